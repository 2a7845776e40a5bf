// CPU implementations of the training-step kernels of layers.h: llm.c's train_gpt2.c layers as plain loops
// that the compiler vectorises (omp simd where a reduction would otherwise stay scalar), parallel over rows
// with OpenMP where the work is large enough to pay for a parallel region.
#include "kernels/layers.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define STRATA_HAVE_MXCSR 1
#endif

namespace strata::layers {
namespace {

// A parallel region costs a few microseconds; below this many elements per thread it is not worth one.
constexpr std::size_t kMinElementsPerThread = std::size_t{1} << 14;
// Parameter-gradient reductions are split over blocks of channels: one 64-byte cache line of floats, so two
// threads never write the same line.
constexpr std::size_t kChannelBlock = 16;

int threads_for(std::size_t elements, const CpuOptions& options) {
  const std::size_t useful = std::max<std::size_t>(1, elements / kMinElementsPerThread);
  return static_cast<int>(std::clamp<std::size_t>(useful, 1, static_cast<std::size_t>(std::max(1, options.threads))));
}

void require(bool condition, const char* message) {
  if (!condition) throw std::invalid_argument(message);
}

void require_options(const CpuOptions& options) { require(options.threads >= 1, "CpuOptions.threads must be >= 1"); }

void require_slice(const VocabSlice& s) {
  if (std::string problem = validate(s); !problem.empty()) throw std::invalid_argument(problem);
}

void require_targets(const std::int32_t* targets, const VocabSlice& s) {
  for (std::size_t i = 0; i < s.rows; ++i) {
    if (targets[i] >= 0 && static_cast<std::size_t>(targets[i]) >= s.vocab) {
      throw std::invalid_argument("cross-entropy: target " + std::to_string(targets[i]) + " of row " +
                                  std::to_string(i) + " is outside the vocabulary of " + std::to_string(s.vocab));
    }
  }
}

// The target's column within the slice, or -1 when the row does not count or its target lies elsewhere.
long local_column(std::int32_t target, const VocabSlice& s) {
  if (target < 0) return -1;
  const auto t = static_cast<std::size_t>(target);
  if (t < s.begin || t >= s.begin + s.width) return -1;
  return static_cast<long>(t - s.begin);
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

// condition ? if_true : if_false through bit masks. Written as a conditional, GCC moves the arithmetic feeding one
// side into a branch of its own (partial redundancy elimination folds the clamped side to a constant), and a loop
// with a branch does not vectorise: the exponential below and GELU ran scalar, about 12 ns an element.
inline float select(bool condition, float if_true, float if_false) {
  const std::uint32_t mask = -static_cast<std::uint32_t>(condition);
  return std::bit_cast<float>((std::bit_cast<std::uint32_t>(if_true) & mask) |
                              (std::bit_cast<std::uint32_t>(if_false) & ~mask));
}

// e^x for x <= 0, as plain arithmetic so that the loops calling it vectorise: libm's expf stays scalar
// without -ffast-math, and at ~10 ns an element it would dominate the cross-entropy over a 50k vocabulary.
// x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so the reduction is exact to fp32), e^r by its Taylor
// series to r^7 (truncation below 1e-8 relative), 2^n placed in the exponent bits. Error a few ulp.
// Results below the normal range are flushed to zero; NaN propagates.
inline float exp_nonpositive(float x) {
  constexpr float kMinArgument = -87.0f;  // e^-87 = 1.6e-38, just above the smallest normal float
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2High = 0.693145751953125f;  // ln 2 to 16 bits: n * kLn2High is exact for |n| < 2^8
  constexpr float kLn2Low = 1.42860682030941723e-6f;
  constexpr float kRoundingShift = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const bool underflows = x < kMinArgument;
  const float clamped = select(underflows, kMinArgument, x);
  const float n = (clamped * kLog2e + kRoundingShift) - kRoundingShift;
  const float r = (clamped - n * kLn2High) - n * kLn2Low;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float two_to_n = std::bit_cast<float>(static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23);
  return select(underflows, 0.0f, p * two_to_n);
}

// GELU through the logistic function: (1 + tanh(u)) / 2 = sigmoid(2u), so gelu(x) = x * sigmoid(2u). Written
// with e = e^(-2|u|) <= 1 on both sides of zero, neither sigmoid(2u) nor 1 - sigmoid(2u) cancels, where
// 1 + tanh(u) loses every digit for x << 0 in fp32.
struct GeluTerms {
  float sigmoid;            // sigmoid(2u) = (1 + tanh(u)) / 2
  float one_minus_sigmoid;  // 1 - sigmoid(2u)
  float du_dx;
};
inline GeluTerms gelu_terms(float x) {
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  const float e = exp_nonpositive(-2.0f * std::abs(u));
  const float large = 1.0f / (1.0f + e), small = e / (1.0f + e);
  const bool positive = u >= 0.0f;
  return GeluTerms{select(positive, large, small), select(positive, small, large),
                   kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x)};
}

}  // namespace

// ---- layer norm ----------------------------------------------------------------------------------------

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, std::size_t rows, std::size_t channels, const CpuOptions& options,
                       float eps) {
  require_options(options);
  require(channels >= 1, "layernorm: channels must be >= 1");
  require(eps > 0.0f, "layernorm: eps must be > 0");
  const long n_rows = static_cast<long>(rows);
#pragma omp parallel for num_threads(threads_for(rows * channels, options)) schedule(static)
  for (long r = 0; r < n_rows; ++r) {
    const float* x = inp + r * channels;
    float* y = out + r * channels;
    // Two passes (mean, then the mean square of deviations) rather than E[x^2] - E[x]^2, which cancels
    // catastrophically for rows far from zero.
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (std::size_t c = 0; c < channels; ++c) sum += x[c];
    const float m = sum / static_cast<float>(channels);
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (std::size_t c = 0; c < channels; ++c) squares += (x[c] - m) * (x[c] - m);
    const float s = 1.0f / std::sqrt(squares / static_cast<float>(channels) + eps);
    for (std::size_t c = 0; c < channels; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, std::size_t rows,
                        std::size_t channels, const CpuOptions& options) {
  require_options(options);
  require(channels >= 1, "layernorm: channels must be >= 1");
  const int threads = threads_for(rows * channels, options);
  const long n_rows = static_cast<long>(rows);
  // Input gradient, row by row: with norm = (x - mean) * rstd and g = weight * dout,
  // dx = rstd * (g - mean(g) - norm * mean(g * norm)).
#pragma omp parallel for num_threads(threads) schedule(static)
  for (long r = 0; r < n_rows; ++r) {
    const float* x = inp + r * channels;
    const float* dy = dout + r * channels;
    float* dx = dinp + r * channels;
    const float m = mean[r];
    const float s = rstd[r];
    float g_sum = 0.0f;
    float g_norm_sum = 0.0f;
#pragma omp simd reduction(+ : g_sum, g_norm_sum)
    for (std::size_t c = 0; c < channels; ++c) {
      const float g = weight[c] * dy[c];
      g_sum += g;
      g_norm_sum += g * (x[c] - m) * s;
    }
    const float g_mean = g_sum / static_cast<float>(channels);
    const float g_norm_mean = g_norm_sum / static_cast<float>(channels);
    for (std::size_t c = 0; c < channels; ++c) {
      const float norm = (x[c] - m) * s;
      dx[c] += s * (weight[c] * dy[c] - g_mean - norm * g_norm_mean);
    }
  }
  // Parameter gradients sum over rows; each task owns a block of channels and walks every row in order, so
  // there are no write races and the sums do not depend on the thread count.
  const long blocks = static_cast<long>((channels + kChannelBlock - 1) / kChannelBlock);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (long block = 0; block < blocks; ++block) {
    const std::size_t c0 = static_cast<std::size_t>(block) * kChannelBlock;
    const std::size_t c1 = std::min(channels, c0 + kChannelBlock);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* x = inp + r * channels;
      const float* dy = dout + r * channels;
      for (std::size_t c = c0; c < c1; ++c) {
        dbias[c] += dy[c];
        dweight[c] += (x[c] - mean[r]) * rstd[r] * dy[c];
      }
    }
  }
}

// ---- GELU ----------------------------------------------------------------------------------------------

void gelu_forward(float* out, const float* inp, std::size_t n, const CpuOptions& options) {
  require_options(options);
  const long count = static_cast<long>(n);
#pragma omp parallel for simd num_threads(threads_for(n, options)) schedule(static)
  for (long i = 0; i < count; ++i) {
    out[i] = inp[i] * gelu_terms(inp[i]).sigmoid;
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n, const CpuOptions& options) {
  require_options(options);
  const long count = static_cast<long>(n);
#pragma omp parallel for simd num_threads(threads_for(n, options)) schedule(static)
  for (long i = 0; i < count; ++i) {
    // d/dx [x * sigmoid(2u)] = sigmoid(2u) + x * 2 sigmoid(2u) (1 - sigmoid(2u)) du/dx.
    const float x = inp[i];
    const GeluTerms t = gelu_terms(x);
    dinp[i] += (t.sigmoid + 2.0f * x * t.sigmoid * t.one_minus_sigmoid * t.du_dx) * dout[i];
  }
}

// ---- softmax cross-entropy -----------------------------------------------------------------------------

VocabSlice whole_vocab(std::size_t rows, std::size_t vocab, std::size_t padded_stride) {
  return VocabSlice{rows, vocab, padded_stride == 0 ? vocab : padded_stride, 0, vocab};
}

std::string validate(const VocabSlice& s) {
  if (s.width < 1) return "vocabulary slice: width must be >= 1";
  if (s.stride < s.width) return "vocabulary slice: stride must be >= width";
  if (s.begin + s.width > s.vocab) return "vocabulary slice: columns [begin, begin + width) must lie in the vocabulary";
  return "";
}

void cross_entropy_row_max(float* row_max, const float* logits, const VocabSlice& slice, const CpuOptions& options) {
  require_options(options);
  require_slice(slice);
  const long rows = static_cast<long>(slice.rows);
#pragma omp parallel for num_threads(threads_for(slice.rows * slice.width, options)) schedule(static)
  for (long r = 0; r < rows; ++r) {
    const float* x = logits + r * slice.stride;
    float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
    for (std::size_t c = 0; c < slice.width; ++c) m = x[c] > m ? x[c] : m;
    row_max[r] = m;
  }
}

void cross_entropy_row_sum_exp(float* row_sum, const float* logits, const float* row_max, const VocabSlice& slice,
                               const CpuOptions& options) {
  require_options(options);
  require_slice(slice);
  const long rows = static_cast<long>(slice.rows);
#pragma omp parallel for num_threads(threads_for(slice.rows * slice.width, options)) schedule(static)
  for (long r = 0; r < rows; ++r) {
    const float* x = logits + r * slice.stride;
    const float m = row_max[r];
    // fp32 sums over blocks of columns, added up in double: one fp32 running sum over a GPT-2 vocabulary
    // (50257 terms) could lose the loss's 4th digit, and a double sum of every term runs at half the speed.
    constexpr std::size_t kBlock = 1024;
    double sum = 0.0;
    for (std::size_t c0 = 0; c0 < slice.width; c0 += kBlock) {
      const std::size_t c1 = std::min(slice.width, c0 + kBlock);
      float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
      for (std::size_t c = c0; c < c1; ++c) block_sum += exp_nonpositive(x[c] - m);
      sum += block_sum;
    }
    row_sum[r] = static_cast<float>(sum);
  }
}

void cross_entropy_target_logit(float* target_logit, const float* logits, const std::int32_t* targets,
                                const VocabSlice& slice, const CpuOptions& options) {
  require_options(options);
  require_slice(slice);
  require_targets(targets, slice);
  for (std::size_t r = 0; r < slice.rows; ++r) {
    const long column = local_column(targets[r], slice);
    target_logit[r] = column < 0 ? 0.0f : logits[r * slice.stride + static_cast<std::size_t>(column)];
  }
}

void cross_entropy_loss_and_grad(float* losses, float* dlogits, const float* logits, const std::int32_t* targets,
                                 const float* row_max, const float* row_sum, const float* target_logit,
                                 float normaliser, const VocabSlice& slice, const CpuOptions& options) {
  require_options(options);
  require_slice(slice);
  require_targets(targets, slice);
  require(std::isfinite(normaliser) && normaliser > 0.0f, "cross-entropy: normaliser must be finite and > 0");
  const long rows = static_cast<long>(slice.rows);
  const float inv_normaliser = 1.0f / normaliser;
#pragma omp parallel for num_threads(threads_for(slice.rows * slice.width, options)) schedule(static)
  for (long r = 0; r < rows; ++r) {
    const bool counts = targets[r] >= 0;
    losses[r] = counts ? static_cast<float>(std::log(static_cast<double>(row_sum[r])) + row_max[r] - target_logit[r])
                       : 0.0f;
    if (dlogits == nullptr) continue;
    const float* x = logits + r * slice.stride;
    float* dx = dlogits + r * slice.stride;
    if (!counts) {
      for (std::size_t c = 0; c < slice.width; ++c) dx[c] = 0.0f;
      continue;
    }
    const float m = row_max[r];
    const float scale = inv_normaliser / row_sum[r];
    for (std::size_t c = 0; c < slice.width; ++c) dx[c] = exp_nonpositive(x[c] - m) * scale;
    if (const long column = local_column(targets[r], slice); column >= 0) dx[column] -= inv_normaliser;
  }
}

std::size_t counted_targets(const std::int32_t* targets, std::size_t rows) {
  return static_cast<std::size_t>(std::count_if(targets, targets + rows, [](std::int32_t t) { return t >= 0; }));
}

double softmax_cross_entropy(float* losses, float* dlogits, float* row_stats, const float* logits,
                             const std::int32_t* targets, float normaliser, const VocabSlice& slice,
                             const CpuOptions& options) {
  require(slice.begin == 0 && slice.width == slice.vocab,
          "softmax_cross_entropy: the slice must hold the whole vocabulary (compose the pieces for a part of it)");
  float* row_max = row_stats;
  float* row_sum = row_stats + slice.rows;
  float* target_logit = row_stats + 2 * slice.rows;
  cross_entropy_row_max(row_max, logits, slice, options);
  cross_entropy_row_sum_exp(row_sum, logits, row_max, slice, options);
  cross_entropy_target_logit(target_logit, logits, targets, slice, options);
  cross_entropy_loss_and_grad(losses, dlogits, logits, targets, row_max, row_sum, target_logit, normaliser, slice,
                              options);
  double total = 0.0;
  for (std::size_t r = 0; r < slice.rows; ++r) total += losses[r];
  return total / normaliser;
}

// ---- embedding -----------------------------------------------------------------------------------------

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       std::size_t batch, std::size_t seq, std::size_t channels, std::size_t vocab,
                       const CpuOptions& options) {
  require_options(options);
  const std::size_t rows = batch * seq;
  for (std::size_t i = 0; i < rows; ++i) {
    if (tokens[i] < 0 || static_cast<std::size_t>(tokens[i]) >= vocab) {
      throw std::invalid_argument("embedding: token " + std::to_string(tokens[i]) + " at position " +
                                  std::to_string(i) + " is outside the vocabulary of " + std::to_string(vocab));
    }
  }
  const long n_rows = static_cast<long>(rows);
#pragma omp parallel for num_threads(threads_for(rows * channels, options)) schedule(static)
  for (long i = 0; i < n_rows; ++i) {
    const float* token_row = wte + static_cast<std::size_t>(tokens[i]) * channels;
    const float* position_row = wpe + (static_cast<std::size_t>(i) % seq) * channels;
    float* y = out + i * channels;
    for (std::size_t c = 0; c < channels; ++c) y[c] = token_row[c] + position_row[c];
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, std::size_t batch,
                        std::size_t seq, std::size_t channels, const CpuOptions& options) {
  require_options(options);
  const int threads = threads_for(batch * seq * channels, options);
  const long positions = static_cast<long>(seq);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (long t = 0; t < positions; ++t) {
    float* dp = dwpe + t * channels;
    for (std::size_t b = 0; b < batch; ++b) {
      const float* dy = dout + (b * seq + static_cast<std::size_t>(t)) * channels;
      for (std::size_t c = 0; c < channels; ++c) dp[c] += dy[c];
    }
  }
  // A token that repeats scatters into the same row of dwte from several positions: each task owns a block
  // of channels and walks the positions in order, so there are no races and no order that varies.
  const std::size_t rows = batch * seq;
  const long blocks = static_cast<long>((channels + kChannelBlock - 1) / kChannelBlock);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (long block = 0; block < blocks; ++block) {
    const std::size_t c0 = static_cast<std::size_t>(block) * kChannelBlock;
    const std::size_t c1 = std::min(channels, c0 + kChannelBlock);
    for (std::size_t i = 0; i < rows; ++i) {
      float* dt = dwte + static_cast<std::size_t>(tokens[i]) * channels;
      const float* dy = dout + i * channels;
      for (std::size_t c = c0; c < c1; ++c) dt[c] += dy[c];
    }
  }
}

// ---- residual ------------------------------------------------------------------------------------------

void residual_forward(float* out, const float* a, const float* b, std::size_t n, const CpuOptions& options) {
  require_options(options);
  const long count = static_cast<long>(n);
#pragma omp parallel for simd num_threads(threads_for(n, options)) schedule(static)
  for (long i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, std::size_t n, const CpuOptions& options) {
  require_options(options);
  const long count = static_cast<long>(n);
#pragma omp parallel for simd num_threads(threads_for(n, options)) schedule(static)
  for (long i = 0; i < count; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

void accumulate(float* dst, const float* src, std::size_t n, const CpuOptions& options) {
  require_options(options);
  const long count = static_cast<long>(n);
#pragma omp parallel for simd num_threads(threads_for(n, options)) schedule(static)
  for (long i = 0; i < count; ++i) dst[i] += src[i];
}

// ---- head layouts and biases -----------------------------------------------------------------------------

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

void permute_heads(float* heads, float* merged, int B, int T, int NH, int D, bool to_merged) {
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        float* head = heads + ((static_cast<std::size_t>(b) * NH + h) * T + t) * D;
        float* row = merged + (static_cast<std::size_t>(b) * T + t) * NH * D + static_cast<std::size_t>(h) * D;
        to_merged ? std::memcpy(row, head, D * sizeof(float)) : std::memcpy(head, row, D * sizeof(float));
      }
}

void add_bias(float* out, const float* bias, std::size_t rows, std::size_t channels) {
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < channels; ++c) out[i * channels + c] += bias[c];
}

void fill_bias(float* y, const float* bias, std::size_t rows, std::size_t channels) {
  for (std::size_t i = 0; i < rows; ++i) std::memcpy(y + i * channels, bias, channels * sizeof(float));
}

void bias_gradient(float* dbias, const float* dy, std::size_t rows, std::size_t channels, bool accumulate) {
  if (!accumulate) std::fill(dbias, dbias + channels, 0.0f);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < channels; ++c) dbias[c] += dy[i * channels + c];
}

// ---- AdamW ---------------------------------------------------------------------------------------------

std::string validate(const AdamWConfig& c) {
  if (!std::isfinite(c.learning_rate) || c.learning_rate < 0.0f) return "AdamW: learning rate must be finite and >= 0";
  if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f)) return "AdamW: beta1 must lie in [0, 1)";
  if (!(c.beta2 >= 0.0f && c.beta2 < 1.0f)) return "AdamW: beta2 must lie in [0, 1)";
  if (!(std::isfinite(c.eps) && c.eps > 0.0f)) return "AdamW: eps must be finite and > 0";
  if (!std::isfinite(c.weight_decay) || c.weight_decay < 0.0f) return "AdamW: weight decay must be finite and >= 0";
  return "";
}

