// Tests of the result checks themselves, so none can be weakened unnoticed: which elements the sampled GEMM
// check reads, a wrong element at the first, last and every row band caught, the GEMM tolerance at its
// stated bound (just inside passes, just outside fails); the collectives' comparison over every element
// of every operation's output, and its tolerance for averages; attention's element and L2 tolerances.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "collectives/check.h"
#include "kernels/attention.h"
#include "kernels/gemm_check.h"

namespace {

using namespace strata;

// ---- GEMM sampled check ---------------------------------------------------------------------------------

// A small GEMM held in double, its exact product, and a view the check reads, recording what it samples.
struct Problem {
  gemm::Shape shape;
  std::vector<double> a, w, c;
  std::set<std::pair<int64_t, int64_t>> sampled;
  Problem(gemm::Shape s, uint64_t seed) : shape(s), a(size_t(s.m * s.k)), w(size_t(s.n * s.k)), c(size_t(s.m * s.n)) {
    gemm::fill_uniform(a.data(), a.size(), seed);
    gemm::fill_uniform(w.data(), w.size(), seed + 1);
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) c[size_t(i * s.n + j)] = static_cast<double>(exact(i, j));
  }
  long double exact(int64_t i, int64_t j) const {
    long double sum = 0;
    for (int64_t k = 0; k < shape.k; ++k) sum += static_cast<long double>(a[size_t(i * shape.k + k)]) * w[size_t(j * shape.k + k)];
    return sum;
  }
  // The bound the header states: 4 sqrt(K) u_acc sum|a w| + 2 u_in sum|a w| + 2 u_out |ref|.
  double tolerance(int64_t i, int64_t j, gemm::DType dtype) const {
    long double magnitude = 0;
    for (int64_t k = 0; k < shape.k; ++k) magnitude += std::fabs(static_cast<long double>(a[size_t(i * shape.k + k)]) * w[size_t(j * shape.k + k)]);
    const gemm::Precision p = gemm::precision(dtype);
    return static_cast<double>(4 * std::sqrt(double(shape.k)) * p.accumulate * magnitude + 2 * p.input * magnitude +
                               2 * p.output * std::fabs(exact(i, j)));
  }
  double& at(int64_t i, int64_t j) { return c[size_t(i * shape.n + j)]; }
  gemm::CheckResult check(int samples, uint64_t seed, gemm::DType dtype = gemm::DType::fp32) {
    sampled.clear();
    const int64_t k = shape.k, n = shape.n;
    gemm::GemmView view{shape, [this, k](int64_t i, int64_t kk) { return a[size_t(i * k + kk)]; },
                        [this, k](int64_t j, int64_t kk) { return w[size_t(j * k + kk)]; },
                        [this, n](int64_t i, int64_t j) {
                          sampled.emplace(i, j);
                          return c[size_t(i * n + j)];
                        }};
    return gemm::check_sampled(view, dtype, samples, seed);
  }
};

constexpr uint64_t kSeed = 20261123;

TEST(GemmCheck, SamplesTheCornersAndAsManyElementsAsAskedInRange) {
  std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(kSeed));
  Problem p({64, 40, 16}, kSeed);
  gemm::CheckResult r = p.check(64, 7);
  EXPECT_EQ(r.checked, 64);
  EXPECT_EQ(r.wrong, 0);
  for (auto corner : {std::pair<int64_t, int64_t>{0, 0}, {0, 39}, {63, 0}, {63, 39}}) EXPECT_TRUE(p.sampled.count(corner));
  for (auto [i, j] : p.sampled) {
    EXPECT_TRUE(i >= 0 && i < 64 && j >= 0 && j < 40) << i << "," << j;
  }
  // The seed picks the other elements: the same seed the same set, another seed another set.
  auto first = p.sampled;
  p.check(64, 7);
  EXPECT_EQ(p.sampled, first);
  p.check(64, 8);
  EXPECT_NE(p.sampled, first);
  // As many samples as elements or more: every element, once.
  Problem small({3, 5, 4}, kSeed);
  EXPECT_EQ(small.check(1000000000, 7).checked, 15);
  EXPECT_EQ(small.sampled.size(), 15u);
}

