// A training step predicted on a system description (project/predict.h), from its configuration: the step traced
// (train::trace_step), simulated, and read as strata-step reads a measured one (tokens/s and MFU with its
// conventions, memory per rank by category), for strata-project predict and validate; the `prediction` table they
// write; and a strata-project run in a results file (no MPI: one process).
//
// Conventions:
// - MFU: model FLOPs 6N + 6Lhs per token (llm.c's count, causal attention as half; train::model_flops_per_token)
//   x tokens of the global batch / (predicted step x the description's dense peak of the workload's dtype x ranks);
//   HFU adds the recomputed FLOPs (train::recompute_flops_per_token).
// - Memory per rank (the largest over the pipeline ranks, per category): train::memory_estimate, the CPU step's
//   fp32 formulas, for element_bytes 4. For 2-byte elements, a GPU step in mixed precision
//   (train::gpu_memory_estimate): model states at docs/strategies.md's mixed-precision count (train::kMixedPrecisionStates:
//   2 B parameters, 2 B gradients, 12 B optimizer states per element) and Korthikanti et al.'s activations for the
//   workload's attention (flash: no s^2 scores). A step fits when the total is within the description's
//   device.memory_capacity.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/cases/step_config.h"
#include "project/predict.h"
#include "project/system.h"
#include "results/table.h"
#include "train/gpu_memory.h"
#include "train/trainer.h"

namespace strata {

class ResultsWriter;

// One step to predict: its configuration (strategy and recomputation set) on a grid, the traced job's layout
// (ranks per node, grid order, overlap's per-pipeline-rank configurations) and the workload's dtype.
struct StepCase {
  std::string label;  // "NNG", "NNG recompute full"
  train::TrainConfig config;
  coll::GridShape grid;
  train::TraceOptions trace;
  project::WorkloadOptions workload;
  project::PredictOptions predict{false, false};  // the fast path; intervals only for a Chrome trace
};

// The step a plan predicts on a system of `ranks_per_node` devices per node: its first strategy and recomputation mode
// (a published row, a timed configuration: one of each).
StepCase first_step_case(const StepPlan& plan, const StepFlags& flags, const std::string& label, int ranks_per_node);

struct PredictedStep {
  project::Prediction prediction;
  double trace_s = 0, simulate_s = 0;  // wall time of the trace, and of the simulations (nominal and both ends)
  double tokens_per_step = 0;
  double flop_per_rank = 0, recompute_flop_per_rank = 0;  // model and recomputed FLOPs per rank per step
  double peak_per_rank = 0;                               // the description's peak of the workload's dtype
  double tokens_per_s = 0, mfu = 0, hfu = 0;
  train::MemoryUse memory;  // per rank: the largest over the pipeline ranks, per category
  double memory_capacity = 0;  // B per device: the description's device.memory_capacity; 0 when it gives none
  int fits = -1;               // 1: the memory per rank (all categories) is within it; 0: above it; -1: no capacity
  std::string stage_layers;  // layers of each stage, comma-separated
  std::map<int, std::string> streams;  // the simulated streams' names, for a Chrome trace
  std::vector<std::string> phases;     // per interval of the timeline: its op's phase
};

// A usage error naming `flag` unless the description has collectives of `algorithm` (the --sharding-collectives
// of predict, a published row's sharding_collectives); nothing for an empty name.
void check_sharding_algorithm(const project::System& system, const std::string& algorithm, const std::string& flag);
// The GPU memory layout of a workload: its element size, and flash attention unless it runs attention unfused.
train::GpuLayout gpu_layout(const project::WorkloadOptions& workload);
double memory_total(const train::MemoryUse& memory);  // all categories

// Throws std::invalid_argument for a configuration the step refuses on the grid (a strategy on uneven groups, a
// model that does not divide) or a description the simulator refuses.
PredictedStep predict_step(const StepCase& step, const project::System& system);

// Each pipeline rank's configuration under a stored placement (a strata-recompute-policy document, as strata-step
// stores it with an overlap case): the rank's ops and windows rebuilt from the configuration, the policy's entries
// of its ops applied (train::apply_placement). `source` names the policy in messages (UsageError).
std::vector<train::TrainConfig> overlap_configs(const train::TrainConfig& config, const coll::GridShape& grid,
                                                const nlohmann::json& policy, const std::string& source);

// The first field of the description whose source or comment says it was fitted from strata-step runs; empty when
// none does (calibrate reads benchmark runs only, and names the programs it read).
std::string fitted_from_steps(const project::System& system);

// The `prediction` table (results/SCHEMA.md): one row per predicted step.
Table prediction_table();
void add_prediction_row(Table& table, int64_t index, const StepCase& step, const PredictedStep& predicted,
                        const std::string& system_name);

// The components strata-step stores as phase_<name> in its summary, in that order, and the predicted value of each.
const std::vector<std::string>& step_components();
double component(const project::StepComponents& c, const std::string& name);

// One run of strata-project in a results file: created as interrupted, its tables appended, closed ok (or failed when
// destroyed before finish()). The attributes of the harness's runs, for one process; `benchmark` is "strata-project"
// unless `attributes` names another.
class ProjectRun {
 public:
  // Checks the path first (BadResultsFile); empty: a new file in results/runs/.
  ProjectRun(const std::string& path, const std::string& command, int argc, const char* const* argv,
             const std::string& config_json, const std::map<std::string, std::string>& attributes);
  ~ProjectRun();
  ProjectRun(const ProjectRun&) = delete;
  ProjectRun& operator=(const ProjectRun&) = delete;

  const std::string& path() const { return path_; }
  const std::string& run_id() const { return run_id_; }
  void append(const Table& table);
  void set_run_attr(const std::string& name, const std::string& value);
  void finish();

 private:
  std::string path_, run_id_;
  std::unique_ptr<ResultsWriter> writer_;
  bool finished_ = false;
};

// Checks, before any work, that a results file can take a run (BadResultsFile otherwise); empty: the default.
void check_results_output(const std::string& path);

// Writes `text` to `path` whole or not at all (a temporary beside it, renamed).
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace strata
