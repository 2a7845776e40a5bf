// GPU kernels of the training-step layers (see layers_cuda.h). Deliberately simple, llm.c-style: one block per
// row for the row-wise kernels (layer norm, cross-entropy) with a warp-shuffle block reduction, grid-stride
// loops for the elementwise ones, every value computed in fp32 (double for the squared norm) and rounded
// once on store. Launch shapes, workspace sizes and argument checks come from layers_launch.cpp.
#include "kernels/layers_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "kernels/error.h"

static_assert(sizeof(strata::layers::BFloat16) == sizeof(__nv_bfloat16), "BFloat16 must match __nv_bfloat16");

namespace strata::layers::gpu {
namespace {

// ---- types -------------------------------------------------------------------------------------------------

template <class T>
struct DeviceTypeOf {
  using type = T;
};
template <>
struct DeviceTypeOf<BFloat16> {
  using type = __nv_bfloat16;
};
template <class T>
using device_t = typename DeviceTypeOf<T>::type;

template <class T>
device_t<T>* dev(T* p) {
  return reinterpret_cast<device_t<T>*>(p);
}
template <class T>
const device_t<T>* dev(const T* p) {
  return reinterpret_cast<const device_t<T>*>(p);
}

__device__ __forceinline__ float load(float x) { return x; }
__device__ __forceinline__ float load(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class D>
__device__ __forceinline__ D store(float x);
template <>
__device__ __forceinline__ float store<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 store<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// ---- reductions ----------------------------------------------------------------------------------------------

struct Sum {
  template <class V>
  __device__ V operator()(V a, V b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Reduces one value per thread over the block; every thread gets the result. Every thread of the block must
// call it (it synchronises). The warps' partials are combined in warp order, so the result is deterministic.
template <class V, class Op>
__device__ V block_reduce(V value, Op op, V identity) {
  __shared__ V partials[32];
  for (int offset = 16; offset > 0; offset /= 2) value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partials[warp] = value;
  __syncthreads();
  V total = identity;
  for (unsigned w = 0; w < (blockDim.x + 31) / 32; ++w) total = op(total, partials[w]);
  __syncthreads();  // the next call reuses partials
  return total;
}

__device__ __forceinline__ std::size_t grid_start() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

template <class Kernel, class... Args>
void enqueue(const launch::Grid& grid, Stream stream, Kernel kernel, Args... args) {
  if (grid.blocks == 0) return;
  kernel<<<grid.blocks, grid.threads, 0, stream>>>(args...);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

// ---- layer norm ----------------------------------------------------------------------------------------------

template <class D>
__global__ void layernorm_forward_kernel(D* out, float* mean, float* rstd, const D* inp, const D* weight,
                                         const D* bias, int channels, float eps) {
  const std::size_t row = blockIdx.x;
  const D* x = inp + row * channels;
  D* y = out + row * channels;
  float sum = 0.0f;
  for (int c = threadIdx.x; c < channels; c += blockDim.x) sum += load(x[c]);
  const float m = block_reduce(sum, Sum{}, 0.0f) / channels;
  float squares = 0.0f;
  for (int c = threadIdx.x; c < channels; c += blockDim.x) {
    const float d = load(x[c]) - m;
    squares += d * d;
  }
  const float s = rsqrtf(block_reduce(squares, Sum{}, 0.0f) / channels + eps);
  for (int c = threadIdx.x; c < channels; c += blockDim.x)
    y[c] = store<D>((load(x[c]) - m) * s * load(weight[c]) + load(bias[c]));
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// Each block walks rows blockIdx.x, blockIdx.x + gridDim.x, ...: the input gradient row by row, and its own
// partial parameter gradients in workspace[blockIdx.x] (dweight then dbias, C floats each). A thread always
// owns the same channels, so the partials need no atomics.
template <class D>
__global__ void layernorm_backward_kernel(D* dinp, float* workspace, const D* dout, const D* inp, const D* weight,
                                          const float* mean, const float* rstd, std::size_t rows, int channels) {
  float* partial_dweight = workspace + static_cast<std::size_t>(blockIdx.x) * 2 * channels;
  float* partial_dbias = partial_dweight + channels;
  for (int c = threadIdx.x; c < channels; c += blockDim.x) partial_dweight[c] = partial_dbias[c] = 0.0f;
  for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const D* x = inp + row * channels;
    const D* dy = dout + row * channels;
    D* dx = dinp + row * channels;
    const float m = mean[row], s = rstd[row];
    float g_sum = 0.0f, g_norm_sum = 0.0f;
    for (int c = threadIdx.x; c < channels; c += blockDim.x) {
      const float g = load(weight[c]) * load(dy[c]);
      g_sum += g;
      g_norm_sum += g * (load(x[c]) - m) * s;
    }
    const float g_mean = block_reduce(g_sum, Sum{}, 0.0f) / channels;
    const float g_norm_mean = block_reduce(g_norm_sum, Sum{}, 0.0f) / channels;
    for (int c = threadIdx.x; c < channels; c += blockDim.x) {
      const float norm = (load(x[c]) - m) * s;
      const float g = load(weight[c]) * load(dy[c]);
      dx[c] = store<D>(load(dx[c]) + s * (g - g_mean - norm * g_norm_mean));
      partial_dweight[c] += norm * load(dy[c]);
      partial_dbias[c] += load(dy[c]);
    }
  }
}

__global__ void layernorm_parameter_gradient_kernel(float* dweight, float* dbias, const float* workspace,
                                                    unsigned partials, int channels) {
  for (std::size_t c = grid_start(); c < static_cast<std::size_t>(channels); c += grid_stride()) {
    float sum_dweight = 0.0f, sum_dbias = 0.0f;
    for (unsigned b = 0; b < partials; ++b) {
      sum_dweight += workspace[static_cast<std::size_t>(b) * 2 * channels + c];
      sum_dbias += workspace[static_cast<std::size_t>(b) * 2 * channels + channels + c];
    }
    dweight[c] += sum_dweight;
    dbias[c] += sum_dbias;
  }
}

// ---- GELU ----------------------------------------------------------------------------------------------------

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

// (1 + tanh u) / 2 = sigmoid(2u): computed as a sigmoid it keeps its digits for x << 0, where 1 + tanh u in
// fp32 cancels to zero (as on the CPU). expf overflowing to infinity gives the correct limit 0.
__device__ __forceinline__ float gelu_sigmoid(float x) {
  return 1.0f / (1.0f + expf(-2.0f * kGeluScale * (x + kGeluCubic * x * x * x)));
}

template <class D>
__global__ void gelu_forward_kernel(D* out, const D* inp, std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) {
    const float x = load(inp[i]);
    out[i] = store<D>(x * gelu_sigmoid(x));
  }
}

// d/dx [x * sigmoid(2u)] = sigmoid(2u) + 2 x sigmoid(2u) (1 - sigmoid(2u)) du/dx.
template <class D>
__global__ void gelu_backward_kernel(D* dinp, const D* inp, const D* dout, std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) {
    const float x = load(inp[i]);
    const float s = gelu_sigmoid(x);
    const float du_dx = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = store<D>(load(dinp[i]) + (s + 2.0f * x * s * (1.0f - s) * du_dx) * load(dout[i]));
  }
}

// ---- cross-entropy -------------------------------------------------------------------------------------------

// Where a slice lies and how its rows are laid out, as the kernels need it.
struct SliceView {
  std::size_t stride;
  long long begin, width, vocab;
};
SliceView view(const VocabSlice& s) {
  return SliceView{s.stride, static_cast<long long>(s.begin), static_cast<long long>(s.width),
                   static_cast<long long>(s.vocab)};
}

__device__ __forceinline__ bool counts(std::int32_t target, const SliceView& s) {
  return target >= 0 && target < s.vocab;
}

template <class D>
__global__ void row_max_kernel(float* row_max, const D* logits, SliceView s) {
  const D* x = logits + blockIdx.x * s.stride;
  float m = -INFINITY;
  for (long long c = threadIdx.x; c < s.width; c += blockDim.x) m = fmaxf(m, load(x[c]));
  m = block_reduce(m, Max{}, -INFINITY);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <class D>
__global__ void row_sum_exp_kernel(float* row_sum, const D* logits, const float* row_max, SliceView s) {
  const D* x = logits + blockIdx.x * s.stride;
  const float m = row_max[blockIdx.x];
  float sum = 0.0f;
  for (long long c = threadIdx.x; c < s.width; c += blockDim.x) sum += expf(load(x[c]) - m);
  sum = block_reduce(sum, Sum{}, 0.0f);
  if (threadIdx.x == 0) row_sum[blockIdx.x] = sum;
}

template <class D>
__global__ void target_logit_kernel(float* target_logit, const D* logits, const std::int32_t* targets,
                                    std::size_t rows, SliceView s) {
  for (std::size_t row = grid_start(); row < rows; row += grid_stride()) {
    const std::int32_t t = targets[row];
    const long long column = t - s.begin;
    const bool here = counts(t, s) && column >= 0 && column < s.width;
    target_logit[row] = here ? load(logits[row * s.stride + column]) : 0.0f;
  }
}

template <class D>
__global__ void loss_and_grad_kernel(float* losses, D* dlogits, const D* logits, const std::int32_t* targets,
                                     const float* row_max, const float* row_sum, const float* target_logit,
                                     float inv_normaliser, SliceView s) {
  const std::size_t row = blockIdx.x;
  const std::int32_t t = targets[row];
  const bool counted = counts(t, s);
  if (threadIdx.x == 0) losses[row] = counted ? logf(row_sum[row]) + row_max[row] - target_logit[row] : 0.0f;
  if (dlogits == nullptr) return;
  const D* x = logits + row * s.stride;
  D* dx = dlogits + row * s.stride;
  const float m = row_max[row];
  const float scale = counted ? inv_normaliser / row_sum[row] : 0.0f;
  const long long target_column = counted ? t - s.begin : -1;
  for (long long c = threadIdx.x; c < s.width; c += blockDim.x) {
    // A row that does not count gets exact zeros (not exp(...) * 0, which is NaN for an infinite exp).
    float p = counted ? expf(load(x[c]) - m) * scale : 0.0f;
    if (c == target_column) p -= inv_normaliser;
    dx[c] = store<D>(p);
  }
}

// ---- embedding -----------------------------------------------------------------------------------------------

template <class D>
__global__ void embedding_forward_kernel(D* out, const std::int32_t* tokens, const D* wte, const D* wpe,
                                         std::size_t rows, std::size_t seq, std::size_t channels, long long vocab) {
  for (std::size_t i = grid_start(); i < rows * channels; i += grid_stride()) {
    const std::size_t row = i / channels, c = i % channels;
    const std::int32_t token = tokens[row];
    if (token < 0 || token >= vocab) {
      out[i] = store<D>(__int_as_float(0x7fc00000));  // NaN: the forward pass cannot throw
      continue;
    }
    out[i] = store<D>(load(wte[static_cast<std::size_t>(token) * channels + c]) + load(wpe[(row % seq) * channels + c]));
  }
}

template <class D>
__global__ void embedding_position_gradient_kernel(float* dwpe, const D* dout, std::size_t batch, std::size_t seq,
                                                   std::size_t channels) {
  for (std::size_t i = grid_start(); i < seq * channels; i += grid_stride()) {
    float sum = 0.0f;
    for (std::size_t b = 0; b < batch; ++b) sum += load(dout[b * seq * channels + i]);
    dwpe[i] += sum;
  }
}

template <class D>
__global__ void embedding_token_gradient_kernel(float* dwte, const D* dout, const std::int32_t* tokens,
                                                std::size_t rows, std::size_t channels) {
  for (std::size_t i = grid_start(); i < rows * channels; i += grid_stride()) {
    const std::int32_t token = tokens[i / channels];
    if (token < 0) continue;
    atomicAdd(dwte + static_cast<std::size_t>(token) * channels + i % channels, load(dout[i]));
  }
}

// ---- residual --------------------------------------------------------------------------------------------------

template <class D>
__global__ void residual_forward_kernel(D* out, const D* a, const D* b, std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) out[i] = store<D>(load(a[i]) + load(b[i]));
}

template <class D>
__global__ void residual_backward_kernel(D* da, D* db, const D* dout, std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) {
    const float g = load(dout[i]);
    da[i] = store<D>(load(da[i]) + g);
    db[i] = store<D>(load(db[i]) + g);
  }
}

template <class D>
__global__ void accumulate_kernel(D* dst, const D* src, std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) dst[i] = store<D>(load(dst[i]) + load(src[i]));
}

// ---- AdamW -------------------------------------------------------------------------------------------------------

struct AdamWArgs {
  float learning_rate, beta1, beta2, eps, weight_decay, inv_correction1, inv_correction2, grad_scale;
};

__global__ void adamw_kernel(float* params, __nv_bfloat16* params_bf16, const float* grads, float* m, float* v,
                             std::size_t n, AdamWArgs a) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) {
    const float g = grads[i] * a.grad_scale;
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float p = params[i];
    const float updated =
        p - a.learning_rate * ((mi * a.inv_correction1) / (sqrtf(vi * a.inv_correction2) + a.eps) + a.weight_decay * p);
    params[i] = updated;
    if (params_bf16 != nullptr) params_bf16[i] = __float2bfloat16_rn(updated);
  }
}

