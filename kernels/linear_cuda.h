// The linear layer's three GEMMs (linear.h) on the GPU through cuBLASLt, for a step that computes in bf16 (or
// fp32) with fp32 accumulation and fp32 weight gradients:
//
//   forward          y  (N, OC) in T        = x (N, C) W^T + b        (bias in the GEMM's epilogue)
//   input gradient   dx (N, C)  in T      (+)= dy (N, OC) W
//   weight gradient  dW (OC, C) in fp32   (+)= dy^T x,   db (OC) in fp32 (+)= column sums of dy
//
// A plan (descriptors, layouts and the heuristic's algorithm) is built the first time a (GEMM, shape, dtype,
// accumulate) is seen and reused after, so a training step pays cuBLASLt's setup once. Every call enqueues on
// `stream` and returns. Declared without CUDA headers (cudaStream_t is CUstream_st*); defined in
// linear_cuda.cu when Strata is built with CUDA. Pointers are device pointers.
#pragma once

#include <cstddef>
#include <memory>

#include "kernels/linear.h"

struct CUstream_st;

namespace strata::linear::gpu {

using Stream = CUstream_st*;
enum class DType { fp32, bf16 };  // activations and weights; accumulation is fp32 either way

class PlanCache {
 public:
  // Allocates the cuBLASLt handle and a workspace of `workspace_bytes` on the current device.
  explicit PlanCache(std::size_t workspace_bytes = std::size_t{32} << 20);
  ~PlanCache();
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;

  void forward(const Dims& d, DType dtype, void* y, const void* x, const void* weight, const void* bias, Stream stream);
  void backward_input(const Dims& d, DType dtype, void* dx, const void* dy, const void* weight, bool accumulate,
                      Stream stream);
  void backward_weight(const Dims& d, DType dtype, float* dweight, float* dbias, const void* dy, const void* x,
                       bool accumulate, Stream stream);

  std::size_t plans() const;  // plans built so far

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::linear::gpu
