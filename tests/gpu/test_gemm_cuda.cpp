// The cuBLASLt GEMM (kernels/gemm_cuda.h) in every dtype against its sampled float64 check, on shapes that are
// not multiples of any tile, so edge tiles and the TN layout mapping are exercised: through the benchmark's
// CudaGemm (bench/cases/gemm_cases.h), and through the plan on caller buffers and a caller stream.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/cases/gemm_cases.h"
#include "kernels/cuda_info.h"
#include "kernels/gemm.h"
#include "kernels/gemm_check.h"
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

// One plan, two sets of caller buffers carved from one allocation at 256-byte offsets, on a non-blocking stream.
TEST(GemmPlan, RunsOnCallerBuffersAndStream) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  const Shape shape{37, 29, 71};
  const gpu::Plan plan(shape, DType::fp32);
  const size_t a_n = static_cast<size_t>(shape.m * shape.k), w_n = static_cast<size_t>(shape.n * shape.k),
               c_n = static_cast<size_t>(shape.m * shape.n);
  auto padded = [](size_t n) { return (n + 63) / 64 * 64; };  // floats to the next 256-byte boundary
  const size_t set = padded(a_n) + padded(w_n) + padded(c_n);
  gpu_test::DeviceArray<float> memory(2 * set);
  gpu_test::DeviceArray<unsigned char> workspace(plan.workspace_bytes());
  gpu_test::TestStream stream;
  std::mt19937_64 rng = gpu_test::seeded_rng();
  std::vector<float> host(2 * set, std::numeric_limits<float>::quiet_NaN());
  std::vector<uint64_t> seeds;
  for (size_t i = 0; i < 2; ++i) {
    seeds.push_back(rng());
    fill_uniform(host.data() + i * set, a_n, seeds.back());
    fill_uniform(host.data() + i * set + padded(a_n), w_n, seeds.back() + 1);
  }
  memory.upload(host);
  for (size_t i = 0; i < 2; ++i) {
    float* base = memory.get() + i * set;
    plan.run(base, base + padded(a_n), base + padded(a_n) + padded(w_n), workspace.get(), workspace.size(),
             stream.get());
  }
  stream.synchronize();
  const std::vector<float> got = memory.download();
  for (size_t i = 0; i < 2; ++i) {
    const float* a = got.data() + i * set;
    const float* w = a + padded(a_n);
    const float* c = w + padded(w_n);
    const int64_t k = shape.k, n = shape.n;
    const GemmView view{shape, [&](int64_t r, int64_t kk) { return static_cast<double>(a[r * k + kk]); },
                        [&](int64_t j, int64_t kk) { return static_cast<double>(w[j * k + kk]); },
                        [&](int64_t r, int64_t j) { return static_cast<double>(c[r * n + j]); }};
    const CheckResult result = check_sampled(view, DType::fp32, 256, seeds[i]);
    EXPECT_EQ(result.wrong, 0) << "buffer set " << i << ": worst error " << result.worst_ratio << " x tolerance";
  }
}

TEST(GemmPlan, RefusesAWorkspaceSmallerThanPlanned) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  const gpu::Plan plan({16, 16, 16}, DType::bf16, 1 << 20);
  EXPECT_EQ(plan.workspace_bytes(), size_t{1} << 20);
  gpu_test::DeviceArray<unsigned char> buffers(3 * 512);
  EXPECT_THROW(plan.run(buffers.get(), buffers.get() + 512, buffers.get() + 1024, buffers.get(), 1024, nullptr),
               std::invalid_argument);
  EXPECT_THROW(gpu::Plan({16, 16, 16}, DType::fp64), std::invalid_argument);
}

}  // namespace
}  // namespace strata::gemm
