// Implementation of the GPT model on one GPU and its single-GPU step (see gpt_cuda.h). The passes read as
// GptCpu's do (gpt.cpp), line for line, with the kernels of layers_cuda.h, linear_cuda.h and attention_cuda.h.
#include "train/gpt_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/error.h"
#include "kernels/layers_cuda.h"
#include "kernels/layers_launch.h"
#include "train/gpt_cuda_kernels.h"

namespace strata::train {

namespace {

using layers::BFloat16;
namespace kgpu = layers::gpu;
constexpr linear::gpu::DType kBf16 = linear::gpu::DType::bf16;

template <class T>
T* at(unsigned char* base, std::size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

void call(const std::function<void(int)>& hook, int layer) {
  if (hook) hook(layer);
}

// The device cannot throw: token ids are checked where they are loaded, as layers_cuda.h asks.
void check_tokens(const int32_t* tokens, const int32_t* targets, std::size_t n, int vocab) {
  for (std::size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab)
      throw std::invalid_argument("token " + std::to_string(tokens[i]) + " at " + std::to_string(i) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    if (targets[i] >= vocab)
      throw std::invalid_argument("target " + std::to_string(targets[i]) + " at " + std::to_string(i) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
}

// The shape, refused before any layout is computed from it.
const ModelConfig& checked(const ModelConfig& model, int batch, int seq, attention::gpu::Impl impl) {
  if (std::string problem = validate_gpu(model, batch, seq, impl); !problem.empty()) throw std::invalid_argument(problem);
  return model;
}

}  // namespace

// ---- model -------------------------------------------------------------------------------------------------

GptCuda::GptCuda(const ModelConfig& model, int batch, int seq, Stream stream, attention::gpu::Impl attention)
    : model_(checked(model, batch, seq, attention)),
      layout_(model),
      batch_(batch),
      seq_(seq),
      stream_(stream),
      impl_(attention),
      layer_(model, static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq)),
      head_(model, static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq)),
      scratch_layout_(model, batch, seq, attention) {
  const std::size_t N = static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq);
  linear_ = std::make_unique<linear::gpu::PlanCache>();
  attention_ = std::make_unique<attention::gpu::Plan>(attention_shape(model, batch, seq), attention::gpu::DType::bf16,
                                                      attention);
  activations_ = DeviceBuffer<unsigned char>(
      MemoryCategory::activations, static_cast<std::size_t>(model.layers) * layer_.list.size() + head_.list.size());
  scratch_ = DeviceBuffer<unsigned char>(MemoryCategory::workspace, scratch_layout_.list.size());
  tokens_ = DeviceBuffer<int32_t>(MemoryCategory::activations, N);
  targets_ = DeviceBuffer<int32_t>(MemoryCategory::activations, N);
}

GptCuda::~GptCuda() = default;

const BFloat16* GptCuda::param(const DeviceUnitPointers& u, int l, LayerTensor t) const {
  return u.params[static_cast<std::size_t>(l) + 1] + (layout_.tensor(l, t).offset - layout_.layer(l).offset);
}

float* GptCuda::grad(const DeviceUnitPointers& u, int l, LayerTensor t) const {
  float* unit = u.grads[static_cast<std::size_t>(l) + 1];
  return unit ? unit + (layout_.tensor(l, t).offset - layout_.layer(l).offset) : nullptr;
}

void GptCuda::attention_forward(int l, const DeviceUnitPointers& u) {
  const ModelConfig& m = model_;
  const GpuLayerActs& a = layer_;
  unsigned char* x = layer_base(l);
  const int64_t N = static_cast<int64_t>(batch_) * seq_;
  using T = LayerTensor;
  // (N, C) -> (N, Q): the three projections at once.
  linear_->forward({N, m.hidden, m.qkv_channels()}, kBf16, at<BFloat16>(x, a.qkv), at<BFloat16>(x, a.ln1),
                   param(u, l, T::qkv_w), param(u, l, T::qkv_b), stream_);
  gpu::permute_qkv(at<BFloat16>(x, a.qkv), at<BFloat16>(x, a.q), at<BFloat16>(x, a.k), at<BFloat16>(x, a.v), batch_,
                   seq_, m.heads, m.kv_heads, m.head_dim(), true, stream_);
  attention_->forward({at<BFloat16>(x, a.q), at<BFloat16>(x, a.k), at<BFloat16>(x, a.v), at<BFloat16>(x, a.atty),
                       at<float>(x, a.lse)},
                      {scratch_.data() + scratch_layout_.attention, scratch_layout_.attention_bytes}, stream_);
  gpu::permute_heads(at<BFloat16>(x, a.atty), at<BFloat16>(x, a.att_merged), batch_, seq_, m.heads, m.head_dim(), true,
                     stream_);
  linear_->forward({N, m.hidden, m.hidden}, kBf16, at<BFloat16>(x, a.attproj), at<BFloat16>(x, a.att_merged),
                   param(u, l, T::attn_proj_w), param(u, l, T::attn_proj_b), stream_);
}

void GptCuda::forward(const DeviceUnitPointers& u, const int32_t* tokens, const int32_t* targets, const LayerHooks& hooks) {
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_;
  check_tokens(tokens, targets, N, model_.vocab);
  // From pageable memory the copy is staged before the call returns, so the caller may reuse its arrays.
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(tokens_.data(), tokens, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(targets_.data(), targets, N * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  // Each unit's pointer is read after its hook, which may have just gathered it.
  call(hooks.before_forward, -1);
  embedding_forward(u);
  for (int l = 0; l < model_.layers; ++l) {
    call(hooks.before_forward, l);
    layer_forward(l, u);
  }
  call(hooks.before_forward, model_.layers);
  head_forward(u);
}

BFloat16* GptCuda::layer_input(int l) {
  return l < model_.layers ? at<BFloat16>(layer_base(l), layer_.x_in) : at<BFloat16>(head_base(), head_.x_final);
}

// The token and position tables' rows into the first layer's input (N, C) (the head's, in a model of no layers).
void GptCuda::embedding_forward(const DeviceUnitPointers& u) {
  const std::size_t C = static_cast<std::size_t>(model_.hidden), V = static_cast<std::size_t>(model_.vocab);
  const BFloat16* wpe = u.params[0] + V * C;
  kgpu::embedding_forward(layer_input(0), tokens_.data(), u.params[0], wpe, static_cast<std::size_t>(batch_),
                          static_cast<std::size_t>(seq_), C, V, stream_);
}

// Pre-LN block: x_mid = x_in + attention(ln1(x_in)); out = x_mid + fcproj(gelu(fc(ln2(x_mid)))), out the next
// layer's input.
void GptCuda::layer_forward(int l, const DeviceUnitPointers& u) {
  const ModelConfig& m = model_;
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(m.hidden);
  const std::size_t F = static_cast<std::size_t>(m.mlp());
  const int64_t rows = static_cast<int64_t>(N);
  const GpuLayerActs& a = layer_;
  unsigned char* x = layer_base(l);
  using T = LayerTensor;
  kgpu::layernorm_forward(at<BFloat16>(x, a.ln1), at<float>(x, a.ln1_mean), at<float>(x, a.ln1_rstd),
                          at<BFloat16>(x, a.x_in), param(u, l, T::ln1_w), param(u, l, T::ln1_b), N, C, stream_);
  attention_forward(l, u);
  kgpu::residual_forward(at<BFloat16>(x, a.x_mid), at<BFloat16>(x, a.x_in), at<BFloat16>(x, a.attproj), N * C, stream_);
  kgpu::layernorm_forward(at<BFloat16>(x, a.ln2), at<float>(x, a.ln2_mean), at<float>(x, a.ln2_rstd),
                          at<BFloat16>(x, a.x_mid), param(u, l, T::ln2_w), param(u, l, T::ln2_b), N, C, stream_);
  linear_->forward({rows, m.hidden, m.mlp()}, kBf16, at<BFloat16>(x, a.fch), at<BFloat16>(x, a.ln2), param(u, l, T::fc_w),
                   param(u, l, T::fc_b), stream_);
  kgpu::gelu_forward(at<BFloat16>(x, a.fch_gelu), at<BFloat16>(x, a.fch), N * F, stream_);
  linear_->forward({rows, m.mlp(), m.hidden}, kBf16, at<BFloat16>(x, a.fcproj), at<BFloat16>(x, a.fch_gelu),
                   param(u, l, T::fc_proj_w), param(u, l, T::fc_proj_b), stream_);
  kgpu::residual_forward(layer_input(l + 1), at<BFloat16>(x, a.x_mid), at<BFloat16>(x, a.fcproj), N * C, stream_);
}

// The final norm, the LM head and the loss: the summed loss of the counted rows stays on the device.
void GptCuda::head_forward(const DeviceUnitPointers& u) {
  const ModelConfig& m = model_;
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(m.hidden);
  const std::size_t V = static_cast<std::size_t>(m.vocab);
  const GpuHeadActs& h = head_;
  unsigned char* head = head_base();
  const BFloat16* lnf = u.params[static_cast<std::size_t>(m.layers) + 1];
  const BFloat16* wte = u.params[0];
  kgpu::layernorm_forward(at<BFloat16>(head, h.lnf), at<float>(head, h.lnf_mean), at<float>(head, h.lnf_rstd),
                          at<BFloat16>(head, h.x_final), lnf, lnf + C, N, C, stream_);
  // The LM head is the token table: logits (N, V) = lnf (N, C) wte (V, C)^T.
  linear_->forward({static_cast<int64_t>(N), m.hidden, m.vocab}, kBf16, at<BFloat16>(head, h.logits),
                   at<BFloat16>(head, h.lnf), wte, nullptr, stream_);
  const layers::VocabSlice slice = layers::whole_vocab(N, V);
  kgpu::softmax_cross_entropy<BFloat16>(at<float>(head, h.losses), nullptr, at<float>(head, h.row_stats),
                                        at<BFloat16>(head, h.logits), targets_.data(), 1.0f, slice, stream_);
  gpu::sum(at<double>(scratch_.data(), scratch_layout_.loss_sum), at<float>(head, h.losses), N, stream_);
}

double GptCuda::loss_sum() {
  double sum = 0.0;
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(&sum, scratch_.data() + scratch_layout_.loss_sum, sizeof sum,
                                           cudaMemcpyDeviceToHost, stream_));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return sum;
}

void GptCuda::attention_backward(int l, const DeviceUnitPointers& u, BFloat16* d_residual) {
  // d_residual (N, C) holds the gradient reaching the attention output projection; on return the gradient of
  // ln1's output is in the scratch d_ln. A frozen layer computes no weight gradients.
  const ModelConfig& m = model_;
  const GpuLayerActs& a = layer_;
  const GpuScratch& s = scratch_layout_;
  unsigned char* x = layer_base(l);
  unsigned char* g = scratch_.data();
  const int64_t rows = static_cast<int64_t>(batch_) * seq_;
  const bool trains = u.grads[static_cast<std::size_t>(l) + 1] != nullptr;
  const attention::gpu::Workspace workspace{g + s.attention, s.attention_bytes};
  using T = LayerTensor;
  if (trains)
    linear_->backward_weight({rows, m.hidden, m.hidden}, kBf16, grad(u, l, T::attn_proj_w), grad(u, l, T::attn_proj_b),
                             d_residual, at<BFloat16>(x, a.att_merged), true, stream_);
  linear_->backward_input({rows, m.hidden, m.hidden}, kBf16, at<BFloat16>(g, s.d_att_merged), d_residual,
                          param(u, l, T::attn_proj_w), false, stream_);
  gpu::permute_heads(at<BFloat16>(g, s.d_atty), at<BFloat16>(g, s.d_att_merged), batch_, seq_, m.heads, m.head_dim(),
                     false, stream_);
  // The unfused backward reads the probabilities of a forward on the same inputs from the workspace: run it again.
  if (impl_ == attention::gpu::Impl::unfused)
    attention_->forward({at<BFloat16>(x, a.q), at<BFloat16>(x, a.k), at<BFloat16>(x, a.v), at<BFloat16>(g, s.o_again),
                         at<float>(g, s.lse_again)},
                        workspace, stream_);
  attention_->backward({at<BFloat16>(x, a.q), at<BFloat16>(x, a.k), at<BFloat16>(x, a.v), at<BFloat16>(x, a.atty),
                        at<BFloat16>(g, s.d_atty), at<float>(x, a.lse), at<BFloat16>(g, s.dq), at<BFloat16>(g, s.dk),
                        at<BFloat16>(g, s.dv)},
                       workspace, stream_);
  gpu::permute_qkv(at<BFloat16>(g, s.d_qkv), at<BFloat16>(g, s.dq), at<BFloat16>(g, s.dk), at<BFloat16>(g, s.dv), batch_,
                   seq_, m.heads, m.kv_heads, m.head_dim(), false, stream_);
  if (trains)
    linear_->backward_weight({rows, m.hidden, m.qkv_channels()}, kBf16, grad(u, l, T::qkv_w), grad(u, l, T::qkv_b),
                             at<BFloat16>(g, s.d_qkv), at<BFloat16>(x, a.ln1), true, stream_);
  linear_->backward_input({rows, m.hidden, m.qkv_channels()}, kBf16, at<BFloat16>(g, s.d_ln), at<BFloat16>(g, s.d_qkv),
                          param(u, l, T::qkv_w), false, stream_);
}

void GptCuda::backward(const DeviceUnitPointers& u, float normaliser, const LayerHooks& hooks) {
  const ModelConfig& m = model_;
  const std::size_t last = static_cast<std::size_t>(m.layers) + 1;
  // Below the lowest trainable unit nothing needs a gradient: the pass stops there.
  int lowest = -1;  // the first unit with a gradient buffer
  for (std::size_t unit = 0; unit <= last && lowest < 0; ++unit)
    if (u.grads[unit]) lowest = static_cast<int>(unit);
  if (lowest < 0) return;  // nothing trains
  const int lowest_layer = lowest - 1;  // unit i is layer i - 1; -1: the embeddings train

  call(hooks.before_backward, m.layers);
  head_backward(u, normaliser);
  call(hooks.after_backward, m.layers);
  // The scratch d_x holds the gradient of the current layer's output; each layer turns it into its input's.
  for (int l = m.layers - 1; l >= std::max(lowest_layer, 0); --l) {
    call(hooks.before_backward, l);
    layer_backward(l, u);
    call(hooks.after_backward, l);
  }
  if (lowest_layer >= 0) return;  // the embeddings are frozen
  call(hooks.before_backward, -1);
  embedding_backward(u);
  call(hooks.after_backward, -1);
}

// dlogits in place of the logits, from the forward's row statistics, then through the LM head and the final norm
// into d_x (N, C), the last layer's output gradient.
void GptCuda::head_backward(const DeviceUnitPointers& u, float normaliser) {
  const ModelConfig& m = model_;
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(m.hidden);
  const std::size_t V = static_cast<std::size_t>(m.vocab);
  const GpuHeadActs& h = head_;
  const GpuScratch& s = scratch_layout_;
  unsigned char* head = head_base();
  unsigned char* g = scratch_.data();
  float* discard = at<float>(g, s.discard);  // 2C floats: layer-norm gradients of frozen units
  BFloat16* d_x = at<BFloat16>(g, s.d_x);
  BFloat16* d_ln = at<BFloat16>(g, s.d_ln);
  const int64_t rows = static_cast<int64_t>(N);
  const std::size_t last = static_cast<std::size_t>(m.layers) + 1;
  const BFloat16* wte = u.params[0];
  float* dwte = u.grads[0];
  const BFloat16* lnf = u.params[last];
  float* dlnf = u.grads[last];
  const layers::VocabSlice slice = layers::whole_vocab(N, V);
  BFloat16* logits = at<BFloat16>(head, h.logits);
  float* row_stats = at<float>(head, h.row_stats);
  kgpu::cross_entropy_loss_and_grad<BFloat16>(at<float>(head, h.losses), logits, logits, targets_.data(), row_stats,
                                              row_stats + N, row_stats + 2 * N, normaliser, slice, stream_);
  if (dwte)
    linear_->backward_weight({rows, m.hidden, m.vocab}, kBf16, dwte, nullptr, logits, at<BFloat16>(head, h.lnf), true,
                             stream_);
  linear_->backward_input({rows, m.hidden, m.vocab}, kBf16, d_ln, logits, wte, false, stream_);
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(d_x, 0, N * C * sizeof(BFloat16), stream_));
  kgpu::layernorm_backward(d_x, dlnf ? dlnf : discard, dlnf ? dlnf + C : discard + C, d_ln, at<BFloat16>(head, h.x_final),
                           lnf, at<float>(head, h.lnf_mean), at<float>(head, h.lnf_rstd), N, C,
                           at<float>(g, s.ln_partials), stream_);
}

// d_x (N, C), the gradient of layer l's output, becomes the gradient of its input: the MLP's branch, then the
// attention's, each with its layer norm and the residual that skips it.
void GptCuda::layer_backward(int l, const DeviceUnitPointers& u) {
  const ModelConfig& m = model_;
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(m.hidden);
  const GpuLayerActs& a = layer_;
  const GpuScratch& s = scratch_layout_;
  unsigned char* x = layer_base(l);
  unsigned char* g = scratch_.data();
  float* discard = at<float>(g, s.discard);
  float* ln_partials = at<float>(g, s.ln_partials);
  BFloat16* d_x = at<BFloat16>(g, s.d_x);
  BFloat16* d_mid = at<BFloat16>(g, s.d_mid);
  BFloat16* d_ln = at<BFloat16>(g, s.d_ln);
  const bool trains = u.grads[static_cast<std::size_t>(l) + 1] != nullptr;
  using T = LayerTensor;
  // out = x_mid + fcproj(gelu(fc(ln2(x_mid)))): the gradient of ln2's output into d_ln.
  mlp_backward(l, u);
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(d_mid, d_x, N * C * sizeof(BFloat16), cudaMemcpyDeviceToDevice, stream_));
  kgpu::layernorm_backward(d_mid, trains ? grad(u, l, T::ln2_w) : discard, trains ? grad(u, l, T::ln2_b) : discard + C,
                           d_ln, at<BFloat16>(x, a.x_mid), param(u, l, T::ln2_w), at<float>(x, a.ln2_mean),
                           at<float>(x, a.ln2_rstd), N, C, ln_partials, stream_);
  // x_mid = x_in + attproj(attention(ln1(x_in))).
  attention_backward(l, u, d_mid);
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(d_x, d_mid, N * C * sizeof(BFloat16), cudaMemcpyDeviceToDevice, stream_));
  kgpu::layernorm_backward(d_x, trains ? grad(u, l, T::ln1_w) : discard, trains ? grad(u, l, T::ln1_b) : discard + C,
                           d_ln, at<BFloat16>(x, a.x_in), param(u, l, T::ln1_w), at<float>(x, a.ln1_mean),
                           at<float>(x, a.ln1_rstd), N, C, ln_partials, stream_);
}

