// strata-bench-gemm-overhead: what the harness costs. In one run, the FP32 rate that strata-gemm's timed
// loop (harness measure(): barrier, timer, sample bookkeeping) reports at 2048^3 beside a bare
// cblas_sgemm loop timed with steady_clock; rounds alternate so machine noise hits both alike.
// Target: harness rate / bare rate >= 0.98 (medians); exits 3 when missed. --smoke (the test suite): a tiny
// size, the check and the output, without judging the target.
#include <cblas.h>

#include <chrono>
#include <cstdio>

#include "bench/harness/harness.h"
#include "kernels/blas.h"
#include "bench/cases/gemm_cases.h"

namespace {

using namespace strata;

int run_overhead(int argc, char** argv) {
  int size = 2048, rounds = 7, iters = 5;
  double target = 0.98;
  Cli cli("strata-bench-gemm-overhead", "Harness FP32 GEMM rate against a bare cblas_sgemm loop (target ratio >= 0.98).");
  cli.option("size", 0, "M = N = K", size, 64);
  cli.option("rounds", 0, "alternating rounds of each", rounds, 1);
  cli.option("iters", 'n', "timed GEMMs per round", iters, 1);
  cli.option("target", 0, "the ratio to reach", target, 0.0);
  bool smoke = false;
  cli.flag("smoke", 0, "tiny run for the test suite: 64^3, 2 rounds of 2; the target is not judged", smoke);
  if (!cli.parse(argc, argv)) return 0;
  if (smoke) size = 64, rounds = 2, iters = 2;
  blas::set_threads(1);

  const gemm::Shape shape{size, size, size};
  gemm::CpuGemm harnessed(shape, gemm::DType::fp32, 11);
  // The bare loop multiplies the very same buffers, so only the timing path differs.
  const auto buffers = harnessed.fp32_buffers();
  auto bare_sgemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, size, size, size, 1.0f, buffers.a, size, buffers.w, size,
                0.0f, buffers.c, size);
  };

  HostTimer timer;
  std::vector<double> harness_samples, bare_samples;
  auto harness_round = [&](int warmup) {
    MeasureSpec spec{warmup, iters, 0, 1};
    auto samples = measure(MPI_COMM_WORLD, spec, timer, [&] { harnessed.run(); });
    harness_samples.insert(harness_samples.end(), samples.begin(), samples.end());
  };
  auto bare_round = [&](int warmup) {
    for (int i = 0; i < warmup; ++i) bare_sgemm();
    for (int i = 0; i < iters; ++i) {
      auto start = std::chrono::steady_clock::now();
      bare_sgemm();
      bare_samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  };
  // Which contender goes first alternates, so neither always follows the other.
  for (int round = 0; round < rounds; ++round) {
    int warmup = round == 0 ? 2 : 0;
    if (round % 2 == 0) harness_round(warmup), bare_round(warmup);
    else bare_round(warmup), harness_round(warmup);
  }
  gemm::CheckResult check = harnessed.check(64, 5);
  if (check.wrong) throw RuntimeError("harnessed GEMM output failed its reference check");

  double flop = shape.flops();
  double harness_rate = flop / summarize(harness_samples).median;
  double bare_rate = flop / summarize(bare_samples).median;
  double ratio = harness_rate / bare_rate;
  if (world_rank() == 0) {
    std::printf("# strata-bench-gemm-overhead: FP32 %dx%dx%d, 1 BLAS thread, %d rounds x %d GEMMs each, medians\n",
                size, size, size, rounds, iters);
    std::printf("harness measure() rate : %8.2f GFLOP/s\n", harness_rate / 1e9);
    std::printf("bare cblas_sgemm rate  : %8.2f GFLOP/s\n", bare_rate / 1e9);
    std::printf("ratio harness/bare     : %8.4f  (target >= %.2f: %s)\n", ratio, target,
                smoke ? "smoke, not judged" : ratio >= target ? "PASS" : "MISS");
  }
  return smoke || ratio >= target ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-bench-gemm-overhead", [&] { return run_overhead(argc, argv); });
}
