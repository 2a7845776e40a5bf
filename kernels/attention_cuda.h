// Scaled dot-product attention on the GPU in fp16/bf16 with fp32 accumulation, in two implementations that
// benchmarks compare: an unfused baseline (cuBLASLt products around a materialised fp32 score matrix, the
// way attention was computed before fused kernels) and a fused flash-attention-2 style kernel pair of our own
// on the tensor cores (mma.sync). Layouts, grouped-query and causal conventions are those of attention.h.
// Declared unconditionally (no CUDA headers here); defined in attention_cuda.cu when Strata is built with CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/attention.h"

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

// One attention problem resident on the current device (the caller selects it with cudaSetDevice first),
// with its own stream. Inputs are drawn on the host from `seed`, rounded to the dtype, and kept on the host
// as stored, so a check compares against exactly what the GPU computed from.
class Attention {
 public:
  // Throws std::invalid_argument when validate() rejects the request or the device is older than compute capability 8.0.
  Attention(const Shape& shape, DType dtype, Impl impl, uint64_t seed);
  ~Attention();
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;

  void forward();   // enqueued on stream(): O (B, Hq, Sq, D) in the dtype, lse (B, Hq, Sq) in fp32
  // Enqueued on stream(): dQ (B, Hq, Sq, D), dK and dV (B, Hkv, Skv, D) in the dtype. Needs forward()'s O and
  // lse (the unfused baseline also its probabilities, which stay in the workspace until the next forward()).
  void backward();
  void* stream() const;  // cudaStream_t

  // Inputs exactly as stored on the device, widened to float: Q and dO (B, Hq, Sq, D), K and V (B, Hkv, Skv, D).
  const std::vector<float>& q() const;
  const std::vector<float>& k() const;
  const std::vector<float>& v() const;
  const std::vector<float>& d_o() const;

  // Outputs widened to float; synchronise the stream first.
  void read_forward(std::vector<float>& o, std::vector<float>& lse) const;
  void read_backward(std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv) const;
  void poison_outputs();  // NaN into O, lse, dQ, dK, dV (synchronous), so a kernel that skips an element shows
  // Testing the check: overwrites element `element` of O (B, Hq, Sq, D) with a huge value (bf16) or NaN (fp16).
  void corrupt_output(size_t element);

  const Shape& shape() const;
  DType dtype() const;
  Impl impl() const;
  std::string description() const;  // e.g. "flash fwd/bwd, tensor cores mma.sync m16n8k16, ..."

 private:
  struct State;
  std::unique_ptr<State> state_;
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

// O, lse and dV are held to compare() with attention::tolerance() of the dtype. dQ and dK also pass element
// differences within a float64 bound on the rounding of dS in the dtype: their terms cancel (each row's dS sums
// to zero), so rows that see few keys carry rounding that is large beside their own value and the tensor RMS.
// Reads the outputs of the last forward() (and backward() when `backward`), which must have run. Throws
// std::invalid_argument when batch or kv_head is out of range.
CheckReport check(const Attention& attention, bool backward, int batch, int kv_head);

}  // namespace strata::attention::gpu
