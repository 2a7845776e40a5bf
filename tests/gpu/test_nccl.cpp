// Every operation of the NCCL backend (collectives/nccl_backend.h), in and out of place, on a communicator of
// this process alone (ncclCommInitRank with one rank needs no MPI), with the buffer layouts strata-collective
// uses and its exact check. One rank still runs the in-place alltoall and sendrecv through their grouped send
// and receive to self, where reading and writing one buffer would race without the staging copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/check.h"
#include "collectives/nccl_backend.h"
#include "tests/gpu/gpu_test.h"

namespace strata::coll {
namespace {

// The send and receive pointers of one case inside `buffer`, laid out as in-place is defined (algorithms.h).
struct Placement {
  void* send = nullptr;
  void* recv = nullptr;
};
Placement place(Operation op, bool in_place, char* a, char* b, std::size_t block_bytes, int rank) {
  if (!in_place) return {a, b};
  const std::size_t offset = block_bytes * static_cast<std::size_t>(rank);
  if (op == Operation::allgather) return {a + offset, a};
  if (op == Operation::reduce_scatter) return {a, a + offset};
  return {a, a};
}

void run_every_operation(DataType dtype, RedOp redop) {
  NcclBackend nccl(0);
  const int rank = 0, size = 1, root = 0;
  for (Operation op : kAllOperations)
    for (bool in_place : {false, true})
      for (std::size_t bytes : {std::size_t{0}, std::size_t{4}, std::size_t{4096 + 12}}) {
        const std::string what = std::string(name(op)) + " " + std::string(name(dtype)) + " " + std::to_string(bytes) +
                                 " B" + (in_place ? " in place" : "");
        const std::size_t elem = size_of(dtype);
        const Counts counts = counts_for(op, bytes, elem, size);
        const CheckSpec spec{op, dtype, redop};
        const std::size_t send_bytes = counts.send_elems * elem, recv_bytes = counts.recv_elems * elem;
        char* a = static_cast<char*>(nccl.device_alloc(std::max(send_bytes, recv_bytes)));
        char* b = static_cast<char*>(nccl.device_alloc(recv_bytes));
        const Placement p = place(op, in_place, a, b, counts.count * elem, rank);
        const std::vector<unsigned char> input = check_inputs(spec, counts, rank);
        nccl.copy_to_device(p.send, input.data(), send_bytes);
        nccl.run(op, p.send, p.recv, counts.count, dtype, redop, root);
        std::vector<unsigned char> out(recv_bytes);
        nccl.synchronize();
        nccl.copy_to_host(out.data(), p.recv, recv_bytes);
        EXPECT_EQ(count_wrong(spec, counts, out, rank, size, root), 0) << what;
      }
}

TEST(Nccl, EveryOperationInAndOutOfPlaceFloat32) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  run_every_operation(DataType::float32, RedOp::sum);
}

TEST(Nccl, EveryOperationInAndOutOfPlaceBfloat16Max) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  run_every_operation(DataType::bfloat16, RedOp::max);
}

TEST(Nccl, EveryOperationInAndOutOfPlaceInt32Prod) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  run_every_operation(DataType::int32, RedOp::prod);
}

TEST(Nccl, VersionIsReported) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  const std::string version = nccl_version();
  EXPECT_NE(version, "none");
  EXPECT_EQ(std::count(version.begin(), version.end(), '.'), 2) << version;
}

}  // namespace
}  // namespace strata::coll
