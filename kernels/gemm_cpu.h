// CPU GEMM on one of the CPU GEMM libraries (cpu_gemm.h): C (M, N) = A (M, K) W (N, K)^T in fp32 or fp64
// (fp64 on OpenBLAS only), with the buffers it owns filled with random values and the sampled reference check.
#pragma once

#include <cstdint>
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

}  // namespace strata::gemm
