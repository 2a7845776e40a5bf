// The GPU training-step layers (kernels/layers_cuda.h) against the float64 reference of the CPU build, for fp32
// and bf16 activations. bf16 inputs are drawn, rounded to bf16, and the reference computes from exactly those
// values, so the tolerance covers only what the kernel rounds: a bf16 output carries up to 2^-8 relative rounding
// (8 significant bits; 8e-3 covers two such roundings); fp32 kernels differ from float64 by a few ulps of fp32.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/layers.h"
#include "kernels/layers_cuda.h"
#include "kernels/layers_launch.h"
#include "kernels/layers_reference.h"
#include "tests/gpu/gpu_test.h"

namespace strata::layers {
namespace {

namespace ref = reference;
using gpu_test::DeviceArray;
using gpu_test::expect_close;
using gpu_test::TestStream;

template <class T>
T narrow(float x) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return to_bf16(x);
  } else {
    return x;
  }
}
double wide(float x) { return x; }
double wide(BFloat16 x) { return to_float(x); }

// Values drawn uniformly and stored in T: the host copy is exactly what the device holds.
template <class T>
std::vector<T> draw(std::size_t n, std::mt19937_64& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> v(n);
  for (T& x : v) x = narrow<T>(dist(rng));
  return v;
}

template <class T>
std::vector<double> widen(const std::vector<T>& v) {
  std::vector<double> d(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) d[i] = wide(v[i]);
  return d;
}

std::vector<double> plus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> s(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) s[i] = a[i] + b[i];
  return s;
}

// Tolerance for a value the kernel stores in T after computing it in fp32.
template <class T>
constexpr double stored_tol() {
  return std::is_same_v<T, BFloat16> ? 8e-3 : 2e-5;
}
// Tolerance for an fp32 result (statistics, losses, parameter gradients) computed from T inputs.
constexpr double kFp32Tol = 2e-5;

template <class T>
class GpuLayers : public ::testing::Test {};
using ActivationTypes = ::testing::Types<float, BFloat16>;
class TypeNames {
 public:
  template <class T>
  static std::string GetName(int) {
    return std::is_same_v<T, BFloat16> ? "bf16" : "fp32";
  }
};
TYPED_TEST_SUITE(GpuLayers, ActivationTypes, TypeNames);

TYPED_TEST(GpuLayers, LayerNormForwardAndBackward) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  using T = TypeParam;
  auto rng = gpu_test::seeded_rng();
  TestStream stream;
  const std::pair<std::size_t, std::size_t> shapes[] = {{1, 7}, {37, 771}, {600, 64}};  // 600 rows > one per block
  for (const auto& [rows, channels] : shapes) {
    const std::string shape = " rows=" + std::to_string(rows) + " C=" + std::to_string(channels);
    const std::size_t n = rows * channels;
    const auto inp = draw<T>(n, rng), weight = draw<T>(channels, rng, 0.5f, 1.5f), bias = draw<T>(channels, rng);
    const auto dout = draw<T>(n, rng), dinp0 = draw<T>(n, rng);
    const auto dweight0 = draw<float>(channels, rng), dbias0 = draw<float>(channels, rng);
    DeviceArray<T> d_inp(inp), d_weight(weight), d_bias(bias), d_dout(dout), d_dinp(dinp0), d_out(n);
    DeviceArray<float> d_mean(rows), d_rstd(rows), d_dweight(dweight0), d_dbias(dbias0),
        d_workspace(launch::layernorm_backward_workspace_floats(rows, channels));
    gpu::layernorm_forward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_weight.get(), d_bias.get(), rows,
                           channels, stream.get());
    gpu::layernorm_backward(d_dinp.get(), d_dweight.get(), d_dbias.get(), d_dout.get(), d_inp.get(), d_weight.get(),
                            d_mean.get(), d_rstd.get(), rows, channels, d_workspace.get(), stream.get());
    stream.synchronize();

    std::vector<double> out(n), mean(rows), rstd(rows), dinp(n), dweight(channels), dbias(channels);
    ref::layernorm_forward(out.data(), mean.data(), rstd.data(), widen(inp).data(), widen(weight).data(),
                           widen(bias).data(), rows, channels, kLayerNormEps);
    ref::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), widen(dout).data(), widen(inp).data(),
                            widen(weight).data(), rows, channels, kLayerNormEps);
    expect_close("out" + shape, widen(d_out.download()), out, stored_tol<T>());
    expect_close("mean" + shape, widen(d_mean.download()), mean, kFp32Tol);
    expect_close("rstd" + shape, widen(d_rstd.download()), rstd, kFp32Tol);
    expect_close("dinp" + shape, widen(d_dinp.download()), plus(widen(dinp0), dinp), stored_tol<T>());
    expect_close("dweight" + shape, widen(d_dweight.download()), plus(widen(dweight0), dweight), 1e-4);
    expect_close("dbias" + shape, widen(d_dbias.download()), plus(widen(dbias0), dbias), 1e-4);
  }
}

