// The recomputation policy file (`--recompute-policy FILE`, and the placement stored with a run): one entry
// per recomputable op, by name, with its decision and, for a window, the window's label:
//   {"format": "strata-recompute-policy", "version": 1,
//    "placement": [{"op": "L3.attn_core", "mode": "window", "window": "tp allreduce bwd L4"},
//                  {"op": "L3.mlp_up", "mode": "keep"}, {"op": "L3.gelu", "mode": "on-demand"}]}
// Malformed files throw UsageError (a std::invalid_argument) naming the file and the problem.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "train/recompute_placement.h"

namespace strata {

nlohmann::json placement_to_json(const train::PlacementProblem& problem, const train::Placement& placement);

// Every op of the problem exactly once, known modes, known windows; `source` names the input in messages.
train::Placement placement_from_json(const train::PlacementProblem& problem, const nlohmann::json& policy,
                                     const std::string& source);

// The file's JSON; UsageError naming the file when it cannot be read or is not JSON.
nlohmann::json read_policy_json(const std::string& path);

// Reads and parses the file, then checks the placement against the problem's constraints
// (train::find_violation): a policy that does not fit is refused with the constraint it breaks.
train::Placement read_recompute_policy(const std::string& path, const train::PlacementProblem& problem);

void write_recompute_policy(const std::string& path, const train::PlacementProblem& problem,
                            const train::Placement& placement);

}  // namespace strata
