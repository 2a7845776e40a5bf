// Implementation of the GPT model on the CPU (see gpt.h).
#include "train/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>

#include "kernels/linear.h"

namespace strata::train {

// ---- parameter layout ----------------------------------------------------------------------------------

ParameterLayout::ParameterLayout(const ModelConfig& model) : model_(model) {
  if (const std::string problem = model.validate(); !problem.empty()) throw std::invalid_argument(problem);
  const std::size_t C = static_cast<std::size_t>(model.hidden), Q = static_cast<std::size_t>(model.qkv_channels()),
                    F = static_cast<std::size_t>(model.mlp());
  std::size_t at = 0;
  auto take = [&](std::size_t n) { return Slice{std::exchange(at, at + n), n}; };
  wte_ = take(static_cast<std::size_t>(model.vocab) * C);
  wpe_ = take(static_cast<std::size_t>(model.max_seq) * C);
  first_layer_ = at;
  const std::size_t sizes[kLayerTensors] = {C, C, Q * C, Q, C * C, C, C, C, F * C, F, C * F, C};
  std::size_t within = 0;
  for (int t = 0; t < kLayerTensors; ++t) {
    tensor_offset_[t] = within;
    tensor_size_[t] = sizes[t];
    within += sizes[t];
  }
  per_layer_ = within;
  at += per_layer_ * static_cast<std::size_t>(model.layers);
  lnf_w_ = take(C);
  lnf_b_ = take(C);
  total_ = at;
}

Slice ParameterLayout::layer(int l) const { return {first_layer_ + static_cast<std::size_t>(l) * per_layer_, per_layer_}; }

Slice ParameterLayout::tensor(int l, LayerTensor t) const {
  const int i = static_cast<int>(t);
  return {layer(l).offset + tensor_offset_[i], tensor_size_[i]};
}

std::vector<Slice> ParameterLayout::units() const {
  std::vector<Slice> units{{0, first_layer_}};
  for (int l = 0; l < model_.layers; ++l) units.push_back(layer(l));
  units.push_back({lnf_w_.offset, total_ - lnf_w_.offset});
  return units;
}

void init_parameters(const ModelConfig& model, const ParameterLayout& layout, float* params, uint64_t seed, float std) {
  std::mt19937_64 random(seed);
  std::normal_distribution<float> normal(0.0f, std);
  std::normal_distribution<float> residual(0.0f, std / std::sqrt(2.0f * static_cast<float>(model.layers)));
  auto fill = [&](Slice s, auto&& value) {
    for (std::size_t i = s.offset; i < s.end(); ++i) params[i] = value();
  };
  auto constant = [](float c) { return [c] { return c; }; };
  fill(layout.wte(), [&] { return normal(random); });
  fill(layout.wpe(), [&] { return normal(random); });
  for (int l = 0; l < model.layers; ++l) {
    using T = LayerTensor;
    fill(layout.tensor(l, T::ln1_w), constant(1.0f));
    fill(layout.tensor(l, T::ln1_b), constant(0.0f));
    fill(layout.tensor(l, T::qkv_w), [&] { return normal(random); });
    fill(layout.tensor(l, T::qkv_b), constant(0.0f));
    fill(layout.tensor(l, T::attn_proj_w), [&] { return residual(random); });
    fill(layout.tensor(l, T::attn_proj_b), constant(0.0f));
    fill(layout.tensor(l, T::ln2_w), constant(1.0f));
    fill(layout.tensor(l, T::ln2_b), constant(0.0f));
    fill(layout.tensor(l, T::fc_w), [&] { return normal(random); });
    fill(layout.tensor(l, T::fc_b), constant(0.0f));
    fill(layout.tensor(l, T::fc_proj_w), [&] { return residual(random); });
    fill(layout.tensor(l, T::fc_proj_b), constant(0.0f));
  }
  fill(layout.lnf_w(), constant(1.0f));
  fill(layout.lnf_b(), constant(0.0f));
}

// ---- activations -------------------------------------------------------------------------------------------

namespace {

// One layer's activations, in buffer order (LayerView's), and their sizes in floats.
struct Activation {
  enum Index : int { x_in, ln1, ln1_mean, ln1_rstd, qkv, q, k, v, atty, lse, att_merged, attproj, x_mid, ln2,
                     ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, count };
};

std::vector<std::size_t> layer_activation_sizes(std::size_t N, std::size_t C, std::size_t Q, std::size_t KV,
                                                std::size_t F, std::size_t heads) {
  return {N * C, N * C, N, N, N * Q, N * C, N * KV, N * KV, N * C, N * heads,
          N * C, N * C, N * C, N * C, N, N, N * F, N * F, N * C};
}

// Whether the forward pass keeps an activation of every layer for the backward pass (else it lives in the
// space of the one layer being computed, and backward computes it again).
bool kept(Recompute recompute, int activation) {
  using A = Activation;
  switch (recompute) {
    case Recompute::none: return true;
    case Recompute::full: return activation == A::x_in;
    case Recompute::selective:
      return activation != A::q && activation != A::k && activation != A::v && activation != A::atty && activation != A::lse;
  }
  return true;
}

}  // namespace

const char* name(Recompute recompute) {
  switch (recompute) {
    case Recompute::none: return "none";
    case Recompute::full: return "full";
    case Recompute::selective: return "selective";
  }
  return "?";
}

std::optional<Recompute> parse_recompute(std::string_view text) {
  for (Recompute r : {Recompute::none, Recompute::full, Recompute::selective})
    if (text == name(r)) return r;
  return std::nullopt;
}

GptCpu::LayerView GptCpu::view(int l) {
  float* own = act(layer_base_[static_cast<std::size_t>(l)]);
  float* shared = act(shared_base_);
  auto at = [&](int a) { return (kept_[static_cast<std::size_t>(a)] ? own : shared) + offset_[static_cast<std::size_t>(a)]; };
  using A = Activation;
  return {at(A::x_in), at(A::ln1), at(A::ln1_mean), at(A::ln1_rstd), at(A::qkv), at(A::q), at(A::k), at(A::v),
          at(A::atty), at(A::lse), at(A::att_merged), at(A::attproj), at(A::x_mid), at(A::ln2), at(A::ln2_mean),
          at(A::ln2_rstd), at(A::fch), at(A::fch_gelu), at(A::fcproj)};
}

namespace {

// The head's saved activations, from its base: the last layer's output, the final norm, logits, losses.
struct HeadActs {
  std::size_t x_final, lnf, lnf_mean, lnf_rstd, logits, losses, row_stats, size;
  HeadActs(std::size_t N, std::size_t C, std::size_t V) {
    std::size_t at = 0;
    auto take = [&](std::size_t n) { return std::exchange(at, at + n); };
    x_final = take(N * C), lnf = take(N * C), lnf_mean = take(N), lnf_rstd = take(N), logits = take(N * V);
    losses = take(N), row_stats = take(3 * N);
    size = at;
  }
};

// Gradients of activations, one set shared by every layer (offsets from the scratch base).
struct Scratch {
  std::size_t d_x, d_mid, d_ln, d_fch_gelu, d_fch, d_att_merged, d_atty, dq, dk, dv, d_qkv, size;
  Scratch(std::size_t N, std::size_t C, std::size_t Q, std::size_t KV, std::size_t F) {
    std::size_t at = 0;
    auto take = [&](std::size_t n) { return std::exchange(at, at + n); };
    d_x = take(N * C), d_mid = take(N * C), d_ln = take(N * C), d_fch_gelu = take(N * F), d_fch = take(N * F);
    d_att_merged = take(N * C), d_atty = take(N * C), dq = take(N * C), dk = take(N * KV), dv = take(N * KV);
    d_qkv = take(N * Q);
    size = at;
  }
};

// qkv (B, T, (NH + 2 KVH) D) <-> q (B, NH, T, D), k and v (B, KVH, T, D). `to_heads` copies from qkv to the
// per-head tensors; otherwise back.
void permute_qkv(float* qkv, float* q, float* k, float* v, int B, int T, int NH, int KVH, int D, bool to_heads) {
  const std::size_t Q = static_cast<std::size_t>((NH + 2 * KVH) * D), C = static_cast<std::size_t>(NH * D),
                    KV = static_cast<std::size_t>(KVH * D);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      float* row = qkv + (static_cast<std::size_t>(b) * T + t) * Q;
      for (int h = 0; h < NH; ++h) {
        float* head = q + ((static_cast<std::size_t>(b) * NH + h) * T + t) * D;
        to_heads ? std::memcpy(head, row + h * D, D * sizeof(float)) : std::memcpy(row + h * D, head, D * sizeof(float));
      }
      for (int g = 0; g < KVH; ++g) {
        float* kh = k + ((static_cast<std::size_t>(b) * KVH + g) * T + t) * D;
        float* vh = v + ((static_cast<std::size_t>(b) * KVH + g) * T + t) * D;
        float* krow = row + C + static_cast<std::size_t>(g) * D;
        float* vrow = row + C + KV + static_cast<std::size_t>(g) * D;
        if (to_heads) {
          std::memcpy(kh, krow, D * sizeof(float)), std::memcpy(vh, vrow, D * sizeof(float));
        } else {
          std::memcpy(krow, kh, D * sizeof(float)), std::memcpy(vrow, vh, D * sizeof(float));
        }
      }
    }
}

// heads (B, NH, T, D) <-> merged (B, T, NH * D).
void permute_heads(float* heads, float* merged, int B, int T, int NH, int D, bool to_merged) {
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        float* head = heads + ((static_cast<std::size_t>(b) * NH + h) * T + t) * D;
        float* row = merged + (static_cast<std::size_t>(b) * T + t) * NH * D + static_cast<std::size_t>(h) * D;
        to_merged ? std::memcpy(row, head, D * sizeof(float)) : std::memcpy(head, row, D * sizeof(float));
      }
}