AdamWBiasCorrection adamw_bias_correction(const AdamWConfig& config, long step, float grad_scale) {
  if (std::string problem = validate(config); !problem.empty()) throw std::invalid_argument(problem);
  require(step >= 1, "AdamW: step must be >= 1 (bias correction divides by 1 - beta^step)");
  require(std::isfinite(grad_scale), "AdamW: gradient scale must be finite");
  const auto t = static_cast<double>(step);
  return AdamWBiasCorrection{static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(config.beta1), t))),
                             static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(config.beta2), t)))};
}

void adamw_update(float* params, const float* grads, float* m, float* v, std::size_t n, const AdamWConfig& config,
                  long step, float grad_scale, const CpuOptions& options) {
  require_options(options);
  const AdamWBiasCorrection correction = adamw_bias_correction(config, step, grad_scale);
  const float inv_correction1 = correction.inv_correction1, inv_correction2 = correction.inv_correction2;
  const float beta1 = config.beta1, beta2 = config.beta2, eps = config.eps;
  const float lr = config.learning_rate, decay = config.weight_decay;
  const long count = static_cast<long>(n);
#pragma omp parallel for simd num_threads(threads_for(n, options)) schedule(static)
  for (long i = 0; i < count; ++i) {
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi * inv_correction1;
    const float v_hat = vi * inv_correction2;
    params[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + decay * params[i]);
  }
}

