// The machine description: decisions that depend on the CPU are tested with injected CPUs (Intel and AMD,
// with and without AVX-512), measurements on this machine with bounds that allow what virtual machines do
// (turbo, noisy neighbours) but not the 3-6x errors of a wrong method.
#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "bench/machine.h"
#include "kernels/blas.h"
#include "kernels/cpu_gemm.h"
#include "kernels/cpu_peak.h"
#include "kernels/machine.h"
#include "kernels/memory_bandwidth.h"
#include "kernels/topology.h"

namespace strata {
namespace {

CpuFeatures intel_emerald_rapids() {  // the family 6 model 207 Xeon that Debian's OpenBLAS does not know
  CpuFeatures c;
  c.vendor = "GenuineIntel", c.model_name = "Intel(R) Xeon(R) Platinum", c.family = 6, c.model = 207;
  c.sse2 = c.avx = c.avx2 = c.fma = true;
  c.avx512f = c.avx512dq = c.avx512bw = c.avx512vl = c.avx512_bf16 = c.avx512_fp16 = c.amx_bf16 = true;
  return c;
}

CpuFeatures amd_zen4() {
  CpuFeatures c;
  c.vendor = "AuthenticAMD", c.model_name = "AMD EPYC 9654", c.family = 0x19, c.model = 0x11;
  c.sse2 = c.avx = c.avx2 = c.fma = true;
  c.avx512f = c.avx512dq = c.avx512bw = c.avx512vl = c.avx512_bf16 = true;
  return c;
}

CpuFeatures amd_zen3() {
  CpuFeatures c = amd_zen4();
  c.model_name = "AMD EPYC 7763", c.model = 0x01;
  c.avx512f = c.avx512dq = c.avx512bw = c.avx512vl = c.avx512_bf16 = false;
  return c;
}

CpuFeatures intel_haswell() {
  CpuFeatures c;
  c.vendor = "GenuineIntel", c.model_name = "Intel(R) Xeon(R) CPU E5-2680 v3", c.family = 6, c.model = 63;
  c.sse2 = c.avx = c.avx2 = c.fma = true;
  return c;
}

CpuFeatures sse_only() {
  CpuFeatures c;
  c.vendor = "GenuineIntel", c.family = 6, c.model = 23, c.sse2 = true;
  return c;
}

TEST(OpenBlasCore, GenericFallbackOnAnAvx512CpuIsReplaced) {
  EXPECT_EQ(blas::preferred_core(intel_emerald_rapids(), "Prescott"), "SKYLAKEX");
  EXPECT_EQ(blas::preferred_core(intel_emerald_rapids(), "Haswell"), "SKYLAKEX");
  EXPECT_EQ(blas::preferred_core(amd_zen4(), "Zen"), "SKYLAKEX");
  EXPECT_EQ(blas::preferred_core(amd_zen4(), "Prescott"), "SKYLAKEX");
}

TEST(OpenBlasCore, RightCoresAreKept) {
  EXPECT_EQ(blas::preferred_core(intel_emerald_rapids(), "SkylakeX"), "");
  EXPECT_EQ(blas::preferred_core(intel_emerald_rapids(), "SapphireRapids"), "");
  EXPECT_EQ(blas::preferred_core(amd_zen4(), "Cooperlake"), "");
  EXPECT_EQ(blas::preferred_core(amd_zen3(), "Zen"), "");
  EXPECT_EQ(blas::preferred_core(intel_haswell(), "Haswell"), "");
  EXPECT_EQ(blas::preferred_core(sse_only(), "Core2"), "");  // nothing wider to run
}

TEST(OpenBlasCore, Avx2CpusGetTheirVendorsCore) {
  EXPECT_EQ(blas::preferred_core(amd_zen3(), "Prescott"), "ZEN");
  EXPECT_EQ(blas::preferred_core(intel_haswell(), "Nehalem"), "HASWELL");
  EXPECT_EQ(blas::preferred_core(intel_haswell(), "Sandybridge"), "HASWELL");
}

TEST(OpenBlasCore, UnknownCoreNamesAreLeftAlone) {
  EXPECT_EQ(blas::core_vector_level("SomeFutureCore"), -1);
  EXPECT_EQ(blas::preferred_core(intel_emerald_rapids(), "SomeFutureCore"), "");
  EXPECT_EQ(blas::core_vector_level("PRESCOTT"), 0);  // case does not matter
  EXPECT_EQ(blas::core_vector_level("cooperlake"), 3);
}

TEST(OpenBlasCore, RunningCoreMatchesThisCpu) {
  // Whatever chose it (the library, or the program's re-execution), the core running in this test binary
  // must not be narrower than the CPU unless it is one the table does not know.
  const CpuFeatures cpu = detect_cpu_features();
  const int running = blas::core_vector_level(blas::corename());
  if (running < 0) GTEST_SKIP() << "OpenBLAS core " << blas::corename() << " is not in the table";
  if (!blas::preferred_core(cpu, blas::corename()).empty())
    GTEST_SKIP() << "this test binary does not re-execute; OpenBLAS runs " << blas::corename()
                 << " here, and the programs correct it (tested in test_machine_metadata.py)";
  EXPECT_GE(running, blas::cpu_vector_level(cpu));
}

TEST(PeakKernel, WidestVectorUnitIsChosen) {
  EXPECT_NE(fma_kernel(PeakPrecision::fp32, intel_emerald_rapids()).description.find("AVX-512"), std::string::npos);
  EXPECT_DOUBLE_EQ(fma_kernel(PeakPrecision::fp32, intel_emerald_rapids()).flop_per_iteration, 12 * 16 * 2);
  EXPECT_DOUBLE_EQ(fma_kernel(PeakPrecision::fp64, intel_emerald_rapids()).flop_per_iteration, 12 * 8 * 2);
  EXPECT_DOUBLE_EQ(fma_kernel(PeakPrecision::bf16, intel_emerald_rapids()).flop_per_iteration, 12 * 16 * 4);
  EXPECT_NE(fma_kernel(PeakPrecision::fp32, amd_zen3()).description.find("AVX2"), std::string::npos);
  EXPECT_DOUBLE_EQ(fma_kernel(PeakPrecision::fp32, amd_zen3()).flop_per_iteration, 12 * 8 * 2);
  EXPECT_EQ(fma_kernel(PeakPrecision::bf16, amd_zen3()).run, nullptr);
  EXPECT_EQ(fma_kernel(PeakPrecision::bf16, intel_haswell()).run, nullptr);
  EXPECT_DOUBLE_EQ(fma_kernel(PeakPrecision::fp32, sse_only()).flop_per_iteration, 12 * 4 * 2);
}

TEST(PeakCrossCheck, CandidatesAreOneOrTwoFmaUnits) {
  EXPECT_EQ(plausible_fp32_flop_per_cycle(intel_emerald_rapids()), (std::vector<double>{32, 64}));
  EXPECT_EQ(plausible_fp32_flop_per_cycle(amd_zen4()), (std::vector<double>{32, 64}));
  EXPECT_EQ(plausible_fp32_flop_per_cycle(amd_zen3()), (std::vector<double>{16, 32}));
  EXPECT_EQ(plausible_fp32_flop_per_cycle(sse_only()), (std::vector<double>{8, 16}));
}

TEST(PeakCrossCheck, RejectsTheClocksOfTheAddChain) {
  // 178 GFLOP/s at 2.8 GHz is 64 FLOP/cycle: two AVX-512 FMA units.
  EXPECT_TRUE(peak_agrees_with_clock(intel_emerald_rapids(), 178e9, 2.8e9));
  // Zen 4 at 3.64 GHz: 32 FLOP/cycle (AVX-512 on two 256-bit pipes).
  EXPECT_TRUE(peak_agrees_with_clock(amd_zen4(), 116.5e9, 3.64e9));
  // The "clocks" a dependent add chain reads on Intel cores that execute it at rename.
  for (double wrong_clock : {9.49e9, 10.92e9, 16.5e9, 17.03e9})
    EXPECT_FALSE(peak_agrees_with_clock(intel_emerald_rapids(), 178e9, wrong_clock)) << wrong_clock;
  // And a peak a third of what it should be (a generic kernel measured as the peak).
  EXPECT_FALSE(peak_agrees_with_clock(intel_emerald_rapids(), 178e9 / 3, 2.8e9));
  EXPECT_FALSE(peak_agrees_with_clock(intel_emerald_rapids(), 0, 2.8e9));
}

TEST(PeakFigure, PerRankUsesTheAllCoreRateForSeveralThreads) {
  PeakFigure p{100e9, 160e9, 2, "k"};
  EXPECT_DOUBLE_EQ(p.per_rank(1), 100e9);
  EXPECT_DOUBLE_EQ(p.per_rank(2), 160e9);
  EXPECT_DOUBLE_EQ(p.per_rank(8), 160e9);  // no more than the cores there are
  PeakFigure one_core_only{100e9, 0, 0, "k"};
  EXPECT_DOUBLE_EQ(one_core_only.per_rank(2), 200e9);
}

// Measurements on this machine. A loaded machine lowers a trial; the median of several and up to three
// attempts keep a neighbour's burst from failing the test, while a wrong method fails every attempt.
TEST(MeasuredPeak, AgreesWithTheImulClock) {
  const CpuFeatures cpu = detect_cpu_features();
  PeakOptions options{7, 0.005, {}};
  double peak = 0, clock = 0;
  bool agrees = false;
  for (int attempt = 0; attempt < 3 && !agrees; ++attempt) {
    peak = measure_peak(PeakPrecision::fp32, cpu, options).one_core;
    clock = measure_clock_hz();
    agrees = peak_agrees_with_clock(cpu, peak, clock);
  }
#if defined(__x86_64__)
  EXPECT_TRUE(agrees) << "FP32 " << peak / 1e9 << " GFLOP/s at " << clock / 1e9 << " GHz = " << peak / clock
                      << " FLOP/cycle";
  EXPECT_GT(clock, 0.5e9);
  EXPECT_LT(clock, 6.5e9);
#else
  GTEST_SKIP() << "the imul clock is x86-64 only";
#endif
}

TEST(MeasuredPeak, Fp64IsHalfOfFp32) {
  const CpuFeatures cpu = detect_cpu_features();
  PeakOptions options{7, 0.005, {}};
  // A peak is a capacity: the best of the attempts of each precision, so that a neighbour's burst during one
  // precision's trials cannot skew the ratio as much as it slowed that precision.
  double best_fp32 = 0, best_fp64 = 0, ratio = 0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    best_fp32 = std::max(best_fp32, measure_peak(PeakPrecision::fp32, cpu, options).one_core);
    best_fp64 = std::max(best_fp64, measure_peak(PeakPrecision::fp64, cpu, options).one_core);
    ratio = best_fp32 / best_fp64;
    if (ratio > 1.6 && ratio < 2.5) break;
  }
  EXPECT_GT(ratio, 1.6);
  EXPECT_LT(ratio, 2.5);
}

TEST(MeasuredPeak, AllCoresRunsOneThreadPerCore) {
  const CpuFeatures cpu = detect_cpu_features();
  const CpuTopology topology = detect_topology();
  PeakOptions options{3, 0.005, topology.one_cpu_per_core};
  PeakFigure p;
  // Noisy neighbours may take some cores, but even one free core gives about one core's rate; a trial that
  // a neighbour's burst slowed is retried.
  auto plausible = [&] { return p.all_cores > 0.3 * p.one_core && p.all_cores < 1.5 * p.one_core * topology.cores; };
  for (int attempt = 0; attempt < 3 && (attempt == 0 || !plausible()); ++attempt)
    p = measure_peak(PeakPrecision::fp32, cpu, options);
  EXPECT_EQ(p.cores, topology.cores);
  EXPECT_TRUE(plausible()) << "one core " << p.one_core / 1e9 << " GFLOP/s, all " << topology.cores << " cores "
                           << p.all_cores / 1e9;
}

TEST(Topology, CoresAndCachesAreFound) {
  const CpuTopology t = detect_topology();
  EXPECT_GE(t.cores, 1);
  EXPECT_EQ(static_cast<int>(t.one_cpu_per_core.size()), t.cores);
  EXPECT_GE(t.hardware_threads, t.cores);
  EXPECT_GE(t.packages, 1);
  EXPECT_GT(t.last_level_cache_bytes(), 0);
  EXPECT_NE(t.source.find("hwloc"), std::string::npos);
}

TEST(MemoryBandwidth, ArraysLeaveTheCacheWithinBounds) {
  CpuTopology t;
  t.l3_bytes = 32 << 20, t.l3_instances = 1;
  EXPECT_EQ(bandwidth_array_bytes(t), int64_t{64} << 20);
  t.l3_bytes = int64_t{480} << 20;
  EXPECT_EQ(bandwidth_array_bytes(t), int64_t{256} << 20);
  t.l3_bytes = 1 << 20;
  EXPECT_EQ(bandwidth_array_bytes(t), int64_t{32} << 20);
}

TEST(MemoryBandwidth, MeasuresPlausibleRates) {
  BandwidthOptions options;
  options.array_bytes = 32 << 20;
  options.cpus = detect_topology().one_cpu_per_core;
  MemoryBandwidth bw = measure_memory_bandwidth(options);
  EXPECT_EQ(bw.array_bytes, int64_t{32} << 20);
  for (double rate : {bw.copy.one_core, bw.copy.all_cores, bw.triad.one_core, bw.triad.all_cores}) {
    EXPECT_GT(rate, 0.2e9);  // no server memory is slower
    EXPECT_LT(rate, 5e12);   // nor faster than HBM
  }
}

// Each library against a double-precision product on odd shapes, every transpose and a non-zero beta.
TEST(CpuGemmLibraries, MatchAReferenceInEveryLayout) {
  std::mt19937 random(7);
  std::uniform_real_distribution<float> uniform(-1, 1);
  const int64_t m = 37, n = 23, k = 51;
  for (cpu_gemm::Backend backend : cpu_gemm::available_backends())
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        // op(A) (m, k) is stored (k, m) when transposed; op(B) (k, n) is stored (n, k).
        std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n));
        for (auto& x : a) x = uniform(random);
        for (auto& x : b) x = uniform(random);
        for (auto& x : c) x = uniform(random);
        std::vector<float> c0 = c;
        const int64_t lda = ta ? m : k, ldb = tb ? k : n;
        cpu_gemm::sgemm(backend, ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, c.data(), n);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double ref = 2.0 * c0[static_cast<size_t>(i * n + j)];
            for (int64_t p = 0; p < k; ++p) {
              double av = a[static_cast<size_t>(ta ? p * m + i : i * k + p)];
              double bv = b[static_cast<size_t>(tb ? j * k + p : p * n + j)];
              ref += 0.5 * av * bv;
            }
            ASSERT_NEAR(c[static_cast<size_t>(i * n + j)], ref, 1e-4)
                << cpu_gemm::name(backend) << " ta=" << ta << " tb=" << tb << " at " << i << "," << j;
          }
      }
}