// ---- squared norm --------------------------------------------------------------------------------------------

__global__ void squared_norm_partial_kernel(double* partials, const float* x, std::size_t n) {
  double sum = 0.0;
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) sum += static_cast<double>(x[i]) * x[i];
  sum = block_reduce(sum, Sum{}, 0.0);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// One thread sums the (few hundred) partials in block order: deterministic, and negligible beside the pass.
__global__ void squared_norm_total_kernel(double* result, const double* partials, unsigned count, bool accumulate) {
  double total = accumulate ? *result : 0.0;
  for (unsigned b = 0; b < count; ++b) total += partials[b];
  *result = total;
}

// ---- casts -----------------------------------------------------------------------------------------------------

__global__ void cast_to_bf16_kernel(__nv_bfloat16* out, const float* inp, std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) out[i] = __float2bfloat16_rn(inp[i]);
}

__global__ void cast_to_float_kernel(float* out, const __nv_bfloat16* inp, std::size_t n) {
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) out[i] = __bfloat162float(inp[i]);
}

}  // namespace

// ---- host wrappers -----------------------------------------------------------------------------------------------

template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                       std::size_t rows, std::size_t channels, Stream stream, float eps) {
  launch::require_rows_and_channels(rows, channels, "layernorm");
  if (!(eps > 0.0f)) throw std::invalid_argument("layernorm: eps must be > 0");
  enqueue(launch::per_row(rows, "layernorm"), stream, layernorm_forward_kernel<device_t<T>>, dev(out), mean, rstd,
          dev(inp), dev(weight), dev(bias), static_cast<int>(channels), eps);
}