// ---- squared norm --------------------------------------------------------------------------------------

double squared_norm(const float* x, std::size_t n, const CpuOptions& options) {
  require_options(options);
  // One partial per thread over a fixed split, summed in thread order: the same result every call with the
  // same thread count (an OpenMP reduction clause combines in arrival order).
  constexpr int kMaxPartials = 256;
  const int threads = std::min(threads_for(n, options), kMaxPartials);
  double partials[kMaxPartials] = {};
  int team = 1;
#pragma omp parallel num_threads(threads)
  {
#ifdef _OPENMP
    const int worker = omp_get_thread_num();
    const int workers = omp_get_num_threads();
#else
    const int worker = 0;
    const int workers = 1;
#endif
    const std::size_t begin = n * static_cast<std::size_t>(worker) / static_cast<std::size_t>(workers);
    const std::size_t end = n * static_cast<std::size_t>(worker + 1) / static_cast<std::size_t>(workers);
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (std::size_t i = begin; i < end; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    partials[worker] = sum;
    if (worker == 0) team = workers;
  }
  double total = 0.0;
  for (int w = 0; w < team; ++w) total += partials[w];
  return total;
}

float clip_scale(double norm, float max_norm) {
  if (max_norm <= 0.0f || !(norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / norm);
}

// ---- bf16 ----------------------------------------------------------------------------------------------

void cast_to_bf16(BFloat16* out, const float* inp, std::size_t n, const CpuOptions& options) {
  require_options(options);
  const long count = static_cast<long>(n);
#pragma omp parallel for num_threads(threads_for(n, options)) schedule(static)
  for (long i = 0; i < count; ++i) out[i] = to_bf16(inp[i]);
}

void cast_to_float(float* out, const BFloat16* inp, std::size_t n, const CpuOptions& options) {
  require_options(options);
  const long count = static_cast<long>(n);
#pragma omp parallel for num_threads(threads_for(n, options)) schedule(static)
  for (long i = 0; i < count; ++i) out[i] = to_float(inp[i]);
}

// ---- denormals -----------------------------------------------------------------------------------------

namespace {
#ifdef STRATA_HAVE_MXCSR
constexpr unsigned int kFlushToZero = 0x8000u;       // MXCSR.FTZ: subnormal results become zero
constexpr unsigned int kDenormalsAreZero = 0x0040u;  // MXCSR.DAZ: subnormal inputs read as zero
constexpr unsigned int kFlushBits = kFlushToZero | kDenormalsAreZero;
#endif
}  // namespace

bool enable_flush_to_zero() {
#ifdef STRATA_HAVE_MXCSR
  _mm_setcsr(_mm_getcsr() | kFlushBits);
  return true;
#else
  return false;
#endif
}

bool flush_to_zero_enabled() {
#ifdef STRATA_HAVE_MXCSR
  return (_mm_getcsr() & kFlushBits) == kFlushBits;
#else
  return false;
#endif
}

int enable_flush_to_zero_all_threads(int threads) {
  require(threads >= 1, "enable_flush_to_zero_all_threads: threads must be >= 1");
  if (!enable_flush_to_zero()) return 0;
  int set = 0;
#pragma omp parallel num_threads(threads) reduction(+ : set)
  set += enable_flush_to_zero() ? 1 : 0;
  return set;
}

ScopedFlushToZero::ScopedFlushToZero() {
#ifdef STRATA_HAVE_MXCSR
  previous_ = _mm_getcsr();
#endif
  enable_flush_to_zero();
}

ScopedFlushToZero::~ScopedFlushToZero() {
#ifdef STRATA_HAVE_MXCSR
  _mm_setcsr(previous_);
#endif
}

}  // namespace strata::layers
