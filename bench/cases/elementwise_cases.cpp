#include "bench/cases/elementwise_cases.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include "kernels/layers_reference.h"

namespace strata::elementwise {

namespace {

namespace ref = layers::reference;

// fp32 against float64: a relative error of the rounding of a few operations, floored by the output's RMS so an
// element near zero is not held to a relative bound.
constexpr double kTolerance = 2e-5;

const layers::AdamWConfig kAdamW{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};

void fill(float* p, std::size_t n, std::mt19937_64& rng, float low = -1, float high = 1) {
  std::uniform_real_distribution<float> u(low, high);
  for (std::size_t i = 0; i < n; ++i) p[i] = u(rng);
}

void compare(CheckResult& r, const float* got, const std::vector<double>& want) {
  double squares = 0;
  for (double w : want) squares += w * w;
  const double rms = want.empty() ? 0 : std::sqrt(squares / static_cast<double>(want.size()));
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double ratio = std::abs(static_cast<double>(got[i]) - want[i]) / (kTolerance * (std::abs(want[i]) + rms) + 1e-30);
    if (!(ratio <= 1)) ++r.wrong;  // NaN counts as wrong
    r.worst_ratio = std::max(r.worst_ratio, std::isnan(ratio) ? INFINITY : ratio);
  }
  r.checked += static_cast<std::int64_t>(want.size());
}

std::vector<double> widen(const float* p, std::size_t n) { return std::vector<double>(p, p + n); }

}  // namespace

const std::vector<std::string>& kernel_names() {
  static const std::vector<std::string> names = {"layernorm_forward", "layernorm_backward", "gelu_forward",
                                                 "gelu_backward",     "residual_forward",   "copy",
                                                 "permute_qkv",       "permute_heads",      "add_bias",
                                                 "fill_bias",         "bias_gradient",
                                                 "accumulate",        "adamw",
                                                 "cross_entropy_forward", "cross_entropy_row_max",
                                                 "cross_entropy_row_sum_exp", "cross_entropy_backward",
                                                 "squared_norm"};
  return names;
}

double traced_elements(const std::string& kernel, const LayerShape& s) {
  const double R = static_cast<double>(s.rows), C = static_cast<double>(s.channels), F = static_cast<double>(s.mlp);
  if (kernel == "layernorm_forward") return 2 * R * C + 2 * R;   // input read, output written, statistics written
  if (kernel == "layernorm_backward") return 4 * R * C + 2 * R;  // dout and input read, dinp read and written
  if (kernel == "gelu_forward") return 2 * R * F;
  if (kernel == "gelu_backward") return 4 * R * F;  // input and dout read, dinp read and written
  if (kernel == "residual_forward") return 3 * R * C;
  if (kernel == "copy") return 2 * R * C;
  const double D = static_cast<double>(s.head_dim);
  if (kernel == "permute_qkv") return 2 * R * static_cast<double>(s.heads + 2 * s.kv_heads) * D;
  if (kernel == "permute_heads") return 2 * R * static_cast<double>(s.heads) * D;
  if (kernel == "add_bias") return 2 * R * C;  // the output read and written; the bias stays in cache
  if (kernel == "fill_bias") return 2 * R * C;  // the output written, and read by the GEMM that adds to it
  if (kernel == "bias_gradient") return R * C + 2 * C;  // the gradient read; the sums read and written
  if (kernel == "accumulate") return 3 * static_cast<double>(s.layer_parameters);
  if (kernel == "adamw") return 7 * static_cast<double>(s.layer_parameters);  // parameters, moments: read, written; gradient read
  if (kernel == "squared_norm") return static_cast<double>(s.layer_parameters);
  // The loss over this rank's vocabulary columns V: the logits read (and the gradient written), a few values per row.
  const double V = static_cast<double>(s.vocab);
  if (kernel == "cross_entropy_forward") return R * V + 4 * R;  // row max, sum, target logit and loss per row
  if (kernel == "cross_entropy_row_max") return R * V + R;
  if (kernel == "cross_entropy_row_sum_exp") return R * V + 2 * R;  // the row max read, the sum written
  if (kernel == "cross_entropy_backward") return 2 * R * V;
  throw std::invalid_argument("unknown elementwise kernel '" + kernel + "'");
}

