// Counted device allocations (see memory_cuda.h).
#include "train/memory_cuda.h"

#include <cuda_runtime.h>

#include "kernels/error.h"

namespace strata::train::detail {

void* device_allocate(MemoryCategory category, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* memory = nullptr;
  STRATA_KERNEL_CUDA_CHECK(cudaMalloc(&memory, bytes));
  // cudaMemset runs on the legacy stream, which non-blocking streams do not wait for: finish it here.
  const cudaError_t zeroed = cudaMemset(memory, 0, bytes);
  const cudaError_t synced = zeroed == cudaSuccess ? cudaDeviceSynchronize() : zeroed;
  if (synced != cudaSuccess) {
    cudaFree(memory);
    throw_kernel_error("CUDA", "cudaMemset", __FILE__, __LINE__, cudaGetErrorString(synced));
  }
  count_device_allocation(category, bytes);
  return memory;
}

void device_free(MemoryCategory category, void* memory, std::size_t bytes) {
  cudaFree(memory);  // a destructor path: a failure here has nowhere to go
  count_device_free(category, bytes);
}

}  // namespace strata::train::detail