// d_x (N, C) reaching the MLP's output projection; on return the gradient of ln2's output is in d_ln. A frozen layer
// computes no weight gradients.
void GptCuda::mlp_backward(int l, const DeviceUnitPointers& u) {
  const ModelConfig& m = model_;
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, F = static_cast<std::size_t>(m.mlp());
  const int64_t rows = static_cast<int64_t>(N);
  const GpuLayerActs& a = layer_;
  const GpuScratch& s = scratch_layout_;
  unsigned char* x = layer_base(l);
  unsigned char* g = scratch_.data();
  BFloat16* d_x = at<BFloat16>(g, s.d_x);
  BFloat16* d_ln = at<BFloat16>(g, s.d_ln);
  const bool trains = u.grads[static_cast<std::size_t>(l) + 1] != nullptr;
  using T = LayerTensor;
  if (trains)
    linear_->backward_weight({rows, m.mlp(), m.hidden}, kBf16, grad(u, l, T::fc_proj_w), grad(u, l, T::fc_proj_b), d_x,
                             at<BFloat16>(x, a.fch_gelu), true, stream_);
  linear_->backward_input({rows, m.mlp(), m.hidden}, kBf16, at<BFloat16>(g, s.d_fch_gelu), d_x, param(u, l, T::fc_proj_w),
                          false, stream_);
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(g + s.d_fch, 0, N * F * sizeof(BFloat16), stream_));
  kgpu::gelu_backward(at<BFloat16>(g, s.d_fch), at<BFloat16>(x, a.fch), at<BFloat16>(g, s.d_fch_gelu), N * F, stream_);
  if (trains)
    linear_->backward_weight({rows, m.hidden, m.mlp()}, kBf16, grad(u, l, T::fc_w), grad(u, l, T::fc_b),
                             at<BFloat16>(g, s.d_fch), at<BFloat16>(x, a.ln2), true, stream_);
  linear_->backward_input({rows, m.hidden, m.mlp()}, kBf16, d_ln, at<BFloat16>(g, s.d_fch), param(u, l, T::fc_w), false,
                          stream_);
}

