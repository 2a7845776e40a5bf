// Unit tests of the CPU GEMM and its reference check: the check passes real output and catches wrong,
// missing and slightly perturbed elements.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "bench/check.h"
#include "kernels/blas.h"
#include "kernels/gemm_check.h"
#include "kernels/gemm_cpu.h"

using namespace strata;
using namespace strata::gemm;

TEST(CpuGemm, PassesItsCheckOnOddShapes) {
  blas::set_threads(1);
  for (DType d : {DType::fp32, DType::fp64}) {
    for (Shape s : {Shape{1, 1, 1}, Shape{17, 33, 65}, Shape{128, 96, 512}}) {
      CpuGemm g(s, d, 42);
      g.run();
      CheckResult r = g.check(64, 1);
      EXPECT_EQ(r.wrong, 0) << name(d) << " " << s.text();
      EXPECT_GT(r.checked, 0);
      EXPECT_LE(r.worst_ratio, 1.0);
    }
  }
}

TEST(CpuGemm, UnrunOutputIsPoisonedAndFails) {
  CpuGemm g({32, 32, 32}, DType::fp32, 1);
  CheckResult r = g.check(16, 1);  // never ran: C is NaN
  EXPECT_EQ(r.wrong, r.checked);
}

TEST(CpuGemm, RejectsGpuDtypes) { EXPECT_THROW(CpuGemm({8, 8, 8}, DType::bf16, 1), std::invalid_argument); }

namespace {
// A fp32 product computed in double, then perturbed at one element.
struct Perturbed {
  Shape s{64, 48, 256};
  std::vector<float> a, w, c;
  Perturbed() : a(static_cast<size_t>(s.m * s.k)), w(static_cast<size_t>(s.n * s.k)), c(static_cast<size_t>(s.m * s.n)) {
    fill_uniform(a.data(), a.size(), 3);
    fill_uniform(w.data(), w.size(), 4);
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double sum = 0;
        for (int64_t k = 0; k < s.k; ++k) sum += double(a[size_t(i * s.k + k)]) * double(w[size_t(j * s.k + k)]);
        c[size_t(i * s.n + j)] = static_cast<float>(sum);
      }
  }
  CheckResult check(int samples) {
    GemmView v{s, [&](int64_t i, int64_t k) { return double(a[size_t(i * s.k + k)]); },
               [&](int64_t j, int64_t k) { return double(w[size_t(j * s.k + k)]); },
               [&](int64_t i, int64_t j) { return double(c[size_t(i * s.n + j)]); }};
    return check_sampled(v, DType::fp32, samples, 9);
  }
};
}  // namespace

TEST(GemmCheck, CatchesAWrongCorner) {
  Perturbed p;
  EXPECT_EQ(p.check(32).wrong, 0);
  // Drop one k term from the last element (a corner, always sampled): error ~ |a w|, far above fp32 rounding.
  size_t last = p.c.size() - 1;
  p.c[last] -= p.a[size_t(p.s.m * p.s.k - 1)] * p.w[size_t(p.s.n * p.s.k - 1)];
  EXPECT_EQ(p.check(32).wrong, 1);
}

TEST(GemmCheck, ToleranceIsTightForFp32) {
  Perturbed p;
  // A relative error of 1e-3 on an element is far beyond fp32 accumulation error at K = 256.
  p.c[0] = p.c[0] * 1.001f + 1e-3f;
  EXPECT_EQ(p.check(8).wrong, 1);
}
