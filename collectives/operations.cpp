// The table of collective operations (see operations.h): one entry per operation, in the order of
// kAllOperations.
#include "collectives/operations.h"

#include <algorithm>
#include <cstring>

#include "collectives/algorithms.h"
#include "collectives/check.h"
#include "collectives/process_group.h"

namespace strata::coll {

namespace {

using Elements = OperationInfo::Elements;

constexpr auto kOperations = std::to_array<OperationInfo>({
    {.operation = Operation::allreduce,
     .reduction = true,
     .rooted = false,
     .elements = [](std::size_t e, int) { return Elements{e, e, e, e}; },
     .in_place = InPlace::same_buffer,
     // Even blocks; the reduce-scatter pass sends every block but mine, the allgather pass every block but my
     // right neighbour's.
     .ring_elements = [](std::size_t count, int rank, int n, int) {
       const std::size_t r = static_cast<std::size_t>(rank), size = static_cast<std::size_t>(n);
       auto block = [&](std::size_t b) { return count * (b + 1) / size - count * b / size; };
       return 2 * count - block(r) - block((r + 1) % size);
     },
     .algos = {Algo::library, Algo::ring, Algo::recursive_doubling, Algo::hierarchical},
     .group_algos = {Algo::library, Algo::ring, Algo::hierarchical, Algo::horing, Algo::shm},
     .expected = [](const CheckSpec& s, std::size_t, int, int n, int, std::size_t i) -> std::optional<double> {
       return expected_reduction(s.redop, s.dtype, n, i, s.op);
     },
     .run = [](Algo algo, const OpArgs& a, const Context& ctx) {
       return allreduce(algo, a.sendbuf, a.recvbuf, a.count, a.dtype, a.redop, ctx);
     },
     .start = [](Group& g, Algo algo, const OpArgs& a, Waiting w) {
       return g.allreduce(algo, a.sendbuf, a.recvbuf, a.count, a.dtype, a.redop, w);
     }},
    {.operation = Operation::allgather,
     .reduction = false,
     .rooted = false,
     .elements = [](std::size_t e, int n) { return Elements{e / n, e / n, e / n * n, e / n}; },
     .in_place = InPlace::send_in_rank_block,
     .ring_elements = [](std::size_t count, int, int n, int) { return static_cast<std::size_t>(n - 1) * count; },
     .algos = {Algo::library, Algo::ring, Algo::recursive_doubling, Algo::hierarchical},
     .group_algos = {Algo::library, Algo::ring, Algo::hierarchical, Algo::horing, Algo::shm},
     .expected = [](const CheckSpec& s, std::size_t count, int, int, int, std::size_t i) -> std::optional<double> {
       return check_input(s.op, s.redop, static_cast<int>(i / count), i % count);
     },
     .run = [](Algo algo, const OpArgs& a, const Context& ctx) {
       return allgather(algo, a.sendbuf, a.recvbuf, a.count, a.dtype, ctx);
     },
     .start = [](Group& g, Algo algo, const OpArgs& a, Waiting w) {
       return g.allgather(algo, a.sendbuf, a.recvbuf, a.count, a.dtype, w);
     }},
    {.operation = Operation::reduce_scatter,
     .reduction = true,
     .rooted = false,
     .elements = [](std::size_t e, int n) { return Elements{e / n, e / n * n, e / n, e / n}; },
     .in_place = InPlace::recv_in_rank_block,
     .ring_elements = [](std::size_t count, int, int n, int) { return static_cast<std::size_t>(n - 1) * count; },
     .algos = {Algo::library, Algo::ring, Algo::recursive_doubling, Algo::hierarchical},
     .group_algos = {Algo::library, Algo::ring, Algo::hierarchical, Algo::horing, Algo::shm},
     .expected = [](const CheckSpec& s, std::size_t count, int rank, int n, int,
                    std::size_t i) -> std::optional<double> {
       return expected_reduction(s.redop, s.dtype, n, static_cast<std::size_t>(rank) * count + i, s.op);
     },
     .run = [](Algo algo, const OpArgs& a, const Context& ctx) {
       return reduce_scatter(algo, a.sendbuf, a.recvbuf, a.count, a.dtype, a.redop, ctx);
     },
     .start = [](Group& g, Algo algo, const OpArgs& a, Waiting w) {
       return g.reduce_scatter(algo, a.sendbuf, a.recvbuf, a.count, a.dtype, a.redop, w);
     }},
    {.operation = Operation::alltoall,
     .reduction = false,
     .rooted = false,
     // OSU's share of an alltoall is its whole send buffer, as nccl-tests' S.
     .elements = [](std::size_t e, int n) { return Elements{e / n, e / n * n, e / n * n, e / n * n}; },
     .in_place = InPlace::same_buffer,
     .ring_elements = nullptr,
     .algos = {Algo::library, Algo::ring},
     .group_algos = {},
     // Block s of the output is block `rank` of rank s's input.
     .expected = [](const CheckSpec& s, std::size_t count, int rank, int, int,
                    std::size_t i) -> std::optional<double> {
       return check_input(s.op, s.redop, static_cast<int>(i / count),
                          static_cast<std::size_t>(rank) * count + i % count);
     },
     .run = [](Algo algo, const OpArgs& a, const Context& ctx) {
       return alltoall(algo, a.sendbuf, a.recvbuf, a.count, a.dtype, ctx);
     },
     .start = nullptr},
    {.operation = Operation::broadcast,
     .reduction = false,
     .rooted = true,
     .elements = [](std::size_t e, int) { return Elements{e, e, e, e}; },
     .in_place = InPlace::same_buffer,
     // A chain from the root: every rank but the last forwards the whole buffer.
     .ring_elements = [](std::size_t count, int rank, int n, int root) -> std::size_t {
       const int position = (rank + n - root) % n;
       return position + 1 < n ? count : 0;
     },
     .algos = {Algo::library, Algo::ring, Algo::recursive_doubling},
     .group_algos = {Algo::library, Algo::ring, Algo::shm},
     .expected = [](const CheckSpec& s, std::size_t, int, int, int root, std::size_t i) -> std::optional<double> {
       return check_input(s.op, s.redop, root, i);
     },
     .run = [](Algo algo, const OpArgs& a, const Context& ctx) {
       return broadcast(algo, a.sendbuf, a.recvbuf, a.count, a.dtype, a.root, ctx);
     },
     // The process groups broadcast in place: out of place, the root's input goes to its output first.
     .start = [](Group& g, Algo algo, const OpArgs& a, Waiting w) {
       if (g.rank() == a.root && a.sendbuf != a.recvbuf && a.count > 0)
         std::memcpy(a.recvbuf, a.sendbuf, a.count * size_of(a.dtype));
       return g.broadcast(algo, a.recvbuf, a.count, a.dtype, a.root, w);
     }},
    {.operation = Operation::reduce,
     .reduction = true,
     .rooted = true,
     .elements = [](std::size_t e, int) { return Elements{e, e, e, e}; },
     .in_place = InPlace::same_buffer,
     .ring_elements = nullptr,
     .algos = {Algo::library, Algo::ring, Algo::recursive_doubling},
     .group_algos = {},
     .expected = [](const CheckSpec& s, std::size_t, int rank, int n, int root,
                    std::size_t i) -> std::optional<double> {
       if (rank != root) return std::nullopt;
       return expected_reduction(s.redop, s.dtype, n, i, s.op);
     },
     .run = [](Algo algo, const OpArgs& a, const Context& ctx) {
       return reduce(algo, a.sendbuf, a.recvbuf, a.count, a.dtype, a.redop, a.root, ctx);
     },
     .start = nullptr},
    {.operation = Operation::sendrecv,
     .reduction = false,
     .rooted = false,
     .elements = [](std::size_t e, int) { return Elements{e, e, e, e}; },
     .in_place = InPlace::same_buffer,
     .ring_elements = nullptr,
     .algos = {Algo::library, Algo::ring},
     .group_algos = {},
     // From the left neighbour around the ring.
     .expected = [](const CheckSpec& s, std::size_t, int rank, int n, int, std::size_t i) -> std::optional<double> {
       return check_input(s.op, s.redop, (rank - 1 + n) % n, i);
     },
     .run = [](Algo algo, const OpArgs& a, const Context& ctx) {
       return sendrecv(algo, a.sendbuf, a.recvbuf, a.count, a.dtype, ctx);
     },
     .start = nullptr},
});

constexpr bool in_enum_order() {
  for (std::size_t i = 0; i < kOperations.size(); ++i)
    if (kOperations[i].operation != kAllOperations[i] || static_cast<std::size_t>(kAllOperations[i]) != i) return false;
  return kOperations.size() == kAllOperations.size();
}
static_assert(in_enum_order(), "one table entry per Operation, in the order of the enum");

}  // namespace

const OperationInfo& info(Operation operation) { return kOperations.at(static_cast<std::size_t>(operation)); }

bool is_supported(Operation operation, Algo algo) { return info(operation).algos.has(algo); }

bool is_reduction(Operation operation) { return info(operation).reduction; }

Counts counts_for(Operation operation, std::size_t bytes, std::size_t elem, int n) {
  const Elements e = info(operation).elements(bytes / elem, n);
  return {.count = e.count,
          .send_elems = e.send,
          .recv_elems = e.recv,
          .size_bytes = std::max(e.send, e.recv) * elem,
          .bytes_per_rank = e.per_rank * elem};
}

InPlaceOffsets in_place_offsets(Operation operation, const Counts& counts, std::size_t elem, int rank) {
  const std::size_t block = counts.count * elem * static_cast<std::size_t>(rank);
  switch (info(operation).in_place) {
    case InPlace::same_buffer: return {};
    case InPlace::send_in_rank_block: return {.send = block, .recv = 0};
    case InPlace::recv_in_rank_block: return {.send = 0, .recv = block};
  }
  return {};
}

}  // namespace strata::coll
