// Unit tests of the CPU training-step kernels (kernels/layers.h): each against the float64 reference on fresh
// random inputs, backward passes also against central finite differences in double, plus the edge cases of
// each (one row, odd sizes, large logits, ignored targets, bf16 ties and NaN, subnormals). Every test prints
// its seed; STRATA_TEST_SEED=<n> reruns with another.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "kernels/layers.h"
#include "kernels/layers_reference.h"

namespace strata::layers {
namespace {

namespace ref = reference;

// fp32 kernels against float64: a few ulps per operation over sums of up to a few thousand terms.
constexpr double kFp32Tol = 1e-5;
// Central differences with h = 1e-5 in double: truncation ~h^2, cancellation ~1e-16 / h.
constexpr double kFiniteDifferenceStep = 1e-5;
constexpr double kFiniteDifferenceTol = 1e-6;

std::mt19937_64 seeded_rng() {
  std::uint64_t seed = 20241123;
  if (const char* text = std::getenv("STRATA_TEST_SEED")) seed = std::strtoull(text, nullptr, 10);
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::cout << "[ seed     ] " << info->test_suite_name() << "." << info->name() << " seed=" << seed
            << " (STRATA_TEST_SEED)\n";
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return std::mt19937_64(seed);
}

std::vector<float> uniform(std::size_t n, std::mt19937_64& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

std::vector<std::int32_t> random_tokens(std::size_t n, std::size_t vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<std::int32_t> dist(0, static_cast<std::int32_t>(vocab) - 1);
  std::vector<std::int32_t> v(n);
  for (auto& t : v) t = dist(rng);
  return v;
}

// Every element within tol * (|ref| + rms(ref)) or abs_floor: relative to the element, and to the tensor's
// scale so that entries near zero do not fail on rounding alone. Reports the worst element.
template <class Got>
void expect_close(const std::string& what, const Got* got, const double* want, std::size_t n, double tol,
                  double abs_floor = 0.0) {
  double squares = 0.0;
  for (std::size_t i = 0; i < n; ++i) squares += want[i] * want[i];
  const double rms = n == 0 ? 0.0 : std::sqrt(squares / static_cast<double>(n));
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double error = std::abs(static_cast<double>(got[i]) - want[i]);
    const double ratio = error / (std::abs(want[i]) + rms + 1e-300);
    if (!(ratio <= tol) && !(error <= abs_floor)) ++bad;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << n << " elements off; worst [" << worst
                     << "] got " << static_cast<double>(got[worst]) << " want " << want[worst]
                     << " (relative " << worst_ratio << ", tol " << tol << ")";
}
template <class Got>
void expect_close(const std::string& what, const std::vector<Got>& got, const std::vector<double>& want, double tol,
                  double abs_floor = 0.0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  expect_close(what, got.data(), want.data(), got.size(), tol, abs_floor);
}

// d loss / d x by central differences, every element of x.
std::vector<double> numeric_gradient(std::vector<double> x, const std::function<double(const std::vector<double>&)>& loss) {
  std::vector<double> gradient(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kFiniteDifferenceStep;
    const double up = loss(x);
    x[i] = saved - kFiniteDifferenceStep;
    const double down = loss(x);
    x[i] = saved;
    gradient[i] = (up - down) / (2.0 * kFiniteDifferenceStep);
  }
  return gradient;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

std::vector<double> plus(const std::vector<float>& a, const std::vector<double>& b) {
  std::vector<double> s(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) s[i] = static_cast<double>(a[i]) + b[i];
  return s;
}

CpuOptions threads(int n) { return CpuOptions{n}; }

// ---- layer norm ----------------------------------------------------------------------------------------

struct LayerNormCase {
  std::size_t rows, channels;
  int threads;
  float offset;  // added to every input: rows far from zero stress the variance computation
};

std::ostream& operator<<(std::ostream& os, const LayerNormCase& c) {
  return os << "rows=" << c.rows << " C=" << c.channels << " threads=" << c.threads << " offset=" << c.offset;
}

class LayerNorm : public ::testing::TestWithParam<LayerNormCase> {};

TEST_P(LayerNorm, ForwardAndBackwardMatchFloat64Reference) {
  const auto [rows, channels, n_threads, offset] = GetParam();
  auto rng = seeded_rng();
  const std::size_t n = rows * channels;
  const auto inp = uniform(n, rng, offset - 1.0f, offset + 1.0f);
  const auto weight = uniform(channels, rng, 0.5f, 1.5f);
  const auto bias = uniform(channels, rng);
  const auto dout = uniform(n, rng);

  std::vector<float> out(n), mean(rows), rstd(rows);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), rows, channels,
                    threads(n_threads));
  std::vector<double> out_ref(n), mean_ref(rows), rstd_ref(rows);
  ref::layernorm_forward(out_ref.data(), mean_ref.data(), rstd_ref.data(), widen(inp).data(), widen(weight).data(),
                         widen(bias).data(), rows, channels, kLayerNormEps);
  // Input rounding is amplified by rstd: for rows offset far from zero the fp32 input itself carries
  // |offset| * 2^-24 of error relative to a spread of about 1.
  const double tol = kFp32Tol * (1.0 + std::abs(offset));
  expect_close("out", out, out_ref, tol);
  expect_close("mean", mean, mean_ref, tol);
  expect_close("rstd", rstd, rstd_ref, tol);

  // Backward accumulates: start every gradient from random values.
  auto dinp = uniform(n, rng), dweight = uniform(channels, rng), dbias = uniform(channels, rng);
  const auto dinp0 = dinp, dweight0 = dweight, dbias0 = dbias;
  layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), mean.data(),
                     rstd.data(), rows, channels, threads(n_threads));
  std::vector<double> dinp_ref(n), dweight_ref(channels), dbias_ref(channels);
  ref::layernorm_backward(dinp_ref.data(), dweight_ref.data(), dbias_ref.data(), widen(dout).data(), widen(inp).data(),
                          widen(weight).data(), rows, channels, kLayerNormEps);
  expect_close("dinp", dinp, plus(dinp0, dinp_ref), tol);
  expect_close("dweight", dweight, plus(dweight0, dweight_ref), tol);
  expect_close("dbias", dbias, plus(dbias0, dbias_ref), tol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayerNorm,
                         ::testing::Values(LayerNormCase{1, 7, 1, 0.0f}, LayerNormCase{37, 768, 1, 0.0f},
                                           LayerNormCase{64, 100, 4, 0.0f}, LayerNormCase{129, 33, 3, 0.0f},
                                           LayerNormCase{16, 256, 2, 300.0f}));

TEST(LayerNormGradient, ReferenceAndKernelMatchFiniteDifferences) {
  auto rng = seeded_rng();
  const std::size_t rows = 3, channels = 5;
  const auto inp = widen(uniform(rows * channels, rng)), weight = widen(uniform(channels, rng, 0.5f, 1.5f));
  const auto bias = widen(uniform(channels, rng)), dout = widen(uniform(rows * channels, rng));
  const double eps = kLayerNormEps;
  auto loss = [&](const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b) {
    std::vector<double> out(rows * channels), mean(rows), rstd(rows);
    ref::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, channels, eps);
    return dot(out, dout);
  };
  const auto dinp_fd = numeric_gradient(inp, [&](const std::vector<double>& x) { return loss(x, weight, bias); });
  const auto dweight_fd = numeric_gradient(weight, [&](const std::vector<double>& w) { return loss(inp, w, bias); });
  const auto dbias_fd = numeric_gradient(bias, [&](const std::vector<double>& b) { return loss(inp, weight, b); });

