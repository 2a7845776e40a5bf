// Implementation of the GEMM problem description (see gemm.h).
#include "kernels/gemm.h"

#include <cmath>


namespace strata::gemm {

std::string name(DType dtype) {
  switch (dtype) {
    case DType::fp32: return "fp32";
    case DType::fp64: return "fp64";
    case DType::tf32: return "tf32";
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::fp8_e4m3: return "fp8";
  }
  return "?";
}

std::optional<DType> parse_dtype(const std::string& text) {
  for (DType d : {DType::fp32, DType::fp64, DType::tf32, DType::fp16, DType::bf16, DType::fp8_e4m3})
    if (name(d) == text) return d;
  if (text == "fp8_e4m3" || text == "e4m3") return DType::fp8_e4m3;
  return std::nullopt;
}

int input_bytes(DType dtype) {
  switch (dtype) {
    case DType::fp64: return 8;
    case DType::fp32: case DType::tf32: return 4;
    case DType::fp16: case DType::bf16: return 2;
    case DType::fp8_e4m3: return 1;
  }
  return 0;
}

int output_bytes(DType dtype) { return dtype == DType::fp8_e4m3 ? 2 : input_bytes(dtype); }

Precision precision(DType dtype) {
  const double u32 = std::ldexp(1.0, -24), u64 = std::ldexp(1.0, -53);
  switch (dtype) {
    case DType::fp64: return {0, u64, u64};
    case DType::fp32: return {0, u32, u32};
    case DType::tf32: return {std::ldexp(1.0, -11), u32, u32};
    case DType::fp16: return {0, u32, std::ldexp(1.0, -11)};
    case DType::bf16: return {0, u32, std::ldexp(1.0, -8)};
    // Output stored as bf16. The accumulation is taken 4 times coarser than fp32's rounding to nearest:
    // cuBLASLt's fp8 GEMM on an H200 exceeded the round-to-nearest bound by 5 % (208x48x144), as the tensor
    // cores' fp8 path keeps its partial sums at reduced precision between promotions to fp32. The bound kept
    // still tells a wrong element from rounding for K up to about 2^20 (4 sqrt(K) u < 1 / sqrt(K)).
    case DType::fp8_e4m3: return {0, std::ldexp(1.0, -22), std::ldexp(1.0, -8)};
  }
  return {};
}

}  // namespace strata::gemm
