// The GEMM benchmark's problems: C (M, N) = A (M, K) W (N, K)^T on buffers each object owns, filled from a seed,
// with the sampled float64 check (kernels/gemm_check.h). Thin wrappers over the callable GEMMs of the kernels
// layer: CpuGemm over cpu_gemm.h's sgemm/dgemm (fp32, fp64; fp64 on OpenBLAS only), CudaGemm over
// gemm_cuda.h's cuBLASLt plan (fp32, tf32, fp16, bf16, fp8), whose inputs are drawn on the host, rounded to the
// dtype and kept there for the check. CudaGemm is declared unconditionally and defined in gemm_cases.cu when
// Strata is built with CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu_gemm.h"
#include "kernels/gemm.h"
#include "kernels/gemm_check.h"

namespace strata::gemm {

class CpuGemm {
 public:
  // Throws std::invalid_argument for dtypes the CPU backend or the library lacks.
  CpuGemm(Shape shape, DType dtype, uint64_t seed, cpu_gemm::Backend library = cpu_gemm::Backend::openblas);
  void run();
  // Fills C with NaN, so a check after run() proves every sampled element was written.
  void poison_output();
  CheckResult check(int samples, uint64_t seed) const;
  // Testing the check: makes the last element of C (a corner, which the check always samples) wrong.
  void corrupt_output();
  const Shape& shape() const { return shape_; }
  // The fp32 buffers, for a bare BLAS loop over exactly the same memory (strata-bench-gemm-overhead).
  struct Fp32Buffers {
    const float* a;
    const float* w;
    float* c;
  };
  Fp32Buffers fp32_buffers() { return {a32_.data(), w32_.data(), c32_.data()}; }

 private:
  Shape shape_;
  DType dtype_;
  cpu_gemm::Backend library_;
  std::vector<float> a32_, w32_, c32_;
  std::vector<double> a64_, w64_, c64_;
};

class CudaGemm {
 public:
  // On `device`, with a stream of its own. Throws std::invalid_argument for dtypes the device lacks (fp8 before
  // compute capability 8.9) and shapes cuBLASLt has no algorithm for; KernelError when CUDA or cuBLASLt fails.
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

}  // namespace strata::gemm