void call(const std::function<void(int)>& hook, int layer) {
  if (hook) hook(layer);
}

}  // namespace

GptCpu::GptCpu(const ModelConfig& model, int batch, int seq, CpuRuntime runtime, Recompute recompute)
    : model_(model), layout_(model), batch_(batch), seq_(seq), runtime_(runtime), recompute_(recompute) {
  if (batch <= 0 || seq <= 0) throw std::invalid_argument("batch and sequence must be positive");
  if (seq > model.max_seq)
    throw std::invalid_argument("sequence " + std::to_string(seq) + " exceeds the model's position table (" +
                                std::to_string(model.max_seq) + ")");
  cpu_.threads = runtime.threads;
  attention_options_.threads = runtime.threads;
  attention_shape_ = {batch, model.heads, model.kv_heads, seq, seq, model.head_dim(), true};
  if (std::string problem = attention::validate(attention_shape_); !problem.empty()) throw std::invalid_argument(problem);
  const std::size_t N = static_cast<std::size_t>(batch) * seq, C = static_cast<std::size_t>(model.hidden),
                    Q = static_cast<std::size_t>(model.qkv_channels()),
                    KV = static_cast<std::size_t>(model.kv_heads * model.head_dim()), F = static_cast<std::size_t>(model.mlp());
  const std::vector<std::size_t> sizes = layer_activation_sizes(N, C, Q, KV, F, static_cast<std::size_t>(model.heads));
  std::size_t shared = 0;
  for (int a = 0; a < Activation::count; ++a) {
    kept_.push_back(kept(recompute, a));
    offset_.push_back(std::exchange(kept_.back() ? per_layer_ : shared, (kept_.back() ? per_layer_ : shared) + sizes[static_cast<std::size_t>(a)]));
  }
  for (int l = 0; l < model.layers; ++l) layer_base_.push_back(static_cast<std::size_t>(l) * per_layer_);
  shared_base_ = static_cast<std::size_t>(model.layers) * per_layer_;
  head_base_ = shared_base_ + shared;
  activations_ = TrackedBuffer<float>(MemoryCategory::activations, head_base_ + HeadActs(N, C, static_cast<std::size_t>(model.vocab)).size);
  // Frozen units' layer-norm gradients land in a region after the scratch and are never read.
  scratch_ = TrackedBuffer<float>(MemoryCategory::workspace, Scratch(N, C, Q, KV, F).size + 2 * C);
}