  std::vector<double> dinp(rows * channels), dweight(channels), dbias(channels);
  ref::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), rows,
                          channels, eps);
  expect_close("reference dinp", dinp, dinp_fd, kFiniteDifferenceTol);
  expect_close("reference dweight", dweight, dweight_fd, kFiniteDifferenceTol);
  expect_close("reference dbias", dbias, dbias_fd, kFiniteDifferenceTol);

  const std::vector<float> inp32(inp.begin(), inp.end()), weight32(weight.begin(), weight.end());
  const std::vector<float> bias32(bias.begin(), bias.end()), dout32(dout.begin(), dout.end());
  std::vector<float> out(rows * channels), mean(rows), rstd(rows), dinp32(rows * channels), dweight32(channels),
      dbias32(channels);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp32.data(), weight32.data(), bias32.data(), rows, channels,
                    threads(1));
  layernorm_backward(dinp32.data(), dweight32.data(), dbias32.data(), dout32.data(), inp32.data(), weight32.data(),
                     mean.data(), rstd.data(), rows, channels, threads(1));
  expect_close("kernel dinp", dinp32, dinp_fd, kFp32Tol);
  expect_close("kernel dweight", dweight32, dweight_fd, kFp32Tol);
  expect_close("kernel dbias", dbias32, dbias_fd, kFp32Tol);
}

TEST(LayerNormGradient, ParameterGradientsIdenticalForAnyThreadCount) {
  auto rng = seeded_rng();
  const std::size_t rows = 300, channels = 200;  // 200 channels: a ragged last channel block
  const auto inp = uniform(rows * channels, rng), weight = uniform(channels, rng), bias = uniform(channels, rng);
  const auto dout = uniform(rows * channels, rng);
  std::vector<float> out(rows * channels), mean(rows), rstd(rows);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), rows, channels,
                    threads(1));
  auto run = [&](int n_threads) {
    std::vector<float> dinp(rows * channels), dweight(channels), dbias(channels);
    layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(), mean.data(),
                       rstd.data(), rows, channels, threads(n_threads));
    dweight.insert(dweight.end(), dbias.begin(), dbias.end());
    return dweight;
  };
  EXPECT_EQ(run(1), run(3));
}

TEST(LayerNormArguments, Rejected) {
  float x = 0;
  EXPECT_THROW(layernorm_forward(&x, &x, &x, &x, &x, &x, 1, 0, threads(1)), std::invalid_argument);
  EXPECT_THROW(layernorm_forward(&x, &x, &x, &x, &x, &x, 1, 1, threads(0)), std::invalid_argument);
  EXPECT_THROW(layernorm_forward(&x, &x, &x, &x, &x, &x, 1, 1, threads(1), 0.0f), std::invalid_argument);
}

// ---- GELU ----------------------------------------------------------------------------------------------

