// The programs' errors and the checks of the GPU libraries they call directly: each CUDA, cuBLAS and NCCL call
// goes through one of these macros, so a failure names the call, the file and the line instead of a bare error
// code. MPI calls are checked with STRATA_MPI_CHECK (collectives/mpi_error.h), HDF5 calls inside results/.
#pragma once

#include <stdexcept>
#include <string>

namespace strata {

// A problem with what the user asked for (flag, value, path). Programs turn it, and the std::invalid_argument
// that the layers below throw for arguments they refuse, into exit code 2.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// A failure of a library or of the machine while running. Programs turn it into exit code 1.
struct RuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail_call(const char* what, const char* call, const char* file, int line,
                                   const std::string& detail) {
  throw RuntimeError(std::string(what) + " call failed: " + call + " at " + file + ":" + std::to_string(line) +
                     (detail.empty() ? "" : ": " + detail));
}

}  // namespace strata

#define STRATA_CUDA_CHECK(call)                                                   \
  do {                                                                            \
    cudaError_t strata_cuda_rc_ = (call);                                         \
    if (strata_cuda_rc_ != cudaSuccess)                                           \
      ::strata::fail_call("CUDA", #call, __FILE__, __LINE__, cudaGetErrorString(strata_cuda_rc_)); \
  } while (0)

#define STRATA_CUBLAS_CHECK(call)                                                 \
  do {                                                                            \
    cublasStatus_t strata_cublas_rc_ = (call);                                    \
    if (strata_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                               \
      ::strata::fail_call("cuBLAS", #call, __FILE__, __LINE__,                    \
                          cublasLtGetStatusString(strata_cublas_rc_));              \
  } while (0)

#define STRATA_NCCL_CHECK(call)                                                   \
  do {                                                                            \
    ncclResult_t strata_nccl_rc_ = (call);                                        \
    if (strata_nccl_rc_ != ncclSuccess)                                           \
      ::strata::fail_call("NCCL", #call, __FILE__, __LINE__, ncclGetErrorString(strata_nccl_rc_)); \
  } while (0)