float* UnitPointers::pending() {
  static float never_written;
  return &never_written;
}

UnitPointers UnitPointers::flat(const ParameterLayout& layout, const float* params, float* grads) {
  UnitPointers u;
  for (const Slice& unit : layout.units()) {
    u.params.push_back(params + unit.offset);
    u.grads.push_back(grads ? grads + unit.offset : nullptr);
  }
  return u;
}

const float* GptCpu::param(const UnitPointers& u, int l, LayerTensor t) const {
  return u.params[static_cast<std::size_t>(l) + 1] + (layout_.tensor(l, t).offset - layout_.layer(l).offset);
}

float* GptCpu::grad(const UnitPointers& u, int l, LayerTensor t) const {
  float* unit = u.grads[static_cast<std::size_t>(l) + 1];
  return unit ? unit + (layout_.tensor(l, t).offset - layout_.layer(l).offset) : nullptr;
}

void GptCpu::attention_core_forward(const LayerView& x) {
  const ModelConfig& m = model_;
  permute_qkv(x.qkv, x.q, x.k, x.v, batch_, seq_, m.heads, m.kv_heads, m.head_dim(), true);
  attention::flash_forward(attention_shape_, x.q, x.k, x.v, x.atty, x.lse, attention_options_);
}

void GptCpu::attention_forward(int l, const UnitPointers& u, const LayerView& x) {
  const ModelConfig& m = model_;
  const int64_t N = static_cast<int64_t>(batch_) * seq_;
  using T = LayerTensor;
  // (N, C) -> (N, Q): the three projections at once.
  linear::forward(runtime_.library, {N, m.hidden, m.qkv_channels()}, x.qkv, x.ln1, param(u, l, T::qkv_w), param(u, l, T::qkv_b));
  attention_core_forward(x);
  permute_heads(x.atty, x.att_merged, batch_, seq_, m.heads, m.head_dim(), true);
  linear::forward(runtime_.library, {N, m.hidden, m.hidden}, x.attproj, x.att_merged, param(u, l, T::attn_proj_w),
                  param(u, l, T::attn_proj_b));
}