TEST(Gelu, ForwardAndBackwardMatchFloat64Reference) {
  auto rng = seeded_rng();
  for (const std::size_t n : {std::size_t{1}, std::size_t{1001}, std::size_t{70001}}) {
    const auto inp = uniform(n, rng, -6.0f, 6.0f);
    const auto dout = uniform(n, rng);
    std::vector<float> out(n);
    gelu_forward(out.data(), inp.data(), n, threads(3));
    auto dinp = uniform(n, rng);
    const auto dinp0 = dinp;
    gelu_backward(dinp.data(), inp.data(), dout.data(), n, threads(3));
    std::vector<double> out_ref(n), dinp_ref(n);
    for (std::size_t i = 0; i < n; ++i) {
      out_ref[i] = ref::gelu(inp[i]);
      dinp_ref[i] = dinp0[i] + ref::gelu_derivative(inp[i]) * dout[i];
    }
    // Relative to each element even in the tail x << 0, where the exact gelu is a tiny negative number and a
    // kernel computing 1 + tanh(u) in fp32 would return 0.
    expect_close("gelu n=" + std::to_string(n), out, out_ref, kFp32Tol);
    expect_close("gelu backward n=" + std::to_string(n), dinp, dinp_ref, kFp32Tol);
  }
}

TEST(Gelu, FarTailsKeepTheirDigits) {
  // Far below zero gelu(x) is a tiny negative number, far above it x itself. Each point alone (the loop's scalar
  // remainder) and repeated over 67 elements (its vector body, then a remainder).
  const std::vector<float> points = {-100.0f, -12.0f, -9.0f, -6.0f, -3.0f, 0.0f, 1e-3f, 3.0f, 9.0f, 30.0f, 1e4f};
  for (const std::size_t n : {std::size_t{1}, std::size_t{67}}) {
    for (const float x : points) {
      const std::vector<float> inp(n, x), ones(n, 1.0f);
      std::vector<float> out(n), grad(n, 0.0f);
      gelu_forward(out.data(), inp.data(), n, threads(1));
      gelu_backward(grad.data(), inp.data(), ones.data(), n, threads(1));
      for (std::size_t i = 0; i < n; ++i) {
        EXPECT_NEAR(out[i], ref::gelu(x), kFp32Tol * std::abs(ref::gelu(x)) + 1e-30) << "x=" << x << " n=" << n;
        EXPECT_NEAR(grad[i], ref::gelu_derivative(x), kFp32Tol * std::abs(ref::gelu_derivative(x)) + 1e-30)
            << "x=" << x << " n=" << n;
      }
    }
    const std::vector<float> nan(n, std::nanf("")), ones(n, 1.0f);
    std::vector<float> out(n), grad(n, 0.0f);
    gelu_forward(out.data(), nan.data(), n, threads(1));
    gelu_backward(grad.data(), nan.data(), ones.data(), n, threads(1));
    for (std::size_t i = 0; i < n; ++i)
      EXPECT_TRUE(std::isnan(out[i]) && std::isnan(grad[i])) << "NaN must propagate, element " << i << " of " << n;
  }
}

TEST(Gelu, InPlaceForward) {
  auto rng = seeded_rng();
  auto x = uniform(257, rng, -4.0f, 4.0f);
  const auto inp = x;
  gelu_forward(x.data(), x.data(), x.size(), threads(1));
  std::vector<double> want(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) want[i] = ref::gelu(inp[i]);
  expect_close("in place", x, want, kFp32Tol);
}

TEST(GeluGradient, DerivativeMatchesFiniteDifferences) {
  auto rng = seeded_rng();
  const auto x = widen(uniform(64, rng, -5.0f, 5.0f));
  const auto dout = widen(uniform(64, rng));
  const auto fd = numeric_gradient(x, [&](const std::vector<double>& v) {
    double s = 0.0;
    for (std::size_t i = 0; i < v.size(); ++i) s += ref::gelu(v[i]) * dout[i];
    return s;
  });
  std::vector<double> analytic(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) analytic[i] = ref::gelu_derivative(x[i]) * dout[i];
  expect_close("reference", analytic, fd, kFiniteDifferenceTol);
  const std::vector<float> x32(x.begin(), x.end()), dout32(dout.begin(), dout.end());
  std::vector<float> dinp(x.size(), 0.0f);
  gelu_backward(dinp.data(), x32.data(), dout32.data(), x.size(), threads(1));
  expect_close("kernel", dinp, fd, kFp32Tol);
}

// ---- softmax cross-entropy -----------------------------------------------------------------------------

struct CrossEntropyCase {
  std::size_t rows, vocab, padded_stride;
  float spread;  // logits uniform in [-spread, spread] ...
  float offset;  // ... plus offset
  int threads;
};

std::ostream& operator<<(std::ostream& os, const CrossEntropyCase& c) {
  return os << "rows=" << c.rows << " V=" << c.vocab << " stride=" << c.padded_stride << " logits=" << c.offset
            << "+-" << c.spread << " threads=" << c.threads;
}

class CrossEntropy : public ::testing::TestWithParam<CrossEntropyCase> {};

