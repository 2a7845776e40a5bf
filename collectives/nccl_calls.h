// The NCCL half of the operations table (operations.h): each operation's NCCL call, written once, and enqueued
// by both the NCCL backend of strata-collective (nccl_backend.h) and the NCCL process groups (nccl_groups.h).
// NCCL target only: needs nccl.h and the CUDA runtime.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>

#include "collectives/operations.h"

namespace strata::coll {

// One operation to enqueue: the arguments (operations.h's conventions; count as the operation takes it), the
// communicator, the stream, my rank and the communicator's size.
struct NcclCall {
  const OpArgs& args;
  ncclComm_t comm;
  cudaStream_t stream;
  int rank, size;
  // Copies `bytes` of `input` to scratch of the caller (`owner`) on the stream and returns the copy. Alltoall
  // and sendrecv in place stage their input there: their grouped sends and receives would otherwise read and
  // write one buffer concurrently. Null for a caller that never runs those two in place
  // (std::invalid_argument if it does).
  const void* (*stage)(void* owner, const void* input, std::size_t bytes) = nullptr;
  void* owner = nullptr;
};

// Enqueues `operation` on call.stream; every NCCL call is checked (GpuError).
void enqueue_nccl(Operation operation, const NcclCall& call);

}  // namespace strata::coll
