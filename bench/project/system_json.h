// The system description's file form (project/system.h): JSON, versioned, meant to be edited by hand. Every field
// is documented in project/SYSTEM.md; in short:
//
//   {"format": "strata-system", "version": 2, "name": "...", "comment": "...",
//    "device": {"name": "...", "source": "...", "devices_per_node": 8,
//               "compute": {"bf16": {"peak_flops": Q,
//                                    "efficiency": {"points": [[flops, fraction], ...], "spread": 0.2,
//                                                   "source": "..."},
//                                    "attention_efficiency": {"fwd": curve, "bwd": curve},        (optional)
//                                    "gemm_points": [{"m", "n", "k", "seconds", "spread"}, ...],  (optional)
//                                    "attention_points": [{"batch", "heads", "kv_heads", "seq_q", "seq_kv",
//                                                          "head_dim", "causal", "pass", "seconds", "spread"}]},
//                           ...},
//               "memory_bandwidth": Q, "memory_efficiency": Q},
//    "network": {"intra_node": {"bandwidth": Q, "latency": Q, "source": "...",
//                               "collectives": {"allreduce": {"latency": Q, "bandwidth": Q}, ...}},
//                "inter_node": {...}},
//    "collectives": [{"operation", "algorithm", "group", "ranks", "form": "latency_bandwidth",
//                     "ranges": [{"up_to_bytes", "latency": Q, "bandwidth": Q, "residual", "sizes"}, ...],
//                     "compared": {"latency_bandwidth": r, "chunked": r}, "source"},
//                    {..., "form": "chunked", "latency": Q, "chunk_bytes", "per_chunk": Q, "bandwidth": Q,
//                     "residual", "sizes", ...}],                                                    (optional)
//    "collective_contention": Q, "overlap_slowdown": Q, "communication_slowdown": Q}
//
// Q, a quantity, is a number or {"value": number, "spread": relative spread (optional, 0), "source": "..."}.
// Units are SI: FLOP/s, B/s, seconds, bytes. Version 1 files (no measured points, fitted collectives,
// contention or communication slowdown) are read as version 2 descriptions; files are written as version 2. Keys
// starting with "_" are comments and are ignored; any other unknown key is refused, so a typo does not pass
// silently. Malformed input throws UsageError (a std::invalid_argument) naming the field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "project/system.h"

namespace strata {

nlohmann::ordered_json system_to_json(const project::System& system);

// `source` names the input in messages (a path, or "<test>"). Checks the result with project::find_problem.
project::System system_from_json(const nlohmann::json& document, const std::string& source);

// Indented JSON that keeps each small object or array (a quantity, a measured point, a size range) on one line,
// so a description with many points stays readable and editable.
std::string format_system_json(const nlohmann::ordered_json& document);

// The file a --system argument names: a path, or a shipped description's name (bench/harness/shipped_files.h). Throws
// UsageError naming the argument and the shipped names when it is neither.
std::string find_system_file(const std::string& argument);
project::System read_system(const std::string& path);  // path: as find_system_file takes it
// Writes the whole file or nothing: a temporary file beside `path`, renamed over it once complete.
void write_system(const std::string& path, const project::System& system);

}  // namespace strata