TEST_P(CrossEntropy, LossAndGradientMatchFloat64Reference) {
  const auto c = GetParam();
  auto rng = seeded_rng();
  const VocabSlice slice = whole_vocab(c.rows, c.vocab, c.padded_stride);
  // Padding columns hold a marker that must survive.
  constexpr float kPadding = 12345.0f;
  std::vector<float> logits(c.rows * slice.stride, kPadding);
  std::vector<double> dense(c.rows * c.vocab);
  std::uniform_real_distribution<float> dist(-c.spread, c.spread);
  for (std::size_t r = 0; r < c.rows; ++r)
    for (std::size_t v = 0; v < c.vocab; ++v) {
      logits[r * slice.stride + v] = c.offset + dist(rng);
      dense[r * c.vocab + v] = logits[r * slice.stride + v];
    }
  auto targets = random_tokens(c.rows, c.vocab, rng);
  if (c.rows > 2) targets[1] = -1;  // a row that does not count
  const auto counted = counted_targets(targets.data(), c.rows);
  const auto normaliser = static_cast<float>(counted);

  std::vector<float> losses(c.rows), dlogits(logits.size(), kPadding), stats(3 * c.rows);
  const double mean = softmax_cross_entropy(losses.data(), dlogits.data(), stats.data(), logits.data(), targets.data(),
                                            normaliser, slice, threads(c.threads));
  std::vector<double> losses_ref(c.rows), dlogits_ref(dense.size());
  const double mean_ref = ref::cross_entropy(losses_ref.data(), dlogits_ref.data(), dense.data(), targets.data(),
                                             c.rows, c.vocab, normaliser);
  // The loss is a difference of terms of size |offset|; its fp32 rounding scales with them.
  const double loss_tol = kFp32Tol * (1.0 + std::abs(c.offset) + c.spread);
  expect_close("losses", losses, losses_ref, loss_tol);
  EXPECT_NEAR(mean, mean_ref, loss_tol * (std::abs(mean_ref) + 1.0));
  std::vector<float> dense_grad(dense.size());
  for (std::size_t r = 0; r < c.rows; ++r)
    for (std::size_t v = 0; v < c.vocab; ++v) dense_grad[r * c.vocab + v] = dlogits[r * slice.stride + v];
  // exp(x - max) in fp32 has a relative error of about |x - max| * 2^-24.
  expect_close("dlogits", dense_grad, dlogits_ref, kFp32Tol * (1.0 + 2.0 * c.spread));
  for (std::size_t r = 0; r < c.rows; ++r)
    for (std::size_t v = c.vocab; v < slice.stride; ++v) ASSERT_EQ(dlogits[r * slice.stride + v], kPadding);
  for (float l : losses) ASSERT_TRUE(std::isfinite(l));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CrossEntropy,
                         ::testing::Values(CrossEntropyCase{1, 2, 0, 1.0f, 0.0f, 1},
                                           CrossEntropyCase{13, 1001, 0, 4.0f, 0.0f, 1},
                                           CrossEntropyCase{7, 50257, 50304, 3.0f, 0.0f, 2},
                                           CrossEntropyCase{9, 333, 0, 1000.0f, 0.0f, 3},     // peaked rows
                                           CrossEntropyCase{9, 333, 0, 2.0f, 80000.0f, 1},    // exp would overflow
                                           CrossEntropyCase{9, 333, 0, 2.0f, -80000.0f, 1}));  // ... or underflow

TEST(CrossEntropyGradient, ReferenceAndKernelMatchFiniteDifferences) {
  auto rng = seeded_rng();
  const std::size_t rows = 4, vocab = 17;
  const auto logits = widen(uniform(rows * vocab, rng, -3.0f, 3.0f));
  auto targets = random_tokens(rows, vocab, rng);
  targets[2] = -1;
  const double normaliser = 3.0;
  std::vector<double> losses(rows), dlogits(logits.size());
  ref::cross_entropy(losses.data(), dlogits.data(), logits.data(), targets.data(), rows, vocab, normaliser);
  const auto fd = numeric_gradient(logits, [&](const std::vector<double>& x) {
    std::vector<double> l(rows);
    return ref::cross_entropy(l.data(), nullptr, x.data(), targets.data(), rows, vocab, normaliser);
  });
  expect_close("reference", dlogits, fd, kFiniteDifferenceTol);

  const std::vector<float> logits32(logits.begin(), logits.end());
  std::vector<float> losses32(rows), dlogits32(logits.size()), stats(3 * rows);
  softmax_cross_entropy(losses32.data(), dlogits32.data(), stats.data(), logits32.data(), targets.data(),
                        static_cast<float>(normaliser), whole_vocab(rows, vocab), threads(1));
  expect_close("kernel", dlogits32, fd, kFp32Tol);
}

TEST(CrossEntropy, InPlaceGradientEqualsSeparateGradient) {
  auto rng = seeded_rng();
  const std::size_t rows = 5, vocab = 129;
  auto logits = uniform(rows * vocab, rng, -5.0f, 5.0f);
  const auto targets = random_tokens(rows, vocab, rng);
  const auto slice = whole_vocab(rows, vocab);
  std::vector<float> losses(rows), separate(logits.size()), stats(3 * rows), losses_in_place(rows);
  softmax_cross_entropy(losses.data(), separate.data(), stats.data(), logits.data(), targets.data(), 5.0f, slice,
                        threads(1));
  softmax_cross_entropy(losses_in_place.data(), logits.data(), stats.data(), logits.data(), targets.data(), 5.0f,
                        slice, threads(1));
  EXPECT_EQ(logits, separate);
  EXPECT_EQ(losses_in_place, losses);
}