bool operands_leave_core_caches(const std::string& kernel) { return kernel == "adamw" || kernel == "squared_norm"; }

Problem::Problem(std::string kernel, const LayerShape& shape, std::uint64_t seed, int threads)
    : kernel_(std::move(kernel)), shape_(shape), options_{threads} {
  (void)traced_elements(kernel_, shape_);
  const std::size_t R = static_cast<std::size_t>(shape.rows), C = static_cast<std::size_t>(shape.channels),
                    F = static_cast<std::size_t>(shape.mlp), P = static_cast<std::size_t>(shape.layer_parameters);
  const std::size_t H = static_cast<std::size_t>(shape.heads), KVH = static_cast<std::size_t>(shape.kv_heads),
                    D = static_cast<std::size_t>(shape.head_dim);
  const std::size_t V = static_cast<std::size_t>(shape.vocab);
  std::mt19937_64 rng(seed);
  auto buffer = [&](std::size_t n, float low = -1, float high = 1) {
    PageAlignedFloats p = page_aligned_floats(n);
    fill(p.get(), n, rng, low, high);
    return p;
  };
  if (kernel_ == "layernorm_forward") {
    a_ = buffer(R * C), b_ = buffer(C), c_ = buffer(C);
    x_ = buffer(R * C), y_ = buffer(R), z_ = buffer(R);
  } else if (kernel_ == "layernorm_backward") {
    a_ = buffer(R * C), b_ = buffer(R * C), c_ = buffer(C);
    x_ = buffer(R * C), y_ = buffer(2 * C), z_ = buffer(2 * R);
    // The forward's statistics of the input, which the backward reads.
    PageAlignedFloats out = page_aligned_floats(R * C), bias = buffer(C);
    layers::layernorm_forward(out.get(), z_.get(), z_.get() + R, b_.get(), c_.get(), bias.get(), R, C, options_);
  } else if (kernel_ == "gelu_forward") {
    a_ = buffer(R * F, -4, 4), x_ = buffer(R * F);
  } else if (kernel_ == "gelu_backward") {
    a_ = buffer(R * F, -4, 4), b_ = buffer(R * F), x_ = buffer(R * F);
  } else if (kernel_ == "residual_forward") {
    a_ = buffer(R * C), b_ = buffer(R * C), x_ = buffer(R * C);
  } else if (kernel_ == "copy") {
    a_ = buffer(R * C), x_ = buffer(R * C);
  } else if (kernel_ == "permute_qkv") {  // qkv rows a to the heads' tensors x (q), y (k), z (v)
    a_ = buffer(R * qkv_channels()), x_ = buffer(R * H * D), y_ = buffer(R * KVH * D), z_ = buffer(R * KVH * D);
  } else if (kernel_ == "permute_heads") {  // heads a to merged rows x
    a_ = buffer(R * H * D), x_ = buffer(R * H * D);
  } else if (kernel_ == "add_bias") {  // x += bias b, x starting as a
    a_ = buffer(R * C), b_ = buffer(C), x_ = buffer(R * C);
  } else if (kernel_ == "fill_bias") {  // every row of x = bias b
    b_ = buffer(C), x_ = buffer(R * C);
  } else if (kernel_ == "bias_gradient") {  // x += column sums of a, x starting as b
    a_ = buffer(R * C), b_ = buffer(C), x_ = buffer(C);
  } else if (kernel_ == "accumulate") {  // x += a, x starting as b
    a_ = buffer(P), b_ = buffer(P), x_ = buffer(P);
  } else if (kernel_ == "squared_norm") {  // sum of a's squares into x[0]
    a_ = buffer(P), x_ = buffer(1);
  } else if (kernel_.starts_with("cross_entropy")) {
    // Logits a (R, V); outputs x (the kernel's first: losses, a row statistic, or the logits' gradient, which the
    // step writes over the logits: x starts as a copy of them), y (losses, beside the gradient), and the row statistics
    // b (max, sum of exponentials, target logit) as the forward leaves them for the kernels that read them.
    targets_.resize(R);
    std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(V) - 1);
    for (std::size_t i = 0; i < R; ++i) targets_[i] = i % 5 == 4 ? -1 : token(rng);
    normaliser_ = static_cast<float>(layers::counted_targets(targets_.data(), R));
    a_ = buffer(R * V, -4, 4), b_ = buffer(3 * R);
    PageAlignedFloats losses = page_aligned_floats(R);
    layers::softmax_cross_entropy(losses.get(), nullptr, b_.get(), a_.get(), targets_.data(), 1.0f, vocab_slice(), options_);
    if (kernel_ == "cross_entropy_forward") x_ = buffer(R), y_ = buffer(3 * R);
    else if (kernel_ == "cross_entropy_backward") x_ = buffer(R * V), y_ = buffer(R), std::copy(a_.get(), a_.get() + R * V, x_.get());
    else x_ = buffer(R);
  } else {  // adamw: parameters x, gradients a, moments y (first) and z (second, positive)
    x_ = buffer(P), a_ = buffer(P, -1e-2f, 1e-2f), y_ = buffer(P, -1e-3f, 1e-3f), z_ = buffer(P, 1e-6f, 1e-4f);
    x0_.assign(x_.get(), x_.get() + P);
    y0_.assign(y_.get(), y_.get() + P), z0_.assign(z_.get(), z_.get() + P);
  }
}

