// Implementation of the GPT model on the CPU (see gpt.h).
#include "train/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>

#include "kernels/linear.h"
#include "train/clock.h"

namespace strata::train {

// ---- parameter layout ----------------------------------------------------------------------------------

namespace {

ModelConfig validated(const ModelConfig& model) {
  if (const std::string problem = model.validate(); !problem.empty()) throw std::invalid_argument(problem);
  return model;
}

}  // namespace

ParameterLayout::ParameterLayout(const ModelConfig& model) : ParameterLayout(model, tensor_shard(validated(model), 1, 0)) {}

ParameterLayout::ParameterLayout(const ModelConfig& model, const TensorShard& shard) : model_(validated(model)), shard_(shard) {
  const std::size_t C = static_cast<std::size_t>(model.hidden), Q = static_cast<std::size_t>(shard.qkv_channels(model)),
                    A = static_cast<std::size_t>(shard.attention_channels(model)), F = static_cast<std::size_t>(shard.mlp);
  std::size_t at = 0;
  auto take = [&](std::size_t n) { return Slice{std::exchange(at, at + n), n}; };
  wte_ = take(static_cast<std::size_t>(shard.vocab_rows) * C);
  wpe_ = take(static_cast<std::size_t>(model.max_seq) * C);
  first_layer_ = at;
  const std::size_t sizes[kLayerTensors] = {C, C, Q * C, Q, C * A, C, C, C, F * C, F, C * F, C};
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

std::vector<Slice> ParameterLayout::replicated() const {
  std::vector<Slice> whole{wpe_};
  using T = LayerTensor;
  for (int l = 0; l < model_.layers; ++l)
    for (T t : {T::ln1_w, T::ln1_b, T::attn_proj_b, T::ln2_w, T::ln2_b, T::fc_proj_b}) whole.push_back(tensor(l, t));
  whole.push_back(lnf_w_);
  whole.push_back(lnf_b_);
  return whole;
}

void take_shard(const ModelConfig& m, const TensorShard& shard, const float* whole, float* local) {
  const ParameterLayout from(m), to(m, shard);
  const std::size_t C = static_cast<std::size_t>(m.hidden), D = static_cast<std::size_t>(m.head_dim());
  const std::size_t r = static_cast<std::size_t>(shard.rank);
  // Rows [first, first + count) of a (rows, width) tensor, appended at `out`.
  auto rows = [](const float* tensor, std::size_t first, std::size_t count, std::size_t width, float*& out) {
    std::copy(tensor + first * width, tensor + (first + count) * width, out);
    out += count * width;
  };
  // Columns [first, first + count) of every row of a (rows, width) tensor.
  auto columns = [](const float* tensor, std::size_t n_rows, std::size_t width, std::size_t first, std::size_t count, float* out) {
    for (std::size_t i = 0; i < n_rows; ++i) std::copy(tensor + i * width + first, tensor + i * width + first + count, out + i * count);
  };
  auto whole_tensor = [&](Slice a, Slice b) { std::copy(whole + a.offset, whole + a.end(), local + b.offset); };
  float* wte = local + to.wte().offset;
  std::fill(wte, wte + to.wte().size, 0.0f);
  rows(whole + from.wte().offset, static_cast<std::size_t>(shard.vocab_begin), static_cast<std::size_t>(shard.vocab_width), C, wte);
  whole_tensor(from.wpe(), to.wpe());
  const std::size_t NH = static_cast<std::size_t>(shard.heads) * D, KV = static_cast<std::size_t>(shard.kv_heads) * D;
  const std::size_t full_q = static_cast<std::size_t>(m.heads) * D, full_kv = static_cast<std::size_t>(m.kv_heads) * D;
  const std::size_t F = static_cast<std::size_t>(shard.mlp), full_f = static_cast<std::size_t>(m.mlp());
  using T = LayerTensor;
  for (int l = 0; l < m.layers; ++l) {
    for (T t : {T::ln1_w, T::ln1_b, T::attn_proj_b, T::ln2_w, T::ln2_b, T::fc_proj_b}) whole_tensor(from.tensor(l, t), to.tensor(l, t));
    // QKV rows: my heads of q, then of k, then of v; its bias alike.
    for (auto [tensor, width] : {std::pair{T::qkv_w, C}, std::pair{T::qkv_b, std::size_t{1}}}) {
      const float* in = whole + from.tensor(l, tensor).offset;
      float* out = local + to.tensor(l, tensor).offset;
      rows(in, r * NH, NH, width, out);
      rows(in, full_q + r * KV, KV, width, out);
      rows(in, full_q + full_kv + r * KV, KV, width, out);
    }
    columns(whole + from.tensor(l, T::attn_proj_w).offset, C, full_q, r * NH, NH, local + to.tensor(l, T::attn_proj_w).offset);
    float* fc = local + to.tensor(l, T::fc_w).offset;
    rows(whole + from.tensor(l, T::fc_w).offset, r * F, F, C, fc);
    float* fc_b = local + to.tensor(l, T::fc_b).offset;
    rows(whole + from.tensor(l, T::fc_b).offset, r * F, F, 1, fc_b);
    columns(whole + from.tensor(l, T::fc_proj_w).offset, C, full_f, r * F, F, local + to.tensor(l, T::fc_proj_w).offset);
  }
  whole_tensor(from.lnf_w(), to.lnf_w());
  whole_tensor(from.lnf_b(), to.lnf_b());
}

void init_parameters(const ModelConfig& model, const ParameterLayout& layout, float* params, uint64_t seed, float std) {
  if (layout.shard().tp > 1) {
    const ParameterLayout whole(model);
    std::vector<float> all(whole.total());
    init_parameters(model, whole, all.data(), seed, std);
    take_shard(model, layout.shard(), all.data(), params);
    return;
  }
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

// The op whose forward computes an activation; the layer's input (x_in) belongs to none and is always kept.
std::optional<LayerOp> op_of(int activation) {
  using A = Activation;
  if (activation == A::x_in) return std::nullopt;
  if (activation <= A::qkv) return LayerOp::pre;
  if (activation <= A::lse) return LayerOp::core;
  return LayerOp::post;
}

// A: the attention's channels (heads x head dimension; C without tensor parallelism). R: rows of the residual
// stream held here (N / T under sequence parallelism, whose layer-norm outputs are kept gathered, N rows).
std::vector<std::size_t> layer_activation_sizes(std::size_t N, std::size_t R, std::size_t C, std::size_t A,
                                                std::size_t Q, std::size_t KV, std::size_t F, std::size_t heads) {
  return {R * C, N * C, R, R, N * Q, N * A, N * KV, N * KV, N * A, N * heads,
          N * A, N * C, R * C, N * C, R, R, N * F, N * F, N * C};
}

constexpr LayerOp kOps[kLayerOps] = {LayerOp::pre, LayerOp::core, LayerOp::post};

}  // namespace

const char* name(LayerOp op) {
  switch (op) {
    case LayerOp::pre: return "pre";
    case LayerOp::core: return "core";
    case LayerOp::post: return "post";
  }
  return "?";
}

bool keeps(Recompute recompute, LayerOp op) {
  switch (recompute) {
    case Recompute::none: return true;
    case Recompute::full: return false;
    case Recompute::selective: return op != LayerOp::core;
    case Recompute::overlap: break;
  }
  throw std::logic_error("keeps: overlap keeps what its placement says (StagePlan::kept)");
}

const char* name(Recompute recompute) {
  switch (recompute) {
    case Recompute::none: return "none";
    case Recompute::full: return "full";
    case Recompute::selective: return "selective";
    case Recompute::overlap: return "overlap";
  }
  return "?";
}

std::optional<Recompute> parse_recompute(std::string_view text) {
  for (Recompute r : kAllRecomputes)
    if (text == name(r)) return r;
  return std::nullopt;
}

bool GptCpu::kept(int layer, LayerOp op) const {
  return kept_[static_cast<std::size_t>(local(layer))][static_cast<std::size_t>(op)];
}

GptCpu::LayerView GptCpu::view(int set, int l) {
  const std::size_t li = static_cast<std::size_t>(local(l));
  float* in_set = act(static_cast<std::size_t>(set) * set_stride_ + layer_in_set_[li]);
  float* shared = act(shared_base_);
  float* recompute = act(layer_recompute_[li]);
  auto at = [&](int a) {
    const Place& p = place_[li][static_cast<std::size_t>(a)];
    return (p.region == Region::set ? in_set : p.region == Region::shared ? shared : recompute) + p.offset;
  };
  using A = Activation;
  return {at(A::x_in), at(A::ln1), at(A::ln1_mean), at(A::ln1_rstd), at(A::qkv), at(A::q), at(A::k), at(A::v),
          at(A::atty), at(A::lse), at(A::att_merged), at(A::attproj), at(A::x_mid), at(A::ln2), at(A::ln2_mean),
          at(A::ln2_rstd), at(A::fch), at(A::fch_gelu), at(A::fcproj)};
}

float* GptCpu::head_base(int set) { return act(static_cast<std::size_t>(set) * set_stride_ + head_in_set_); }

namespace {

// The head's saved activations, from its base: the last layer's output, the final norm, logits, losses.
// R: rows of the residual stream held here (N, or N / T under sequence parallelism).
struct HeadActs {
  std::size_t x_final, lnf, lnf_mean, lnf_rstd, logits, losses, row_stats, size;
  HeadActs(std::size_t N, std::size_t R, std::size_t C, std::size_t V) {
    std::size_t at = 0;
    auto take = [&](std::size_t n) { return std::exchange(at, at + n); };
    x_final = take(R * C), lnf = take(N * C), lnf_mean = take(R), lnf_rstd = take(R), logits = take(N * V);
    losses = take(N), row_stats = take(3 * N);
    size = at;
  }
};

// Gradients of activations, one set shared by every layer (offsets from the scratch base).
// d_full: under sequence parallelism, the gathered gradient of the residual stream (N, C) the row-parallel
// layers and the embedding read.
struct Scratch {
  std::size_t d_x, d_mid, d_ln, d_fch_gelu, d_fch, d_att_merged, d_atty, dq, dk, dv, d_qkv, d_full, d_norm, size;
  Scratch(std::size_t N, std::size_t R, std::size_t C, std::size_t A, std::size_t Q, std::size_t KV, std::size_t F) {
    std::size_t at = 0;
    auto take = [&](std::size_t n) { return std::exchange(at, at + n); };
    d_x = take(R * C), d_mid = take(R * C), d_ln = take(N * C), d_fch_gelu = take(N * F), d_fch = take(N * F);
    d_att_merged = take(N * A), d_atty = take(N * A), dq = take(N * A), dk = take(N * KV), dv = take(N * KV);
    d_qkv = take(N * Q), d_full = take(R < N ? N * C : 0), d_norm = take(R < N ? 2 * C : 0);
    size = at;
  }
};

void call(const std::function<void(int)>& hook, int layer) {
  if (hook) hook(layer);
}

HeadActs head_layout(const GptCpu& model) {
  return HeadActs(static_cast<std::size_t>(model.batch()) * model.seq(), model.rows_here(),
                  static_cast<std::size_t>(model.model().hidden), static_cast<std::size_t>(model.shard().vocab_rows));
}

Scratch scratch_layout(const GptCpu& model) {
  const ModelConfig& m = model.model();
  const TensorShard& sh = model.shard();
  return Scratch(static_cast<std::size_t>(model.batch()) * model.seq(), model.rows_here(), static_cast<std::size_t>(m.hidden),
                 static_cast<std::size_t>(sh.attention_channels(m)), static_cast<std::size_t>(sh.qkv_channels(m)),
                 static_cast<std::size_t>(sh.kv_channels(m)), static_cast<std::size_t>(sh.mlp));
}

}  // namespace

GptCpu::GptCpu(const ModelConfig& model, int batch, int seq, CpuRuntime runtime, Recompute recompute,
               coll::Group* tensor_parallel, bool sequence_parallel, StagePlan stage)
    : model_(model), tp_(tensor_parallel && tensor_parallel->size() > 1 ? tensor_parallel : nullptr),
      sp_(tp_ && sequence_parallel),
      layout_(model, tensor_shard(validated(model), tp_ ? tp_->size() : 1, tp_ ? tp_->rank() : 0)), batch_(batch),
      seq_(seq), runtime_(runtime), recompute_(recompute), stage_(std::move(stage)) {
  if (batch <= 0 || seq <= 0) throw std::invalid_argument("batch and sequence must be positive");
  if (seq > model.max_seq)
    throw std::invalid_argument("sequence " + std::to_string(seq) + " exceeds the model's position table (" +
                                std::to_string(model.max_seq) + ")");
  if (stage_.layers < 0) stage_.layers = model.layers - stage_.first_layer;
  if (stage_.first_layer < 0 || stage_.first_layer + stage_.layers > model.layers)
    throw std::invalid_argument("stage of layers " + std::to_string(stage_.first_layer) + ".." +
                                std::to_string(stage_.first_layer + stage_.layers - 1) + " is outside the model's " +
                                std::to_string(model.layers) + " layers");
  if (stage_.layers == 0 && !(stage_.embedding && stage_.head))
    throw std::invalid_argument("a pipeline stage needs at least one layer");
  if (stage_.activation_sets < 1) throw std::invalid_argument("a stage holds at least one micro-batch's activations");
  if (recompute == Recompute::overlap && stage_.kept.size() != static_cast<std::size_t>(stage_.layers))
    throw std::invalid_argument("recompute overlap needs a kept/recomputed decision for each of the stage's " +
                                std::to_string(stage_.layers) + " layers");
  cpu_.threads = runtime.threads;
  attention_options_.threads = runtime.threads;
  const TensorShard& sh = layout_.shard();
  attention_shape_ = {batch, sh.heads, sh.kv_heads, seq, seq, model.head_dim(), true};
  if (std::string problem = attention::validate(attention_shape_); !problem.empty()) throw std::invalid_argument(problem);
  const std::size_t N = static_cast<std::size_t>(batch) * seq, C = static_cast<std::size_t>(model.hidden);
  const std::size_t A = static_cast<std::size_t>(sh.attention_channels(model)), Q = static_cast<std::size_t>(sh.qkv_channels(model)),
                    KV = static_cast<std::size_t>(sh.kv_channels(model)), F = static_cast<std::size_t>(sh.mlp);
  rows_here_ = N, row_begin_ = 0;
  if (sp_) {
    const std::size_t T = static_cast<std::size_t>(tp_->size());
    if (N % T != 0)
      throw std::invalid_argument("sequence parallelism: the " + std::to_string(N) + " rows of a micro-batch (batch x sequence) "
                                  "do not divide among " + std::to_string(T) + " tensor-parallel ranks");
    rows_here_ = N / T, row_begin_ = static_cast<std::size_t>(tp_->rank()) * rows_here_;
  }
  const std::size_t R = rows_here_;
  const std::vector<std::size_t> sizes = layer_activation_sizes(N, R, C, A, Q, KV, F, static_cast<std::size_t>(sh.heads));
  // Where each layer's activations live: kept ones in every set; recomputed ones in one layer's shared space, or
  // under overlap in the layer's own recompute space (several layers may be recomputed before their backward).
  std::size_t in_set = 0, shared = 0, recompute_total = 0;
  for (int li = 0; li < stage_.layers; ++li) {
    KeptOps keep{};
    for (LayerOp op : kOps)
      keep[static_cast<std::size_t>(op)] = recompute == Recompute::overlap ? stage_.kept[static_cast<std::size_t>(li)][static_cast<std::size_t>(op)]
                                                                          : keeps(recompute, op);
    kept_.push_back(keep);
    layer_in_set_.push_back(in_set);
    layer_recompute_.push_back(recompute_total);
    std::size_t own = 0, elsewhere = 0;
    std::vector<Place> places;
    for (int a = 0; a < Activation::count; ++a) {
      const std::optional<LayerOp> op = op_of(a);
      const std::size_t n = sizes[static_cast<std::size_t>(a)];
      if (!op || keep[static_cast<std::size_t>(*op)]) places.push_back({Region::set, std::exchange(own, own + n)});
      else places.push_back({recompute == Recompute::overlap ? Region::recompute : Region::shared, std::exchange(elsewhere, elsewhere + n)});
    }
    place_.push_back(std::move(places));
    in_set += own;
    if (recompute == Recompute::overlap) recompute_total += elsewhere;
    else shared = std::max(shared, elsewhere);
  }
  head_in_set_ = in_set;
  set_stride_ = in_set + (stage_.head ? HeadActs(N, R, C, static_cast<std::size_t>(sh.vocab_rows)).size : R * C);
  shared_base_ = static_cast<std::size_t>(stage_.activation_sets) * set_stride_;
  for (std::size_t& base : layer_recompute_) base += shared_base_ + shared;
  const Backing backing = runtime.tracer ? Backing::address_space : Backing::memory;
  activations_ = TrackedBuffer<float>(MemoryCategory::activations, shared_base_ + shared + recompute_total, backing);
  recomputed_for_.assign(static_cast<std::size_t>(stage_.layers), {0, 0, 0});
  tokens_.resize(static_cast<std::size_t>(stage_.activation_sets));
  targets_.resize(static_cast<std::size_t>(stage_.activation_sets));
  // Frozen units' layer-norm gradients land in a region after the scratch and are never read.
  scratch_ = TrackedBuffer<float>(MemoryCategory::workspace, Scratch(N, R, C, A, Q, KV, F).size + 2 * C, backing);
}

void GptCpu::tp_reduce_scatter(float* full, std::size_t width, const char* what) {
  const double start = timing_tensor_parallel() ? host_seconds() : 0;
  if (runtime_.tracer) runtime_.tracer->name_next(what);
  coll::Work work = tp_->reduce_scatter(coll::Algo::library, full, my_rows(full, width), rows_here_ * width, coll::DataType::float32,
                      coll::RedOp::sum, coll::Waiting::at_once);
  finish(work);
  if (timing_tensor_parallel()) hooks_->tensor_parallel_comm(what, start, host_seconds(), rows_here_ * width * tp_->size() * sizeof(float));
}

void GptCpu::tp_allgather(float* full, std::size_t width, const char* what) {
  const double start = timing_tensor_parallel() ? host_seconds() : 0;
  if (runtime_.tracer) runtime_.tracer->name_next(what);
  coll::Work work = tp_->allgather(coll::Algo::library, my_rows(full, width), full, rows_here_ * width, coll::DataType::float32,
                 coll::Waiting::at_once);
  finish(work);
  if (timing_tensor_parallel()) hooks_->tensor_parallel_comm(what, start, host_seconds(), rows_here_ * width * tp_->size() * sizeof(float));
}

void GptCpu::tp_allreduce(float* data, std::size_t count, const char* what, coll::RedOp op) {
  if (!tp_) return;
  const double start = timing_tensor_parallel() ? host_seconds() : 0;
  if (runtime_.tracer) runtime_.tracer->name_next(what);
  coll::Work work = tp_->allreduce(coll::Algo::library, data, data, count, coll::DataType::float32, op, coll::Waiting::at_once);
  finish(work);
  if (timing_tensor_parallel()) hooks_->tensor_parallel_comm(what, start, host_seconds(), count * sizeof(float));
}

void GptCpu::finish(coll::Work& work) const {
  if (runtime_.tracer) runtime_.tracer->complete(runtime_.tracer->last_operation());  // a traced collective waits to be told
  work.wait();
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

template <typename Run>
void GptCpu::compute(const char* what, double elements, const Run& run) const {
  if (runtime_.tracer) runtime_.tracer->elementwise(what, elements);
  else run();
}

void GptCpu::linear_forward(const char* what, const linear::Dims& d, float* y, const float* x, const float* w,
                            const float* b) const {
  if (runtime_.tracer) {
    // The bias is written before the GEMM, which then reads it (beta 1): a pass of its own unless the GEMM's
    // library applies it in its epilogue (the description's fused_into_gemm).
    if (b) runtime_.tracer->elementwise("bias fill", 2.0 * static_cast<double>(d.rows) * static_cast<double>(d.out_channels));
    runtime_.tracer->gemm(what, d.rows, d.out_channels, d.in_channels);
  } else {
    linear::forward({runtime_.library, runtime_.precision}, d, y, x, w, b);
  }
}

void GptCpu::linear_backward_input(const char* what, const linear::Dims& d, float* dx, const float* dy, const float* w,
                                   bool accumulate) const {
  if (runtime_.tracer) runtime_.tracer->gemm(what, d.rows, d.in_channels, d.out_channels);
  else linear::backward_input({runtime_.library, runtime_.precision}, d, dx, dy, w, accumulate);
}

void GptCpu::linear_backward_weight(const char* what, const linear::Dims& d, float* dw, float* db, const float* dy,
                                    const float* x, bool accumulate) const {
  if (runtime_.tracer) {
    runtime_.tracer->gemm(what, d.out_channels, d.in_channels, d.rows);
    // dy read once more for the bias's column sums, the sums read and written.
    if (db)
      runtime_.tracer->elementwise("bias grad", static_cast<double>(d.rows) * static_cast<double>(d.out_channels) +
                                                    2.0 * static_cast<double>(d.out_channels));
  } else {
    linear::backward_weight({runtime_.library, runtime_.precision}, d, dw, db, dy, x, accumulate);
  }
}

void GptCpu::attention_pass(const char* what, bool backward, const LayerView& x, float* d_out, float* dq, float* dk,
                            float* dv) const {
  const attention::Shape& a = attention_shape_;
  if (runtime_.tracer) runtime_.tracer->attention(what, a.batch, a.heads_q, a.seq_q, a.seq_kv, a.head_dim, a.causal, backward);
  else if (backward) attention::flash_backward(a, x.q, x.k, x.v, x.atty, d_out, x.lse, dq, dk, dv, attention_options_);
  else attention::flash_forward(a, x.q, x.k, x.v, x.atty, x.lse, attention_options_);
}

void GptCpu::forward_op(int set, int l, const UnitPointers& u, LayerOp op) {
  const ModelConfig& m = model_;
  const TensorShard& sh = shard();
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(m.hidden);
  const std::size_t F = static_cast<std::size_t>(sh.mlp), R = rows_here_;
  const std::size_t Q = static_cast<std::size_t>(sh.qkv_channels(m)), A = static_cast<std::size_t>(sh.attention_channels(m));
  const int64_t rows = static_cast<int64_t>(N);
  using T = LayerTensor;
  const LayerView x = view(set, l);
  switch (op) {
    case LayerOp::pre:
      // The residual stream and the layer norms on this rank's rows (all N without sequence parallelism).
      compute("ln1", 2.0 * R * C + 2.0 * R, [&] {
        layers::layernorm_forward(my_rows(x.ln1, C), x.ln1_mean, x.ln1_rstd, x.x_in, param(u, l, T::ln1_w),
                                  param(u, l, T::ln1_b), R, C, cpu_);
      });
      if (sp_) tp_allgather(x.ln1, C, "allgather ln1");
      // (N, C) -> (N, Q): the three projections at once (this rank's heads).
      linear_forward("qkv", {rows, m.hidden, sh.qkv_channels(m)}, x.qkv, x.ln1, param(u, l, T::qkv_w), param(u, l, T::qkv_b));
      return;
    case LayerOp::core:
      compute("split heads", 2.0 * N * Q, [&] {
        layers::permute_qkv(x.qkv, x.q, x.k, x.v, batch_, seq_, sh.heads, sh.kv_heads, m.head_dim(), true);
      });
      attention_pass("attention", false, x, nullptr, nullptr, nullptr, nullptr);
      return;
    case LayerOp::post: {
      compute("merge heads", 2.0 * N * A,
              [&] { layers::permute_heads(x.atty, x.att_merged, batch_, seq_, sh.heads, m.head_dim(), true); });
      // (N, A) -> (N, C), row-parallel: partial sums over this rank's heads. A row-parallel layer's bias is added
      // once, after the sum.
      auto row_parallel_sum = [&](float* out, const float* bias, const char* reduce_scatter, const char* allreduce) {
        if (sp_) {
          tp_reduce_scatter(out, C, reduce_scatter);
          compute("bias", 2.0 * R * C, [&] { layers::add_bias(my_rows(out, C), bias, R, C); });
        } else if (tensor_parallel()) {
          tp_allreduce(out, N * C, allreduce);
          compute("bias", 2.0 * N * C, [&] { layers::add_bias(out, bias, N, C); });
        }
      };
      linear_forward("attention out", {rows, sh.attention_channels(m), m.hidden}, x.attproj, x.att_merged,
                     param(u, l, T::attn_proj_w), tensor_parallel() ? nullptr : param(u, l, T::attn_proj_b));
      row_parallel_sum(x.attproj, param(u, l, T::attn_proj_b), "reduce-scatter attention out", "allreduce attention out");
      compute("residual", 3.0 * R * C, [&] { layers::residual_forward(x.x_mid, x.x_in, my_rows(x.attproj, C), R * C, cpu_); });
      compute("ln2", 2.0 * R * C + 2.0 * R, [&] {
        layers::layernorm_forward(my_rows(x.ln2, C), x.ln2_mean, x.ln2_rstd, x.x_mid, param(u, l, T::ln2_w),
                                  param(u, l, T::ln2_b), R, C, cpu_);
      });
      if (sp_) tp_allgather(x.ln2, C, "allgather ln2");
      // MLP up column-parallel, down row-parallel.
      linear_forward("mlp up", {rows, m.hidden, sh.mlp}, x.fch, x.ln2, param(u, l, T::fc_w), param(u, l, T::fc_b));
      compute("gelu", 2.0 * N * F, [&] { layers::gelu_forward(x.fch_gelu, x.fch, N * F, cpu_); });
      linear_forward("mlp down", {rows, sh.mlp, m.hidden}, x.fcproj, x.fch_gelu, param(u, l, T::fc_proj_w),
                     tensor_parallel() ? nullptr : param(u, l, T::fc_proj_b));
      row_parallel_sum(x.fcproj, param(u, l, T::fc_proj_b), "reduce-scatter mlp out", "allreduce mlp out");
      return;
    }
  }
}

void GptCpu::recompute_on_demand(int set, int l, const UnitPointers& u, const LayerHooks& hooks) {
  auto& ready = recomputed_for_[static_cast<std::size_t>(local(l))];
  bool any = false;
  for (LayerOp op : kOps) {
    const std::size_t i = static_cast<std::size_t>(op);
    if (kept_[static_cast<std::size_t>(local(l))][i] || ready[i] == set + 1) continue;
    if (!any) call(hooks.before_recompute, l);
    any = true;
    forward_op(set, l, u, op);
    ready[i] = set + 1;
  }
  if (any) call(hooks.after_recompute, l);
}

void GptCpu::recompute(int set, int layer, LayerOp op, const UnitPointers& u, const LayerHooks& hooks) {
  if (recompute_ != Recompute::overlap) throw std::logic_error("recompute ahead of backward needs Recompute::overlap");
  if (layer < first_layer() || layer >= end_layer() || set < 0 || set >= stage_.activation_sets)
    throw std::logic_error("recompute: layer " + std::to_string(layer) + " or set " + std::to_string(set) + " is not on this stage");
  const std::size_t li = static_cast<std::size_t>(local(layer)), i = static_cast<std::size_t>(op);
  if (kept_[li][i]) throw std::logic_error(std::string("recompute: op ") + name(op) + " of layer " + std::to_string(layer) + " is kept");
  auto available = [&](LayerOp producer) {
    const std::size_t p = static_cast<std::size_t>(producer);
    return kept_[li][p] || recomputed_for_[li][p] == set + 1;
  };
  if ((op == LayerOp::core && !available(LayerOp::pre)) || (op == LayerOp::post && !available(LayerOp::core)))
    throw std::logic_error(std::string("recompute: op ") + name(op) + " of layer " + std::to_string(layer) +
                           " before its producer");
  hooks_ = &hooks;
  forward_op(set, layer, u, op);
  recomputed_for_[li][i] = set + 1;
}

float* GptCpu::stage_input(int set) {
  if (stage_.embedding) throw std::logic_error("stage_input: the first stage reads tokens");
  return view(set, first_layer()).x_in;
}

const float* GptCpu::stage_output(int set) const {
  if (stage_.head) throw std::logic_error("stage_output: the last stage ends in the loss");
  return act(static_cast<std::size_t>(set) * set_stride_ + head_in_set_);
}

const float* GptCpu::input_grad() const { return scratch_.data() + Scratch(0, 0, 0, 0, 0, 0, 0).d_x; }

double GptCpu::forward(const float* params, const int32_t* tokens, const int32_t* targets, const LayerHooks& hooks) {
  return forward(UnitPointers::flat(layout_, params, nullptr), tokens, targets, hooks);
}

void GptCpu::backward(const float* params, float* grads, float normaliser, const LayerHooks& hooks) {
  backward(UnitPointers::flat(layout_, params, grads), normaliser, hooks);
}

double GptCpu::forward(const UnitPointers& u, const int32_t* tokens, const int32_t* targets, const LayerHooks& hooks) {
  return forward(0, u, tokens, targets, hooks);
}

void GptCpu::backward(const UnitPointers& u, float normaliser, const LayerHooks& hooks) {
  backward(0, u, normaliser, nullptr, false, hooks);
}

// One micro-batch through the stage, block by block: the embeddings, each layer, the head.
double GptCpu::forward(int set, const UnitPointers& u, const int32_t* tokens, const int32_t* targets, const LayerHooks& hooks) {
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_;
  if (set < 0 || set >= stage_.activation_sets) throw std::logic_error("forward: no activation set " + std::to_string(set));
  if (stage_.embedding) {
    if (!tokens) throw std::logic_error("forward: the first stage needs tokens");
    tokens_[static_cast<std::size_t>(set)].assign(tokens, tokens + N);
  }
  if (stage_.head) {
    if (!targets) throw std::logic_error("forward: the last stage needs targets");
    targets_[static_cast<std::size_t>(set)].assign(targets, targets + N);
  }
  hooks_ = &hooks;
  for (auto& ready : recomputed_for_) ready = {0, 0, 0};  // this forward overwrites the recompute spaces

  if (stage_.embedding) {
    call(hooks.before_forward, -1);  // each unit's pointer is read after its hook, which may have just gathered it
    embedding_forward(set, u, tokens);
  }
  for (int l = first_layer(); l < end_layer(); ++l) {
    call(hooks.before_forward, l);
    layer_forward(set, l, u, hooks);
  }
  if (!stage_.head) return 0;
  call(hooks.before_forward, model_.layers);
  return head_forward(set, u, targets);
}

// The token and position tables' rows into the first layer's input (R, C) (or the head's, on a stage of no layers).
void GptCpu::embedding_forward(int set, const UnitPointers& u, const int32_t* tokens) {
  const ModelConfig& m = model_;
  const TensorShard& sh = shard();
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(m.hidden);
  const std::size_t R = rows_here_, V = static_cast<std::size_t>(sh.vocab_rows);
  const float* wpe = u.params[0] + V * C;
  float* first_input = end_layer() > first_layer() ? view(set, first_layer()).x_in : head_base(set) + head_layout(*this).x_final;
  if (!tensor_parallel()) {
    compute("embedding", 3.0 * N * C, [&] {
      layers::embedding_forward(first_input, tokens, u.params[0], wpe, static_cast<std::size_t>(batch_),
                                static_cast<std::size_t>(seq_), C, V, cpu_);
    });
    return;
  }
  // Vocabulary-parallel lookup: my rows of the token table, zeros for the others' tokens, summed over the group
  // (onto my rows under sequence parallelism, through the workspace); then the position table, whole on every rank.
  const std::size_t begin = static_cast<std::size_t>(sh.vocab_begin), width = static_cast<std::size_t>(sh.vocab_width);
  float* looked_up = sp_ ? scratch_.data() + scratch_layout(*this).d_full : first_input;
  compute("embedding lookup", 2.0 * N * C, [&] {
    for (std::size_t i = 0; i < N; ++i) {
      const int32_t token = tokens[i];
      if (token < 0 || token >= m.vocab)
        throw std::invalid_argument("token " + std::to_string(token) + " at position " + std::to_string(i) +
                                    " is outside the vocabulary of " + std::to_string(m.vocab));
      const std::size_t t = static_cast<std::size_t>(token);
      float* row = looked_up + i * C;
      if (t >= begin && t < begin + width) std::copy(u.params[0] + (t - begin) * C, u.params[0] + (t - begin + 1) * C, row);
      else std::fill(row, row + C, 0.0f);
    }
  });
  if (sp_) {
    tp_reduce_scatter(looked_up, C, "reduce-scatter embedding");
    compute("copy", 2.0 * R * C, [&] { std::copy(my_rows(looked_up, C), my_rows(looked_up, C) + R * C, first_input); });
  } else {
    tp_allreduce(first_input, N * C, "allreduce embedding");
  }
  compute("positions", 3.0 * R * C, [&] {
    for (std::size_t i = 0; i < R; ++i)
      for (std::size_t c = 0; c < C; ++c) first_input[i * C + c] += wpe[((row_begin_ + i) % static_cast<std::size_t>(seq_)) * C + c];
  });
}

// Layer l's ops (kOps), then the residual add into the next layer's input, or the stage's output.
void GptCpu::layer_forward(int set, int l, const UnitPointers& u, const LayerHooks& hooks) {
  for (LayerOp op : kOps) {
    const double start = hooks.forward_op ? host_seconds() : 0;
    forward_op(set, l, u, op);
    if (hooks.forward_op) hooks.forward_op(l, op, host_seconds() - start);
  }
  const std::size_t C = static_cast<std::size_t>(model_.hidden);
  const LayerView x = view(set, l);
  float* out = l + 1 < end_layer() ? view(set, l + 1).x_in : head_base(set) + (stage_.head ? head_layout(*this).x_final : 0);
  compute("residual", 3.0 * rows_here_ * C,
          [&] { layers::residual_forward(out, x.x_mid, my_rows(x.fcproj, C), rows_here_ * C, cpu_); });
}

// The final norm, the LM head and the loss: the summed loss of the micro-batch's rows.
double GptCpu::head_forward(int set, const UnitPointers& u, const int32_t* targets) {
  const ModelConfig& m = model_;
  const TensorShard& sh = shard();
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(m.hidden), R = rows_here_;
  const std::size_t V = static_cast<std::size_t>(sh.vocab_rows);
  const HeadActs h = head_layout(*this);
  float* head = head_base(set);
  const int64_t rows = static_cast<int64_t>(N);
  const float* lnf = u.params[static_cast<std::size_t>(m.layers) + 1];
  const float* wte = u.params[0];
  compute("lnf", 2.0 * R * C + 2.0 * R, [&] {
    layers::layernorm_forward(my_rows(head + h.lnf, C), head + h.lnf_mean, head + h.lnf_rstd, head + h.x_final, lnf, lnf + C,
                              R, C, cpu_);
  });
  if (sp_) tp_allgather(head + h.lnf, C, "allgather lnf");
  // The LM head is the token table: logits (N, V) = lnf (N, C) wte (V, C)^T; a rank's slice of them in parallel.
  linear_forward("lm head", {rows, m.hidden, sh.vocab_rows}, head + h.logits, head + h.lnf, wte, nullptr);
  double loss = 0;
  if (!tensor_parallel()) {
    const layers::VocabSlice slice = layers::whole_vocab(N, V);
    compute("cross-entropy", 1.0 * N * V + 4.0 * N, [&] {
      loss = layers::softmax_cross_entropy(head + h.losses, nullptr, head + h.row_stats, head + h.logits, targets, 1.0f,
                                           slice, cpu_);
    });
    return loss;
  }
  // Vocabulary-parallel cross-entropy: each rank's statistics of its slice, combined over the group.
  const layers::VocabSlice slice{N, static_cast<std::size_t>(sh.vocab_width), V, static_cast<std::size_t>(sh.vocab_begin),
                                 static_cast<std::size_t>(m.vocab)};
  float* row_max = head + h.row_stats;
  float* row_sum = row_max + N;
  float* target_logit = row_sum + N;
  compute("logit max", 1.0 * N * V + N, [&] { layers::cross_entropy_row_max(row_max, head + h.logits, slice, cpu_); });
  tp_allreduce(row_max, N, "allreduce loss max", coll::RedOp::max);
  compute("sum of exponentials", 1.0 * N * V + 2.0 * N,
          [&] { layers::cross_entropy_row_sum_exp(row_sum, head + h.logits, row_max, slice, cpu_); });
  tp_allreduce(row_sum, N, "allreduce loss sum");
  compute("target logit", 3.0 * N, [&] { layers::cross_entropy_target_logit(target_logit, head + h.logits, targets, slice, cpu_); });
  tp_allreduce(target_logit, N, "allreduce loss target");
  compute("losses", 5.0 * N, [&] {
    layers::cross_entropy_loss_and_grad(head + h.losses, nullptr, head + h.logits, targets, row_max, row_sum, target_logit,
                                        1.0f, slice, cpu_);
    for (std::size_t i = 0; i < N; ++i) loss += head[h.losses + i];
  });
  return loss;
}

void GptCpu::attention_backward(int l, const UnitPointers& u, const LayerView& x, float* d_residual) {
  // d_residual (R, C) holds the gradient reaching the attention output projection for this rank's rows; on
  // return the gradient of ln1's output for them is in the scratch d_ln at my rows (summed over the
  // tensor-parallel group). A frozen layer computes no weight gradients.
  const ModelConfig& m = model_;
  const TensorShard& sh = shard();
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(m.hidden);
  const Scratch s = scratch_layout(*this);
  float* g = scratch_.data();
  if (sp_) d_residual = gathered(d_residual, g + s.d_full, "allgather d attention out");
  const int64_t rows = static_cast<int64_t>(N);
  const bool trains = u.grads[static_cast<std::size_t>(l) + 1] != nullptr;
  const int A = sh.attention_channels(m);
  using T = LayerTensor;
  if (trains)
    linear_backward_weight("attention out weight", {rows, A, m.hidden}, grad(u, l, T::attn_proj_w), grad(u, l, T::attn_proj_b),
                           d_residual, x.att_merged, true);
  linear_backward_input("attention out input", {rows, A, m.hidden}, g + s.d_att_merged, d_residual, param(u, l, T::attn_proj_w),
                        false);
  compute("split head grads", 2.0 * N * static_cast<double>(A),
          [&] { layers::permute_heads(g + s.d_atty, g + s.d_att_merged, batch_, seq_, sh.heads, m.head_dim(), false); });
  attention_pass("attention backward", true, x, g + s.d_atty, g + s.dq, g + s.dk, g + s.dv);
  compute("merge qkv", 2.0 * N * sh.qkv_channels(m),
          [&] {
            layers::permute_qkv(g + s.d_qkv, g + s.dq, g + s.dk, g + s.dv, batch_, seq_, sh.heads, sh.kv_heads, m.head_dim(),
                                false);
          });
  if (trains)
    linear_backward_weight("qkv weight", {rows, m.hidden, sh.qkv_channels(m)}, grad(u, l, T::qkv_w), grad(u, l, T::qkv_b),
                           g + s.d_qkv, x.ln1, true);
  linear_backward_input("qkv input", {rows, m.hidden, sh.qkv_channels(m)}, g + s.d_ln, g + s.d_qkv, param(u, l, T::qkv_w), false);
  // column-parallel: each rank's heads contribute to ln1's gradient
  if (sp_) tp_reduce_scatter(g + s.d_ln, C, "reduce-scatter d ln1");
  else tp_allreduce(g + s.d_ln, N * C, "allreduce d ln1");
}

float* GptCpu::gathered(const float* mine, float* full, const char* what) {
  const std::size_t C = static_cast<std::size_t>(model_.hidden);
  compute("copy", 2.0 * rows_here_ * C, [&] { std::copy(mine, mine + rows_here_ * C, my_rows(full, C)); });
  tp_allgather(full, C, what);
  return full;
}

// One micro-batch's gradients through the stage, block by block: the head (or the next stage's gradient), each
// layer from the last, the embeddings.
void GptCpu::backward(int set, const UnitPointers& u, float normaliser, const float* output_grad, bool input_grad,
                      const LayerHooks& hooks) {
  if (set < 0 || set >= stage_.activation_sets) throw std::logic_error("backward: no activation set " + std::to_string(set));
  if (!stage_.head && !output_grad) throw std::logic_error("backward: a stage without the head needs its output's gradient");
  const int first = first_layer(), end = end_layer();
  // Below the lowest layer that trains nothing needs a gradient, and the pass stops there, unless the stage's
  // input gradient is asked for (an earlier stage trains) or the embeddings train here.
  const bool embedding_trains = stage_.embedding && u.grads[0] != nullptr;
  int lowest_layer = end;
  if (input_grad || embedding_trains) lowest_layer = first;
  else
    for (int l = end - 1; l >= first; --l)
      if (u.grads[static_cast<std::size_t>(l) + 1]) lowest_layer = l;
  const bool head_trains =
      stage_.head && (u.grads[static_cast<std::size_t>(model_.layers) + 1] != nullptr || u.grads[0] != nullptr);
  if (lowest_layer == end && !head_trains && !embedding_trains) return;  // nothing trains here
  hooks_ = &hooks;

  float* d_x = scratch_.data() + scratch_layout(*this).d_x;  // the gradient of the current block's output (my rows)
  if (stage_.head) {
    call(hooks.before_backward, model_.layers);
    head_backward(set, u, normaliser);
    call(hooks.after_backward, model_.layers);
  } else {
    compute("copy", 2.0 * rows_here_ * model_.hidden, [&] { std::copy(output_grad, output_grad + rows_here_ * model_.hidden, d_x); });
  }
  for (int l = end - 1; l >= lowest_layer; --l) {
    call(hooks.before_backward, l);
    recompute_on_demand(set, l, u, hooks);
    layer_backward(set, l, u);
    call(hooks.after_backward, l);
  }
  if (!embedding_trains) return;  // the input's gradient is in d_x, or the embeddings are frozen
  call(hooks.before_backward, -1);
  embedding_backward(set, u);  // reads the token table's gradient after the hook, which may have just provided it
  call(hooks.after_backward, -1);
}

// The gradient of a column-parallel GEMM's input (N, C) in the scratch's d_ln, summed over the group: onto my rows
// under sequence parallelism, where the layer norm that produced the input runs.
void GptCpu::sum_input_gradient(const char* allreduce, const char* reduce_scatter) {
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(model_.hidden);
  float* d_ln = scratch_.data() + scratch_layout(*this).d_ln;
  if (sp_) tp_reduce_scatter(d_ln, C, reduce_scatter);
  else tp_allreduce(d_ln, N * C, allreduce);
}

// 2C floats past the scratch: the layer-norm gradients of a frozen unit, computed and dropped.
float* GptCpu::discarded_norm_grads() { return scratch_.data() + scratch_layout(*this).size; }

// A layer norm's backward over my rows, from the gradient of its output in d_ln. Under sequence parallelism its
// weight and bias gradients come from my rows only: this micro-batch's are summed over the group before they join
// the accumulated ones.
void GptCpu::norm_backward(const NormGrads& norm, const char* what) {
  const std::size_t C = static_cast<std::size_t>(model_.hidden), R = rows_here_;
  const Scratch s = scratch_layout(*this);
  const float* dout = my_rows(scratch_.data() + s.d_ln, C);
  const double elements = 4.0 * R * C + 2.0 * R;  // dout and the input read, dinp read and written
  if (!sp_ || norm.dweight == discarded_norm_grads()) {
    compute("norm backward", elements, [&] {
      layers::layernorm_backward(norm.dinp, norm.dweight, norm.dbias, dout, norm.inp, norm.weight, norm.mean, norm.rstd, R, C, cpu_);
    });
    return;
  }
  float* partial = scratch_.data() + s.d_norm;
  compute("norm backward", elements, [&] {
    std::fill(partial, partial + 2 * C, 0.0f);
    layers::layernorm_backward(norm.dinp, partial, partial + C, dout, norm.inp, norm.weight, norm.mean, norm.rstd, R, C, cpu_);
  });
  tp_allreduce(partial, 2 * C, what);
  compute("norm weights", 6.0 * C, [&] {
    for (std::size_t c = 0; c < C; ++c) norm.dweight[c] += partial[c], norm.dbias[c] += partial[C + c];
  });
}

// The loss's gradient through the LM head and the final norm into d_x; dlogits in place of the logits, from the
// forward's row statistics.
void GptCpu::head_backward(int set, const UnitPointers& u, float normaliser) {
  const ModelConfig& m = model_;
  const TensorShard& sh = shard();
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(m.hidden), R = rows_here_;
  const std::size_t V = static_cast<std::size_t>(sh.vocab_rows), last = static_cast<std::size_t>(m.layers) + 1;
  const HeadActs h = head_layout(*this);
  const Scratch s = scratch_layout(*this);
  float* head = head_base(set);
  float* g = scratch_.data();
  const int64_t rows = static_cast<int64_t>(N);
  const std::vector<int32_t>& targets = targets_[static_cast<std::size_t>(set)];
  const float* wte = u.params[0];
  float* dwte = u.grads[0];
  float* dlnf = u.grads[last];
  const layers::VocabSlice slice =
      tensor_parallel() ? layers::VocabSlice{N, static_cast<std::size_t>(sh.vocab_width), V,
                                             static_cast<std::size_t>(sh.vocab_begin), static_cast<std::size_t>(m.vocab)}
                        : layers::whole_vocab(N, V);
  float* logits = head + h.logits;
  compute("cross-entropy backward", 2.0 * N * V, [&] {
    layers::cross_entropy_loss_and_grad(head + h.losses, logits, logits, targets.data(), head + h.row_stats,
                                        head + h.row_stats + N, head + h.row_stats + 2 * N, normaliser, slice, cpu_);
    if (tensor_parallel() && V > static_cast<std::size_t>(sh.vocab_width))  // the padding rows of the last slice
      for (std::size_t i = 0; i < N; ++i) std::fill(logits + i * V + sh.vocab_width, logits + (i + 1) * V, 0.0f);
  });
  if (dwte) linear_backward_weight("lm head weight", {rows, m.hidden, sh.vocab_rows}, dwte, nullptr, logits, head + h.lnf, true);
  linear_backward_input("lm head input", {rows, m.hidden, sh.vocab_rows}, g + s.d_ln, logits, wte, false);
  sum_input_gradient("allreduce d lnf", "reduce-scatter d lnf");  // every slice of the vocabulary contributes
  compute("zero", 1.0 * R * C, [&] { std::fill(g + s.d_x, g + s.d_x + R * C, 0.0f); });
  float* discard = discarded_norm_grads();
  norm_backward({g + s.d_x, dlnf ? dlnf : discard, dlnf ? dlnf + C : discard + C, head + h.x_final, u.params[last],
                 head + h.lnf_mean, head + h.lnf_rstd},
                "allreduce d lnf weights");
}

// d_x, the gradient of layer l's output, becomes its input's: the MLP's branch, then the attention's.
void GptCpu::layer_backward(int set, int l, const UnitPointers& u) {
  const std::size_t C = static_cast<std::size_t>(model_.hidden), R = rows_here_;
  const Scratch s = scratch_layout(*this);
  float* g = scratch_.data();
  const LayerView x = view(set, l);
  const bool trains = u.grads[static_cast<std::size_t>(l) + 1] != nullptr;
  float* discard = discarded_norm_grads();
  using T = LayerTensor;
  // out = x_mid + fcproj(gelu(fc(ln2(x_mid))))
  mlp_backward(l, u, x);
  compute("copy", 2.0 * R * C, [&] { std::copy(g + s.d_x, g + s.d_x + R * C, g + s.d_mid); });  // the residual branch
  norm_backward({g + s.d_mid, trains ? grad(u, l, T::ln2_w) : discard, trains ? grad(u, l, T::ln2_b) : discard + C, x.x_mid,
                 param(u, l, T::ln2_w), x.ln2_mean, x.ln2_rstd},
                "allreduce d ln2 weights");
  // x_mid = x_in + attproj(attention(ln1(x_in)))
  attention_backward(l, u, x, g + s.d_mid);
  compute("copy", 2.0 * R * C, [&] { std::copy(g + s.d_mid, g + s.d_mid + R * C, g + s.d_x); });  // the residual branch
  norm_backward({g + s.d_x, trains ? grad(u, l, T::ln1_w) : discard, trains ? grad(u, l, T::ln1_b) : discard + C, x.x_in,
                 param(u, l, T::ln1_w), x.ln1_mean, x.ln1_rstd},
                "allreduce d ln1 weights");
  recomputed_for_[static_cast<std::size_t>(local(l))] = {0, 0, 0};
}

// d_x (the gradient reaching the MLP's output, my rows) through the MLP down and up into d_ln (ln2's output),
// summed over the tensor-parallel group. A frozen layer computes no weight gradients.
void GptCpu::mlp_backward(int l, const UnitPointers& u, const LayerView& x) {
  const ModelConfig& m = model_;
  const TensorShard& sh = shard();
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, F = static_cast<std::size_t>(sh.mlp);
  const Scratch s = scratch_layout(*this);
  float* g = scratch_.data();
  const int64_t rows = static_cast<int64_t>(N);
  const bool trains = u.grads[static_cast<std::size_t>(l) + 1] != nullptr;
  using T = LayerTensor;
  const float* d_out = sp_ ? gathered(g + s.d_x, g + s.d_full, "allgather d mlp out") : g + s.d_x;  // row-parallel: every row
  if (trains)
    linear_backward_weight("mlp down weight", {rows, sh.mlp, m.hidden}, grad(u, l, T::fc_proj_w), grad(u, l, T::fc_proj_b), d_out,
                           x.fch_gelu, true);
  linear_backward_input("mlp down input", {rows, sh.mlp, m.hidden}, g + s.d_fch_gelu, d_out, param(u, l, T::fc_proj_w), false);
  compute("gelu backward", 4.0 * N * F, [&] {
    std::fill(g + s.d_fch, g + s.d_fch + N * F, 0.0f);
    layers::gelu_backward(g + s.d_fch, x.fch, g + s.d_fch_gelu, N * F, cpu_);
  });
  if (trains)
    linear_backward_weight("mlp up weight", {rows, m.hidden, sh.mlp}, grad(u, l, T::fc_w), grad(u, l, T::fc_b), g + s.d_fch, x.ln2,
                           true);
  linear_backward_input("mlp up input", {rows, m.hidden, sh.mlp}, g + s.d_ln, g + s.d_fch, param(u, l, T::fc_w), false);
  sum_input_gradient("allreduce d ln2", "reduce-scatter d ln2");  // column-parallel MLP up: every slice contributes
}

// d_x, the gradient of the first layer's input, into the token and position tables' gradients.
void GptCpu::embedding_backward(int set, const UnitPointers& u) {
  const ModelConfig& m = model_;
  const TensorShard& sh = shard();
  const std::size_t N = static_cast<std::size_t>(batch_) * seq_, C = static_cast<std::size_t>(m.hidden);
  const std::size_t V = static_cast<std::size_t>(sh.vocab_rows);
  const Scratch s = scratch_layout(*this);
  float* g = scratch_.data();
  const std::vector<int32_t>& tokens = tokens_[static_cast<std::size_t>(set)];
  float* dwte = u.grads[0];
  if (!tensor_parallel()) {
    compute("embedding backward", 3.0 * N * C, [&] {
      layers::embedding_backward(dwte, dwte + V * C, g + s.d_x, tokens.data(), static_cast<std::size_t>(batch_),
                                 static_cast<std::size_t>(seq_), C, cpu_);
    });
    return;
  }
  // My rows of the token table from the tokens they hold; the position table, whole, from every row.
  const float* d_embedding = sp_ ? gathered(g + s.d_x, g + s.d_full, "allgather d embedding") : g + s.d_x;
  const std::size_t begin = static_cast<std::size_t>(sh.vocab_begin), width = static_cast<std::size_t>(sh.vocab_width);
  float* dwpe = dwte + V * C;
  compute("embedding backward", 5.0 * N * C, [&] {
    for (std::size_t i = 0; i < N; ++i) {
      const float* d = d_embedding + i * C;
      const std::size_t t = static_cast<std::size_t>(tokens[i]);
      if (t >= begin && t < begin + width)
        for (std::size_t c = 0; c < C; ++c) dwte[(t - begin) * C + c] += d[c];
      float* pos = dwpe + (i % static_cast<std::size_t>(seq_)) * C;
      for (std::size_t c = 0; c < C; ++c) pos[c] += d[c];
    }
  });
}

}  // namespace strata::train