// The vocabulary-parallel composition: three uneven slices, with the allreduces done by hand, give the
// whole-vocabulary losses and, slice by slice, the whole-vocabulary gradient.
TEST(CrossEntropy, VocabularySlicesComposeToTheWholeVocabulary) {
  auto rng = seeded_rng();
  const std::size_t rows = 11, vocab = 1000;
  const std::size_t bounds[] = {0, 301, 302, 1000};  // a one-column slice too
  const auto logits = uniform(rows * vocab, rng, -8.0f, 8.0f);
  auto targets = random_tokens(rows, vocab, rng);
  targets[0] = 301;  // in the one-column slice
  targets[3] = -1;
  const float normaliser = 10.0f;

  std::vector<float> whole_losses(rows), whole_grad(logits.size()), stats(3 * rows);
  softmax_cross_entropy(whole_losses.data(), whole_grad.data(), stats.data(), logits.data(), targets.data(),
                        normaliser, whole_vocab(rows, vocab), threads(1));

  const int ranks = 3;
  std::vector<std::vector<float>> shards(ranks);
  std::vector<VocabSlice> slices(ranks);
  for (int k = 0; k < ranks; ++k) {
    const std::size_t width = bounds[k + 1] - bounds[k];
    slices[k] = VocabSlice{rows, width, width, bounds[k], vocab};
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t v = bounds[k]; v < bounds[k + 1]; ++v) shards[k].push_back(logits[r * vocab + v]);
  }
  std::vector<float> global_max(rows, -std::numeric_limits<float>::infinity()), global_sum(rows, 0.0f),
      global_target(rows, 0.0f), local(rows);
  for (int k = 0; k < ranks; ++k) {
    cross_entropy_row_max(local.data(), shards[k].data(), slices[k], threads(1));
    for (std::size_t r = 0; r < rows; ++r) global_max[r] = std::max(global_max[r], local[r]);
  }
  for (int k = 0; k < ranks; ++k) {
    cross_entropy_row_sum_exp(local.data(), shards[k].data(), global_max.data(), slices[k], threads(1));
    for (std::size_t r = 0; r < rows; ++r) global_sum[r] += local[r];
    cross_entropy_target_logit(local.data(), shards[k].data(), targets.data(), slices[k], threads(1));
    for (std::size_t r = 0; r < rows; ++r) global_target[r] += local[r];
  }
  std::vector<double> whole_losses64(whole_losses.begin(), whole_losses.end());
  for (int k = 0; k < ranks; ++k) {
    std::vector<float> losses(rows), grad(shards[k].size());
    cross_entropy_loss_and_grad(losses.data(), grad.data(), shards[k].data(), targets.data(), global_max.data(),
                                global_sum.data(), global_target.data(), normaliser, slices[k], threads(1));
    expect_close("losses of slice " + std::to_string(k), losses, whole_losses64, kFp32Tol);
    std::vector<double> want;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t v = bounds[k]; v < bounds[k + 1]; ++v) want.push_back(whole_grad[r * vocab + v]);
    expect_close("gradient of slice " + std::to_string(k), grad, want, kFp32Tol);
  }
}

TEST(CrossEntropy, NanLogitMakesItsRowLossNan) {
  std::vector<float> logits = {0.5f, std::nanf(""), -1.0f, 0.5f, 0.25f, -1.0f};
  const std::vector<std::int32_t> targets = {0, 0};
  std::vector<float> losses(2), grad(6), stats(6);
  softmax_cross_entropy(losses.data(), grad.data(), stats.data(), logits.data(), targets.data(), 2.0f,
                        whole_vocab(2, 3), threads(1));
  EXPECT_TRUE(std::isnan(losses[0]));  // never silently dropped
  EXPECT_TRUE(std::isfinite(losses[1]));
}

TEST(CrossEntropyArguments, Rejected) {
  std::vector<float> logits(8, 0.0f), out(8);
  const std::vector<std::int32_t> beyond = {0, 4};
  const auto slice = whole_vocab(2, 4);
  EXPECT_THROW(cross_entropy_target_logit(out.data(), logits.data(), beyond.data(), slice, threads(1)),
               std::invalid_argument);
  const std::vector<std::int32_t> fine = {0, 3};
  std::vector<float> stats(6);
  EXPECT_THROW(softmax_cross_entropy(out.data(), nullptr, stats.data(), logits.data(), fine.data(), 0.0f, slice,
                                     threads(1)),
               std::invalid_argument);
  EXPECT_THROW(cross_entropy_row_max(out.data(), logits.data(), VocabSlice{2, 3, 3, 2, 4}, threads(1)),
               std::invalid_argument);  // columns [2, 5) of a vocabulary of 4
  EXPECT_THROW(cross_entropy_row_max(out.data(), logits.data(), VocabSlice{2, 4, 3, 0, 4}, threads(1)),
               std::invalid_argument);  // stride below width
  EXPECT_THROW(softmax_cross_entropy(out.data(), nullptr, stats.data(), logits.data(), fine.data(), 1.0f,
                                     VocabSlice{2, 2, 4, 0, 4}, threads(1)),
               std::invalid_argument);  // not the whole vocabulary
}