template <class T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, std::size_t rows, std::size_t channels,
                        float* workspace, Stream stream) {
  launch::require_rows_and_channels(rows, channels, "layernorm");
  const launch::Grid grid = launch::layernorm_backward(rows);
  if (grid.blocks == 0) return;
  enqueue(grid, stream, layernorm_backward_kernel<device_t<T>>, dev(dinp), workspace, dev(dout), dev(inp),
          dev(weight), mean, rstd, rows, static_cast<int>(channels));
  enqueue(launch::elementwise(channels), stream, layernorm_parameter_gradient_kernel, dweight, dbias,
          static_cast<const float*>(workspace), grid.blocks, static_cast<int>(channels));
}

template <class T>
void gelu_forward(T* out, const T* inp, std::size_t n, Stream stream) {
  enqueue(launch::elementwise(n), stream, gelu_forward_kernel<device_t<T>>, dev(out), dev(inp), n);
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::size_t n, Stream stream) {
  enqueue(launch::elementwise(n), stream, gelu_backward_kernel<device_t<T>>, dev(dinp), dev(inp), dev(dout), n);
}

template <class T>
void cross_entropy_row_max(float* row_max, const T* logits, const VocabSlice& slice, Stream stream) {
  launch::require_slice(slice);
  enqueue(launch::per_row(slice.rows, "cross-entropy"), stream, row_max_kernel<device_t<T>>, row_max, dev(logits),
          view(slice));
}

