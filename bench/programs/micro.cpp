// strata-micro: Google Benchmark microbenchmarks of Strata's own small kernels, the pieces whose cost must
// stay negligible beside what they support: the GEMM reference check, input generation, and statistics.
#include <benchmark/benchmark.h>

#include <vector>

#include "bench/harness/stats.h"
#include "kernels/gemm_check.h"

namespace {

using namespace strata;

// The sampled reference check strata-gemm runs after each case: cost grows with K x samples.
void BM_GemmReferenceCheck(benchmark::State& state) {
  const int64_t k = state.range(0);
  const int samples = static_cast<int>(state.range(1));
  const gemm::Shape shape{512, 512, k};
  std::vector<float> a(static_cast<size_t>(shape.m * k)), w(static_cast<size_t>(shape.n * k));
  std::vector<float> c(static_cast<size_t>(shape.m * shape.n), 0.0f);
  gemm::fill_uniform(a.data(), a.size(), 1);
  gemm::fill_uniform(w.data(), w.size(), 2);
  gemm::GemmView view{shape,
                      [&](int64_t i, int64_t kk) { return static_cast<double>(a[static_cast<size_t>(i * k + kk)]); },
                      [&](int64_t j, int64_t kk) { return static_cast<double>(w[static_cast<size_t>(j * k + kk)]); },
                      [&](int64_t i, int64_t j) { return static_cast<double>(c[static_cast<size_t>(i * shape.n + j)]); }};
  for (auto _ : state) benchmark::DoNotOptimize(gemm::check_sampled(view, gemm::DType::fp32, samples, 3));
  state.SetItemsProcessed(state.iterations() * samples * k);  // multiply-adds in long double
}
BENCHMARK(BM_GemmReferenceCheck)->Args({4096, 64})->Args({64, 64})->Args({4096, 256});

void BM_FillUniform(benchmark::State& state) {
  std::vector<float> values(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    gemm::fill_uniform(values.data(), values.size(), 7);
    benchmark::DoNotOptimize(values.data());
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * static_cast<int64_t>(sizeof(float)));
}
BENCHMARK(BM_FillUniform)->Arg(1 << 20);

// Statistics of one case's samples, as the harness computes them for each rank view.
void BM_Summarize(benchmark::State& state) {
  std::vector<double> values(static_cast<size_t>(state.range(0)));
  gemm::fill_uniform(values.data(), values.size(), 9);
  for (auto _ : state) benchmark::DoNotOptimize(summarize(values));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Summarize)->Arg(1000)->Arg(100000);

}  // namespace

BENCHMARK_MAIN();
