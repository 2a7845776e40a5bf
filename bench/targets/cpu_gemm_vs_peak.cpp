// strata-bench-cpu-gemm: how close each CPU GEMM library comes to the measured FP32 peak. In one run, rounds
// interleaved: the one-core FP32 peak (independent FMA chains), the sgemm rate at 2048^3 on one thread of
// every library as Strata runs it (OpenBLAS on the core Strata chose, oneDNN), of OpenBLAS as it loads by
// itself, and of OpenBLAS's generic Prescott kernels (what a CPU model newer than the library gets).
// The last two run in child processes, because OpenBLAS reads its core type only when it loads.
// Target: the default library (the machine's fastest) >= 0.75 of the peak (medians). Exit 3 on a miss.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/harness/blas_core.h"
#include "bench/harness/check.h"
#include "bench/harness/cli.h"
#include "bench/harness/stats.h"
#include "kernels/blas.h"
#include "kernels/cpu_features.h"
#include "kernels/cpu_gemm.h"
#include "kernels/cpu_peak.h"

namespace {

using namespace strata;
using Clock = std::chrono::steady_clock;

constexpr double kTarget = 0.75;

struct Buffers {
  explicit Buffers(int64_t size) : n(size) {
    const size_t elements = static_cast<size_t>(size * size);
    for (auto* p : {&a, &b, &c}) {
      void* memory = std::aligned_alloc(4096, (elements * sizeof(float) + 4095) / 4096 * 4096);
      if (!memory) throw RuntimeError("out of memory");
      p->reset(static_cast<float*>(memory));
    }
    std::mt19937 random(3);
    std::uniform_real_distribution<float> uniform(-1, 1);
    for (size_t i = 0; i < elements; ++i) a[i] = uniform(random), b[i] = uniform(random), c[i] = 0;
  }
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  int64_t n;
  std::unique_ptr<float[], Free> a, b, c;
};

// FLOP/s of one timed sgemm (the caller warms up).
double sgemm_rate(cpu_gemm::Backend library, Buffers& x) {
  auto start = Clock::now();
  cpu_gemm::sgemm(library, false, true, x.n, x.n, x.n, 1.0f, x.a.get(), x.n, x.b.get(), x.n, 0.0f, x.c.get(), x.n);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return 2.0 * static_cast<double>(x.n) * static_cast<double>(x.n) * static_cast<double>(x.n) / seconds;
}

// Child mode: one warm-up and one timed OpenBLAS sgemm, the rate printed on stdout.
int child(int64_t size) {
  blas::set_threads(1);
  Buffers x(size);
  sgemm_rate(cpu_gemm::Backend::openblas, x);
  std::printf("%.6e %s\n", sgemm_rate(cpu_gemm::Backend::openblas, x), blas::corename().c_str());
  return 0;
}

// OpenBLAS loaded afresh in a child, with OPENBLAS_CORETYPE unset (the library's own choice) or set.
struct ChildRate {
  double rate = 0;
  std::string core;
};
ChildRate child_rate(int64_t size, const std::string& coretype) {
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) throw RuntimeError("cannot find this program");
  std::string command = "env -u STRATA_OPENBLAS_CORE_AT_LOAD -u STRATA_TEST_OPENBLAS_CORE_AT_LOAD -u OPENBLAS_CORETYPE ";
  command += "STRATA_OPENBLAS_CORE=keep " + (coretype.empty() ? "" : "OPENBLAS_CORETYPE=" + coretype + " ");
  command += std::string("'") + self + "' --child-openblas-rate " + std::to_string(size);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) throw RuntimeError("cannot start " + command);
  char core[64] = {};
  ChildRate result;
  if (std::fscanf(pipe.get(), "%lf %63s", &result.rate, core) != 2) throw RuntimeError("no rate from " + command);
  result.core = core;
  return result;
}

double median(std::vector<double> v) { return summarize(std::move(v)).median; }

