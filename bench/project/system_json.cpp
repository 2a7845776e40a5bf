#include "bench/harness/json_file.h"
#include "bench/project/system_json.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <unistd.h>

#include "bench/harness/check.h"
#include "bench/harness/shipped_files.h"

namespace strata {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using project::Quantity;

constexpr const char* kFormat = "strata-system";

ordered_json quantity_to_json(const Quantity& q) {
  ordered_json out = {{"value", q.value}, {"spread", q.relative_spread}};
  if (!q.source.empty()) out["source"] = q.source;
  return out;
}

ordered_json curve_to_json(const project::EfficiencyCurve& curve) {
  ordered_json points = ordered_json::array();
  for (const auto& p : curve.points) points.push_back({p.flops, p.efficiency});
  ordered_json out = {{"points", points}, {"spread", curve.relative_spread}};
  if (curve.over != "flops") out["over"] = curve.over;
  if (!curve.source.empty()) out["source"] = curve.source;
  return out;
}

ordered_json ring_latency_to_json(const project::RingLatency& ring) {
  ordered_json protocols = ordered_json::object();
  for (const auto& [name, p] : ring.protocols)
    protocols[name] = {{"base", quantity_to_json(p.base)},
                       {"intra_step", quantity_to_json(p.intra_step)},
                       {"inter_step", quantity_to_json(p.inter_step)},
                       {"bandwidth_factor", p.bandwidth_factor},
                       {"bandwidth_factor_one_per_node", p.bandwidth_factor_one_per_node}};
  ordered_json out = {{"protocols", protocols}};
  if (!ring.source.empty()) out["source"] = ring.source;
  return out;
}

ordered_json tier_to_json(const project::NetworkTier& tier) {
  ordered_json out = {{"bandwidth", quantity_to_json(tier.bandwidth)}, {"latency", quantity_to_json(tier.latency)}};
  if (!tier.source.empty()) out["source"] = tier.source;
  if (!tier.collectives.empty()) {
    ordered_json collectives = ordered_json::object();
    for (const auto& [op, model] : tier.collectives)
      collectives[std::string(coll::name(op))] = {{"latency", quantity_to_json(model.latency)},
                                                   {"bandwidth", quantity_to_json(model.bandwidth)}};
    out["collectives"] = collectives;
  }
  return out;
}

ordered_json compute_to_json(const project::ComputePeak& peak) {
  ordered_json out = {{"peak_flops", quantity_to_json(peak.peak_flops)}, {"efficiency", curve_to_json(peak.efficiency)}};
  if (!peak.attention_efficiency.empty()) {
    ordered_json curves = ordered_json::object();
    for (const auto& [pass, curve] : peak.attention_efficiency) curves[pass] = curve_to_json(curve);
    out["attention_efficiency"] = curves;
  }
  if (!peak.gemm_points.empty()) {
    ordered_json points = ordered_json::array();
    for (const auto& p : peak.gemm_points)
      points.push_back({{"m", p.m}, {"n", p.n}, {"k", p.k}, {"seconds", p.seconds.value}, {"spread", p.seconds.relative_spread}});
    out["gemm_points"] = points;
  }
  if (!peak.attention_points.empty()) {
    ordered_json points = ordered_json::array();
    for (const auto& p : peak.attention_points) {
      const project::AttentionShape& s = p.shape;
      points.push_back({{"batch", s.batch}, {"heads", s.heads}, {"kv_heads", s.kv_heads}, {"seq_q", s.seq_q},
                        {"seq_kv", s.seq_kv}, {"head_dim", s.head_dim}, {"causal", s.causal},
                        {"pass", s.backward ? "bwd" : "fwd"}, {"seconds", p.seconds.value},
                        {"spread", p.seconds.relative_spread}});
    }
    out["attention_points"] = points;
  }
  return out;
}

ordered_json collective_to_json(const project::CollectiveModel& m) {
  ordered_json out = {{"operation", std::string(coll::name(m.op))}, {"algorithm", m.algorithm},
                      {"group", project::group_kind_name(m.group)}, {"ranks", m.ranks}};
  if (m.blocking) out["mode"] = "blocking";
  out["form"] = project::collective_form_name(m.form);
  if (m.form == project::CollectiveForm::chunked) {
    out["latency"] = quantity_to_json(m.chunked.latency);
    out["chunk_bytes"] = m.chunked.chunk_bytes;
    out["per_chunk"] = quantity_to_json(m.chunked.per_chunk);
    out["bandwidth"] = quantity_to_json(m.chunked.bandwidth);
    out["residual"] = m.chunked.residual;
    out["sizes"] = m.chunked.sizes;
  } else {
    ordered_json ranges = ordered_json::array();
    for (const auto& r : m.ranges) {
      ordered_json range = ordered_json::object();
      if (std::isfinite(r.up_to_bytes)) range["up_to_bytes"] = r.up_to_bytes;
      range["latency"] = quantity_to_json(r.model.latency);
      range["bandwidth"] = quantity_to_json(r.model.bandwidth);
      range["residual"] = r.residual;
      range["sizes"] = r.sizes;
      ranges.push_back(range);
    }
    out["ranges"] = ranges;
  }
  if (!m.points.empty()) {
    ordered_json points = ordered_json::array();
    for (const auto& p : m.points)
      points.push_back({{"bytes", p.bytes}, {"seconds", p.seconds.value}, {"spread", p.seconds.relative_spread}});
    out["points"] = points;
  }
  if (!m.compared.empty()) {
    ordered_json compared = ordered_json::object();
    for (const auto& [form, residual] : m.compared) compared[form] = residual;
    out["compared"] = compared;
  }
  if (!m.source.empty()) out["source"] = m.source;
  return out;
}

// Reading: every helper names the field it reads by its path from the top, e.g. device.compute.bf16.peak_flops.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw UsageError("system description " + source_ + ": " + field + ": " + what);
  }

  const json& object(const json& parent, const std::string& key, const std::string& field) const {
    if (!parent.contains(key)) fail(field, "missing");
    const json& value = parent.at(key);
    if (!value.is_object()) fail(field, "must be a JSON object");
    return value;
  }

  const json& array(const json& parent, const std::string& key, const std::string& field) const {
    if (!parent.contains(key)) fail(field, "missing");
    const json& value = parent.at(key);
    if (!value.is_array()) fail(field, "must be a JSON array");
    return value;
  }

  void only_keys(const json& object, const std::string& field, const std::set<std::string>& allowed) const {
    for (const auto& [key, value] : object.items())
      if (!key.starts_with("_") && !allowed.count(key))
        fail(field.empty() ? key : field + "." + key, "unknown field");
  }

  double number(const json& value, const std::string& field) const {
    if (!value.is_number()) fail(field, "must be a number");
    return value.get<double>();
  }

  double number(const json& parent, const std::string& key, const std::string& field, double fallback,
                bool required) const {
    if (!parent.contains(key)) {
      if (required) fail(field, "missing");
      return fallback;
    }
    return number(parent.at(key), field);
  }

  std::int64_t integer(const json& parent, const std::string& key, const std::string& field, bool required,
                       std::int64_t fallback = 0) const {
    if (!parent.contains(key)) {
      if (required) fail(field, "missing");
      return fallback;
    }
    if (!parent.at(key).is_number_integer()) fail(field, "must be an integer");
    return parent.at(key).get<std::int64_t>();
  }

  bool boolean(const json& parent, const std::string& key, const std::string& field) const {
    if (!parent.contains(key)) fail(field, "missing");
    if (!parent.at(key).is_boolean()) fail(field, "must be true or false");
    return parent.at(key).get<bool>();
  }

  std::string text(const json& parent, const std::string& key, const std::string& field, bool required) const {
    if (!parent.contains(key)) {
      if (required) fail(field, "missing");
      return "";
    }
    if (!parent.at(key).is_string()) fail(field, "must be a string");
    return parent.at(key).get<std::string>();
  }

  Quantity quantity(const json& parent, const std::string& key, const std::string& field) const {
    if (!parent.contains(key)) fail(field, "missing");
    const json& value = parent.at(key);
    Quantity q;
    if (value.is_number()) {
      q.value = value.get<double>();
      return q;
    }
    if (!value.is_object()) fail(field, "must be a number or {\"value\", \"spread\", \"source\"}");
    only_keys(value, field, {"value", "spread", "source"});
    if (!value.contains("value")) fail(field + ".value", "missing");
    q.value = number(value.at("value"), field + ".value");
    if (value.contains("spread")) q.relative_spread = number(value.at("spread"), field + ".spread");
    q.source = text(value, "source", field + ".source", false);
    return q;
  }

  project::EfficiencyCurve curve(const json& value, const std::string& field) const {
    if (!value.is_object()) fail(field, "must be a JSON object");
    only_keys(value, field, {"points", "spread", "source", "over"});
    project::EfficiencyCurve c;
    if (value.contains("over")) c.over = text(value, "over", field + ".over", true);
    if (!value.contains("points") || !value.at("points").is_array())
      fail(field + ".points", "must be an array of [flops, efficiency] pairs");
    for (size_t i = 0; i < value.at("points").size(); ++i) {
      const json& point = value.at("points")[i];
      const std::string f = field + ".points[" + std::to_string(i) + "]";
      if (!point.is_array() || point.size() != 2) fail(f, "must be a pair [flops, efficiency]");
      c.points.push_back({number(point[0], f), number(point[1], f)});
    }
    if (value.contains("spread")) c.relative_spread = number(value.at("spread"), field + ".spread");
    c.source = text(value, "source", field + ".source", false);
    return c;
  }

  // A measured time: "seconds" with its relative "spread" beside it.
  Quantity seconds(const json& point, const std::string& field) const {
    Quantity q;
    q.value = number(point, "seconds", field + ".seconds", 0, true);
    q.relative_spread = number(point, "spread", field + ".seconds.spread", 0, false);
    return q;
  }

  project::ComputePeak compute(const json& peak, const std::string& field, int version) const {
    if (!peak.is_object()) fail(field, "must be a JSON object");
    if (version == 1)
      only_keys(peak, field, {"peak_flops", "efficiency"});
    else
      only_keys(peak, field, {"peak_flops", "efficiency", "attention_efficiency", "gemm_points", "attention_points"});
    project::ComputePeak c;
    c.peak_flops = quantity(peak, "peak_flops", field + ".peak_flops");
    c.efficiency = curve(object(peak, "efficiency", field + ".efficiency"), field + ".efficiency");
    if (peak.contains("attention_efficiency")) {
      const std::string f = field + ".attention_efficiency";
      for (const auto& [pass, value] : object(peak, "attention_efficiency", f).items()) {
        if (pass.starts_with("_")) continue;
        if (pass != "fwd" && pass != "bwd") fail(f + "." + pass, "unknown pass (fwd, bwd)");
        c.attention_efficiency[pass] = curve(value, f + "." + pass);
      }
    }
    if (peak.contains("gemm_points")) {
      const json& points = array(peak, "gemm_points", field + ".gemm_points");
      for (size_t i = 0; i < points.size(); ++i) {
        const std::string f = field + ".gemm_points[" + std::to_string(i) + "]";
        const json& p = points[i];
        if (!p.is_object()) fail(f, "must be a JSON object");
        only_keys(p, f, {"m", "n", "k", "seconds", "spread"});
        c.gemm_points.push_back({integer(p, "m", f + ".m", true), integer(p, "n", f + ".n", true),
                                 integer(p, "k", f + ".k", true), seconds(p, f)});
      }
    }
    if (peak.contains("attention_points")) {
      const json& points = array(peak, "attention_points", field + ".attention_points");
      for (size_t i = 0; i < points.size(); ++i) {
        const std::string f = field + ".attention_points[" + std::to_string(i) + "]";
        const json& p = points[i];
        if (!p.is_object()) fail(f, "must be a JSON object");
        only_keys(p, f, {"batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal", "pass", "seconds",
                         "spread"});
        project::AttentionPoint point;
        project::AttentionShape& s = point.shape;
        s.batch = integer(p, "batch", f + ".batch", true);
        s.heads = integer(p, "heads", f + ".heads", true);
        s.kv_heads = integer(p, "kv_heads", f + ".kv_heads", false, s.heads);
        s.seq_q = integer(p, "seq_q", f + ".seq_q", true);
        s.seq_kv = integer(p, "seq_kv", f + ".seq_kv", false, s.seq_q);
        s.head_dim = integer(p, "head_dim", f + ".head_dim", true);
        s.causal = boolean(p, "causal", f + ".causal");
        const std::string pass = text(p, "pass", f + ".pass", true);
        if (pass != "fwd" && pass != "bwd") fail(f + ".pass", "must be fwd or bwd (got " + pass + ")");
        s.backward = pass == "bwd";
        point.seconds = seconds(p, f);
        c.attention_points.push_back(point);
      }
    }
    return c;
  }

  project::NetworkTier tier(const json& network, const std::string& key, int version) const {
    const std::string field = "network." + key;
    const json& value = object(network, key, field);
    if (version == 1)
      only_keys(value, field, {"bandwidth", "latency", "collectives"});
    else
      only_keys(value, field, {"bandwidth", "latency", "collectives", "source"});
    project::NetworkTier t;
    t.bandwidth = quantity(value, "bandwidth", field + ".bandwidth");
    t.latency = quantity(value, "latency", field + ".latency");
    t.source = text(value, "source", field + ".source", false);
    if (value.contains("collectives")) {
      const json& collectives = object(value, "collectives", field + ".collectives");
      for (const auto& [name, model] : collectives.items()) {
        if (name.starts_with("_")) continue;
        const std::string f = field + ".collectives." + name;
        const auto op = project::collective_from_name(name);
        if (!op) fail(f, "unknown collective (allreduce, allgather, reduce_scatter, alltoall, broadcast, reduce)");
        if (!model.is_object()) fail(f, "must be a JSON object");
        only_keys(model, f, {"latency", "bandwidth"});
        t.collectives[*op] = {quantity(model, "latency", f + ".latency"), quantity(model, "bandwidth", f + ".bandwidth")};
      }
    }
    return t;
  }

  project::RingLatency ring_latency(const json& network) const {
    const std::string field = "network.ring_latency";
    const json& value = object(network, "ring_latency", field);
    only_keys(value, field, {"protocols", "source"});
    project::RingLatency ring;
    ring.source = text(value, "source", field + ".source", false);
    for (const auto& [name, protocol] : object(value, "protocols", field + ".protocols").items()) {
      if (name.starts_with("_")) continue;
      const std::string f = field + ".protocols." + name;
      if (!protocol.is_object()) fail(f, "must be a JSON object");
      only_keys(protocol, f, {"base", "intra_step", "inter_step", "bandwidth_factor", "bandwidth_factor_one_per_node"});
      project::RingProtocol p{quantity(protocol, "base", f + ".base"), quantity(protocol, "intra_step", f + ".intra_step"),
                              quantity(protocol, "inter_step", f + ".inter_step")};
      p.bandwidth_factor = number(protocol, "bandwidth_factor", f + ".bandwidth_factor", 1, false);
      p.bandwidth_factor_one_per_node = number(protocol, "bandwidth_factor_one_per_node",
                                               f + ".bandwidth_factor_one_per_node", p.bandwidth_factor, false);
      ring.protocols[name] = p;
    }
    return ring;
  }

  project::CollectiveModel collective(const json& value, const std::string& field) const {
    if (!value.is_object()) fail(field, "must be a JSON object");
    project::CollectiveModel m;
    const std::string op = text(value, "operation", field + ".operation", true);
    const auto parsed_op = project::collective_from_name(op);
    if (!parsed_op) fail(field + ".operation", "unknown collective '" + op + "'");
    m.op = *parsed_op;
    m.algorithm = text(value, "algorithm", field + ".algorithm", true);
    const std::string group = text(value, "group", field + ".group", true);
    const auto kind = project::group_kind_from_name(group);
    if (!kind) fail(field + ".group", "must be intra_node, inter_node or hierarchical (got " + group + ")");
    m.group = *kind;
    const std::int64_t ranks = integer(value, "ranks", field + ".ranks", true);
    if (ranks < 0 || ranks > 1 << 30) fail(field + ".ranks", "out of range (" + std::to_string(ranks) + ")");
    m.ranks = static_cast<int>(ranks);
    const std::string form = text(value, "form", field + ".form", false);
    if (value.contains("form") && form != "latency_bandwidth" && form != "chunked")
      fail(field + ".form", "must be latency_bandwidth or chunked (got '" + form + "')");
    m.form = form == "chunked" ? project::CollectiveForm::chunked : project::CollectiveForm::latency_bandwidth;
    const std::string mode = text(value, "mode", field + ".mode", false);
    if (!mode.empty() && mode != "pipelined" && mode != "blocking")
      fail(field + ".mode", "must be pipelined or blocking (got " + mode + ")");
    m.blocking = mode == "blocking";
    const std::set<std::string> common = {"operation", "algorithm", "group", "ranks", "mode", "form", "points", "compared",
                                          "source"};
    std::set<std::string> allowed = common;
    if (m.form == project::CollectiveForm::chunked) {
      allowed.insert({"latency", "chunk_bytes", "per_chunk", "bandwidth", "residual", "sizes"});
      only_keys(value, field, allowed);
      m.chunked.latency = quantity(value, "latency", field + ".latency");
      m.chunked.chunk_bytes = number(value, "chunk_bytes", field + ".chunk_bytes", 0, true);
      m.chunked.per_chunk = quantity(value, "per_chunk", field + ".per_chunk");
      m.chunked.bandwidth = quantity(value, "bandwidth", field + ".bandwidth");
      m.chunked.residual = number(value, "residual", field + ".residual", 0, false);
      m.chunked.sizes = static_cast<int>(integer(value, "sizes", field + ".sizes", false));
    } else {
      allowed.insert("ranges");
      only_keys(value, field, allowed);
      const json& ranges = array(value, "ranges", field + ".ranges");
      for (size_t i = 0; i < ranges.size(); ++i) {
        const std::string f = field + ".ranges[" + std::to_string(i) + "]";
        const json& r = ranges[i];
        if (!r.is_object()) fail(f, "must be a JSON object");
        only_keys(r, f, {"up_to_bytes", "latency", "bandwidth", "residual", "sizes"});
        project::SizeRange range;
        range.up_to_bytes = number(r, "up_to_bytes", f + ".up_to_bytes", std::numeric_limits<double>::infinity(), false);
        range.model = {quantity(r, "latency", f + ".latency"), quantity(r, "bandwidth", f + ".bandwidth")};
        range.residual = number(r, "residual", f + ".residual", 0, false);
        range.sizes = static_cast<int>(integer(r, "sizes", f + ".sizes", false));
        m.ranges.push_back(range);
      }
    }
    if (value.contains("points")) {
      const json& points = array(value, "points", field + ".points");
      for (size_t i = 0; i < points.size(); ++i) {
        const std::string f = field + ".points[" + std::to_string(i) + "]";
        const json& p = points[i];
        if (!p.is_object()) fail(f, "must be a JSON object");
        only_keys(p, f, {"bytes", "seconds", "spread"});
        m.points.push_back({number(p, "bytes", f + ".bytes", 0, true), seconds(p, f)});
      }
    }
    if (value.contains("compared"))
      for (const auto& [name, residual] : object(value, "compared", field + ".compared").items())
        if (!name.starts_with("_")) m.compared[name] = number(residual, field + ".compared." + name);
    m.source = text(value, "source", field + ".source", false);
    return m;
  }

 private:
  std::string source_;
};