// ---- embedding -----------------------------------------------------------------------------------------

TEST(Embedding, ForwardAndBackwardMatchFloat64Reference) {
  auto rng = seeded_rng();
  const std::size_t batch = 3, seq = 5, max_seq = 8, channels = 37, vocab = 4;  // few tokens: many repeats
  const auto tokens = random_tokens(batch * seq, vocab, rng);
  const auto wte = uniform(vocab * channels, rng), wpe = uniform(max_seq * channels, rng);
  const auto dout = uniform(batch * seq * channels, rng);
  std::vector<float> out(batch * seq * channels);
  embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), batch, seq, channels, vocab, threads(2));
  std::vector<double> out_ref(out.size());
  ref::embedding_forward(out_ref.data(), tokens.data(), widen(wte).data(), widen(wpe).data(), batch, seq, channels);
  expect_close("out", out, out_ref, kFp32Tol);

  auto dwte = uniform(vocab * channels, rng), dwpe = uniform(max_seq * channels, rng);
  const auto dwte0 = dwte, dwpe0 = dwpe;
  embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), batch, seq, channels, threads(2));
  std::vector<double> dwte_ref(vocab * channels), dwpe_ref(seq * channels);
  ref::embedding_backward(dwte_ref.data(), dwpe_ref.data(), widen(dout).data(), tokens.data(), vocab, batch, seq,
                          channels);
  dwpe_ref.resize(max_seq * channels, 0.0);  // positions beyond T get no gradient
  expect_close("dwte", dwte, plus(dwte0, dwte_ref), kFp32Tol);
  expect_close("dwpe", dwpe, plus(dwpe0, dwpe_ref), kFp32Tol);

  // The reference gradient against finite differences of sum(out * dout).
  const auto dout64 = widen(dout);
  const auto fd_wte = numeric_gradient(widen(wte), [&](const std::vector<double>& w) {
    std::vector<double> o(out.size());
    ref::embedding_forward(o.data(), tokens.data(), w.data(), widen(wpe).data(), batch, seq, channels);
    return dot(o, dout64);
  });
  expect_close("reference dwte vs finite differences", dwte_ref, fd_wte, kFiniteDifferenceTol);
}

TEST(Embedding, GradientIdenticalForAnyThreadCount) {
  auto rng = seeded_rng();
  // Large enough that the kernel really runs on 3 threads (it keeps small problems on fewer).
  const std::size_t batch = 8, seq = 128, channels = 72, vocab = 10;
  const auto tokens = random_tokens(batch * seq, vocab, rng);
  const auto dout = uniform(batch * seq * channels, rng);
  auto run = [&](int n_threads) {
    std::vector<float> dwte(vocab * channels), dwpe(seq * channels);
    embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), batch, seq, channels, threads(n_threads));
    dwte.insert(dwte.end(), dwpe.begin(), dwpe.end());
    return dwte;
  };
  EXPECT_EQ(run(1), run(3));
}

TEST(Embedding, TokenOutsideVocabularyRejected) {
  std::vector<float> table(8, 0.0f), out(8);
  for (const std::int32_t bad : {-1, 4}) {
    const std::vector<std::int32_t> tokens = {0, bad};
    EXPECT_THROW(embedding_forward(out.data(), tokens.data(), table.data(), table.data(), 1, 2, 2, 4, threads(1)),
                 std::invalid_argument)
        << "token " << bad;
  }
}

// ---- residual ------------------------------------------------------------------------------------------

TEST(Residual, ForwardAddsAndBackwardReachesBothBranches) {
  auto rng = seeded_rng();
  const std::size_t n = 40001;
  const auto a = uniform(n, rng), b = uniform(n, rng), dout = uniform(n, rng);
  std::vector<float> out(n);
  residual_forward(out.data(), a.data(), b.data(), n, threads(3));
  auto da = uniform(n, rng), db = uniform(n, rng), dst = uniform(n, rng);
  const auto da0 = da, db0 = db, dst0 = dst;
  residual_backward(da.data(), db.data(), dout.data(), n, threads(3));
  accumulate(dst.data(), dout.data(), n, threads(3));
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[i], a[i] + b[i]) << i;  // one fp32 addition: exact agreement
    ASSERT_EQ(da[i], da0[i] + dout[i]) << i;
    ASSERT_EQ(db[i], db0[i] + dout[i]) << i;
    ASSERT_EQ(dst[i], dst0[i] + dout[i]) << i;
  }
  auto in_place = a;
  residual_forward(in_place.data(), in_place.data(), b.data(), n, threads(1));
  EXPECT_EQ(in_place, out);
}

// ---- AdamW ---------------------------------------------------------------------------------------------

