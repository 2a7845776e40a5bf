// CPU GEMM behind one call, on either library: OpenBLAS (CBLAS) or oneDNN (dnnl_sgemm). Both are row-major
// here: C (M, N) = alpha op(A) op(B) + beta C with op(A) (M, K) and op(B) (K, N).
//
// oneDNN chooses its kernels by instruction set, never by CPU model, so it runs AVX-512 (or AMX) kernels on
// CPUs newer than the library; OpenBLAS chooses by model and needs its core type set on those (blas.h).
// oneDNN has no FP64 GEMM: FP64 always runs on OpenBLAS.
//
// Mixed-precision training's GEMM takes fp32 tensors, rounds both operands to bf16 and sums the products in
// fp32 (fp32 master weights stay untouched; the output is fp32). A product of two bf16 values is exact in fp32,
// so such a GEMM differs from one on the rounded operands in fp32 only by the order of its sums: that is the
// reference `bf16_rounded` computes on any CPU, and what the library's bf16 kernels are checked against.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu_features.h"

namespace strata::cpu_gemm {

enum class Backend { openblas, onednn };

// The GEMM's arithmetic. fp32; bf16: oneDNN's bf16 matmul (AVX-512 BF16 or AMX kernels; bf16_refusal says
// where it cannot run); bf16_rounded: the operands rounded to bf16 in fp32 scratch and multiplied by the
// library's fp32 GEMM (the same products in another order of sums: bf16's reference, and how a bf16 step is
// checked on CPUs without the units).
enum class Precision { fp32, bf16, bf16_rounded };
std::string name(Precision precision);  // "fp32", "bf16", "bf16_rounded"

// A library and the arithmetic it runs in; a library alone means fp32.
struct Math {
  Math(Backend library_ = Backend::openblas, Precision precision_ = Precision::fp32)
      : library(library_), precision(precision_) {}
  Backend library;
  Precision precision;
};

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
// sgemm in `math`'s precision: operands and result fp32 whatever the precision. bf16 needs oneDNN as the library
// (std::invalid_argument otherwise) and a CPU bf16_refusal accepts: elsewhere oneDNN refuses the matmul
// (std::runtime_error) or emulates it; the caller asks bf16_refusal first.
void gemm(const Math& math, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// Why bf16 GEMMs cannot run here on `cpu`, for a message; empty where they can: oneDNN is built, the CPU has
// AVX-512 BF16 or AMX, oneDNN's kernels may use them (ONEDNN_MAX_CPU_ISA can hold them below: without those
// units oneDNN refuses bf16 or emulates it far below the fp32 rate), and oneDNN creates a bf16 matmul.
std::string bf16_refusal(const CpuFeatures& cpu);
void dgemm(Backend backend, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
           const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

// The default FP32 backend: the faster of the measured rates (same shape, one thread, same run), OpenBLAS
// when nothing was measured. `rates` pairs each measured backend with its FLOP/s.
Backend fastest(const std::vector<std::pair<Backend, double>>& rates);

}  // namespace strata::cpu_gemm