layers::VocabSlice Problem::vocab_slice() const {
  return layers::whole_vocab(static_cast<std::size_t>(shape_.rows), static_cast<std::size_t>(shape_.vocab));
}

void Problem::run() {
  const std::size_t R = static_cast<std::size_t>(shape_.rows), C = static_cast<std::size_t>(shape_.channels),
                    F = static_cast<std::size_t>(shape_.mlp), P = static_cast<std::size_t>(shape_.layer_parameters);
  if (kernel_ == "layernorm_forward")
    layers::layernorm_forward(x_.get(), y_.get(), z_.get(), a_.get(), b_.get(), c_.get(), R, C, options_);
  else if (kernel_ == "layernorm_backward")
    layers::layernorm_backward(x_.get(), y_.get(), y_.get() + C, a_.get(), b_.get(), c_.get(), z_.get(), z_.get() + R, R, C,
                               options_);
  else if (kernel_ == "gelu_forward")
    layers::gelu_forward(x_.get(), a_.get(), R * F, options_);
  else if (kernel_ == "gelu_backward")
    layers::gelu_backward(x_.get(), a_.get(), b_.get(), R * F, options_);
  else if (kernel_ == "residual_forward")
    layers::residual_forward(x_.get(), a_.get(), b_.get(), R * C, options_);
  else if (kernel_ == "copy")
    std::copy(a_.get(), a_.get() + R * C, x_.get());
  else if (kernel_ == "permute_qkv")
    layers::permute_qkv(a_.get(), x_.get(), y_.get(), z_.get(), 1, static_cast<int>(R), static_cast<int>(shape_.heads),
                        static_cast<int>(shape_.kv_heads), static_cast<int>(shape_.head_dim), true);
  else if (kernel_ == "permute_heads")
    layers::permute_heads(a_.get(), x_.get(), 1, static_cast<int>(R), static_cast<int>(shape_.heads),
                          static_cast<int>(shape_.head_dim), true);
  else if (kernel_ == "add_bias")
    layers::add_bias(x_.get(), b_.get(), R, C);
  else if (kernel_ == "fill_bias")
    layers::fill_bias(x_.get(), b_.get(), R, C);
  else if (kernel_ == "bias_gradient")
    layers::bias_gradient(x_.get(), a_.get(), R, C, true);  // gradients accumulate over micro-batches
  else if (kernel_ == "accumulate")
    layers::accumulate(x_.get(), a_.get(), P, options_);
  else if (kernel_ == "squared_norm")
    x_[0] = static_cast<float>(layers::squared_norm(a_.get(), P, options_));
  else if (kernel_ == "cross_entropy_forward")
    layers::softmax_cross_entropy(x_.get(), nullptr, y_.get(), a_.get(), targets_.data(), 1.0f, vocab_slice(), options_);
  else if (kernel_ == "cross_entropy_row_max")
    layers::cross_entropy_row_max(x_.get(), a_.get(), vocab_slice(), options_);
  else if (kernel_ == "cross_entropy_row_sum_exp")
    layers::cross_entropy_row_sum_exp(x_.get(), a_.get(), b_.get(), vocab_slice(), options_);
  else if (kernel_ == "cross_entropy_backward")
    // In place, as the step: a timed run after the first reads the gradient as logits (finite, below the row max).
    layers::cross_entropy_loss_and_grad(y_.get(), x_.get(), x_.get(), targets_.data(), b_.get(), b_.get() + R, b_.get() + 2 * R,
                                        normaliser_, vocab_slice(), options_);
  else
    layers::adamw_update(x_.get(), a_.get(), y_.get(), z_.get(), P, kAdamW, step_, 1.0f, options_);
}

