// The system description's file form (project/system.h): JSON, versioned, meant to be edited by hand.
//
//   {"format": "strata-system", "version": 1, "name": "...", "comment": "...",
//    "device": {"name": "...", "source": "...", "devices_per_node": 8,
//               "compute": {"bf16": {"peak_flops": Q,
//                                    "efficiency": {"points": [[flops, fraction], ...], "spread": 0.2,
//                                                   "source": "..."}}, ...},
//               "memory_bandwidth": Q, "memory_efficiency": Q},
//    "network": {"intra_node": {"bandwidth": Q, "latency": Q,
//                               "collectives": {"allreduce": {"latency": Q, "bandwidth": Q}, ...}},
//                "inter_node": {...}},
//    "overlap_slowdown": Q}
//
// Q, a quantity, is a number or {"value": number, "spread": relative spread (optional, 0), "source": "..."}.
// Units are SI: FLOP/s, B/s, seconds; "collectives" is optional per tier (the tier's own latency and bandwidth
// otherwise). Keys starting with "_" are comments and are ignored; any other unknown key is refused, so a typo
// does not pass silently. Malformed input throws UsageError (a std::invalid_argument) naming the field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "project/system.h"

namespace strata {

nlohmann::ordered_json system_to_json(const project::System& system);

// `source` names the input in messages (a path, or "<test>"). Checks the result with project::find_problem.
project::System system_from_json(const nlohmann::json& document, const std::string& source);

project::System read_system(const std::string& path);
void write_system(const std::string& path, const project::System& system);

}  // namespace strata
