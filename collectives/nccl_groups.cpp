// Implementation of the NCCL process groups (see nccl_groups.h).
#include "collectives/nccl_groups.h"

#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "collectives/gpu_error.h"
#include "collectives/mpi.h"
#include "collectives/mpi_error.h"
#include "collectives/nccl_calls.h"
#include "collectives/nccl_plan.h"
#include "collectives/nccl_types.h"

namespace strata::coll {

namespace {

// Teardown cannot throw: a failure is reported and the rest is still released.
void report_teardown(const char* call, const char* detail) {
  std::fprintf(stderr, "strata: NCCL process groups teardown: %s failed: %s\n", call, detail);
}

}  // namespace

// ---- NcclWork ---------------------------------------------------------------------------------------------

NcclWork::NcclWork(NcclWork&& other) noexcept
    : done_(std::exchange(other.done_, nullptr)), comm_(std::exchange(other.comm_, nullptr)), traffic_(other.traffic_) {}

NcclWork& NcclWork::operator=(NcclWork&& other) noexcept {
  if (this != &other) {
    release();
    done_ = std::exchange(other.done_, nullptr);
    comm_ = std::exchange(other.comm_, nullptr);
    traffic_ = other.traffic_;
  }
  return *this;
}

NcclWork::~NcclWork() { release(); }

// As Work does: an operation still in flight reads and writes the caller's buffers, which may be freed or
// reused the moment this handle is gone, so it is waited for first (polling, so a failed peer ends the wait
// with a report instead of a hang).
void NcclWork::release() noexcept {
  if (!done_) return;
  try {
    wait();
  } catch (const std::exception& e) {
    report_teardown("waiting for an operation in flight", e.what());
  }
  if (cudaError_t rc = cudaEventDestroy(done_); rc != cudaSuccess) report_teardown("cudaEventDestroy", cudaGetErrorString(rc));
  done_ = nullptr;
}

bool NcclWork::test() {
  if (!done_) return true;
  const cudaError_t rc = cudaEventQuery(done_);
  if (rc == cudaSuccess) return true;
  if (rc != cudaErrorNotReady) STRATA_COLL_CUDA_CHECK(rc);
  // A peer that failed leaves this rank's kernel waiting forever; NCCL says so here.
  ncclResult_t async = ncclSuccess;
  STRATA_COLL_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
  STRATA_COLL_NCCL_CHECK(async);
  return false;
}

void NcclWork::wait() {
  while (!test()) std::this_thread::yield();
}

void NcclWork::wait_on(cudaStream_t compute) const {
  if (done_) STRATA_COLL_CUDA_CHECK(cudaStreamWaitEvent(compute, done_, 0));
}

// ---- NcclGroup --------------------------------------------------------------------------------------------

// The group's handles, torn down in the order NCCL and CUDA need: nothing may still run on the stream when
// the communicator goes, and finalize flushes the communicator's work before destroy frees it.
struct NcclGroup::Handles {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t inputs_ready = nullptr;

