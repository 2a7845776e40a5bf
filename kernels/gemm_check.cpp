// Implementation of the sampled GEMM reference check (see gemm_check.h).
#include "kernels/gemm_check.h"

#include <cmath>
#include <random>
#include <vector>

namespace strata::gemm {

namespace {
// SplitMix64: a fast, well-mixed generator; the stream depends only on the seed.
struct SplitMix {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53 * 2.0 - 1.0; }  // [-1, 1)
};
}  // namespace

void fill_uniform(float* out, size_t count, uint64_t seed) {
  SplitMix rng{seed};
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<float>(rng.uniform());
}

void fill_uniform(double* out, size_t count, uint64_t seed) {
  SplitMix rng{seed};
  for (size_t i = 0; i < count; ++i) out[i] = rng.uniform();
}

CheckResult check_sampled(const GemmView& view, DType dtype, int samples, uint64_t seed) {
  const Shape& s = view.shape;
  Precision p = precision(dtype);
  std::vector<std::pair<int64_t, int64_t>> points;
  SplitMix rng{seed ^ 0x5eedc0ffeeull};
  if (static_cast<int64_t>(samples) >= s.m * s.n) {  // as many samples as elements: every element, once
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) points.emplace_back(i, j);
  } else {
    points = {{0, 0}, {0, s.n - 1}, {s.m - 1, 0}, {s.m - 1, s.n - 1}};
    while (static_cast<int>(points.size()) < samples)
      points.emplace_back(static_cast<int64_t>(rng.next() % static_cast<uint64_t>(s.m)),
                          static_cast<int64_t>(rng.next() % static_cast<uint64_t>(s.n)));
  }

  CheckResult result;
  const double sqrt_k = std::sqrt(static_cast<double>(s.k));
  for (auto [i, j] : points) {
    long double ref = 0, magnitude = 0;
    for (int64_t k = 0; k < s.k; ++k) {
      long double product = static_cast<long double>(view.a(i, k)) * static_cast<long double>(view.w(j, k));
      ref += product;
      magnitude += std::fabs(product);
    }
    double tolerance = static_cast<double>(4 * sqrt_k * p.accumulate * magnitude + 2 * p.input * magnitude +
                                           2 * p.output * std::fabs(ref)) +
                       1e-300;
    double got = view.c(i, j);
    double ratio = std::fabs(got - static_cast<double>(ref)) / tolerance;
    ++result.checked;
    if (!(ratio <= 1.0)) ++result.wrong;  // NaN lands here too
    if (!(ratio <= result.worst_ratio)) result.worst_ratio = ratio;
  }
  return result;
}

}  // namespace strata::gemm