int run(int argc, char** argv) {
  int64_t size = 2048;
  int rounds = 5;
  bool smoke = false;
  Cli cli("strata-bench-cpu-gemm",
          "FP32 sgemm of each CPU GEMM library against the measured one-core FP32 peak (target >= 0.75 for the default).");
  cli.option("size", 0, "M = N = K", size, 16);
  cli.option("rounds", 0, "interleaved rounds; medians are reported", rounds, 1);
  cli.flag("smoke", 0, "tiny and quick: checks that every part runs, judges no target", smoke);
  if (!cli.parse(argc, argv)) return 0;
  if (smoke) size = std::min<int64_t>(size, 128), rounds = 1;

  const CpuFeatures cpu = detect_cpu_features();
  cpu_gemm::set_threads(1);
  Buffers x(size);
  const std::vector<cpu_gemm::Backend> libraries = cpu_gemm::available_backends();
  for (auto library : libraries) sgemm_rate(library, x);  // warm-up: thread pools, JIT kernels, page faults

  std::vector<double> peak;
  std::vector<std::vector<double>> rates(libraries.size());
  std::vector<double> as_loaded, generic;
  std::string loaded_core;
  PeakOptions peak_options{3, 0.02, {}};
  for (int round = 0; round < rounds; ++round) {
    peak.push_back(measure_peak(PeakPrecision::fp32, cpu, peak_options).one_core);
    for (size_t i = 0; i < libraries.size(); ++i) rates[i].push_back(sgemm_rate(libraries[i], x));
    ChildRate loaded = child_rate(size, "");
    as_loaded.push_back(loaded.rate);
    loaded_core = loaded.core;
    generic.push_back(child_rate(size, "PRESCOTT").rate);
  }

  double peak_median = median(peak);
  PeakCheck peak_check = check_peak(PeakPrecision::fp32, cpu, peak_median, measure_clock_hz());
  for (int again = 0; again < 2 && !peak_check.agrees; ++again) {  // a neighbour's burst, not the method
    peak_median = measure_peak(PeakPrecision::fp32, cpu, peak_options).one_core;
    peak_check = check_peak(PeakPrecision::fp32, cpu, peak_median, measure_clock_hz());
  }
  const BlasCoreChoice core = blas_core_choice();
  // The default library, chosen as a run chooses it: the faster one, here measured at this size.
  size_t best = 0;
  for (size_t i = 0; i < libraries.size(); ++i)
    if (median(rates[i]) > median(rates[best])) best = i;
  std::printf("# strata-bench-cpu-gemm: FP32 %lldx%lldx%lld (C = A B^T), one thread, %d interleaved rounds, medians\n",
              static_cast<long long>(size), static_cast<long long>(size), static_cast<long long>(size), rounds);
  std::printf("# CPU: %s (%s family %d model %d), %s\n", cpu.model_name.c_str(), cpu.vendor.c_str(), cpu.family,
              cpu.model, cpu.flags_text().c_str());
  std::printf("%-55s %8.1f GFLOP/s\n", ("measured FP32 peak, one core: " + fma_kernel(PeakPrecision::fp32, cpu).description).c_str(),
              peak_median / 1e9);
  auto row = [&](const std::string& label, double rate, bool is_default) {
    std::printf("%-55s %8.1f GFLOP/s  %.3f of peak%s\n", label.c_str(), rate / 1e9, rate / peak_median,
                is_default ? "  <- default" : "");
  };
  for (size_t i = 0; i < libraries.size(); ++i)
    row(cpu_gemm::name(libraries[i]) + ": " + cpu_gemm::library(libraries[i]) + " (" + cpu_gemm::kernel(libraries[i]) +
            ")",
        median(rates[i]), i == best);
  row("openblas as it loads by itself (" + loaded_core + ")", median(as_loaded), false);
  row("openblas generic kernels (OPENBLAS_CORETYPE=PRESCOTT)", median(generic), false);
  std::printf("# OpenBLAS core in this process: %s (%s)\n", core.running.c_str(), core.how.c_str());
  std::printf("# peak check: %s%s\n", peak_check.agrees ? "agrees: " : "FAILED: ", peak_check.text.c_str());
  if (!peak_check.agrees) {
    std::printf("default library / peak: not judged: the measured peak failed its check against the clock\n");
    return smoke ? 0 : 3;
  }
  const double ratio = median(rates[best]) / peak_median;
  if (smoke) {
    std::printf("default/peak %.3f (smoke run: target not judged)\n", ratio);
    return 0;
  }
  std::printf("default library / peak: %.3f  (target >= %.2f: %s)\n", ratio, kTarget, ratio >= kTarget ? "PASS" : "MISS");
  return ratio >= kTarget ? 0 : 3;  // a missed target, as every strata-bench-* program reports it
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--child-openblas-rate") return child(std::atoll(argv[2]));
  strata::run_openblas_on_the_right_core(argv);
  try {
    return run(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "strata-bench-cpu-gemm: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata-bench-cpu-gemm: error: %s\n", e.what());
    return 1;
  }
}
