// Flash and unfused GPU attention (kernels/attention_cuda.h), forward and backward, against the float64
// reference through attention::gpu::check, on shapes whose sequence lengths are not multiples of the tiles,
// with grouped-query heads and the causal mask on and off, in fp16 and bf16.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_cuda.h"
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

}  // namespace
}  // namespace strata::attention::gpu
