// Implementation of the NCCL backend (see nccl_backend.h).
#include "collectives/nccl_backend.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <vector>

#include "collectives/gpu_error.h"
#include "collectives/mpi_error.h"

namespace strata::coll {

namespace {

ncclDataType_t nccl_type(DataType dtype) {
  switch (dtype) {
    case DataType::int8: return ncclInt8;
    case DataType::int32: return ncclInt32;
    case DataType::float32: return ncclFloat32;
    case DataType::float64: return ncclFloat64;
    case DataType::float16: return ncclFloat16;
    case DataType::bfloat16: return ncclBfloat16;
  }
  throw std::invalid_argument("datatype not available in NCCL");
}

ncclRedOp_t nccl_op(RedOp op) {
  switch (op) {
    case RedOp::sum: return ncclSum;
    case RedOp::prod: return ncclProd;
    case RedOp::min: return ncclMin;
    case RedOp::max: return ncclMax;
    case RedOp::avg: return ncclAvg;
  }
  throw std::invalid_argument("reduction not available in NCCL");
}

struct NcclCommOwner {
  ncclComm_t comm = nullptr;
  ~NcclCommOwner() {
    if (comm) ncclCommDestroy(comm);
  }
};

}  // namespace

struct NcclBackend::Impl {
  NcclCommOwner world, group;
  cudaStream_t stream = nullptr;
  int rank = 0, size = 1;
  std::vector<void*> allocations;
  ~Impl() {
    for (void* p : allocations) cudaFree(p);
    if (stream) cudaStreamDestroy(stream);
  }
};

NcclBackend::NcclBackend(MPI_Comm group, int group_index, int device) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  STRATA_COLL_CUDA_CHECK(cudaSetDevice(device));
  STRATA_COLL_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  int world_rank = 0, world_size = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  STRATA_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  ncclUniqueId id{};
  if (world_rank == 0) STRATA_COLL_NCCL_CHECK(ncclGetUniqueId(&id));
  STRATA_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
  STRATA_COLL_NCCL_CHECK(ncclCommInitRank(&s.world.comm, world_size, id, world_rank));
  STRATA_MPI_CHECK(MPI_Comm_rank(group, &s.rank));
  STRATA_MPI_CHECK(MPI_Comm_size(group, &s.size));
  STRATA_COLL_NCCL_CHECK(ncclCommSplit(s.world.comm, group_index, s.rank, &s.group.comm, nullptr));
}

NcclBackend::~NcclBackend() = default;

void* NcclBackend::stream() const { return impl_->stream; }

void NcclBackend::run(Operation operation, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
                      RedOp op, int root) {
  Impl& s = *impl_;
  ncclComm_t comm = s.group.comm;
  ncclDataType_t type = nccl_type(dtype);
  const std::size_t elem = size_of(dtype);
  switch (operation) {
    case Operation::allreduce:
      STRATA_COLL_NCCL_CHECK(ncclAllReduce(sendbuf, recvbuf, count, type, nccl_op(op), comm, s.stream));
      break;
    case Operation::allgather:
      STRATA_COLL_NCCL_CHECK(ncclAllGather(sendbuf, recvbuf, count, type, comm, s.stream));
      break;
    case Operation::reduce_scatter:
      STRATA_COLL_NCCL_CHECK(ncclReduceScatter(sendbuf, recvbuf, count, type, nccl_op(op), comm, s.stream));
      break;
    case Operation::broadcast:
      STRATA_COLL_NCCL_CHECK(ncclBroadcast(sendbuf, recvbuf, count, type, root, comm, s.stream));
      break;
    case Operation::reduce:
      STRATA_COLL_NCCL_CHECK(ncclReduce(sendbuf, recvbuf, count, type, nccl_op(op), root, comm, s.stream));
      break;
    case Operation::alltoall:
      // NCCL has no alltoall: grouped sends and receives, as nccl-tests does.
      STRATA_COLL_NCCL_CHECK(ncclGroupStart());
      for (int peer = 0; peer < s.size; ++peer) {
        STRATA_COLL_NCCL_CHECK(ncclSend(static_cast<const char*>(sendbuf) + peer * count * elem, count, type, peer, comm, s.stream));
        STRATA_COLL_NCCL_CHECK(ncclRecv(static_cast<char*>(recvbuf) + peer * count * elem, count, type, peer, comm, s.stream));
      }
      STRATA_COLL_NCCL_CHECK(ncclGroupEnd());
      break;
    case Operation::sendrecv:
      STRATA_COLL_NCCL_CHECK(ncclGroupStart());
      STRATA_COLL_NCCL_CHECK(ncclSend(sendbuf, count, type, (s.rank + 1) % s.size, comm, s.stream));
      STRATA_COLL_NCCL_CHECK(ncclRecv(recvbuf, count, type, (s.rank - 1 + s.size) % s.size, comm, s.stream));
      STRATA_COLL_NCCL_CHECK(ncclGroupEnd());
      break;
  }
}

void NcclBackend::synchronize() { STRATA_COLL_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

void* NcclBackend::device_alloc(std::size_t bytes) {
  void* p = nullptr;
  STRATA_COLL_CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
  impl_->allocations.push_back(p);
  return p;
}

void NcclBackend::copy_to_device(void* device, const void* host, std::size_t bytes) {
  if (bytes) STRATA_COLL_CUDA_CHECK(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
}

void NcclBackend::copy_to_host(void* host, const void* device, std::size_t bytes) {
  if (bytes) STRATA_COLL_CUDA_CHECK(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
}

}  // namespace strata::coll
