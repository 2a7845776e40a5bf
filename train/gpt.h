// A GPT-2-style decoder trained on the CPU in fp32 (its GEMMs optionally in bf16: CpuRuntime), written as llm.c
// writes it: token + learned position embeddings, pre-LayerNorm blocks of causal (grouped-query) attention and a
// GELU MLP, a final LayerNorm and an LM head tied to the token table; one function per pass, reading as the model
// reads.
//
// Parameters and gradients live in flat buffers owned by the caller, laid out by ParameterLayout: the
// embeddings, then each layer's tensors together, then the final norm, so a layer is one contiguous range
// and sharding a state is slicing it. The model owns its activations (kept for the backward pass).
//
// Dimensions: B batch, T sequence, C hidden, NH heads, KVH kv heads, D = C / NH, F MLP hidden, V vocabulary,
// N = B * T rows.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "collectives/process_group.h"
#include "kernels/attention.h"
#include "kernels/cpu_gemm.h"
#include "kernels/layers.h"
#include "kernels/linear.h"
#include "train/memory.h"
#include "train/model_config.h"
#include "train/tracer.h"

namespace strata::train {

struct Slice {
  std::size_t offset = 0;
  std::size_t size = 0;
  std::size_t end() const { return offset + size; }
};

// The tensors of one layer, in buffer order.
enum class LayerTensor { ln1_w, ln1_b, qkv_w, qkv_b, attn_proj_w, attn_proj_b, ln2_w, ln2_b, fc_w, fc_b, fc_proj_w, fc_proj_b };
inline constexpr int kLayerTensors = 12;

class ParameterLayout {
 public:
  // The whole model, or one tensor-parallel rank's share of it (its tensors hold the shard's rows or columns).
  explicit ParameterLayout(const ModelConfig& model);
  ParameterLayout(const ModelConfig& model, const TensorShard& shard);
  const TensorShard& shard() const { return shard_; }
  std::size_t total() const { return total_; }
  Slice wte() const { return wte_; }  // (V, C), also the LM head; a shard: (vocab_rows, C)
  Slice wpe() const { return wpe_; }  // (maxT, C)
  Slice layer(int l) const;           // every tensor of layer l
  Slice tensor(int l, LayerTensor t) const;
  Slice lnf_w() const { return lnf_w_; }
  Slice lnf_b() const { return lnf_b_; }
  // The units a sharded strategy gathers one at a time, in forward order: embeddings, each layer, final norm.
  std::vector<Slice> units() const;
  // The tensors every tensor-parallel rank holds whole (the position table, the norms, the row-parallel
  // layers' biases), in buffer order: a sum over the group must count them once.
  std::vector<Slice> replicated() const;

