// Implementation of the measured CPU peak (see cpu_peak.h).
#include "kernels/cpu_peak.h"
#include "kernels/cpu_threads.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace strata {

std::string name(PeakPrecision precision) {
  switch (precision) {
    case PeakPrecision::fp32: return "fp32";
    case PeakPrecision::fp64: return "fp64";
    case PeakPrecision::bf16: return "bf16";
  }
  return "?";
}

double PeakFigure::per_rank(int threads) const {
  if (!usable()) return 0;
  if (threads <= 1 || all_cores <= 0 || cores <= 0) return one_core * std::max(threads, 1);
  return all_cores / cores * std::min(threads, cores);
}

namespace {

// Twelve chains: two FMA pipes with a 4- or 5-cycle latency need eight to ten in flight, and twelve
// accumulators with the two operands fit the 16 architectural registers of AVX2.
constexpr int kChains = 12;

// The chains run inside one asm block whose operands are the twelve accumulators, the two constant vectors
// and the counter: a register operand cannot live in memory while the block runs, so no compiler, option or
// register pressure can put an accumulator on the stack (a spilled accumulator turns the loop into a chain of
// store-to-load forwarding and measures a third of the peak). `STRATA_CHAIN(i)` is one chain's step in the
// block's text; the operand lists name the same twelve accumulators.
#define STRATA_FOR_EACH_CHAIN(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define STRATA_ACCUMULATORS(constraint)                                                                      \
  [a0] constraint(acc[0]), [a1] constraint(acc[1]), [a2] constraint(acc[2]), [a3] constraint(acc[3]),     \
      [a4] constraint(acc[4]), [a5] constraint(acc[5]), [a6] constraint(acc[6]), [a7] constraint(acc[7]), \
      [a8] constraint(acc[8]), [a9] constraint(acc[9]), [a10] constraint(acc[10]), [a11] constraint(acc[11])

template <typename Lane, typename Vector>
double lane_sum(const Vector (&acc)[kChains]) {
  constexpr size_t lanes = sizeof(Vector) / sizeof(Lane);
  double total = 0;
  for (const Vector& v : acc) {
    Lane values[lanes];
    static_assert(sizeof values == sizeof v);
    __builtin_memcpy(values, &v, sizeof v);
    for (Lane lane : values) total += static_cast<double>(lane);
  }
  return total;
}

// Each FMA chain computes acc = acc * x + y with x just below 1: it converges to y / (1 - x) and never reaches
// subnormals or infinities, which would slow the units down.
template <typename Vector, typename Lane>
void fill_chains(Vector (&acc)[kChains], Vector& x, Vector& y) {
  constexpr size_t lanes = sizeof(Vector) / sizeof(Lane);
  for (int c = 0; c < kChains; ++c) {
    Lane values[lanes];
    for (Lane& v : values) v = static_cast<Lane>(0.5 + 0.01 * c);
    __builtin_memcpy(&acc[c], values, sizeof values);
  }
  Lane xs[lanes], ys[lanes];
  for (size_t i = 0; i < lanes; ++i) xs[i] = static_cast<Lane>(0.999999), ys[i] = static_cast<Lane>(1e-6);
  __builtin_memcpy(&x, xs, sizeof xs), __builtin_memcpy(&y, ys, sizeof ys);
}

// One kernel: `chain(i)` is chain i's step in the loop's text, `reg` the operands' register class ("x": xmm/ymm,
// "v": also zmm16-31, "w": Arm's vector registers).
#define STRATA_PEAK_KERNEL(function, attributes, Vector, Lane, reg, chain)                  \
  attributes double function(long iterations) {                                          \
    iterations = std::max(iterations, 1L); /* the loop counts down to zero */            \
    Vector acc[kChains], x, y;                                                           \
    fill_chains<Vector, Lane>(acc, x, y);                                                \
    asm volatile(STRATA_LOOP(STRATA_FOR_EACH_CHAIN(chain))                               \
                 : STRATA_ACCUMULATORS("+" reg), [n] "+r"(iterations)                    \
                 : [x] reg(x), [y] reg(y)                                                \
                 : "cc");                                                                \
    return lane_sum<Lane>(acc);                                                          \
  }

#if defined(__x86_64__)
#define STRATA_LOOP(body) "1:\n\t" body "dec %[n]\n\tjnz 1b\n\t"
// AT&T operand order: `vfmadd213ps y, x, acc` is acc = x * acc + y. SSE2 has no FMA: a multiply and an add per
// step, both counted.
#define STRATA_FMA_PS(i) "vfmadd213ps %[y], %[x], %[a" #i "]\n\t"
#define STRATA_FMA_PD(i) "vfmadd213pd %[y], %[x], %[a" #i "]\n\t"
#define STRATA_MUL_ADD_PS(i) "mulps %[x], %[a" #i "]\n\taddps %[y], %[a" #i "]\n\t"
#define STRATA_MUL_ADD_PD(i) "mulpd %[x], %[a" #i "]\n\taddpd %[y], %[a" #i "]\n\t"
STRATA_PEAK_KERNEL(fma_avx512_fp32, __attribute__((target("avx512f"))), __m512, float, "v", STRATA_FMA_PS)
STRATA_PEAK_KERNEL(fma_avx512_fp64, __attribute__((target("avx512f"))), __m512d, double, "v", STRATA_FMA_PD)
STRATA_PEAK_KERNEL(fma_avx2_fp32, __attribute__((target("avx2,fma"))), __m256, float, "x", STRATA_FMA_PS)
STRATA_PEAK_KERNEL(fma_avx2_fp64, __attribute__((target("avx2,fma"))), __m256d, double, "x", STRATA_FMA_PD)
STRATA_PEAK_KERNEL(mul_add_sse2_fp32, , __m128, float, "x", STRATA_MUL_ADD_PS)
STRATA_PEAK_KERNEL(mul_add_sse2_fp64, , __m128d, double, "x", STRATA_MUL_ADD_PD)
#undef STRATA_FMA_PS
#undef STRATA_FMA_PD
#undef STRATA_MUL_ADD_PS
#undef STRATA_MUL_ADD_PD

// vdpbf16ps: each FP32 lane adds two bf16 products of the constant pairs a and b (0.01 each); the sums grow
// linearly and stay far below overflow.
__attribute__((target("avx512f,avx512bf16"))) double dot_avx512_bf16(long iterations) {
  iterations = std::max(iterations, 1L);  // the loop counts down to zero
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.01f * static_cast<float>(c));
  const __m512 small = _mm512_set1_ps(0.01f);
  const __m512bh pairs = _mm512_cvtne2ps_pbh(small, small);
  __m512 a, b;
  __builtin_memcpy(&a, &pairs, sizeof a), __builtin_memcpy(&b, &pairs, sizeof b);
#define STRATA_CHAIN(i) "vdpbf16ps %[b], %[a], %[a" #i "]\n\t"
  asm volatile(STRATA_LOOP(STRATA_FOR_EACH_CHAIN(STRATA_CHAIN))
               : STRATA_ACCUMULATORS("+v"), [n] "+r"(iterations)
               : [a] "v"(a), [b] "v"(b)
               : "cc");
#undef STRATA_CHAIN
  return lane_sum<float>(acc);
}
#undef STRATA_LOOP
#elif defined(__aarch64__)
// fmla acc, x, y is acc += x * y: with x * y = 1e-6 the chains grow linearly and stay far from overflow.
#define STRATA_LOOP(body) "1:\n\t" body "subs %[n], %[n], #1\n\tb.ne 1b\n\t"
#define STRATA_FMLA_4S(i) "fmla %[a" #i "].4s, %[x].4s, %[y].4s\n\t"
#define STRATA_FMLA_2D(i) "fmla %[a" #i "].2d, %[x].2d, %[y].2d\n\t"
STRATA_PEAK_KERNEL(fma_neon_fp32, , float32x4_t, float, "w", STRATA_FMLA_4S)
STRATA_PEAK_KERNEL(fma_neon_fp64, , float64x2_t, double, "w", STRATA_FMLA_2D)
#undef STRATA_FMLA_4S
#undef STRATA_FMLA_2D
#undef STRATA_LOOP
#endif
#undef STRATA_PEAK_KERNEL
#undef STRATA_ACCUMULATORS
#undef STRATA_FOR_EACH_CHAIN

