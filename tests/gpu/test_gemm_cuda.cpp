// The cuBLASLt GEMM (kernels/gemm_cuda.h) in every dtype against its sampled float64 check, on shapes that are
// not multiples of any tile, so edge tiles and the TN layout mapping are exercised.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda_info.h"
#include "kernels/gemm.h"
#include "kernels/gemm_cuda.h"
#include "tests/gpu/gpu_test.h"

namespace strata::gemm {
namespace {

void expect_gemm_passes(DType dtype, const std::vector<Shape>& shapes) {
  std::mt19937_64 rng = gpu_test::seeded_rng();
  for (const Shape& shape : shapes) {
    const uint64_t seed = rng();
    CudaGemm gemm(shape, dtype, seed, 0);  // the constructor poisons C with NaN, so a skipped element shows
    gemm.run();
    const CheckResult result = gemm.check(256, seed + 17);
    EXPECT_GT(result.checked, 0) << name(dtype) << " " << shape.text();
    EXPECT_EQ(result.wrong, 0) << name(dtype) << " " << shape.text() << ": worst error " << result.worst_ratio
                               << " x tolerance (" << gemm.algorithm() << ")";
  }
}

const std::vector<Shape> kOddShapes = {{33, 17, 65}, {1, 7, 129}, {127, 255, 31}};

TEST(CudaGemm, Fp32OnOddShapes) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_gemm_passes(DType::fp32, kOddShapes);
}

TEST(CudaGemm, Tf32OnOddShapes) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_gemm_passes(DType::tf32, kOddShapes);
}

// 16-bit inputs need even leading dimensions for cuBLASLt's 4-byte alignment; the tile counts stay odd.
TEST(CudaGemm, Fp16OnOddShapes) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_gemm_passes(DType::fp16, {{33, 18, 66}, {1, 8, 130}, {127, 254, 30}});
}

TEST(CudaGemm, Bf16OnOddShapes) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_gemm_passes(DType::bf16, {{33, 18, 66}, {1, 8, 130}, {127, 254, 30}});
}

// FP8 GEMMs need every dimension a multiple of 16; odd multiples keep partial tiles of the larger tile sizes.
TEST(CudaGemm, Fp8OnOddMultiplesOf16) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  if (cuda::compute_capability(0) < 89)
    GTEST_SKIP() << "fp8 needs compute capability 8.9 or newer; device 0 has " << cuda::compute_capability(0);
  expect_gemm_passes(DType::fp8_e4m3, {{48, 80, 112}, {16, 16, 16}, {208, 48, 144}});
}

TEST(CudaGemm, Fp8IsRefusedBeforeComputeCapability89) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  if (cuda::compute_capability(0) >= 89)
    GTEST_SKIP() << "device 0 has compute capability " << cuda::compute_capability(0) << ", which has fp8";
  EXPECT_THROW(CudaGemm({16, 16, 16}, DType::fp8_e4m3, 1, 0), std::invalid_argument);
}

TEST(CudaGemm, PeakIsKnownForTheTensorCoreDtypes) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  const int cc = cuda::compute_capability(0);
  if (cc != 80 && cc != 90) GTEST_SKIP() << "no FLOP/clock table for compute capability " << cc;
  for (DType d : {DType::fp32, DType::tf32, DType::fp16, DType::bf16}) {
    const GpuPeak peak = gpu_peak(0, d);
    EXPECT_GT(peak.flops, 0) << name(d) << ": " << peak.source;
  }
}

}  // namespace
}  // namespace strata::gemm