 private:
  ModelConfig model_;
  TensorShard shard_;
  Slice wte_, wpe_, lnf_w_, lnf_b_;
  std::size_t first_layer_ = 0, per_layer_ = 0, total_ = 0;
  std::size_t tensor_offset_[kLayerTensors] = {}, tensor_size_[kLayerTensors] = {};
};

// GPT-2 initialisation: weights normal(0, std), the residual projections (attention output, MLP down)
// normal(0, std / sqrt(2 L)), biases 0, layer-norm weights 1. Deterministic for a seed; a tensor-parallel
// layout gets its shard of the whole model's initialisation, so every degree trains the same model.
void init_parameters(const ModelConfig& model, const ParameterLayout& layout, float* params, uint64_t seed,
                     float std = 0.02f);
// Copies a tensor-parallel rank's share out of a buffer laid out for the whole model (parameters or
// gradients): `local` is laid out by ParameterLayout(model, shard); vocabulary rows beyond V are zero.
void take_shard(const ModelConfig& model, const TensorShard& shard, const float* whole, float* local);

// The recomputable parts of a layer's forward pass, in order; each reads its predecessor's outputs (and the
// layer's input, which is always kept):
//   pre   ln1 and its statistics, the QKV projection;
//   core  q, k, v in head layout, the attention output and its log-sum-exp (the attention core);
//   post  the attention's merged output and projection, the residual, ln2 and its statistics, the MLP.
enum class LayerOp { pre, core, post };
inline constexpr int kLayerOps = 3;
const char* name(LayerOp op);  // "pre", "core", "post"

// What the forward pass keeps for the backward pass, and what the backward pass computes again first:
//   none       every layer's activations;
//   full       each layer's input only; backward runs the layer's forward again, into one layer's space;
//   selective  all but the attention core (q, k, v in head layout, the attention output and its log-sum-exp),
//              which backward recomputes from the kept qkv (Megatron's selective mode: the core attention);
//   overlap    per layer and op, kept or recomputed as a placement decides (StagePlan::kept); a recomputed op
//              gets its own space in the layer (one micro-batch's worth), so the trainer can recompute it before
//              the layer's backward, while the rank waits for communication (Lynx), or on demand.
// Without dropout the recomputed activations equal the kept ones bit for bit, so every mode trains the same.
enum class Recompute { none, full, selective, overlap };
inline constexpr Recompute kAllRecomputes[] = {Recompute::none, Recompute::full, Recompute::selective, Recompute::overlap};
const char* name(Recompute recompute);
std::optional<Recompute> parse_recompute(std::string_view text);
// Whether a mode other than overlap keeps an op's outputs.
bool keeps(Recompute recompute, LayerOp op);

using KeptOps = std::array<bool, kLayerOps>;  // per op of one layer: kept (else recomputed)

// The part of the model one pipeline stage runs: layers [first_layer, first_layer + layers), the embeddings on
// the first stage, and on the last the final norm and the LM head, which reads its own copy of the tied token
// table (the trainer keeps the copies equal); and how many micro-batches' activations it holds at once (a
// pipeline schedule's micro-batches in flight on the stage).
struct StagePlan {
  int first_layer = 0;
  int layers = -1;  // -1: every layer from first_layer on
  bool embedding = true;
  bool head = true;
  int activation_sets = 1;
  std::vector<KeptOps> kept;  // Recompute::overlap: per layer of the stage
};

struct CpuRuntime {
  cpu_gemm::Backend library = cpu_gemm::Backend::openblas;
  int threads = 1;
  // A traced model (trace.h) records each kernel call here instead of running it, and holds addresses, not memory.
  Tracer* tracer = nullptr;
  // The linear layers' GEMMs (QKV, attention output, MLP, LM head): fp32, or bf16 operands summed in fp32, as
  // mixed-precision training runs them; every other op, the attention core included, and every stored tensor
  // (parameters, gradients, activations, the optimizer's moments) stay fp32.
  cpu_gemm::Precision precision = cpu_gemm::Precision::fp32;
};

// Where each unit's parameters and gradients are: unit u of ParameterLayout::units() (0 the embeddings, 1..L
// the layers, L + 1 the final norm) starts at params[u] / grads[u]. A data-parallel strategy points a unit at
// the buffer it gathered it into; a null gradient unit is frozen: no gradients are computed for it.
struct UnitPointers {
  std::vector<const float*> params;
  std::vector<float*> grads;
  // Every unit inside one flat buffer laid out by `layout` (grads may be null: nothing trains).
  static UnitPointers flat(const ParameterLayout& layout, const float* params, float* grads);
  // A trainable unit whose gradient buffer the before_backward hook provides (the head's hook for the
  // embeddings and the final norm): backward reads each unit's gradient pointer only after that hook ran.
  static float* pending();
};

// Called around each layer, so data-parallel strategies can gather a layer's parameters before it runs and
// reduce its gradients as soon as they are complete. `layer` is -1 for the embeddings and L for the final
// norm and head.
struct LayerHooks {
  std::function<void(int layer)> before_forward;
  std::function<void(int layer)> before_backward;
  std::function<void(int layer)> after_backward;  // the unit's gradients are final for this micro-batch
  // Around the recomputation that opens a layer's backward (after before_backward), when the mode has one.
  std::function<void(int layer)> before_recompute;
  std::function<void(int layer)> after_recompute;
  // After each tensor-parallel collective (blocking, so all of it exposed): what, its interval on the host
  // steady clock (seconds since its epoch), and the bytes of its buffer.
  std::function<void(const char* what, double start, double end, std::size_t bytes)> tensor_parallel_comm;
  // After each op of a layer's forward pass (not recomputations): its time, for placing recomputation.
  std::function<void(int layer, LayerOp op, double seconds)> forward_op;
};

// With a tensor-parallel group of T ranks (Megatron-LM's scheme), each rank holds its TensorShard and the
// ranks of the group run the same rows: the column-parallel GEMMs (QKV, MLP up) need no communication in
// forward and allreduce their input gradient in backward; the row-parallel ones (attention output, MLP down)
// allreduce their output in forward, adding the bias after; the token lookup is vocabulary-parallel (each rank
// its rows, then an allreduce); the LM head computes the rank's slice of the logits and the cross-entropy
// allreduces three numbers per row (max, sum of exponentials, target logit). Every rank sees the same loss and
// the same residual stream. The allreduces are blocking (the group's library algorithm).
class GptCpu {
 public:
  // Throws std::invalid_argument when the model is invalid, seq exceeds its position table, the tensor-parallel
  // group's size does not divide the model (tensor_shard), or the stage is empty or outside the model.
  // sequence_parallel (with a tensor-parallel group; Megatron-LM's sequence parallelism): the layer norms and
  // residual adds run on N / T of the micro-batch's N rows (tokens) on each rank; the allreduce after a
  // row-parallel GEMM becomes a reduce-scatter onto the rank's rows, and a layer norm's output is allgathered
  // before the column-parallel GEMM that reads it (in backward the mirror: an allgather of the gradient before
  // a row-parallel GEMM, a reduce-scatter of the column-parallel one's input gradient). The layer norms'
  // gradients then come from each rank's rows and are summed over the group. N must divide by T.
  // stage: the pipeline stage this model runs (the whole model by default).
  GptCpu(const ModelConfig& model, int batch, int seq, CpuRuntime runtime, Recompute recompute = Recompute::none,
         coll::Group* tensor_parallel = nullptr, bool sequence_parallel = false, StagePlan stage = {});
  bool sequence_parallel() const { return sp_; }