  Handles() = default;
  Handles(const Handles&) = delete;
  Handles& operator=(const Handles&) = delete;
  ~Handles() {
    if (stream)
      if (cudaError_t rc = cudaStreamSynchronize(stream); rc != cudaSuccess)
        report_teardown("cudaStreamSynchronize", cudaGetErrorString(rc));
    if (comm) {
      if (ncclResult_t rc = ncclCommFinalize(comm); rc != ncclSuccess) report_teardown("ncclCommFinalize", ncclGetErrorString(rc));
      if (ncclResult_t rc = ncclCommDestroy(comm); rc != ncclSuccess) report_teardown("ncclCommDestroy", ncclGetErrorString(rc));
    }
    if (inputs_ready)
      if (cudaError_t rc = cudaEventDestroy(inputs_ready); rc != cudaSuccess)
        report_teardown("cudaEventDestroy", cudaGetErrorString(rc));
    if (stream)
      if (cudaError_t rc = cudaStreamDestroy(stream); rc != cudaSuccess)
        report_teardown("cudaStreamDestroy", cudaGetErrorString(rc));
  }
};

NcclGroup::NcclGroup(std::string name, ncclComm_t comm, int device, std::vector<int> node_of_rank)
    : name_(std::move(name)), device_(device), node_of_rank_(std::move(node_of_rank)), handles_(std::make_unique<Handles>()) {
  handles_->comm = comm;  // owned from here, whatever fails below
  STRATA_COLL_CUDA_CHECK(cudaSetDevice(device_));
  STRATA_COLL_NCCL_CHECK(ncclCommUserRank(comm, &rank_));
  STRATA_COLL_NCCL_CHECK(ncclCommCount(comm, &size_));
  if (static_cast<int>(node_of_rank_.size()) != size_)
    throw std::invalid_argument("NCCL group " + name_ + ": node map of " + std::to_string(node_of_rank_.size()) +
                                " ranks for " + std::to_string(size_));
  STRATA_COLL_CUDA_CHECK(cudaStreamCreateWithFlags(&handles_->stream, cudaStreamNonBlocking));
  STRATA_COLL_CUDA_CHECK(cudaEventCreateWithFlags(&handles_->inputs_ready, cudaEventDisableTiming));
}

NcclGroup::~NcclGroup() = default;

ncclComm_t NcclGroup::comm() const { return handles_->comm; }
cudaStream_t NcclGroup::stream() const { return handles_->stream; }

// The operation on the group's stream, after the inputs the compute stream had made, then its done event.
// One inputs-ready event serves every operation: a stream wait takes the event as it is at the call.
template <typename Call>
NcclWork NcclGroup::launch(cudaStream_t compute, Traffic traffic, Call call) {
  STRATA_COLL_CUDA_CHECK(cudaSetDevice(device_));
  cudaEvent_t done = nullptr;
  STRATA_COLL_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  NcclWork work(done, handles_->comm, traffic);
  STRATA_COLL_CUDA_CHECK(cudaEventRecord(handles_->inputs_ready, compute));
  STRATA_COLL_CUDA_CHECK(cudaStreamWaitEvent(handles_->stream, handles_->inputs_ready, 0));
  call(handles_->comm, handles_->stream);
  STRATA_COLL_CUDA_CHECK(cudaEventRecord(done, handles_->stream));
  return work;
}

// An operation of the operations table, through its NCCL call (nccl_calls.h), with the ring model's traffic.
NcclWork NcclGroup::start(Operation operation, const OpArgs& args, cudaStream_t compute) {
  const Traffic traffic = ring_traffic(operation, args.count, args.dtype, rank_, node_of_rank_, args.root);
  return launch(compute, traffic, [&](ncclComm_t comm, cudaStream_t stream) {
    enqueue_nccl(operation, {args, comm, stream, rank_, size_});
  });
}

NcclWork NcclGroup::allreduce(const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, RedOp op,
                              cudaStream_t compute) {
  return start(Operation::allreduce, {sendbuf, recvbuf, count, dtype, op}, compute);
}

NcclWork NcclGroup::reduce_scatter(const void* sendbuf, void* recvbuf, std::size_t recvcount, DataType dtype, RedOp op,
                                   cudaStream_t compute) {
  return start(Operation::reduce_scatter, {sendbuf, recvbuf, recvcount, dtype, op}, compute);
}

NcclWork NcclGroup::allgather(const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, cudaStream_t compute) {
  return start(Operation::allgather, {sendbuf, recvbuf, count, dtype}, compute);
}

NcclWork NcclGroup::broadcast(void* buf, std::size_t count, DataType dtype, int root, cudaStream_t compute) {
  check_root(root, size_, name_.c_str());
  return start(Operation::broadcast, {buf, buf, count, dtype, RedOp::sum, root}, compute);
}

NcclWork NcclGroup::send(const void* buf, std::size_t count, DataType dtype, int peer, cudaStream_t compute) {
  check_peer(peer, rank_, size_, name_.c_str());
  const ncclDataType_t type = nccl_type(dtype);
  return launch(compute, message_traffic(count, dtype, rank_, peer, node_of_rank_),
                [&](ncclComm_t comm, cudaStream_t stream) {
                  STRATA_COLL_NCCL_CHECK(ncclSend(buf, count, type, peer, comm, stream));
                });
}

NcclWork NcclGroup::recv(void* buf, std::size_t count, DataType dtype, int peer, cudaStream_t compute) {
  check_peer(peer, rank_, size_, name_.c_str());
  const ncclDataType_t type = nccl_type(dtype);
  return launch(compute, Traffic{}, [&](ncclComm_t comm, cudaStream_t stream) {
    STRATA_COLL_NCCL_CHECK(ncclRecv(buf, count, type, peer, comm, stream));
  });
}

NcclWork NcclGroup::sendrecv(const void* sendbuf, int to, void* recvbuf, int from, std::size_t count, DataType dtype,
                             cudaStream_t compute) {
  check_exchange(to, from, size_, name_.c_str());
  if (count != 0 && sendbuf == recvbuf)
    throw std::invalid_argument("sendrecv on group " + name_ + ": the send and receive buffers must differ");
  const ncclDataType_t type = nccl_type(dtype);
  const Traffic traffic = to == rank_ ? Traffic{} : message_traffic(count, dtype, rank_, to, node_of_rank_);
  return launch(compute, traffic, [&](ncclComm_t comm, cudaStream_t stream) {
    // The group is closed whatever fails inside it, so the next operation does not join it.
    STRATA_COLL_NCCL_CHECK(ncclGroupStart());
    ncclResult_t sent = ncclSend(sendbuf, count, type, to, comm, stream);
    ncclResult_t received = sent == ncclSuccess ? ncclRecv(recvbuf, count, type, from, comm, stream) : ncclSuccess;
    STRATA_COLL_NCCL_CHECK(ncclGroupEnd());
    STRATA_COLL_NCCL_CHECK(sent);
    STRATA_COLL_NCCL_CHECK(received);
  });
}

// ---- NcclProcessGroups ------------------------------------------------------------------------------------

NcclProcessGroups::NcclProcessGroups(ProcessGroups& groups) {
  // GPUs are per real node, whatever nodes the groups emulate. Every rank learns whether any node is short of
  // GPUs before NCCL starts, so all refuse together instead of the others hanging in ncclCommInitRank.
  Comm node = split_shared_memory(MPI_COMM_WORLD);
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess) device_count = 0;
  std::string refusal;
  try {
    device_ = device_for_rank(node.rank(), node.size(), device_count);
  } catch (const std::invalid_argument& e) {
    refusal = e.what();
  }
  int short_here = !refusal.empty(), short_anywhere = 0;
  STRATA_MPI_CHECK(MPI_Allreduce(&short_here, &short_anywhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (short_anywhere)
    throw std::invalid_argument(short_here ? refusal : "another node holds more ranks than GPUs: NCCL needs one rank per GPU");
  STRATA_COLL_CUDA_CHECK(cudaSetDevice(device_));

  Group& world = groups.world();
  ncclUniqueId id{};
  if (world.rank() == 0) STRATA_COLL_NCCL_CHECK(ncclGetUniqueId(&id));
  STRATA_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, world.comm()));
  ncclComm_t world_comm = nullptr;
  STRATA_COLL_NCCL_CHECK(ncclCommInitRank(&world_comm, world.size(), id, world.rank()));
  world_ = std::make_unique<NcclGroup>("world", world_comm, device_, world.node_of_rank());

  // Every rank splits once per kind of group, in the same order, each into the group of that kind it is in.
  tp_ = split(groups.tp());
  pp_ = split(groups.pp());
  dp_ = split(groups.dp());
  dp_intra_ = split(groups.dp_intra());
  dp_inter_ = split(groups.dp_inter());
}

std::unique_ptr<NcclGroup> NcclProcessGroups::split(Group& group) {
  int me = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &me));
  const SplitColor sc = split_color(world_ranks_of(group.comm()), me);
  ncclComm_t comm = nullptr;
  STRATA_COLL_NCCL_CHECK(ncclCommSplit(world_->comm(), sc.color, sc.key, &comm, nullptr));
  auto made = std::make_unique<NcclGroup>(group.name(), comm, device_, group.node_of_rank());
  if (made->rank() != group.rank() || made->size() != group.size())
    throw GpuError("NCCL group " + group.name() + " came out as rank " + std::to_string(made->rank()) + " of " +
                   std::to_string(made->size()) + ", the MPI group's " + std::to_string(group.rank()) + " of " +
                   std::to_string(group.size()));
  return made;
}

}  // namespace strata::coll
