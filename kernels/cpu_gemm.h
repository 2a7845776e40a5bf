// CPU GEMM behind one call, on either library: OpenBLAS (CBLAS) or oneDNN (dnnl_sgemm). Both are row-major
// here: C (M, N) = alpha op(A) op(B) + beta C with op(A) (M, K) and op(B) (K, N).
//
// oneDNN chooses its kernels by instruction set, never by CPU model, so it runs AVX-512 (or AMX) kernels on
// CPUs newer than the library; OpenBLAS chooses by model and needs its core type set on those (blas.h).
// oneDNN has no FP64 GEMM: FP64 always runs on OpenBLAS.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::cpu_gemm {

enum class Backend { openblas, onednn };

std::string name(Backend backend);  // "openblas", "onednn"
std::optional<Backend> parse_backend(const std::string& text);
bool available(Backend backend);    // oneDNN only where the build found it
std::vector<Backend> available_backends();
bool supports_fp64(Backend backend);
std::string library(Backend backend);  // "OpenBLAS 0.3.21", "oneDNN 2.6.3"
std::string kernel(Backend backend);   // what runs: OpenBLAS's core ("SkylakeX"), oneDNN's ISA ("avx512_core_amx")

// Threads each library may use in this process (OpenBLAS's pool and oneDNN's OpenMP pool).
void set_threads(int threads);

// Throws std::invalid_argument for a backend that is not built (or FP64 on oneDNN), std::runtime_error when
// the library reports a failure.
void sgemm(Backend backend, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void dgemm(Backend backend, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
           const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

// The default FP32 backend: the faster of the measured rates (same shape, one thread, same run), OpenBLAS
// when nothing was measured. `rates` pairs each measured backend with its FLOP/s.
Backend fastest(const std::vector<std::pair<Backend, double>>& rates);

}  // namespace strata::cpu_gemm