// d_x, the first layer's input gradient, into the token and position tables' rows.
void GptCuda::embedding_backward(const DeviceUnitPointers& u) {
  const std::size_t C = static_cast<std::size_t>(model_.hidden), V = static_cast<std::size_t>(model_.vocab);
  float* dwte = u.grads[0];
  kgpu::embedding_backward(dwte, dwte + V * C, at<BFloat16>(scratch_.data(), scratch_layout_.d_x), tokens_.data(),
                           static_cast<std::size_t>(batch_), static_cast<std::size_t>(seq_), C, stream_);
}

// ---- the single-GPU step -----------------------------------------------------------------------------------

GpuTrainer::GpuTrainer(GptCuda& model, const float* params, const GpuStepConfig& config)
    : model_(model), config_(config) {
  if (std::string problem = layers::validate(config.adamw); !problem.empty()) throw std::invalid_argument(problem);
  const ParameterLayout& layout = model.layout();
  const std::size_t n = layout.total();
  master_ = DeviceBuffer<float>(MemoryCategory::parameters, n);
  compute_ = DeviceBuffer<BFloat16>(MemoryCategory::parameters, n);
  grads_ = DeviceBuffer<float>(MemoryCategory::gradients, n);
  adam_m_ = DeviceBuffer<float>(MemoryCategory::optimizer, n);
  adam_v_ = DeviceBuffer<float>(MemoryCategory::optimizer, n);
  norm_ = DeviceBuffer<double>(MemoryCategory::workspace, 1 + layers::launch::squared_norm_workspace_doubles(n));
  const Stream stream = model.stream();
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(master_.data(), params, n * sizeof(float), cudaMemcpyHostToDevice, stream));
  // The compute copy unit by unit, as a data-parallel step casts each unit it gathered.
  for (const Slice& unit : layout.units())
    kgpu::cast_to_bf16(compute_.data() + unit.offset, master_.data() + unit.offset, unit.size, stream);
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(stream));
}

