// The cuBLASLt layout of the CUDA GEMM (see gemm_layout.h).
#include "kernels/gemm_layout.h"

namespace strata::gemm {

LtLayout lt_layout(const Shape& s) {
  LtLayout l;
  l.transpose_a = true;   // W stored row-major (N, K) = column-major (K, N); op(A) = (N, K)
  l.transpose_b = false;  // A stored row-major (M, K) = column-major (K, M); op(B) = (K, M)
  l.a = {s.k, s.n, s.k};
  l.b = {s.k, s.m, s.k};
  l.d = {s.n, s.m, s.n};  // C^T column-major (N, M) = C row-major (M, N)
  return l;
}

}  // namespace strata::gemm
