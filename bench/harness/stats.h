// Statistics over timing samples and the two rank views every Strata summary reports:
//   max over ranks per iteration  (the straggler view: a step waits for its slowest rank), and
//   mean over ranks per iteration (the typical rank, as nccl-tests averages by default).
// Percentiles interpolate linearly between order statistics (numpy's default); stddev is the sample one.
#pragma once

#include <array>
#include <string>
#include <vector>

namespace strata {

struct Stats {
  double min = 0, p05 = 0, median = 0, mean = 0, p95 = 0, p99 = 0, max = 0, stddev = 0;
  size_t count = 0;
};

// Names in column order; `stat_value` reads the field with that name.
inline constexpr std::array<const char*, 8> kStatNames = {"min", "p05", "median", "mean", "p95", "p99", "max", "stddev"};
double stat_value(const Stats& stats, const std::string& name);

double percentile_of_sorted(const std::vector<double>& sorted, double fraction);  // fraction in [0, 1]
Stats summarize(std::vector<double> values);

enum class RankView { max_over_ranks, mean_over_ranks };
inline constexpr std::array<RankView, 2> kRankViews = {RankView::max_over_ranks, RankView::mean_over_ranks};
const char* rank_view_name(RankView view);         // "rankmax", "rankmean": column prefixes
const char* rank_view_description(RankView view);  // for the convention attribute

// samples: ranks x iterations, row-major (rank r's iteration i at r * iterations + i).
std::vector<double> per_iteration(const std::vector<double>& samples, int ranks, int iterations, RankView view);
// Each rank's own median over its iterations.
std::vector<double> per_rank_median(const std::vector<double>& samples, int ranks, int iterations);

}  // namespace strata
