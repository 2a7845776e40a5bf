#include "project/system.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace strata::project {

double EfficiencyCurve::at(double flops) const {
  if (points.empty()) throw std::invalid_argument("an efficiency curve without points");
  if (flops <= points.front().flops) return points.front().efficiency;
  if (flops >= points.back().flops) return points.back().efficiency;
  for (size_t i = 1; i < points.size(); ++i) {
    if (flops > points[i].flops) continue;
    const EfficiencyPoint& lo = points[i - 1];
    const EfficiencyPoint& hi = points[i];
    const double w = (std::log10(flops) - std::log10(lo.flops)) / (std::log10(hi.flops) - std::log10(lo.flops));
    return lo.efficiency + w * (hi.efficiency - lo.efficiency);
  }
  return points.back().efficiency;
}

double Device::gemm_seconds(const std::string& dtype, double flops) const {
  const auto it = compute.find(dtype);
  if (it == compute.end()) throw std::invalid_argument("the system's device has no peak for dtype " + dtype);
  if (flops <= 0) return 0;
  return flops / (it->second.peak_flops.value * it->second.efficiency.at(flops));
}

double Device::elementwise_seconds(double bytes) const {
  return bytes / (memory_bandwidth.value * memory_efficiency.value);
}

const char* collective_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::allreduce: return "allreduce";
    case CollectiveOp::allgather: return "allgather";
    case CollectiveOp::reduce_scatter: return "reduce_scatter";
    case CollectiveOp::alltoall: return "alltoall";
    case CollectiveOp::broadcast: return "broadcast";
    case CollectiveOp::reduce: return "reduce";
  }
  return "?";
}

std::vector<CollectiveOp> all_collectives() {
  return {CollectiveOp::allreduce, CollectiveOp::allgather, CollectiveOp::reduce_scatter,
          CollectiveOp::alltoall,  CollectiveOp::broadcast, CollectiveOp::reduce};
}

std::optional<CollectiveOp> collective_from_name(const std::string& name) {
  for (CollectiveOp op : all_collectives())
    if (name == collective_name(op)) return op;
  return std::nullopt;
}

double bus_factor(CollectiveOp op, int ranks) {
  const double n = ranks;
  switch (op) {
    case CollectiveOp::allreduce: return 2 * (n - 1) / n;
    case CollectiveOp::allgather:
    case CollectiveOp::reduce_scatter:
    case CollectiveOp::alltoall: return (n - 1) / n;
    case CollectiveOp::broadcast:
    case CollectiveOp::reduce: return 1;
  }
  return 1;
}

LatencyBandwidth NetworkTier::model(CollectiveOp op) const {
  const auto it = collectives.find(op);
  return it != collectives.end() ? it->second : LatencyBandwidth{latency, bandwidth};
}

double NetworkTier::collective_seconds(CollectiveOp op, double bytes, int ranks) const {
  if (ranks <= 1) return 0;  // a group of one moves nothing
  const LatencyBandwidth m = model(op);
  return m.latency.value + bytes * bus_factor(op, ranks) / m.bandwidth.value;
}

double NetworkTier::transfer_seconds(double bytes) const { return latency.value + bytes / bandwidth.value; }

namespace {

std::string number(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

// Each check returns the problem with one field, or nothing.
std::optional<std::string> check_spread(const std::string& field, double spread) {
  if (!std::isfinite(spread) || spread < 0)
    return field + ".spread must be a non-negative number (got " + number(spread) + ")";
  return std::nullopt;
}

std::optional<std::string> check_positive(const std::string& field, const Quantity& q) {
  if (!std::isfinite(q.value) || q.value <= 0) return field + " must be positive (got " + number(q.value) + ")";
  return check_spread(field, q.relative_spread);
}

std::optional<std::string> check_non_negative(const std::string& field, const Quantity& q) {
  if (!std::isfinite(q.value) || q.value < 0) return field + " must not be negative (got " + number(q.value) + ")";
  return check_spread(field, q.relative_spread);
}

std::optional<std::string> check_fraction(const std::string& field, double x) {
  if (!std::isfinite(x) || x <= 0 || x > 1) return field + " must be in (0, 1] (got " + number(x) + ")";
  return std::nullopt;
}

std::optional<std::string> check_tier(const std::string& field, const NetworkTier& tier) {
  if (auto p = check_positive(field + ".bandwidth", tier.bandwidth)) return p;
  if (auto p = check_non_negative(field + ".latency", tier.latency)) return p;
  for (const auto& [op, m] : tier.collectives) {
    const std::string f = field + ".collectives." + collective_name(op);
    if (auto p = check_non_negative(f + ".latency", m.latency)) return p;
    if (auto p = check_positive(f + ".bandwidth", m.bandwidth)) return p;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> find_problem(const System& system) {
  if (system.version != kSystemFormatVersion)
    return "version must be " + std::to_string(kSystemFormatVersion) + " (got " + std::to_string(system.version) +
           ")";
  const Device& d = system.device;
  if (d.devices_per_node < 1)
    return "device.devices_per_node must be at least 1 (got " + std::to_string(d.devices_per_node) + ")";
  if (d.compute.empty()) return "device.compute must name at least one dtype";
  for (const auto& [dtype, peak] : d.compute) {
    const std::string f = "device.compute." + dtype;
    if (auto p = check_positive(f + ".peak_flops", peak.peak_flops)) return p;
    const std::vector<EfficiencyPoint>& points = peak.efficiency.points;
    if (points.empty()) return f + ".efficiency.points must hold at least one [flops, efficiency] point";
    for (size_t i = 0; i < points.size(); ++i) {
      const std::string fp = f + ".efficiency.points[" + std::to_string(i) + "]";
      if (!std::isfinite(points[i].flops) || points[i].flops <= 0)
        return fp + " flops must be positive (got " + number(points[i].flops) + ")";
      if (i > 0 && points[i].flops <= points[i - 1].flops) return fp + " flops must exceed the previous point's";
      if (auto p = check_fraction(fp + " efficiency", points[i].efficiency)) return p;
    }
    if (auto p = check_spread(f + ".efficiency", peak.efficiency.relative_spread)) return p;
  }
  if (auto p = check_positive("device.memory_bandwidth", d.memory_bandwidth)) return p;
  if (auto p = check_fraction("device.memory_efficiency", d.memory_efficiency.value)) return p;
  if (auto p = check_spread("device.memory_efficiency", d.memory_efficiency.relative_spread)) return p;
  if (auto p = check_tier("network.intra_node", system.intra_node)) return p;
  if (auto p = check_tier("network.inter_node", system.inter_node)) return p;
  if (auto p = check_non_negative("overlap_slowdown", system.overlap_slowdown)) return p;
  return std::nullopt;
}

}  // namespace strata::project
