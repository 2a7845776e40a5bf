// Shared helpers of strata-gpu-tests (see gpu_test.h).
#include "tests/gpu/gpu_test.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

namespace strata::gpu_test {

std::string cuda_unavailable_reason() {
  int count = 0;
  if (const cudaError_t rc = cudaGetDeviceCount(&count); rc != cudaSuccess) {
    return std::string("no CUDA device: ") + cudaGetErrorString(rc);
  }
  if (count == 0) return "no CUDA device: cudaGetDeviceCount found none";
  if (const cudaError_t rc = cudaSetDevice(0); rc != cudaSuccess) {
    return std::string("no CUDA device: ") + cudaGetErrorString(rc);
  }
  return "";
}

std::mt19937_64 seeded_rng() {
  std::uint64_t seed = 20241123;
  if (const char* text = std::getenv("STRATA_TEST_SEED")) seed = std::strtoull(text, nullptr, 10);
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::cout << "[ seed     ] " << info->test_suite_name() << "." << info->name() << " seed=" << seed
            << " (STRATA_TEST_SEED)\n";
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return std::mt19937_64(seed);
}

void expect_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                  double tol, double abs_floor) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double squares = 0.0;
  for (double w : want) squares += w * w;
  const double rms = want.empty() ? 0.0 : std::sqrt(squares / static_cast<double>(want.size()));
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double error = std::abs(got[i] - want[i]);
    const double ratio = error / (std::abs(want[i]) + rms + 1e-300);
    if (!(ratio <= tol) && !(error <= abs_floor)) ++bad;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off; worst [" << worst << "] got "
                     << (got.empty() ? 0.0 : got[worst]) << " want " << (want.empty() ? 0.0 : want[worst])
                     << " (relative " << worst_ratio << ", tol " << tol << ")";
}

}  // namespace strata::gpu_test
