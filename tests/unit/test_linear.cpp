// The linear layer's three GEMMs on every CPU GEMM library: against a float64 product, accumulation, and
// the backward passes against central finite differences of the forward.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/linear.h"

namespace strata::linear {
namespace {

std::vector<float> random_values(std::size_t n, std::mt19937& random) {
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = uniform(random);
  return v;
}

struct Case {
  Dims d{13, 17, 11};
  std::mt19937 random{2024};
  std::vector<float> x = random_values(13 * 17, random), w = random_values(11 * 17, random), b = random_values(11, random),
                     dy = random_values(13 * 11, random);
  double x_at(int64_t i, int64_t c) const { return x[static_cast<std::size_t>(i * d.in_channels + c)]; }
  double w_at(int64_t o, int64_t c) const { return w[static_cast<std::size_t>(o * d.in_channels + c)]; }
  double dy_at(int64_t i, int64_t o) const { return dy[static_cast<std::size_t>(i * d.out_channels + o)]; }
  // The scalar loss sum(y * dy), whose gradients the backward passes compute.
  double loss(cpu_gemm::Backend library) const {
    std::vector<float> y(static_cast<std::size_t>(d.rows * d.out_channels));
    forward(library, d, y.data(), x.data(), w.data(), b.data());
    double total = 0;
    for (std::size_t k = 0; k < y.size(); ++k) total += static_cast<double>(y[k]) * dy[k];
    return total;
  }
};

TEST(Linear, ForwardMatchesAFloat64Product) {
  for (auto library : cpu_gemm::available_backends()) {
    Case t;
    std::vector<float> y(static_cast<std::size_t>(t.d.rows * t.d.out_channels));
    forward(library, t.d, y.data(), t.x.data(), t.w.data(), t.b.data());
    for (int64_t i = 0; i < t.d.rows; ++i)
      for (int64_t o = 0; o < t.d.out_channels; ++o) {
        double ref = t.b[static_cast<std::size_t>(o)];
        for (int64_t c = 0; c < t.d.in_channels; ++c) ref += t.x_at(i, c) * t.w_at(o, c);
        ASSERT_NEAR(y[static_cast<std::size_t>(i * t.d.out_channels + o)], ref, 1e-5) << cpu_gemm::name(library);
      }
    forward(library, t.d, y.data(), t.x.data(), t.w.data(), nullptr);  // no bias
    double ref = 0;
    for (int64_t c = 0; c < t.d.in_channels; ++c) ref += t.x_at(0, c) * t.w_at(0, c);
    EXPECT_NEAR(y[0], ref, 1e-5);
  }
}

TEST(Linear, BackwardMatchesFloat64AndAccumulates) {
  for (auto library : cpu_gemm::available_backends()) {
    Case t;
    const Dims& d = t.d;
    std::vector<float> dx(static_cast<std::size_t>(d.rows * d.in_channels), 7.0f);
    std::vector<float> dw(static_cast<std::size_t>(d.out_channels * d.in_channels), 7.0f), db(static_cast<std::size_t>(d.out_channels), 7.0f);
    backward_input(library, d, dx.data(), t.dy.data(), t.w.data(), false);
    backward_weight(library, d, dw.data(), db.data(), t.dy.data(), t.x.data(), false);
    for (int64_t i = 0; i < d.rows; ++i)
      for (int64_t c = 0; c < d.in_channels; ++c) {
        double ref = 0;
        for (int64_t o = 0; o < d.out_channels; ++o) ref += t.dy_at(i, o) * t.w_at(o, c);
        ASSERT_NEAR(dx[static_cast<std::size_t>(i * d.in_channels + c)], ref, 1e-5) << cpu_gemm::name(library);
      }
    for (int64_t o = 0; o < d.out_channels; ++o) {
      double bias_ref = 0;
      for (int64_t i = 0; i < d.rows; ++i) bias_ref += t.dy_at(i, o);
      ASSERT_NEAR(db[static_cast<std::size_t>(o)], bias_ref, 1e-5);
      for (int64_t c = 0; c < d.in_channels; ++c) {
        double ref = 0;
        for (int64_t i = 0; i < d.rows; ++i) ref += t.dy_at(i, o) * t.x_at(i, c);
        ASSERT_NEAR(dw[static_cast<std::size_t>(o * d.in_channels + c)], ref, 1e-5) << cpu_gemm::name(library);
      }
    }
    // A second micro-batch with accumulation doubles every gradient.
    std::vector<float> dx1 = dx, dw1 = dw, db1 = db;
    backward_input(library, d, dx.data(), t.dy.data(), t.w.data(), true);
    backward_weight(library, d, dw.data(), db.data(), t.dy.data(), t.x.data(), true);
    for (std::size_t k = 0; k < dx.size(); ++k) ASSERT_NEAR(dx[k], 2 * dx1[k], 1e-5);
    for (std::size_t k = 0; k < dw.size(); ++k) ASSERT_NEAR(dw[k], 2 * dw1[k], 1e-5);
    for (std::size_t k = 0; k < db.size(); ++k) ASSERT_NEAR(db[k], 2 * db1[k], 1e-5);
  }
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  const auto library = cpu_gemm::Backend::openblas;
  Case t;
  const Dims& d = t.d;
  std::vector<float> dx(static_cast<std::size_t>(d.rows * d.in_channels)), dw(static_cast<std::size_t>(d.out_channels * d.in_channels)),
      db(static_cast<std::size_t>(d.out_channels));
  backward_input(library, d, dx.data(), t.dy.data(), t.w.data(), false);
  backward_weight(library, d, dw.data(), db.data(), t.dy.data(), t.x.data(), false);
  const float h = 1e-2f;
  auto central = [&](float& parameter) {
    const float saved = parameter;
    parameter = saved + h;
    const double up = t.loss(library);
    parameter = saved - h;
    const double down = t.loss(library);
    parameter = saved;
    return (up - down) / (2.0 * h);
  };
  for (std::size_t k : {std::size_t{0}, std::size_t{5}, dx.size() - 1}) EXPECT_NEAR(dx[k], central(t.x[k]), 2e-3) << k;
  for (std::size_t k : {std::size_t{0}, std::size_t{9}, dw.size() - 1}) EXPECT_NEAR(dw[k], central(t.w[k]), 2e-3) << k;
  for (std::size_t k : {std::size_t{0}, db.size() - 1}) EXPECT_NEAR(db[k], central(t.b[k]), 2e-3) << k;
}

TEST(Linear, RejectsEmptyDims) {
  float x = 0;
  EXPECT_THROW(forward(cpu_gemm::Backend::openblas, Dims{0, 1, 1}, &x, &x, &x, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace strata::linear
