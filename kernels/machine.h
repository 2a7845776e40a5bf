// What one node can do, measured: the CPU and its topology, the FP32/FP64/BF16 peaks on one core and on all
// cores, a clock to cross-check them, memory bandwidth beyond the last-level cache, and the FP32 GEMM rate
// of each CPU GEMM library, from which the default library is chosen. Every %peak, MFU and system
// description of the projection is held against these figures. Measuring takes about two seconds; the
// harness does it once per node and job and shares the result (bench/harness/machine.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/cpu_gemm.h"
#include "kernels/cpu_peak.h"
#include "kernels/memory_bandwidth.h"
#include "kernels/topology.h"

namespace strata {

struct GemmBackendRate {
  cpu_gemm::Backend backend = cpu_gemm::Backend::openblas;
  std::string library;  // "oneDNN 2.6.3"
  std::string kernel;   // "avx512_core_amx"
  double fp32_rate = 0; // FLOP/s, the best of the trials
};

struct MachineDescription {
  CpuFeatures cpu;
  CpuTopology topology;
  PeakFigure fp32, fp64, bf16;
  double clock_hz = 0;        // dependent integer chain, one core (measure_clock_hz)
  bool clock_agrees = false;  // the FP32 peak's check against the clock agrees (judge_peaks)
  MemoryBandwidth memory;
  int64_t gemm_probe_size = 0;        // the square FP32 GEMM each library ran, one thread
  std::vector<GemmBackendRate> gemm;  // every library this build has
  cpu_gemm::Backend default_gemm = cpu_gemm::Backend::openblas;  // the fastest of `gemm`
  double measure_seconds = 0;         // how long measuring took
};

struct MachineOptions {
  int peak_trials = 7;
  double peak_trial_seconds = 0.01;
  int bandwidth_trials = 3;
  int64_t bandwidth_array_bytes = 0;  // 0: bandwidth_array_bytes(topology)
  int64_t gemm_probe_size = 1024;
  int gemm_rounds = 5;  // rounds of one GEMM per library
};

// Holds each measured peak to the clock and the CPU's FMA units (check_peak): a peak that does not agree gets
// its `failure` and is not used as a denominator. Sets clock_agrees from the FP32 check.
void judge_peaks(MachineDescription& machine);

// Measures this node. A peak that fails its check is measured again (twice at most) before it is given up. Uses the calling thread and one thread per core; leaves the GEMM libraries at one thread.
MachineDescription measure_machine(const MachineOptions& options = {});

// FP32 FLOP/s of each of `backends` on a size^3 GEMM (one thread, after one warm-up each): the best of `rounds`
// rounds that run one GEMM of every library in turn, on buffers filled with values in [-1, 1). Leaves the GEMM
// libraries at one thread.
std::vector<double> measure_gemm_rates(const std::vector<cpu_gemm::Backend>& backends, int64_t size, int rounds);

}  // namespace strata
