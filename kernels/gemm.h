// GEMM problem description shared by the CPU and CUDA backends and by the reference check.
// Layout, as a transformer's linear layer stores it (PyTorch's nn.Linear, the TN layout cuBLASLt needs for
// FP8): activations A (M, K) row-major, weights W (N, K) row-major, output C = A W^T (M, N) row-major.
// FLOPs = 2 M N K (one multiply-add counted as two).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::gemm {

enum class DType { fp32, fp64, tf32, fp16, bf16, fp8_e4m3 };

std::string name(DType dtype);                  // "fp32", "fp64", "tf32", "fp16", "bf16", "fp8"
std::optional<DType> parse_dtype(const std::string& text);
int input_bytes(DType dtype);                    // bytes per element of A and W
int output_bytes(DType dtype);                   // bytes per element of C (fp8 products are written as bf16)

struct Shape {
  int64_t m = 0, n = 0, k = 0;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
  std::string text() const { return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k); }
};

// Unit roundoff of the arithmetic a dtype's GEMM uses, for the reference check's tolerance.
struct Precision {
  double input;       // rounding applied to inputs inside the GEMM (tf32), 0 when inputs are used exactly
  double accumulate;  // accumulation
  double output;      // rounding of the stored result
};
Precision precision(DType dtype);

}  // namespace strata::gemm
