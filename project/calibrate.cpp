#include "project/calibrate.h"

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

namespace strata::project {
namespace {

double median_of(std::vector<double> values) {
  if (values.empty()) throw std::invalid_argument("median of nothing");
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Linear interpolation between order statistics, as bench/harness/stats does.
double percentile_of_sorted(const std::vector<double>& sorted, double p) {
  const double position = p * static_cast<double>(sorted.size() - 1);
  const auto below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  const double weight = position - static_cast<double>(below);
  return sorted[below] + weight * (sorted[above] - sorted[below]);
}

std::string format(const char* pattern, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, pattern, value);
  return buffer;
}

// 1.23e-6 s -> "1.23 us"; 1.2e10 B/s -> "12.0 GB/s"; decimal prefixes.
std::string si(double value, const std::string& unit) {
  struct Prefix {
    double scale;
    const char* name;
  };
  static const Prefix prefixes[] = {{1e15, "P"}, {1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"},
                                    {1, ""},     {1e-3, "m"}, {1e-6, "u"}, {1e-9, "n"}};
  for (const Prefix& p : prefixes)
    if (std::abs(value) >= p.scale * 0.9995) return format("%.3g", value / p.scale) + " " + p.name + unit;
  return format("%.3g", value) + " " + unit;
}

// 4096 -> "4 KiB", the way strata-collective's sizes are given.
std::string bytes_text(double bytes) {
  if (bytes >= 1 << 30 && std::fmod(bytes, 1 << 30) == 0) return format("%.0f", bytes / (1 << 30)) + " GiB";
  if (bytes >= 1 << 20 && std::fmod(bytes, 1 << 20) == 0) return format("%.0f", bytes / (1 << 20)) + " MiB";
  if (bytes >= 1 << 10 && std::fmod(bytes, 1 << 10) == 0) return format("%.0f", bytes / (1 << 10)) + " KiB";
  return format("%.0f", bytes) + " B";
}

std::string percent(double fraction) { return format("%.1f", 100 * fraction) + "%"; }

// Fitted figures are written with the digits they carry, so the description stays readable: values to 5
// significant digits, spreads and residuals to 3 (measurement noise is far above either).
double significant(double x, int digits) {
  if (x == 0 || !std::isfinite(x)) return x;
  char text[40];
  std::snprintf(text, sizeof text, "%.*e", digits - 1, x);  // the decimal's nearest double, not x * 10^k / 10^k
  return std::strtod(text, nullptr);
}
Quantity fitted(double value, double spread, std::string source = "") {
  return {significant(value, 5), significant(spread, 3), std::move(source)};
}

// One point of a shape measured by several runs (make run's passes): their median time, its spread the larger of the
// runs' median spread and half their range over the median.
template <typename Measurement>
Quantity median_over_runs(const std::vector<const Measurement*>& runs) {
  std::vector<double> times, spreads;
  for (const Measurement* m : runs) times.push_back(m->seconds), spreads.push_back(m->spread);
  const double seconds = median_of(times);
  const auto [low, high] = std::minmax_element(times.begin(), times.end());
  return fitted(seconds, std::max(median_of(spreads), (*high - *low) / (2 * seconds)));
}

// Relative standard error, 0 where the value is 0 (a bound that binds carries no spread of its own).
double relative(double se, double value) { return value > 0 ? se / value : 0; }

// ---- least squares on relative residuals -------------------------------------------------------------------

// Solves min || A c - 1 || over the columns in `free` (the others fixed at 0); returns the coefficients (zeros
// for the fixed ones), the sum of squares and the covariance of the free ones (sigma^2 (A'A)^-1).
struct Solved {
  Eigen::VectorXd coefficients;
  double sse = 0;
  Eigen::MatrixXd covariance;
};

// The least-squares solution of min || A c - 1 || with c >= lower, for a few columns: every subset of columns held
// at their bound is tried, and the best feasible solution kept (exact for so few columns). A bound of -infinity
// leaves its column free.
Solved solve_bounded(const Eigen::MatrixXd& a, const Eigen::VectorXd& lower) {
  const int columns = static_cast<int>(a.cols());
  const Eigen::VectorXd ones = Eigen::VectorXd::Ones(a.rows());
  std::optional<Solved> best;
  for (int mask = 0; mask < (1 << columns); ++mask) {
    std::vector<int> free;
    Eigen::VectorXd fixed = Eigen::VectorXd::Zero(columns);
    bool holds_unbounded = false;
    for (int j = 0; j < columns; ++j) {
      if (mask & (1 << j)) free.push_back(j);
      else fixed(j) = lower(j), holds_unbounded = holds_unbounded || std::isinf(lower(j));
    }
    if (holds_unbounded) continue;
    // Held columns contribute their bound; the free ones fit what is left.
    const Eigen::VectorXd held = a * fixed;
    Solved s;
    if (free.empty()) {
      s.coefficients = fixed;
      s.sse = (a * fixed - ones).squaredNorm();
      s.covariance = Eigen::MatrixXd::Zero(columns, columns);
    } else {
      // Solving on the unscaled residual: A_free c = 1 - held.
      Eigen::MatrixXd sub(a.rows(), static_cast<Eigen::Index>(free.size()));
      for (size_t j = 0; j < free.size(); ++j) sub.col(static_cast<Eigen::Index>(j)) = a.col(free[j]);
      const Eigen::VectorXd target = ones - held;
      const Eigen::VectorXd c = sub.colPivHouseholderQr().solve(target);
      s.coefficients = fixed;
      bool feasible = true;
      for (size_t j = 0; j < free.size(); ++j) {
        s.coefficients(free[j]) = c(static_cast<Eigen::Index>(j));
        if (!(c(static_cast<Eigen::Index>(j)) >= lower(free[j]))) feasible = false;
      }
      if (!feasible) continue;
      s.sse = (a * s.coefficients - ones).squaredNorm();
      const auto dof = a.rows() - static_cast<Eigen::Index>(free.size());
      const double sigma2 = dof > 0 ? s.sse / static_cast<double>(dof) : 0;
      const Eigen::MatrixXd normal = sub.transpose() * sub;
      s.covariance = Eigen::MatrixXd::Zero(columns, columns);
      if (normal.fullPivLu().isInvertible()) {
        const Eigen::MatrixXd inverse = normal.inverse() * sigma2;
        for (size_t i = 0; i < free.size(); ++i)
          for (size_t j = 0; j < free.size(); ++j)
            s.covariance(free[i], free[j]) = inverse(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j));
      }
    }
    if (!best || s.sse < best->sse) best = s;
  }
  if (!best) throw std::logic_error("no feasible least-squares solution");  // the all-free subset always is
  return *best;
}

// The rows of t = sum_j c_j f_j(x) divided by t, so the residuals are relative.
Eigen::MatrixXd relative_design(const std::vector<std::vector<double>>& features, const std::vector<double>& t) {
  Eigen::MatrixXd a(static_cast<Eigen::Index>(t.size()), static_cast<Eigen::Index>(features.size()));
  for (size_t i = 0; i < t.size(); ++i)
    for (size_t j = 0; j < features.size(); ++j)
      a(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) = features[j][i] / t[i];
  return a;
}

double bic(double sse, int points, int parameters) {
  // A floor keeps a perfect fit (synthetic data) finite: relative residuals of 1e-9.
  const double floor = 1e-18 * points;
  return points * std::log(std::max(sse, floor) / points) + parameters * std::log(static_cast<double>(points));
}

void check_series(const SizeSeries& series, size_t minimum) {
  if (series.bytes.size() != series.seconds.size()) throw std::invalid_argument("sizes and times differ in count");
  if (series.bytes.size() < minimum)
    throw std::invalid_argument("a collective fit needs at least " + std::to_string(minimum) + " sizes");
  for (size_t i = 0; i < series.bytes.size(); ++i) {
    if (!(series.seconds[i] > 0)) throw std::invalid_argument("a measured time must be positive");
    if (i > 0 && !(series.bytes[i] > series.bytes[i - 1])) throw std::invalid_argument("sizes must increase");
  }
}

}  // namespace

LinearFit fit_relative(const std::vector<double>& x, const std::vector<double>& t, double min_intercept) {
  if (x.empty() || x.size() != t.size()) throw std::invalid_argument("fit_relative: no points, or x and t differ");
  for (double v : t)
    if (!(v > 0)) throw std::invalid_argument("fit_relative: times must be positive");
  const Eigen::MatrixXd a = relative_design({std::vector<double>(x.size(), 1.0), x}, t);
  Eigen::VectorXd lower(2);
  lower << min_intercept, kMinSlope;
  const Solved s = solve_bounded(a, lower);
  LinearFit fit;
  fit.intercept = s.coefficients(0);
  fit.slope = s.coefficients(1);
  fit.intercept_se = std::sqrt(std::max(0.0, s.covariance(0, 0)));
  fit.slope_se = std::sqrt(std::max(0.0, s.covariance(1, 1)));
  fit.sse = s.sse;
  fit.points = static_cast<int>(x.size());
  fit.residual = std::sqrt(s.sse / fit.points);
  return fit;
}

RangesFit fit_ranges(const SizeSeries& series, int max_ranges) {
  constexpr size_t kMinSizes = 3;  // per range: two parameters and one degree of freedom
  check_series(series, kMinSizes);
  const size_t n = series.bytes.size();
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = series.bytes[i] * series.bus_factor;
  std::map<std::pair<size_t, size_t>, LinearFit> cache;
  // The first range's intercept is the latency (>= 0); a later range is a piece of the curve whose line may cross
  // zero below it (a steeper piece where the buffers leave a cache), as long as it is positive where it starts.
  auto segment = [&](size_t first, size_t last) -> const LinearFit& {
    auto [it, fresh] = cache.try_emplace({first, last});
    if (fresh) {
      const std::vector<double> xs(x.begin() + static_cast<long>(first), x.begin() + static_cast<long>(last) + 1);
      const std::vector<double> ts(series.seconds.begin() + static_cast<long>(first),
                                   series.seconds.begin() + static_cast<long>(last) + 1);
      it->second = fit_relative(xs, ts, first == 0 ? 0.0 : -INFINITY);
      const double lowest = first == 0 ? 0 : x[first - 1];  // the previous range's last size
      if (it->second.intercept + it->second.slope * lowest <= 0) it->second = fit_relative(xs, ts, 0.0);
    }
    return it->second;
  };
  // Every split into k ranges of at least kMinSizes consecutive sizes: the ends of the first k - 1 ranges.
  std::vector<size_t> best_ends;
  double best_bic = 0, best_sse = 0;
  bool found = false;
  std::function<void(std::vector<size_t>&, size_t, int)> search = [&](std::vector<size_t>& ends, size_t start, int left) {
    if (left == 1) {
      if (n - start < kMinSizes) return;
      double sse = 0;
      size_t first = 0;
      for (size_t end : ends) sse += segment(first, end).sse, first = end + 1;
      sse += segment(start, n - 1).sse;
      const int k = static_cast<int>(ends.size()) + 1;
      const double score = bic(sse, static_cast<int>(n), 3 * k - 1);
      if (!found || score < best_bic - 1e-12) best_bic = score, best_sse = sse, best_ends = ends, found = true;
      return;
    }
    for (size_t end = start + kMinSizes - 1; end + kMinSizes < n; ++end) {
      ends.push_back(end);
      search(ends, end + 1, left - 1);
      ends.pop_back();
    }
  };
  // More ranges are kept only on strong evidence: a BIC lower by more than 10 than the best with fewer (Kass and
  // Raftery's "very strong"), since choosing the best of many splits favours fitting noise.
  constexpr double kStrongEvidence = 10;
  std::vector<size_t> chosen_ends;
  double chosen_bic = 0, chosen_sse = 0;
  for (int k = 1; k <= std::max(1, max_ranges); ++k) {
    std::vector<size_t> ends;
    found = false;
    search(ends, 0, k);
    if (found && (k == 1 || best_bic < chosen_bic - kStrongEvidence))
      chosen_ends = best_ends, chosen_bic = best_bic, chosen_sse = best_sse;
  }
  best_ends = chosen_ends, best_bic = chosen_bic, best_sse = chosen_sse;
  RangesFit out;
  size_t first = 0;
  std::vector<size_t> ends = best_ends;
  ends.push_back(n - 1);
  for (size_t r = 0; r < ends.size(); ++r) {
    const LinearFit& f = segment(first, ends[r]);
    SizeRange range;
    if (r + 1 < ends.size()) range.up_to_bytes = series.bytes[ends[r]];
    range.model.latency = fitted(f.intercept, relative(f.intercept_se, std::abs(f.intercept)));
    range.model.bandwidth = fitted(1 / f.slope, relative(f.slope_se, f.slope));
    range.residual = significant(f.residual, 3);
    range.sizes = f.points;
    out.ranges.push_back(range);
    first = ends[r] + 1;
  }
  out.residual = std::sqrt(best_sse / static_cast<double>(n));
  out.bic = best_bic;
  return out;
}

ChunkedFit fit_chunked(const SizeSeries& series) {
  check_series(series, 4);
  const size_t n = series.bytes.size();
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = series.bytes[i] * series.bus_factor;
  // Chunk sizes of the libraries and of Strata's own algorithms lie in this span (NCCL's protocols' chunks, the
  // shared-memory slots of 256 KiB, the ring's and HO-Ring's 1 MiB).
  std::optional<ChunkedFit> best;
  for (double chunk = 4096; chunk <= 4 << 20; chunk *= 4) {
    std::vector<double> chunks(n);
    for (size_t i = 0; i < n; ++i) chunks[i] = std::ceil(x[i] / chunk);
    const Eigen::MatrixXd a = relative_design({std::vector<double>(n, 1.0), chunks, x}, series.seconds);
    Eigen::VectorXd lower(3);
    lower << 0.0, 0.0, kMinSlope;
    const Solved s = solve_bounded(a, lower);
    ChunkedFit fit;
    ChunkedModel& m = fit.model;
    m.chunk_bytes = chunk;
    m.latency = fitted(s.coefficients(0), relative(std::sqrt(std::max(0.0, s.covariance(0, 0))), s.coefficients(0)));
    m.per_chunk = fitted(s.coefficients(1), relative(std::sqrt(std::max(0.0, s.covariance(1, 1))), s.coefficients(1)));
    m.bandwidth = fitted(1 / s.coefficients(2), relative(std::sqrt(std::max(0.0, s.covariance(2, 2))), s.coefficients(2)));
    m.residual = significant(std::sqrt(s.sse / static_cast<double>(n)), 3);
    m.sizes = static_cast<int>(n);
    fit.bic = bic(s.sse, static_cast<int>(n), 4);
    if (!best || fit.bic < best->bic) best = fit;
  }
  return *best;
}

CollectiveModel fit_collective(coll::Operation op, const std::string& algorithm, GroupKind group, int ranks,
                               const SizeSeries& series, const std::string& source) {
  CollectiveModel m;
  m.op = op;
  m.algorithm = algorithm;
  m.group = group;
  m.ranks = ranks;
  const RangesFit ranges = fit_ranges(series);
  m.ranges = ranges.ranges;
  m.compared["latency_bandwidth"] = significant(ranges.residual, 3);
  std::string kept = "latency_bandwidth (" + std::to_string(ranges.ranges.size()) + " range" +
                     (ranges.ranges.size() > 1 ? "s" : "") + ")";
  if (series.bytes.size() >= 4) {
    const ChunkedFit chunked = fit_chunked(series);
    m.compared["chunked"] = significant(chunked.model.residual, 3);
    if (chunked.bic < ranges.bic - 10) {  // as a range more: only on very strong evidence
      m.form = CollectiveForm::chunked;
      m.chunked = chunked.model;
      m.ranges.clear();
      kept = "chunked (" + bytes_text(chunked.model.chunk_bytes) + " chunks)";
    }
  }
  m.source = source + "; kept " + kept + " by the Bayesian information criterion";
  return m;
}

EfficiencyCurve fit_efficiency(std::vector<EfficiencyPoint> measured, const std::string& source,
                               double measurement_spread) {
  if (measured.empty()) throw std::invalid_argument("an efficiency curve needs at least one measured point");
  std::sort(measured.begin(), measured.end(), [](const auto& a, const auto& b) { return a.flops < b.flops; });
  EfficiencyCurve curve;
  // Points within a quarter decade of FLOPs of a group's first share one curve point: their median efficiency at
  // their geometric mean FLOPs, so shapes of one size but another aspect average out.
  constexpr double kGroupDecades = 0.25;
  for (size_t first = 0; first < measured.size();) {
    size_t last = first;
    while (last + 1 < measured.size() &&
           std::log10(measured[last + 1].flops) - std::log10(measured[first].flops) <= kGroupDecades)
      ++last;
    std::vector<double> efficiencies;
    double log_sum = 0;
    for (size_t i = first; i <= last; ++i) efficiencies.push_back(measured[i].efficiency), log_sum += std::log10(measured[i].flops);
    const double efficiency = std::clamp(median_of(efficiencies), 1e-6, 1.0);
    const EfficiencyPoint point{significant(std::pow(10.0, log_sum / static_cast<double>(last - first + 1)), 4),
                                significant(efficiency, 4)};
    if (curve.points.empty() || point.flops > curve.points.back().flops) curve.points.push_back(point);
    first = last + 1;
  }
  double squares = 0;
  for (const EfficiencyPoint& p : measured) {
    const double fitted = curve.at(p.flops);
    squares += (p.efficiency - fitted) * (p.efficiency - fitted) / (fitted * fitted);
  }
  // A curve through every point has no deviation to show: the points' own spread is then its floor.
  curve.relative_spread = significant(std::max(std::sqrt(squares / static_cast<double>(measured.size())), measurement_spread), 3);
  curve.source = source;
  return curve;
}

MedianInterval bootstrap_median(const std::vector<double>& values, int resamples, std::uint64_t seed) {
  if (values.empty()) throw std::invalid_argument("bootstrap of nothing");
  MedianInterval out;
  out.values = static_cast<int>(values.size());
  out.median = median_of(values);
  std::uint64_t state = seed;
  auto next = [&state] {  // splitmix64: small, seeded, the same on every platform
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  std::vector<double> medians;
  std::vector<double> resample(values.size());
  for (int r = 0; r < resamples; ++r) {
    for (double& v : resample) v = values[next() % values.size()];
    medians.push_back(median_of(resample));
  }
  std::sort(medians.begin(), medians.end());
  out.low = percentile_of_sorted(medians, 0.05);
  out.high = percentile_of_sorted(medians, 0.95);
  return out;
}

// ---- the whole description ------------------------------------------------------------------------------

namespace {

// A slowdown factor (>= 1 when slower) -> the extra fraction, clipped at 0, with its bootstrap interval.
Quantity slowdown_quantity(const std::vector<double>& factors, const std::string& what, std::string& line) {
  std::vector<double> extra;
  for (double f : factors) extra.push_back(f - 1);
  const MedianInterval m = bootstrap_median(extra);
  const double value = std::max(0.0, m.median);
  const double half_width = 0.5 * (m.high - m.low);
  // Relative to a slowdown near 0 the interval's width is huge: held at a description's largest spread (100).
  Quantity q = fitted(value, std::min(half_width / std::max(value, 0.01), 100.0));
  q.source = "measured: median over " + std::to_string(m.values) + " " + what + " of (slowdown - 1) = " +
             format("%.4f", m.median) + (m.median < 0 ? " (faster overlapped: noise; taken as 0)" : "") +
             ", 90% bootstrap interval of the median [" + format("%.4f", m.low) + ", " + format("%.4f", m.high) +
             "]; spread = its half-width relative to the value (or to 0.01 when smaller)";
  line = format("%.4f", q.value) + " [" + format("%.4f", m.low) + ", " + format("%.4f", m.high) + "] over " +
         std::to_string(m.values) + " " + what;
  return q;
}

// The measured times of one key by size (positive sizes and times only).
std::map<double, std::vector<double>> times_by_size(const std::vector<std::pair<double, double>>& bytes_seconds) {
  std::map<double, std::vector<double>> by_size;
  for (const auto& [bytes, seconds] : bytes_seconds)
    if (bytes > 0 && seconds > 0) by_size[bytes].push_back(seconds);
  return by_size;
}

// The measured times of one key, one per distinct size (the median where a size was measured more than once).
SizeSeries series_of(const std::vector<std::pair<double, double>>& bytes_seconds, double factor) {
  const auto by_size = times_by_size(bytes_seconds);
  SizeSeries series;
  series.bus_factor = factor;
  for (const auto& [bytes, times] : by_size) series.bytes.push_back(bytes), series.seconds.push_back(median_of(times));
  return series;
}

// The relative residual of a collective's fit at `bytes` (its range's, or the chunked form's).
double residual_at(const CollectiveModel& m, double bytes) {
  if (m.form == CollectiveForm::chunked) return m.chunked.residual;
  for (const SizeRange& range : m.ranges)
    if (bytes <= range.up_to_bytes) return range.residual;
  return m.ranges.back().residual;
}

// A collective's measured sizes: per size, the median over its runs (each run's own median of its cases there, in
// place and out of place), spread half their range relative to it. A size only one run timed has no spread of its
// own: it takes the fit's residual there.
std::vector<CollectivePoint> measured_points(const std::vector<const CollectiveMeasurement*>& measured,
                                             const CollectiveModel& fit) {
  std::map<double, std::map<std::string, std::vector<double>>> by_size_and_run;
  int unnamed = 0;
  for (const CollectiveMeasurement* m : measured)
    if (m->bytes > 0 && m->seconds > 0)
      by_size_and_run[m->bytes][m->run.empty() ? "#" + std::to_string(unnamed++) : m->run].push_back(m->seconds);
  std::vector<CollectivePoint> points;
  for (const auto& [bytes, runs] : by_size_and_run) {
    std::vector<double> times;
    for (const auto& [run, cases] : runs) times.push_back(median_of(cases));
    const double median = median_of(times);
    const auto [low, high] = std::minmax_element(times.begin(), times.end());
    const double spread = times.size() > 1 ? (*high - *low) / (2 * median) : residual_at(fit, bytes);
    points.push_back({bytes, fitted(median, spread)});
  }
  return points;
}

std::string range_text(const SizeRange& r, double lower) {
  std::string span = std::isinf(r.up_to_bytes) ? "> " + bytes_text(lower) : "<= " + bytes_text(r.up_to_bytes);
  if (lower == 0 && std::isinf(r.up_to_bytes)) span = "all sizes";
  return "[" + span + ": alpha " + si(r.model.latency.value, "s") + ", beta " + si(r.model.bandwidth.value, "B/s") +
         ", residual " + percent(r.residual) + "]";
}

std::string model_text(const CollectiveModel& m) {
  std::string text;
  if (m.form == CollectiveForm::chunked) {
    text = "chunked: a " + si(m.chunked.latency.value, "s") + ", " + si(m.chunked.per_chunk.value, "s") + " per " +
           bytes_text(m.chunked.chunk_bytes) + " chunk, beta " + si(m.chunked.bandwidth.value, "B/s") + ", residual " +
           percent(m.chunked.residual);
    if (m.compared.count("latency_bandwidth"))
      text += " (latency-bandwidth: " + percent(m.compared.at("latency_bandwidth")) + ")";
  } else {
    text = "latency-bandwidth";
    double lower = 0;
    for (const SizeRange& r : m.ranges) text += " " + range_text(r, lower), lower = r.up_to_bytes;
    if (m.compared.count("chunked")) text += " (chunked: " + percent(m.compared.at("chunked")) + ")";
  }
  return text;
}

std::string dtype_list(const std::map<std::string, ComputePeak>& compute) {
  std::string out;
  for (const auto& [dtype, peak] : compute) out += (out.empty() ? "" : ", ") + dtype;
  return out;
}

// One calibration: the runs read, the description whose figures stand in for what was not measured here (or none),
// and what is built, a part of the description per method.
class Calibrator {
 public:
  Calibrator(const CalibrationInput& input, const System* base, const std::string& base_name)
      : input(input), base(base), from_base("not measured here: from " + base_name) {}

  Calibration run() {
    s.name = input.name;
    s.comment = "Calibrated by strata-project calibrate from " + input.provenance +
                ". Every fitted figure names its fit and residual in its source; figures not measured here say so.";
    s.device.name = input.device_name;
    s.device.source = input.device_source;
    s.device.devices_per_node = input.devices_per_node;
    fit_gemm();
    fit_attention();
    take_missing_compute();
    fit_memory();
    fit_elementwise();
    // The GEMM library's epilogues are the base's (the GPU's cuBLASLt) unless the step's elementwise kernels were
    // measured: the CPU step runs its biases as passes of their own, which strata-elementwise times.
    if (input.elementwise.empty() && base && !base->device.fused_into_gemm.empty()) {
      s.device.fused_into_gemm = base->device.fused_into_gemm;
      report.push_back("elementwise kernels fused into the GEMM: " + from_base);
    }
    // The device's memory capacity is not measured: the base's, when it says.
    if (base && base->device.memory_capacity) s.device.memory_capacity = based_quantity(*base->device.memory_capacity);
    // Frameworks' other attention kernels are not measured here: the base's speeds, relative now to the attention
    // strata-attention measured rather than to the kernel the base's ratios were published against.
    if (base && !base->device.attention_kernels.empty()) {
      for (const auto& [kernel, speed] : base->device.attention_kernels)
        s.device.attention_kernels[kernel] = {based_quantity(speed.forward), based_quantity(speed.backward)};
      report.push_back("attention kernels relative to the measured one: " + from_base);
    }
    fit_collectives();
    fit_tier(GroupKind::intra_node, s.intra_node, base ? &base->intra_node : nullptr);
    fit_tier(GroupKind::inter_node, s.inter_node, base ? &base->inter_node : nullptr);
    keep_base_collectives();
    // A ring's per-step latency across many nodes is not measurable on the few nodes a calibration runs on. Its
    // steps inside a node depend on the host's CPU (NCCL's network post overhead): the base's hosts are assumed.
    if (base && base->ring_latency) {
      s.ring_latency = *base->ring_latency;
      s.ring_latency->source = based(s.ring_latency->source);
      for (auto& [name, p] : s.ring_latency->protocols)
        for (Quantity* q : {&p.base, &p.intra_step, &p.inter_step}) *q = based_quantity(*q);
      report.push_back("ring latency: " + from_base + " (its hosts' CPU assumed)");
    }
    fit_contention();
    fit_overlap();
    if (out.missing.empty())
      if (auto problem = find_problem(s))
        throw std::logic_error("calibration produced an unusable description: " + *problem);
    return std::move(out);
  }

 private:
  using Key = std::tuple<coll::Operation, std::string, GroupKind, int, bool>;  // ..., ranks, blocking

  std::string based(const std::string& source) const { return source.empty() ? from_base : from_base + " (" + source + ")"; }
  Quantity based_quantity(Quantity q) const {
    q.source = based(q.source);
    return q;
  }

  // GEMM: the peak of each dtype, a point per shape (the median of its cases) and the efficiency curve through them.
  void fit_gemm() {
    std::map<std::string, std::vector<GemmMeasurement>> gemm_by_dtype;
    for (const GemmMeasurement& g : input.gemm) gemm_by_dtype[g.dtype].push_back(g);
    for (const auto& [dtype, measured] : gemm_by_dtype) {
      const auto peak = input.peaks.find(dtype);
      if (peak == input.peaks.end() || !(peak->second.value > 0)) {
        report.push_back("gemm " + dtype + ": " + std::to_string(measured.size()) +
                         " points but no measured peak for the dtype: left out");
        continue;
      }
      ComputePeak c;
      c.peak_flops = fitted(peak->second.value, peak->second.relative_spread, peak->second.source);
      // One point per shape: the median of the cases measured at that shape (runs, libraries already chosen).
      std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, std::vector<const GemmMeasurement*>> by_shape;
      for (const GemmMeasurement& g : measured) by_shape[{g.m, g.n, g.k}].push_back(&g);
      std::vector<EfficiencyPoint> efficiencies;
      std::vector<double> point_spreads;
      double lowest = 1e300, highest = 0;
      for (const auto& [shape, cases] : by_shape) {
        GemmPoint p{std::get<0>(shape), std::get<1>(shape), std::get<2>(shape), median_over_runs(cases)};
        const double seconds = p.seconds.value;
        point_spreads.push_back(p.seconds.relative_spread);
        const double efficiency = p.flops() / (c.peak_flops.value * seconds);
        lowest = std::min(lowest, efficiency), highest = std::max(highest, efficiency);
        efficiencies.push_back({p.flops(), efficiency});
        c.gemm_points.push_back(p);
      }
      c.efficiency = fit_efficiency(efficiencies,
          "fitted: median efficiency per quarter decade of FLOPs of the " + std::to_string(c.gemm_points.size()) +
          " gemm_points (strata-gemm, " + input.provenance + "); spread: RMS relative deviation of the points from "
          "it, at least their own median spread", median_of(point_spreads));
      s.device.compute[dtype] = c;
      report.push_back("gemm " + dtype + ": peak " + si(c.peak_flops.value, "FLOP/s") + ", " +
                       std::to_string(c.gemm_points.size()) + " shapes, efficiency " + format("%.3f", lowest) + " to " +
                       format("%.3f", highest) + "; curve of " + std::to_string(c.efficiency.points.size()) +
                       " points, residual " + percent(c.efficiency.relative_spread));
      if (highest > 1)
        report.push_back("gemm " + dtype + ": faster than the measured peak at some shapes (clipped to 1 in the curve): "
                         "the machine description was likely measured on a busy machine; STRATA_MACHINE_CACHE=refresh "
                         "measures it again");
    }
  }

  // Attention: points beside the GEMM figures of the same dtype, a curve per pass.
  void fit_attention() {
    std::map<std::pair<std::string, bool>, std::vector<const AttentionMeasurement*>> attention_by;
    for (const AttentionMeasurement& a : input.attention) attention_by[{a.dtype, a.shape.backward}].push_back(&a);
    for (const auto& [key, measured] : attention_by) {
      const auto& [dtype, backward] = key;
      const std::string pass = backward ? "bwd" : "fwd";
      const auto compute = s.device.compute.find(dtype);
      if (compute == s.device.compute.end()) {
        report.push_back("attention " + dtype + " " + pass + ": no GEMM peak for the dtype: left out");
        continue;
      }
      ComputePeak& c = compute->second;
      // One point per shape, as for GEMMs: the median of the runs that measured it.
      using ShapeKey = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool>;
      std::map<ShapeKey, std::vector<const AttentionMeasurement*>> by_shape;
      for (const AttentionMeasurement* a : measured) {
        const AttentionShape& h = a->shape;
        by_shape[{h.batch, h.heads, h.kv_heads > 0 ? h.kv_heads : h.heads, h.seq_q, h.seq_kv, h.head_dim, h.causal}]
            .push_back(a);
      }
      std::vector<EfficiencyPoint> efficiencies;
      std::vector<double> point_spreads;
      for (const auto& [key_of_shape, runs] : by_shape) {
        const AttentionShape& shape = runs.front()->shape;
        c.attention_points.push_back({shape, median_over_runs(runs)});
        const double seconds = c.attention_points.back().seconds.value;
        point_spreads.push_back(c.attention_points.back().seconds.relative_spread);
        efficiencies.push_back({shape.flops(), shape.flops() / (c.peak_flops.value * seconds)});
      }
      const EfficiencyCurve curve = fit_efficiency(efficiencies,
          "fitted: median efficiency per quarter decade of FLOPs of the " + std::to_string(by_shape.size()) + " " + pass +
          " attention_points (strata-attention flash, flash-attention FLOPs, " + input.provenance + ")",
          median_of(point_spreads));
      c.attention_efficiency[pass] = curve;
      report.push_back("attention " + dtype + " " + pass + ": " + std::to_string(by_shape.size()) + " shapes, curve of " +
                       std::to_string(curve.points.size()) + " points from efficiency " +
                       format("%.3f", curve.points.front().efficiency) + " to " +
                       format("%.3f", curve.points.back().efficiency) + ", residual " + percent(curve.relative_spread));
    }
    if (input.attention.empty()) report.push_back("attention: not measured (no strata-attention flash run): the GEMM curves stand in");
  }

  // Without a GEMM run: the base's compute; and the base's devices per node where no run says.
  void take_missing_compute() {
    if (s.device.compute.empty()) {
      if (base) {
        s.device.compute = base->device.compute;
        for (auto& [dtype, c] : s.device.compute) {
          c.peak_flops = based_quantity(c.peak_flops);
          c.efficiency.source = based(c.efficiency.source);
        }
        if (s.device.name.empty()) s.device.name = base->device.name;
        report.push_back("compute: " + from_base + " (" + dtype_list(s.device.compute) + ")");
      } else {
        out.missing.push_back("no strata-gemm run: the device's compute (peak, efficiency curve, GEMM points) cannot be "
                              "fitted");
      }
    }
    if (s.device.devices_per_node < 1) {
      if (base) s.device.devices_per_node = base->device.devices_per_node;
      else out.missing.push_back("no run says how many devices a node holds");
    }
  }

  void fit_memory() {
    if (input.memory_bandwidth && input.memory_efficiency) {
      s.device.memory_bandwidth = fitted(input.memory_bandwidth->value, input.memory_bandwidth->relative_spread,
                                         input.memory_bandwidth->source);
      s.device.memory_efficiency = fitted(input.memory_efficiency->value, input.memory_efficiency->relative_spread,
                                          input.memory_efficiency->source);
      report.push_back("memory: " + si(s.device.memory_bandwidth.value, "B/s") + " per device at efficiency " +
                       format("%.3f", s.device.memory_efficiency.value) + " (" + s.device.memory_bandwidth.source + ")");
    } else if (base) {
      s.device.memory_bandwidth = based_quantity(base->device.memory_bandwidth);
      s.device.memory_efficiency = based_quantity(base->device.memory_efficiency);
      report.push_back("memory: " + from_base);
    } else {
      out.missing.push_back("no measured memory bandwidth for this device (the runs' machine description measures the "
                            "host's, not a GPU's): the elementwise kernels cannot be fitted");
    }
  }

  // The step's elementwise kernels at its shapes: each kernel's bytes over its seconds (every shape measured), and all
  // of them together for the step's elementwise ops no kernel of them runs. Without them the memory figures above
  // time every elementwise op. The loss's kernels stay out of the rate together: an exponential per logit bounds
  // them, not memory, and the ops timed at that rate (zeroing, copies of the embedding, the positions) are memory's.
  // A kernel measured both with its operands evicted and hot (files of different ages) takes the evicted
  // measurements only: where strata-elementwise evicts, the step meets those operands outside the core's caches.
  void fit_elementwise() {
    if (!input.elementwise.empty()) {
      std::set<std::string> evicted;
      for (const ElementwiseMeasurement& e : input.elementwise)
        if (e.evicted) evicted.insert(e.kernel);
      std::map<std::string, std::pair<double, double>> sums;  // kernel -> (bytes, seconds)
      std::map<std::string, double> spreads;
      std::map<std::string, int> hot_left_out;
      double bytes = 0, seconds = 0, widest = 0;
      for (const ElementwiseMeasurement& e : input.elementwise) {
        if (!e.evicted && evicted.count(e.kernel)) {
          ++hot_left_out[e.kernel];
          continue;
        }
        sums[e.kernel].first += e.bytes, sums[e.kernel].second += e.seconds;
        spreads[e.kernel] = std::max(spreads[e.kernel], e.spread);
        if (e.kernel.starts_with("cross_entropy")) continue;
        bytes += e.bytes, seconds += e.seconds, widest = std::max(widest, e.spread);
      }
      std::string rates;
      for (const auto& [kernel, sum] : sums) {
        s.device.elementwise_kernels[kernel] = fitted(sum.first / sum.second, spreads[kernel], "measured: strata-elementwise");
        rates += (rates.empty() ? "" : ", ") + kernel + " " + si(sum.first / sum.second, "B/s");
      }
      if (seconds > 0) {
        s.device.elementwise_bandwidth = fitted(bytes / seconds, widest,
                                                "measured: strata-elementwise, every kernel's bytes over their seconds but the loss's");
        rates += "; together " + si(bytes / seconds, "B/s");
      }
      report.push_back("elementwise kernels: " + rates);
      for (const auto& [kernel, count] : hot_left_out)
        report.push_back("elementwise kernel " + kernel + ": " + std::to_string(count) +
                         " measurement(s) with hot operands left out for the evicted ones");
    }
  }

  // A model per operation, algorithm, group kind and size measured at three sizes or more.
  void fit_collectives() {
    std::map<Key, std::vector<const CollectiveMeasurement*>> measured_of;
    for (const CollectiveMeasurement& m : input.collectives) {
      const Key key{m.op, m.algorithm, m.group, m.ranks, m.blocking};
      measured_of[key].push_back(&m);
      emulated[key] = emulated[key] || (m.emulated && m.group != GroupKind::intra_node);
    }
    for (const auto& [key, measured] : measured_of) {
      const auto& [op, algorithm, group, ranks, blocking] = key;
      std::vector<std::pair<double, double>> points;  // (bytes, seconds) of every case, both placements pooled
      for (const CollectiveMeasurement* m : measured) points.emplace_back(m->bytes, m->seconds);
      const std::string name = std::string(coll::name(op)) + " " + algorithm + " " + group_kind_name(group) +
                               " n=" + std::to_string(ranks) + (blocking ? " blocking" : "");
      const SizeSeries series = series_of(points, coll::bus_factor(op, ranks));
      if (series.bytes.size() < 3) {
        report.push_back(name + ": " + std::to_string(series.bytes.size()) + " size(s), fewer than 3: not fitted");
        continue;
      }
      const std::string source =
          "fitted: strata-collective, " + std::to_string(series.bytes.size()) + " sizes " + bytes_text(series.bytes.front()) +
          " to " + bytes_text(series.bytes.back()) + (blocking ? " timed one call at a time (--mode blocking)" : "") +
          ", medians of the per-iteration max over ranks (" + input.provenance +
          ")" + (emulated.at(key) ? "; nodes emulated on one machine (--ranks-per-node): shared memory, not a network" : "");
      s.collectives.push_back(fit_collective(op, algorithm, group, ranks, series, source));
      s.collectives.back().blocking = blocking;
      s.collectives.back().points = measured_points(measured, s.collectives.back());
      report.push_back(name + ": " + model_text(s.collectives.back()));
    }
  }

  // A tier's latency and bandwidth: from its point-to-point sizes; else its best-covered fitted allreduce; else the
  // base's.
  void fit_tier(GroupKind kind, NetworkTier& tier, const NetworkTier* base_tier) {
    const std::string tier_name = group_kind_name(kind);
    std::vector<std::pair<double, double>> transfers;
    bool tier_emulated = false;
    for (const TransferMeasurement& t : input.transfers)
      if (t.group == kind) transfers.emplace_back(t.bytes, t.seconds), tier_emulated = tier_emulated || t.emulated;
    const SizeSeries series = series_of(transfers, 1);
    const std::string emulated_note =
        tier_emulated ? "; nodes emulated on one machine (--ranks-per-node): shared memory, not a network" : "";
    if (series.bytes.size() >= 3) {
      // One latency and bandwidth per tier: the largest sizes set the bandwidth, the smallest the latency.
      const RangesFit fit = fit_ranges(series);
      tier.latency = fit.ranges.front().model.latency;
      tier.bandwidth = fit.ranges.back().model.bandwidth;
      const std::string source = "fitted: strata-collective sendrecv (ring neighbour exchange), " +
                                 std::to_string(series.bytes.size()) + " sizes, " + std::to_string(fit.ranges.size()) +
                                 " range(s), residual " + percent(fit.residual) + emulated_note;
      tier.latency.source = source + "; latency of the smallest sizes' range";
      tier.bandwidth.source = source + "; bandwidth of the largest sizes' range";
      tier.source = "measured" + std::string(tier_emulated ? ", emulated on one machine" : "");
      report.push_back(tier_name + " tier: latency " + si(tier.latency.value, "s") + ", bandwidth " +
                       si(tier.bandwidth.value, "B/s") + " (sendrecv, residual " + percent(fit.residual) + ")" +
                       (tier_emulated ? ", emulated nodes" : ""));
      return;
    }
    // Without point-to-point sizes: the tier's ring figures from its best-covered fitted allreduce (ring first).
    const CollectiveModel* best = nullptr;
    for (const bool blocking : {false, true}) {  // the tier's bandwidth is a stream's: pipelined sizes first
      for (const char* algorithm : {"ring", "library"})
        for (const CollectiveModel& m : s.collectives)
          if (!best && m.group == kind && m.blocking == blocking && m.op == coll::Operation::allreduce && m.algorithm == algorithm)
            best = &m;
      for (const CollectiveModel& m : s.collectives)
        if (!best && m.group == kind && m.blocking == blocking) best = &m;
    }
    if (best) {
      const bool chunked = best->form == CollectiveForm::chunked;
      tier.latency = chunked ? best->chunked.latency : best->ranges.front().model.latency;
      tier.bandwidth = chunked ? best->chunked.bandwidth : best->ranges.back().model.bandwidth;
      const std::string source = std::string("from the fitted ") + std::string(coll::name(best->op)) + " " + best->algorithm +
                                 " (busbw is a ring's link bandwidth)" + (emulated.count({best->op, best->algorithm, kind, best->ranks, best->blocking}) &&
                                 emulated.at({best->op, best->algorithm, kind, best->ranks, best->blocking}) ? "; emulated nodes" : "");
      tier.latency.source = source;
      tier.bandwidth.source = source;
      tier.source = "measured";
      report.push_back(tier_name + " tier: latency " + si(tier.latency.value, "s") + ", bandwidth " +
                       si(tier.bandwidth.value, "B/s") + " (" + source + ")");
      return;
    }
    if (base_tier) {
      tier = *base_tier;
      tier.bandwidth = based_quantity(tier.bandwidth);
      tier.latency = based_quantity(tier.latency);
      tier.source = based(tier.source);
      report.push_back(tier_name + " tier: " + from_base);
      return;
    }
    out.missing.push_back(std::string("no strata-collective run with ") +
                          (kind == GroupKind::intra_node ? "intra-node groups (all ranks of a group on one node)"
                                                         : "inter-node groups (one rank per node; e.g. --group inter, "
                                                           "or --ranks-per-node 1 to emulate nodes on one machine)") +
                          ": the " + tier_name + " tier cannot be fitted");
  }

  // The base's models of what was not measured here. A collective measured here in either mode replaces the base's
  // models of it in both: a call of the other mode takes the fresh measurement before an older one.
  void keep_base_collectives() {
    const auto fresh = static_cast<std::ptrdiff_t>(s.collectives.size());
    if (base)
      for (const CollectiveModel& m : base->collectives) {
        // Against the fresh models only: a base's two modes of a collective not measured here are both kept.
        const bool measured = std::any_of(s.collectives.begin(), s.collectives.begin() + fresh, [&m](const CollectiveModel& f) {
          return f.op == m.op && f.algorithm == m.algorithm && f.group == m.group && f.ranks == m.ranks;
        });
        if (measured) continue;
        CollectiveModel kept = m;
        kept.source = based(kept.source);
        s.collectives.push_back(kept);
      }
    bool hierarchical = false;
    for (const CollectiveModel& m : s.collectives) hierarchical = hierarchical || m.group == GroupKind::hierarchical;
    if (!hierarchical)
      report.push_back("hierarchical groups: not measured (needs two or more nodes of two or more ranks): the "
                       "inter_node tier stands in");
  }

  void fit_contention() {
    std::vector<double> contention;
    for (const ContentionMeasurement& c : input.contention) contention.push_back(c.slowdown);
    if (!contention.empty()) {
      std::string line;
      s.collective_contention = slowdown_quantity(contention, "operations and sizes of strata-collective --mixed", line);
      report.push_back("collective contention c = " + line);
    } else if (base && base->collective_contention) {
      s.collective_contention = based_quantity(*base->collective_contention);
      report.push_back("collective contention: " + from_base);
    } else {
      report.push_back("collective contention: not measured (no strata-collective --mixed run with TP and DP groups of "
                       "two or more ranks each; needs 4 ranks)");
    }
  }

  // The overlap slowdown s and the communication slowdown, from strata-interference's cases.
  void fit_overlap() {
    std::vector<double> compute_slowdowns, communication_slowdowns;
    for (const InterferenceMeasurement& i : input.interference) {
      compute_slowdowns.push_back(i.compute_slowdown);
      communication_slowdowns.push_back(i.communication_slowdown);
    }
    if (!compute_slowdowns.empty()) {
      std::string line;
      s.overlap_slowdown = slowdown_quantity(compute_slowdowns, "kernel, collective and size cases of strata-interference", line);
      report.push_back("overlap slowdown s = " + line);
      s.communication_slowdown =
          slowdown_quantity(communication_slowdowns, "kernel, collective and size cases of strata-interference", line);
      report.push_back("communication slowdown = " + line);
    } else if (base) {
      s.overlap_slowdown = based_quantity(base->overlap_slowdown);
      if (base->communication_slowdown) s.communication_slowdown = based_quantity(*base->communication_slowdown);
      report.push_back("overlap slowdown: " + from_base);
    } else {
      out.missing.push_back("no strata-interference run: the overlap slowdown s cannot be fitted");
    }
  }

  const CalibrationInput& input;
  const System* base;
  const std::string from_base;
  Calibration out;
  System& s = out.system;
  std::vector<std::string>& report = out.report;
  std::map<Key, bool> emulated;  // per fitted collective: its inter-node groups were emulated nodes
};

}  // namespace

Calibration calibrate(const CalibrationInput& input, const System* base, const std::string& base_name) {
  return Calibrator(input, base, base_name).run();
}

}  // namespace strata::project