void GptCpu::layer_forward(int l, const UnitPointers& u, bool write_output) {
  const ModelConfig& m = model_;
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(m.hidden);
  const std::size_t F = static_cast<std::size_t>(m.mlp());
  const int64_t rows = static_cast<int64_t>(N);
  using T = LayerTensor;
  const LayerView x = view(l);
  layers::layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, x.x_in, param(u, l, T::ln1_w), param(u, l, T::ln1_b), N, C, cpu_);
  attention_forward(l, u, x);
  layers::residual_forward(x.x_mid, x.x_in, x.attproj, N * C, cpu_);
  layers::layernorm_forward(x.ln2, x.ln2_mean, x.ln2_rstd, x.x_mid, param(u, l, T::ln2_w), param(u, l, T::ln2_b), N, C, cpu_);
  linear::forward(runtime_.library, {rows, m.hidden, m.mlp()}, x.fch, x.ln2, param(u, l, T::fc_w), param(u, l, T::fc_b));
  layers::gelu_forward(x.fch_gelu, x.fch, N * F, cpu_);
  linear::forward(runtime_.library, {rows, m.mlp(), m.hidden}, x.fcproj, x.fch_gelu, param(u, l, T::fc_proj_w),
                  param(u, l, T::fc_proj_b));
  if (!write_output) return;
  float* out = l + 1 < m.layers ? view(l + 1).x_in : act(head_base_) + HeadActs(N, C, static_cast<std::size_t>(m.vocab)).x_final;
  layers::residual_forward(out, x.x_mid, x.fcproj, N * C, cpu_);
}

double GptCpu::forward(const float* params, const int32_t* tokens, const int32_t* targets, const LayerHooks& hooks) {
  return forward(UnitPointers::flat(layout_, params, nullptr), tokens, targets, hooks);
}

void GptCpu::backward(const float* params, float* grads, float normaliser, const LayerHooks& hooks) {
  backward(UnitPointers::flat(layout_, params, grads), normaliser, hooks);
}

