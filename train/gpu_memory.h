// Memory per rank of a 16-bit training step as GPU frameworks hold it (Megatron-LM's layout), for predictions of
// GPU steps. The CPU executor's own accounting (step_formulas.h: fp32, its own buffers) is what strata-step measures
// and stays the formula of the CPU step; a GPU step keeps other tensors, in 2 bytes, and frees them as it goes.
//
// Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
// (arXiv 2205.05198), Section 4: s sequence, b micro-batch, h hidden, a heads, t tensor-parallel degree, e the
// element's bytes (2), one byte per dropout-mask element. One layer keeps, per micro-batch (Section 4.1):
//   layer norms' inputs 2 e sbh, the QKV projection's input e sbh, the MLP's input e sbh, two dropout masks 2 sbh
//                                     (10 sbh: held whole by every tensor-parallel rank, Section 4.2.1)
//   q, k, v e sb (A + 2 KV), the attention output e sb A, the GELU's input and output 2 e sb F
//                                     (24 sbh for A = KV = h, F = 4h: split over the t ranks)
//   the attention core: softmax output, its dropout mask and output (2e + 1) a s^2 b (5 a s^2 b; split over t)
// so sbh (34 + 5 as/h) without parallelism and sbh (10 + 24/t + 5 as/(ht)) with tensor parallelism (Table 2).
// Sequence parallelism (Section 4.2.2) splits the 10 sbh over t too: sbh/t (34 + 5 as/h). Selective recomputation
// (Section 5) keeps all but the attention core: sbh (10 + 24/t), sbh 34/t with sequence parallelism. Full
// recomputation keeps each layer's input, e sbh (2 sbh, Table 2; over t with sequence parallelism, which holds the
// residual stream split), and re-materialises one layer at a time in backward (its whole set, counted once).
// Flash attention (a fused kernel; not in the paper, which materialises the scores) keeps the softmax's log-sum-exp
// in fp32, 4 a s b (over t), instead of the a s^2 b terms, and regenerates its dropout mask.
// Pipeline (Section 4.2.3): each rank holds the micro-batches its schedule has in flight: in 1F1B the first stage
// holds p of them, so it holds the activations of all L layers of one micro-batch, L/p layers x p; interleaved with
// v chunks, Megatron-LM's schedule holds (1 + (p - 1)/(p v)) times that (Section 4.3). Here: the largest over the
// rank's action list (schedule.h) of the sum over its chunks of the micro-batches in flight times the chunk's
// bytes.
// Embeddings and output (Section 4.3): the embeddings' dropout mask sbh per micro-batch on the first stage (sbhp/t
// for p in flight, with sequence parallelism); on the last stage the final layer norm's and the output layer's
// inputs, 2 e sbh, and the fp32 logits of the rank's vocabulary slice, 4 sb V/t (4 sbh/t (1 + V/h) in all); a cross
// entropy on the logits as they are (Transformer Engine's, flash-attn's) keeps them at e bytes instead
// (GpuLayout::logit_bytes).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "train/gpt.h"
#include "train/model_config.h"
#include "train/step_formulas.h"
#include "train/trainer.h"

