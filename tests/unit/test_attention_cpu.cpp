// Unit tests of the CPU attention kernels: flash and naive forward/backward against the float64 reference on
// fresh random inputs, over the shapes that stress blocking (ragged lengths), causal alignment (Sq != Skv,
// rows that see no key), grouped-query heads and threading; plus validate(), the FLOP conventions and
// compare().
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention.h"

namespace strata::attention {
namespace {

const double kTol = tolerance(Precision::fp32);

struct Tensors {
  std::vector<float> values;
  std::vector<double> exact;  // the same values in float64, for the reference
};

// Uniform in [-spread, spread]; a larger spread widens the score range so running maxima move between tiles.
// A fresh seed per run, so repeated runs cover more inputs, printed so that a failure can be reproduced:
// STRATA_TEST_SEED=<seed> ./strata-unit-tests --gtest_filter=...
unsigned test_seed() {
  static const unsigned seed = [] {
    const char* given = std::getenv("STRATA_TEST_SEED");
    const unsigned value = given ? static_cast<unsigned>(std::strtoul(given, nullptr, 10)) : std::random_device{}();
    std::printf("[ seed     ] STRATA_TEST_SEED=%u (random inputs of the attention reference tests)\n", value);
    return value;
  }();
  return seed;
}

Tensors random_tensor(std::size_t n, std::mt19937& rng, float spread = 1.0f) {
  std::uniform_real_distribution<float> dist(-spread, spread);
  Tensors t{std::vector<float>(n), std::vector<double>(n)};
  for (std::size_t i = 0; i < n; ++i) {
    t.values[i] = dist(rng);
    t.exact[i] = t.values[i];
  }
  return t;
}

struct Case {
  const char* name;
  Shape shape;
  CpuOptions options;
  float spread = 1.0f;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

CpuOptions blocks(int threads, int q_block, int kv_block) {
  CpuOptions o;
  o.threads = threads;
  o.q_block = o.bwd_q_block = q_block;
  o.kv_block = o.bwd_kv_block = kv_block;
  return o;
}
CpuOptions defaults(int threads) {
  CpuOptions o;
  o.threads = threads;
  return o;
}
// The same blocking with cblas_sgemm for every block product, so both engines stay checked.
CpuOptions with_blas(CpuOptions o) {
  o.products = BlockProducts::blas;
  return o;
}

// Gradients that are zero in exact arithmetic (dQ, dK when every row sees one key) leave fp32 rounding
// noise of about 1e-7 for these O(1) inputs; the floor lets that pass while real errors stay O(gradient).
constexpr double kGradientNoiseFloor = 1e-6;

void expect_close(const char* what, const float* got, const double* ref, std::size_t n, double abs_floor = 0.0) {
  const ErrorReport r = compare(got, ref, n, kTol, abs_floor);
  EXPECT_TRUE(within(r, kTol)) << what << ": rel_l2=" << r.rel_l2 << " max_abs=" << r.max_abs << " bad=" << r.bad
                               << " of " << n;
}

using Kernel = void (*)(const Shape&, const float*, const float*, const float*, float*, float*, const CpuOptions&);
using BackwardKernel = void (*)(const Shape&, const float*, const float*, const float*, const float*, const float*,
                                const float*, float*, float*, float*, const CpuOptions&);

// Runs forward and backward of one kernel family and the reference on the same random inputs.
void check_against_reference(const Case& c, Kernel forward, BackwardKernel backward) {
  // Multi-threaded cases need the kernels built with OpenMP; validate() says so when they are not.
  if (const std::string problem = validate(c.options); !problem.empty()) GTEST_SKIP() << problem;
  const Shape& s = c.shape;
  const unsigned seed = test_seed();
  SCOPED_TRACE("STRATA_TEST_SEED=" + std::to_string(seed));
  std::mt19937 rng(seed);
  const std::size_t nq = q_elements(s), nkv = kv_elements(s), nl = lse_elements(s);
  const Tensors q = random_tensor(nq, rng, c.spread), k = random_tensor(nkv, rng, c.spread),
                v = random_tensor(nkv, rng), d_o = random_tensor(nq, rng);

  std::vector<double> o_ref(nq), lse_ref(nl), dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
  reference_forward(s, q.exact.data(), k.exact.data(), v.exact.data(), o_ref.data(), lse_ref.data());
  reference_backward(s, q.exact.data(), k.exact.data(), v.exact.data(), o_ref.data(), d_o.exact.data(),
                     lse_ref.data(), dq_ref.data(), dk_ref.data(), dv_ref.data());

  // Outputs start as NaN so any element a kernel forgets to write fails the comparison.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> o(nq, nan), lse(nl, nan), dq(nq, nan), dk(nkv, nan), dv(nkv, nan);
  forward(s, q.values.data(), k.values.data(), v.values.data(), o.data(), lse.data(), c.options);
  expect_close("O", o.data(), o_ref.data(), nq);
  expect_close("lse", lse.data(), lse_ref.data(), nl);
  backward(s, q.values.data(), k.values.data(), v.values.data(), o.data(), d_o.values.data(), lse.data(), dq.data(),
           dk.data(), dv.data(), c.options);
  expect_close("dQ", dq.data(), dq_ref.data(), nq, kGradientNoiseFloor);
  expect_close("dK", dk.data(), dk_ref.data(), nkv, kGradientNoiseFloor);
  expect_close("dV", dv.data(), dv_ref.data(), nkv);
}

class FlashVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(FlashVsReference, ForwardAndBackwardMatch) {
  check_against_reference(GetParam(), flash_forward, flash_backward);
}

// Shape{batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, causal}. Small blocks make short sequences span
// several ragged tiles; the default blocks cover the tile sizes used for speed.
INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashVsReference,
    ::testing::Values(
        Case{"seq1", {1, 2, 2, 1, 1, 64, false}, defaults(1)},
        Case{"seq1_causal", {1, 2, 2, 1, 1, 64, true}, defaults(1)},
        Case{"seq17_small_blocks", {1, 2, 2, 17, 17, 64, false}, blocks(1, 8, 8)},
        Case{"seq17_causal_small_blocks", {1, 2, 2, 17, 17, 64, true}, blocks(1, 8, 8)},
        Case{"seq100_causal", {1, 2, 2, 100, 100, 64, true}, blocks(1, 32, 48)},
        Case{"seq257", {1, 2, 2, 257, 257, 64, false}, defaults(1)},
        Case{"seq124_every_lane_count", {1, 1, 1, 124, 124, 64, false}, blocks(1, 124, 64)},
        Case{"seq257_causal", {1, 2, 2, 257, 257, 64, true}, defaults(1)},
        Case{"seq257_causal_small_blocks", {1, 1, 1, 257, 257, 64, true}, blocks(1, 40, 64)},
        Case{"wide_scores_move_the_max", {1, 2, 2, 200, 300, 64, false}, blocks(1, 32, 64), 4.0f},
        Case{"wide_scores_causal", {1, 2, 2, 200, 200, 64, true}, blocks(1, 32, 64), 4.0f},
        Case{"sq_lt_skv_causal", {1, 2, 2, 100, 257, 64, true}, blocks(1, 32, 64)},
        Case{"sq_gt_skv_causal_empty_rows", {1, 2, 2, 257, 100, 64, true}, blocks(1, 32, 64)},
        Case{"sq_lt_skv", {1, 2, 2, 17, 100, 64, false}, defaults(1)},
        Case{"sq_gt_skv", {1, 2, 2, 100, 17, 64, false}, defaults(1)},
        Case{"dim128_causal", {1, 2, 2, 130, 130, 128, true}, blocks(1, 64, 64)},
        Case{"dim128", {1, 2, 2, 130, 70, 128, false}, defaults(1)},
        Case{"dim_odd", {1, 2, 1, 33, 45, 7, true}, blocks(1, 8, 16)},
        Case{"gqa4_causal", {1, 8, 2, 100, 100, 64, true}, blocks(1, 32, 32)},
        Case{"gqa8", {1, 8, 1, 70, 90, 64, false}, defaults(1)},
        Case{"batch2_gqa4", {2, 4, 1, 65, 65, 64, true}, blocks(1, 16, 32)},
        Case{"threads2_causal", {2, 4, 4, 129, 129, 64, true}, blocks(2, 32, 32)},
        Case{"threads2_gqa8_split_keys", {1, 8, 1, 150, 150, 64, true}, blocks(2, 32, 32)},
        Case{"threads2_batch2_gqa4_split_keys", {2, 4, 1, 90, 120, 128, false}, blocks(2, 16, 32)},
        Case{"threads2_sq_gt_skv_causal", {1, 4, 2, 120, 50, 64, true}, blocks(2, 16, 16)},
        // Default blocks on causal shapes long enough for the diagonal tiles to skip register blocks.
        Case{"sq_lt_skv_causal_default_blocks", {1, 2, 1, 300, 700, 64, true}, defaults(1)},
        Case{"sq_gt_skv_causal_default_blocks", {1, 2, 1, 700, 300, 64, true}, defaults(1)},
        Case{"dim128_causal_default_blocks", {1, 1, 1, 450, 450, 128, true}, defaults(1)},
        Case{"blas_seq257_causal", {1, 2, 2, 257, 257, 64, true}, with_blas(defaults(1))},
        Case{"blas_sq_gt_skv_causal", {1, 2, 2, 257, 100, 64, true}, with_blas(blocks(1, 32, 64))},
        Case{"blas_sq_lt_skv_causal_dim128", {1, 2, 1, 100, 257, 128, true}, with_blas(blocks(1, 48, 64))},
        Case{"blas_threads2_gqa4", {2, 4, 1, 90, 120, 64, false}, with_blas(blocks(2, 16, 32))}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

class NaiveVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(NaiveVsReference, ForwardAndBackwardMatch) {
  check_against_reference(GetParam(), naive_forward, naive_backward);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, NaiveVsReference,
    ::testing::Values(Case{"seq17", {1, 2, 2, 17, 17, 64, false}, defaults(1)},
                      Case{"seq100_causal", {1, 2, 2, 100, 100, 64, true}, defaults(1)},
                      Case{"sq_gt_skv_causal_empty_rows", {1, 2, 2, 60, 25, 64, true}, defaults(1)},
                      Case{"sq_lt_skv_causal", {1, 2, 2, 25, 60, 128, true}, defaults(1)},
                      Case{"threads2_batch2_gqa4", {2, 8, 2, 40, 50, 64, true}, defaults(2)}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The reference itself, against central differences of L = sum(dO * O) on a tiny causal GQA shape with
// Sq > Skv (so one query row sees no key), where float64 differences are accurate to ~1e-9.
TEST(ReferenceBackward, MatchesFiniteDifferences) {
  const Shape s{1, 2, 1, 4, 3, 5, true};
  std::mt19937 rng(3);
  Tensors q = random_tensor(q_elements(s), rng), k = random_tensor(kv_elements(s), rng),
          v = random_tensor(kv_elements(s), rng), d_o = random_tensor(q_elements(s), rng);
  std::vector<double> o(q_elements(s)), lse(lse_elements(s));
  auto loss = [&] {
    reference_forward(s, q.exact.data(), k.exact.data(), v.exact.data(), o.data(), lse.data());
    double sum = 0.0;
    for (std::size_t i = 0; i < o.size(); ++i) sum += d_o.exact[i] * o[i];
    return sum;
  };
  loss();
  std::vector<double> dq(q_elements(s)), dk(kv_elements(s)), dv(kv_elements(s));
  reference_backward(s, q.exact.data(), k.exact.data(), v.exact.data(), o.data(), d_o.exact.data(), lse.data(),
                     dq.data(), dk.data(), dv.data());
  auto check = [&](const char* what, std::vector<double>& x, const std::vector<double>& grad) {
    constexpr double h = 1e-6;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      const double up = loss();
      x[i] = saved - h;
      const double down = loss();
      x[i] = saved;
      EXPECT_NEAR(grad[i], (up - down) / (2 * h), 1e-7) << what << "[" << i << "]";
    }
  };
  check("dQ", q.exact, dq);
  check("dK", k.exact, dk);
  check("dV", v.exact, dv);
}

TEST(FlashForward, ResultDoesNotDependOnThreadCount) {
  if (const std::string problem = validate(blocks(2, 32, 64)); !problem.empty()) GTEST_SKIP() << problem;
  const Shape s{2, 4, 2, 150, 150, 64, true};
  std::mt19937 rng(7);
  const Tensors q = random_tensor(q_elements(s), rng), k = random_tensor(kv_elements(s), rng),
                v = random_tensor(kv_elements(s), rng);
  std::vector<float> o1(q_elements(s)), o2(q_elements(s)), l1(lse_elements(s)), l2(lse_elements(s));
  flash_forward(s, q.values.data(), k.values.data(), v.values.data(), o1.data(), l1.data(), blocks(1, 32, 64));
  flash_forward(s, q.values.data(), k.values.data(), v.values.data(), o2.data(), l2.data(), blocks(2, 32, 64));
  EXPECT_EQ(o1, o2);  // each query block is computed by one thread in the same order either way
  EXPECT_EQ(l1, l2);
}

TEST(FlashForward, RowsThatSeeNoKeyGiveZerosAndMinusInfinity) {
  const Shape s{1, 1, 1, 6, 2, 8, true};  // query i sees keys j <= i - 4: rows 0..3 see nothing
  std::vector<float> q(q_elements(s), 0.5f), k(kv_elements(s), 0.25f), v(kv_elements(s), 2.0f);
  std::vector<float> o(q_elements(s), 1.0f), lse(lse_elements(s), 1.0f);
  flash_forward(s, q.data(), k.data(), v.data(), o.data(), lse.data(), defaults(1));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(lse[i], -std::numeric_limits<float>::infinity()) << "row " << i;
    for (int c = 0; c < 8; ++c) EXPECT_EQ(o[i * 8 + c], 0.0f) << "row " << i;
  }
  for (int c = 0; c < 8; ++c) EXPECT_FLOAT_EQ(o[4 * 8 + c], 2.0f);  // row 4 sees key 0 only: O = v_0
}

TEST(Validate, AcceptsGoodShapes) {
  EXPECT_EQ(validate(Shape{1, 8, 8, 2048, 2048, 64, false}), "");
  EXPECT_EQ(validate(Shape{2, 8, 1, 1, 5, 3, true}), "");
  EXPECT_EQ(validate(CpuOptions{}), "");
}

TEST(Validate, NamesTheProblem) {
  auto message = [](Shape s) { return validate(s); };
  EXPECT_NE(message({0, 8, 8, 16, 16, 64, false}).find("batch"), std::string::npos);
  EXPECT_NE(message({1, 0, 1, 16, 16, 64, false}).find("heads_q"), std::string::npos);
  EXPECT_NE(message({1, 8, -1, 16, 16, 64, false}).find("heads_kv"), std::string::npos);
  EXPECT_NE(message({1, 8, 3, 16, 16, 64, false}).find("multiple"), std::string::npos);
  EXPECT_NE(message({1, 8, 8, 0, 16, 64, false}).find("seq_q"), std::string::npos);
  EXPECT_NE(message({1, 8, 8, 16, -4, 64, false}).find("seq_kv"), std::string::npos);
  EXPECT_NE(message({1, 8, 8, 16, 16, 0, false}).find("head_dim"), std::string::npos);
  CpuOptions bad;
  bad.threads = 0;
  EXPECT_NE(validate(bad).find("threads"), std::string::npos);
  bad = CpuOptions{};
  bad.kv_block = 0;
  EXPECT_NE(validate(bad).find("block"), std::string::npos);
}

TEST(Validate, KernelsRejectBadInput) {
  const Shape bad{1, 8, 3, 16, 16, 64, false};
  std::vector<float> buffer(8 * 16 * 64);
  float* p = buffer.data();
  EXPECT_THROW(flash_forward(bad, p, p, p, p, p, defaults(1)), std::invalid_argument);
  EXPECT_THROW(flash_backward(bad, p, p, p, p, p, p, p, p, p, defaults(1)), std::invalid_argument);
  EXPECT_THROW(naive_forward(bad, p, p, p, p, p, defaults(1)), std::invalid_argument);
  CpuOptions zero_threads;
  zero_threads.threads = 0;
  EXPECT_THROW(flash_forward(Shape{1, 1, 1, 16, 16, 64, false}, p, p, p, p, p, zero_threads),
               std::invalid_argument);
}

TEST(Flops, FollowTheFlashAttentionConvention) {
  const Shape s{2, 8, 2, 1024, 2048, 64, false};
  const double full = 4.0 * 2 * 8 * 1024 * 2048 * 64;
  EXPECT_DOUBLE_EQ(forward_flops(s), full);
  EXPECT_DOUBLE_EQ(backward_flops(s), 2.5 * full);
  Shape causal = s;
  causal.causal = true;
  EXPECT_DOUBLE_EQ(forward_flops(causal), full / 2);
  EXPECT_DOUBLE_EQ(backward_flops(causal), 2.5 * full / 2);
}

TEST(Compare, ReportsErrors) {
  const std::vector<double> ref{1.0, -2.0, 0.0, -std::numeric_limits<double>::infinity()};
  const std::vector<float> same{1.0f, -2.0f, 0.0f, -std::numeric_limits<float>::infinity()};
  const ErrorReport exact = compare(same.data(), ref.data(), ref.size(), 1e-4);
  EXPECT_EQ(exact.bad, 0u);
  EXPECT_EQ(exact.rel_l2, 0.0);
  EXPECT_TRUE(within(exact, 1e-4));

  const std::vector<float> off{1.0f, -2.5f, 0.0f, -std::numeric_limits<float>::infinity()};
  const ErrorReport wrong = compare(off.data(), ref.data(), ref.size(), 1e-4);
  EXPECT_EQ(wrong.bad, 1u);
  EXPECT_DOUBLE_EQ(wrong.max_abs, 0.5);
  EXPECT_NEAR(wrong.rel_l2, 0.5 / std::sqrt(5.0), 1e-12);
  EXPECT_FALSE(within(wrong, 1e-4));
  // The message names the bad element by row and column of a tensor two wide: element 1 is row 0, column 1.
  const std::string line = describe("dv", wrong, 2);
  EXPECT_NE(line.find("dv rel_l2 "), std::string::npos) << line;
  EXPECT_NE(line.find("bad 1 (worst "), std::string::npos) << line;
  EXPECT_NE(line.find(" x its bound at row 0, column 1)"), std::string::npos) << line;
  EXPECT_EQ(describe("o", exact, 2), "o rel_l2 0.00e+00 bad 0");

  // Against an all-zero reference only the floor can tell rounding noise from an error.
  const std::vector<double> zeros{0.0, 0.0, 0.0};
  const std::vector<float> noise{1e-7f, -1e-7f, 0.0f};
  EXPECT_EQ(compare(noise.data(), zeros.data(), zeros.size(), 1e-4).bad, 2u);
  EXPECT_TRUE(within(compare(noise.data(), zeros.data(), zeros.size(), 1e-4, 1e-6), 1e-4));

  const std::vector<float> nan{1.0f, -2.0f, std::numeric_limits<float>::quiet_NaN(), 0.0f};
  EXPECT_EQ(compare(nan.data(), ref.data(), ref.size(), 1e-4).bad, 2u);  // NaN, and a finite value for -inf
}

}  // namespace
}  // namespace strata::attention
