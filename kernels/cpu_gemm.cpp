// Implementation of the CPU GEMM dispatch (see cpu_gemm.h).
#include "kernels/cpu_gemm.h"

#include <cblas.h>
#include <omp.h>

#include <stdexcept>

#include "kernels/blas.h"

#ifdef STRATA_HAVE_ONEDNN
#include <dnnl.h>
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

}  // namespace

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
