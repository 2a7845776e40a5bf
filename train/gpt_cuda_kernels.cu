// The GPU model's permutations and loss sum (see gpt_cuda_kernels.h): grid-stride loops over the token-major
// tensor, one thread per element, so reads of qkv and writes of merged rows are coalesced.
#include "train/gpt_cuda_kernels.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/error.h"
#include "kernels/layers_launch.h"

namespace strata::train::gpu {

namespace {

using Bits = std::uint16_t;  // a bf16 moved, never computed with

__device__ std::size_t grid_start() { return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

__global__ void permute_qkv_kernel(Bits* qkv, Bits* q, Bits* k, Bits* v, int T, int NH, int KVH, int D, std::size_t n,
                                   bool to_heads) {
  const std::size_t Q = static_cast<std::size_t>(NH + 2 * KVH) * D, C = static_cast<std::size_t>(NH) * D,
                    KV = static_cast<std::size_t>(KVH) * D;
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) {
    const std::size_t row = i / Q, c = i % Q, b = row / T, t = row % T;
    Bits* head;
    if (c < C) {
      head = q + ((b * NH + c / D) * T + t) * D + c % D;
    } else if (c < C + KV) {
      head = k + ((b * KVH + (c - C) / D) * T + t) * D + (c - C) % D;
    } else {
      head = v + ((b * KVH + (c - C - KV) / D) * T + t) * D + (c - C - KV) % D;
    }
    if (to_heads) {
      *head = qkv[i];
    } else {
      qkv[i] = *head;
    }
  }
}

__global__ void permute_heads_kernel(Bits* heads, Bits* merged, int T, int NH, int D, std::size_t n, bool to_merged) {
  const std::size_t C = static_cast<std::size_t>(NH) * D;
  for (std::size_t i = grid_start(); i < n; i += grid_stride()) {
    const std::size_t row = i / C, c = i % C, b = row / T, t = row % T;
    Bits* head = heads + ((b * NH + c / D) * T + t) * D + c % D;
    if (to_merged) {
      merged[i] = *head;
    } else {
      *head = merged[i];
    }
  }
}

constexpr unsigned kSumThreads = 256;

// One block: each thread sums a strided share, then a tree over shared memory, the same order every time.
__global__ void sum_kernel(double* result, const float* values, std::size_t n) {
  __shared__ double partial[kSumThreads];
  double s = 0.0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) s += values[i];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (unsigned half = kSumThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *result = partial[0];
}

}  // namespace

void permute_qkv(BFloat16* qkv, BFloat16* q, BFloat16* k, BFloat16* v, int B, int T, int NH, int KVH, int D,
                 bool to_heads, Stream stream) {
  const std::size_t n = static_cast<std::size_t>(B) * T * (NH + 2 * KVH) * D;
  const layers::launch::Grid grid = layers::launch::elementwise(n);
  if (grid.blocks == 0) return;
  permute_qkv_kernel<<<grid.blocks, grid.threads, 0, stream>>>(
      reinterpret_cast<Bits*>(qkv), reinterpret_cast<Bits*>(q), reinterpret_cast<Bits*>(k), reinterpret_cast<Bits*>(v),
      T, NH, KVH, D, n, to_heads);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

void permute_heads(BFloat16* heads, BFloat16* merged, int B, int T, int NH, int D, bool to_merged, Stream stream) {
  const std::size_t n = static_cast<std::size_t>(B) * T * NH * D;
  const layers::launch::Grid grid = layers::launch::elementwise(n);
  if (grid.blocks == 0) return;
  permute_heads_kernel<<<grid.blocks, grid.threads, 0, stream>>>(reinterpret_cast<Bits*>(heads),
                                                                 reinterpret_cast<Bits*>(merged), T, NH, D, n, to_merged);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

void sum(double* result, const float* values, std::size_t n, Stream stream) {
  sum_kernel<<<1, kSumThreads, 0, stream>>>(result, values, n);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::train::gpu
