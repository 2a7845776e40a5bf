// The command-line side of a step's prediction (project/step_prediction.h computes it): the step case a plan and its
// flags describe, the checks of names the description must have, overlap's stored placements, the `prediction` table
// strata-project predict and validate write (results/SCHEMA.md), and a strata-project run in a results file (no MPI:
// one process).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/cases/step_config.h"
#include "project/step_prediction.h"
#include "project/system.h"
#include "results/table.h"
#include "train/gpu_memory.h"
#include "train/trainer.h"

namespace strata {

class ResultsWriter;

// The step a plan predicts on a system of `ranks_per_node` devices per node: its first strategy and recomputation mode
// (a published row, a timed configuration: one of each).
project::StepCase first_step_case(const StepPlan& plan, const StepFlags& flags, const std::string& label, int ranks_per_node);

// A usage error naming `flag` unless the description has collectives of `algorithm` (the --sharding-collectives
// of predict, a published row's sharding_collectives); nothing for an empty name.
void check_sharding_algorithm(const project::System& system, const std::string& algorithm, const std::string& flag);
// Exits 2 (UsageError) naming the flag unless `attention` is flash, unfused or a kernel the description names.
void check_attention(const project::System& system, const std::string& attention, const std::string& flag);

// The --grad-reduce-dtype choices of predict and search (auto, fp32, bf16, fp16) and the element size each gives
// WorkloadOptions::gradient_reduction_bytes (auto: 0, the step's element size).
inline const std::vector<std::string> kGradReduceDtypes = {"auto", "fp32", "bf16", "fp16"};
// How the loss runs over the logits (project::WorkloadOptions::loss).
inline const std::vector<std::string>& kLossModes = project::loss_modes();
int gradient_reduction_bytes(const std::string& dtype);
// The help of --sharding-buffers (predict and search): train::ShardingBuffers, memory only.
inline constexpr const char* kShardingBuffersHelp =
    "how the framework holds sharded parameters it gathers and sharded gradients it reduces (ZeRO-2/3, FSDP), "
    "memory only: strata (the step's own: four of the largest unit gathered, four being reduced), fsdp (PyTorch "
    "FSDP, a unit per layer: two layers gathered beside the embeddings' root unit, two units being reduced) or "
    "deepspeed (DeepSpeed ZeRO's defaults, module by module: up to 1e9 live parameters or the largest module's, a "
    "5e7 prefetch, a 5e8 reduce bucket and the largest module's gradient)";

// Each pipeline rank's configuration under a stored placement (a strata-recompute-policy document, as strata-step
// stores it with an overlap case): train::placed_rank_configs with, for each rank, the policy's entries that name its
// ops. `source` names the policy in messages (UsageError).
std::vector<train::TrainConfig> overlap_configs(const train::TrainConfig& config, const coll::GridShape& grid,
                                                const nlohmann::json& policy, const std::string& source);

// The first field of the description whose source or comment says it was fitted from strata-step runs; empty when
// none does (calibrate reads benchmark runs only, and names the programs it read).
std::string fitted_from_steps(const project::System& system);

// The `prediction` table (results/SCHEMA.md): one row per predicted step.
Table prediction_table();
void add_prediction_row(Table& table, int64_t index, const project::StepCase& step, const project::PredictedStep& predicted,
                        const std::string& system_name);

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
