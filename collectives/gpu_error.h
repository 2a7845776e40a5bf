// CUDA and NCCL errors of the collectives layer (for sources built with CUDA): every call goes through one of
// these checks, so a failure names the call, the file and the line with the library's own message.
#pragma once

#include <stdexcept>
#include <string>

namespace strata::coll {

struct GpuError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void throw_gpu_error(const char* library, const char* call, const char* file, int line,
                                         const char* detail) {
  throw GpuError(std::string(library) + " call failed: " + call + " at " + file + ":" + std::to_string(line) + ": " + detail);
}

}  // namespace strata::coll

#define STRATA_COLL_CUDA_CHECK(call)                                                       \
  do {                                                                                     \
    const cudaError_t strata_coll_cuda_rc_ = (call);                                       \
    if (strata_coll_cuda_rc_ != cudaSuccess)                                               \
      ::strata::coll::throw_gpu_error("CUDA", #call, __FILE__, __LINE__, cudaGetErrorString(strata_coll_cuda_rc_)); \
  } while (0)

#define STRATA_COLL_NCCL_CHECK(call)                                                       \
  do {                                                                                     \
    const ncclResult_t strata_coll_nccl_rc_ = (call);                                      \
    if (strata_coll_nccl_rc_ != ncclSuccess)                                               \
      ::strata::coll::throw_gpu_error("NCCL", #call, __FILE__, __LINE__, ncclGetErrorString(strata_coll_nccl_rc_)); \
  } while (0)
