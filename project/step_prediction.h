// A training configuration's step predicted on a system description: the step traced (train::trace_step),
// simulated (predict.h), and read as strata-step reads a measured one: tokens/s and MFU with their conventions, memory
// per rank by category. The one path from a configuration to a prediction: strata-project predict and validate call
// it, and so does the search (search.h) for each configuration it simulates.
//
// Conventions:
// - MFU: model FLOPs 6N + 6Lhs per token (llm.c's count, causal attention as half; train::model_flops_per_token)
//   x tokens of the global batch / (predicted step x the description's dense peak of the workload's dtype x ranks);
//   HFU adds the recomputed FLOPs (train::recompute_flops_per_token).
// - Memory per rank (the largest over the pipeline ranks, per category; pipeline_rank_memory): train::memory_estimate,
//   the CPU step's fp32 formulas, for element_bytes 4 or more. For 2-byte elements, a GPU step in mixed precision
//   (train::gpu_memory_estimate): model states at docs/strategies.md's mixed-precision count
//   (train::kMixedPrecisionStates: 2 B parameters, 2 B gradients, 12 B optimizer states per element) and Korthikanti
//   et al.'s activations for the workload's attention (flash: no s^2 scores). A step fits when the total is within
//   the description's device.memory_capacity.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "project/predict.h"
#include "project/system.h"
#include "project/trace_workload.h"
#include "train/gpu_memory.h"
#include "train/trainer.h"

namespace strata::project {

// One step to predict: its configuration (strategy and recomputation set) on a grid, the traced job's layout
// (ranks per node, grid order, overlap's per-pipeline-rank configurations) and the workload's dtype.
struct StepCase {
  std::string label;  // "NNG", "NNG recompute full"
  train::TrainConfig config;
  coll::GridShape grid;
  train::TraceOptions trace;
  WorkloadOptions workload;
  PredictOptions predict{false, false};  // the fast path; intervals only for a Chrome trace
};

// Tokens and FLOPs of a step of `config` on `grid`, and its rates at `step_s` on devices of `peak` FLOP/s.
struct Throughput {
  double tokens_per_step = 0;  // of the global batch
  double flop_per_rank = 0;    // model FLOPs per rank per step
  double tokens_per_s = 0, mfu = 0;
};
Throughput throughput(const train::TrainConfig& config, const coll::GridShape& grid, double step_s, double peak);

struct PredictedStep {
  Prediction prediction;
  double trace_s = 0, simulate_s = 0;  // wall time of the trace, and of the simulations (nominal; both ends: interval)
  double tokens_per_step = 0;
  double flop_per_rank = 0, recompute_flop_per_rank = 0;  // model and recomputed FLOPs per rank per step
  double peak_per_rank = 0;                               // the description's peak of the workload's dtype
  double tokens_per_s = 0, mfu = 0, hfu = 0;
  train::MemoryUse memory;     // per rank: the largest over the pipeline ranks, per category
  std::vector<train::MemoryUse> rank_memory;  // per pipeline rank (pipeline_rank_memory)
  double memory_capacity = 0;  // B per device: the description's device.memory_capacity; 0 when it gives none
  int fits = -1;               // 1: the memory per rank (all categories) is within it; 0: above it; -1: no capacity
  std::string stage_layers;    // layers of each stage, comma-separated
  std::size_t traced_operations = 0;   // over the traced ranks (prediction.simulated_operations: after compaction)
  std::vector<std::string> group_roles;  // per traced group (TraceGroup::role), as the timeline numbers them
  std::map<int, std::string> streams;  // the simulated streams' names, for a Chrome trace
  std::vector<std::string_view> phases;  // with intervals: per interval of the timeline, its op's phase (TraceOp::phase)
};

// What each pipeline rank holds, per category, in stage order (each stage's data-parallel group placed as the trace
// places it, train::stage_data_parallel_shape): the executor's fp32 formulas (train::memory_estimate) for elements of
// 4 bytes or more (an fp64 step is counted at fp32's 4 bytes), a GPU step's in mixed precision (train::gpu_memory_estimate, the workload's gpu_layout) for
// narrower ones. predict_step reports the largest of each category; the search, the rank with the largest total.
std::vector<train::MemoryUse> pipeline_rank_memory(const StepCase& step);

// Throws std::invalid_argument for a configuration the step refuses on the grid (a strategy on uneven groups, a
// model that does not divide) or a description the simulator refuses.
PredictedStep predict_step(const StepCase& step, const System& system);

// The GPU memory layout of a workload: its element size, flash attention unless it runs attention unfused, its
// dropout masks, and its logits kept in fp32 under a loss on fp32 logits (the cast Megatron's cross entropy saves its
// softmax in, fused or not), at the element size under the fused loss; under fp8 GEMMs the linear layers' inputs at
// 1 byte (Transformer Engine keeps their FP8 copies for the weight gradients).
train::GpuLayout gpu_layout(const WorkloadOptions& workload);

// The components strata-step stores as phase_<name> in its summary, in that order, and the predicted value of each.
const std::vector<std::string>& step_components();
double component(const StepComponents& c, const std::string& name);

}  // namespace strata::project
