// CUDA GEMM through cuBLASLt: C (M, N) = A (M, K) W (N, K)^T in fp32, tf32, fp16, bf16 or fp8 (e4m3 inputs,
// bf16 output, on GPUs of compute capability 8.9 and newer), fp32 accumulation, the algorithm chosen by
// cuBLASLt's heuristic. Inputs are drawn on the host, rounded to the dtype, and kept there for the check.
// Declared unconditionally; defined in gemm_cuda.cu when Strata is built with CUDA.
#pragma once

#include <memory>
#include <string>

#include "kernels/gemm.h"
#include "kernels/gemm_check.h"

namespace strata::gemm {

class CudaGemm {
 public:
  // Throws std::invalid_argument for dtypes the device lacks (fp8 before compute capability 8.9) and shapes
  // cuBLASLt has no algorithm for; KernelError when CUDA or cuBLASLt fails.
  CudaGemm(Shape shape, DType dtype, uint64_t seed, int device);
  ~CudaGemm();
  CudaGemm(const CudaGemm&) = delete;
  CudaGemm& operator=(const CudaGemm&) = delete;

  void run();            // enqueued on stream(); the timer waits for it
  void poison_output();  // NaN into C (synchronous)
  CheckResult check(int samples, uint64_t seed) const;
  // Testing the check: overwrites the last element of C (a corner, always sampled) with a huge value or NaN.
  void corrupt_output();
  void* stream() const;  // cudaStream_t
  std::string algorithm() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct GpuPeak {
  double flops = 0;    // dense FLOP/s of the whole device for this dtype, 0 when unknown
  std::string source;
};
GpuPeak gpu_peak(int device, DType dtype);

}  // namespace strata::gemm
