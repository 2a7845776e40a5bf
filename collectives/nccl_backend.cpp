// Implementation of the NCCL backend (see nccl_backend.h).
#include "collectives/nccl_backend.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/gpu_error.h"
#include "collectives/mpi_error.h"
#include "collectives/nccl_calls.h"

namespace strata::coll {

namespace {

// Teardown cannot throw: a failure there is reported and the rest is still released.
void report_teardown(const char* call, const char* detail) {
  std::fprintf(stderr, "strata: NCCL backend teardown: %s failed: %s\n", call, detail);
}

struct NcclCommOwner {
  ncclComm_t comm = nullptr;
  NcclCommOwner() = default;
  NcclCommOwner(const NcclCommOwner&) = delete;
  NcclCommOwner& operator=(const NcclCommOwner&) = delete;
  // Finalize flushes the communicator's outstanding work before destroy frees its resources.
  ~NcclCommOwner() {
    if (!comm) return;
    if (ncclResult_t rc = ncclCommFinalize(comm); rc != ncclSuccess) report_teardown("ncclCommFinalize", ncclGetErrorString(rc));
    if (ncclResult_t rc = ncclCommDestroy(comm); rc != ncclSuccess) report_teardown("ncclCommDestroy", ncclGetErrorString(rc));
  }
};

}  // namespace

// Members are destroyed in reverse order: the communicators go before the buffers and the stream they use.
struct NcclBackend::Impl {
  struct Resources {
    cudaStream_t stream = nullptr;
    std::vector<void*> allocations;
    void* scratch = nullptr;
    std::size_t scratch_bytes = 0;
    Resources() = default;
    Resources(const Resources&) = delete;
    Resources& operator=(const Resources&) = delete;
    ~Resources() {
      for (void* p : allocations)
        if (cudaError_t rc = cudaFree(p); rc != cudaSuccess) report_teardown("cudaFree", cudaGetErrorString(rc));
      if (scratch)
        if (cudaError_t rc = cudaFree(scratch); rc != cudaSuccess) report_teardown("cudaFree", cudaGetErrorString(rc));
      if (stream)
        if (cudaError_t rc = cudaStreamDestroy(stream); rc != cudaSuccess)
          report_teardown("cudaStreamDestroy", cudaGetErrorString(rc));
    }
  };
  Resources resources;
  NcclCommOwner world, group;  // split from world, so destroyed first
  int rank = 0, size = 1;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  // Nothing may still run on the stream when the communicators and buffers go.
  ~Impl() {
    if (resources.stream)
      if (cudaError_t rc = cudaStreamSynchronize(resources.stream); rc != cudaSuccess)
        report_teardown("cudaStreamSynchronize", cudaGetErrorString(rc));
  }

  void* scratch(std::size_t bytes) {
    if (bytes > resources.scratch_bytes) {
      // The old scratch may still be read by enqueued work.
      STRATA_COLL_CUDA_CHECK(cudaStreamSynchronize(resources.stream));
      if (resources.scratch) STRATA_COLL_CUDA_CHECK(cudaFree(resources.scratch));
      resources.scratch = nullptr;
      resources.scratch_bytes = 0;
      STRATA_COLL_CUDA_CHECK(cudaMalloc(&resources.scratch, bytes));
      resources.scratch_bytes = bytes;
    }
    return resources.scratch;
  }
};

NcclBackend::NcclBackend(MPI_Comm group, int group_index, int device) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  STRATA_COLL_CUDA_CHECK(cudaSetDevice(device));
  STRATA_COLL_CUDA_CHECK(cudaStreamCreateWithFlags(&s.resources.stream, cudaStreamNonBlocking));
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

NcclBackend::NcclBackend(int device) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  STRATA_COLL_CUDA_CHECK(cudaSetDevice(device));
  STRATA_COLL_CUDA_CHECK(cudaStreamCreateWithFlags(&s.resources.stream, cudaStreamNonBlocking));
  ncclUniqueId id{};
  STRATA_COLL_NCCL_CHECK(ncclGetUniqueId(&id));
  STRATA_COLL_NCCL_CHECK(ncclCommInitRank(&s.group.comm, 1, id, 0));
  s.rank = 0;
  s.size = 1;
}

NcclBackend::~NcclBackend() = default;

void* NcclBackend::stream() const { return impl_->resources.stream; }

void NcclBackend::run(Operation operation, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
                      RedOp op, int root) {
  Impl& s = *impl_;
  const OpArgs args{sendbuf, recvbuf, count, dtype, op, root};
  auto stage = [](void* backend, const void* input, std::size_t bytes) -> const void* {
    if (bytes == 0) return input;
    Impl& impl = *static_cast<Impl*>(backend);
    void* scratch = impl.scratch(bytes);
    STRATA_COLL_CUDA_CHECK(
        cudaMemcpyAsync(scratch, input, bytes, cudaMemcpyDeviceToDevice, impl.resources.stream));
    return scratch;
  };
  enqueue_nccl(operation, {args, s.group.comm, s.resources.stream, s.rank, s.size, stage, &s});
}

void NcclBackend::synchronize() { STRATA_COLL_CUDA_CHECK(cudaStreamSynchronize(impl_->resources.stream)); }

void* NcclBackend::device_alloc(std::size_t bytes) {
  void* p = nullptr;
  STRATA_COLL_CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
  impl_->resources.allocations.push_back(p);
  return p;
}

void NcclBackend::copy_to_device(void* device, const void* host, std::size_t bytes) {
  if (bytes == 0) return;
  STRATA_COLL_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, impl_->resources.stream));
  STRATA_COLL_CUDA_CHECK(cudaStreamSynchronize(impl_->resources.stream));
}

void NcclBackend::copy_to_host(void* host, const void* device, std::size_t bytes) {
  if (bytes == 0) return;
  STRATA_COLL_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, impl_->resources.stream));
  STRATA_COLL_CUDA_CHECK(cudaStreamSynchronize(impl_->resources.stream));
}

std::string nccl_version() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return "none";
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

}  // namespace strata::coll
