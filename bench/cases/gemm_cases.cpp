// The CPU GEMM benchmark problem (see gemm_cases.h).
#include "bench/cases/gemm_cases.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace strata::gemm {

CpuGemm::CpuGemm(Shape shape, DType dtype, uint64_t seed, cpu_gemm::Backend library)
    : shape_(shape), dtype_(dtype), library_(library) {
  if (!cpu_gemm::available(library)) throw std::invalid_argument("CPU GEMM library " + cpu_gemm::name(library) + " is not built");
  if (dtype == DType::fp64 && !cpu_gemm::supports_fp64(library))
    throw std::invalid_argument("dtype fp64 is not available on " + cpu_gemm::name(library) + " (fp64: openblas)");
  size_t a = static_cast<size_t>(shape.m * shape.k), w = static_cast<size_t>(shape.n * shape.k),
         c = static_cast<size_t>(shape.m * shape.n);
  if (dtype == DType::fp32) {
    a32_.resize(a), w32_.resize(w), c32_.resize(c);
    fill_uniform(a32_.data(), a, seed);
    fill_uniform(w32_.data(), w, seed + 1);
  } else if (dtype == DType::fp64) {
    a64_.resize(a), w64_.resize(w), c64_.resize(c);
    fill_uniform(a64_.data(), a, seed);
    fill_uniform(w64_.data(), w, seed + 1);
  } else {
    throw std::invalid_argument("dtype " + name(dtype) + " is not available on the cpu backend (cpu: fp32, fp64)");
  }
  poison_output();
}

void CpuGemm::poison_output() {
  std::fill(c32_.begin(), c32_.end(), std::numeric_limits<float>::quiet_NaN());
  std::fill(c64_.begin(), c64_.end(), std::numeric_limits<double>::quiet_NaN());
}

void CpuGemm::run() {
  const int64_t m = shape_.m, n = shape_.n, k = shape_.k;
  if (dtype_ == DType::fp32)
    cpu_gemm::sgemm(library_, false, true, m, n, k, 1.0f, a32_.data(), k, w32_.data(), k, 0.0f, c32_.data(), n);
  else
    cpu_gemm::dgemm(library_, false, true, m, n, k, 1.0, a64_.data(), k, w64_.data(), k, 0.0, c64_.data(), n);
}

void CpuGemm::corrupt_output() {
  // Off by far more than any rounding: the check must count it whatever the element's value.
  if (dtype_ == DType::fp32) c32_.back() = 2 * c32_.back() + 1;
  else c64_.back() = 2 * c64_.back() + 1;
}

CheckResult CpuGemm::check(int samples, uint64_t seed) const {
  const int64_t k = shape_.k, n = shape_.n;
  GemmView view{shape_, {}, {}, {}};
  if (dtype_ == DType::fp32) {
    view.a = [&](int64_t i, int64_t kk) { return static_cast<double>(a32_[static_cast<size_t>(i * k + kk)]); };
    view.w = [&](int64_t j, int64_t kk) { return static_cast<double>(w32_[static_cast<size_t>(j * k + kk)]); };
    view.c = [&](int64_t i, int64_t j) { return static_cast<double>(c32_[static_cast<size_t>(i * n + j)]); };
  } else {
    view.a = [&](int64_t i, int64_t kk) { return a64_[static_cast<size_t>(i * k + kk)]; };
    view.w = [&](int64_t j, int64_t kk) { return w64_[static_cast<size_t>(j * k + kk)]; };
    view.c = [&](int64_t i, int64_t j) { return c64_[static_cast<size_t>(i * n + j)]; };
  }
  return check_sampled(view, dtype_, samples, seed);
}

}  // namespace strata::gemm