TYPED_TEST(GpuLayers, GeluForwardAndBackward) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  using T = TypeParam;
  auto rng = gpu_test::seeded_rng();
  TestStream stream;
  const std::size_t n = 100003;
  const auto inp = draw<T>(n, rng, -6.0f, 6.0f), dout = draw<T>(n, rng), dinp0 = draw<T>(n, rng);
  DeviceArray<T> d_inp(inp), d_dout(dout), d_dinp(dinp0), d_out(n);
  gpu::gelu_forward(d_out.get(), d_inp.get(), n, stream.get());
  gpu::gelu_backward(d_dinp.get(), d_inp.get(), d_dout.get(), n, stream.get());
  stream.synchronize();
  std::vector<double> out(n), dinp(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = ref::gelu(wide(inp[i]));
    dinp[i] = wide(dinp0[i]) + ref::gelu_derivative(wide(inp[i])) * wide(dout[i]);
  }
  expect_close("gelu", widen(d_out.download()), out, stored_tol<T>());
  expect_close("gelu backward", widen(d_dinp.download()), dinp, stored_tol<T>());
}

TYPED_TEST(GpuLayers, CrossEntropyWholeVocabulary) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  using T = TypeParam;
  auto rng = gpu_test::seeded_rng();
  TestStream stream;
  const std::size_t rows = 9, vocab = 50257, stride = 50304;  // GPT-2's vocabulary, padded as llm.c pads it
  const VocabSlice slice = whole_vocab(rows, vocab, stride);
  const T padding = narrow<T>(777.0f);  // padding columns must be left alone
  std::vector<T> logits(rows * stride, padding);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<double> dense(rows * vocab);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t v = 0; v < vocab; ++v) {
      logits[r * stride + v] = narrow<T>(dist(rng) + (r == 4 ? 30000.0f : 0.0f));  // one row far from zero
      dense[r * vocab + v] = wide(logits[r * stride + v]);
    }
  std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(vocab) - 1);
  std::vector<std::int32_t> targets(rows);
  for (auto& t : targets) t = token(rng);
  targets[2] = -1;
  const auto normaliser = static_cast<float>(counted_targets(targets.data(), rows));

  DeviceArray<T> d_logits(logits), d_dlogits(std::vector<T>(logits.size(), padding));
  DeviceArray<std::int32_t> d_targets(targets);
  DeviceArray<float> d_losses(rows), d_stats(3 * rows);
  gpu::softmax_cross_entropy(d_losses.get(), d_dlogits.get(), d_stats.get(), d_logits.get(), d_targets.get(),
                             normaliser, slice, stream.get());
  // And in place, as the step runs it to save the logits' memory.
  gpu::softmax_cross_entropy(d_losses.get(), d_logits.get(), d_stats.get(), d_logits.get(), d_targets.get(),
                             normaliser, slice, stream.get());
  stream.synchronize();

  std::vector<double> losses(rows), dlogits(dense.size());
  ref::cross_entropy(losses.data(), dlogits.data(), dense.data(), targets.data(), rows, vocab, normaliser);
  // Row 4's logits are near 30000, where bf16 keeps only multiples of 128 and fp32 the loss to about 2e-3.
  expect_close("losses", widen(d_losses.download()), losses, kFp32Tol, 30000.0 * 1.2e-7);
  for (const auto* buffer : {&d_dlogits, &d_logits}) {
    const auto got = buffer->download();
    std::vector<double> dense_got(dense.size());
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t v = 0; v < vocab; ++v) dense_got[r * vocab + v] = wide(got[r * stride + v]);
      for (std::size_t v = vocab; v < stride; ++v) ASSERT_EQ(wide(got[r * stride + v]), wide(padding)) << r << "," << v;
    }
    expect_close(buffer == &d_logits ? "dlogits in place" : "dlogits", dense_got, dlogits, stored_tol<T>());
  }
}