  const ModelConfig& model() const { return model_; }
  const ParameterLayout& layout() const { return layout_; }
  const TensorShard& shard() const { return layout_.shard(); }
  int batch() const { return batch_; }
  int seq() const { return seq_; }
  Recompute recompute() const { return recompute_; }
  const StagePlan& stage() const { return stage_; }
  int first_layer() const { return stage_.first_layer; }
  int end_layer() const { return stage_.first_layer + stage_.layers; }
  bool kept(int layer, LayerOp op) const;
  std::size_t rows_here() const { return rows_here_; }  // rows of the residual stream on this rank (R)
  std::size_t activation_floats() const { return activations_.size(); }  // kept for the backward pass
  std::size_t workspace_floats() const { return scratch_.size(); }     // gradients of activations, reused per layer

  // tokens, targets (B, T): tokens on the first stage (the lookup), targets on the last (the loss); either may
  // be null elsewhere. A stage without the embeddings reads its input (R, C) from stage_input(set), which the
  // caller fills first. `set` (< activation_sets) holds this micro-batch's activations until its backward.
  // Returns the summed loss of the rows whose target counts (target >= 0) on the last stage, 0 elsewhere; the
  // caller divides by the tokens of the whole (global) batch, the normaliser it then passes to backward.
  double forward(int set, const UnitPointers& units, const int32_t* tokens, const int32_t* targets,
                 const LayerHooks& hooks = {});
  float* stage_input(int set);               // (R, C): the first layer's input, on stages without the embeddings
  const float* stage_output(int set) const;  // (R, C): the last layer's output, on stages without the head
  // grads += d(sum of losses / normaliser) / d(params) for every unit with a gradient buffer, for the micro-batch
  // of set `set`. A stage without the head starts from output_grad (R, C), the gradient of its output. With
  // input_grad the pass goes down to the stage's first layer and leaves the gradient of its input in
  // input_grad() (R, C), valid until the next backward; without it, the pass stops at the lowest unit with a
  // gradient buffer.
  void backward(int set, const UnitPointers& units, float normaliser, const float* output_grad, bool input_grad,
                const LayerHooks& hooks = {});
  const float* input_grad() const;
  // Recompute::overlap: computes op of layer again into the layer's recompute space for the micro-batch of set
  // `set`, ahead of that micro-batch's backward (which then uses it). The op's producers must be kept or
  // recomputed already; std::logic_error otherwise.
  void recompute(int set, int layer, LayerOp op, const UnitPointers& units, const LayerHooks& hooks = {});

  // The whole model (or stage) on one micro-batch, activation set 0: tokens, targets (B, T).
  double forward(const UnitPointers& units, const int32_t* tokens, const int32_t* targets, const LayerHooks& hooks = {});
  void backward(const UnitPointers& units, float normaliser, const LayerHooks& hooks = {});
  // The same on one flat parameter and gradient buffer.
  double forward(const float* params, const int32_t* tokens, const int32_t* targets, const LayerHooks& hooks = {});
  void backward(const float* params, float* grads, float normaliser, const LayerHooks& hooks = {});