template <class T>
void cross_entropy_row_sum_exp(float* row_sum, const T* logits, const float* row_max, const VocabSlice& slice,
                               Stream stream) {
  launch::require_slice(slice);
  enqueue(launch::per_row(slice.rows, "cross-entropy"), stream, row_sum_exp_kernel<device_t<T>>, row_sum,
          dev(logits), row_max, view(slice));
}

template <class T>
void cross_entropy_target_logit(float* target_logit, const T* logits, const std::int32_t* targets,
                                const VocabSlice& slice, Stream stream) {
  launch::require_slice(slice);
  enqueue(launch::elementwise(slice.rows), stream, target_logit_kernel<device_t<T>>, target_logit, dev(logits),
          targets, slice.rows, view(slice));
}

template <class T>
void cross_entropy_loss_and_grad(float* losses, T* dlogits, const T* logits, const std::int32_t* targets,
                                 const float* row_max, const float* row_sum, const float* target_logit,
                                 float normaliser, const VocabSlice& slice, Stream stream) {
  launch::require_slice(slice);
  launch::require_normaliser(normaliser);
  enqueue(launch::per_row(slice.rows, "cross-entropy"), stream, loss_and_grad_kernel<device_t<T>>, losses,
          dev(dlogits), dev(logits), targets, row_max, row_sum, target_logit, 1.0f / normaliser, view(slice));
}

