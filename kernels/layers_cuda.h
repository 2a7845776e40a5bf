// The training-step kernels of layers.h on the GPU, for a step that computes in bf16 and keeps fp32 master
// weights: activations and their gradients in T (bf16, or float for an fp32 step), row statistics, parameter
// gradients and optimizer states in fp32. Same shapes, same conventions (backward passes accumulate, a
// negative target does not count, dlogits may equal logits) and same results within the dtype's rounding.
//
// Every function enqueues its kernels on `stream` and returns; none allocates or synchronises. Pointers are
// device pointers. Bad arguments throw std::invalid_argument before anything is launched; a failed launch
// throws strata::KernelError. T is float or BFloat16 (layout-identical to CUDA's __nv_bfloat16).
//
// Declared without CUDA headers so that any C++ file can call them; cudaStream_t is CUstream_st*.
// Defined in layers_cuda.cu when Strata is built with CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/layers.h"
#include "kernels/layers_launch.h"

struct CUstream_st;

namespace strata::layers::gpu {

using Stream = CUstream_st*;

// ---- layer norm: inp, out (N, C) in T; weight, bias (C) in T; mean, rstd (N) in fp32 ------------------------
template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                       std::size_t rows, std::size_t channels, Stream stream, float eps = kLayerNormEps);
// dinp (N, C) in T +=; dweight, dbias (C) in fp32 +=. workspace: launch::layernorm_backward_workspace_floats
// floats, so the parameter gradients are summed in a fixed order (deterministic).
template <class T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp, const T* weight,
                        const float* mean, const float* rstd, std::size_t rows, std::size_t channels,
                        float* workspace, Stream stream);

// ---- GELU (tanh approximation), computed in fp32 ---------------------------------------------------------
template <class T>
void gelu_forward(T* out, const T* inp, std::size_t n, Stream stream);
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::size_t n, Stream stream);  // dinp +=

// ---- softmax cross-entropy: logits (N, stride) in T, row values and losses (N) in fp32 ---------------------
// The pieces of the vocabulary-parallel loss, as in layers.h; the allreduces between them are the caller's.
template <class T>
void cross_entropy_row_max(float* row_max, const T* logits, const VocabSlice& slice, Stream stream);
template <class T>
void cross_entropy_row_sum_exp(float* row_sum, const T* logits, const float* row_max, const VocabSlice& slice,
                               Stream stream);
// Targets are global indices; one outside [0, vocab) reads as a row that does not count (0), since the device
// cannot throw: check token ids where they are loaded.
template <class T>
void cross_entropy_target_logit(float* target_logit, const T* logits, const std::int32_t* targets,
                                const VocabSlice& slice, Stream stream);
template <class T>
void cross_entropy_loss_and_grad(float* losses, T* dlogits, const T* logits, const std::int32_t* targets,
                                 const float* row_max, const float* row_sum, const float* target_logit,
                                 float normaliser, const VocabSlice& slice, Stream stream);
// Whole vocabulary; row_stats holds 3N floats (max, sum, target logit). The loss stays on the device.
template <class T>
void softmax_cross_entropy(float* losses, T* dlogits, float* row_stats, const T* logits, const std::int32_t* targets,
                           float normaliser, const VocabSlice& slice, Stream stream);

// ---- embedding: out (B, T, C) in T; wte (V, C), wpe (maxT, C) in T; gradients in fp32 ---------------------
// A token outside [0, vocab) makes its output row NaN (the device cannot throw), so it cannot pass unseen.
template <class T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* wte, const T* wpe, std::size_t batch,
                       std::size_t seq, std::size_t channels, std::size_t vocab, Stream stream);
// dwpe += per position, summed over the batch in order; dwte += with fp32 atomics (order not fixed, so the
// last bits of a row of a repeated token may differ run to run).
template <class T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const std::int32_t* tokens, std::size_t batch,
                        std::size_t seq, std::size_t channels, Stream stream);

// ---- residual ------------------------------------------------------------------------------------------
template <class T>
void residual_forward(T* out, const T* a, const T* b, std::size_t n, Stream stream);
template <class T>
void residual_backward(T* da, T* db, const T* dout, std::size_t n, Stream stream);  // da += dout; db += dout
template <class T>
void accumulate(T* dst, const T* src, std::size_t n, Stream stream);  // dst += src

// ---- AdamW on fp32 master weights ----------------------------------------------------------------------
// One pass, as layers.h's adamw_update; when params_bf16 is not null it receives the updated parameters
// rounded to bf16 in the same pass (the copy the next forward computes with).
void adamw_update(float* params, BFloat16* params_bf16, const float* grads, float* m, float* v, std::size_t n,
                  const AdamWConfig& config, long step, float grad_scale, Stream stream);

// ---- squared norm --------------------------------------------------------------------------------------
// *result = sum of x[i]^2 in double (+= the previous *result when accumulate, to sum several ranges).
// workspace: launch::squared_norm_workspace_doubles(n) doubles. Deterministic.
void squared_norm(double* result, const float* x, std::size_t n, bool accumulate, double* workspace, Stream stream);

// ---- casts (round to nearest even; NaN stays NaN) -----------------------------------------------------------
void cast_to_bf16(BFloat16* out, const float* inp, std::size_t n, Stream stream);
void cast_to_float(float* out, const BFloat16* inp, std::size_t n, Stream stream);

}  // namespace strata::layers::gpu