 private:
  // One layer's activations: where each lives (the micro-batch's set, the layer's recompute space, or the space
  // shared by the layer being computed or recomputed, as the mode has it).
  struct LayerView {
    float *x_in, *ln1, *ln1_mean, *ln1_rstd, *qkv, *q, *k, *v, *atty, *lse, *att_merged, *attproj, *x_mid, *ln2,
        *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj;
  };
  LayerView view(int set, int l);
  float* act(std::size_t offset) { return activations_.data() + offset; }
  const float* act(std::size_t offset) const { return activations_.data() + offset; }
  float* head_base(int set);
  // One op of layer l's forward for the micro-batch of `set`, into wherever the op's outputs live.
  void forward_op(int set, int l, const UnitPointers& u, LayerOp op);
  // The ops of layer l not kept and not yet recomputed for `set`, computed again before its backward.
  void recompute_on_demand(int set, int l, const UnitPointers& u, const LayerHooks& hooks);
  // Tensor t of layer l in the unit buffers (unit l + 1).
  const float* param(const UnitPointers& u, int l, LayerTensor t) const;
  float* grad(const UnitPointers& u, int l, LayerTensor t) const;
  // The passes' blocks, in the order forward and backward call them.
  void embedding_forward(int set, const UnitPointers& u, const int32_t* tokens);
  void layer_forward(int set, int l, const UnitPointers& u, const LayerHooks& hooks);
  double head_forward(int set, const UnitPointers& u, const int32_t* targets);
  void head_backward(int set, const UnitPointers& u, float normaliser);
  void layer_backward(int set, int l, const UnitPointers& u);
  void mlp_backward(int l, const UnitPointers& u, const LayerView& x);
  void attention_backward(int l, const UnitPointers& u, const LayerView& x, float* d_residual);
  void embedding_backward(int set, const UnitPointers& u);
  // A layer norm's backward: the gradient of its input (accumulated into dinp), weight and bias.
  struct NormGrads {
    float *dinp, *dweight, *dbias;
    const float *inp, *weight, *mean, *rstd;
  };
  void norm_backward(const NormGrads& norm, const char* what);
  void sum_input_gradient(const char* allreduce, const char* reduce_scatter);
  float* discarded_norm_grads();
  // Tensor parallelism: the group's sum of a partial (N, C) result, in place; nothing without a group.
  void tp_allreduce(float* data, std::size_t count, const char* what, coll::RedOp op = coll::RedOp::sum);
  // Sequence parallelism: (N, width) partial sums -> my rows summed over the group, in place at my rows; and
  // my rows -> (N, width) gathered, in place.
  void tp_reduce_scatter(float* full, std::size_t width, const char* what);
  void tp_allgather(float* full, std::size_t width, const char* what);
  float* my_rows(float* full, std::size_t width) const { return full + row_begin_ * width; }
  // Sequence parallelism: my rows of a gradient of the residual stream (R, C), gathered into `full` (N, C).
  float* gathered(const float* mine, float* full, const char* what);
  // Every kernel call of a pass goes through one of these: it runs, or under a tracer it is recorded (its shape, or
  // the elements it reads and writes) and nothing is computed.
  template <typename Run>
  void compute(const char* what, double elements, const Run& run) const;
  void linear_forward(const char* what, const linear::Dims& d, float* y, const float* x, const float* w, const float* b) const;
  void linear_backward_input(const char* what, const linear::Dims& d, float* dx, const float* dy, const float* w, bool accumulate) const;
  void linear_backward_weight(const char* what, const linear::Dims& d, float* dw, float* db, const float* dy, const float* x,
                              bool accumulate) const;
  void attention_pass(const char* what, bool backward, const LayerView& x, float* d_out, float* dq, float* dk, float* dv) const;
  // Waits for a tensor-parallel collective (a traced one completes when told).
  void finish(coll::Work& work) const;
  const LayerHooks* hooks_ = nullptr;  // of the pass running, for tp_allreduce's report
  bool timing_tensor_parallel() const { return hooks_ && hooks_->tensor_parallel_comm; }
  bool tensor_parallel() const { return tp_ != nullptr; }
  int local(int l) const { return l - stage_.first_layer; }  // index of layer l within the stage

  ModelConfig model_;
  coll::Group* tp_;
  bool sp_;
  std::size_t rows_here_ = 0, row_begin_ = 0;  // rows of the residual stream held here, and the first of them
  ParameterLayout layout_;
  int batch_, seq_;
  CpuRuntime runtime_;
  layers::CpuOptions cpu_;
  attention::CpuOptions attention_options_;
  attention::Shape attention_shape_;
  Recompute recompute_;
  StagePlan stage_;
  // Activations: per set, each layer's kept ones and then the head's or the stage's output; after the sets, the
  // shared layer space and the layers' recompute spaces.
  TrackedBuffer<float> activations_;
  TrackedBuffer<float> scratch_;  // gradients of activations, reused by every layer (workspace)
  enum class Region { set, shared, recompute };
  struct Place {
    Region region = Region::set;
    std::size_t offset = 0;  // from the layer's base in its region
  };
  std::vector<std::vector<Place>> place_;  // per stage layer, per activation
  std::vector<KeptOps> kept_;              // per stage layer
  std::vector<std::size_t> layer_in_set_;  // per stage layer: its kept activations' offset within a set
  std::vector<std::size_t> layer_recompute_;  // per stage layer: its recompute space, from the activations' start
  std::size_t set_stride_ = 0, head_in_set_ = 0, shared_base_ = 0;
  // Per stage layer and op: 1 + the set whose micro-batch the recompute space holds, 0 when it holds none.
  std::vector<std::array<int, kLayerOps>> recomputed_for_;
  std::vector<std::vector<int32_t>> tokens_, targets_;  // per set
};

}  // namespace strata::train