// One line when the value fits in `width` columns after `indent`, else one member per line.
void format(const ordered_json& value, int indent, std::string& out) {
  constexpr int kWidth = 160;
  auto inline_form = [](const ordered_json& v, auto& self) -> std::string {
    if (v.is_object()) {
      std::string s = "{";
      bool first = true;
      for (const auto& [key, member] : v.items()) {
        s += (first ? "" : ", ") + ordered_json(key).dump() + ": " + self(member, self);
        first = false;
      }
      return s + "}";
    }
    if (v.is_array()) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + self(v[i], self);
      return s + "]";
    }
    return v.dump();
  };
  const std::string flat = inline_form(value, inline_form);
  // An object of plain values or of objects of plain values (a measured point, a size range), with no long text,
  // is one record: one line.
  auto plain = [](const ordered_json& v) { return v.is_primitive() && !(v.is_string() && v.get<std::string>().size() > 32); };
  const bool record = value.is_object() && std::all_of(value.begin(), value.end(), [&](const ordered_json& member) {
    return plain(member) || (member.is_object() && std::all_of(member.begin(), member.end(), plain));
  });
  if ((!value.is_object() && !value.is_array()) || value.empty() || record ||
      static_cast<int>(flat.size()) + indent <= kWidth) {
    out += flat;
    return;
  }
  const std::string pad(static_cast<size_t>(indent) + 2, ' ');
  out += value.is_object() ? "{\n" : "[\n";
  size_t i = 0;
  for (const auto& [key, member] : value.items()) {
    out += pad;
    if (value.is_object()) out += ordered_json(key).dump() + ": ";
    format(member, indent + 2, out);
    out += ++i < value.size() ? ",\n" : "\n";
  }
  out += std::string(static_cast<size_t>(indent), ' ') + (value.is_object() ? "}" : "]");
}

}  // namespace

