// The GPU attention benchmark's problem: one attention request with device tensors it owns, inputs drawn on
// the host from a seed, rounded to the dtype and kept on the host as stored (so a check compares against exactly
// what the GPU computed from), a workspace and a stream of its own. A thin wrapper over the callable kernels of
// kernels/attention_cuda.h (Plan on caller tensors). Declared unconditionally; defined in attention_cases.cu
// when Strata is built with CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_cuda.h"

namespace strata::attention::gpu {

class Attention {
 public:
  // On the current device (the caller selects it with cudaSetDevice first). Throws std::invalid_argument when
  // Plan does (validate() rejects the request, the device is too old).
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

  // Outputs widened to float (waits for the stream).
  void read_forward(std::vector<float>& o, std::vector<float>& lse) const;
  void read_backward(std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv) const;
  void poison_outputs();  // NaN into O, lse, dQ, dK, dV (synchronous), so a kernel that skips an element shows
  // Testing the check: overwrites element `element` of O (B, Hq, Sq, D) with a huge value (bf16) or NaN (fp16).
  void corrupt_output(size_t element);

  const Shape& shape() const;
  DType dtype() const;
  Impl impl() const;
  std::string description() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// check() of attention_cuda.h on the outputs of the last forward() (and backward() when `backward`), which
// must have run.
CheckReport check(const Attention& attention, bool backward, int batch, int kv_head);

}  // namespace strata::attention::gpu
