// Scaled dot-product attention on the GPU in fp16/bf16 with fp32 accumulation, in two implementations that
// benchmarks compare: an unfused baseline (cuBLASLt products around a materialised fp32 score matrix, the
// way attention was computed before fused kernels) and a fused flash-attention-2 style kernel pair of our own
// on the tensor cores (mma.sync). Layouts, grouped-query and causal conventions are those of attention.h.
// Callable on caller device tensors with a caller workspace and stream (Plan). Declared unconditionally (no CUDA
// headers here; cudaStream_t is CUstream_st*); the host side (names, validation, workspace layout, the check)
// is in attention_cuda_host.cpp, the rest in attention_cuda.cu when Strata is built with CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attention.h"

struct CUstream_st;

namespace strata::attention::gpu {

enum class Impl { unfused, flash };
enum class DType { fp16, bf16 };

std::string name(Impl impl);    // "unfused", "flash"
std::string name(DType dtype);  // "fp16", "bf16"
std::optional<Impl> parse_impl(const std::string& text);
std::optional<DType> parse_dtype(const std::string& text);

// The unfused baseline keeps the fp32 scores (reused for dP), the probabilities and dS of every
// (batch, head) at once: 8 bytes per score. Larger problems are refused rather than left to fail in cudaMalloc.
constexpr std::size_t kUnfusedWorkspaceLimitBytes = std::size_t{4} << 30;

// Bytes of the unfused baseline's score workspace for this shape (B*Hq*Sq*Skv * 8).
std::size_t unfused_workspace_bytes(const Shape& shape);

// "" when the combination is usable, otherwise a message naming the first problem found.
std::string validate(const Shape& shape, DType dtype, Impl impl);

using Stream = CUstream_st*;

// Device tensors of one call, in the layouts of attention.h: Q, K, V, O, dO, dQ, dK, dV hold the dtype's 16-bit
// values, lse is fp32. Every pointer is aligned to 256 bytes for the unfused baseline (cuBLASLt's heuristic
// assumes cudaMalloc's alignment) and to 16 bytes for flash (its 16-byte loads and stores).
struct ForwardTensors {
  const void* q;  // (B, Hq, Sq, D)
  const void* k;  // (B, Hkv, Skv, D)
  const void* v;  // (B, Hkv, Skv, D)
  void* o;        // (B, Hq, Sq, D), written
  float* lse;     // (B, Hq, Sq), written
};
struct BackwardTensors {
  const void* q;    // (B, Hq, Sq, D)
  const void* k;    // (B, Hkv, Skv, D)
  const void* v;    // (B, Hkv, Skv, D)
  const void* o;    // (B, Hq, Sq, D), from the forward
  const void* d_o;  // (B, Hq, Sq, D)
  const float* lse; // (B, Hq, Sq), from the forward
  void* dq;         // (B, Hq, Sq, D), written
  void* dk;         // (B, Hkv, Skv, D), written
  void* dv;         // (B, Hkv, Skv, D), written
};

// Device memory a call may use as scratch, 256-byte aligned, at least workspace_bytes() long.
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// Where each part of the workspace lies (byte offsets, each 256-byte aligned; 0 bytes where the
// implementation has no such part). Both: delta (B, Hq, Sq) fp32, rowsum(dO * O). Flash: the fp32 dQ
// accumulator (B, Hq, Sq, D). Unfused: the fp32 scores (B, Hq, Sq, Skv), P and dS in the dtype (the same
// shape), and cuBLASLt's workspace.
constexpr std::size_t kUnfusedCublasLtBytes = std::size_t{32} << 20;
struct WorkspaceLayout {
  std::size_t delta = 0, dq_accum = 0, scores = 0, probs = 0, dscores = 0, cublaslt = 0;
  std::size_t bytes = 0;  // the total
};
WorkspaceLayout workspace_layout(const Shape& shape, DType dtype, Impl impl);
// The size query: workspace_layout(...).bytes.
std::size_t workspace_bytes(const Shape& shape, DType dtype, Impl impl);

// Attention forward and backward on caller tensors. A Plan holds what one (shape, dtype, impl) needs on the
// current device (the caller selects it with cudaSetDevice first): the kernels chosen and their shared-memory
// limits raised (flash), the cuBLASLt products planned (unfused). forward() and backward() enqueue on `stream`
// and return; they allocate nothing.
class Plan {
 public:
  // Throws std::invalid_argument when validate() rejects the request, the device is older than compute
  // capability 8.0 or lacks the shared memory the flash kernels need; KernelError when CUDA or cuBLASLt fails.
  Plan(const Shape& shape, DType dtype, Impl impl);
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // Throws std::invalid_argument for a workspace below workspace_bytes() or a misaligned pointer.
  void forward(const ForwardTensors& tensors, const Workspace& workspace, Stream stream) const;
  // The unfused backward reads the probabilities its forward left in the workspace: pass the workspace of the
  // forward of the same inputs, untouched since. The flash backward recomputes them from lse.
  void backward(const BackwardTensors& tensors, const Workspace& workspace, Stream stream) const;

  const Shape& shape() const;
  DType dtype() const;
  Impl impl() const;
  std::size_t workspace_bytes() const;
  std::string description() const;  // e.g. "flash fwd/bwd, tensor cores mma.sync m16n8k16, ..."

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Host conversions for callers that upload inputs and read results (CUDA builds): to_storage() rounds `values`
// to the dtype in place and returns the stored 16-bit patterns, so the host copy is exactly what the GPU reads;
// widen() turns stored patterns back into floats.
std::vector<uint16_t> to_storage(DType dtype, std::vector<float>& values);
std::vector<float> widen(DType dtype, const std::vector<uint16_t>& bits);

// Whole tensors of one problem on the host, widened to float, for check(): the inputs as stored and the
// outputs read back. dq, dk, dv may be null when only the forward is checked.
struct HostTensors {
  const float* q;    // (B, Hq, Sq, D)
  const float* k;    // (B, Hkv, Skv, D)
  const float* v;    // (B, Hkv, Skv, D)
  const float* d_o;  // (B, Hq, Sq, D)
  const float* o;    // (B, Hq, Sq, D)
  const float* lse;  // (B, Hq, Sq)
  const float* dq = nullptr;
  const float* dk = nullptr;
  const float* dv = nullptr;
};

// Accuracy of the device results against the float64 reference (reference_forward/backward of attention.h),
// over the query heads of one kv head of one batch entry: every sequence position, the whole GQA group (so the
// group sum in dK/dV is exercised), at a cost far below the full problem's.
struct CheckReport {
  ErrorReport o, lse, dq, dk, dv;  // dq, dk, dv only when backward was checked
  double tolerance = 0;            // attention::tolerance() for the dtype
  bool backward = false;
  bool passed = false;
  std::string summary;             // one line: worst relative L2 and bad counts per tensor
};

// O and lse are held to compare() with attention::tolerance() of the dtype. dQ, dK and dV also pass element
// differences within a float64 bound on the rounding of dS (dQ, dK) or P (dV) in the dtype: their terms cancel
// (each row's dS sums to zero; dV sums P-weighted rows of dO of either sign), so an element can be far below
// its terms and the tensor's RMS and still carry their rounding. A NaN or infinity that the reference does not
// have is reported as worst_excess infinity.
// Host code, built with or without CUDA. Throws std::invalid_argument when batch or kv_head is out of range,
// or `backward` is asked without dq, dk, dv.
CheckReport check(const Shape& shape, DType dtype, const HostTensors& tensors, bool backward, int batch,
                  int kv_head);

}  // namespace strata::attention::gpu
