// The machine description: decisions that depend on the CPU are tested with injected CPUs (Intel and AMD,
// with and without AVX-512), measurements on this machine with bounds that allow what virtual machines do
// (turbo, noisy neighbours) but not the 3-6x errors of a wrong method.
#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "bench/harness/machine.h"
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

CpuFeatures with_model(CpuFeatures c, int family, int model, std::string name) {
  c.family = family, c.model = model, c.model_name = std::move(name);
  return c;
}

CpuFeatures amd_zen1() { return with_model(amd_zen3(), 0x17, 0x01, "AMD EPYC 7601"); }
CpuFeatures amd_zen2() { return with_model(amd_zen3(), 0x17, 0x31, "AMD EPYC 7742"); }
CpuFeatures amd_zen5() { return with_model(amd_zen4(), 0x1a, 0x02, "AMD EPYC 9755"); }
CpuFeatures intel_skylake_sp() {
  CpuFeatures c = with_model(intel_emerald_rapids(), 6, 0x55, "Intel(R) Xeon(R) Gold 6148");
  c.avx512_bf16 = c.avx512_fp16 = c.amx_bf16 = false;
  return c;
}
CpuFeatures intel_ice_lake_sp() { return with_model(intel_skylake_sp(), 6, 0x6a, "Intel(R) Xeon(R) Platinum 8380"); }
CpuFeatures intel_sapphire_rapids() { return with_model(intel_emerald_rapids(), 6, 0x8f, "Intel(R) Xeon(R) Platinum 8480+"); }
CpuFeatures intel_granite_rapids() { return with_model(intel_emerald_rapids(), 6, 0xad, "Intel(R) Xeon(R) 6980P"); }
CpuFeatures arm(int part) {
  CpuFeatures c;
  c.vendor = "ARM", c.family = 0x41, c.model = part, c.neon = true;
  return c;
}

TEST(FmaUnits, TheTableKnowsTheCpusUsersRun) {
  struct Row {
    CpuFeatures cpu;
    const char* microarchitecture;
    std::vector<int> units;
    int bits;
  };
  for (const Row& row : std::vector<Row>{{amd_zen1(), "AMD Zen/Zen+", {2}, 128},
                                         {amd_zen2(), "AMD Zen 2", {2}, 256},
                                         {amd_zen3(), "AMD Zen 3", {2}, 256},
                                         {amd_zen4(), "AMD Zen 4", {2}, 256},
                                         {amd_zen5(), "AMD Zen 5", {2}, 512},
                                         {intel_haswell(), "Intel Haswell", {2}, 256},
                                         {intel_skylake_sp(), "Intel Skylake-SP/Cascade Lake/Cooper Lake", {1, 2}, 512},
                                         {intel_ice_lake_sp(), "Intel Ice Lake-SP", {2}, 512},
                                         {intel_sapphire_rapids(), "Intel Sapphire Rapids", {2}, 512},
                                         {intel_emerald_rapids(), "Intel Emerald Rapids", {2}, 512},
                                         {intel_granite_rapids(), "Intel Granite Rapids", {2}, 512},
                                         {arm(0xd0c), "Arm Neoverse N1", {2}, 128},
                                         {arm(0xd40), "Arm Neoverse V1", {4}, 128},
                                         {arm(0xd4f), "Arm Neoverse V2", {4}, 128}}) {
    const FmaUnits units = fma_units(row.cpu);
    EXPECT_EQ(units.microarchitecture, row.microarchitecture) << row.cpu.model_name;
    EXPECT_EQ(units.unit_counts, row.units) << row.microarchitecture;
    EXPECT_EQ(units.unit_bits, row.bits) << row.microarchitecture;
  }
  EXPECT_FALSE(fma_units(sse_only()).known());
  EXPECT_FALSE(fma_units(with_model(amd_zen3(), 0x30, 0x01, "a future AMD")).known());
}