void Problem::prepare_check() {
  const std::size_t R = static_cast<std::size_t>(shape_.rows), C = static_cast<std::size_t>(shape_.channels),
                    F = static_cast<std::size_t>(shape_.mlp);
  const float nan = std::nanf("");
  if (kernel_ == "layernorm_forward") {
    std::fill(x_.get(), x_.get() + R * C, nan), std::fill(y_.get(), y_.get() + R, nan), std::fill(z_.get(), z_.get() + R, nan);
  } else if (kernel_ == "layernorm_backward") {  // accumulates
    std::fill(x_.get(), x_.get() + R * C, 0.0f), std::fill(y_.get(), y_.get() + 2 * C, 0.0f);
  } else if (kernel_ == "gelu_forward") {
    std::fill(x_.get(), x_.get() + R * F, nan);
  } else if (kernel_ == "gelu_backward") {  // accumulates
    std::fill(x_.get(), x_.get() + R * F, 0.0f);
  } else if (kernel_ == "residual_forward" || kernel_ == "copy") {
    std::fill(x_.get(), x_.get() + R * C, nan);
  } else if (kernel_ == "permute_qkv") {
    const std::size_t H = static_cast<std::size_t>(shape_.heads), KVH = static_cast<std::size_t>(shape_.kv_heads),
                      D = static_cast<std::size_t>(shape_.head_dim);
    std::fill(x_.get(), x_.get() + R * H * D, nan), std::fill(y_.get(), y_.get() + R * KVH * D, nan);
    std::fill(z_.get(), z_.get() + R * KVH * D, nan);
  } else if (kernel_ == "permute_heads") {
    std::fill(x_.get(), x_.get() + R * static_cast<std::size_t>(shape_.heads * shape_.head_dim), nan);
  } else if (kernel_ == "add_bias") {  // accumulates onto a
    std::copy(a_.get(), a_.get() + R * C, x_.get());
  } else if (kernel_ == "fill_bias") {
    std::fill(x_.get(), x_.get() + R * C, nan);
  } else if (kernel_ == "bias_gradient") {  // accumulates onto b
    std::copy(b_.get(), b_.get() + C, x_.get());
  } else if (kernel_ == "accumulate") {  // accumulates onto b
    std::copy(b_.get(), b_.get() + static_cast<std::size_t>(shape_.layer_parameters), x_.get());
  } else if (kernel_ == "squared_norm") {
    x_[0] = nan;
  } else if (kernel_.starts_with("cross_entropy")) {
    const std::size_t V = static_cast<std::size_t>(shape_.vocab);
    if (kernel_ == "cross_entropy_forward") std::fill(x_.get(), x_.get() + R, nan), std::fill(y_.get(), y_.get() + 3 * R, nan);
    else if (kernel_ == "cross_entropy_backward") std::copy(a_.get(), a_.get() + R * V, x_.get()), std::fill(y_.get(), y_.get() + R, nan);
    else std::fill(x_.get(), x_.get() + R, nan);
  } else {
    std::copy(x0_.begin(), x0_.end(), x_.get()), std::copy(y0_.begin(), y0_.end(), y_.get());
    std::copy(z0_.begin(), z0_.end(), z_.get());
  }
}

