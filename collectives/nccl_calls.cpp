// Each operation's NCCL call (see nccl_calls.h), in the order of kAllOperations.
#include "collectives/nccl_calls.h"

#include <array>
#include <stdexcept>
#include <string>

#include "collectives/gpu_error.h"
#include "collectives/nccl_types.h"

namespace strata::coll {

namespace {

// The input, in place copied to scratch first (see NcclCall::stage).
const void* staged_input(const NcclCall& c, std::size_t bytes) {
  if (c.args.sendbuf != c.args.recvbuf) return c.args.sendbuf;
  if (!c.stage) throw std::invalid_argument("NCCL in-place grouped sends and receives need scratch to stage the input");
  return c.stage(c.owner, c.args.sendbuf, bytes);
}

// Grouped sends and receives; the group is closed whatever fails inside it, so the next operation does not
// join it.
template <typename Calls>
void grouped(Calls calls) {
  STRATA_COLL_NCCL_CHECK(ncclGroupStart());
  try {
    calls();
  } catch (...) {
    (void)ncclGroupEnd();
    throw;
  }
  STRATA_COLL_NCCL_CHECK(ncclGroupEnd());
}

struct NcclEntry {
  Operation operation;
  void (*enqueue)(const NcclCall& c);
};

constexpr auto kNcclCalls = std::to_array<NcclEntry>({
    {Operation::allreduce,
     [](const NcclCall& c) {
       STRATA_COLL_NCCL_CHECK(ncclAllReduce(c.args.sendbuf, c.args.recvbuf, c.args.count, nccl_type(c.args.dtype),
                                            nccl_op(c.args.redop), c.comm, c.stream));
     }},
    {Operation::allgather,
     [](const NcclCall& c) {
       STRATA_COLL_NCCL_CHECK(
           ncclAllGather(c.args.sendbuf, c.args.recvbuf, c.args.count, nccl_type(c.args.dtype), c.comm, c.stream));
     }},
    {Operation::reduce_scatter,
     [](const NcclCall& c) {
       STRATA_COLL_NCCL_CHECK(ncclReduceScatter(c.args.sendbuf, c.args.recvbuf, c.args.count, nccl_type(c.args.dtype),
                                                nccl_op(c.args.redop), c.comm, c.stream));
     }},
    // NCCL has no alltoall: grouped sends and receives, as nccl-tests does.
    {Operation::alltoall,
     [](const NcclCall& c) {
       const ncclDataType_t type = nccl_type(c.args.dtype);
       const std::size_t block = c.args.count * size_of(c.args.dtype);
       const auto* send = static_cast<const char*>(staged_input(c, static_cast<std::size_t>(c.size) * block));
       grouped([&] {
         for (int peer = 0; peer < c.size; ++peer) {
           STRATA_COLL_NCCL_CHECK(ncclSend(send + peer * block, c.args.count, type, peer, c.comm, c.stream));
           STRATA_COLL_NCCL_CHECK(ncclRecv(static_cast<char*>(c.args.recvbuf) + peer * block, c.args.count, type, peer,
                                           c.comm, c.stream));
         }
       });
     }},
    {Operation::broadcast,
     [](const NcclCall& c) {
       STRATA_COLL_NCCL_CHECK(ncclBroadcast(c.args.sendbuf, c.args.recvbuf, c.args.count, nccl_type(c.args.dtype),
                                            c.args.root, c.comm, c.stream));
     }},
    {Operation::reduce,
     [](const NcclCall& c) {
       STRATA_COLL_NCCL_CHECK(ncclReduce(c.args.sendbuf, c.args.recvbuf, c.args.count, nccl_type(c.args.dtype),
                                         nccl_op(c.args.redop), c.args.root, c.comm, c.stream));
     }},
    // From the left neighbour around the ring, to the right one.
    {Operation::sendrecv,
     [](const NcclCall& c) {
       const ncclDataType_t type = nccl_type(c.args.dtype);
       const void* send = staged_input(c, c.args.count * size_of(c.args.dtype));
       grouped([&] {
         STRATA_COLL_NCCL_CHECK(ncclSend(send, c.args.count, type, (c.rank + 1) % c.size, c.comm, c.stream));
         STRATA_COLL_NCCL_CHECK(
             ncclRecv(c.args.recvbuf, c.args.count, type, (c.rank - 1 + c.size) % c.size, c.comm, c.stream));
       });
     }},
});

constexpr bool in_table_order() {
  for (std::size_t i = 0; i < kNcclCalls.size(); ++i)
    if (kNcclCalls[i].operation != kAllOperations[i]) return false;
  return kNcclCalls.size() == kAllOperations.size();
}
static_assert(in_table_order(), "one NCCL call per Operation, in the order of kAllOperations");

}  // namespace

void enqueue_nccl(Operation operation, const NcclCall& call) {
  kNcclCalls.at(static_cast<std::size_t>(operation)).enqueue(call);
}

}  // namespace strata::coll
