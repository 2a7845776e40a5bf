// The linear layer's three GEMMs on every CPU GEMM library: against a float64 product, accumulation, and
// the backward passes against central finite differences of the forward. The GEMM in bf16 (operands rounded to
// bf16, fp32 sums): against the float64 product of the rounded operands, in every transposition.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/layers.h"
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

// ---- bf16 GEMMs -------------------------------------------------------------------------------------------
// Both bf16 precisions multiply the operands rounded to bf16, and a product of two bf16 values is exact in fp32,
// so they differ from the float64 product of the rounded operands only by their fp32 sums: at most
// (k + 2) 2^-24 (|alpha| sum |a||b| + |beta c|) for k terms, held here with a factor 2 of margin for a library's
// blocking. From the fp32 GEMM they differ by the rounding of the operands, at most (2 u + u^2) sum |a||b| with
// u = 2^-8 (bf16 keeps 8 significant bits), and they must differ from it somewhere (the rounding happened).
struct Bf16Case {
  int64_t m = 13, n = 11, k = 37;
  bool trans_a = false, trans_b = false;
  float alpha = 1.0f, beta = 0.0f;
  int64_t pad = 3;  // leading dimensions past the stored rows' width
  int64_t a_cols() const { return trans_a ? m : k; }
  int64_t b_cols() const { return trans_b ? k : n; }
  int64_t lda() const { return a_cols() + pad; }
  int64_t ldb() const { return b_cols() + pad; }
  int64_t ldc() const { return n + pad; }
  std::string text() const {
    return std::string(trans_a ? "T" : "N") + (trans_b ? "T" : "N") + " alpha " + std::to_string(alpha) + " beta " +
           std::to_string(beta);
  }
};

double as_bf16(float x) { return layers::to_float(layers::to_bf16(x)); }

// Runs `math` on random operands of `t` and checks it against both float64 products.
void check_bf16_gemm(const cpu_gemm::Math& math, const Bf16Case& t) {
  std::mt19937 random(7);
  const std::vector<float> a = random_values(static_cast<std::size_t>((t.trans_a ? t.k : t.m) * t.lda()), random);
  const std::vector<float> b = random_values(static_cast<std::size_t>((t.trans_b ? t.n : t.k) * t.ldb()), random);
  const std::vector<float> c0 = random_values(static_cast<std::size_t>(t.m * t.ldc()), random);
  std::vector<float> c = c0;
  cpu_gemm::gemm(math, t.trans_a, t.trans_b, t.m, t.n, t.k, t.alpha, a.data(), t.lda(), b.data(), t.ldb(), t.beta, c.data(),
                 t.ldc());
  auto a_at = [&](int64_t i, int64_t l) { return a[static_cast<std::size_t>(t.trans_a ? l * t.lda() + i : i * t.lda() + l)]; };
  auto b_at = [&](int64_t l, int64_t j) { return b[static_cast<std::size_t>(t.trans_b ? j * t.ldb() + l : l * t.ldb() + j)]; };
  const double u = 0x1.0p-8, fp32_unit = 0x1.0p-24;
  bool differs_from_fp32 = false;
  for (int64_t i = 0; i < t.m; ++i)
    for (int64_t j = 0; j < t.n; ++j) {
      double rounded = 0, exact = 0, magnitude = 0;
      for (int64_t l = 0; l < t.k; ++l) {
        rounded += as_bf16(a_at(i, l)) * as_bf16(b_at(l, j));
        exact += static_cast<double>(a_at(i, l)) * b_at(l, j);
        magnitude += std::abs(static_cast<double>(a_at(i, l)) * b_at(l, j));
      }
      const std::size_t at = static_cast<std::size_t>(i * t.ldc() + j);
      const double prior = static_cast<double>(t.beta) * c0[at];
      const double sums_bound = 2.0 * static_cast<double>(t.k + 2) * fp32_unit * (std::abs(t.alpha) * magnitude * (1 + 2 * u) + std::abs(prior));
      ASSERT_NEAR(c[at], t.alpha * rounded + prior, sums_bound) << cpu_gemm::name(math.precision) << " " << t.text() << " at " << i << "," << j;
      ASSERT_NEAR(c[at], t.alpha * exact + prior, (2 * u + u * u) * std::abs(t.alpha) * magnitude + sums_bound)
          << cpu_gemm::name(math.precision) << " " << t.text() << " at " << i << "," << j << ": against the fp32 operands";
      differs_from_fp32 = differs_from_fp32 || std::abs(c[at] - (t.alpha * exact + prior)) > sums_bound;
    }
  EXPECT_TRUE(differs_from_fp32) << "the operands were not rounded to bf16: " << t.text();
  for (int64_t i = 0; i < t.m; ++i)  // past each row's n columns C is not touched
    for (int64_t j = t.n; j < t.ldc(); ++j) ASSERT_EQ(c[static_cast<std::size_t>(i * t.ldc() + j)], c0[static_cast<std::size_t>(i * t.ldc() + j)]);
}

void check_every_transposition(const cpu_gemm::Math& math) {
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true})
      for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, 1.0f}}) {
        Bf16Case t;
        t.trans_a = trans_a, t.trans_b = trans_b, t.alpha = alpha, t.beta = beta;
        check_bf16_gemm(math, t);
      }
}

