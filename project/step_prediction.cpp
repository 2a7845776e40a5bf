#include "project/step_prediction.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "train/overlap.h"
#include "train/step_formulas.h"
#include "train/trace.h"

namespace strata::project {

using namespace strata::train;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The configuration pipeline rank `stage` runs.
const TrainConfig& config_of(const StepCase& step, int stage) {
  return step.trace.pipeline_rank_configs.empty() ? step.config
                                                  : step.trace.pipeline_rank_configs.at(static_cast<std::size_t>(stage));
}

// The largest of each category over the pipeline ranks.
MemoryUse largest_per_category(const std::vector<MemoryUse>& ranks) {
  MemoryUse most;
  for (const MemoryUse& m : ranks) {
    most.params = std::max(most.params, m.params), most.grads = std::max(most.grads, m.grads);
    most.optimizer = std::max(most.optimizer, m.optimizer), most.activations = std::max(most.activations, m.activations);
    most.workspace = std::max(most.workspace, m.workspace), most.comm_buffers = std::max(most.comm_buffers, m.comm_buffers);
  }
  return most;
}

// Overlap keeps different ops on each pipeline rank: the recomputed FLOPs per token summed over the ranks' stages.
double recompute_flops_per_token_of(const StepCase& step) {
  const TrainConfig& c = step.config;
  if (c.recompute != Recompute::overlap) return recompute_flops_per_token(c.model, c.seq, c.recompute);
  double per_token = 0;
  for (int stage = 0; stage < step.grid.pp; ++stage) {
    std::vector<std::vector<KeptOps>> kept;
    for (const StagePlan& plan : rank_stages(config_of(step, stage), step.grid.pp, stage)) kept.push_back(plan.kept);
    per_token += recompute_flops_per_token(c.model, c.seq, c.recompute, kept);
  }
  return per_token;
}

std::string join_ints(const std::vector<int>& values) {
  std::string text;
  for (int v : values) text += (text.empty() ? "" : ",") + std::to_string(v);
  return text;
}

}  // namespace

std::vector<MemoryUse> pipeline_rank_memory(const StepCase& step) {
  std::vector<MemoryUse> ranks;
  const int per_node = static_cast<int>(std::min<long long>(step.trace.ranks_per_node, step.grid.size()));
  for (int stage = 0; stage < step.grid.pp; ++stage) {
    const DataParallelShape shape = stage_data_parallel_shape(step.grid, per_node, step.trace.grid_order, stage);
    ranks.push_back(step.workload.element_bytes >= 4
                        ? memory_estimate(config_of(step, stage), shape)
                        : gpu_memory_estimate(config_of(step, stage), shape, gpu_layout(step.workload)));
  }
  return ranks;
}

Throughput throughput(const TrainConfig& c, const coll::GridShape& grid, double step_s, double peak) {
  Throughput t;
  const double world = static_cast<double>(grid.size());
  t.tokens_per_step = static_cast<double>(grid.dp) * c.accumulation * c.micro_batch * c.seq;
  t.flop_per_rank = model_flops_per_token(c.model, c.seq) * t.tokens_per_step / world;
  t.tokens_per_s = step_s > 0 ? t.tokens_per_step / step_s : 0;
  t.mfu = step_s > 0 && peak > 0 ? t.flop_per_rank / (step_s * peak) : 0;
  return t;
}

GpuLayout gpu_layout(const WorkloadOptions& workload) {
  GpuLayout layout;
  layout.element_bytes = workload.element_bytes;
  layout.gradient_reduction_bytes = workload.gradient_reduction_bytes;
  layout.flash_attention = workload.attention != "unfused";
  layout.dropout = workload.dropout;
  layout.logit_bytes = fp32_logits(workload.loss) ? 4 : workload.element_bytes;
  layout.gemm_input_bytes = workload.dtype == "fp8" ? 1 : 0;  // Transformer Engine keeps its GEMMs' FP8 inputs
  layout.sharding_buffers = parse_sharding_buffers(workload.sharding_buffers);
  return layout;
}

PredictedStep predict_step(const StepCase& step, const System& system) {
  const TrainConfig& c = step.config;
  PredictedStep out;
  auto start = std::chrono::steady_clock::now();
  const StepTrace trace = trace_step(c, step.grid, step.trace);
  out.trace_s = seconds_since(start);
  start = std::chrono::steady_clock::now();
  out.prediction = predict(system, trace, step.workload, step.predict);
  out.simulate_s = seconds_since(start);

  const auto compute = system.device.compute.find(step.workload.dtype);
  out.peak_per_rank = compute == system.device.compute.end() ? 0 : compute->second.peak_flops.value;
  const double step_s = out.prediction.step_s;
  const Throughput rates = throughput(c, step.grid, step_s, out.peak_per_rank);
  out.tokens_per_step = rates.tokens_per_step, out.flop_per_rank = rates.flop_per_rank;
  out.tokens_per_s = rates.tokens_per_s, out.mfu = rates.mfu;
  out.recompute_flop_per_rank =
      recompute_flops_per_token_of(step) * out.tokens_per_step / static_cast<double>(step.grid.size());
  out.hfu = step_s > 0 && out.peak_per_rank > 0
                ? (out.flop_per_rank + out.recompute_flop_per_rank) / (step_s * out.peak_per_rank) : 0;
  out.rank_memory = pipeline_rank_memory(step);
  out.memory = largest_per_category(out.rank_memory);
  if (system.device.memory_capacity) {
    out.memory_capacity = system.device.memory_capacity->value;
    out.fits = out.memory.total() <= out.memory_capacity ? 1 : 0;
  }
  out.stage_layers = join_ints(stage_partition(c.model, step.grid.pp * c.virtual_stages, c.stage_layers));
  // trace_workload.h: a group's collectives and sends on one stream each, its receives on another.
  const int groups = static_cast<int>(trace.groups.size());
  out.streams[kComputeStream] = "compute";
  for (int g = 0; g < groups; ++g) {
    const TraceGroup& group = trace.groups[static_cast<std::size_t>(g)];
    const std::string what = group.role + " (" + std::to_string(group.ranks.size()) + " ranks)";
    out.streams[communication_stream(g)] = what;
    out.streams[communication_stream(groups + g)] = "receives " + what;
    out.group_roles.push_back(group.role);
  }
  for (const TraceRank& rank : trace.ranks) out.traced_operations += rank.ops.size();
  // The simulator lists the intervals rank by rank, op by op.
  if (step.predict.intervals && step.predict.phases)
    for (const TraceRank& rank : trace.ranks)
      for (const TraceOp& op : rank.ops) out.phases.push_back(op.phase);
  return out;
}

const std::vector<std::string>& step_components() {
  static const std::vector<std::string> names = {"forward",   "backward", "optimizer",     "comm_exposed",    "idle",
                                                 "recompute", "comm_tp",  "pipeline_wait", "recompute_window"};
  return names;
}

double component(const StepComponents& c, const std::string& name) {
  if (name == "forward") return c.forward_s;
  if (name == "backward") return c.backward_s;
  if (name == "optimizer") return c.optimizer_s;
  if (name == "comm_exposed") return c.comm_exposed_s;
  if (name == "idle") return c.idle_s;
  if (name == "recompute") return c.recompute_s;
  if (name == "comm_tp") return c.comm_tp_s;
  if (name == "pipeline_wait") return c.pipeline_wait_s;
  if (name == "recompute_window") return c.recompute_window_s;
  throw std::invalid_argument("no step component " + name);
}

}  // namespace strata::project
