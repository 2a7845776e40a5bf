// Implementation of the CPU peak detection (see cpu_peak.h).
#include "kernels/cpu_peak.h"

#include <cpuid.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>

namespace strata {

std::string cpu_model_name() {
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

double measure_clock_hz(double seconds) {
#if defined(__x86_64__)
  // Each asm block is 16 dependent adds: 16 cycles on any core with one-cycle integer add latency. The loop
  // counter runs in parallel on other ports, so cycles = 16 * blocks.
  using clock = std::chrono::steady_clock;
  double best = 0;
  // Many short trials, keeping the fastest: a short trial often runs without being descheduled, so
  // the figure holds even on a loaded machine.
  const int trials = 40;
  for (int trial = 0; trial < trials; ++trial) {
    const int64_t blocks = static_cast<int64_t>(seconds / trials * 2e8);
    uint64_t x = 0;
    auto start = clock::now();
    for (int64_t i = 0; i < blocks; ++i) {
      asm volatile(
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
          : "+r"(x));
    }
    double elapsed = std::chrono::duration<double>(clock::now() - start).count();
    if (x != static_cast<uint64_t>(blocks) * 16) return 0;
    best = std::max(best, 16.0 * static_cast<double>(blocks) / elapsed);  // fastest trial: least disturbed
  }
  return best;
#else
  (void)seconds;
  return 0;
#endif
}

CpuPeak detect_cpu_peak() {
  CpuPeak peak;
#if defined(__x86_64__)
  __builtin_cpu_init();
  bool amd = __builtin_cpu_is("amd");
  bool avx512 = __builtin_cpu_supports("avx512f");
  bool fma = __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2");
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  unsigned family = ((eax >> 8) & 0xf) + (((eax >> 8) & 0xf) == 0xf ? ((eax >> 20) & 0xff) : 0);
  bool zen4 = amd && family == 0x19;  // Zen 3 (same family) has no AVX-512
  if (avx512 && zen4) {
    // Zen 4 runs AVX-512 on two 256-bit FMA pipes (double-pumped): same rate as AVX2.
    peak.fp32_flop_per_cycle = 32;
    peak.vector_unit = "AVX-512 on 2x256-bit FMA pipes (AMD Zen 4)";
  } else if (avx512) {
    peak.fp32_flop_per_cycle = 64;
    peak.vector_unit = "AVX-512, assuming 2x512-bit FMA units (Intel server core)";
  } else if (fma) {
    peak.fp32_flop_per_cycle = 32;
    peak.vector_unit = "AVX2 with 2x256-bit FMA units";
  } else {
    peak.fp32_flop_per_cycle = 8;
    peak.vector_unit = "SSE, 128-bit multiply and add";
  }
  peak.fp64_flop_per_cycle = peak.fp32_flop_per_cycle / 2;
  peak.clock_hz = measure_clock_hz();
#endif
  return peak;
}

std::string CpuPeak::source(bool fp64, int cores) const {
  if (!known()) return "unknown: no clock measurement or vector unit table for this CPU";
  char text[256];
  std::snprintf(text, sizeof text, "measured clock %.2f GHz x %.0f %s FLOP/cycle (%s) x %d core%s",
                clock_hz / 1e9, fp64 ? fp64_flop_per_cycle : fp32_flop_per_cycle, fp64 ? "FP64" : "FP32",
                vector_unit.c_str(), cores, cores == 1 ? "" : "s");
  return text;
}

}  // namespace strata