TEST(CpuGemmBf16, RoundedOperandsOnEveryLibraryGiveTheirExactProducts) {
  for (auto library : cpu_gemm::available_backends()) check_every_transposition({library, cpu_gemm::Precision::bf16_rounded});
}

TEST(CpuGemmBf16, OneDnnBf16GivesTheSameProducts) {
  if (const std::string why = cpu_gemm::bf16_refusal(detect_cpu_features()); !why.empty()) GTEST_SKIP() << why;
  const cpu_gemm::Math bf16{cpu_gemm::Backend::onednn, cpu_gemm::Precision::bf16};
  check_every_transposition(bf16);
  // Shapes where oneDNN takes its blocked (AMX, brgemm) kernels and splits K, as a layer's weight gradient does.
  for (bool trans_a : {false, true}) {
    Bf16Case t;
    t.m = 384, t.n = 256, t.k = 1031, t.trans_a = trans_a, t.beta = 1.0f;
    check_bf16_gemm(bf16, t);
  }
}

// The layer's three GEMMs in bf16_rounded are its fp32 GEMMs on operands rounded first, bit for bit (the same
// library call on the same values), and differ from them on the operands as they are.
TEST(Linear, Bf16RoundsEveryOperandOfItsThreeGemms) {
  for (auto library : cpu_gemm::available_backends()) {
    const cpu_gemm::Math bf16{library, cpu_gemm::Precision::bf16_rounded};
    Case t, r;  // r: t's operands rounded to bf16 (the bias stays fp32)
    for (auto* v : {&r.x, &r.w, &r.dy})
      for (float& value : *v) value = static_cast<float>(as_bf16(value));
    const Dims& d = t.d;
    const auto size = [](int64_t a, int64_t b) { return static_cast<std::size_t>(a * b); };
    std::vector<float> y(size(d.rows, d.out_channels)), y_want = y, y_fp32 = y;
    forward(bf16, d, y.data(), t.x.data(), t.w.data(), t.b.data());
    forward(library, d, y_want.data(), r.x.data(), r.w.data(), t.b.data());
    forward(library, d, y_fp32.data(), t.x.data(), t.w.data(), t.b.data());
    std::vector<float> dx(size(d.rows, d.in_channels), 1.0f), dx_want = dx, dx_fp32 = dx;
    backward_input(bf16, d, dx.data(), t.dy.data(), t.w.data(), true);
    backward_input(library, d, dx_want.data(), r.dy.data(), r.w.data(), true);
    backward_input(library, d, dx_fp32.data(), t.dy.data(), t.w.data(), true);
    std::vector<float> dw(size(d.out_channels, d.in_channels)), dw_want = dw, dw_fp32 = dw, db(size(d.out_channels, 1)), db_want = db;
    backward_weight(bf16, d, dw.data(), db.data(), t.dy.data(), t.x.data(), false);
    backward_weight(library, d, dw_want.data(), db_want.data(), t.dy.data(), t.x.data(), false);  // the bias gradient stays fp32
    EXPECT_EQ(db, db_want);
    backward_weight(library, d, dw_want.data(), nullptr, r.dy.data(), r.x.data(), false);
    backward_weight(library, d, dw_fp32.data(), nullptr, t.dy.data(), t.x.data(), false);
    EXPECT_EQ(y, y_want) << cpu_gemm::name(library);
    EXPECT_EQ(dx, dx_want) << cpu_gemm::name(library);
    EXPECT_EQ(dw, dw_want) << cpu_gemm::name(library);
    EXPECT_NE(y, y_fp32);
    EXPECT_NE(dx, dx_fp32);
    EXPECT_NE(dw, dw_fp32);
  }
}

TEST(CpuGemmBf16, RefusesWhereItCannotRun) {
  float x[4] = {1, 2, 3, 4}, y[4] = {};
  EXPECT_THROW(cpu_gemm::gemm({cpu_gemm::Backend::openblas, cpu_gemm::Precision::bf16}, false, false, 2, 2, 2, 1.0f, x, 2, x,
                              2, 0.0f, y, 2),
               std::invalid_argument);
  CpuFeatures zen3;
  zen3.vendor = "AuthenticAMD", zen3.model_name = "AMD EPYC 7763", zen3.family = 0x19, zen3.avx2 = zen3.fma = true;
  const std::string why = cpu_gemm::bf16_refusal(zen3);
  EXPECT_FALSE(why.empty());
  if (cpu_gemm::available(cpu_gemm::Backend::onednn)) {
    EXPECT_NE(why.find("no AVX-512 BF16 or AMX"), std::string::npos) << why;
  }
  // A CPU that claims the units while oneDNN's kernels stop below them (this one, where it has none) is refused:
  // oneDNN would emulate bf16 on AVX-512 without the dot product, and refuse it below.
  const CpuFeatures here = detect_cpu_features();
  if (!here.avx512_bf16 && !here.amx_bf16 && cpu_gemm::available(cpu_gemm::Backend::onednn)) {
    CpuFeatures claimed = here;
    claimed.avx512_bf16 = true;
    const std::string probe = cpu_gemm::bf16_refusal(claimed);
    EXPECT_NE(probe.find("below avx512_core_bf16"), std::string::npos) << probe;
  }
}

}  // namespace
}  // namespace strata::linear
