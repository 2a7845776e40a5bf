// Checks a GEMM's output against a higher-precision reference on sampled elements: each sampled C[i][j]
// is recomputed in long double from the same (already rounded) inputs and compared with a bound built
// from the dtype's rounding:  |c - ref| <= 4 sqrt(K) u_acc sum|a w| + 2 u_in sum|a w| + 2 u_out |ref|.
// A missing, misplaced or garbage element misses that bound by orders of magnitude.
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/gemm.h"

namespace strata::gemm {

struct CheckResult {
  int64_t checked = 0;
  int64_t wrong = 0;
  double worst_ratio = 0;  // max over sampled elements of |c - ref| / tolerance (NaN counts as wrong)
};

// Elements of A (M, K), W (N, K) and C (M, N), row-major, read through accessors so any storage type
// (float, double, half on the host) can be checked.
struct GemmView {
  Shape shape;
  std::function<double(int64_t i, int64_t k)> a;
  std::function<double(int64_t j, int64_t k)> w;
  std::function<double(int64_t i, int64_t j)> c;
};

// Samples `samples` elements (always including the four corners), chosen by `seed`; every element once when `samples`
// is the output's size or more.
CheckResult check_sampled(const GemmView& view, DType dtype, int samples, uint64_t seed);

// Fills `count` values uniform in [-1, 1) from `seed` (never zeros as a pattern: a deterministic PRNG).
void fill_uniform(float* out, size_t count, uint64_t seed);
void fill_uniform(double* out, size_t count, uint64_t seed);

}  // namespace strata::gemm
