// The elementwise and row-wise kernels of a GPT-2-style training step on the CPU, in fp32 (llm.c's
// train_gpt2.c layers): layer norm, GELU, softmax cross-entropy with its logits gradient, token + position
// embedding, residual add, AdamW, fp32/bf16 casts, flush-to-zero control and the squared norm for gradient
// clipping. GEMM and attention live in cpu_gemm.h and attention.h.
//
// Dimensions, fixed once: B batch, T sequence, C channels, V vocabulary (Vs: the columns of a vocabulary
// slice), N rows = B*T. Every buffer is row-major and contiguous unless a stride is given.
//
// Conventions shared by every kernel here:
// - Caller buffers only: no kernel allocates. Inputs and outputs must not overlap unless a kernel says so.
// - Backward passes accumulate (+=) into every gradient they produce, activation and parameter gradients
//   alike, as llm.c does: the step zeroes gradients once, micro-batches accumulate into parameter
//   gradients, and a residual branch's gradient adds to the stream's without a separate pass.
// - Parameter gradients do not depend on the thread count: their sums over rows are split over channels,
//   never over rows, so every sum is taken in the same order however many threads run.
// - Bad sizes or arguments throw std::invalid_argument naming the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace strata::layers {

struct CpuOptions {
  // OpenMP threads a kernel may use. Small problems run on fewer (parallel regions cost a few microseconds).
  int threads = 1;
};

// ---- layer norm --------------------------------------------------------------------------------------
// out = (inp - mean) * rstd * weight + bias per row, with rstd = 1/sqrt(var + eps), var the biased variance.
//   inp, out (N, C); weight, bias (C); mean, rstd (N), saved for the backward pass.
constexpr float kLayerNormEps = 1e-5f;
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, std::size_t rows, std::size_t channels, const CpuOptions& options,
                       float eps = kLayerNormEps);
// dinp (N, C) += ..., dweight (C) += ..., dbias (C) += ... from dout (N, C) and the forward's inputs and
// statistics.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, std::size_t rows,
                        std::size_t channels, const CpuOptions& options);

// ---- GELU (tanh approximation, as GPT-2) -----------------------------------------------------------------
// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), evaluated as the equal x * sigmoid(2u) so the tail
// x << 0 keeps its digits rather than cancelling to zero. out may equal inp.
void gelu_forward(float* out, const float* inp, std::size_t n, const CpuOptions& options);
// dinp += gelu'(inp) * dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t n, const CpuOptions& options);

// ---- softmax cross-entropy ------------------------------------------------------------------------------
// loss_i = logsumexp(logits_i) - logits_i[target_i]; dlogits_i = (softmax(logits_i) - onehot(target_i)) / normaliser.
// A negative target marks a row that does not count (padding): loss 0, gradient 0. Probabilities below
// e^-87 (1.6e-38) of the row's largest are flushed to zero, as FTZ would flush them anyway.
//
// The pieces below work on a slice of the vocabulary, so a vocabulary-parallel loss (Megatron-LM: each
// tensor-parallel rank holds columns [begin, begin + width) of every row) composes from them:
//   1. cross_entropy_row_max        local max      -> allreduce(MAX)  -> global max
//   2. cross_entropy_row_sum_exp    local sum of exp(x - global max) -> allreduce(SUM) -> global sum
//   3. cross_entropy_target_logit   target logit or 0                -> allreduce(SUM) -> target logit
//   4. cross_entropy_loss_and_grad  losses and this slice's gradient from the three global row values
// On one rank, softmax_cross_entropy does the same with the whole vocabulary as its slice.
struct VocabSlice {
  std::size_t rows = 0;    // N
  std::size_t width = 0;   // Vs, columns held here
  std::size_t stride = 0;  // elements between rows, >= width (llm.c pads V to a multiple of 128)
  std::size_t begin = 0;   // global vocabulary index of the first column held here
  std::size_t vocab = 0;   // V, global vocabulary size: targets must be < vocab
};
// The whole vocabulary on one rank: rows x vocab, stride vocab (or padded_stride when given).
VocabSlice whole_vocab(std::size_t rows, std::size_t vocab, std::size_t padded_stride = 0);
// "" when usable (width >= 1, stride >= width, the columns inside the vocabulary), otherwise the problem.
std::string validate(const VocabSlice& slice);