GpuTrainer::~GpuTrainer() = default;

DeviceUnitPointers GpuTrainer::units() { return DeviceUnitPointers::flat(model_.layout(), compute_.data(), grads_.data()); }

GpuStepStats GpuTrainer::step(long step, std::span<const int32_t> tokens, std::span<const int32_t> targets) {
  const std::size_t rows = static_cast<std::size_t>(model_.batch()) * static_cast<std::size_t>(model_.seq());
  if (tokens.empty() || tokens.size() % rows != 0 || targets.size() != tokens.size())
    throw std::invalid_argument("a step takes whole micro-batches of " + std::to_string(rows) +
                                " tokens and as many targets (got " + std::to_string(tokens.size()) + " and " +
                                std::to_string(targets.size()) + ")");
  const std::size_t counted = layers::counted_targets(targets.data(), targets.size());
  if (counted == 0) throw std::invalid_argument("no target of the step counts (every target is negative)");
  const float normaliser = static_cast<float>(counted);
  const Stream stream = model_.stream();
  const std::size_t n = grads_.size();
  const DeviceUnitPointers u = units();

  GpuStepStats stats;
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, n * sizeof(float), stream));
  for (std::size_t at = 0; at < tokens.size(); at += rows) {
    model_.forward(u, tokens.data() + at, targets.data() + at);
    model_.backward(u, normaliser);
    stats.loss += model_.loss_sum();  // waits while the backward runs, not before it is enqueued
  }
  stats.loss /= normaliser;

  kgpu::squared_norm(norm_.data(), grads_.data(), n, false, norm_.data() + 1, stream);
  double squares = 0.0;
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(&squares, norm_.data(), sizeof squares, cudaMemcpyDeviceToHost, stream));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(stream));
  stats.grad_norm = std::sqrt(squares);
  const float scale = layers::clip_scale(stats.grad_norm, config_.max_grad_norm);
  kgpu::adamw_update(master_.data(), compute_.data(), grads_.data(), adam_m_.data(), adam_v_.data(), n, config_.adamw, step,
                     scale, stream);
  return stats;
}

namespace {
std::vector<float> download(const float* device, std::size_t n, Stream stream) {
  std::vector<float> host(n);
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}
}  // namespace

std::vector<float> GpuTrainer::parameters() const { return download(master_.data(), master_.size(), model_.stream()); }
std::vector<float> GpuTrainer::gradients() const { return download(grads_.data(), grads_.size(), model_.stream()); }

}  // namespace strata::train
