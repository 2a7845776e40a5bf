// The CPU's floating-point peak, measured rather than assumed: a kernel of independent FMA chains on the
// widest vector unit present (AVX-512, AVX2, NEON; SSE2 multiply + add otherwise; AVX-512 BF16 dot products
// where present) runs on one core and on every core at once, and the median of several trials is the peak.
// A clock measured with a dependent chain of `imul` (3-cycle latency on every x86 core since 2008, and not
// executed at rename, unlike `add` with an immediate on recent Intel cores) stays beside it as a cross-check:
// measured FLOP/s divided by that clock must be the FLOP per cycle of one or two FMA units of that width.
#pragma once

#include <string>
#include <vector>

#include "kernels/cpu_features.h"

namespace strata {

enum class PeakPrecision { fp32, fp64, bf16 };
std::string name(PeakPrecision precision);  // "fp32", "fp64", "bf16"

// One precision's peak. bf16 is the rate of the bf16 dot-product instruction (two products and two adds per
// FP32 lane, counted as 4 FLOP), 0 where the CPU has none.
struct PeakFigure {
  double one_core = 0;   // FLOP/s, one thread
  double all_cores = 0;  // FLOP/s, one thread pinned to each core, all at once
  int cores = 0;
  std::string kernel;    // e.g. "12 independent AVX-512 FMA chains"
  bool known() const { return one_core > 0; }
  // The peak a rank running `threads` threads is held against: the one-core figure for one thread, the
  // all-core figure per core (clocks drop when every core is busy) for more.
  double per_rank(int threads) const;
};

struct PeakOptions {
  int trials = 7;              // the median of these is reported
  double trial_seconds = 0.01;
  std::vector<int> cpus;       // one CPU per core for the all-core figure; empty: no all-core figure
};

// The independent-chain kernel for `precision` on `cpu`: runs `iterations` rounds and returns a checksum (so
// the work cannot be optimised away); `flop_per_iteration` is what one round computes. `run` is null where the
// CPU lacks the instructions (bf16 without AVX-512 BF16).
struct FmaKernel {
  double (*run)(long iterations) = nullptr;
  double flop_per_iteration = 0;
  std::string description;
};
FmaKernel fma_kernel(PeakPrecision precision, const CpuFeatures& cpu);

PeakFigure measure_peak(PeakPrecision precision, const CpuFeatures& cpu, const PeakOptions& options);

// Cycles per second of this core from a dependent `imul` chain (median of `trials`); 0 where not x86-64.
double measure_clock_hz(int trials = 7, double trial_seconds = 0.005);

// The cross-check: FMA units of this width do 2 x lanes (one unit) or 4 x lanes (two units) FP32 FLOP per
// cycle; SSE2 multiply + add does 8 or 16. Returns those two candidates.
std::vector<double> plausible_fp32_flop_per_cycle(const CpuFeatures& cpu);
// Whether `fp32_one_core` / `clock_hz` lies within [low, high] times one of the candidates. The bounds allow
// what virtual machines and turbo do to the clock between two measurements, and reject the 3-6x errors of a
// clock read from an instruction the core does not execute one per cycle.
bool peak_agrees_with_clock(const CpuFeatures& cpu, double fp32_one_core, double clock_hz, double low = 0.7,
                            double high = 1.2);

}  // namespace strata