// A wrong element anywhere a check samples it is counted once: the first, the last, and one in each band of
// rows (the samples must reach every part of C, not one corner of it).
TEST(GemmCheck, AWrongElementInTheFirstLastAndEveryRowBandIsCaught) {
  std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(kSeed));
  const int64_t m = 256, bands = 8;
  Problem p({m, 24, 32}, kSeed);
  p.check(64, 3);
  std::vector<std::pair<int64_t, int64_t>> targets = {{0, 0}, {m - 1, 23}};
  for (int64_t band = 0; band < bands; ++band) {
    auto in_band = std::find_if(p.sampled.begin(), p.sampled.end(), [&](const auto& ij) {
      return ij.first / (m / bands) == band && ij.first != 0 && ij.first != m - 1;
    });
    ASSERT_NE(in_band, p.sampled.end()) << "no sample in rows " << band * (m / bands) << ".." << (band + 1) * (m / bands) - 1;
    targets.push_back(*in_band);
  }
  for (auto [i, j] : targets) {
    const double right = p.at(i, j);
    p.at(i, j) = right + 1e-3 * (std::fabs(right) + 1);
    gemm::CheckResult r = p.check(64, 3);
    EXPECT_EQ(r.wrong, 1) << "element " << i << "," << j;
    EXPECT_GT(r.worst_ratio, 1.0);
    p.at(i, j) = std::numeric_limits<double>::quiet_NaN();
    EXPECT_EQ(p.check(64, 3).wrong, 1) << "NaN at " << i << "," << j;
    p.at(i, j) = right;
  }
}

// The smallest error the check promises to see is its tolerance: 0.99 of it passes, 1.01 of it fails, for
// each dtype's rounding (and the worst ratio reports how close it came).
TEST(GemmCheck, ToleranceHoldsAtItsStatedBound) {
  for (gemm::DType dtype : {gemm::DType::fp32, gemm::DType::fp64, gemm::DType::tf32, gemm::DType::fp16,
                            gemm::DType::bf16, gemm::DType::fp8_e4m3}) {
    Problem p({4, 3, 100}, kSeed + 2);
    const int64_t i = 3, j = 2;  // a corner: always sampled
    const long double ref = p.exact(i, j);
    const double tol = p.tolerance(i, j, dtype);
    ASSERT_GT(tol, 0);
    p.at(i, j) = static_cast<double>(ref + 0.99L * tol);
    gemm::CheckResult inside = p.check(4, 1, dtype);
    EXPECT_EQ(inside.wrong, 0) << gemm::name(dtype);
    EXPECT_NEAR(inside.worst_ratio, 0.99, 0.005) << gemm::name(dtype);
    p.at(i, j) = static_cast<double>(ref - 1.01L * tol);
    gemm::CheckResult outside = p.check(4, 1, dtype);
    EXPECT_EQ(outside.wrong, 1) << gemm::name(dtype);
    EXPECT_NEAR(outside.worst_ratio, 1.01, 0.005) << gemm::name(dtype);
  }
}

TEST(GemmCheck, UnitRoundoffsAreTheDtypes) {
  EXPECT_EQ(gemm::precision(gemm::DType::fp32).accumulate, std::ldexp(1.0, -24));
  EXPECT_EQ(gemm::precision(gemm::DType::fp64).accumulate, std::ldexp(1.0, -53));
  EXPECT_EQ(gemm::precision(gemm::DType::tf32).input, std::ldexp(1.0, -11));
  EXPECT_EQ(gemm::precision(gemm::DType::fp16).output, std::ldexp(1.0, -11));
  EXPECT_EQ(gemm::precision(gemm::DType::bf16).output, std::ldexp(1.0, -8));
  EXPECT_EQ(gemm::precision(gemm::DType::fp32).input, 0.0);
}

// ---- collectives ----------------------------------------------------------------------------------------

using coll::DataType;
using coll::Operation;
using coll::RedOp;