// row_max (N) = max over the slice's columns.
void cross_entropy_row_max(float* row_max, const float* logits, const VocabSlice& slice, const CpuOptions& options);
// row_sum (N) = sum over the slice's columns of exp(logits - row_max), row_max the global row maximum.
void cross_entropy_row_sum_exp(float* row_sum, const float* logits, const float* row_max, const VocabSlice& slice,
                               const CpuOptions& options);
// target_logit (N) = logits[i, target_i] when target_i lies in the slice, else 0 (so a sum over slices is the
// target's logit). targets (N) are global vocabulary indices.
void cross_entropy_target_logit(float* target_logit, const float* logits, const std::int32_t* targets,
                                const VocabSlice& slice, const CpuOptions& options);
// losses (N) = log(row_sum) + row_max - target_logit (0 for rows that do not count); when dlogits is not null,
// dlogits (N, stride) = (exp(logits - row_max) / row_sum - onehot) / normaliser over the slice's columns
// (padding columns are left alone). dlogits may equal logits (in place). Each rank of a vocabulary-parallel
// group computes the same losses; only its slice of the gradient differs.
void cross_entropy_loss_and_grad(float* losses, float* dlogits, const float* logits, const std::int32_t* targets,
                                 const float* row_max, const float* row_sum, const float* target_logit,
                                 float normaliser, const VocabSlice& slice, const CpuOptions& options);
// Rows whose target counts (target >= 0): the normaliser of a mean over tokens.
std::size_t counted_targets(const std::int32_t* targets, std::size_t rows);
// Whole vocabulary: row statistics in `row_stats` (3N floats: max, sum, target logit), losses (N), and
// dlogits (may be null, may equal logits). Returns sum(losses) / normaliser, accumulated in double.
double softmax_cross_entropy(float* losses, float* dlogits, float* row_stats, const float* logits,
                             const std::int32_t* targets, float normaliser, const VocabSlice& slice,
                             const CpuOptions& options);

// ---- embedding -----------------------------------------------------------------------------------------
// out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :].
//   out (B, T, C); tokens (B, T); wte (V, C); wpe (maxT, C) with T <= maxT, so only its first T rows are read.
// Throws std::invalid_argument when a token is outside [0, vocab).
void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       std::size_t batch, std::size_t seq, std::size_t channels, std::size_t vocab,
                       const CpuOptions& options);
// dwte[tokens[b, t], :] += dout[b, t, :]; dwpe[t, :] += sum over b of dout[b, t, :]. Tokens are assumed
// checked by the forward pass.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens, std::size_t batch,
                        std::size_t seq, std::size_t channels, const CpuOptions& options);

// ---- residual ------------------------------------------------------------------------------------------
// out = a + b (n elements). out may equal a or b.
void residual_forward(float* out, const float* a, const float* b, std::size_t n, const CpuOptions& options);
// da += dout; db += dout: the gradient reaches both branches unchanged.
void residual_backward(float* da, float* db, const float* dout, std::size_t n, const CpuOptions& options);
// dst += src: one branch alone, for a step whose stream gradient is already in place.
void accumulate(float* dst, const float* src, std::size_t n, const CpuOptions& options);

// ---- head layouts and biases -----------------------------------------------------------------------------
// qkv (B, T, (NH + 2 KVH) D) <-> q (B, NH, T, D), k and v (B, KVH, T, D). `to_heads` copies from qkv to the
// per-head tensors; otherwise back. One copy of D elements per head, position and tensor.
void permute_qkv(float* qkv, float* q, float* k, float* v, int B, int T, int NH, int KVH, int D, bool to_heads);
// heads (B, NH, T, D) <-> merged (B, T, NH * D).
void permute_heads(float* heads, float* merged, int B, int T, int NH, int D, bool to_merged);
// out (N, C) += bias (C): a row-parallel layer's bias, added once after the allreduce of its partial outputs.
void add_bias(float* out, const float* bias, std::size_t rows, std::size_t channels);
// A linear layer's bias outside its GEMM: y (N, C) = bias (C) in every row, before the GEMM adds x W^T (beta 1); and
// dbias (C) (+)= the column sums of dy (N, C), rows in order, so the result does not depend on threads.
void fill_bias(float* y, const float* bias, std::size_t rows, std::size_t channels);
void bias_gradient(float* dbias, const float* dy, std::size_t rows, std::size_t channels, bool accumulate);

