// The CPU's floating-point peak, from a measured clock (not /proc/cpuinfo's nominal MHz, which on boosting
// CPUs understates the running clock by up to 1.4x) times the FLOP per cycle of the detected vector unit.
#pragma once

#include <string>

namespace strata {

std::string cpu_model_name();

struct CpuPeak {
  double clock_hz = 0;              // measured on this core
  double fp32_flop_per_cycle = 0;   // per core
  double fp64_flop_per_cycle = 0;
  std::string vector_unit;          // e.g. "AVX-512 on 2x256-bit FMA pipes (AMD Zen 4)"
  bool known() const { return clock_hz > 0 && fp32_flop_per_cycle > 0; }
  double per_core(bool fp64) const { return clock_hz * (fp64 ? fp64_flop_per_cycle : fp32_flop_per_cycle); }
  std::string source(bool fp64, int cores) const;  // how the number was made, for the results
};

// Measures the clock with a chain of dependent integer adds (one per cycle) for about `seconds`.
double measure_clock_hz(double seconds = 0.05);
CpuPeak detect_cpu_peak();

}  // namespace strata
