// Implementation of the machine measurement (see machine.h).
#include "kernels/machine.h"

#include <algorithm>
#include <chrono>
#include <random>

namespace strata {

std::vector<double> measure_gemm_rates(const std::vector<cpu_gemm::Backend>& backends, int64_t size, int rounds) {
  cpu_gemm::set_threads(1);  // a one-core rate: the libraries otherwise run as many threads as they were last set to
  const size_t elements = static_cast<size_t>(size * size);
  std::vector<float> a(elements), b(elements), c(elements);
  std::mt19937 random(12345);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (size_t i = 0; i < elements; ++i) a[i] = uniform(random), b[i] = uniform(random);
  auto run = [&](cpu_gemm::Backend backend) {
    cpu_gemm::sgemm(backend, false, true, size, size, size, 1.0f, a.data(), size, b.data(), size, 0.0f, c.data(), size);
  };
  for (cpu_gemm::Backend backend : backends) run(backend);  // warm-up: thread pools, JIT-generated kernels, page faults
  // Rounds of one GEMM per library, so that a slow moment of the machine falls on every library alike, and each
  // library's best: the work is fixed, so whatever else the core does only slows a trial down.
  const double flop = 2.0 * static_cast<double>(size) * static_cast<double>(size) * static_cast<double>(size);
  std::vector<double> best(backends.size(), 0.0);
  for (int round = 0; round < std::max(1, rounds); ++round)
    for (size_t i = 0; i < backends.size(); ++i) {
      auto start = std::chrono::steady_clock::now();
      run(backends[i]);
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best[i] = std::max(best[i], flop / seconds);
    }
  return best;
}

void judge_peaks(MachineDescription& m) {
  for (auto [precision, figure] : {std::pair{PeakPrecision::fp32, &m.fp32}, {PeakPrecision::fp64, &m.fp64},
                                   {PeakPrecision::bf16, &m.bf16}}) {
    figure->failure.clear();
    if (!figure->known()) continue;
    const PeakCheck check = check_peak(precision, m.cpu, figure->one_core, m.clock_hz);
    if (!check.agrees) figure->failure = "failed measurement: " + check.text;
  }
  m.clock_agrees = m.fp32.usable();
}

MachineDescription measure_machine(const MachineOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  MachineDescription m;
  m.cpu = detect_cpu_features();
  m.topology = detect_topology();

  PeakOptions peak{options.peak_trials, options.peak_trial_seconds, m.topology.one_cpu_per_core};
  auto measure_peaks = [&] {
    m.fp32 = measure_peak(PeakPrecision::fp32, m.cpu, peak);
    m.fp64 = measure_peak(PeakPrecision::fp64, m.cpu, peak);
    m.bf16 = measure_peak(PeakPrecision::bf16, m.cpu, peak);
    m.clock_hz = measure_clock_hz();
    judge_peaks(m);
  };
  auto failed = [&] { return !m.fp32.failure.empty() || !m.fp64.failure.empty() || !m.bf16.failure.empty(); };
  measure_peaks();
  for (int again = 0; again < 2 && failed(); ++again) measure_peaks();  // a neighbour's burst, not the method

  BandwidthOptions bandwidth;
  bandwidth.array_bytes =
      options.bandwidth_array_bytes > 0 ? options.bandwidth_array_bytes : bandwidth_array_bytes(m.topology);
  bandwidth.trials = options.bandwidth_trials;
  bandwidth.cpus = m.topology.one_cpu_per_core;
  m.memory = measure_memory_bandwidth(bandwidth);

  m.gemm_probe_size = options.gemm_probe_size;
  const std::vector<cpu_gemm::Backend> backends = cpu_gemm::available_backends();
  const std::vector<double> measured = measure_gemm_rates(backends, options.gemm_probe_size, options.gemm_rounds);
  std::vector<std::pair<cpu_gemm::Backend, double>> rates;
  for (size_t i = 0; i < backends.size(); ++i) {
    rates.emplace_back(backends[i], measured[i]);
    m.gemm.push_back({backends[i], cpu_gemm::library(backends[i]), cpu_gemm::kernel(backends[i]), measured[i]});
  }
  m.default_gemm = cpu_gemm::fastest(rates);
  m.measure_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return m;
}

}  // namespace strata
