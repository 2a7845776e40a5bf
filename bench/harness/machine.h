// The measured machine description (kernels/machine.h) as a run uses it: measured once per node and job by
// the node's first rank while the others wait without spinning, kept in a small JSON cache that the job's
// later programs read, printed once per run, and written into the run's `env` group.
//
// Cache: $STRATA_CACHE_DIR, else $XDG_CACHE_HOME/strata, else ~/.cache/strata; one file per host, CPU, BLAS
// libraries, build type and Slurm job, re-measured after 24 hours. STRATA_MACHINE_CACHE=off measures every
// time and writes nothing; =refresh measures and replaces the file.
#pragma once

#include <map>
#include <mpi.h>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/harness/check.h"
#include "bench/harness/blas_core.h"
#include "kernels/machine.h"

namespace strata {

struct NodeMachine {
  MachineDescription description;
  std::string source;        // "measured now" or "cache <path>"
  std::string measured_utc;  // when it was measured
};

nlohmann::json to_json(const MachineDescription& machine);
// Throws std::runtime_error naming the first missing or malformed field.
MachineDescription machine_from_json(const nlohmann::json& json);

// The cache file for this node (its folder is not created here).
std::string machine_cache_path(const CpuFeatures& cpu);

// Collective over `world`: every rank returns its own node's description.
NodeMachine node_machine(MPI_Comm world);

// Flat `env` entries (units in the names' documentation in results/SCHEMA.md) for one node's description,
// the BLAS core choice, and `all_nodes_json` (a JSON array with one object per node).
void add_machine_env(std::map<std::string, std::string>& env, const NodeMachine& machine, const BlasCoreChoice& core,
                     const std::string& all_nodes_json);

// How a %peak's denominator was made, for the results: e.g. "measured: 12 independent AVX-512 FP32 FMA
// chains, one core, 216 GFLOP/s".
std::string peak_source(const PeakFigure& peak, int threads);

// "agrees: 16.1 FLOP/cycle at 2.3 GHz; AMD Zen/Zen+: 2 x 128-bit FMA units per core: 16 expected", "FAILED: ...",
// or "n/a: <reason>" for a precision this CPU has no kernel for.
std::string peak_check_text(const MachineDescription& machine, const PeakFigure& peak);
// Why a precision has no peak on this CPU (empty when it has one).
std::string missing_peak_reason(const CpuFeatures& cpu, const PeakFigure& peak);

// The lines a run prints first, each starting with "# ".
std::string machine_summary(const NodeMachine& machine, const BlasCoreChoice& core);

}  // namespace strata
