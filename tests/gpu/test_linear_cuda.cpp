// The linear layer's GEMMs on cuBLASLt against the CPU layer (float64-checked in test_linear.cpp), in fp32 and
// bf16 (inputs rounded to bf16 on both sides), with bias and accumulation; plans are built once per shape.
#include <gtest/gtest.h>

#include <vector>

#include "gpu_test.h"
#include "kernels/layers.h"
#include "kernels/linear.h"
#include "kernels/linear_cuda.h"

namespace strata::linear {
namespace {

using gpu_test::DeviceArray;

std::vector<float> random_values(std::size_t n, std::mt19937_64& random, bool round_to_bf16) {
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = round_to_bf16 ? layers::to_float(layers::to_bf16(uniform(random))) : uniform(random);
  return v;
}

template <class T>
std::vector<T> as(const std::vector<float>& v);
template <>
std::vector<float> as(const std::vector<float>& v) { return v; }
template <>
std::vector<layers::BFloat16> as(const std::vector<float>& v) {
  std::vector<layers::BFloat16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = layers::to_bf16(v[i]);
  return out;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<double> widen(const std::vector<layers::BFloat16>& v) {
  std::vector<double> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = layers::to_float(v[i]);
  return out;
}

template <class T>
void check_all_three(gpu::DType dtype, double tol) {
  auto random = gpu_test::seeded_rng();
  const Dims d{37, 64, 48};
  const bool bf16 = dtype == gpu::DType::bf16;
  const auto n = static_cast<std::size_t>(d.rows), c = static_cast<std::size_t>(d.in_channels), oc = static_cast<std::size_t>(d.out_channels);
  std::vector<float> x = random_values(n * c, random, bf16), w = random_values(oc * c, random, bf16),
                     b = random_values(oc, random, bf16), dy = random_values(n * oc, random, bf16);
  std::vector<float> y(n * oc), dx(n * c), dw(oc * c, 0.5f), db(oc, 0.5f);
  forward(cpu_gemm::Backend::openblas, d, y.data(), x.data(), w.data(), b.data());
  backward_input(cpu_gemm::Backend::openblas, d, dx.data(), dy.data(), w.data(), false);
  backward_weight(cpu_gemm::Backend::openblas, d, dw.data(), db.data(), dy.data(), x.data(), true);

  gpu_test::TestStream stream;
  gpu::PlanCache cache;
  DeviceArray<T> gx(as<T>(x)), gw(as<T>(w)), gb(as<T>(b)), gdy(as<T>(dy)), gy(n * oc), gdx(n * c);
  DeviceArray<float> gdw(std::vector<float>(oc * c, 0.5f)), gdb(std::vector<float>(oc, 0.5f));
  for (int repeat = 0; repeat < 2; ++repeat) {  // the second pass reuses the plans
    cache.forward(d, dtype, gy.get(), gx.get(), gw.get(), gb.get(), stream.get());
    cache.backward_input(d, dtype, gdx.get(), gdy.get(), gw.get(), false, stream.get());
  }
  cache.backward_weight(d, dtype, gdw.get(), gdb.get(), gdy.get(), gx.get(), true, stream.get());
  stream.synchronize();
  EXPECT_EQ(cache.plans(), 3u);
  gpu_test::expect_close("y", widen(gy.download()), widen(y), tol);
  gpu_test::expect_close("dx", widen(gdx.download()), widen(dx), tol);
  gpu_test::expect_close("dW", widen(gdw.download()), widen(dw), tol);
  gpu_test::expect_close("db", widen(gdb.download()), widen(db), 1e-5);
}

TEST(LinearCuda, Fp32MatchesTheCpuLayer) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  check_all_three<float>(gpu::DType::fp32, 2e-3);  // cuBLASLt may use TF32-free fp32 kernels; headroom for order
}

TEST(LinearCuda, Bf16MatchesTheCpuLayer) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  check_all_three<layers::BFloat16>(gpu::DType::bf16, 2e-2);  // outputs rounded to bf16 (2^-8)
}

}  // namespace
}  // namespace strata::linear