// ---- AdamW ---------------------------------------------------------------------------------------------
struct AdamWConfig {
  float learning_rate = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: param -= lr * weight_decay * param
};
// "" when usable, otherwise a message naming the problem (betas in [0, 1), eps > 0, finite rates).
std::string validate(const AdamWConfig& config);
// 1 / (1 - beta1^step) and 1 / (1 - beta2^step), computed in double (in float, 1 - beta2^t loses digits for beta2
// near 1). Throws std::invalid_argument for what every update refuses: a config validate() rejects, step < 1, a
// gradient scale that is not finite. Shared by the CPU and GPU updates.
struct AdamWBiasCorrection {
  float inv_correction1 = 1.0f;
  float inv_correction2 = 1.0f;
};
AdamWBiasCorrection adamw_bias_correction(const AdamWConfig& config, long step, float grad_scale);
// One pass over a flat range of n parameters, step t >= 1 (bias correction 1 - beta^t):
//   g = grad * grad_scale          (grad_scale: gradient clipping, or 1)
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   param -= lr * ((m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * param)
// The optimizer is memory-bound, so everything happens in this single read of the four arrays.
void adamw_update(float* params, const float* grads, float* m, float* v, std::size_t n, const AdamWConfig& config,
                  long step, float grad_scale, const CpuOptions& options);

// ---- squared norm ----------------------------------------------------------------------------------------
// sum of x[i]^2 accumulated in double, for the global gradient norm (sum the ranges, or ranks, then sqrt).
double squared_norm(const float* x, std::size_t n, const CpuOptions& options);
// The scale that clips a gradient of norm `norm` to `max_norm` (1 when it is already within it, or when
// max_norm <= 0 turns clipping off).
float clip_scale(double norm, float max_norm);

// ---- bf16 ------------------------------------------------------------------------------------------------
// bfloat16 as stored: the top 16 bits of an IEEE float. Same size and layout as CUDA's __nv_bfloat16.
struct BFloat16 {
  std::uint16_t bits = 0;
};
static_assert(sizeof(BFloat16) == 2);
// Round to nearest, ties to even; NaN stays NaN (quietened, sign kept); overflow rounds to infinity. Inline: the
// CPU's bf16 GEMMs round every operand element through it. memcpy, not std::bit_cast: nvcc compiles this header as
// C++17.
inline BFloat16 to_bf16(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: truncation could clear every payload bit left and make it infinity; set the quiet bit instead.
    return BFloat16{static_cast<std::uint16_t>((bits >> 16) | 0x0040u)};
  }
  // Round to nearest, ties to even: add just under half an ulp of bf16, plus one when the kept part is odd.
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return BFloat16{static_cast<std::uint16_t>((bits + rounding) >> 16)};
}
inline float to_float(BFloat16 x) {
  const std::uint32_t bits = static_cast<std::uint32_t>(x.bits) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
void cast_to_bf16(BFloat16* out, const float* inp, std::size_t n, const CpuOptions& options);
void cast_to_float(float* out, const BFloat16* inp, std::size_t n, const CpuOptions& options);

// ---- denormals -------------------------------------------------------------------------------------------
// Adam's second moments and small updates drift into subnormal floats after a few steps, and x86 cores take
// microcode assists on them: an fp32 step slows about 4x. Flush-to-zero (results) and denormals-are-zero
// (inputs) in MXCSR avoid it. The setting is per thread, so every thread that computes needs it.
// Returns true when set (x86), false where the platform has no such control (nothing is changed).
bool enable_flush_to_zero();
// True when this thread flushes subnormal results to zero and treats subnormal inputs as zero.
bool flush_to_zero_enabled();
// Sets it in every thread of an OpenMP team of `threads` (libgomp keeps its pool threads, so later parallel
// regions of up to that many threads inherit it) and in the calling thread. Returns the threads set, 0 where
// unsupported. BLAS libraries with their own thread pools (OpenBLAS pthreads) are out of its reach.
int enable_flush_to_zero_all_threads(int threads);
// Sets the mode for a scope and restores the previous one at its end (for tests and one-off calls).
class ScopedFlushToZero {
 public:
  ScopedFlushToZero();
  ~ScopedFlushToZero();
  ScopedFlushToZero(const ScopedFlushToZero&) = delete;
  ScopedFlushToZero& operator=(const ScopedFlushToZero&) = delete;

 private:
  unsigned int previous_ = 0;
};

}  // namespace strata::layers
