// Error checking shared by every Strata program: each MPI, HDF5, CUDA and NCCL call goes through one of
// these macros, so a failure names the call, the file and the line instead of a bare error code.
#pragma once

#include <stdexcept>
#include <string>

namespace strata {

// A problem with what the user asked for (flag, value, path). Programs turn it into exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
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

// MPI: the error string comes from the library. Requires <mpi.h> and MPI_ERRORS_RETURN on the communicator
// (the harness sets it on MPI_COMM_WORLD).
#define STRATA_MPI_CHECK(call)                                                    \
  do {                                                                            \
    int strata_mpi_rc_ = (call);                                                  \
    if (strata_mpi_rc_ != MPI_SUCCESS) {                                          \
      char strata_msg_[MPI_MAX_ERROR_STRING];                                     \
      int strata_len_ = 0;                                                        \
      MPI_Error_string(strata_mpi_rc_, strata_msg_, &strata_len_);                \
      ::strata::fail_call("MPI", #call, __FILE__, __LINE__,                       \
                          std::string(strata_msg_, static_cast<size_t>(strata_len_))); \
    }                                                                             \
  } while (0)

// HDF5: negative herr_t or hid_t means failure; the HDF5 error stack is printed by the library when enabled.
#define STRATA_H5_CHECK(call)                                                     \
  ([&]() {                                                                        \
    auto strata_h5_rc_ = (call);                                                  \
    if (strata_h5_rc_ < 0) ::strata::fail_call("HDF5", #call, __FILE__, __LINE__, ""); \
    return strata_h5_rc_;                                                         \
  }())

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