double GptCpu::forward(const UnitPointers& u, const int32_t* tokens, const int32_t* targets, const LayerHooks& hooks) {
  const ModelConfig& m = model_;
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(m.hidden);
  const std::size_t V = static_cast<std::size_t>(m.vocab);
  tokens_.assign(tokens, tokens + N);
  targets_.assign(targets, targets + N);
  const HeadActs h(N, C, V);
  float* head = act(head_base_);

  // Each unit's pointer is read after its hook, which may have just gathered it.
  call(hooks.before_forward, -1);
  const float* wpe = u.params[0] + V * C;
  float* first_input = m.layers > 0 ? view(0).x_in : head + h.x_final;
  layers::embedding_forward(first_input, tokens, u.params[0], wpe, static_cast<std::size_t>(batch_),
                            static_cast<std::size_t>(seq_), C, V, cpu_);
  const int64_t rows = static_cast<int64_t>(N);
  for (int l = 0; l < m.layers; ++l) {
    call(hooks.before_forward, l);
    layer_forward(l, u, true);
  }
  call(hooks.before_forward, m.layers);
  const float* lnf = u.params[static_cast<std::size_t>(m.layers) + 1];
  const float* wte = u.params[0];
  layers::layernorm_forward(head + h.lnf, head + h.lnf_mean, head + h.lnf_rstd, head + h.x_final, lnf, lnf + C, N, C, cpu_);
  // The LM head is the token table: logits (N, V) = lnf (N, C) wte (V, C)^T.
  linear::forward(runtime_.library, {rows, m.hidden, m.vocab}, head + h.logits, head + h.lnf, wte, nullptr);
  const layers::VocabSlice slice = layers::whole_vocab(N, V);
  return layers::softmax_cross_entropy(head + h.losses, nullptr, head + h.row_stats, head + h.logits, targets, 1.0f,
                                       slice, cpu_);
}

void GptCpu::attention_backward(int l, const UnitPointers& u, const LayerView& x, float* d_residual) {
  // d_residual (N, C) holds the gradient reaching the attention output projection; on return the gradient of
  // ln1's output is in the scratch d_ln. A frozen layer computes no weight gradients.
  const ModelConfig& m = model_;
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_;
  const Scratch s(N, m.hidden, m.qkv_channels(), m.kv_heads * m.head_dim(), m.mlp());
  float* g = scratch_.data();
  const int64_t rows = static_cast<int64_t>(N);
  const bool trains = u.grads[static_cast<std::size_t>(l) + 1] != nullptr;
  using T = LayerTensor;
  if (trains)
    linear::backward_weight(runtime_.library, {rows, m.hidden, m.hidden}, grad(u, l, T::attn_proj_w),
                            grad(u, l, T::attn_proj_b), d_residual, x.att_merged, true);
  linear::backward_input(runtime_.library, {rows, m.hidden, m.hidden}, g + s.d_att_merged, d_residual,
                         param(u, l, T::attn_proj_w), false);
  permute_heads(g + s.d_atty, g + s.d_att_merged, batch_, seq_, m.heads, m.head_dim(), false);
  attention::flash_backward(attention_shape_, x.q, x.k, x.v, x.atty, g + s.d_atty, x.lse, g + s.dq, g + s.dk, g + s.dv,
                            attention_options_);
  permute_qkv(g + s.d_qkv, g + s.dq, g + s.dk, g + s.dv, batch_, seq_, m.heads, m.kv_heads, m.head_dim(), false);
  if (trains)
    linear::backward_weight(runtime_.library, {rows, m.hidden, m.qkv_channels()}, grad(u, l, T::qkv_w), grad(u, l, T::qkv_b),
                            g + s.d_qkv, x.ln1, true);
  linear::backward_input(runtime_.library, {rows, m.hidden, m.qkv_channels()}, g + s.d_ln, g + s.d_qkv,
                         param(u, l, T::qkv_w), false);
}

