// Memory of a 16-bit GPU step (see gpu_memory.h).
#include "train/gpu_memory.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "train/schedule.h"

namespace strata::train {

GpuActivationBytes gpu_activation_bytes(const ModelConfig& model, int micro_batch, int seq, int tp, bool sp,
                                        const GpuLayout& layout) {
  const double s = seq, b = micro_batch, h = model.hidden, t = tp, e = layout.element_bytes;
  const double g = layout.gemm_input_bytes > 0 ? layout.gemm_input_bytes : e;  // a linear layer's kept input
  const double a = model.heads, A = model.heads * model.head_dim(), KV = model.kv_heads * model.head_dim(),
               F = model.mlp();
  const double mask = layout.dropout ? 1 : 0;
  // Korthikanti's 10 sbh: whole on every tensor-parallel rank, split over them only by sequence parallelism.
  const double whole = sp ? t : 1;
  const double sbh = s * b * h;
  GpuActivationBytes bytes;
  bytes.input = e * sbh / whole;  // ln1's input (Section 4.1: "layer norm ... stores its input, 2sbh")
  bytes.op[static_cast<std::size_t>(LayerOp::pre)] =
      g * sbh / whole                    // the QKV projection's input ("QKV matrix multiplies: 2sbh")
      + e * s * b * (A + 2 * KV) / t;   // q and k ("QK^T: 4sbh") and v ("attention over values: 2sbh")
  bytes.op[static_cast<std::size_t>(LayerOp::core)] =
      layout.flash_attention ? 4 * a * s * b / t  // flash: the softmax's fp32 log-sum-exp per (b, head, position)
                             : (2 * e + mask) * a * s * s * b / t;  // softmax output 2as^2b, its dropout mask as^2b and
                                                                    // output 2as^2b
  bytes.op[static_cast<std::size_t>(LayerOp::post)] =
      g * s * b * A / t          // the attention output, the projection's input ("linear projection: 2sbh")
      + mask * sbh / whole       // the attention's dropout mask ("sbh")
      + (e + g) * sbh / whole    // ln2's input and its output, the MLP's input ("2sbh" each)
      + (e + g) * s * b * F / t  // the GELU's input and output, the second MLP GEMM's input ("8sbh" each for F = 4h)
      + mask * sbh / whole;      // the MLP's dropout mask ("sbh")
  bytes.embedding = mask * sbh / whole;  // the embeddings' dropout mask (Section 4.3: "sbhp/t" for p in flight)
  // The final norm's and the output layer's inputs, and the logits of the rank's vocabulary slice (Section 4.3:
  // "4sbh/t (1 + v/h)", fp32 logits; layout.logit_bytes each).
  bytes.head = 2 * e * sbh / whole + layout.logit_bytes * s * b * tensor_shard(model, tp, 0).vocab_rows;
  return bytes;
}

double gpu_layer_kept_bytes(const GpuActivationBytes& bytes, Recompute recompute) {
  double kept = bytes.input;
  for (int op = 0; op < kLayerOps; ++op)
    if (keeps(recompute, static_cast<LayerOp>(op))) kept += bytes.op[static_cast<std::size_t>(op)];
  return kept;
}

double gpu_activation_peak(const TrainConfig& c, int pp, int pp_rank, int tp, bool sp, const GpuLayout& layout) {
  const GpuActivationBytes bytes = gpu_activation_bytes(c.model, c.micro_batch, c.seq, tp, sp, layout);
  const std::vector<StagePlan> stages = rank_stages(c, pp, pp_rank);
  // Per chunk: one micro-batch's kept bytes, and the recomputation's space the chunk needs.
  std::vector<double> per_micro_batch;
  double working = 0, overlap_space = 0;
  for (const StagePlan& plan : stages) {
    double kept = (plan.embedding ? bytes.embedding : 0) + (plan.head ? bytes.head : 0);
    for (int l = 0; l < plan.layers; ++l) {
      double recomputed = 0;
      if (c.recompute == Recompute::overlap) {
        kept += bytes.input;
        for (int op = 0; op < kLayerOps; ++op)
          (plan.kept.at(static_cast<std::size_t>(l))[static_cast<std::size_t>(op)] ? kept : recomputed) +=
              bytes.op[static_cast<std::size_t>(op)];
        overlap_space += recomputed;
      } else {
        kept += gpu_layer_kept_bytes(bytes, c.recompute);
        recomputed = bytes.layer() - gpu_layer_kept_bytes(bytes, c.recompute);
      }
      working = std::max(working, recomputed);
    }
    per_micro_batch.push_back(kept);
  }
  // The schedule's peak: every chunk's micro-batches in flight at once, freed as their backward ends.
  const std::vector<PipelineAction> actions =
      pipeline_actions(c.schedule, {pp, c.accumulation, c.virtual_stages}, pp_rank);
  double now = 0, peak = 0;
  for (const PipelineAction& action : actions) {
    const double chunk = per_micro_batch.at(static_cast<std::size_t>(action.chunk));
    now += action.pass == PipelineAction::Pass::forward ? chunk : -chunk;
    peak = std::max(peak, now);
  }
  return peak + (c.recompute == Recompute::overlap ? overlap_space : working);
}

const char* name(ShardingBuffers buffers) {
  switch (buffers) {
    case ShardingBuffers::strata: return "strata";
    case ShardingBuffers::fsdp: return "fsdp";
    case ShardingBuffers::deepspeed: return "deepspeed";
  }
  return "?";
}

const std::vector<std::string>& sharding_buffer_names() {
  static const std::vector<std::string> names = {"strata", "fsdp", "deepspeed"};
  return names;
}

ShardingBuffers parse_sharding_buffers(const std::string& text) {
  for (ShardingBuffers b : {ShardingBuffers::strata, ShardingBuffers::fsdp, ShardingBuffers::deepspeed})
    if (text == name(b)) return b;
  std::string names;
  for (const std::string& known : sharding_buffer_names()) names += (names.empty() ? "" : ", ") + known;
  throw std::invalid_argument("sharding buffers '" + text + "': not one of " + names);
}

DataParallelBuffers sharding_buffer_elements(const TrainConfig& c, const DataParallelShape& shape,
                                             ShardingBuffers buffers) {
  const bool gathers = c.strategy.params != Sharding::none, reductions = c.strategy.grads != Sharding::none;
  DataParallelBuffers b;
  switch (buffers) {
    case ShardingBuffers::strata: {
      const DataParallelBuffers fp32 = data_parallel_buffers(c, shape);
      b.gathers = fp32.gathers / 4, b.reductions = fp32.reductions / 4;
      break;
    }
    case ShardingBuffers::fsdp: {
      const HeldSizes held = held_sizes(c, shape);
      b.gathers = gathers ? held.outer_units + 2 * held.largest_layer : 0;
      b.reductions = reductions ? 2 * held.largest_unit : 0;
      break;
    }
    case ShardingBuffers::deepspeed: {
      // DeepSpeed's defaults (deepspeed/runtime/zero/constants.py): stage3_max_live_parameters,
      // stage3_prefetch_bucket_size, reduce_bucket_size; never more than the rank's whole model.
      constexpr double kMaxLiveParameters = 1e9, kPrefetchBucket = 5e7, kReduceBucket = 5e8;
      const HeldSizes held = held_sizes(c, shape);
      const double module = held.largest_tensor;
      b.gathers = gathers ? std::min(std::max(kMaxLiveParameters, module) + kPrefetchBucket, held.parameters) : 0;
      b.reductions = reductions ? std::min(kReduceBucket + module, held.trainable) : 0;
      break;
    }
  }
  return b;
}

MemoryUse gpu_memory_estimate(const TrainConfig& c, const DataParallelShape& shape, const GpuLayout& layout) {
  MemoryUse use = memory_estimate(c, shape);  // its model states are those of the units the rank holds, in fp32
  use.params *= kMixedPrecisionStates.params / kFp32States.params;
  use.grads *= kMixedPrecisionStates.grads / kFp32States.grads;
  use.optimizer *= kMixedPrecisionStates.optimizer / kFp32States.optimizer;
  const bool sp = c.sequence_parallel && shape.tp > 1;
  use.activations = gpu_activation_peak(c, shape.pp, shape.pp_rank, shape.tp, sp, layout);
  const double scale = layout.element_bytes / 4.0;
  use.workspace = scale * workspace_bytes(c.model, c.micro_batch, c.seq, shape.tp, sp);
  const double message = layout.element_bytes * static_cast<double>(c.micro_batch) * c.seq / (sp ? shape.tp : 1) *
                         c.model.hidden;
  const DataParallelBuffers in_flight = sharding_buffer_elements(c, shape, layout.sharding_buffers);
  const int reduction_bytes = layout.gradient_reduction_bytes > 0 ? layout.gradient_reduction_bytes : layout.element_bytes;
  use.comm_buffers = layout.element_bytes * in_flight.gathers + reduction_bytes * in_flight.reductions;
  for (const StagePlan& plan : rank_stages(c, shape.pp, shape.pp_rank)) {
    if (!plan.head) use.comm_buffers += message;       // the output's gradient, received
    if (!plan.embedding) use.comm_buffers += message;  // the input's gradient, being sent
  }
  return use;
}

}  // namespace strata::train