TEST(AdamW, ThreeStepsMatchFloat64Reference) {
  auto rng = seeded_rng();
  const std::size_t n = 50003;
  AdamWConfig config;
  config.learning_rate = 1e-3f;
  config.weight_decay = 0.1f;
  auto params = uniform(n, rng);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  auto params64 = widen(params);
  std::vector<double> m64(n, 0.0), v64(n, 0.0);
  for (long step = 1; step <= 3; ++step) {
    const auto grads = uniform(n, rng, -0.1f, 0.1f);
    const float grad_scale = step == 2 ? 0.5f : 1.0f;  // as gradient clipping would
    adamw_update(params.data(), grads.data(), m.data(), v.data(), n, config, step, grad_scale, threads(3));
    ref::adamw_update(params64.data(), widen(grads).data(), m64.data(), v64.data(), n, config.learning_rate,
                      config.beta1, config.beta2, config.eps, config.weight_decay, step, grad_scale);
  }
  expect_close("m", m, m64, kFp32Tol);
  expect_close("v", v, v64, kFp32Tol);
  expect_close("params", params, params64, kFp32Tol);
}

TEST(AdamW, FirstStepMovesEachParameterByTheLearningRate) {
  // With m = v = 0, bias correction makes the first update lr * g / (|g| + eps) = lr * sign(g), for any beta:
  // a check of the correction that does not rely on the reference's arithmetic.
  auto rng = seeded_rng();
  const std::size_t n = 1000;
  AdamWConfig config;
  config.learning_rate = 0.01f;
  const auto grads = uniform(n, rng, 0.01f, 1.0f);
  std::vector<float> params(n, 1.0f), m(n, 0.0f), v(n, 0.0f);
  adamw_update(params.data(), grads.data(), m.data(), v.data(), n, config, 1, 1.0f, threads(1));
  for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(params[i], 1.0f - config.learning_rate, 1e-6) << i;
}

TEST(AdamW, BiasCorrection) {
  AdamWConfig config;
  config.beta1 = 0.9f;
  config.beta2 = 0.95f;
  const AdamWBiasCorrection first = adamw_bias_correction(config, 1, 1.0f);
  EXPECT_NEAR(first.inv_correction1, 1.0 / (1.0 - 0.9f), 1e-5);
  EXPECT_NEAR(first.inv_correction2, 1.0 / (1.0 - 0.95f), 1e-4);
  const AdamWBiasCorrection later = adamw_bias_correction(config, 10000, 1.0f);
  EXPECT_FLOAT_EQ(later.inv_correction1, 1.0f);
  EXPECT_FLOAT_EQ(later.inv_correction2, 1.0f);
  EXPECT_THROW(adamw_bias_correction(config, 0, 1.0f), std::invalid_argument);
  EXPECT_THROW(adamw_bias_correction(config, 1, std::nanf("")), std::invalid_argument);
}

TEST(AdamW, ArgumentsRejected) {
  float x = 0.0f;
  AdamWConfig config;
  EXPECT_EQ(validate(config), "");
  EXPECT_THROW(adamw_update(&x, &x, &x, &x, 1, config, 0, 1.0f, threads(1)), std::invalid_argument);
  EXPECT_THROW(adamw_update(&x, &x, &x, &x, 1, config, 1, std::nanf(""), threads(1)), std::invalid_argument);
  for (auto broken : {AdamWConfig{1e-3f, 1.0f, 0.95f, 1e-8f, 0.0f}, AdamWConfig{1e-3f, 0.9f, -0.1f, 1e-8f, 0.0f},
                      AdamWConfig{1e-3f, 0.9f, 0.95f, 0.0f, 0.0f}, AdamWConfig{-1.0f, 0.9f, 0.95f, 1e-8f, 0.0f},
                      AdamWConfig{1e-3f, 0.9f, 0.95f, 1e-8f, -0.5f}}) {
    EXPECT_NE(validate(broken), "");
    EXPECT_THROW(adamw_update(&x, &x, &x, &x, 1, broken, 1, 1.0f, threads(1)), std::invalid_argument);
  }
}

// ---- squared norm and clipping -------------------------------------------------------------------------

TEST(SquaredNorm, MatchesDoubleSum) {
  auto rng = seeded_rng();
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{100003}}) {
    const auto x = uniform(n, rng, -3.0f, 3.0f);
    double want = 0.0;
    for (float e : x) want += static_cast<double>(e) * e;
    for (int t : {1, 4}) {
      const double got = squared_norm(x.data(), n, threads(t));
      EXPECT_NEAR(got, want, 1e-12 * (want + 1.0)) << "n=" << n << " threads=" << t;
      EXPECT_EQ(got, squared_norm(x.data(), n, threads(t))) << "repeatable";
    }
  }
  const float huge[] = {3e30f, 4e30f};  // squares overflow float, not double
  EXPECT_NEAR(std::sqrt(squared_norm(huge, 2, threads(1))), 5e30, 1e24);
}

TEST(SquaredNorm, ClipScale) {
  EXPECT_EQ(clip_scale(0.5, 1.0f), 1.0f);
  EXPECT_EQ(clip_scale(1.0, 1.0f), 1.0f);
  EXPECT_FLOAT_EQ(clip_scale(4.0, 1.0f), 0.25f);
  EXPECT_EQ(clip_scale(4.0, 0.0f), 1.0f);  // clipping off
}

// ---- bf16 ------------------------------------------------------------------------------------------------

