// Unit tests of the sample statistics and rank views (bench/harness/stats.h).
#include <gtest/gtest.h>

#include <cmath>

#include "bench/harness/stats.h"

using namespace strata;

TEST(Stats, PercentilesInterpolateLikeNumpy) {
  // numpy.percentile([1..10], q) with linear interpolation
  std::vector<double> v = {10, 1, 9, 2, 8, 3, 7, 4, 6, 5};
  Stats s = summarize(v);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 10);
  EXPECT_DOUBLE_EQ(s.median, 5.5);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  EXPECT_NEAR(s.p05, 1.45, 1e-12);
  EXPECT_NEAR(s.p95, 9.55, 1e-12);
  EXPECT_NEAR(s.p99, 9.91, 1e-12);
  EXPECT_NEAR(s.stddev, 3.0276503540974917, 1e-12);  // sample (n-1) standard deviation
  EXPECT_EQ(s.count, 10u);
}

TEST(Stats, SingleAndEmpty) {
  Stats one = summarize({2.5});
  EXPECT_DOUBLE_EQ(one.median, 2.5);
  EXPECT_DOUBLE_EQ(one.p99, 2.5);
  EXPECT_DOUBLE_EQ(one.stddev, 0);
  Stats none = summarize({});
  EXPECT_TRUE(std::isnan(none.median));
  EXPECT_EQ(none.count, 0u);
}

TEST(Stats, StatValueByName) {
  Stats s = summarize({1, 2, 3});
  for (const char* name : kStatNames) EXPECT_FALSE(std::isnan(stat_value(s, name))) << name;
  EXPECT_DOUBLE_EQ(stat_value(s, "median"), 2);
  EXPECT_THROW(stat_value(s, "p50"), std::exception);
}

TEST(Stats, RankViews) {
  // 2 ranks x 3 iterations: rank 1 straggles in iteration 1.
  std::vector<double> samples = {1, 1, 1,
                                 1, 5, 2};
  auto maxv = per_iteration(samples, 2, 3, RankView::max_over_ranks);
  auto meanv = per_iteration(samples, 2, 3, RankView::mean_over_ranks);
  EXPECT_EQ(maxv, (std::vector<double>{1, 5, 2}));
  EXPECT_EQ(meanv, (std::vector<double>{1, 3, 1.5}));
  auto medians = per_rank_median(samples, 2, 3);
  EXPECT_EQ(medians, (std::vector<double>{1, 2}));
  EXPECT_THROW(per_iteration(samples, 3, 3, RankView::max_over_ranks), std::exception);
}
