// How the CUDA GEMM hands Strata's row-major C = A W^T to cuBLASLt, which is column-major: as the product
// C^T (N, M) = W (N, K) . A^T (K, M). W's row-major storage is a column-major (K, N) matrix used transposed,
// A's is a column-major (K, M) matrix used as is: cuBLASLt's "TN" layout, the one FP8 requires. Plain C++ so
// the CPU build tests the mapping (tests/unit/test_gemm.cpp); shared with nvcc (C++17).
#pragma once

#include <cstdint>

#include "kernels/gemm.h"

namespace strata::gemm {

// A column-major matrix as cuBLASLt describes it: rows x cols, `ld` elements between columns.
struct ColumnMajor {
  int64_t rows = 0, cols = 0, ld = 0;
};

// cuBLASLt's D = op(A) op(B) for our shape: its A is our W, its B our A, its D our C (transposed).
struct LtLayout {
  bool transpose_a = false, transpose_b = false;
  ColumnMajor a, b, d;
};

LtLayout lt_layout(const Shape& shape);

}  // namespace strata::gemm