CheckResult Problem::check() const {
  const std::size_t R = static_cast<std::size_t>(shape_.rows), C = static_cast<std::size_t>(shape_.channels),
                    F = static_cast<std::size_t>(shape_.mlp), P = static_cast<std::size_t>(shape_.layer_parameters);
  CheckResult r;
  if (kernel_ == "layernorm_forward") {
    std::vector<double> out(R * C), mean(R), rstd(R);
    ref::layernorm_forward(out.data(), mean.data(), rstd.data(), widen(a_.get(), R * C).data(), widen(b_.get(), C).data(),
                           widen(c_.get(), C).data(), R, C, layers::kLayerNormEps);
    compare(r, x_.get(), out), compare(r, y_.get(), mean), compare(r, z_.get(), rstd);
  } else if (kernel_ == "layernorm_backward") {
    std::vector<double> dinp(R * C), dweight(C), dbias(C);
    ref::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), widen(a_.get(), R * C).data(),
                            widen(b_.get(), R * C).data(), widen(c_.get(), C).data(), R, C, layers::kLayerNormEps);
    compare(r, x_.get(), dinp), compare(r, y_.get(), dweight), compare(r, y_.get() + C, dbias);
  } else if (kernel_ == "gelu_forward" || kernel_ == "gelu_backward") {
    std::vector<double> want(R * F);
    for (std::size_t i = 0; i < R * F; ++i)
      want[i] = kernel_ == "gelu_forward" ? ref::gelu(a_[i]) : ref::gelu_derivative(a_[i]) * static_cast<double>(b_[i]);
    compare(r, x_.get(), want);
  } else if (kernel_ == "residual_forward" || kernel_ == "copy") {
    std::vector<double> want(R * C);
    for (std::size_t i = 0; i < R * C; ++i)
      want[i] = static_cast<double>(a_[i]) + (kernel_ == "copy" ? 0.0 : static_cast<double>(b_[i]));
    compare(r, x_.get(), want);
  } else if (kernel_ == "permute_qkv" || kernel_ == "permute_heads") {
    // Row t of the packed layout holds head h's D elements at h D (q first, then k and v for permute_qkv); head h's
    // tensor holds them at (h T + t) D.
    const std::size_t H = static_cast<std::size_t>(shape_.heads), KVH = static_cast<std::size_t>(shape_.kv_heads),
                      D = static_cast<std::size_t>(shape_.head_dim);
    if (kernel_ == "permute_heads") {  // heads a (H, T, D) to rows x (T, H D)
      std::vector<double> want(R * H * D);
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t t = 0; t < R; ++t)
          for (std::size_t d = 0; d < D; ++d) want[(t * H + h) * D + d] = a_[(h * R + t) * D + d];
      compare(r, x_.get(), want);
    } else {  // rows a (T, (H + 2 KVH) D) to q x (H, T, D), k y and v z (KVH, T, D)
      const std::size_t Q = (H + 2 * KVH) * D;
      std::vector<double> q(R * H * D), k(R * KVH * D), v(R * KVH * D);
      for (std::size_t t = 0; t < R; ++t)
        for (std::size_t d = 0; d < D; ++d) {
          for (std::size_t h = 0; h < H; ++h) q[(h * R + t) * D + d] = a_[t * Q + h * D + d];
          for (std::size_t g = 0; g < KVH; ++g) {
            k[(g * R + t) * D + d] = a_[t * Q + (H + g) * D + d];
            v[(g * R + t) * D + d] = a_[t * Q + (H + KVH + g) * D + d];
          }
        }
      compare(r, x_.get(), q), compare(r, y_.get(), k), compare(r, z_.get(), v);
    }
  } else if (kernel_ == "add_bias") {
    std::vector<double> want(R * C);
    for (std::size_t i = 0; i < R; ++i)
      for (std::size_t c = 0; c < C; ++c) want[i * C + c] = static_cast<double>(a_[i * C + c]) + static_cast<double>(b_[c]);
    compare(r, x_.get(), want);
  } else if (kernel_ == "fill_bias") {
    std::vector<double> want(R * C);
    for (std::size_t i = 0; i < R * C; ++i) want[i] = b_[i % C];
    compare(r, x_.get(), want);
  } else if (kernel_ == "bias_gradient") {
    std::vector<double> want(b_.get(), b_.get() + C);
    for (std::size_t i = 0; i < R; ++i)
      for (std::size_t c = 0; c < C; ++c) want[c] += static_cast<double>(a_[i * C + c]);
    compare(r, x_.get(), want);
  } else if (kernel_ == "accumulate") {
    std::vector<double> want(P);
    for (std::size_t i = 0; i < P; ++i) want[i] = static_cast<double>(b_[i]) + static_cast<double>(a_[i]);
    compare(r, x_.get(), want);
  } else if (kernel_ == "squared_norm") {
    double squares = 0;
    for (std::size_t i = 0; i < P; ++i) squares += static_cast<double>(a_[i]) * static_cast<double>(a_[i]);
    compare(r, x_.get(), {squares});
  } else if (kernel_.starts_with("cross_entropy")) {
    const std::size_t V = static_cast<std::size_t>(shape_.vocab);
    // Each row's statistics in float64: its max, its sum of exponentials from the fp32 max the kernels read (b), the
    // target's logit (0 for a row that does not count); the losses and gradient from the float64 reference.
    const bool gradient = kernel_ == "cross_entropy_backward";
    std::vector<double> row_max(R), row_sum(R), target_logit(R), losses(R), dlogits(gradient ? R * V : 0);
    for (std::size_t i = 0; i < R; ++i) {
      const float* row = a_.get() + i * V;
      row_max[i] = *std::max_element(row, row + V);
      for (std::size_t c = 0; c < V; ++c) row_sum[i] += std::exp(static_cast<double>(row[c]) - b_[i]);
      target_logit[i] = targets_[i] < 0 ? 0.0 : row[targets_[i]];
    }
    ref::cross_entropy(losses.data(), gradient ? dlogits.data() : nullptr, widen(a_.get(), R * V).data(), targets_.data(),
                       R, V, normaliser_);
    if (kernel_ == "cross_entropy_forward") {
      compare(r, x_.get(), losses), compare(r, y_.get(), row_max), compare(r, y_.get() + R, row_sum);
      compare(r, y_.get() + 2 * R, target_logit);
    } else if (kernel_ == "cross_entropy_row_max") {
      compare(r, x_.get(), row_max);
    } else if (kernel_ == "cross_entropy_row_sum_exp") {
      compare(r, x_.get(), row_sum);
    } else {
      compare(r, x_.get(), dlogits), compare(r, y_.get(), losses);
    }
  } else {
    std::vector<double> params(x0_.begin(), x0_.end()), m(y0_.begin(), y0_.end()), v(z0_.begin(), z0_.end());
    ref::adamw_update(params.data(), widen(a_.get(), P).data(), m.data(), v.data(), P,
                      kAdamW.learning_rate, kAdamW.beta1, kAdamW.beta2, kAdamW.eps, kAdamW.weight_decay, step_, 1.0);
    compare(r, x_.get(), params), compare(r, y_.get(), m), compare(r, z_.get(), v);
  }
  return r;
}

void Problem::corrupt_output() { x_[0] += 1.0f + std::abs(x_[0]); }

}  // namespace strata::elementwise
