// Collectives through NCCL: one communicator per group, split from a world communicator bootstrapped over
// MPI, device buffers, one stream. Declared unconditionally; defined in nccl_backend.cpp when Strata is
// built with CUDA and NCCL.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>

#include "collectives/algorithms.h"
#include "collectives/types.h"

namespace strata::coll {

class NcclBackend {
 public:
  // Collective over MPI_COMM_WORLD: the world NCCL communicator, then `group` (my group's MPI communicator)
  // split from it with colour `group_index`. One GPU per rank: `device`.
  NcclBackend(MPI_Comm group, int group_index, int device);
  // A communicator of this process alone on `device`, with no MPI (tests of every operation's buffer handling).
  explicit NcclBackend(int device);
  ~NcclBackend();
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  void* stream() const;  // cudaStream_t
  // Enqueues one operation on stream(), with the same buffer conventions as the MPI algorithms. In place,
  // alltoall and sendrecv first copy the input to scratch on the stream: their grouped sends and receives
  // would otherwise read and write one buffer concurrently.
  void run(Operation operation, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, RedOp op,
           int root);
  void synchronize();

  // Device memory owned by the backend, with host staging for fills and checks: both copies run on stream()
  // and are finished on return, so they are ordered with the operations.
  void* device_alloc(std::size_t bytes);
  void copy_to_device(void* device, const void* host, std::size_t bytes);
  void copy_to_host(void* host, const void* device, std::size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The NCCL library's version, "2.21.5", or "none" where it cannot say.
std::string nccl_version();

}  // namespace strata::coll
