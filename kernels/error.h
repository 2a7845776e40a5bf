// Errors of the kernels layer. Kernels throw std::invalid_argument for bad arguments and KernelError when a
// library or the device fails; the programs above decide what either means for the user.
#pragma once

#include <stdexcept>
#include <string>

namespace strata {

struct KernelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void throw_kernel_error(const char* library, const char* call, const char* file, int line,
                                            const char* detail) {
  throw KernelError(std::string(library) + " call failed: " + call + " at " + file + ":" + std::to_string(line) +
                    ": " + detail);
}

}  // namespace strata

// For CUDA sources (needs <cuda_runtime.h>): names the call, file, line and the runtime's message.
#define STRATA_KERNEL_CUDA_CHECK(call)                                                         \
  do {                                                                                         \
    const cudaError_t strata_kernel_rc_ = (call);                                              \
    if (strata_kernel_rc_ != cudaSuccess)                                                      \
      ::strata::throw_kernel_error("CUDA", #call, __FILE__, __LINE__, cudaGetErrorString(strata_kernel_rc_)); \
  } while (0)

// For sources that use cuBLASLt (needs <cublasLt.h>): names the call, file, line and cuBLAS's status string.
#define STRATA_KERNEL_CUBLAS_CHECK(call)                                                       \
  do {                                                                                         \
    const cublasStatus_t strata_kernel_status_ = (call);                                       \
    if (strata_kernel_status_ != CUBLAS_STATUS_SUCCESS)                                        \
      ::strata::throw_kernel_error("cuBLAS", #call, __FILE__, __LINE__,                        \
                                   cublasLtGetStatusString(strata_kernel_status_));             \
  } while (0)
