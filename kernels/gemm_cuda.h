// CUDA GEMM through cuBLASLt on caller buffers: C (M, N) = A (M, K) W (N, K)^T in fp32, tf32, fp16, bf16 or fp8
// (e4m3 inputs, bf16 output, on GPUs of compute capability 8.9 and newer), fp32 accumulation, the algorithm
// chosen once by cuBLASLt's heuristic. A Plan holds what cuBLASLt needs for one (shape, dtype); run() enqueues
// the product of the caller's device buffers on the caller's stream with the caller's workspace.
// Declared without CUDA headers (cudaStream_t is CUstream_st*); defined in gemm_cuda.cu when Strata is built
// with CUDA. Pointers are device pointers, aligned to 256 bytes as cudaMalloc returns them (the heuristic
// assumes that alignment).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "kernels/gemm.h"

struct CUstream_st;

namespace strata::gemm {

namespace gpu {

using Stream = CUstream_st*;

// Workspace a Plan lets cuBLASLt use unless told otherwise.
constexpr std::size_t kDefaultWorkspaceBytes = std::size_t{32} << 20;

class Plan {
 public:
  // On the current device, for algorithms that use at most `workspace_bytes` of workspace. Throws
  // std::invalid_argument for dtypes the device lacks (fp64; fp8 before compute capability 8.9) and shapes
  // cuBLASLt has no algorithm for; KernelError when CUDA or cuBLASLt fails.
  Plan(Shape shape, DType dtype, std::size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // Enqueues C = A W^T on `stream`: A (M, K) and W (N, K) in the dtype's input type, C (M, N) in its output
  // type (gemm.h: input_bytes, output_bytes). Throws std::invalid_argument when `workspace_bytes` is below the
  // plan's (workspace_bytes()).
  void run(const void* a, const void* w, void* c, void* workspace, std::size_t workspace_bytes, Stream stream) const;

  const Shape& shape() const;
  DType dtype() const;
  std::size_t workspace_bytes() const;
  std::string algorithm() const;  // "cuBLASLt heuristic 1 of 8: algo 21, tile 18, stages 20"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpu

struct GpuPeak {
  double flops = 0;    // dense FLOP/s of the whole device for this dtype, 0 when unknown
  std::string source;
};
GpuPeak gpu_peak(int device, DType dtype);

}  // namespace strata::gemm
