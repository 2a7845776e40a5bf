#include "bench/harness/gpu_device.h"

#include "bench/harness/check.h"
#include "collectives/mpi.h"
#include "collectives/mpi_error.h"
#include "kernels/cuda_info.h"

namespace strata {

RankGpu select_rank_gpu(const std::string& flag, bool exclusive) {
  const int gpus = cuda::device_count();
  int fewest = 0;
  STRATA_MPI_CHECK(MPI_Allreduce(&gpus, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (fewest == 0) throw UsageError(flag + ": no CUDA device is visible to every rank");
  Comm node = split_shared_memory(MPI_COMM_WORLD);
  if (exclusive) {
    int crowded = node.size() > gpus ? 1 : 0, any_crowded = 0;
    STRATA_MPI_CHECK(MPI_Allreduce(&crowded, &any_crowded, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (any_crowded)
      throw UsageError(flag + ": one GPU per rank, but a node runs more ranks than it has visible GPUs (" +
                       std::to_string(node.size()) + " ranks, " + std::to_string(gpus) + " GPUs here)");
  }
  RankGpu gpu;
  gpu.device = node.rank() % gpus;
  cuda::set_device(gpu.device);
  gpu.text = "cuda:" + std::to_string(gpu.device) + " " + cuda::device_name(gpu.device);
  return gpu;
}

}  // namespace strata