using Clock = std::chrono::steady_clock;

double seconds_of(long iterations, double (*run)(long), double* checksum) {
  auto start = Clock::now();
  *checksum += run(iterations);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Iterations that take about `seconds` on this core, from a short timed run (after one untimed run that
// brings the vector unit up to speed).
long calibrate(const FmaKernel& kernel, double seconds) {
  double checksum = 0;
  long probe = 2000;
  seconds_of(probe, kernel.run, &checksum);
  double t = seconds_of(probe, kernel.run, &checksum);
  while (t < 1e-3 && probe < (1L << 40)) {
    probe *= 4;
    t = seconds_of(probe, kernel.run, &checksum);
  }
  return std::max(1L, static_cast<long>(static_cast<double>(probe) * seconds / t));
}

}  // namespace

FmaKernel fma_kernel(PeakPrecision precision, const CpuFeatures& cpu) {
  const std::string chains = std::to_string(kChains) + " independent ";
  [[maybe_unused]] const double per_vector = 2.0 * kChains;  // one FMA = 2 FLOP per lane
#if defined(__x86_64__)
  if (precision == PeakPrecision::bf16) {
    if (cpu.avx512f && cpu.avx512_bf16) return {dot_avx512_bf16, 4.0 * kChains * 16, chains + "AVX-512 BF16 dot-product chains"};
    return {};
  }
  const bool fp64 = precision == PeakPrecision::fp64;
  if (cpu.avx512f)
    return fp64 ? FmaKernel{fma_avx512_fp64, per_vector * 8, chains + "AVX-512 FP64 FMA chains"}
                : FmaKernel{fma_avx512_fp32, per_vector * 16, chains + "AVX-512 FP32 FMA chains"};
  if (cpu.avx2 && cpu.fma)
    return fp64 ? FmaKernel{fma_avx2_fp64, per_vector * 4, chains + "AVX2 FP64 FMA chains"}
                : FmaKernel{fma_avx2_fp32, per_vector * 8, chains + "AVX2 FP32 FMA chains"};
  return fp64 ? FmaKernel{mul_add_sse2_fp64, per_vector * 2, chains + "SSE2 FP64 multiply-add chains"}
              : FmaKernel{mul_add_sse2_fp32, per_vector * 4, chains + "SSE2 FP32 multiply-add chains"};
#elif defined(__aarch64__)
  (void)cpu;
  if (precision == PeakPrecision::bf16) return {};
  if (precision == PeakPrecision::fp64) return {fma_neon_fp64, per_vector * 2, chains + "NEON FP64 FMA chains"};
  return {fma_neon_fp32, per_vector * 4, chains + "NEON FP32 FMA chains"};
#else
  (void)precision, (void)cpu;
  return {};
#endif
}

PeakFigure measure_peak(PeakPrecision precision, const CpuFeatures& cpu, const PeakOptions& options) {
  PeakFigure figure;
  const FmaKernel kernel = fma_kernel(precision, cpu);
  if (!kernel.run) return figure;
  figure.kernel = kernel.description;
  const int trials = std::max(1, options.trials);
  const long iterations = calibrate(kernel, options.trial_seconds);
  const double flop = kernel.flop_per_iteration * static_cast<double>(iterations);

  std::vector<double> one;
  double checksum = 0;
  for (int t = 0; t < trials; ++t) one.push_back(flop / seconds_of(iterations, kernel.run, &checksum));
  // The best trial: the kernel's work is fixed, so whatever else the core does (an interrupt, a hypervisor's
  // other guest) only slows a trial down, and the median of trials a slow moment covers sits under the hardware's.
  figure.one_core = *std::max_element(one.begin(), one.end());

  const int cores = static_cast<int>(options.cpus.size());
  figure.cores = cores;
  if (cores == 0) return figure;
  // Every thread runs the same iterations, started together; a trial lasts as long as its slowest thread.
  std::vector<double> all;
  std::vector<double> elapsed(static_cast<size_t>(cores)), sums(static_cast<size_t>(cores));
  std::barrier start(cores + 1), done(cores + 1);
  std::vector<std::jthread> threads;
  for (int i = 0; i < cores; ++i)
    threads.emplace_back([&, i] {
      pin_this_thread(options.cpus[static_cast<size_t>(i)]);
      double warm = 0;
      seconds_of(iterations / 4 + 1, kernel.run, &warm);
      for (int t = 0; t < trials; ++t) {
        start.arrive_and_wait();
        elapsed[static_cast<size_t>(i)] = seconds_of(iterations, kernel.run, &sums[static_cast<size_t>(i)]);
        done.arrive_and_wait();
      }
    });
  for (int t = 0; t < trials; ++t) {
    start.arrive_and_wait();
    done.arrive_and_wait();
    all.push_back(flop * cores / *std::max_element(elapsed.begin(), elapsed.end()));
  }
  threads.clear();
  figure.all_cores = *std::max_element(all.begin(), all.end());
  return figure;
}

double measure_clock_hz(int trials, double trial_seconds) {
#if defined(__x86_64__) || defined(__aarch64__)
  // Each asm block is a dependent chain of 16 integer operations of known latency: `imul` takes 3 cycles on
  // every x86-64 core since 2008; `add` 1 cycle on Arm's cores. The loop counter runs on other ports in parallel.
#if defined(__x86_64__)
  constexpr double kCyclesPerBlock = 48;
#define STRATA_STEP "imul %0, %0\n\t"
#else
  constexpr double kCyclesPerBlock = 16;
#define STRATA_STEP "add %0, %0, %0\n\t"
#endif
  auto blocks_taking = [](long blocks) {
    uint64_t x = 1;
    auto start = Clock::now();
    for (long i = 0; i < blocks; ++i)
      asm volatile(STRATA_STEP STRATA_STEP STRATA_STEP STRATA_STEP STRATA_STEP STRATA_STEP STRATA_STEP STRATA_STEP
                   STRATA_STEP STRATA_STEP STRATA_STEP STRATA_STEP STRATA_STEP STRATA_STEP STRATA_STEP STRATA_STEP
                   : "+r"(x));
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
#undef STRATA_STEP
  long blocks = 1000;
  blocks_taking(blocks);
  double t = blocks_taking(blocks);
  while (t < 5e-4 && blocks < (1L << 40)) t = blocks_taking(blocks *= 4);
  blocks = std::max(1L, static_cast<long>(static_cast<double>(blocks) * trial_seconds / t));
  std::vector<double> hz;
  for (int i = 0; i < std::max(1, trials); ++i)
    hz.push_back(kCyclesPerBlock * static_cast<double>(blocks) / blocks_taking(blocks));
  return *std::max_element(hz.begin(), hz.end());  // the best trial, as the peak's
#else
  (void)trials, (void)trial_seconds;
  return 0;
#endif
}

namespace {

struct ModelRange {
  int first, last;  // CPUID model (Arm: part) range, inclusive
};

struct UnitsEntry {
  const char* vendor;  // CpuFeatures::vendor
  int family;          // CPUID display family (Arm: implementer)
  std::vector<ModelRange> models;
  const char* microarchitecture;
  std::vector<int> unit_counts;
  int unit_bits;
};

// FMA units per core by CPU model, from the vendors' optimisation manuals (Intel's Optimization Reference
// Manual, AMD's Software Optimization Guides for families 17h, 19h and 1Ah, Arm's Neoverse Software
// Optimization Guides). docs/cpu-peak.md lists the sources per row.
const std::vector<UnitsEntry>& units_table() {
  static const std::vector<UnitsEntry> table = {
      // AMD: Zen and Zen+ split 256-bit operations over two 128-bit FMA pipes; Zen 2 to Zen 4 have two
      // 256-bit pipes (Zen 4 double-pumps AVX-512); Zen 5 has two 512-bit pipes except in the mobile parts.
      {"AuthenticAMD", 0x17, {{0x00, 0x2f}}, "AMD Zen/Zen+", {2}, 128},
      {"AuthenticAMD", 0x17, {{0x30, 0xff}}, "AMD Zen 2", {2}, 256},
      {"AuthenticAMD", 0x19, {{0x00, 0x0f}, {0x20, 0x2f}, {0x40, 0x5f}}, "AMD Zen 3", {2}, 256},
      {"AuthenticAMD", 0x19, {{0x10, 0x1f}, {0x60, 0x7f}, {0xa0, 0xaf}}, "AMD Zen 4", {2}, 256},
      {"AuthenticAMD", 0x1a, {{0x00, 0x1f}, {0x40, 0x4f}}, "AMD Zen 5", {2}, 512},
      {"AuthenticAMD", 0x1a, {{0x20, 0x2f}, {0x60, 0x7f}}, "AMD Zen 5 (mobile)", {2}, 256},
      // Intel, family 6.
      {"GenuineIntel", 6, {{0x3c, 0x3c}, {0x3f, 0x3f}, {0x45, 0x46}}, "Intel Haswell", {2}, 256},
      {"GenuineIntel", 6, {{0x3d, 0x3d}, {0x47, 0x47}, {0x4f, 0x4f}, {0x56, 0x56}}, "Intel Broadwell", {2}, 256},
      {"GenuineIntel", 6, {{0x4e, 0x4e}, {0x5e, 0x5e}, {0x8e, 0x8e}, {0x9e, 0x9e}, {0xa5, 0xa6}},
       "Intel Skylake (client)", {2}, 256},
      {"GenuineIntel", 6, {{0x55, 0x55}}, "Intel Skylake-SP/Cascade Lake/Cooper Lake", {1, 2}, 512},
      {"GenuineIntel", 6, {{0x6a, 0x6a}, {0x6c, 0x6c}}, "Intel Ice Lake-SP", {2}, 512},
      {"GenuineIntel", 6, {{0x7d, 0x7e}, {0x8c, 0x8d}, {0xa7, 0xa7}}, "Intel Ice Lake/Tiger Lake/Rocket Lake (client)",
       {1}, 512},
      {"GenuineIntel", 6, {{0x8f, 0x8f}}, "Intel Sapphire Rapids", {2}, 512},
      {"GenuineIntel", 6, {{0xcf, 0xcf}}, "Intel Emerald Rapids", {2}, 512},
      {"GenuineIntel", 6, {{0xad, 0xae}}, "Intel Granite Rapids", {2}, 512},
      {"GenuineIntel", 6, {{0xaf, 0xaf}, {0xdd, 0xdd}}, "Intel Sierra Forest/Clearwater Forest (E-cores)", {2}, 128},
      // Arm (implementer 0x41): NEON runs on 128-bit pipes, two on the N cores and four on the V cores.
      {"ARM", 0x41, {{0xd0c, 0xd0c}}, "Arm Neoverse N1", {2}, 128},
      {"ARM", 0x41, {{0xd49, 0xd49}}, "Arm Neoverse N2", {2}, 128},
      {"ARM", 0x41, {{0xd8e, 0xd8e}}, "Arm Neoverse N3", {2}, 128},
      {"ARM", 0x41, {{0xd40, 0xd40}}, "Arm Neoverse V1", {4}, 128},
      {"ARM", 0x41, {{0xd4f, 0xd4f}}, "Arm Neoverse V2", {4}, 128},
      {"ARM", 0x41, {{0xd84, 0xd84}}, "Arm Neoverse V3", {4}, 128},
  };
  return table;
}

// The kernel's vector width in bits: what fma_kernel() picks for this CPU.
int kernel_vector_bits(const CpuFeatures& cpu) { return 32 * fp32_vector_lanes(cpu); }

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", value);
  return text;
}

}  // namespace

std::string FmaUnits::text() const {
  if (!known()) return "not in the table of FMA units";
  std::string counts;
  for (int c : unit_counts) counts += (counts.empty() ? "" : " or ") + std::to_string(c);
  return microarchitecture + ": " + counts + " x " + std::to_string(unit_bits) + "-bit FMA units per core";
}

FmaUnits fma_units(const CpuFeatures& cpu) {
  for (const UnitsEntry& e : units_table()) {
    if (cpu.vendor != e.vendor || cpu.family != e.family) continue;
    for (const ModelRange& range : e.models)
      if (cpu.model >= range.first && cpu.model <= range.last) return {e.microarchitecture, e.unit_counts, e.unit_bits};
  }
  return {};
}

std::vector<double> expected_flop_per_cycle(PeakPrecision precision, const CpuFeatures& cpu) {
  const bool sse2_only = !cpu.avx512f && !(cpu.avx2 && cpu.fma) && !cpu.neon;
  const double per_lane = precision == PeakPrecision::fp64 ? 1.0 : precision == PeakPrecision::bf16 ? 4.0 : 2.0;
  FmaUnits units = fma_units(cpu);
  if (!units.known()) units.unit_counts = {1, 2}, units.unit_bits = kernel_vector_bits(cpu);
  std::vector<double> expected;
  for (int count : units.unit_counts) {
    // SSE2's multiply and add issue to separate ports: the same FLOP per cycle as one FMA unit per port.
    const int bits = std::min(units.unit_bits, sse2_only ? 128 : kernel_vector_bits(cpu));
    expected.push_back(count * (bits / 32.0) * per_lane);
  }
  return expected;
}

PeakCheck check_peak(PeakPrecision precision, const CpuFeatures& cpu, double one_core, double clock_hz) {
  PeakCheck check;
  check.expected = expected_flop_per_cycle(precision, cpu);
  const FmaUnits units = fma_units(cpu);
  std::string expected;
  for (double e : check.expected) expected += (expected.empty() ? "" : " or ") + number_text(e);
  const std::string basis = units.known() ? units.text()
                                          : "not in the table of FMA units, so one or two " +
                                                std::to_string(kernel_vector_bits(cpu)) + "-bit units";
  if (one_core <= 0) {
    check.text = "no " + name(precision) + " kernel on this CPU";
    return check;
  }
  if (clock_hz <= 0) {
    check.agrees = true;
    check.text = "not checked: no clock measurement on this architecture";
    return check;
  }
  check.flop_per_cycle = one_core / clock_hz;
  for (double e : check.expected)
    if (check.flop_per_cycle >= kPeakTolerance.low * e && check.flop_per_cycle <= kPeakTolerance.high * e)
      check.agrees = true;
  check.text = number_text(check.flop_per_cycle) + " FLOP/cycle at " + number_text(clock_hz / 1e9) + " GHz; " + basis +
               ": " + expected + " expected";
  if (!check.agrees && cpu.hypervisor)
    check.text += " (under a hypervisor, which may present another CPU model than the host's)";
  return check;
}

}  // namespace strata
