// The GPU each rank drives, chosen one way by every program: the rank's index on its node modulo the GPUs the node
// shows (one GPU per local rank), made current. CUDA builds only (bench/harness/gpu_device.cpp).
#pragma once

#include <string>

namespace strata {

struct RankGpu {
  int device = -1;
  std::string text;  // "cuda:N name", the device a run records
};

// Collective over MPI_COMM_WORLD. UsageError naming `flag` when some rank sees no GPU, and with `exclusive` (NCCL
// takes one device per rank of a communicator, and GPUs shared by ranks would not measure the network) when a node
// runs more ranks than it has GPUs.
RankGpu select_rank_gpu(const std::string& flag, bool exclusive = false);

}  // namespace strata