// The right output of `rank` of `n`, built from the check inputs of every rank with the element-wise
// reduction of types.h (not with the check's own expected values).
std::vector<unsigned char> right_output(Operation op, DataType dtype, RedOp redop, const coll::Counts& c, int rank,
                                        int n, int root) {
  const size_t elem = coll::size_of(dtype);
  auto input = [&](int r) { return coll::check_inputs({op, dtype, redop}, c, r); };
  std::vector<unsigned char> out(c.recv_elems * elem);
  switch (op) {
    case Operation::allreduce: case Operation::reduce: case Operation::reduce_scatter: {
      std::vector<unsigned char> sum = input(0);
      for (int r = 1; r < n; ++r) coll::reduce_into(sum.data(), input(r).data(), c.send_elems, dtype, redop);
      if (redop == RedOp::avg) coll::finish_avg(sum.data(), c.send_elems, dtype, n);
      const size_t from = op == Operation::reduce_scatter ? size_t(rank) * c.count : 0;
      std::copy_n(sum.begin() + std::ptrdiff_t(from * elem), c.recv_elems * elem, out.begin());
      break;
    }
    case Operation::allgather:
      for (int r = 0; r < n; ++r) std::copy_n(input(r).begin(), c.count * elem, out.begin() + std::ptrdiff_t(r * c.count * elem));
      break;
    case Operation::alltoall:
      for (int s = 0; s < n; ++s)
        std::copy_n(input(s).begin() + std::ptrdiff_t(size_t(rank) * c.count * elem), c.count * elem,
                    out.begin() + std::ptrdiff_t(size_t(s) * c.count * elem));
      break;
    case Operation::broadcast: out = input(root); break;
    case Operation::sendrecv: out = input((rank + n - 1) % n); break;
  }
  return out;
}

// Every element of every operation's output is compared: the right output passes, and changing any one
// element (by one unit of the type) is counted exactly once, on every rank and with a root that is not 0.
TEST(CollectiveCheck, EveryElementOfEveryOperationIsCompared) {
  const int n = 3, root = 2;
  for (Operation op : coll::kAllOperations)
    for (DataType dtype : {DataType::int8, DataType::float32, DataType::bfloat16, DataType::float64})
      for (RedOp redop : coll::is_reduction(op) ? std::vector<RedOp>{RedOp::sum, RedOp::prod, RedOp::min, RedOp::max, RedOp::avg}
                                                : std::vector<RedOp>{RedOp::sum}) {
        const coll::Counts c = coll::counts_for(op, 7 * size_t(n) * coll::size_of(dtype), coll::size_of(dtype), n);
        for (int rank = 0; rank < n; ++rank) {
          std::vector<unsigned char> out = right_output(op, dtype, redop, c, rank, n, root);
          const coll::CheckSpec spec{op, dtype, redop};
          const std::string what = std::string(coll::name(op)) + " " + std::string(coll::name(dtype)) + " " +
                                   std::string(coll::name(redop)) + " rank " + std::to_string(rank);
          ASSERT_EQ(coll::count_wrong(spec, c, out, rank, n, root), 0) << what;
          if (op == Operation::reduce && rank != root) continue;  // no result off the root
          for (size_t i = 0; i < c.recv_elems; ++i) {
            std::vector<unsigned char> bad = out;
            const double v = coll::load_value(bad.data(), i, dtype);
            coll::store_value(bad.data(), i, dtype, v == 1 ? 2 : 1);
            EXPECT_EQ(coll::count_wrong(spec, c, bad, rank, n, root), 1) << what << " element " << i;
          }
        }
      }
}