TYPED_TEST(GpuLayers, CrossEntropyVocabularySlicesCompose) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  using T = TypeParam;
  auto rng = gpu_test::seeded_rng();
  TestStream stream;
  const std::size_t rows = 6, vocab = 1000;
  const std::size_t bounds[] = {0, 301, 302, 1000};
  const auto logits = draw<T>(rows * vocab, rng, -8.0f, 8.0f);
  std::vector<std::int32_t> targets = {301, 5, 999, -1, 300, 302};
  std::vector<double> losses(rows), dlogits(logits.size());
  ref::cross_entropy(losses.data(), dlogits.data(), widen(logits).data(), targets.data(), rows, vocab, 5.0);

  // Three "ranks", with the allreduces done on the host between the device pieces.
  DeviceArray<std::int32_t> d_targets(targets);
  std::vector<double> global_max(rows, -std::numeric_limits<double>::infinity()), global_sum(rows, 0.0),
      global_target(rows, 0.0);
  std::vector<std::vector<T>> shards(3);
  std::vector<VocabSlice> slices(3);
  for (int k = 0; k < 3; ++k) {
    const std::size_t width = bounds[k + 1] - bounds[k];
    slices[k] = VocabSlice{rows, width, width, bounds[k], vocab};
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t v = bounds[k]; v < bounds[k + 1]; ++v) shards[k].push_back(logits[r * vocab + v]);
    DeviceArray<T> d_shard(shards[k]);
    DeviceArray<float> d_local(rows);
    gpu::cross_entropy_row_max(d_local.get(), d_shard.get(), slices[k], stream.get());
    const auto local = d_local.download();
    for (std::size_t r = 0; r < rows; ++r) global_max[r] = std::max(global_max[r], static_cast<double>(local[r]));
  }
  std::vector<float> max32(global_max.begin(), global_max.end());
  DeviceArray<float> d_max(max32);
  for (int k = 0; k < 3; ++k) {
    DeviceArray<T> d_shard(shards[k]);
    DeviceArray<float> d_sum(rows), d_target(rows);
    gpu::cross_entropy_row_sum_exp(d_sum.get(), d_shard.get(), d_max.get(), slices[k], stream.get());
    gpu::cross_entropy_target_logit(d_target.get(), d_shard.get(), d_targets.get(), slices[k], stream.get());
    const auto sum = d_sum.download(), target = d_target.download();
    for (std::size_t r = 0; r < rows; ++r) global_sum[r] += sum[r], global_target[r] += target[r];
  }
  DeviceArray<float> d_sum(std::vector<float>(global_sum.begin(), global_sum.end())),
      d_target(std::vector<float>(global_target.begin(), global_target.end()));
  for (int k = 0; k < 3; ++k) {
    DeviceArray<T> d_shard(shards[k]), d_grad(shards[k].size());
    DeviceArray<float> d_losses(rows);
    gpu::cross_entropy_loss_and_grad(d_losses.get(), d_grad.get(), d_shard.get(), d_targets.get(), d_max.get(),
                                     d_sum.get(), d_target.get(), 5.0f, slices[k], stream.get());
    expect_close("losses of slice " + std::to_string(k), widen(d_losses.download()), losses, kFp32Tol);
    std::vector<double> want;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t v = bounds[k]; v < bounds[k + 1]; ++v) want.push_back(dlogits[r * vocab + v]);
    expect_close("gradient of slice " + std::to_string(k), widen(d_grad.download()), want, stored_tol<T>());
  }
}