TEST(FmaUnits, ExpectedFlopPerCycleIsUnitsTimesWidthTimesTwo) {
  using P = PeakPrecision;
  EXPECT_EQ(expected_flop_per_cycle(P::fp32, amd_zen1()), (std::vector<double>{16}));  // AVX2 on 128-bit pipes
  EXPECT_EQ(expected_flop_per_cycle(P::fp32, amd_zen3()), (std::vector<double>{32}));
  EXPECT_EQ(expected_flop_per_cycle(P::fp64, amd_zen3()), (std::vector<double>{16}));
  EXPECT_EQ(expected_flop_per_cycle(P::fp32, amd_zen4()), (std::vector<double>{32}));  // AVX-512 double-pumped
  EXPECT_EQ(expected_flop_per_cycle(P::bf16, amd_zen4()), (std::vector<double>{64}));
  EXPECT_EQ(expected_flop_per_cycle(P::fp32, amd_zen5()), (std::vector<double>{64}));
  EXPECT_EQ(expected_flop_per_cycle(P::fp32, intel_skylake_sp()), (std::vector<double>{32, 64}));
  EXPECT_EQ(expected_flop_per_cycle(P::fp32, intel_emerald_rapids()), (std::vector<double>{64}));
  EXPECT_EQ(expected_flop_per_cycle(P::bf16, intel_sapphire_rapids()), (std::vector<double>{128}));
  EXPECT_EQ(expected_flop_per_cycle(P::fp64, intel_granite_rapids()), (std::vector<double>{32}));
  EXPECT_EQ(expected_flop_per_cycle(P::fp32, arm(0xd4f)), (std::vector<double>{32}));
  EXPECT_EQ(expected_flop_per_cycle(P::fp32, arm(0xd0c)), (std::vector<double>{16}));
  // Not in the table: one or two units of the kernel's width.
  EXPECT_EQ(expected_flop_per_cycle(P::fp32, sse_only()), (std::vector<double>{8, 16}));
}

TEST(PeakCheck, HoldsTheMeasuredPeakToTheClock) {
  using P = PeakPrecision;
  // Emerald Rapids: 178 GFLOP/s at 2.8 GHz is 64 FLOP/cycle, two AVX-512 FMA units.
  EXPECT_TRUE(check_peak(P::fp32, intel_emerald_rapids(), 178e9, 2.8e9).agrees);
  // Zen 4 at 3.64 GHz: 32 FLOP/cycle (AVX-512 on two 256-bit pipes).
  EXPECT_TRUE(check_peak(P::fp32, amd_zen4(), 116.5e9, 3.64e9).agrees);
  // Zen 3: twelve independent AVX2 chains reach about 98 GFLOP/s at 3.05 GHz; a kernel with an accumulator on the
  // stack measured 41.2 (13.5 FLOP/cycle), which one 256-bit unit would also explain: the table rejects it.
  EXPECT_TRUE(check_peak(P::fp32, amd_zen3(), 98e9, 3.05e9).agrees);
  const PeakCheck spilled = check_peak(P::fp32, amd_zen3(), 41.2e9, 3.05e9);
  EXPECT_FALSE(spilled.agrees);
  EXPECT_NE(spilled.text.find("AMD Zen 3: 2 x 256-bit FMA units per core: 32 expected"), std::string::npos) << spilled.text;
  EXPECT_TRUE(check_peak(P::fp64, amd_zen3(), 45.5e9, 3.05e9).agrees);  // that machine's FP64 kernel was right
  EXPECT_FALSE(check_peak(P::fp64, amd_zen3(), 91e9, 3.05e9).agrees);   // twice what FP64 units can do
  // Skylake-SP: one or two units, at the lower AVX-512 clock of its frequency licence.
  EXPECT_TRUE(check_peak(P::fp32, intel_skylake_sp(), 0.8 * 64 * 3.0e9, 3.0e9).agrees);
  EXPECT_TRUE(check_peak(P::fp32, intel_skylake_sp(), 0.9 * 32 * 3.0e9, 3.0e9).agrees);
  // The "clocks" a dependent add chain reads on Intel cores that execute it at rename.
  for (double wrong_clock : {9.49e9, 10.92e9, 16.5e9, 17.03e9})
    EXPECT_FALSE(check_peak(P::fp32, intel_emerald_rapids(), 178e9, wrong_clock).agrees) << wrong_clock;
  // A peak a third of what it should be, and one above what the units can do.
  EXPECT_FALSE(check_peak(P::fp32, intel_emerald_rapids(), 178e9 / 3, 2.8e9).agrees);
  EXPECT_FALSE(check_peak(P::fp32, amd_zen1(), 32 * 2.3e9, 2.3e9).agrees);
  EXPECT_FALSE(check_peak(P::fp32, intel_emerald_rapids(), 0, 2.8e9).agrees);
  // Neoverse V2 at 3.1 GHz: four 128-bit pipes.
  EXPECT_TRUE(check_peak(P::fp32, arm(0xd4f), 32 * 3.1e9, 3.1e9).agrees);
  EXPECT_FALSE(check_peak(P::fp32, arm(0xd4f), 16 * 3.1e9, 3.1e9).agrees);
}

