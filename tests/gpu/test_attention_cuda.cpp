// Flash and unfused GPU attention (kernels/attention_cuda.h), forward and backward, against the float64
// reference through attention::gpu::check, on shapes whose sequence lengths are not multiples of the tiles,
// with grouped-query heads and the causal mask on and off, in fp16 and bf16: through the benchmark's object
// (bench/cases/attention_cases.h), and through the Plan on caller tensors, workspace and stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench/cases/attention_cases.h"
#include "kernels/attention.h"
#include "kernels/attention_cuda.h"
#include "kernels/gemm_check.h"
#include "tests/gpu/gpu_test.h"

namespace strata::attention::gpu {
namespace {

std::vector<Shape> odd_shapes(int head_dim) {
  std::vector<Shape> shapes;
  for (bool causal : {false, true}) {
    shapes.push_back({2, 4, 2, 77, 93, head_dim, causal});   // GQA, Skv > Sq
    shapes.push_back({1, 3, 3, 130, 65, head_dim, causal});  // Sq > Skv: causal rows that see no key
    shapes.push_back({1, 2, 1, 1, 1, head_dim, causal});     // one query, one key
  }
  return shapes;
}

std::string label(const Shape& s, DType dtype, Impl impl) {
  return name(impl) + " " + name(dtype) + " b" + std::to_string(s.batch) + " h" + std::to_string(s.heads_q) + "/" +
         std::to_string(s.heads_kv) + " s" + std::to_string(s.seq_q) + "/" + std::to_string(s.seq_kv) + " d" +
         std::to_string(s.head_dim) + (s.causal ? " causal" : "");
}

void expect_attention_passes(Impl impl, DType dtype, int head_dim) {
  std::mt19937_64 rng = gpu_test::seeded_rng();
  for (const Shape& shape : odd_shapes(head_dim)) {
    const std::string what = label(shape, dtype, impl);
    ASSERT_EQ(validate(shape, dtype, impl), "") << what;
    Attention attention(shape, dtype, impl, rng());
    attention.poison_outputs();
    attention.forward();
    attention.backward();
    // Every (batch, kv head) slice, so every block of the grid is compared.
    for (int b = 0; b < shape.batch; ++b)
      for (int h = 0; h < shape.heads_kv; ++h) {
        const CheckReport report = check(attention, true, b, h);
        EXPECT_TRUE(report.backward) << what;
        EXPECT_TRUE(report.passed) << what << " batch " << b << " kv head " << h << ": " << report.summary;
      }
  }
}

TEST(GpuAttention, FlashFp16D64) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_attention_passes(Impl::flash, DType::fp16, 64);
}
TEST(GpuAttention, FlashBf16D64) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_attention_passes(Impl::flash, DType::bf16, 64);
}
TEST(GpuAttention, FlashBf16D128) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_attention_passes(Impl::flash, DType::bf16, 128);
}
TEST(GpuAttention, UnfusedFp16D64) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_attention_passes(Impl::unfused, DType::fp16, 64);
}
TEST(GpuAttention, UnfusedBf16D128) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_attention_passes(Impl::unfused, DType::bf16, 128);
}

TEST(GpuAttention, CheckRefusesSlicesOutOfRange) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  Attention attention({1, 2, 1, 16, 16, 64, false}, DType::bf16, Impl::flash, 1);
  attention.forward();
  EXPECT_THROW(check(attention, false, 1, 0), std::invalid_argument);
  EXPECT_THROW(check(attention, false, 0, 1), std::invalid_argument);
}

// Every tensor of one problem in one caller allocation of 16-bit elements, each at a 256-byte boundary (lse
// takes two elements per float), filled with 0xFFFF (NaN in fp16, bf16 and fp32) where outputs go.
struct CallerTensors {
  static size_t padded(size_t n) { return (n + 127) / 128 * 128; }
  size_t q_n, kv_n, lse_n;
  size_t q, k, v, d_o, o, dq, dk, dv, lse, total;  // element offsets
  explicit CallerTensors(const Shape& s)
      : q_n(q_elements(s)), kv_n(kv_elements(s)), lse_n(lse_elements(s)) {
    size_t at = 0;
    for (auto [offset, n] : {std::pair{&q, q_n}, {&k, kv_n}, {&v, kv_n}, {&d_o, q_n}, {&o, q_n}, {&dq, q_n},
                             {&dk, kv_n}, {&dv, kv_n}, {&lse, 2 * lse_n}}) {
      *offset = at;
      at += padded(n);
    }
    total = at;
  }
};

