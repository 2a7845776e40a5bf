// Scaled dot-product attention on the CPU: flash-style kernels (blocked online softmax, never holding the
// Sq x Skv score matrix), a materialised baseline, and a float64 reference that the checks compare both
// against. Benchmarks hold the flash kernels to the cblas_sgemm rate of the GEMMs they are made of, so their
// block products run on register-blocked AVX-512 kernels that beat cblas_sgemm at these block shapes
// (cblas_sgemm itself where the build has no AVX-512, or on request).
//
// Layouts, row-major and contiguous:
//   Q, O, dO, dQ  (B, Hq, Sq, D)
//   K, V, dK, dV  (B, Hkv, Skv, D)
//   lse           (B, Hq, Sq)        natural-log log-sum-exp of each query row's scaled scores
// Grouped-query attention: query head h reads kv head h / (Hq / Hkv). Softmax scale is 1/sqrt(D).
// Causal masking with Sq != Skv is aligned bottom-right (as in flash-attention): query i sees keys
// j <= i + (Skv - Sq). A query row that sees no key outputs zeros, has lse = -inf, and contributes no gradient.
#pragma once

#include <cstddef>
#include <string>

namespace strata::attention {

struct Shape {
  int batch = 1;
  int heads_q = 1;
  int heads_kv = 1;
  int seq_q = 1;
  int seq_kv = 1;
  int head_dim = 64;
  bool causal = false;
};

// "" when the shape is usable, otherwise a message naming the first problem found.
std::string validate(const Shape& shape);

// Element counts of the tensors above, for callers that allocate them.
std::size_t q_elements(const Shape& shape);    // B*Hq*Sq*D  (Q, O, dO, dQ)
std::size_t kv_elements(const Shape& shape);   // B*Hkv*Skv*D (K, V, dK, dV)
std::size_t lse_elements(const Shape& shape);  // B*Hq*Sq

// FLOP counts by the flash-attention convention, so rates compare with published figures: the forward is
// two GEMMs, 4*B*Hq*Sq*Skv*D, halved when causal (whatever the exact count of unmasked pairs); the backward
// is five GEMMs, 2.5x the forward.
double forward_flops(const Shape& shape);
double backward_flops(const Shape& shape);

// How the flash kernels multiply their blocks. automatic: register-blocked AVX-512 kernels that read the
// operands in place (no packing) when the build targets AVX-512, cblas_sgemm otherwise. blas: always
// cblas_sgemm, for comparison and for checking one against the other.
enum class BlockProducts { automatic, blas };

struct CpuOptions {
  // Threads the kernel runs on. BLAS is held to one thread per caller thread for the duration of a call,
  // because the kernels parallelise over (batch, head, block) themselves.
  int threads = 1;
  // Forward: query rows per task, keys per online-softmax tile. The transposed score tile (kv_block x
  // q_block floats, ~430 KB) stays in L2. A q_block that is a multiple of 48 fills both the 6-row register
  // blocks and the 16-lane vectors without ragged edges.
  int q_block = 192;
  int kv_block = 512;
  // Backward: query rows per recomputed probability tile, keys per dK/dV accumulator (P and dS tiles of
  // bwd_q_block x bwd_kv_block floats, ~440 KB together).
  int bwd_q_block = 192;
  int bwd_kv_block = 256;
  BlockProducts products = BlockProducts::automatic;
};

// "" when the options are usable, otherwise a message naming the problem.
std::string validate(const CpuOptions& options);

// Flash-style forward: writes O (B, Hq, Sq, D) and lse (B, Hq, Sq). Workspace is O(block sizes) per thread.
// Throws std::invalid_argument when validate() rejects the shape or the options.
void flash_forward(const Shape& shape, const float* q, const float* k, const float* v, float* o, float* lse,
                   const CpuOptions& options);

// Flash-attention-2 backward: recomputes probabilities from lse, writes dQ, dK, dV. Parallel tasks own
// disjoint (batch, kv head) groups, so dK/dV have no write races. With fewer than 4 groups per thread the
// key blocks of each group are split across tasks as well; every worker but the first then accumulates dQ
// into a private dQ-sized copy (the one allocation beyond the O(block sizes) per-thread workspace), and the
// copies are summed at the end.
void flash_backward(const Shape& shape, const float* q, const float* k, const float* v, const float* o,
                    const float* d_o, const float* lse, float* dq, float* dk, float* dv, const CpuOptions& options);

// Baseline: materialises the (Sq x Skv) probabilities of one (batch, head) at a time, BLAS products and a
// plain scalar softmax. Same layouts and results as the flash kernels; O(Sq*Skv) workspace per thread.
void naive_forward(const Shape& shape, const float* q, const float* k, const float* v, float* o, float* lse,
                   const CpuOptions& options);
void naive_backward(const Shape& shape, const float* q, const float* k, const float* v, const float* o,
                    const float* d_o, const float* lse, float* dq, float* dk, float* dv, const CpuOptions& options);

// float64 reference with plain loops and a materialised softmax; single-threaded and slow, for checks only.
void reference_forward(const Shape& shape, const double* q, const double* k, const double* v, double* o,
                       double* lse);
void reference_backward(const Shape& shape, const double* q, const double* k, const double* v, const double* o,
                        const double* d_o, const double* lse, double* dq, double* dk, double* dv);

// Accuracy of a result against a reference.
struct ErrorReport {
  double max_abs = 0.0;  // largest |got - ref|
  double rel_l2 = 0.0;   // ||got - ref|| / ||ref|| (plain ||got - ref|| when ref is all zeros), counting only
                         // the part of each |got - ref| above abs_floor
  std::size_t bad = 0;   // elements with |got - ref| > max(tol * (|ref| + rms(ref)), abs_floor), or NaN/Inf mismatch
  double worst_excess = 0.0;   // largest |got - ref| / that element's bound (over 1 for a bad element;
                               // infinity for a NaN or infinity the reference does not have)
  std::size_t worst_at = 0;    // the element it was at
};

// Element test is relative to the element and to the tensor's RMS, so near-zero entries of a tensor with
// large values do not fail on rounding alone. Differences up to abs_floor always pass: it is for tensors that
// are zero in exact arithmetic (dQ and dK when each row sees a single key), where only rounding noise is left.
// Non-finite values must match exactly (-inf lse of an empty causal row is a valid result).
ErrorReport compare(const float* got, const double* ref, std::size_t n, double tol, double abs_floor = 0.0);
ErrorReport compare(const float* got, const float* ref, std::size_t n, double tol, double abs_floor = 0.0);

// True when no element is bad and the relative L2 error is under tol.
bool within(const ErrorReport& report, double tol);

// One tensor's part of a check's message, its elements taken as rows of `width`: "dv rel_l2 3.1e-03 bad 2 (worst
// 1.12 x its bound at row 517, column 3)", or "... bad 0" when no element is bad.
std::string describe(const char* label, const ErrorReport& report, std::size_t width);

// Tolerance guidance for compare()/within(), by the precision the kernel computes in. fp32 kernels land
// around 1e-7..1e-5 relative L2 against float64 (the upper end for peaked softmax rows, where few large
// probabilities carry the rounding); 1e-4 leaves that headroom while any indexing, masking or scaling bug
// shows up as an O(1) error. Half-precision inputs
// with fp32 accumulation carry the input rounding (2^-11 for fp16, 2^-8 for bf16) into every product.
enum class Precision { fp32, fp16, bf16 };
constexpr double tolerance(Precision precision) {
  switch (precision) {
    case Precision::fp32: return 1e-4;
    case Precision::fp16: return 5e-3;
    case Precision::bf16: return 3e-2;
  }
  return 0.0;
}

}  // namespace strata::attention
