#include "bench/harness/json_file.h"
#include "bench/cases/recompute_policy.h"

#include <fstream>
#include <map>
#include <set>

#include "bench/harness/check.h"

namespace strata {
namespace {

constexpr const char* kFormat = "strata-recompute-policy";
constexpr int kVersion = 1;

}  // namespace

nlohmann::json placement_to_json(const train::PlacementProblem& problem, const train::Placement& placement) {
  if (placement.size() != problem.ops.size())
    throw std::invalid_argument("placement_to_json: the placement decides " + std::to_string(placement.size()) +
                                " ops but the problem has " + std::to_string(problem.ops.size()));
  nlohmann::json entries = nlohmann::json::array();
  for (size_t i = 0; i < placement.size(); ++i) {
    nlohmann::json entry = {{"op", problem.ops[i].name}, {"mode", train::mode_name(placement[i].mode)}};
    if (placement[i].mode == train::RecomputeMode::window) {
      const int w = placement[i].window;
      if (w < 0 || w >= static_cast<int>(problem.windows.size()))
        throw std::invalid_argument("placement_to_json: op '" + problem.ops[i].name + "' is in window " +
                                    std::to_string(w) + ", which does not exist");
      entry["window"] = problem.windows[w].label;
    }
    entries.push_back(entry);
  }
  return {{"format", kFormat}, {"version", kVersion}, {"placement", entries}};
}

train::Placement placement_from_json(const train::PlacementProblem& problem, const nlohmann::json& policy,
                                     const std::string& source) {
  auto fail = [&](const std::string& what) { throw UsageError("recompute policy " + source + ": " + what); };
  if (!policy.is_object()) fail("expected a JSON object at the top");
  if (!policy.contains("format") || policy["format"] != kFormat)
    fail(std::string("\"format\" must be \"") + kFormat + "\"");
  if (!policy.contains("version") || policy["version"] != kVersion)
    fail("\"version\" must be " + std::to_string(kVersion));
  if (!policy.contains("placement") || !policy["placement"].is_array()) fail("\"placement\" must be an array");

  std::map<std::string, int> op_index, window_index;
  for (size_t i = 0; i < problem.ops.size(); ++i) op_index[problem.ops[i].name] = static_cast<int>(i);
  for (size_t w = 0; w < problem.windows.size(); ++w) window_index[problem.windows[w].label] = static_cast<int>(w);

  train::Placement placement(problem.ops.size());
  std::set<int> decided;
  for (const nlohmann::json& entry : policy["placement"]) {
    if (!entry.is_object() || !entry.contains("op") || !entry["op"].is_string())
      fail("each entry needs \"op\", the name of an op, as a string");
    const std::string name = entry["op"].get<std::string>();
    const auto op = op_index.find(name);
    if (op == op_index.end()) fail("unknown op '" + name + "'");
    if (!decided.insert(op->second).second) fail("op '" + name + "' is decided twice");
    if (!entry.contains("mode") || !entry["mode"].is_string())
      fail("op '" + name + "' needs \"mode\": keep, on-demand or window");
    const std::string mode = entry["mode"].get<std::string>();
    train::OpPlacement& d = placement[op->second];
    if (mode == "keep") d = {train::RecomputeMode::keep, -1};
    else if (mode == "on-demand") d = {train::RecomputeMode::on_demand, -1};
    else if (mode == "window") {
      if (!entry.contains("window") || !entry["window"].is_string())
        fail("op '" + name + "' is in mode window but names no \"window\" (a window's label)");
      const std::string label = entry["window"].get<std::string>();
      const auto w = window_index.find(label);
      if (w == window_index.end()) fail("op '" + name + "' names unknown window '" + label + "'");
      d = {train::RecomputeMode::window, w->second};
    } else {
      fail("op '" + name + "' has mode '" + mode + "'; the modes are keep, on-demand and window");
    }
    if (mode != "window" && entry.contains("window"))
      fail("op '" + name + "' is in mode " + mode + " but names a window");
  }
  for (size_t i = 0; i < problem.ops.size(); ++i)
    if (!decided.count(static_cast<int>(i))) fail("op '" + problem.ops[i].name + "' has no entry");
  return placement;
}

nlohmann::json read_policy_json(const std::string& path) { return read_json_file(path, "recompute policy"); }

train::Placement read_recompute_policy(const std::string& path, const train::PlacementProblem& problem) {
  train::Placement placement = placement_from_json(problem, read_policy_json(path), path);
  if (const auto violation = train::find_violation(problem, placement))
    throw UsageError("recompute policy " + path + " does not fit this run: " + *violation);
  return placement;
}

void write_recompute_policy(const std::string& path, const train::PlacementProblem& problem,
                            const train::Placement& placement) {
  const nlohmann::json policy = placement_to_json(problem, placement);
  std::ofstream out(path);
  if (!out) throw RuntimeError("cannot write the recompute policy " + path);
  out << policy.dump(2) << "\n";
  if (!out) throw RuntimeError("writing the recompute policy " + path + " failed");
}

}  // namespace strata