TEST(PeakCheck, AFailedPeakIsNotUsed) {
  MachineDescription m;
  m.cpu = amd_zen3();
  m.clock_hz = 3.05e9;
  m.fp32 = {41.2e9, 80e9, 2, "12 independent AVX2 FP32 FMA chains", ""};
  m.fp64 = {49e9, 96e9, 2, "12 independent AVX2 FP64 FMA chains", ""};
  judge_peaks(m);
  EXPECT_FALSE(m.fp32.usable());
  EXPECT_NE(m.fp32.failure.find("failed measurement"), std::string::npos);
  EXPECT_EQ(m.fp32.per_rank(1), 0);  // unknown: no %peak, no MFU
  EXPECT_EQ(m.fp32.per_rank(2), 0);
  EXPECT_FALSE(m.clock_agrees);
  EXPECT_TRUE(m.fp64.usable());
  EXPECT_EQ(m.fp64.per_rank(1), 49e9);
  EXPECT_FALSE(m.bf16.known());
  EXPECT_TRUE(m.bf16.failure.empty());
  m.fp32.one_core = 98e9;
  judge_peaks(m);
  EXPECT_TRUE(m.fp32.usable());
  EXPECT_TRUE(m.clock_agrees);
}

TEST(PeakFigure, PerRankUsesTheAllCoreRateForSeveralThreads) {
  PeakFigure p{100e9, 160e9, 2, "k", ""};
  EXPECT_DOUBLE_EQ(p.per_rank(1), 100e9);
  EXPECT_DOUBLE_EQ(p.per_rank(2), 160e9);
  EXPECT_DOUBLE_EQ(p.per_rank(8), 160e9);  // no more than the cores there are
  PeakFigure one_core_only{100e9, 0, 0, "k", ""};
  EXPECT_DOUBLE_EQ(one_core_only.per_rank(2), 200e9);
}

// Measurements on this machine. A loaded machine lowers a trial; the best of several and up to three
// attempts keep a neighbour's burst from failing the test, while a wrong method fails every attempt.
// Every precision this CPU has a kernel for, against the clock and this CPU's FMA units.
TEST(MeasuredPeak, AgreesWithTheClockAndTheFmaUnits) {
  const CpuFeatures cpu = detect_cpu_features();
  PeakOptions options{7, 0.005, {}};
  for (PeakPrecision precision : {PeakPrecision::fp32, PeakPrecision::fp64, PeakPrecision::bf16}) {
    if (!fma_kernel(precision, cpu).run) continue;
    PeakCheck check;
    double clock = 0;
    for (int attempt = 0; attempt < 3 && !check.agrees; ++attempt) {
      const double peak = measure_peak(precision, cpu, options).one_core;
      clock = measure_clock_hz();
      check = check_peak(precision, cpu, peak, clock);
    }
#if defined(__x86_64__) || defined(__aarch64__)
    EXPECT_TRUE(check.agrees) << name(precision) << ": " << check.text << " (" << cpu.model_name << ", family "
                              << cpu.family << " model " << cpu.model << ")";
    EXPECT_GT(clock, 0.5e9);
    EXPECT_LT(clock, 6.5e9);
#else
    GTEST_SKIP() << "no clock measurement on this architecture";
#endif
  }
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

TEST(CpuGemmLibraries, ProbeRatesOnePerLibraryInOrderAndUnderThePeak) {
  std::vector<cpu_gemm::Backend> backends = cpu_gemm::available_backends();
  backends.push_back(backends.front());  // a library twice: each entry its own rate
  const std::vector<double> rates = measure_gemm_rates(backends, 192, 3);
  ASSERT_EQ(rates.size(), backends.size());
  // The peak as a capacity: the best of several measurements, so a neighbour's burst cannot lower it much.
  double peak = 0;
  for (int attempt = 0; attempt < 5; ++attempt)
    peak = std::max(peak, measure_peak(PeakPrecision::fp32, detect_cpu_features(), PeakOptions{}).one_core);
  for (size_t i = 0; i < rates.size(); ++i) {
    EXPECT_GT(rates[i], 0) << cpu_gemm::name(backends[i]);
    // 2 n^3 FLOP per GEMM: a GEMM counted twice or skipped would read far above what the core can do.
    if (peak > 0) {
      EXPECT_LT(rates[i], 1.5 * peak) << cpu_gemm::name(backends[i]);
    }
  }
}

MachineDescription small_measured_machine() {
  MachineOptions options;
  options.peak_trials = 3, options.peak_trial_seconds = 0.002, options.bandwidth_trials = 1;
  options.bandwidth_array_bytes = 8 << 20, options.gemm_probe_size = 128, options.gemm_rounds = 1;
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

TEST(MachineDescription, ResultsFilesOfTheFirstFormatStillRead) {
  nlohmann::json j = to_json(small_measured_machine());
  EXPECT_EQ(j.at("format"), 2);
  j["format"] = 1;  // the same fields, medians of their trials
  EXPECT_EQ(machine_from_json(j).clock_hz, j.at("clock").at("imul_chain_hz").get<double>());
  for (int unknown : {0, 3}) {
    j["format"] = unknown;
    EXPECT_THROW(machine_from_json(j), std::runtime_error) << "format " << unknown;
  }
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
