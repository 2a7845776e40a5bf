// The CPU's floating-point peak, measured rather than assumed: a kernel of independent FMA chains on the
// widest vector unit present (AVX-512, AVX2, NEON; SSE2 multiply + add otherwise; AVX-512 BF16 dot products
// where present) runs on one core and on every core at once, and the best of several trials is the peak.
// A clock measured with a dependent chain of `imul` (3-cycle latency on every x86 core since 2008, and not
// executed at rename, unlike `add` with an immediate on recent Intel cores; on Arm a chain of `add`) stays beside it as a cross-check:
// measured FLOP/s divided by that clock must be what this CPU's FMA units do per cycle (a table by CPU model,
// fma_units()). A peak that is not is a failed measurement, never a denominator.
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
  std::string failure;   // why the figure failed its check against the clock; empty when it agrees
  bool known() const { return one_core > 0; }
  bool usable() const { return known() && failure.empty(); }
  // The peak a rank running `threads` threads is held against: the one-core figure for one thread, the
  // all-core figure per core (clocks drop when every core is busy) for more; 0 (unknown) when not usable().
  double per_rank(int threads) const;
};

struct PeakOptions {
  int trials = 7;              // the best of these is reported
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

// Cycles per second of this core from a dependent chain of integer operations (x86-64 `imul`, Arm `add`;
// the best of `trials`); 0 on other architectures.
double measure_clock_hz(int trials = 7, double trial_seconds = 0.005);

// The FMA units of one core, from the CPU's vendor, family and model (x86 CPUID; Arm implementer and part):
// how many there are and how wide. `unit_counts` holds one count where the model decides it and two where the
// part number does (Skylake-SP Silver and some Gold parts have one 512-bit unit, others two); it is empty for
// a CPU the table does not know.
struct FmaUnits {
  std::string microarchitecture;  // "AMD Zen 3", "Intel Sapphire Rapids", "Arm Neoverse V2"; empty when unknown
  std::vector<int> unit_counts;   // {2}, or {1, 2}
  int unit_bits = 0;              // 128, 256 or 512: the width each unit executes per cycle
  bool known() const { return !unit_counts.empty(); }
  std::string text() const;       // "AMD Zen 3: 2 x 256-bit FMA units per core"
};
FmaUnits fma_units(const CpuFeatures& cpu);

// FLOP per cycle per core that `precision`'s peak kernel can reach on `cpu`: 2 x units x lanes for FP32, lanes
// the narrower of the unit and the kernel's vector (AVX-512 on 256-bit units, as on Zen 4, runs at the 256-bit
// rate); FP64 half of that, BF16 dot products twice. For a CPU the table does not know: one or two units of
// the kernel's vector width. One figure per candidate unit count.
std::vector<double> expected_flop_per_cycle(PeakPrecision precision, const CpuFeatures& cpu);

// A measured peak held to the clock: FLOP/s / clock within [kPeakTolerance.low, .high] of an expected FLOP per
// cycle. The bounds allow what the core does to its clock between the two measurements (turbo, the lower
// AVX-512 clocks of Intel's frequency licences, a noisy neighbour); a measured peak outside them is a failed
// measurement and is not used: %peak and MFU are then not reported.
struct PeakTolerance {
  double low = 0.7;
  double high = 1.15;
};
inline constexpr PeakTolerance kPeakTolerance{};

struct PeakCheck {
  bool agrees = false;
  double flop_per_cycle = 0;           // measured FLOP/s / clock
  std::vector<double> expected;        // expected_flop_per_cycle()
  std::string text;                    // "16.1 FLOP/cycle; AMD Zen: 2 x 128-bit FMA units per core: 16 expected"
};
PeakCheck check_peak(PeakPrecision precision, const CpuFeatures& cpu, double one_core, double clock_hz);

}  // namespace strata