void GptCpu::backward(const UnitPointers& u, float normaliser, const LayerHooks& hooks) {
  const ModelConfig& m = model_;
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(m.hidden);
  const std::size_t F = static_cast<std::size_t>(m.mlp()), V = static_cast<std::size_t>(m.vocab);
  const HeadActs h(N, C, V);
  const Scratch s(N, C, m.qkv_channels(), m.kv_heads * m.head_dim(), F);
  float* head = act(head_base_);
  float* g = scratch_.data();
  float* discard = g + s.size;  // 2C floats: layer-norm gradients of frozen units
  const int64_t rows = static_cast<int64_t>(N);
  const std::size_t last = static_cast<std::size_t>(m.layers) + 1;
  // Below the lowest trainable unit nothing needs a gradient: the pass stops there.
  int lowest = -1;  // the first unit with a gradient buffer
  for (std::size_t unit = 0; unit <= last && lowest < 0; ++unit)
    if (u.grads[unit]) lowest = static_cast<int>(unit);
  if (lowest < 0) return;  // nothing trains
  const int lowest_layer = lowest - 1;  // unit i is layer i - 1; -1: the embeddings train
  using T = LayerTensor;

  // Head: dlogits in place of the logits, from the forward's row statistics.
  call(hooks.before_backward, m.layers);
  const float* wte = u.params[0];
  float* dwte = u.grads[0];
  const float* lnf = u.params[last];
  float* dlnf = u.grads[last];
  const layers::VocabSlice slice = layers::whole_vocab(N, V);
  float* logits = head + h.logits;
  layers::cross_entropy_loss_and_grad(head + h.losses, logits, logits, targets_.data(), head + h.row_stats,
                                      head + h.row_stats + N, head + h.row_stats + 2 * N, normaliser, slice, cpu_);
  if (dwte) linear::backward_weight(runtime_.library, {rows, m.hidden, m.vocab}, dwte, nullptr, logits, head + h.lnf, true);
  linear::backward_input(runtime_.library, {rows, m.hidden, m.vocab}, g + s.d_ln, logits, wte, false);
  std::fill(g + s.d_x, g + s.d_x + N * C, 0.0f);
  layers::layernorm_backward(g + s.d_x, dlnf ? dlnf : discard, dlnf ? dlnf + C : discard + C, g + s.d_ln, head + h.x_final,
                             lnf, head + h.lnf_mean, head + h.lnf_rstd, N, C, cpu_);
  call(hooks.after_backward, m.layers);

  // d_x holds the gradient of the current layer's output; each layer turns it into its input's gradient.
  for (int l = m.layers - 1; l >= std::max(lowest_layer, 0); --l) {
    call(hooks.before_backward, l);
    const LayerView x = view(l);
    if (recompute_ != Recompute::none) {
      call(hooks.before_recompute, l);
      if (recompute_ == Recompute::full) layer_forward(l, u, false);
      else attention_core_forward(x);
      call(hooks.after_recompute, l);
    }
    const bool trains = u.grads[static_cast<std::size_t>(l) + 1] != nullptr;
    // MLP: out = x_mid + fcproj(gelu(fc(ln2(x_mid)))).
    if (trains)
      linear::backward_weight(runtime_.library, {rows, m.mlp(), m.hidden}, grad(u, l, T::fc_proj_w), grad(u, l, T::fc_proj_b),
                              g + s.d_x, x.fch_gelu, true);
    linear::backward_input(runtime_.library, {rows, m.mlp(), m.hidden}, g + s.d_fch_gelu, g + s.d_x,
                           param(u, l, T::fc_proj_w), false);
    std::fill(g + s.d_fch, g + s.d_fch + N * F, 0.0f);
    layers::gelu_backward(g + s.d_fch, x.fch, g + s.d_fch_gelu, N * F, cpu_);
    if (trains)
      linear::backward_weight(runtime_.library, {rows, m.hidden, m.mlp()}, grad(u, l, T::fc_w), grad(u, l, T::fc_b),
                              g + s.d_fch, x.ln2, true);
    linear::backward_input(runtime_.library, {rows, m.hidden, m.mlp()}, g + s.d_ln, g + s.d_fch, param(u, l, T::fc_w), false);
    std::copy(g + s.d_x, g + s.d_x + N * C, g + s.d_mid);  // the residual branch
    layers::layernorm_backward(g + s.d_mid, trains ? grad(u, l, T::ln2_w) : discard, trains ? grad(u, l, T::ln2_b) : discard + C,
                               g + s.d_ln, x.x_mid, param(u, l, T::ln2_w), x.ln2_mean, x.ln2_rstd, N, C, cpu_);
    // Attention: x_mid = x_in + attproj(attention(ln1(x_in))).
    attention_backward(l, u, x, g + s.d_mid);
    std::copy(g + s.d_mid, g + s.d_mid + N * C, g + s.d_x);  // the residual branch
    layers::layernorm_backward(g + s.d_x, trains ? grad(u, l, T::ln1_w) : discard, trains ? grad(u, l, T::ln1_b) : discard + C,
                               g + s.d_ln, x.x_in, param(u, l, T::ln1_w), x.ln1_mean, x.ln1_rstd, N, C, cpu_);
    call(hooks.after_backward, l);
  }
  if (lowest_layer >= 0) return;  // the embeddings are frozen
  call(hooks.before_backward, -1);
  layers::embedding_backward(dwte, dwte + V * C, g + s.d_x, tokens_.data(), static_cast<std::size_t>(batch_),
                             static_cast<std::size_t>(seq_), C, cpu_);
  call(hooks.after_backward, -1);
}

}  // namespace strata::train