ordered_json system_to_json(const project::System& system) {
  ordered_json compute = ordered_json::object();
  for (const auto& [dtype, peak] : system.device.compute) compute[dtype] = compute_to_json(peak);
  ordered_json device = {{"name", system.device.name}};
  if (!system.device.source.empty()) device["source"] = system.device.source;
  device["devices_per_node"] = system.device.devices_per_node;
  device["compute"] = compute;
  device["memory_bandwidth"] = quantity_to_json(system.device.memory_bandwidth);
  device["memory_efficiency"] = quantity_to_json(system.device.memory_efficiency);
  if (system.device.memory_capacity) device["memory_capacity"] = quantity_to_json(*system.device.memory_capacity);
  if (system.device.kernel_overhead) device["kernel_overhead"] = quantity_to_json(*system.device.kernel_overhead);
  if (!system.device.fused_into_gemm.empty()) device["fused_into_gemm"] = system.device.fused_into_gemm;
  if (system.device.elementwise_bandwidth || !system.device.elementwise_kernels.empty()) {
    ordered_json elementwise = ordered_json::object();
    if (system.device.elementwise_bandwidth) elementwise["bandwidth"] = quantity_to_json(*system.device.elementwise_bandwidth);
    ordered_json kernels = ordered_json::object();
    for (const auto& [kernel, rate] : system.device.elementwise_kernels) kernels[kernel] = quantity_to_json(rate);
    if (!kernels.empty()) elementwise["kernels"] = kernels;
    device["elementwise"] = elementwise;
  }
  if (!system.device.attention_kernels.empty()) {
    ordered_json kernels = ordered_json::object();
    for (const auto& [kernel, speed] : system.device.attention_kernels)
      kernels[kernel] = {{"forward", quantity_to_json(speed.forward)}, {"backward", quantity_to_json(speed.backward)}};
    device["attention_kernels"] = kernels;
  }
  ordered_json out = {{"format", kFormat}, {"version", system.version}, {"name", system.name}};
  if (!system.comment.empty()) out["comment"] = system.comment;
  out["units"] = "SI: FLOP/s, B/s, s, B; spread is relative (0.1: +-10%)";
  out["device"] = device;
  out["network"] = {{"intra_node", tier_to_json(system.intra_node)}, {"inter_node", tier_to_json(system.inter_node)}};
  if (system.ring_latency) out["network"]["ring_latency"] = ring_latency_to_json(*system.ring_latency);
  if (!system.collectives.empty()) {
    ordered_json collectives = ordered_json::array();
    for (const auto& m : system.collectives) collectives.push_back(collective_to_json(m));
    out["collectives"] = collectives;
  }
  if (system.collective_contention) out["collective_contention"] = quantity_to_json(*system.collective_contention);
  out["overlap_slowdown"] = quantity_to_json(system.overlap_slowdown);
  if (system.communication_slowdown) out["communication_slowdown"] = quantity_to_json(*system.communication_slowdown);
  return out;
}