TEST(CpuGemmLibraries, Fp64RunsOnOpenBlasOnly) {
  double a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {};
  cpu_gemm::dgemm(cpu_gemm::Backend::openblas, false, false, 2, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 2);
  EXPECT_DOUBLE_EQ(c[0], 19);
  EXPECT_DOUBLE_EQ(c[3], 50);
  if (cpu_gemm::available(cpu_gemm::Backend::onednn)) {
    EXPECT_THROW(cpu_gemm::dgemm(cpu_gemm::Backend::onednn, false, false, 2, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 2),
                 std::invalid_argument);
  }
}

TEST(CpuGemmLibraries, DefaultIsTheFastestMeasured) {
  using cpu_gemm::Backend;
  EXPECT_EQ(cpu_gemm::fastest({{Backend::openblas, 100e9}, {Backend::onednn, 140e9}}), Backend::onednn);
  EXPECT_EQ(cpu_gemm::fastest({{Backend::openblas, 150e9}, {Backend::onednn, 140e9}}), Backend::openblas);
  EXPECT_EQ(cpu_gemm::fastest({}), Backend::openblas);
  EXPECT_EQ(cpu_gemm::parse_backend("onednn"), Backend::onednn);
  EXPECT_FALSE(cpu_gemm::parse_backend("mkl").has_value());
}

