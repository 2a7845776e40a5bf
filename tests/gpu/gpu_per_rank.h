// For GPU tests under mpirun: whether every rank has a GPU of its own, decided the same on every rank, and a
// skip (with the reason) where not, so a machine without enough GPUs reports the tests skipped, never passed.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "collectives/mpi.h"
#include "collectives/mpi_error.h"
#include "kernels/error.h"
#include "tests/gpu/gpu_test.h"

namespace strata::gpu_test {

// "" when every rank has a GPU of its own; otherwise why not. Collective over the world.
inline std::string gpu_per_rank_unavailable_reason() {
  std::string reason = cuda_unavailable_reason();
  if (reason.empty()) {
    Comm node = split_shared_memory(MPI_COMM_WORLD);
    int devices = 0;
    STRATA_KERNEL_CUDA_CHECK(cudaGetDeviceCount(&devices));
    if (node.size() > devices)
      reason = "fewer GPUs than ranks: " + std::to_string(node.size()) + " ranks on this node, " + std::to_string(devices) + " GPU(s)";
  }
  int mine = !reason.empty(), any = 0;
  STRATA_MPI_CHECK(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (any && reason.empty()) reason = "fewer GPUs than ranks on another rank's node";
  return reason;
}

}  // namespace strata::gpu_test

#define SKIP_WITHOUT_A_GPU_PER_RANK()                                                               \
  do {                                                                                              \
    if (const std::string strata_reason_ = ::strata::gpu_test::gpu_per_rank_unavailable_reason(); \
        !strata_reason_.empty())                                                                    \
      GTEST_SKIP() << strata_reason_;                                                               \
  } while (0)
