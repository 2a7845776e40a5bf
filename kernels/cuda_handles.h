// Owners for the CUDA and cuBLASLt handles the GPU kernels use (device memory, cuBLASLt handle, matmul and
// layout descriptors, preferences), so every handle is released on every path. CUDA sources only.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <memory>

#include "kernels/error.h"

namespace strata::cuda {

struct DeviceDeleter {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceDeleter>;

inline DeviceBuffer device_alloc(std::size_t bytes) {
  void* p = nullptr;
  STRATA_KERNEL_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)));
  return DeviceBuffer(p);
}

struct LtHandleDeleter {
  void operator()(cublasLtContext* h) const { cublasLtDestroy(h); }
};
struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using LtHandle = std::unique_ptr<cublasLtContext, LtHandleDeleter>;
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, MatmulDescDeleter>;
using LayoutPtr = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using PreferencePtr = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter>;

}  // namespace strata::cuda