MachineDescription small_measured_machine() {
  MachineOptions options;
  options.peak_trials = 3, options.peak_trial_seconds = 0.002, options.bandwidth_trials = 1;
  options.bandwidth_array_bytes = 8 << 20, options.gemm_probe_size = 128, options.gemm_trials = 1;
  return measure_machine(options);
}

TEST(MachineDescription, JsonRoundTripKeepsEveryField) {
  const MachineDescription m = small_measured_machine();
  EXPECT_EQ(m.gemm.size(), cpu_gemm::available_backends().size());
  const MachineDescription back = machine_from_json(to_json(m));
  EXPECT_EQ(back.cpu.flags_text(), m.cpu.flags_text());
  EXPECT_EQ(back.cpu.model, m.cpu.model);
  EXPECT_EQ(back.topology.one_cpu_per_core, m.topology.one_cpu_per_core);
  EXPECT_EQ(back.topology.l2_bytes, m.topology.l2_bytes);
  EXPECT_DOUBLE_EQ(back.fp32.one_core, m.fp32.one_core);
  EXPECT_DOUBLE_EQ(back.fp64.all_cores, m.fp64.all_cores);
  EXPECT_DOUBLE_EQ(back.bf16.one_core, m.bf16.one_core);
  EXPECT_DOUBLE_EQ(back.memory.triad.all_cores, m.memory.triad.all_cores);
  EXPECT_DOUBLE_EQ(back.clock_hz, m.clock_hz);
  EXPECT_EQ(back.default_gemm, m.default_gemm);
  ASSERT_EQ(back.gemm.size(), m.gemm.size());
  EXPECT_DOUBLE_EQ(back.gemm[0].fp32_rate, m.gemm[0].fp32_rate);
}

TEST(MachineDescription, MalformedJsonNamesTheField) {
  nlohmann::json j = to_json(small_measured_machine());
  j["peak"]["fp32"].erase("one_core");
  try {
    machine_from_json(j);
    FAIL() << "a description without peak.fp32.one_core was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("one_core"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata
