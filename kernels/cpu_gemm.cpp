// Implementation of the CPU GEMM dispatch (see cpu_gemm.h).
#include "kernels/cpu_gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "kernels/blas.h"
#include "kernels/layers.h"

#ifdef STRATA_HAVE_ONEDNN
#include <dnnl.h>
#include <dnnl.hpp>
#endif

namespace strata::cpu_gemm {

namespace {

#ifdef STRATA_HAVE_ONEDNN
void check_dnnl(dnnl_status_t status, const char* call, const char* file, int line) {
  if (status != dnnl_success)
    throw std::runtime_error(std::string("oneDNN call failed: ") + call + " at " + file + ":" + std::to_string(line) +
                             ": status " + std::to_string(static_cast<int>(status)));
}
#define STRATA_DNNL_CHECK(call) check_dnnl((call), #call, __FILE__, __LINE__)

std::string isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "isa " + std::to_string(static_cast<int>(isa));
  }
}
#endif

void require(Backend backend) {
  if (!available(backend)) throw std::invalid_argument("CPU GEMM backend " + name(backend) + " is not built");
}

using layers::BFloat16;

// An operand as stored (rows, cols) with leading dimension ld, rounded to bf16 into contiguous scratch (ld = cols)
// that lives as long as the thread and only grows.
template <typename Out, int Slot>
const Out* rounded(const float* x, int64_t rows, int64_t cols, int64_t ld) {
  static thread_local std::vector<Out> scratch;
  const auto count = static_cast<std::size_t>(rows * cols);
  if (scratch.size() < count) scratch.resize(count);
  Out* out = scratch.data();
  // Threads only where there is enough to share: a thread's start costs about as much as rounding 64 K elements.
  const bool parallel = count >= (std::size_t{1} << 16);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const BFloat16 bits = layers::to_bf16(x[r * ld + c]);
      if constexpr (std::is_same_v<Out, float>) out[r * cols + c] = layers::to_float(bits);
      else out[r * cols + c] = bits;
    }
  return out;
}

#ifdef STRATA_HAVE_ONEDNN
// oneDNN's matmul: C (M, N) fp32 = alpha op(A) op(B) + beta C, A and B contiguous bf16 as stored (op(A) (M, K):
// A is (K, M) when transposed).
void onednn_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const BFloat16* a,
                 const BFloat16* b, float beta, float* c, int64_t ldc) {
  using dnnl::memory;
  static thread_local const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  static thread_local dnnl::stream stream(engine);
  const memory::desc a_md({m, k}, memory::data_type::bf16, trans_a ? memory::dims{1, m} : memory::dims{k, 1});
  const memory::desc b_md({k, n}, memory::data_type::bf16, trans_b ? memory::dims{1, k} : memory::dims{n, 1});
  const memory::desc c_md({m, n}, memory::data_type::f32, memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops sum;
    sum.append_sum(beta);
    attr.set_post_ops(sum);
  }
  // oneDNN caches the primitive (its kernels' code) per shape; the descriptor is made per call, tens of
  // microseconds against the milliseconds of a layer's GEMM.
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine);
  dnnl::matmul(pd).execute(stream, {{DNNL_ARG_SRC, memory(a_md, engine, const_cast<BFloat16*>(a))},
                                    {DNNL_ARG_WEIGHTS, memory(b_md, engine, const_cast<BFloat16*>(b))},
                                    {DNNL_ARG_DST, memory(c_md, engine, c)}});
  stream.wait();
}
#endif

}  // namespace

std::string name(Precision precision) {
  switch (precision) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::bf16_rounded: return "bf16_rounded";
  }
  return "?";
}

std::string name(Backend backend) { return backend == Backend::onednn ? "onednn" : "openblas"; }

std::optional<Backend> parse_backend(const std::string& text) {
  if (text == "openblas") return Backend::openblas;
  if (text == "onednn") return Backend::onednn;
  return std::nullopt;
}

bool available(Backend backend) {
#ifdef STRATA_HAVE_ONEDNN
  (void)backend;
  return true;
#else
  return backend == Backend::openblas;
#endif
}

std::vector<Backend> available_backends() {
  std::vector<Backend> backends;
  for (Backend b : {Backend::openblas, Backend::onednn})
    if (available(b)) backends.push_back(b);
  return backends;
}

bool supports_fp64(Backend backend) { return backend == Backend::openblas; }

std::string library(Backend backend) {
  if (backend == Backend::openblas) return "OpenBLAS " + blas::version();
#ifdef STRATA_HAVE_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
#else
  return "not built";
#endif
}

std::string kernel(Backend backend) {
  if (backend == Backend::openblas) return blas::corename();
#ifdef STRATA_HAVE_ONEDNN
  return isa_name(dnnl_get_effective_cpu_isa());
#else
  return "not built";
#endif
}

void set_threads(int threads) {
  blas::set_threads(threads);
  omp_set_num_threads(threads);  // oneDNN's CPU runtime is OpenMP in Debian's build
}

void sgemm(Backend backend, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  require(backend);
  if (backend == Backend::onednn) {
#ifdef STRATA_HAVE_ONEDNN
    STRATA_DNNL_CHECK(dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
#endif
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void gemm(const Math& math, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (math.precision == Precision::fp32) return sgemm(math.library, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  require(math.library);
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k, b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  if (math.precision == Precision::bf16_rounded) {
    const float* a16 = rounded<float, 0>(a, a_rows, a_cols, lda);
    const float* b16 = rounded<float, 1>(b, b_rows, b_cols, ldb);
    // BLAS wants leading dimensions of at least 1, also for an empty operand.
    return sgemm(math.library, trans_a, trans_b, m, n, k, alpha, a16, std::max<int64_t>(1, a_cols), b16,
                 std::max<int64_t>(1, b_cols), beta, c, ldc);
  }
  if (math.library != Backend::onednn)
    throw std::invalid_argument("bf16 GEMMs run on oneDNN only, not on " + name(math.library));
#ifdef STRATA_HAVE_ONEDNN
  const BFloat16* a16 = rounded<BFloat16, 0>(a, a_rows, a_cols, lda);
  const BFloat16* b16 = rounded<BFloat16, 1>(b, b_rows, b_cols, ldb);
  try {
    onednn_bf16(trans_a, trans_b, m, n, k, alpha, a16, b16, beta, c, ldc);
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("oneDNN bf16 matmul failed at ") + __FILE__ + ":" + std::to_string(__LINE__) +
                             ": " + e.what() + " (status " + std::to_string(static_cast<int>(e.status)) + ")");
  }
#endif
}

std::string bf16_refusal(const CpuFeatures& cpu) {
#ifndef STRATA_HAVE_ONEDNN
  (void)cpu;
  return "this build has no oneDNN, which runs Strata's bf16 GEMMs on the CPU";
#else
  if (!cpu.avx512_bf16 && !cpu.amx_bf16)
    return "this CPU (" + cpu.model_name + "; " + cpu.flags_text() +
           ") has no AVX-512 BF16 or AMX unit, which oneDNN's bf16 GEMMs need";
  // The ISAs are bit sets, each holding the ones below it.
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const auto needed = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  if ((isa & needed) != needed)
    return library(Backend::onednn) + " runs " + kernel(Backend::onednn) + " kernels here, below avx512_core_bf16 " +
           "(as ONEDNN_MAX_CPU_ISA may set), where its bf16 GEMMs would be emulated or refused";
  try {
    const float one[4] = {1, 1, 1, 1};
    float out[4] = {};
    gemm({Backend::onednn, Precision::bf16}, false, false, 2, 2, 2, 1.0f, one, 2, one, 2, 0.0f, out, 2);
  } catch (const std::exception& e) {
    return library(Backend::onednn) + " cannot create a bf16 GEMM on this CPU (its kernels: " + kernel(Backend::onednn) +
           "): " + e.what();
  }
  return "";
#endif
}

void dgemm(Backend backend, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
           const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  require(backend);
  if (!supports_fp64(backend)) throw std::invalid_argument("CPU GEMM backend " + name(backend) + " has no fp64 GEMM");
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

Backend fastest(const std::vector<std::pair<Backend, double>>& rates) {
  Backend best = Backend::openblas;
  double best_rate = 0;
  for (const auto& [backend, rate] : rates)
    if (rate > best_rate) best = backend, best_rate = rate;
  return best;
}

}  // namespace strata::cpu_gemm