// Exact types and operations compare exactly; a floating average (rounded twice) allows one unit in the
// last place relative to max(1, |expected|): 0.99 of that passes, 1.01 of it fails.
TEST(CollectiveCheck, AverageToleranceIsOneUlpAndEverythingElseIsExact) {
  const std::pair<DataType, double> ulps[] = {{DataType::float16, 0x1p-10}, {DataType::bfloat16, 0x1p-7},
                                              {DataType::float32, 0x1p-23}, {DataType::float64, 0x1p-52}};
  for (auto [dtype, ulp] : ulps) {
    // Just inside and just outside; for float64 the nearest doubles there are half an ulp apart.
    const double inside = dtype == DataType::float64 ? 0.5 : 0.99, outside = dtype == DataType::float64 ? 1.5 : 1.01;
    for (double expected : {0.25, 1.0, -3.0, 40.0}) {
      const double allowed = ulp * std::max(1.0, std::fabs(expected));
      EXPECT_TRUE(coll::matches(expected + inside * allowed, expected, dtype, RedOp::avg)) << coll::name(dtype) << " " << expected;
      EXPECT_FALSE(coll::matches(expected + outside * allowed, expected, dtype, RedOp::avg)) << coll::name(dtype) << " " << expected;
      EXPECT_FALSE(coll::matches(expected - outside * allowed, expected, dtype, RedOp::avg)) << coll::name(dtype) << " " << expected;
      EXPECT_TRUE(coll::matches(expected, expected, dtype, RedOp::sum));
      EXPECT_FALSE(coll::matches(std::nextafter(expected, 1e9), expected, dtype, RedOp::sum)) << coll::name(dtype) << " " << expected;
    }
  }
  EXPECT_TRUE(coll::matches(-2, -2, DataType::int32, RedOp::avg));
  EXPECT_FALSE(coll::matches(-1, -2, DataType::int32, RedOp::avg));
}

// ---- attention ------------------------------------------------------------------------------------------

// An element is bad when |got - ref| > max(tol (|ref| + rms(ref)), floor): 0.99 of that passes, 1.01 fails;
// within() also needs the relative L2 error at most tol.
TEST(AttentionCheck, ElementToleranceHoldsAtItsStatedBound) {
  const double tol = attention::tolerance(attention::Precision::fp32);
  EXPECT_EQ(tol, 1e-4);
  const std::vector<double> ref = {0.5, -2.0, 1.0, 0.0, 3.0, -0.25};
  double squares = 0;
  for (double r : ref) squares += r * r;
  const double rms = std::sqrt(squares / double(ref.size()));
  for (size_t i = 0; i < ref.size(); ++i) {
    const double bound = tol * (std::fabs(ref[i]) + rms);
    for (auto [fraction, bad] : {std::pair{0.99, size_t{0}}, std::pair{1.01, size_t{1}}}) {
      std::vector<float> got(ref.begin(), ref.end());
      // The perturbation is far above float's rounding of these values, so it lands where it is meant to.
      got[i] = static_cast<float>(ref[i] + fraction * bound);
      const attention::ErrorReport r = attention::compare(got.data(), ref.data(), ref.size(), tol);
      EXPECT_EQ(r.bad, bad) << "element " << i << " at " << fraction << " of the bound";
    }
  }
  // A tensor that is zero in exact arithmetic: differences up to the floor pass, above it fail; NaN never passes.
  const std::vector<double> zeros(4, 0.0);
  std::vector<float> got(zeros.size(), 0.0f);
  got[3] = 0.5e-6f;
  EXPECT_EQ(attention::compare(got.data(), zeros.data(), zeros.size(), tol, 1e-6).bad, 0u);
  EXPECT_EQ(attention::compare(got.data(), zeros.data(), zeros.size(), tol, 0.1e-6).bad, 1u);
  std::vector<float> nan(ref.begin(), ref.end());
  nan[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(attention::compare(nan.data(), ref.data(), ref.size(), tol).bad, 1u);
}

TEST(AttentionCheck, RelativeL2ToleranceHoldsAtItsBound) {
  const double tol = 1e-2;  // large enough that float rounding of the inputs does not matter
  std::vector<double> ref(100, 1.0);
  std::vector<float> got(ref.size(), 1.0f);
  // Every element off by d: rel_l2 = d. Element bound: tol (1 + 1) = 2 tol, so no element is bad.
  for (auto [d, ok] : {std::pair{0.99e-2, true}, std::pair{1.01e-2, false}}) {
    std::fill(got.begin(), got.end(), static_cast<float>(1.0 + d));
    const attention::ErrorReport r = attention::compare(got.data(), ref.data(), ref.size(), tol);
    EXPECT_EQ(r.bad, 0u);
    EXPECT_NEAR(r.rel_l2, d, 1e-6);
    EXPECT_EQ(attention::within(r, tol), ok) << d;
  }
}

}  // namespace
