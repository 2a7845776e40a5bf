#include "project/system.h"

#include <algorithm>
#include <limits>
#include <map>
#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace strata::project {

double EfficiencyCurve::at(double x) const {
  const double flops = x;  // or the sequence length of a curve over seq_kv: the same interpolation
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

double AttentionShape::flops() const {
  const double forward = 4.0 * static_cast<double>(batch) * static_cast<double>(heads) * static_cast<double>(seq_q) *
                         static_cast<double>(seq_kv) * static_cast<double>(head_dim) * (causal ? 0.5 : 1.0);
  return backward ? 2.5 * forward : forward;
}

std::optional<double> dtype_bytes(const std::string& dtype) {
  if (dtype == "fp8") return 1;
  if (dtype == "fp16" || dtype == "bf16") return 2;
  if (dtype == "fp32" || dtype == "tf32") return 4;
  if (dtype == "fp64") return 8;
  return std::nullopt;
}

namespace {

const ComputePeak& peak_of(const Device& device, const std::string& dtype) {
  const auto it = device.compute.find(dtype);
  if (it == device.compute.end()) throw std::invalid_argument("the system's device has no peak for dtype " + dtype);
  return it->second;
}

// A measured point's efficiency at log10 of its FLOPs.
struct Measured {
  double log_flops;
  double efficiency;
};

// The efficiency at `log_flops` linearly between the nearest measured points below and above it (points of equal
// FLOPs averaged); nothing outside their range, where the caller falls back to its curve.
std::optional<double> interpolate(std::vector<Measured> points, double log_flops) {
  if (points.empty()) return std::nullopt;
  std::sort(points.begin(), points.end(), [](const Measured& a, const Measured& b) { return a.log_flops < b.log_flops; });
  // Tolerance for "the same FLOPs": shapes with equal 2mnk computed in a different order.
  constexpr double kSame = 1e-9;
  if (log_flops < points.front().log_flops - kSame || log_flops > points.back().log_flops + kSame) return std::nullopt;
  auto mean_at = [&](double x) {
    double sum = 0;
    int count = 0;
    for (const Measured& p : points)
      if (std::abs(p.log_flops - x) <= kSame) sum += p.efficiency, ++count;
    return sum / count;
  };
  double below = points.front().log_flops, above = points.back().log_flops;
  for (const Measured& p : points) {
    if (p.log_flops <= log_flops + kSame) below = p.log_flops;
    if (p.log_flops >= log_flops - kSame) {
      above = p.log_flops;
      break;
    }
  }
  if (above - below <= kSame) return mean_at(below);
  const double w = (log_flops - below) / (above - below);
  return mean_at(below) + w * (mean_at(above) - mean_at(below));
}

}  // namespace

double Device::gemm_seconds(const std::string& dtype, double flops) const {
  const ComputePeak& c = peak_of(*this, dtype);
  if (flops <= 0) return 0;
  return flops / (c.peak_flops.value * c.efficiency.at(flops));
}

double Device::gemm_seconds(const std::string& dtype, std::int64_t m, std::int64_t n, std::int64_t k) const {
  const ComputePeak& c = peak_of(*this, dtype);
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  return launch_gap() + gemm_kernel_seconds(c, dtype, m, n, k);
}

double Device::gemm_kernel_seconds(const ComputePeak& c, const std::string& dtype, std::int64_t m, std::int64_t n,
                                   std::int64_t k) const {
  const GemmPoint call{m, n, k, {}};
  const double flops = call.flops();
  for (const GemmPoint& p : c.gemm_points)
    if (p.m == m && p.n == n && p.k == k) return p.seconds.value;
  // Similar aspect: m/k and n/k each within a factor 2 of the call's, so a skinny GEMM is not read off square ones.
  const double aspect_m = std::log(static_cast<double>(m) / static_cast<double>(k));
  const double aspect_n = std::log(static_cast<double>(n) / static_cast<double>(k));
  std::vector<Measured> similar;
  for (const GemmPoint& p : c.gemm_points) {
    const double pm = std::log(static_cast<double>(p.m) / static_cast<double>(p.k));
    const double pn = std::log(static_cast<double>(p.n) / static_cast<double>(p.k));
    if (std::abs(pm - aspect_m) <= std::log(2.0) + 1e-12 && std::abs(pn - aspect_n) <= std::log(2.0) + 1e-12)
      similar.push_back({std::log10(p.flops()), p.flops() / (c.peak_flops.value * p.seconds.value)});
  }
  if (auto efficiency = interpolate(similar, std::log10(flops))) return flops / (c.peak_flops.value * *efficiency);
  const double compute_s = flops / (c.peak_flops.value * c.efficiency.at(flops));
  const std::optional<double> element = dtype_bytes(dtype);
  if (!element) return compute_s;
  const double bytes = (static_cast<double>(m) * static_cast<double>(k) + static_cast<double>(n) * static_cast<double>(k) +
                        static_cast<double>(m) * static_cast<double>(n)) * *element;
  return std::max(compute_s, elementwise_seconds(bytes));
}

double Device::attention_seconds(const std::string& dtype, const AttentionShape& shape, std::string_view kernel) const {
  const ComputePeak& c = peak_of(*this, dtype);
  double speed = 1;
  if (!kernel.empty()) {
    const auto named = attention_kernels.find(kernel);
    if (named == attention_kernels.end())
      throw std::invalid_argument("device '" + name + "' describes no attention kernel '" + std::string(kernel) + "'");
    speed = shape.backward ? named->second.backward.value : named->second.forward.value;
  }
  const double flops = shape.flops();
  if (flops <= 0) return 0;
  return launch_gap() + attention_kernel_seconds(c, shape) / speed;
}

double Device::attention_kernel_seconds(const ComputePeak& c, const AttentionShape& shape) const {
  const double flops = shape.flops();
  auto kv = [](const AttentionShape& s) { return s.kv_heads > 0 ? s.kv_heads : s.heads; };
  for (const AttentionPoint& p : c.attention_points) {
    const AttentionShape& s = p.shape;
    if (s.batch == shape.batch && s.heads == shape.heads && kv(s) == kv(shape) && s.seq_q == shape.seq_q &&
        s.seq_kv == shape.seq_kv && s.head_dim == shape.head_dim && s.causal == shape.causal &&
        s.backward == shape.backward)
      return p.seconds.value;
  }
  std::vector<Measured> similar;
  for (const AttentionPoint& p : c.attention_points)
    if (p.shape.causal == shape.causal && p.shape.backward == shape.backward && p.shape.head_dim == shape.head_dim)
      similar.push_back({std::log10(p.shape.flops()), p.shape.flops() / (c.peak_flops.value * p.seconds.value)});
  if (auto efficiency = interpolate(similar, std::log10(flops))) return flops / (c.peak_flops.value * *efficiency);
  const auto curve = c.attention_efficiency.find(shape.backward ? "bwd" : "fwd");
  const EfficiencyCurve& efficiency = curve != c.attention_efficiency.end() ? curve->second : c.efficiency;
  const double x = efficiency.over == "seq_kv" ? static_cast<double>(shape.seq_kv) : flops;
  return flops / (c.peak_flops.value * efficiency.at(x));
}

double Device::elementwise_seconds(double bytes) const {
  return bytes / (memory_bandwidth.value * memory_efficiency.value);
}

double Device::elementwise_seconds(std::string_view op_name, double bytes) const {
  if (bytes <= 0) return 0;
  const std::string_view kernel_name = elementwise_kernel_of(op_name);
  if (fused_into_gemm.contains(kernel_name)) return 0;
  if (const auto kernel = elementwise_kernels.find(kernel_name); kernel != elementwise_kernels.end())
    return launch_gap() + bytes / kernel->second.value;
  if (elementwise_bandwidth) return launch_gap() + bytes / elementwise_bandwidth->value;
  return launch_gap() + elementwise_seconds(bytes);
}

std::string_view elementwise_kernel_of(std::string_view op_name) {
  static const std::map<std::string_view, std::string_view> kernels = {
      {"ln1", "layernorm_forward"},          {"ln2", "layernorm_forward"},
      {"lnf", "layernorm_forward"},          {"norm backward", "layernorm_backward"},
      {"gelu", "gelu_forward"},              {"gelu backward", "gelu_backward"},
      {"residual", "residual_forward"},      {"copy", "copy"},
      {"split heads", "permute_qkv"},        {"merge qkv", "permute_qkv"},
      {"merge heads", "permute_heads"},      {"split head grads", "permute_heads"},
      {"bias", "add_bias"},                  {"accumulate grads", "accumulate"},
      {"bias fill", "fill_bias"},            {"bias grad", "bias_gradient"},
      {"adamw", "adamw"},                    {"squared norm", "squared_norm"},
      {"cross-entropy", "cross_entropy_forward"}, {"cross-entropy backward", "cross_entropy_backward"},
      {"logit max", "cross_entropy_row_max"},  {"sum of exponentials", "cross_entropy_row_sum_exp"}};
  const auto kernel = kernels.find(op_name);
  return kernel == kernels.end() ? "" : kernel->second;
}

std::vector<coll::Operation> all_collectives() {
  std::vector<coll::Operation> modelled;
  for (coll::Operation op : coll::kAllOperations)
    if (op != coll::Operation::sendrecv) modelled.push_back(op);
  return modelled;
}

std::optional<coll::Operation> collective_from_name(const std::string& name) {
  const std::optional<coll::Operation> op = coll::parse_operation(name);
  return op && *op != coll::Operation::sendrecv ? op : std::nullopt;
}

const Quantity& NetworkTier::latency_of(coll::Operation op) const {
  const auto it = collectives.find(op);
  return it != collectives.end() ? it->second.latency : latency;
}

const Quantity& NetworkTier::bandwidth_of(coll::Operation op) const {
  const auto it = collectives.find(op);
  return it != collectives.end() ? it->second.bandwidth : bandwidth;
}

double NetworkTier::collective_seconds(coll::Operation op, double bytes, int ranks) const {
  if (ranks <= 1) return 0;  // a group of one moves nothing
  return latency_of(op).value + bytes * coll::bus_factor(op, ranks) / bandwidth_of(op).value;
}

double NetworkTier::transfer_seconds(double bytes) const { return latency.value + bytes / bandwidth.value; }

const char* group_kind_name(GroupKind kind) {
  switch (kind) {
    case GroupKind::intra_node: return "intra_node";
    case GroupKind::inter_node: return "inter_node";
    case GroupKind::hierarchical: return "hierarchical";
  }
  return "?";
}

std::optional<GroupKind> group_kind_from_name(const std::string& name) {
  for (GroupKind kind : {GroupKind::intra_node, GroupKind::inter_node, GroupKind::hierarchical})
    if (name == group_kind_name(kind)) return kind;
  return std::nullopt;
}

int members_per_node(const std::vector<int>& node_of_member) {
  std::map<int, int> count;
  for (int node : node_of_member) ++count[node];
  int fewest = 0;
  for (const auto& [node, n] : count) fewest = fewest == 0 ? n : std::min(fewest, n);
  return std::max(fewest, 1);
}

GroupKind group_kind_of(const std::vector<int>& node_of_member) {
  const std::set<int> nodes(node_of_member.begin(), node_of_member.end());
  if (nodes.size() <= 1) return GroupKind::intra_node;
  return nodes.size() == node_of_member.size() ? GroupKind::inter_node : GroupKind::hierarchical;
}

const char* collective_form_name(CollectiveForm form) {
  return form == CollectiveForm::chunked ? "chunked" : "latency_bandwidth";
}

double CollectiveModel::seconds(double bytes, int group_ranks) const {
  if (group_ranks <= 1) return 0;  // a group of one moves nothing
  if (group_ranks == ranks && !points.empty() && bytes >= points.front().bytes && bytes <= points.back().bytes) {
    const auto above = std::lower_bound(points.begin(), points.end(), bytes,
                                        [](const CollectivePoint& p, double b) { return p.bytes < b; });
    if (above->bytes == bytes) return above->seconds.value;
    const CollectivePoint& below = *std::prev(above);
    const double t = std::log(bytes / below.bytes) / std::log(above->bytes / below.bytes);
    return below.seconds.value * std::pow(above->seconds.value / below.seconds.value, t);
  }
  const double x = bytes * coll::bus_factor(op, group_ranks);
  if (form == CollectiveForm::chunked)
    return chunked.latency.value + std::ceil(x / chunked.chunk_bytes) * chunked.per_chunk.value +
           x / chunked.bandwidth.value;
  if (ranges.empty()) throw std::invalid_argument("a latency-bandwidth collective model without ranges");
  for (const SizeRange& range : ranges)
    if (bytes <= range.up_to_bytes) return range.model.latency.value + x / range.model.bandwidth.value;
  return ranges.back().model.latency.value + x / ranges.back().model.bandwidth.value;
}

const CollectiveModel* System::find_collective(coll::Operation op, std::string_view algorithm, GroupKind kind,
                                               int ranks, bool blocking) const {
  auto nearest = [&](bool mode) {
    const CollectiveModel* best = nullptr;
    double best_distance = 0;
    for (const CollectiveModel& m : collectives) {
      if (m.op != op || m.algorithm != algorithm || m.group != kind || m.blocking != mode) continue;
      // Nearest measured group size in log terms; of two equally near, the larger.
      const double distance = std::abs(std::log(static_cast<double>(m.ranks)) - std::log(std::max(1, ranks)));
      if (!best || distance < best_distance - 1e-12 || (distance <= best_distance + 1e-12 && m.ranks > best->ranks))
        best = &m, best_distance = distance;
    }
    return best;
  };
  // A model measured at the call's group size first, of its own mode, then of the other (a ring's steps follow the
  // group size more than the mode); else the nearest size of its own mode, then of the other (a measurement of the
  // operation) before the tier's generic model.
  const CollectiveModel* own = nearest(blocking);
  const CollectiveModel* other = nearest(!blocking);
  if (own && own->ranks == ranks) return own;
  if (other && other->ranks == ranks) return other;
  return own ? own : other;
}

double RingLatency::seconds(double bus_bytes, double bandwidth, int ranks, int nodes) const {
  const double inter_steps = std::max(nodes - 1, 0);
  const double intra_steps = std::max(ranks - 1 - static_cast<int>(inter_steps), 0);
  const bool one_per_node = nodes >= ranks;
  double fastest = std::numeric_limits<double>::infinity();
  for (const auto& [name, p] : protocols) {
    const double factor = one_per_node ? p.bandwidth_factor_one_per_node : p.bandwidth_factor;
    fastest = std::min(fastest, p.base.value + intra_steps * p.intra_step.value + inter_steps * p.inter_step.value +
                                    bus_bytes / (factor * bandwidth));
  }
  return fastest;
}

bool runs_as_library_ring(std::string_view algorithm) { return algorithm == "library" || algorithm == "ring"; }

double System::collective_seconds(coll::Operation op, std::string_view algorithm, GroupKind kind, double bytes, int ranks,
                                  int per_node, bool blocking) const {
  if (ranks <= 1) return 0;
  if (const CollectiveModel* m = find_collective(op, algorithm, kind, ranks, blocking)) return m->seconds(bytes, ranks);
  if (kind == GroupKind::intra_node) return intra_node.collective_seconds(op, bytes, ranks);
  const double across = inter_node.bandwidth_of(op).value;
  const bool one_per_node = kind == GroupKind::inter_node || per_node <= 1;
  const double bandwidth = one_per_node ? across : std::min(intra_node.bandwidth_of(op).value, per_node * across);
  const double bus_bytes = bytes * coll::bus_factor(op, ranks);
  const double tiers = inter_node.latency_of(op).value + bus_bytes / bandwidth;
  // NCCL runs these two as rings only (its tree is for allreduce, whose latency grows with log2 of the nodes).
  const bool ring_only = op == coll::Operation::allgather || op == coll::Operation::reduce_scatter;
  if (!ring_latency || !ring_only || !runs_as_library_ring(algorithm)) return tiers;
  const int nodes = one_per_node ? ranks : (ranks + per_node - 1) / per_node;
  return std::max(tiers, ring_latency->seconds(bus_bytes, bandwidth, ranks, nodes));
}

namespace {

std::string number(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}

// Each check returns the problem with one field, or nothing.
std::optional<std::string> check_spread(const std::string& field, double spread) {
  // A relative spread: 1 is 100 %; past 100 (10,000 %) a figure says nothing.
  if (!std::isfinite(spread) || spread < 0 || spread > 100)
    return field + ".spread must be a relative spread from 0 to 100 (got " + number(spread) + ")";
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

std::optional<std::string> check_curve(const std::string& field, const EfficiencyCurve& curve, bool attention = false) {
  if (curve.over != "flops" && !(attention && curve.over == "seq_kv"))
    return field + ".over must be " + (attention ? "flops or seq_kv" : "flops") + " (got " + curve.over + ")";
  const std::vector<EfficiencyPoint>& points = curve.points;
  if (points.empty()) return field + ".points must hold at least one [flops, efficiency] point";
  for (size_t i = 0; i < points.size(); ++i) {
    const std::string fp = field + ".points[" + std::to_string(i) + "]";
    if (!std::isfinite(points[i].flops) || points[i].flops <= 0)
      return fp + " flops must be positive (got " + number(points[i].flops) + ")";
    if (i > 0 && points[i].flops <= points[i - 1].flops) return fp + " flops must exceed the previous point's";
    if (auto p = check_fraction(fp + " efficiency", points[i].efficiency)) return p;
  }
  return check_spread(field, curve.relative_spread);
}

std::optional<std::string> check_count(const std::string& field, std::int64_t value) {
  if (value < 1) return field + " must be at least 1 (got " + std::to_string(value) + ")";
  return std::nullopt;
}

std::optional<std::string> check_points(const std::string& field, const ComputePeak& peak) {
  for (size_t i = 0; i < peak.gemm_points.size(); ++i) {
    const GemmPoint& p = peak.gemm_points[i];
    const std::string f = field + ".gemm_points[" + std::to_string(i) + "]";
    if (auto e = check_count(f + ".m", p.m)) return e;
    if (auto e = check_count(f + ".n", p.n)) return e;
    if (auto e = check_count(f + ".k", p.k)) return e;
    if (auto e = check_positive(f + ".seconds", p.seconds)) return e;
  }
  for (size_t i = 0; i < peak.attention_points.size(); ++i) {
    const AttentionShape& s = peak.attention_points[i].shape;
    const std::string f = field + ".attention_points[" + std::to_string(i) + "]";
    for (const auto& [name, value] : {std::pair{"batch", s.batch}, std::pair{"heads", s.heads},
                                      std::pair{"kv_heads", s.kv_heads}, std::pair{"seq_q", s.seq_q},
                                      std::pair{"seq_kv", s.seq_kv}, std::pair{"head_dim", s.head_dim}})
      if (auto e = check_count(f + "." + name, value)) return e;
    if (s.heads % s.kv_heads != 0)
      return f + ".kv_heads must divide heads (got " + std::to_string(s.kv_heads) + " of " + std::to_string(s.heads) + ")";
    if (auto e = check_positive(f + ".seconds", peak.attention_points[i].seconds)) return e;
  }
  for (const auto& [pass, curve] : peak.attention_efficiency) {
    if (pass != "fwd" && pass != "bwd") return field + ".attention_efficiency." + pass + " must be fwd or bwd";
    if (auto e = check_curve(field + ".attention_efficiency." + pass, curve, true)) return e;
  }
  return std::nullopt;
}

std::optional<std::string> check_residual(const std::string& field, double residual) {
  if (!std::isfinite(residual) || residual < 0)
    return field + " must be a non-negative number (got " + number(residual) + ")";
  return std::nullopt;
}

std::optional<std::string> check_collective(const std::string& field, const CollectiveModel& m) {
  if (m.algorithm.empty()) return field + ".algorithm must name the algorithm (e.g. ring, library)";
  if (m.ranks < 2) return field + ".ranks must be at least 2 (got " + std::to_string(m.ranks) + ")";
  if (m.form == CollectiveForm::chunked) {
    const ChunkedModel& c = m.chunked;
    if (auto p = check_non_negative(field + ".latency", c.latency)) return p;
    if (!std::isfinite(c.chunk_bytes) || c.chunk_bytes <= 0)
      return field + ".chunk_bytes must be positive (got " + number(c.chunk_bytes) + ")";
    if (auto p = check_non_negative(field + ".per_chunk", c.per_chunk)) return p;
    if (auto p = check_positive(field + ".bandwidth", c.bandwidth)) return p;
    if (auto p = check_residual(field + ".residual", c.residual)) return p;
  } else {
    if (m.ranges.empty()) return field + ".ranges must hold at least one size range";
    for (size_t i = 0; i < m.ranges.size(); ++i) {
      const SizeRange& r = m.ranges[i];
      const std::string f = field + ".ranges[" + std::to_string(i) + "]";
      const bool last = i + 1 == m.ranges.size();
      if (last && !std::isinf(r.up_to_bytes))
        return f + ".up_to_bytes must be absent on the last range (it covers every larger size)";
      if (!last && (!std::isfinite(r.up_to_bytes) || r.up_to_bytes <= 0))
        return f + ".up_to_bytes must be positive (got " + number(r.up_to_bytes) + "); only the last range is unbounded";
      if (i > 0 && !last && r.up_to_bytes <= m.ranges[i - 1].up_to_bytes)
        return f + ".up_to_bytes must exceed the previous range's";
      if (auto p = check_positive(f + ".bandwidth", r.model.bandwidth)) return p;
      if (i == 0) {
        if (auto p = check_non_negative(f + ".latency", r.model.latency)) return p;
      } else {
        // A later range is a piece of the curve: its line may cross zero below it, not inside it.
        if (!std::isfinite(r.model.latency.value))
          return f + ".latency must be a number (got " + number(r.model.latency.value) + ")";
        if (auto p = check_spread(f + ".latency", r.model.latency.relative_spread)) return p;
        const double start = m.ranges[i - 1].up_to_bytes * coll::bus_factor(m.op, std::max(m.ranks, 2));
        if (r.model.latency.value + start / r.model.bandwidth.value <= 0)
          return f + ".latency makes the time at the range's start (" + number(m.ranges[i - 1].up_to_bytes) +
                 " B) negative (got " + number(r.model.latency.value) + " s)";
      }
      if (auto p = check_residual(f + ".residual", r.residual)) return p;
      if (r.sizes < 0) return f + ".sizes must not be negative";
    }
  }
  for (const auto& [form, residual] : m.compared)
    if (auto p = check_residual(field + ".compared." + form, residual)) return p;
  for (size_t i = 0; i < m.points.size(); ++i) {
    const std::string f = field + ".points[" + std::to_string(i) + "]";
    const CollectivePoint& point = m.points[i];
    if (!std::isfinite(point.bytes) || point.bytes <= 0) return f + ".bytes must be positive (got " + number(point.bytes) + ")";
    if (i > 0 && point.bytes <= m.points[i - 1].bytes) return f + ".bytes must exceed the previous point's";
    if (auto p = check_positive(f + ".seconds", point.seconds)) return p;
  }
  return std::nullopt;
}

std::optional<std::string> check_tier(const std::string& field, const NetworkTier& tier) {
  if (auto p = check_positive(field + ".bandwidth", tier.bandwidth)) return p;
  if (auto p = check_non_negative(field + ".latency", tier.latency)) return p;
  for (const auto& [op, m] : tier.collectives) {
    const std::string f = field + ".collectives." + std::string(coll::name(op));
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
    if (auto p = check_curve(f + ".efficiency", peak.efficiency)) return p;
    if (auto p = check_points(f, peak)) return p;
  }
  if (auto p = check_positive("device.memory_bandwidth", d.memory_bandwidth)) return p;
  if (auto p = check_fraction("device.memory_efficiency", d.memory_efficiency.value)) return p;
  if (auto p = check_spread("device.memory_efficiency", d.memory_efficiency.relative_spread)) return p;
  if (d.memory_capacity)
    if (auto p = check_positive("device.memory_capacity", *d.memory_capacity)) return p;
  for (const auto& [kernel, rate] : d.elementwise_kernels)
    if (auto p = check_positive("device.elementwise.kernels." + kernel, rate)) return p;
  if (d.elementwise_bandwidth)
    if (auto p = check_positive("device.elementwise.bandwidth", *d.elementwise_bandwidth)) return p;
  if (d.kernel_overhead)
    if (auto p = check_non_negative("device.kernel_overhead", *d.kernel_overhead)) return p;
  for (const auto& [kernel, speed] : d.attention_kernels) {
    if (kernel.empty()) return "device.attention_kernels: a kernel needs a name (got an empty one)";
    if (kernel == "flash" || kernel == "unfused")
      return "device.attention_kernels." + kernel + ": '" + kernel + "' names how attention runs without a kernel " +
             "of the description's own (flash: the described kernel; unfused: the scores materialised)";
    if (auto p = check_positive("device.attention_kernels." + kernel + ".forward", speed.forward)) return p;
    if (auto p = check_positive("device.attention_kernels." + kernel + ".backward", speed.backward)) return p;
  }
  for (const std::string& kernel : d.fused_into_gemm)
    if (std::find(std::begin(kFusableIntoGemm), std::end(kFusableIntoGemm), kernel) == std::end(kFusableIntoGemm))
      return "device.fused_into_gemm: '" + kernel +
             "' is no kernel a GEMM's epilogue applies (fill_bias, bias_gradient)";
  if (auto p = check_tier("network.intra_node", system.intra_node)) return p;
  if (auto p = check_tier("network.inter_node", system.inter_node)) return p;
  if (system.ring_latency) {
    if (system.ring_latency->protocols.empty()) return "network.ring_latency.protocols must name at least one protocol";
    for (const auto& [name, protocol] : system.ring_latency->protocols) {
      const std::string f = "network.ring_latency.protocols." + name;
      if (auto p = check_non_negative(f + ".base", protocol.base)) return p;
      if (auto p = check_non_negative(f + ".intra_step", protocol.intra_step)) return p;
      if (auto p = check_non_negative(f + ".inter_step", protocol.inter_step)) return p;
      if (auto p = check_fraction(f + ".bandwidth_factor", protocol.bandwidth_factor)) return p;
      if (auto p = check_fraction(f + ".bandwidth_factor_one_per_node", protocol.bandwidth_factor_one_per_node))
        return p;
    }
  }
  std::set<std::tuple<coll::Operation, std::string, GroupKind, int, bool>> seen;
  for (size_t i = 0; i < system.collectives.size(); ++i) {
    const CollectiveModel& m = system.collectives[i];
    const std::string f = "collectives[" + std::to_string(i) + "]";
    if (auto p = check_collective(f, m)) return p;
    if (!seen.emplace(m.op, m.algorithm, m.group, m.ranks, m.blocking).second)
      return f + " repeats an earlier entry's operation, algorithm, group, ranks and mode (" + std::string(coll::name(m.op)) +
             ", " + m.algorithm + ", " + group_kind_name(m.group) + ", " + std::to_string(m.ranks) + ", " +
             (m.blocking ? "blocking" : "pipelined") + ")";
  }
  if (system.collective_contention)
    if (auto p = check_non_negative("collective_contention", *system.collective_contention)) return p;
  if (auto p = check_non_negative("overlap_slowdown", system.overlap_slowdown)) return p;
  if (system.communication_slowdown)
    if (auto p = check_non_negative("communication_slowdown", *system.communication_slowdown)) return p;
  return std::nullopt;
}

}  // namespace strata::project
