#include "bench/system_json.h"

#include <fstream>
#include <set>

#include "bench/check.h"

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

ordered_json tier_to_json(const project::NetworkTier& tier) {
  ordered_json out = {{"bandwidth", quantity_to_json(tier.bandwidth)}, {"latency", quantity_to_json(tier.latency)}};
  if (!tier.collectives.empty()) {
    ordered_json collectives = ordered_json::object();
    for (const auto& [op, model] : tier.collectives)
      collectives[project::collective_name(op)] = {{"latency", quantity_to_json(model.latency)},
                                                   {"bandwidth", quantity_to_json(model.bandwidth)}};
    out["collectives"] = collectives;
  }
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

  void only_keys(const json& object, const std::string& field, const std::set<std::string>& allowed) const {
    for (const auto& [key, value] : object.items())
      if (!key.starts_with("_") && !allowed.count(key))
        fail(field.empty() ? key : field + "." + key, "unknown field");
  }

  double number(const json& value, const std::string& field) const {
    if (!value.is_number()) fail(field, "must be a number");
    return value.get<double>();
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

  project::EfficiencyCurve curve(const json& parent, const std::string& field) const {
    const json& value = object(parent, "efficiency", field);
    only_keys(value, field, {"points", "spread", "source"});
    project::EfficiencyCurve c;
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

  project::NetworkTier tier(const json& network, const std::string& key) const {
    const std::string field = "network." + key;
    const json& value = object(network, key, field);
    only_keys(value, field, {"bandwidth", "latency", "collectives"});
    project::NetworkTier t;
    t.bandwidth = quantity(value, "bandwidth", field + ".bandwidth");
    t.latency = quantity(value, "latency", field + ".latency");
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

 private:
  std::string source_;
};

}  // namespace

ordered_json system_to_json(const project::System& system) {
  ordered_json compute = ordered_json::object();
  for (const auto& [dtype, peak] : system.device.compute) {
    ordered_json points = ordered_json::array();
    for (const auto& p : peak.efficiency.points) points.push_back({p.flops, p.efficiency});
    ordered_json efficiency = {{"points", points}, {"spread", peak.efficiency.relative_spread}};
    if (!peak.efficiency.source.empty()) efficiency["source"] = peak.efficiency.source;
    compute[dtype] = {{"peak_flops", quantity_to_json(peak.peak_flops)}, {"efficiency", efficiency}};
  }
  ordered_json device = {{"name", system.device.name}};
  if (!system.device.source.empty()) device["source"] = system.device.source;
  device["devices_per_node"] = system.device.devices_per_node;
  device["compute"] = compute;
  device["memory_bandwidth"] = quantity_to_json(system.device.memory_bandwidth);
  device["memory_efficiency"] = quantity_to_json(system.device.memory_efficiency);
  ordered_json out = {{"format", kFormat}, {"version", system.version}, {"name", system.name}};
  if (!system.comment.empty()) out["comment"] = system.comment;
  out["units"] = "SI: FLOP/s, B/s, s; spread is relative (0.1: +-10%)";
  out["device"] = device;
  out["network"] = {{"intra_node", tier_to_json(system.intra_node)}, {"inter_node", tier_to_json(system.inter_node)}};
  out["overlap_slowdown"] = quantity_to_json(system.overlap_slowdown);
  return out;
}

project::System system_from_json(const json& document, const std::string& source) {
  const Reader read(source);
  if (!document.is_object()) read.fail("(top)", "must be a JSON object");
  read.only_keys(document, "", {"format", "version", "name", "comment", "units", "device", "network",
                                "overlap_slowdown"});
  if (read.text(document, "format", "format", true) != kFormat)
    read.fail("format", std::string("must be \"") + kFormat + "\"");
  if (!document.contains("version") || !document.at("version").is_number_integer())
    read.fail("version", "must be the integer " + std::to_string(project::kSystemFormatVersion));
  project::System system;
  system.version = document.at("version").get<int>();
  if (system.version != project::kSystemFormatVersion)
    read.fail("version", "is " + std::to_string(system.version) + "; this build reads version " +
                             std::to_string(project::kSystemFormatVersion));
  system.name = read.text(document, "name", "name", true);
  system.comment = read.text(document, "comment", "comment", false);

  const json& device = read.object(document, "device", "device");
  read.only_keys(device, "device", {"name", "source", "devices_per_node", "compute", "memory_bandwidth",
                                    "memory_efficiency"});
  system.device.name = read.text(device, "name", "device.name", true);
  system.device.source = read.text(device, "source", "device.source", false);
  if (!device.contains("devices_per_node") || !device.at("devices_per_node").is_number_integer())
    read.fail("device.devices_per_node", "must be an integer");
  system.device.devices_per_node = device.at("devices_per_node").get<int>();
  const json& compute = read.object(device, "compute", "device.compute");
  for (const auto& [dtype, peak] : compute.items()) {
    if (dtype.starts_with("_")) continue;
    const std::string field = "device.compute." + dtype;
    if (!peak.is_object()) read.fail(field, "must be a JSON object");
    read.only_keys(peak, field, {"peak_flops", "efficiency"});
    system.device.compute[dtype] = {read.quantity(peak, "peak_flops", field + ".peak_flops"),
                                    read.curve(peak, field + ".efficiency")};
  }
  system.device.memory_bandwidth = read.quantity(device, "memory_bandwidth", "device.memory_bandwidth");
  system.device.memory_efficiency = read.quantity(device, "memory_efficiency", "device.memory_efficiency");

  const json& network = read.object(document, "network", "network");
  read.only_keys(network, "network", {"intra_node", "inter_node"});
  system.intra_node = read.tier(network, "intra_node");
  system.inter_node = read.tier(network, "inter_node");
  system.overlap_slowdown = read.quantity(document, "overlap_slowdown", "overlap_slowdown");

  if (auto problem = project::find_problem(system)) throw UsageError("system description " + source + ": " + *problem);
  return system;
}

project::System read_system(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("system description " + path + ": cannot open it");
  json document;
  try {
    document = json::parse(in);
  } catch (const json::parse_error& e) {
    throw UsageError("system description " + path + ": not valid JSON: " + e.what());
  }
  return system_from_json(document, path);
}

void write_system(const std::string& path, const project::System& system) {
  if (auto problem = project::find_problem(system))
    throw std::invalid_argument("write_system: refusing an unusable description: " + *problem);
  std::ofstream out(path);
  if (!out) throw RuntimeError("cannot write " + path);
  out << system_to_json(system).dump(2) << '\n';
  if (!out) throw RuntimeError("writing " + path + " failed");
}

}  // namespace strata