project::System system_from_json(const json& document, const std::string& source) {
  const Reader read(source);
  if (!document.is_object()) read.fail("(top)", "must be a JSON object");
  if (read.text(document, "format", "format", true) != kFormat)
    read.fail("format", std::string("must be \"") + kFormat + "\"");
  if (!document.contains("version") || !document.at("version").is_number_integer())
    read.fail("version", "must be the integer " + std::to_string(project::kSystemFormatVersion));
  const int version = document.at("version").get<int>();
  if (version < 1 || version > project::kSystemFormatVersion)
    read.fail("version", "is " + std::to_string(version) + "; this build reads versions 1 to " +
                             std::to_string(project::kSystemFormatVersion));
  if (version == 1)
    read.only_keys(document, "", {"format", "version", "name", "comment", "units", "device", "network", "overlap_slowdown"});
  else
    read.only_keys(document, "", {"format", "version", "name", "comment", "units", "device", "network", "collectives",
                                  "collective_contention", "overlap_slowdown", "communication_slowdown"});
  project::System system;  // version 1 reads into the current version: it lacks only optional parts
  system.name = read.text(document, "name", "name", true);
  system.comment = read.text(document, "comment", "comment", false);

  const json& device = read.object(document, "device", "device");
  if (version == 1)
    read.only_keys(device, "device", {"name", "source", "devices_per_node", "compute", "memory_bandwidth",
                                      "memory_efficiency"});
  else
    read.only_keys(device, "device", {"name", "source", "devices_per_node", "compute", "memory_bandwidth",
                                      "memory_efficiency", "memory_capacity", "elementwise", "kernel_overhead",
                                      "fused_into_gemm", "attention_kernels"});
  system.device.name = read.text(device, "name", "device.name", true);
  system.device.source = read.text(device, "source", "device.source", false);
  if (!device.contains("devices_per_node") || !device.at("devices_per_node").is_number_integer())
    read.fail("device.devices_per_node", "must be an integer");
  system.device.devices_per_node = device.at("devices_per_node").get<int>();
  const json& compute = read.object(device, "compute", "device.compute");
  for (const auto& [dtype, peak] : compute.items()) {
    if (dtype.starts_with("_")) continue;
    system.device.compute[dtype] = read.compute(peak, "device.compute." + dtype, version);
  }
  system.device.memory_bandwidth = read.quantity(device, "memory_bandwidth", "device.memory_bandwidth");
  system.device.memory_efficiency = read.quantity(device, "memory_efficiency", "device.memory_efficiency");
  if (device.contains("memory_capacity"))
    system.device.memory_capacity = read.quantity(device, "memory_capacity", "device.memory_capacity");
  if (device.contains("kernel_overhead"))
    system.device.kernel_overhead = read.quantity(device, "kernel_overhead", "device.kernel_overhead");
  if (device.contains("fused_into_gemm")) {
    const json& fused = device.at("fused_into_gemm");
    if (!fused.is_array()) read.fail("device.fused_into_gemm", "must be a list of kernel names");
    for (const json& kernel : fused) {
      if (!kernel.is_string()) read.fail("device.fused_into_gemm", "must be a list of kernel names");
      system.device.fused_into_gemm.insert(kernel.get<std::string>());
    }
  }
  if (device.contains("elementwise")) {
    const json& elementwise = read.object(device, "elementwise", "device.elementwise");
    read.only_keys(elementwise, "device.elementwise", {"bandwidth", "kernels"});
    if (elementwise.contains("bandwidth"))
      system.device.elementwise_bandwidth = read.quantity(elementwise, "bandwidth", "device.elementwise.bandwidth");
    if (elementwise.contains("kernels")) {
      const json& kernels = read.object(elementwise, "kernels", "device.elementwise.kernels");
      for (const auto& [kernel, rate] : kernels.items())
        if (!kernel.starts_with("_"))
          system.device.elementwise_kernels[kernel] = read.quantity(kernels, kernel, "device.elementwise.kernels." + kernel);
    }
  }

  if (device.contains("attention_kernels")) {
    const json& kernels = read.object(device, "attention_kernels", "device.attention_kernels");
    for (const auto& [kernel, speed] : kernels.items()) {
      if (kernel.starts_with("_")) continue;
      const std::string field = "device.attention_kernels." + kernel;
      const json& passes = read.object(kernels, kernel, field);
      read.only_keys(passes, field, {"forward", "backward"});
      system.device.attention_kernels[kernel] = {read.quantity(passes, "forward", field + ".forward"),
                                                 read.quantity(passes, "backward", field + ".backward")};
    }
  }

  const json& network = read.object(document, "network", "network");
  if (version == 1)
    read.only_keys(network, "network", {"intra_node", "inter_node"});
  else
    read.only_keys(network, "network", {"intra_node", "inter_node", "ring_latency"});
  system.intra_node = read.tier(network, "intra_node", version);
  system.inter_node = read.tier(network, "inter_node", version);
  if (network.contains("ring_latency")) system.ring_latency = read.ring_latency(network);
  if (document.contains("collectives")) {
    const json& collectives = read.array(document, "collectives", "collectives");
    for (size_t i = 0; i < collectives.size(); ++i)
      system.collectives.push_back(read.collective(collectives[i], "collectives[" + std::to_string(i) + "]"));
  }
  if (document.contains("collective_contention"))
    system.collective_contention = read.quantity(document, "collective_contention", "collective_contention");
  system.overlap_slowdown = read.quantity(document, "overlap_slowdown", "overlap_slowdown");
  if (document.contains("communication_slowdown"))
    system.communication_slowdown = read.quantity(document, "communication_slowdown", "communication_slowdown");

  if (auto problem = project::find_problem(system)) throw UsageError("system description " + source + ": " + *problem);
  return system;
}

