// Names and version of the Strata results schema (documented in results/SCHEMA.md). Writers and readers
// share these constants so a renamed attribute cannot drift between them.
#pragma once

namespace strata::schema {

inline constexpr const char* kName = "strata-results";
inline constexpr int kVersionMajor = 1;  // a reader refuses files with a newer major version
inline constexpr int kVersionMinor = 1;  // minor versions only add attributes, columns or tables

inline constexpr const char* kRunsGroup = "runs";
// The attributes every run has from its start, which every reader of a run needs.
inline constexpr const char* kRunAttributes[] = {"benchmark", "status", "n_ranks", "n_nodes", "launcher", "start_utc"};
inline constexpr const char* kEnvGroup = "env";

// Table names inside a run group.
inline constexpr const char* kCases = "cases";
inline constexpr const char* kSamples = "samples";
inline constexpr const char* kSummary = "summary";
inline constexpr const char* kRanks = "ranks";
// Step records (1.1): what a training step is made of, per rank.
inline constexpr const char* kClock = "clock";
inline constexpr const char* kPhases = "phases";
inline constexpr const char* kEvents = "events";
inline constexpr const char* kMemory = "memory";
inline constexpr const char* kMetrics = "metrics";

// Run status values.
inline constexpr const char* kStatusOk = "ok";
inline constexpr const char* kStatusFailed = "failed";
inline constexpr const char* kStatusInterrupted = "interrupted";  // written at start; replaced when a run ends

}  // namespace strata::schema
