// A transformer's linear layer as three GEMMs on caller buffers, on the CPU GEMM library and in the precision of
// the caller's choice (cpu_gemm.h: fp32, or bf16 operands with fp32 sums), in the layouts llm.c and PyTorch's
// nn.Linear use. N rows (tokens), C input channels, OC output channels; weights are stored (OC, C), row-major.
//
//   forward          y  (N, OC)  = x (N, C) W^T + b
//   input gradient   dx (N, C)  (+)= dy (N, OC) W
//   weight gradient  dW (OC, C) (+)= dy^T x,   db (OC) (+)= sum over rows of dy
//
// Gradients accumulate when `accumulate` is true (gradient accumulation over micro-batches), else they are
// overwritten. Bias may be null (no bias). Throws std::invalid_argument for non-positive sizes.
#pragma once

#include <cstdint>

#include "kernels/cpu_gemm.h"

namespace strata::linear {

struct Dims {
  int64_t rows = 0;             // N
  int64_t in_channels = 0;      // C
  int64_t out_channels = 0;     // OC
  double flops() const { return 2.0 * static_cast<double>(rows) * static_cast<double>(in_channels) * static_cast<double>(out_channels); }
};

void forward(const cpu_gemm::Math& math, const Dims& d, float* y, const float* x, const float* weight, const float* bias);
void backward_input(const cpu_gemm::Math& math, const Dims& d, float* dx, const float* dy, const float* weight,
                    bool accumulate);
void backward_weight(const cpu_gemm::Math& math, const Dims& d, float* dweight, float* dbias, const float* dy,
                     const float* x, bool accumulate);

}  // namespace strata::linear