template <class T>
void softmax_cross_entropy(float* losses, T* dlogits, float* row_stats, const T* logits, const std::int32_t* targets,
                           float normaliser, const VocabSlice& slice, Stream stream) {
  if (slice.begin != 0 || slice.width != slice.vocab) {
    throw std::invalid_argument(
        "softmax_cross_entropy: the slice must hold the whole vocabulary (compose the pieces for a part of it)");
  }
  launch::require_normaliser(normaliser);
  float* row_max = row_stats;
  float* row_sum = row_stats + slice.rows;
  float* target_logit = row_stats + 2 * slice.rows;
  cross_entropy_row_max(row_max, logits, slice, stream);
  cross_entropy_row_sum_exp(row_sum, logits, row_max, slice, stream);
  cross_entropy_target_logit(target_logit, logits, targets, slice, stream);
  cross_entropy_loss_and_grad(losses, dlogits, logits, targets, row_max, row_sum, target_logit, normaliser, slice,
                              stream);
}

template <class T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* wte, const T* wpe, std::size_t batch,
                       std::size_t seq, std::size_t channels, std::size_t vocab, Stream stream) {
  if (channels < 1 || seq < 1) throw std::invalid_argument("embedding: sequence and channels must be >= 1");
  enqueue(launch::elementwise(batch * seq * channels), stream, embedding_forward_kernel<device_t<T>>, dev(out),
          tokens, dev(wte), dev(wpe), batch * seq, seq, channels, static_cast<long long>(vocab));
}

template <class T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const std::int32_t* tokens, std::size_t batch,
                        std::size_t seq, std::size_t channels, Stream stream) {
  if (channels < 1 || seq < 1) throw std::invalid_argument("embedding: sequence and channels must be >= 1");
  enqueue(launch::elementwise(seq * channels), stream, embedding_position_gradient_kernel<device_t<T>>, dwpe,
          dev(dout), batch, seq, channels);
  enqueue(launch::elementwise(batch * seq * channels), stream, embedding_token_gradient_kernel<device_t<T>>, dwte,
          dev(dout), tokens, batch * seq, channels);
}

template <class T>
void residual_forward(T* out, const T* a, const T* b, std::size_t n, Stream stream) {
  enqueue(launch::elementwise(n), stream, residual_forward_kernel<device_t<T>>, dev(out), dev(a), dev(b), n);
}