TYPED_TEST(GpuLayers, EmbeddingForwardAndBackward) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  using T = TypeParam;
  auto rng = gpu_test::seeded_rng();
  TestStream stream;
  const std::size_t batch = 3, seq = 5, max_seq = 8, channels = 37, vocab = 4;  // few tokens: many repeats
  std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(vocab) - 1);
  std::vector<std::int32_t> tokens(batch * seq);
  for (auto& t : tokens) t = token(rng);
  const auto wte = draw<T>(vocab * channels, rng), wpe = draw<T>(max_seq * channels, rng);
  const auto dout = draw<T>(batch * seq * channels, rng);
  const auto dwte0 = draw<float>(vocab * channels, rng), dwpe0 = draw<float>(max_seq * channels, rng);
  DeviceArray<std::int32_t> d_tokens(tokens);
  DeviceArray<T> d_wte(wte), d_wpe(wpe), d_dout(dout), d_out(batch * seq * channels);
  DeviceArray<float> d_dwte(dwte0), d_dwpe(dwpe0);
  gpu::embedding_forward(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), batch, seq, channels, vocab,
                         stream.get());
  gpu::embedding_backward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tokens.get(), batch, seq, channels,
                          stream.get());
  stream.synchronize();
  std::vector<double> out(batch * seq * channels), dwte(vocab * channels), dwpe(seq * channels);
  ref::embedding_forward(out.data(), tokens.data(), widen(wte).data(), widen(wpe).data(), batch, seq, channels);
  ref::embedding_backward(dwte.data(), dwpe.data(), widen(dout).data(), tokens.data(), vocab, batch, seq, channels);
  dwpe.resize(max_seq * channels, 0.0);
  expect_close("out", widen(d_out.download()), out, stored_tol<T>());
  expect_close("dwte", widen(d_dwte.download()), plus(widen(dwte0), dwte), kFp32Tol);
  expect_close("dwpe", widen(d_dwpe.download()), plus(widen(dwpe0), dwpe), kFp32Tol);

  // A token outside the vocabulary makes its row NaN rather than reading beyond the table.
  tokens[7] = static_cast<std::int32_t>(vocab);
  d_tokens.upload(tokens);
  gpu::embedding_forward(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), batch, seq, channels, vocab,
                         stream.get());
  const auto marked = widen(d_out.download());
  for (std::size_t c = 0; c < channels; ++c) EXPECT_TRUE(std::isnan(marked[7 * channels + c])) << c;
  EXPECT_FALSE(std::isnan(marked[6 * channels]));
}

TYPED_TEST(GpuLayers, ResidualForwardAndBackward) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  using T = TypeParam;
  auto rng = gpu_test::seeded_rng();
  TestStream stream;
  const std::size_t n = 10001;
  const auto a = draw<T>(n, rng), b = draw<T>(n, rng), dout = draw<T>(n, rng);
  const auto da0 = draw<T>(n, rng), db0 = draw<T>(n, rng), dst0 = draw<T>(n, rng);
  DeviceArray<T> d_a(a), d_b(b), d_dout(dout), d_da(da0), d_db(db0), d_dst(dst0), d_out(n);
  gpu::residual_forward(d_out.get(), d_a.get(), d_b.get(), n, stream.get());
  gpu::residual_backward(d_da.get(), d_db.get(), d_dout.get(), n, stream.get());
  gpu::accumulate(d_dst.get(), d_dout.get(), n, stream.get());
  stream.synchronize();
  expect_close("out", widen(d_out.download()), plus(widen(a), widen(b)), stored_tol<T>());
  expect_close("da", widen(d_da.download()), plus(widen(da0), widen(dout)), stored_tol<T>());
  expect_close("db", widen(d_db.download()), plus(widen(db0), widen(dout)), stored_tol<T>());
  expect_close("dst", widen(d_dst.download()), plus(widen(dst0), widen(dout)), stored_tol<T>());
}

