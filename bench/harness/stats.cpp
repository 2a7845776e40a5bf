// Implementation of the sample statistics (see stats.h).
#include "bench/harness/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "bench/harness/check.h"

namespace strata {

double stat_value(const Stats& s, const std::string& name) {
  if (name == "min") return s.min;
  if (name == "p05") return s.p05;
  if (name == "median") return s.median;
  if (name == "mean") return s.mean;
  if (name == "p95") return s.p95;
  if (name == "p99") return s.p99;
  if (name == "max") return s.max;
  if (name == "stddev") return s.stddev;
  throw RuntimeError("unknown statistic " + name);
}

double percentile_of_sorted(const std::vector<double>& sorted, double fraction) {
  if (sorted.empty()) return std::nan("");
  double position = fraction * static_cast<double>(sorted.size() - 1);
  size_t below = static_cast<size_t>(std::floor(position));
  size_t above = std::min(below + 1, sorted.size() - 1);
  double weight = position - static_cast<double>(below);
  return sorted[below] + weight * (sorted[above] - sorted[below]);
}

Stats summarize(std::vector<double> values) {
  Stats s;
  s.count = values.size();
  if (values.empty()) {
    s.min = s.p05 = s.median = s.mean = s.p95 = s.p99 = s.max = s.stddev = std::nan("");
    return s;
  }
  std::sort(values.begin(), values.end());
  s.min = values.front();
  s.max = values.back();
  s.p05 = percentile_of_sorted(values, 0.05);
  s.median = percentile_of_sorted(values, 0.50);
  s.p95 = percentile_of_sorted(values, 0.95);
  s.p99 = percentile_of_sorted(values, 0.99);
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  double squares = 0;
  for (double v : values) squares += (v - s.mean) * (v - s.mean);
  s.stddev = values.size() > 1 ? std::sqrt(squares / static_cast<double>(values.size() - 1)) : 0.0;
  return s;
}

const char* rank_view_name(RankView view) { return view == RankView::max_over_ranks ? "rankmax" : "rankmean"; }

const char* rank_view_description(RankView view) {
  return view == RankView::max_over_ranks ? "per iteration, the maximum over ranks; statistic over iterations"
                                          : "per iteration, the mean over ranks; statistic over iterations";
}

std::vector<double> per_iteration(const std::vector<double>& samples, int ranks, int iterations, RankView view) {
  if (samples.size() != static_cast<size_t>(ranks) * static_cast<size_t>(iterations))
    throw RuntimeError("sample matrix does not have ranks x iterations entries");
  std::vector<double> out(static_cast<size_t>(iterations));
  for (int i = 0; i < iterations; ++i) {
    double max = -INFINITY, sum = 0;
    for (int r = 0; r < ranks; ++r) {
      double v = samples[static_cast<size_t>(r) * iterations + i];
      max = std::max(max, v);
      sum += v;
    }
    out[static_cast<size_t>(i)] = view == RankView::max_over_ranks ? max : sum / ranks;
  }
  return out;
}

std::vector<double> per_rank_median(const std::vector<double>& samples, int ranks, int iterations) {
  std::vector<double> medians(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    std::vector<double> own(samples.begin() + static_cast<ptrdiff_t>(r) * iterations,
                            samples.begin() + static_cast<ptrdiff_t>(r + 1) * iterations);
    std::sort(own.begin(), own.end());
    medians[static_cast<size_t>(r)] = percentile_of_sorted(own, 0.5);
  }
  return medians;
}

}  // namespace strata