template <class T>
void residual_backward(T* da, T* db, const T* dout, std::size_t n, Stream stream) {
  enqueue(launch::elementwise(n), stream, residual_backward_kernel<device_t<T>>, dev(da), dev(db), dev(dout), n);
}

template <class T>
void accumulate(T* dst, const T* src, std::size_t n, Stream stream) {
  enqueue(launch::elementwise(n), stream, accumulate_kernel<device_t<T>>, dev(dst), dev(src), n);
}

void adamw_update(float* params, BFloat16* params_bf16, const float* grads, float* m, float* v, std::size_t n,
                  const AdamWConfig& config, long step, float grad_scale, Stream stream) {
  const AdamWBiasCorrection correction = adamw_bias_correction(config, step, grad_scale);
  const AdamWArgs args{config.learning_rate, config.beta1,       config.beta2,
                       config.eps,           config.weight_decay, correction.inv_correction1,
                       correction.inv_correction2, grad_scale};
  enqueue(launch::elementwise(n), stream, adamw_kernel, params, dev(params_bf16), grads, m, v, n, args);
}

void squared_norm(double* result, const float* x, std::size_t n, bool accumulate, double* workspace, Stream stream) {
  const launch::Grid grid = launch::squared_norm(n);
  enqueue(grid, stream, squared_norm_partial_kernel, workspace, x, n);
  enqueue(launch::Grid{1, 1}, stream, squared_norm_total_kernel, result, static_cast<const double*>(workspace),
          grid.blocks, accumulate);
}

void cast_to_bf16(BFloat16* out, const float* inp, std::size_t n, Stream stream) {
  enqueue(launch::elementwise(n), stream, cast_to_bf16_kernel, dev(out), inp, n);
}

void cast_to_float(float* out, const BFloat16* inp, std::size_t n, Stream stream) {
  enqueue(launch::elementwise(n), stream, cast_to_float_kernel, out, dev(inp), n);
}

// ---- instantiations for fp32 and bf16 activations ---------------------------------------------------------------

#define STRATA_LAYERS_INSTANTIATE(T)                                                                                 \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const T*, const T*, std::size_t, std::size_t,   \
                                     Stream, float);                                                                \
  template void layernorm_backward<T>(T*, float*, float*, const T*, const T*, const T*, const float*, const float*, \
                                      std::size_t, std::size_t, float*, Stream);                                    \
  template void gelu_forward<T>(T*, const T*, std::size_t, Stream);                                                \
  template void gelu_backward<T>(T*, const T*, const T*, std::size_t, Stream);                                     \
  template void cross_entropy_row_max<T>(float*, const T*, const VocabSlice&, Stream);                             \
  template void cross_entropy_row_sum_exp<T>(float*, const T*, const float*, const VocabSlice&, Stream);           \
  template void cross_entropy_target_logit<T>(float*, const T*, const std::int32_t*, const VocabSlice&, Stream);   \
  template void cross_entropy_loss_and_grad<T>(float*, T*, const T*, const std::int32_t*, const float*,            \
                                               const float*, const float*, float, const VocabSlice&, Stream);       \
  template void softmax_cross_entropy<T>(float*, T*, float*, const T*, const std::int32_t*, float,                 \
                                         const VocabSlice&, Stream);                                                 \
  template void embedding_forward<T>(T*, const std::int32_t*, const T*, const T*, std::size_t, std::size_t,        \
                                     std::size_t, std::size_t, Stream);                                             \
  template void embedding_backward<T>(float*, float*, const T*, const std::int32_t*, std::size_t, std::size_t,     \
                                      std::size_t, Stream);                                                         \
  template void residual_forward<T>(T*, const T*, const T*, std::size_t, Stream);                                  \
  template void residual_backward<T>(T*, T*, const T*, std::size_t, Stream);                                       \
  template void accumulate<T>(T*, const T*, std::size_t, Stream);

STRATA_LAYERS_INSTANTIATE(float)
STRATA_LAYERS_INSTANTIATE(BFloat16)

#undef STRATA_LAYERS_INSTANTIATE

}  // namespace strata::layers::gpu