TEST(GpuAdamW, MasterWeightsWithBf16Copy) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  auto rng = gpu_test::seeded_rng();
  TestStream stream;
  const std::size_t n = 100003;
  AdamWConfig config;
  config.learning_rate = 1e-3f;
  config.weight_decay = 0.1f;
  const auto params0 = draw<float>(n, rng);
  DeviceArray<float> d_params(params0), d_m(std::vector<float>(n, 0.0f)), d_v(std::vector<float>(n, 0.0f)),
      d_grads(n);
  DeviceArray<BFloat16> d_copy(n);
  auto params = widen(params0);
  std::vector<double> m(n, 0.0), v(n, 0.0);
  for (long step = 1; step <= 3; ++step) {
    const auto grads = draw<float>(n, rng, -0.1f, 0.1f);
    const float grad_scale = step == 2 ? 0.5f : 1.0f;
    d_grads.upload(grads);
    gpu::adamw_update(d_params.get(), d_copy.get(), d_grads.get(), d_m.get(), d_v.get(), n, config, step, grad_scale,
                      stream.get());
    stream.synchronize();
    ref::adamw_update(params.data(), widen(grads).data(), m.data(), v.data(), n, config.learning_rate, config.beta1,
                      config.beta2, config.eps, config.weight_decay, step, grad_scale);
  }
  const auto got = d_params.download();
  expect_close("params", widen(got), params, kFp32Tol);
  expect_close("m", widen(d_m.download()), m, kFp32Tol);
  expect_close("v", widen(d_v.download()), v, kFp32Tol);
  const auto copy = d_copy.download();
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(copy[i].bits, to_bf16(got[i]).bits) << i;
}

TEST(GpuSquaredNorm, SumOfRanges) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  auto rng = gpu_test::seeded_rng();
  TestStream stream;
  const auto first = draw<float>(1000003, rng, -3.0f, 3.0f), second = draw<float>(17, rng);
  double want = 0.0;
  for (float x : first) want += static_cast<double>(x) * x;
  for (float x : second) want += static_cast<double>(x) * x;
  DeviceArray<float> d_first(first), d_second(second);
  DeviceArray<double> d_result(std::vector<double>{-1.0}), d_workspace(launch::squared_norm_workspace_doubles(first.size()));
  gpu::squared_norm(d_result.get(), d_first.get(), first.size(), false, d_workspace.get(), stream.get());
  gpu::squared_norm(d_result.get(), d_second.get(), second.size(), true, d_workspace.get(), stream.get());
  gpu::squared_norm(d_result.get(), d_second.get(), 0, true, d_workspace.get(), stream.get());  // adds nothing
  stream.synchronize();
  EXPECT_NEAR(d_result.download()[0], want, 1e-12 * want);
  gpu::squared_norm(d_result.get(), d_second.get(), 0, false, d_workspace.get(), stream.get());
  EXPECT_EQ(d_result.download()[0], 0.0);
}

TEST(GpuCasts, RoundToNearestEvenAndKeepNan) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  auto rng = gpu_test::seeded_rng();
  TestStream stream;
  std::uniform_int_distribution<std::uint32_t> bits;
  std::vector<float> values(1 << 20);
  for (float& x : values) x = std::bit_cast<float>(bits(rng));
  const float one = 1.0f, ulp = std::ldexp(1.0f, -7);
  values[0] = one + ulp / 2;       // tie to even: down
  values[1] = one + 3 * ulp / 2;   // tie to even: up
  values[2] = std::bit_cast<float>(0x7f800001u);  // NaN whose payload lies in the bits rounding drops
  DeviceArray<float> d_values(values), d_back(values.size());
  DeviceArray<BFloat16> d_rounded(values.size());
  gpu::cast_to_bf16(d_rounded.get(), d_values.get(), values.size(), stream.get());
  gpu::cast_to_float(d_back.get(), d_rounded.get(), values.size(), stream.get());
  stream.synchronize();
  const auto rounded = d_rounded.download();
  const auto back = d_back.download();
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) {
      ASSERT_TRUE(std::isnan(to_float(rounded[i]))) << i;
    } else {
      ASSERT_EQ(rounded[i].bits, to_bf16(values[i]).bits) << std::hex << std::bit_cast<std::uint32_t>(values[i]);
    }
    ASSERT_EQ(std::bit_cast<std::uint32_t>(back[i]), static_cast<std::uint32_t>(rounded[i].bits) << 16) << i;
  }
}

TEST(GpuLayerArguments, RejectedBeforeLaunching) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  float* none = nullptr;
  EXPECT_THROW(gpu::layernorm_forward<float>(none, none, none, none, none, none, 4, 0, nullptr), std::invalid_argument);
  EXPECT_THROW(gpu::cross_entropy_row_max<float>(none, none, VocabSlice{4, 10, 5, 0, 10}, nullptr),
               std::invalid_argument);
  AdamWConfig config;
  EXPECT_THROW(gpu::adamw_update(none, nullptr, none, none, none, 4, config, 0, 1.0f, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace strata::layers
