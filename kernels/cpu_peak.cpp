// Implementation of the measured CPU peak (see cpu_peak.h).
#include "kernels/cpu_peak.h"
#include "kernels/cpu_threads.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
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
  if (threads <= 1 || all_cores <= 0 || cores <= 0) return one_core * std::max(threads, 1);
  return all_cores / cores * std::min(threads, cores);
}

namespace {

// Every inner loop over the chains is unrolled so the accumulators stay in registers. Twelve chains: two FMA pipes with a 4-cycle latency need eight in flight; twelve leave room for the
// 5-cycle latencies of some cores and still fit the 16 architectural registers of AVX2 with the operands.
constexpr int kChains = 12;

#if defined(__x86_64__)
template <typename Vector, typename Sum>
double horizontal_sum(const Vector& v, Sum) {
  alignas(64) Sum lanes[sizeof(Vector) / sizeof(Sum)];
  static_assert(sizeof lanes == sizeof v);
  __builtin_memcpy(lanes, &v, sizeof v);
  double total = 0;
  for (Sum lane : lanes) total += static_cast<double>(lane);
  return total;
}

// Each chain computes acc = acc * x + y with x just below 1: it converges to y / (1 - x) and never reaches
// subnormals or infinities, which would slow the units down.
__attribute__((target("avx512f"))) double fma_avx512_fp32(long iterations) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.5f + 0.01f * static_cast<float>(c));
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-6f);
  for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], x, y);
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return horizontal_sum(sum, 0.0f);
}

__attribute__((target("avx512f"))) double fma_avx512_fp64(long iterations) {
  __m512d acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_pd(0.5 + 0.01 * c);
  const __m512d x = _mm512_set1_pd(0.999999), y = _mm512_set1_pd(1e-6);
  for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_pd(acc[c], x, y);
  __m512d sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_pd(sum, acc[c]);
  return horizontal_sum(sum, 0.0);
}

// vdpbf16ps: each FP32 lane adds two bf16 products. The sums grow linearly, staying far below overflow.
__attribute__((target("avx512f,avx512bf16"))) double dot_avx512_bf16(long iterations) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.01f * static_cast<float>(c));
  const __m512 small = _mm512_set1_ps(0.01f);
  const __m512bh a = _mm512_cvtne2ps_pbh(small, small), b = _mm512_cvtne2ps_pbh(small, small);
  for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return horizontal_sum(sum, 0.0f);
}

__attribute__((target("avx2,fma"))) double fma_avx2_fp32(long iterations) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.5f + 0.01f * static_cast<float>(c));
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-6f);
  for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], x, y);
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  return horizontal_sum(sum, 0.0f);
}

__attribute__((target("avx2,fma"))) double fma_avx2_fp64(long iterations) {
  __m256d acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_pd(0.5 + 0.01 * c);
  const __m256d x = _mm256_set1_pd(0.999999), y = _mm256_set1_pd(1e-6);
  for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_pd(acc[c], x, y);
  __m256d sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_pd(sum, acc[c]);
  return horizontal_sum(sum, 0.0);
}

double mul_add_sse2_fp32(long iterations) {
  __m128 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm_set1_ps(0.5f + 0.01f * static_cast<float>(c));
  const __m128 x = _mm_set1_ps(0.999999f), y = _mm_set1_ps(1e-6f);
  for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm_add_ps(_mm_mul_ps(acc[c], x), y);
  __m128 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm_add_ps(sum, acc[c]);
  return horizontal_sum(sum, 0.0f);
}

double mul_add_sse2_fp64(long iterations) {
  __m128d acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm_set1_pd(0.5 + 0.01 * c);
  const __m128d x = _mm_set1_pd(0.999999), y = _mm_set1_pd(1e-6);
  for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm_add_pd(_mm_mul_pd(acc[c], x), y);
  __m128d sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm_add_pd(sum, acc[c]);
  return horizontal_sum(sum, 0.0);
}
#elif defined(__aarch64__)
double fma_neon_fp32(long iterations) {
  float32x4_t acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = vdupq_n_f32(0.5f + 0.01f * static_cast<float>(c));
  const float32x4_t x = vdupq_n_f32(0.999999f), y = vdupq_n_f32(1e-6f);
  for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = vfmaq_f32(y, acc[c], x);
  double total = 0;
  for (int c = 0; c < kChains; ++c) total += vaddvq_f32(acc[c]);
  return total;
}

double fma_neon_fp64(long iterations) {
  float64x2_t acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = vdupq_n_f64(0.5 + 0.01 * c);
  const float64x2_t x = vdupq_n_f64(0.999999), y = vdupq_n_f64(1e-6);
  for (long i = 0; i < iterations; ++i)
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = vfmaq_f64(y, acc[c], x);
  double total = 0;
  for (int c = 0; c < kChains; ++c) total += vaddvq_f64(acc[c]);
  return total;
}
#endif

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
  figure.one_core = median(one);

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
  figure.all_cores = median(all);
  return figure;
}

double measure_clock_hz(int trials, double trial_seconds) {
#if defined(__x86_64__)
  // Each asm block is 16 dependent imuls of 3 cycles. The loop counter runs on other ports in parallel.
  auto blocks_taking = [](long blocks) {
    uint64_t x = 1;
    auto start = Clock::now();
    for (long i = 0; i < blocks; ++i)
      asm volatile(
          "imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0\n\t"
          "imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0\n\t"
          "imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0\n\t"
          "imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0"
          : "+r"(x));
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  long blocks = 1000;
  blocks_taking(blocks);
  double t = blocks_taking(blocks);
  while (t < 5e-4 && blocks < (1L << 40)) t = blocks_taking(blocks *= 4);
  blocks = std::max(1L, static_cast<long>(static_cast<double>(blocks) * trial_seconds / t));
  std::vector<double> hz;
  for (int i = 0; i < std::max(1, trials); ++i) hz.push_back(48.0 * static_cast<double>(blocks) / blocks_taking(blocks));
  return median(hz);
#else
  (void)trials, (void)trial_seconds;
  return 0;
#endif
}

std::vector<double> plausible_fp32_flop_per_cycle(const CpuFeatures& cpu) {
  if (!cpu.avx512f && !(cpu.avx2 && cpu.fma) && !cpu.neon) return {8, 16};  // SSE2 mul + add on one or two ports
  const double lanes = fp32_vector_lanes(cpu);
  return {2 * lanes, 4 * lanes};
}

bool peak_agrees_with_clock(const CpuFeatures& cpu, double fp32_one_core, double clock_hz, double low, double high) {
  if (fp32_one_core <= 0 || clock_hz <= 0) return false;
  const double per_cycle = fp32_one_core / clock_hz;
  for (double candidate : plausible_fp32_flop_per_cycle(cpu))
    if (per_cycle >= low * candidate && per_cycle <= high * candidate) return true;
  return false;
}

}  // namespace strata
