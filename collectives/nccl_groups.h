// The process groups of a training job on GPUs: one NCCL communicator per coll::ProcessGroups group (the same
// groups, the same rank order), built once per job, with non-blocking operations on device buffers.
//
// Communicators: the world one from ncclCommInitRank (its unique id broadcast over MPI), every other group's
// split from it (ncclCommSplit, colour and key from the MPI group's members: nccl_plan.h). One rank per GPU:
// a rank takes the GPU of its index on its real node.
//
// Ordering: each group has its own non-blocking CUDA stream, and its operations run there in the order they
// were started; different groups' operations may run at the same time as each other and as compute. Starting
// an operation records an event on the caller's compute stream and makes the group's stream wait on it, so
// the operation reads its inputs as the compute stream had left them at the call (work enqueued on compute
// after the call runs concurrently and must not touch the buffers until the operation is done). The returned
// NcclWork carries an event recorded on the group's stream after the operation: wait_on(compute) makes later
// compute work wait for it without blocking the host, wait() blocks the host, test() asks. Nothing is copied
// to the host, and a dropped handle neither waits nor cancels: the operation still runs in stream order.
//
// Rules, as for the MPI groups (process_group.h) and NCCL: every rank of a group starts the same collectives
// in the same order with the same count, dtype, op and root; ranks shared by two groups start those groups'
// operations in the same order (two communicators' kernels on one GPU may otherwise wait on each other).
// Point-to-point: send and recv on one group run in stream order like everything else, and a send finishes only
// once the peer's matching recv runs, so order them as blocking calls would be ordered; sendrecv pairs a send
// and a receive that must progress together (the pipeline's neighbour exchange, or a rank with itself).
//
// Buffers follow NCCL, as the MPI groups do: in place means sendbuf == recvbuf, except allgather (sendbuf ==
// recvbuf + rank * count elements) and reduce_scatter (recvbuf == sendbuf + rank * recvcount elements). Every
// buffer and the compute stream belong to this rank's GPU.
//
// Teardown, on every rank at the same point (destroy the NcclProcessGroups as it was built, collectively):
// each group synchronises its stream, finalises and destroys its communicator, then destroys its event and
// stream; the split communicators go before the world one.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "collectives/operations.h"
#include "collectives/process_group.h"
#include "collectives/types.h"
#include "collectives/work.h"  // Traffic

namespace strata::coll {

// One operation in flight on a group's stream. Must not outlive its NcclProcessGroups. Destroying (or
// assigning over) one that is still in flight waits for it first, as Work does.
class NcclWork {
 public:
  NcclWork() = default;  // an operation that is already complete (no event)
  NcclWork(NcclWork&& other) noexcept;
  NcclWork& operator=(NcclWork&& other) noexcept;
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;
  ~NcclWork();

  // True once the operation has finished on the GPU (cudaEventQuery). Throws GpuError for a CUDA error or an
  // error NCCL reports for the communicator.
  bool test();
  // Blocks the host until test() is true, polling so that an NCCL failure throws instead of hanging.
  void wait();
  // Later work on `compute` waits for the operation (cudaStreamWaitEvent); the host does not block.
  void wait_on(cudaStream_t compute) const;
  cudaEvent_t event() const { return done_; }  // null for a default-constructed handle
  // Bytes this rank sends, per tier, as the ring model of nccl_plan.h counts them; known at the start.
  Traffic traffic() const { return traffic_; }

 private:
  friend class NcclGroup;
  NcclWork(cudaEvent_t done, ncclComm_t comm, Traffic traffic) : done_(done), comm_(comm), traffic_(traffic) {}
  void release() noexcept;
  cudaEvent_t done_ = nullptr;
  ncclComm_t comm_ = nullptr;
  Traffic traffic_;
};

class NcclGroup {
 public:
  // Takes over `comm` (on `device`), whose ranks are the group ranks; node_of_rank[r]: the node of group rank r.
  NcclGroup(std::string name, ncclComm_t comm, int device, std::vector<int> node_of_rank);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::vector<int>& node_of_rank() const { return node_of_rank_; }
  ncclComm_t comm() const;
  cudaStream_t stream() const;

  // Device buffers. std::invalid_argument for a root or peer outside the group, or a send to myself.
  NcclWork allreduce(const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, RedOp op, cudaStream_t compute);
  NcclWork reduce_scatter(const void* sendbuf, void* recvbuf, std::size_t recvcount, DataType dtype, RedOp op,
                          cudaStream_t compute);
  NcclWork allgather(const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, cudaStream_t compute);
  NcclWork broadcast(void* buf, std::size_t count, DataType dtype, int root, cudaStream_t compute);
  NcclWork send(const void* buf, std::size_t count, DataType dtype, int peer, cudaStream_t compute);
  NcclWork recv(void* buf, std::size_t count, DataType dtype, int peer, cudaStream_t compute);
  // Sends sendbuf to rank `to` and receives recvbuf from rank `from` together; either may be me. Distinct buffers.
  NcclWork sendrecv(const void* sendbuf, int to, void* recvbuf, int from, std::size_t count, DataType dtype,
                    cudaStream_t compute);

 private:
  struct Handles;
  NcclWork start(Operation operation, const OpArgs& args, cudaStream_t compute);
  template <typename Call>
  NcclWork launch(cudaStream_t compute, Traffic traffic, Call call);

  std::string name_;
  int device_ = 0;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> node_of_rank_;
  std::unique_ptr<Handles> handles_;
};

class NcclProcessGroups {
 public:
  // Collective over MPI_COMM_WORLD, after `groups` (which it reads, and need not outlive it). Selects this
  // rank's GPU. std::invalid_argument on every rank when some node holds more ranks than GPUs.
  explicit NcclProcessGroups(ProcessGroups& groups);
  NcclProcessGroups(const NcclProcessGroups&) = delete;
  NcclProcessGroups& operator=(const NcclProcessGroups&) = delete;

  int device() const { return device_; }
  NcclGroup& world() { return *world_; }
  NcclGroup& tp() { return *tp_; }
  NcclGroup& pp() { return *pp_; }
  NcclGroup& dp() { return *dp_; }
  NcclGroup& dp_intra() { return *dp_intra_; }
  NcclGroup& dp_inter() { return *dp_inter_; }
  // The communicator of another group of the MPI process groups, made after them (e.g. a reordered one), split
  // from the world one: its ranks in the MPI group's order. Collective over the world, every rank in the same order.
  std::unique_ptr<NcclGroup> split(Group& group);

 private:
  int device_ = 0;
  // Destroyed in reverse: the split communicators before the world one they came from.
  std::unique_ptr<NcclGroup> world_, tp_, pp_, dp_, dp_intra_, dp_inter_;
};

}  // namespace strata::coll