namespace strata::train {

// How a framework holds the data-parallel gathers of sharded parameters and reductions of sharded gradients while they
// are in flight (the data-parallel part of the communication buffers), each from the largest unit the rank gathers
// (a layer: one FSDP unit per transformer block) or the largest single tensor (a module's weight):
//   strata     the step's own pools (data_parallel_buffers): four of the largest unit gathered (this unit, the next,
//              the embeddings and the final norm), four being reduced
//   fsdp       PyTorch FSDP, one unit per layer and the root holding the embeddings and the final norm: two layers
//              gathered (the one computing and the one its all-gather rate limiter, limit_all_gathers, or backward
//              prefetch lets run ahead) beside the root, which FSDP keeps gathered from its forward to its backward
//              (torch/distributed/fsdp/_runtime_utils.py, _post_forward_reshard: "Do not free the root's parameters
//              in the post-forward"), and two units' gradients (the one being written and the one being
//              reduce-scattered)
//   deepspeed  DeepSpeed ZeRO at its defaults, which gathers module by module: live parameters up to
//              stage3_max_live_parameters (1e9 elements) or the largest module's, when larger, plus the
//              stage3_prefetch_bucket_size (5e7) fetched ahead; gradients up to reduce_bucket_size (5e8) waiting in
//              the bucket plus the largest module's being written; at most the parameters the rank holds, and
//              gradients at most the trainable ones
enum class ShardingBuffers { strata, fsdp, deepspeed };
// "strata", "fsdp", "deepspeed".
const char* name(ShardingBuffers buffers);
const std::vector<std::string>& sharding_buffer_names();
// std::invalid_argument naming `text` and the names unless it is one of them.
ShardingBuffers parse_sharding_buffers(const std::string& text);
// The data-parallel buffers' elements in flight under `buffers` (data_parallel_buffers' fp32 bytes over 4 for strata);
// nothing for parameters that are not sharded (gathers) or gradients that are not (reductions).
DataParallelBuffers sharding_buffer_elements(const TrainConfig& config, const DataParallelShape& shape,
                                             ShardingBuffers buffers);

struct GpuLayout {
  int element_bytes = 2;         // e: activations and gradients (bf16, fp16)
  bool flash_attention = true;   // a fused kernel: no s^2 scores kept
  bool dropout = true;           // masks of 1 byte per element (GPT-3's and the paper's models train with dropout)
  int gradient_reduction_bytes = 0;  // the data-parallel gradient reductions' buffers (fp32 reductions: 4); 0: e
  int logit_bytes = 4;           // the kept logits' element: 4 (fp32, the paper's count), or e under a fused loss
  // The linear layers' inputs kept for their weight gradients: 1 under FP8 training (Transformer Engine keeps the FP8
  // copies its GEMMs read: the QKV, attention projection, MLP and second MLP inputs); 0: e.
  int gemm_input_bytes = 0;
  ShardingBuffers sharding_buffers = ShardingBuffers::strata;
};

// One micro-batch's bytes on one rank, split as the executor's ops split a layer (gpt.h's LayerOp) so every
// recomputation mode picks its part: pre the QKV projection's input and q, k, v; core the attention core; post the
// attention output, both dropout masks, ln2's input and output, the GELU's input and output. The layer's input (ln1's
// input) is kept in every mode.
struct GpuActivationBytes {
  double input = 0;
  std::array<double, kLayerOps> op{};
  double embedding = 0;  // the first stage's, per micro-batch: the embeddings' dropout mask
  double head = 0;       // the last stage's, per micro-batch: final norm and output layer inputs, logits
  double layer() const { return input + op[0] + op[1] + op[2]; }
};
GpuActivationBytes gpu_activation_bytes(const ModelConfig& model, int micro_batch, int seq, int tp, bool sp,
                                        const GpuLayout& layout = {});

// Bytes one layer keeps for one micro-batch under a recomputation mode other than overlap: none every term,
// selective all but the core, full the input.
double gpu_layer_kept_bytes(const GpuActivationBytes& bytes, Recompute recompute);

// The activations pipeline rank `pp_rank` of `pp` holds at its peak under `config` (its schedule, stages and
// recomputation; overlap keeps what config.kept_ops says), with tensor-parallel degree tp: the most, over its action
// list, of the micro-batches in flight per chunk times the chunk's kept bytes, plus the recomputation's space: one
// layer's recomputed terms (full: the whole layer; selective: the core), or under overlap every layer's own (as the
// executor allocates them).
double gpu_activation_peak(const TrainConfig& config, int pp, int pp_rank, int tp, bool sp, const GpuLayout& layout = {});

// What a rank holds, per category, in mixed precision: model states at kMixedPrecisionStates (2, 2 and 12 bytes per
// element) on the units the rank holds (memory_estimate's), activations gpu_activation_peak, the backward pass's
// workspace once (workspace_bytes at e bytes an element: the allocator reuses it across chunks), communication
// buffers the data-parallel ones (sharding_buffer_elements under the layout's sharding_buffers: the gathers' at e
// bytes an element, the reductions' at the layout's gradient_reduction_bytes) and, per stage, the output's received
// gradient and the input's gradient being sent (one message each: a GPU step does not queue copies).
MemoryUse gpu_memory_estimate(const TrainConfig& config, const DataParallelShape& shape, const GpuLayout& layout = {});

}  // namespace strata::train
