// The GPU model's own kernels, the pieces the kernels layer has no use for: moving attention's inputs and
// outputs between the token-major layout of the linear layers and the head-major one of attention, and the
// summed loss. Declared without CUDA headers; defined in gpt_cuda_kernels.cu. Pointers are device pointers,
// every call enqueues on `stream`; a failed launch throws KernelError.
//
// Dimensions as in gpt.h: B batch, T sequence, NH heads, KVH kv heads, D head dimension.
#pragma once

#include <cstddef>

#include "kernels/layers.h"

struct CUstream_st;

namespace strata::train::gpu {

using Stream = CUstream_st*;
using layers::BFloat16;

// qkv (B, T, (NH + 2 KVH) D) <-> q (B, NH, T, D), k and v (B, KVH, T, D). `to_heads` copies from qkv to the
// per-head tensors; otherwise back.
void permute_qkv(BFloat16* qkv, BFloat16* q, BFloat16* k, BFloat16* v, int B, int T, int NH, int KVH, int D,
                 bool to_heads, Stream stream);
// heads (B, NH, T, D) <-> merged (B, T, NH D).
void permute_heads(BFloat16* heads, BFloat16* merged, int B, int T, int NH, int D, bool to_merged, Stream stream);
// *sum = the n values added in double, in a fixed order (deterministic).
void sum(double* result, const float* values, std::size_t n, Stream stream);

}  // namespace strata::train::gpu
