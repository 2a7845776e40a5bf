// Calibration: a system description (system.h) fitted from what Strata measured on a machine. The result files
// are read in bench/ (bench/project/calibration_input.h) into the measurements below, each already one median time per
// case; this layer only fits, so it needs no file, MPI or device.
//
// What is fitted, and how (project/SYSTEM.md says it for users):
// - GEMM and attention: every measured case becomes a point of the description (median seconds, relative spread
//   (p95 - p05) / (2 median) of its iterations); the efficiency curve behind the roofline is the median efficiency
//   per quarter decade of FLOPs, its spread the RMS relative deviation of the points from it.
// - Collectives, per operation, algorithm, group kind and group size: t(S) = alpha + S coll::bus_factor(n) / beta on up
//   to three size ranges, by weighted least squares on relative residuals (times span decades). The breaks and the
//   number of ranges come from the Bayesian information criterion (BIC) over every split into ranges of at least
//   three sizes; a range more is kept only when it lowers the BIC by more than 10 (very strong evidence: the best of
//   many splits otherwise fits noise). alpha >= 0 on the first range; a later range's line may cross zero below it
//   (a steeper piece, where buffers leave a cache) if it is positive where the range starts. Beside it Echo's
//   chunked form t = a + ceil(x / C) c + x / beta, x = S coll::bus_factor(n), for chunk sizes C of 4 KiB to 4 MiB, kept
//   when its BIC is lower by more than 10 too; both residuals are recorded. alpha and beta carry the relative
//   standard errors of the fit, each range its RMS relative residual.
// - The contention of concurrent groups and the overlap slowdowns: the median over cases of (slowdown - 1), its
//   spread from a bootstrap of that median (90% interval), relative to the value (or to 0.01 when it is smaller).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "project/system.h"

namespace strata::project {

// ---- the fits, each usable alone ----------------------------------------------------------------------------

// t = intercept + slope x, minimising sum ((fit - t) / t)^2, with intercept >= min_intercept (-INFINITY: free) and
// slope >= kMinSlope (a bound that binds refits the other). Standard errors from the weighted residuals (0 with no
// degree of freedom left).
inline constexpr double kMinSlope = 1e-15;  // s/B: a bandwidth of 1 PB/s stands for "not resolved"
struct LinearFit {
  double intercept = 0, slope = 0;
  double intercept_se = 0, slope_se = 0;
  double sse = 0;       // sum of squared relative residuals
  double residual = 0;  // sqrt(sse / points)
  int points = 0;
};
LinearFit fit_relative(const std::vector<double>& x, const std::vector<double>& t, double min_intercept = 0);

// Sizes S (ascending, distinct), their median times and the group's bus factor.
struct SizeSeries {
  std::vector<double> bytes;
  std::vector<double> seconds;
  double bus_factor = 1;
};

struct RangesFit {
  std::vector<SizeRange> ranges;
  double residual = 0;  // over every size
  double bic = 0;
};
// Throws std::invalid_argument with fewer than three sizes.
RangesFit fit_ranges(const SizeSeries& series, int max_ranges = 3);

struct ChunkedFit {
  ChunkedModel model;
  double bic = 0;
};
ChunkedFit fit_chunked(const SizeSeries& series);

// Both forms on one series; the one kept by BIC, both residuals in `compared`.
CollectiveModel fit_collective(coll::Operation op, const std::string& algorithm, GroupKind group, int ranks,
                               const SizeSeries& series, const std::string& source);

// (flops, achieved fraction of peak) per measured call -> the curve; its spread is at least `measurement_spread`
// (the points' own relative spread). Throws std::invalid_argument when empty.
EfficiencyCurve fit_efficiency(std::vector<EfficiencyPoint> measured, const std::string& source,
                               double measurement_spread = 0);

// The median of `values` and the 5th and 95th percentiles of the medians of `resamples` bootstrap resamples
// (a fixed seed: the same input gives the same interval).
struct MedianInterval {
  double median = 0, low = 0, high = 0;
  int values = 0;
};
MedianInterval bootstrap_median(const std::vector<double>& values, int resamples = 2000, std::uint64_t seed = 1);

// ---- the measurements -------------------------------------------------------------------------------------

// One elementwise kernel of the training step at one shape (strata-elementwise): bytes as the step's trace counts
// them, the median time of a call, and whether its operands were pushed out of the core's caches before each call
// (strata-elementwise's evict_bytes; files from before that column timed every kernel hot).
struct ElementwiseMeasurement {
  std::string kernel;
  double bytes = 0;
  double seconds = 0;
  double spread = 0;  // relative
  bool evicted = false;
};

struct GemmMeasurement {
  std::string dtype;
  std::int64_t m = 0, n = 0, k = 0;
  double seconds = 0;
  double spread = 0;  // relative
};

struct AttentionMeasurement {
  std::string dtype;
  AttentionShape shape;
  double seconds = 0;
  double spread = 0;
};

struct CollectiveMeasurement {
  coll::Operation op = coll::Operation::allreduce;
  std::string algorithm;
  GroupKind group = GroupKind::intra_node;
  int ranks = 0;
  double bytes = 0;    // S (nccl-tests)
  double seconds = 0;  // median over iterations of the per-iteration max over ranks
  bool emulated = false;  // the nodes were emulated on one machine (--ranks-per-node)
  bool blocking = false;  // timed one call at a time (strata-collective --mode blocking); else pipelined
  // The run that timed it (its results file and run id): a size's cases of one run (in place and out of place) are
  // one run's measurement of it. Empty: a run of its own.
  std::string run;
};

// A ring neighbour exchange (strata-collective's sendrecv): every rank sends S to one peer and receives S, so its
// time is a point-to-point transfer's on the group's tier.
struct TransferMeasurement {
  GroupKind group = GroupKind::intra_node;
  double bytes = 0;
  double seconds = 0;
  bool emulated = false;
};

// One operation of strata-collective --mixed beside another group's: median time concurrent / alone.
struct ContentionMeasurement {
  std::string operation;
  double bytes = 0;
  double slowdown = 1;
};

// One (kernel, collective, size) of strata-interference: overlapped / alone, for the kernel and the collective.
struct InterferenceMeasurement {
  std::string kernel;
  std::string collective;
  double bytes = 0;
  double compute_slowdown = 1;
  double communication_slowdown = 1;
};

struct CalibrationInput {
  std::string name;
  std::string device_name;
  std::string device_source;
  int devices_per_node = 0;
  std::map<std::string, Quantity> peaks;  // by dtype: the peak every efficiency is held against
  std::optional<Quantity> memory_bandwidth;
  std::optional<Quantity> memory_efficiency;
  std::vector<GemmMeasurement> gemm;
  std::vector<ElementwiseMeasurement> elementwise;
  std::vector<AttentionMeasurement> attention;
  std::vector<CollectiveMeasurement> collectives;
  std::vector<TransferMeasurement> transfers;
  std::vector<ContentionMeasurement> contention;
  std::vector<InterferenceMeasurement> interference;
  std::string provenance;  // e.g. "3 runs of results/runs/suite-....h5", for the sources
};

struct Calibration {
  System system;
  std::vector<std::string> report;   // one line per fit and its residual, for people
  std::vector<std::string> missing;  // what neither the measurements nor the base could give, one sentence each
};

// Fits every part the measurements allow. A part they do not cover comes from `base` where given (its source
// then says "not measured here: from <base_name>"), or is named in `missing`. Optional parts (attention, the
// hierarchical group kind, contention, the communication slowdown) are left out when neither has them.
Calibration calibrate(const CalibrationInput& input, const System* base, const std::string& base_name);

}  // namespace strata::project