// Round to nearest even written another way: choose between the two bf16 neighbours in double.
std::uint16_t nearest_even_bf16(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t below = bits & 0xffff0000u;
  const std::uint32_t above = below + 0x10000u;
  const double d = x;
  const double lo = std::bit_cast<float>(below);
  double hi = std::bit_cast<float>(above);
  // Above the largest bf16 the next step would be 2^128: the halfway point to it is where infinity begins.
  if (std::isinf(hi)) hi = std::copysign(std::ldexp(1.0, 128), d);
  const double to_lo = std::abs(d - lo), to_hi = std::abs(d - hi);
  if (to_lo < to_hi) return static_cast<std::uint16_t>(below >> 16);
  if (to_hi < to_lo) return static_cast<std::uint16_t>(above >> 16);
  return static_cast<std::uint16_t>(((below >> 16) & 1u) == 0 ? below >> 16 : above >> 16);
}

TEST(Bf16, TiesRoundToEven) {
  const float one = 1.0f, ulp = std::ldexp(1.0f, -7);  // bf16 keeps 7 fraction bits
  EXPECT_EQ(to_float(to_bf16(one + ulp / 2)), one);                 // tie, 1.0 is even
  EXPECT_EQ(to_float(to_bf16(one + 3 * ulp / 2)), one + 2 * ulp);   // tie, 1 + ulp is odd: up
  EXPECT_EQ(to_float(to_bf16(std::nextafter(one + ulp / 2, 2.0f))), one + ulp);  // just above a tie: up
  EXPECT_EQ(to_float(to_bf16(-(one + ulp / 2))), -one);
  EXPECT_EQ(to_bf16(-0.0f).bits, 0x8000u);
  EXPECT_EQ(to_float(to_bf16(std::numeric_limits<float>::max())), std::numeric_limits<float>::infinity());
  EXPECT_EQ(to_float(to_bf16(-std::numeric_limits<float>::infinity())), -std::numeric_limits<float>::infinity());
  const float subnormal = std::bit_cast<float>(0x00018000u);  // tie between 0x0001 and 0x0002 (bf16 bits)
  EXPECT_EQ(to_bf16(subnormal).bits, 0x0002u);
}

TEST(Bf16, NanStaysNan) {
  for (const std::uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fffffffu}) {
    const BFloat16 b = to_bf16(std::bit_cast<float>(bits));
    EXPECT_TRUE(std::isnan(to_float(b))) << std::hex << bits << " -> " << b.bits;
    EXPECT_EQ(b.bits & 0x8000u, (bits >> 16) & 0x8000u) << "sign of " << std::hex << bits;
  }
}

TEST(Bf16, RandomBitPatternsMatchNearestEven) {
  auto rng = seeded_rng();
  std::uniform_int_distribution<std::uint32_t> dist;
  std::vector<float> values(1 << 20);
  for (float& x : values) {
    do x = std::bit_cast<float>(dist(rng)); while (std::isnan(x));
  }
  std::vector<BFloat16> rounded(values.size());
  cast_to_bf16(rounded.data(), values.data(), values.size(), threads(3));
  std::vector<float> back(values.size());
  cast_to_float(back.data(), rounded.data(), values.size(), threads(3));
  for (std::size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(rounded[i].bits, nearest_even_bf16(values[i])) << std::hex << std::bit_cast<std::uint32_t>(values[i]);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(back[i]), static_cast<std::uint32_t>(rounded[i].bits) << 16);
  }
}

// ---- flush to zero -------------------------------------------------------------------------------------

#if defined(__x86_64__) || defined(__i386__)
// A product whose exact value is subnormal: zero when flushed. volatile keeps it out of constant folding.
float subnormal_product() {
  volatile float tiny = 1e-30f;
  volatile float factor = 1e-10f;
  return tiny * factor;
}

void clear_flush_to_zero() { _mm_setcsr(_mm_getcsr() & ~0x8040u); }

TEST(FlushToZero, ScopedModeFlushesAndRestores) {
  clear_flush_to_zero();
  ASSERT_NE(subnormal_product(), 0.0f);
  {
    ScopedFlushToZero flushing;
    EXPECT_TRUE(flush_to_zero_enabled());
    EXPECT_EQ(subnormal_product(), 0.0f);
  }
  EXPECT_FALSE(flush_to_zero_enabled());
  EXPECT_NE(subnormal_product(), 0.0f);
}

TEST(FlushToZero, EveryOpenMpThreadFlushes) {
  const int team = 3;
  EXPECT_EQ(enable_flush_to_zero_all_threads(team), team);
  int flushing = 0, threads_seen = 0;
#pragma omp parallel num_threads(team) reduction(+ : flushing, threads_seen)
  {
    threads_seen += 1;
    flushing += flush_to_zero_enabled() && subnormal_product() == 0.0f ? 1 : 0;
  }
  EXPECT_EQ(flushing, threads_seen);
  // Leave the threads as other tests expect them.
#pragma omp parallel num_threads(team)
  clear_flush_to_zero();
  clear_flush_to_zero();
}
#else
TEST(FlushToZero, Unsupported) {
  EXPECT_FALSE(enable_flush_to_zero());
  EXPECT_EQ(enable_flush_to_zero_all_threads(2), 0);
  GTEST_SKIP() << "no MXCSR on this platform: the helpers are no-ops";
}
#endif

}  // namespace
}  // namespace strata::layers