void expect_plan_passes(Impl impl, DType dtype, int head_dim) {
  std::mt19937_64 rng = gpu_test::seeded_rng();
  gpu_test::TestStream stream;
  for (const Shape& shape : odd_shapes(head_dim)) {
    const std::string what = label(shape, dtype, impl);
    const Plan plan(shape, dtype, impl);
    ASSERT_EQ(plan.workspace_bytes(), workspace_bytes(shape, dtype, impl)) << what;
    const CallerTensors at(shape);
    std::vector<float> q(at.q_n), k(at.kv_n), v(at.kv_n), d_o(at.q_n);
    const uint64_t seed = rng();
    gemm::fill_uniform(q.data(), q.size(), seed);
    gemm::fill_uniform(k.data(), k.size(), seed + 1);
    gemm::fill_uniform(v.data(), v.size(), seed + 2);
    gemm::fill_uniform(d_o.data(), d_o.size(), seed + 3);
    std::vector<uint16_t> host(at.total, 0xFFFF);
    for (auto [values, offset] : {std::pair{&q, at.q}, {&k, at.k}, {&v, at.v}, {&d_o, at.d_o}}) {
      const std::vector<uint16_t> bits = to_storage(dtype, *values);  // rounds *values to what the GPU reads
      std::copy(bits.begin(), bits.end(), host.begin() + static_cast<std::ptrdiff_t>(offset));
    }
    gpu_test::DeviceArray<uint16_t> memory(host);
    gpu_test::DeviceArray<unsigned char> workspace(plan.workspace_bytes());
    uint16_t* base = memory.get();
    float* lse = reinterpret_cast<float*>(base + at.lse);
    plan.forward({base + at.q, base + at.k, base + at.v, base + at.o, lse}, {workspace.get(), workspace.size()},
                 stream.get());
    plan.backward({base + at.q, base + at.k, base + at.v, base + at.o, base + at.d_o, lse, base + at.dq, base + at.dk,
                   base + at.dv},
                  {workspace.get(), workspace.size()}, stream.get());
    stream.synchronize();
    const std::vector<uint16_t> got = memory.download();
    auto output = [&](size_t offset, size_t n) {
      return widen(dtype, std::vector<uint16_t>(got.begin() + static_cast<std::ptrdiff_t>(offset),
                                                got.begin() + static_cast<std::ptrdiff_t>(offset + n)));
    };
    const std::vector<float> o = output(at.o, at.q_n), dq = output(at.dq, at.q_n), dk = output(at.dk, at.kv_n),
                             dv = output(at.dv, at.kv_n);
    std::vector<float> lse_host(at.lse_n);
    std::memcpy(lse_host.data(), got.data() + at.lse, at.lse_n * sizeof(float));
    const HostTensors tensors{q.data(), k.data(), v.data(), d_o.data(), o.data(), lse_host.data(),
                              dq.data(), dk.data(), dv.data()};
    for (int b = 0; b < shape.batch; ++b)
      for (int h = 0; h < shape.heads_kv; ++h) {
        const CheckReport report = check(shape, dtype, tensors, true, b, h);
        EXPECT_TRUE(report.passed) << what << " batch " << b << " kv head " << h << ": " << report.summary;
      }
  }
}

TEST(GpuAttentionPlan, FlashFp16D64OnCallerTensors) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_plan_passes(Impl::flash, DType::fp16, 64);
}
TEST(GpuAttentionPlan, FlashBf16D128OnCallerTensors) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_plan_passes(Impl::flash, DType::bf16, 128);
}
TEST(GpuAttentionPlan, UnfusedBf16D64OnCallerTensors) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_plan_passes(Impl::unfused, DType::bf16, 64);
}
TEST(GpuAttentionPlan, UnfusedFp16D128OnCallerTensors) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_plan_passes(Impl::unfused, DType::fp16, 128);
}

TEST(GpuAttentionPlan, RefusesASmallWorkspaceAndMisalignedTensors) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  const Shape shape{1, 2, 1, 16, 16, 64, false};
  for (Impl impl : {Impl::flash, Impl::unfused}) {
    const Plan plan(shape, DType::bf16, impl);
    const CallerTensors at(shape);
    gpu_test::DeviceArray<uint16_t> memory(at.total + 128);
    gpu_test::DeviceArray<unsigned char> workspace(plan.workspace_bytes());
    uint16_t* base = memory.get();
    float* lse = reinterpret_cast<float*>(base + at.lse);
    const ForwardTensors good{base + at.q, base + at.k, base + at.v, base + at.o, lse};
    EXPECT_THROW(plan.forward(good, {workspace.get(), workspace.size() - 1}, nullptr), std::invalid_argument)
        << name(impl);
    ForwardTensors misaligned = good;
    misaligned.o = base + at.o + 1;  // 2 bytes off
    EXPECT_THROW(plan.forward(misaligned, {workspace.get(), workspace.size()}, nullptr), std::invalid_argument)
        << name(impl);
    ForwardTensors missing = good;
    missing.lse = nullptr;
    EXPECT_THROW(plan.forward(missing, {workspace.get(), workspace.size()}, nullptr), std::invalid_argument)
        << name(impl);
  }
}

}  // namespace
}  // namespace strata::attention::gpu
