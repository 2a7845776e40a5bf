// Unit tests of the CPU GEMM and its reference check: the check passes real output and catches wrong,
// missing and slightly perturbed elements.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "bench/harness/check.h"
#include "kernels/blas.h"
#include "kernels/gemm_check.h"
#include "bench/cases/gemm_cases.h"
#include "kernels/gemm_layout.h"

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

namespace strata::gemm {
namespace {

// cuBLASLt's column-major D = op(A) op(B), run on the host over the bytes Strata hands it (row-major A and W),
// must be row-major C = A W^T: the layout mapping of the CUDA GEMM, checked where no GPU is needed.
TEST(GemmLayout, ColumnMajorProductIsTheRowMajorLinearLayer) {
  for (const Shape shape : {Shape{3, 5, 7}, Shape{1, 9, 2}, Shape{8, 1, 1}}) {
    const LtLayout lt = lt_layout(shape);
    std::vector<double> a(static_cast<size_t>(shape.m * shape.k)), w(static_cast<size_t>(shape.n * shape.k));
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<double>(i % 7) - 3;
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<double>(i % 5) - 2;
    // Element (r, c) of a column-major matrix, and of op() of it.
    auto element = [](const std::vector<double>& data, const ColumnMajor& l, int64_t r, int64_t c) {
      EXPECT_LT(r, l.rows);
      EXPECT_LT(c, l.cols);
      return data[static_cast<size_t>(c * l.ld + r)];
    };
    auto op = [&](const std::vector<double>& data, const ColumnMajor& l, bool t, int64_t r, int64_t c) {
      return t ? element(data, l, c, r) : element(data, l, r, c);
    };
    const int64_t inner = lt.transpose_a ? lt.a.rows : lt.a.cols;
    ASSERT_EQ(inner, shape.k);
    ASSERT_EQ(lt.transpose_b ? lt.b.cols : lt.b.rows, inner);
    std::vector<double> d(static_cast<size_t>(lt.d.ld * lt.d.cols), 0.0);
    ASSERT_EQ(d.size(), static_cast<size_t>(shape.m * shape.n));  // exactly C's bytes
    for (int64_t r = 0; r < lt.d.rows; ++r)
      for (int64_t c = 0; c < lt.d.cols; ++c) {
        double sum = 0;
        for (int64_t kk = 0; kk < inner; ++kk)
          sum += op(w, lt.a, lt.transpose_a, r, kk) * op(a, lt.b, lt.transpose_b, kk, c);
        d[static_cast<size_t>(c * lt.d.ld + r)] = sum;
      }
    for (int64_t i = 0; i < shape.m; ++i)
      for (int64_t j = 0; j < shape.n; ++j) {
        double want = 0;
        for (int64_t kk = 0; kk < shape.k; ++kk)
          want += a[static_cast<size_t>(i * shape.k + kk)] * w[static_cast<size_t>(j * shape.k + kk)];
        EXPECT_EQ(d[static_cast<size_t>(i * shape.n + j)], want) << shape.text() << " (" << i << ", " << j << ")";
      }
  }
}

}  // namespace
}  // namespace strata::gemm