std::string format_system_json(const ordered_json& document) {
  std::string out;
  format(document, 0, out);
  return out + "\n";
}

std::string find_system_file(const std::string& argument) {
  const std::string file = resolve_shipped_file(argument, "project/systems");
  std::error_code error;
  if (file == argument && argument.find('/') == std::string::npos && !std::filesystem::exists(argument, error)) {
    std::string shipped;
    for (const std::string& name : shipped_names("project/systems")) shipped += (shipped.empty() ? "" : ", ") + name;
    throw UsageError("system description " + argument + ": no such file, nor a shipped description of that name" +
                     (shipped.empty() ? std::string() : " (shipped: " + shipped + ")"));
  }
  return file;
}

project::System read_system(const std::string& path) {
  const std::string file = find_system_file(path);
  return system_from_json(read_json_file(file, "system description"), file);
}

void write_system(const std::string& path, const project::System& system) {
  if (auto problem = project::find_problem(system))
    throw std::invalid_argument("write_system: refusing an unusable description: " + *problem);
  const std::string temporary = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(temporary);
    if (!out) throw UsageError("cannot write " + path + " (its folder is missing or not writable)");
    out << format_system_json(system_to_json(system));
    if (!out) {
      std::filesystem::remove(temporary);
      throw RuntimeError("writing " + temporary + " failed");
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::filesystem::remove(temporary);
    throw UsageError("cannot replace " + path + ": " + error.message());
  }
}

}  // namespace strata
