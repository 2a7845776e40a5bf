// Tests of the shared-memory collectives (collectives/shm.h), run under mpirun with 2 to 5 ranks: every
// operation must give exactly what the MPI library gives, and what a local reference computes, for every
// type, reduction, awkward count, root and in/out-of-place call, on segments far smaller than the buffers,
// and on registered buffers (the direct path) at offsets that differ from rank to rank; repeated back-to-back
// calls and several calls in flight at once, of both paths mixed, must not tear or reuse a chunk early.
// Inputs are small integers, so sums and products are exact in every type whatever the order of reduction.
#include <gtest/gtest.h>
#include <mpi.h>

#include <array>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <algorithm>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/mpi.h"
#include "collectives/shm.h"
#include "collectives/types.h"

namespace strata::coll {
namespace {

const MpiTypes* g_types = nullptr;  // owned by main, which frees it before MPI_Finalize

using Buffer = std::vector<std::byte>;
constexpr std::byte kUntouched{0x5a};

constexpr std::array<Operation, 5> kShmOperations{Operation::allreduce, Operation::allgather,
                                                  Operation::reduce_scatter, Operation::broadcast,
                                                  Operation::reduce};

// Segments of one to a few chunks' worth, so every test buffer spans many chunks and wraps the ring often:
// the smallest slots (two of 64 bytes), a ring of three 4 KiB slots that streams every output and every
// fill, and the defaults (256 KiB slots, streaming outputs from 4 MiB).
ShmOptions tiny_slots() { return {64 * ((static_cast<std::size_t>(world_size()) + 7) / 8), 2, 0, false}; }
ShmOptions streaming_slots() { return {4096, 3, 1, true}; }

// Values in -2..2 that depend on the rank, the element and a salt (the call's number in a sequence): with at
// most 5 ranks every sum, product and average numerator is exact even in bfloat16 and fits in int8.
Buffer make_input(int rank, std::size_t count, DataType dtype, unsigned salt = 0) {
  Buffer buf(count * size_of(dtype));
  for (std::size_t i = 0; i < count; ++i)
    store_value(buf.data(), i, dtype, static_cast<int>((static_cast<std::size_t>(rank) * 7 + i * 3 + salt) % 5) - 2);
  return buf;
}

::testing::AssertionResult same_elements(const Buffer& got, const Buffer& want, DataType dtype) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " bytes, expected " << want.size();
  const std::size_t elem = size_of(dtype);
  for (std::size_t i = 0; i * elem < got.size(); ++i)
    if (std::memcmp(got.data() + i * elem, want.data() + i * elem, elem) != 0)
      return ::testing::AssertionFailure() << "element " << i << " is " << load_value(got.data(), i, dtype)
                                           << ", expected " << load_value(want.data(), i, dtype);
  return ::testing::AssertionSuccess();
}

struct Case {
  Operation operation;
  DataType dtype;
  RedOp op;
  std::size_t count;
  bool in_place;
  int root;
  unsigned salt = 0;

  std::string describe() const {
    return std::string(name(operation)) + " dtype=" + std::string(name(dtype)) + " op=" + std::string(name(op)) +
           " count=" + std::to_string(count) + (in_place ? " in-place" : "") + " root=" + std::to_string(root) +
           " salt=" + std::to_string(salt) + " rank=" + std::to_string(world_rank()) + "/" +
           std::to_string(world_size());
  }
};

bool reduces(Operation operation) {
  return operation == Operation::allreduce || operation == Operation::reduce_scatter ||
         operation == Operation::reduce;
}

Buffer reference_reduction(std::size_t count, DataType dtype, RedOp op, int n, unsigned salt) {
  Buffer result = make_input(0, count, dtype, salt);
  for (int r = 1; r < n; ++r) reduce_into(result.data(), make_input(r, count, dtype, salt).data(), count, dtype, op);
  if (op == RedOp::avg) finish_avg(result.data(), count, dtype, n);
  return result;
}

Buffer expected_result(const Case& c) {
  const int rank = world_rank(), n = world_size();
  const std::size_t bytes = c.count * size_of(c.dtype);
  Buffer want;
  switch (c.operation) {
    case Operation::allreduce: return reference_reduction(c.count, c.dtype, c.op, n, c.salt);
    case Operation::allgather:
      for (int r = 0; r < n; ++r) {
        const Buffer block = make_input(r, c.count, c.dtype, c.salt);
        want.insert(want.end(), block.begin(), block.end());
      }
      return want;
    case Operation::reduce_scatter: {
      const Buffer all = reference_reduction(static_cast<std::size_t>(n) * c.count, c.dtype, c.op, n, c.salt);
      const auto from = all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(rank) * bytes);
      return Buffer(from, from + static_cast<std::ptrdiff_t>(bytes));
    }
    case Operation::broadcast: return make_input(c.root, c.count, c.dtype, c.salt);
    case Operation::reduce: return rank == c.root ? reference_reduction(c.count, c.dtype, c.op, n, c.salt) : Buffer();
    default: return want;
  }
}

// The buffers of one call with this rank's input, placed by the conventions of algorithms.h.
struct Placed {
  Buffer send, recv;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
};

Placed place(const Case& c) {
  const int rank = world_rank(), n = world_size();
  const std::size_t elem = size_of(c.dtype), bytes = c.count * elem;
  const auto whole = static_cast<std::size_t>(n) * c.count;
  Placed p;
  switch (c.operation) {
    case Operation::allreduce:
    case Operation::reduce:
      p.send = make_input(rank, c.count, c.dtype, c.salt);
      p.recv = c.in_place ? Buffer() : Buffer(bytes, kUntouched);
      break;
    case Operation::broadcast:
      p.send = rank == c.root ? make_input(rank, c.count, c.dtype, c.salt) : Buffer(bytes, kUntouched);
      p.recv = c.in_place ? Buffer() : Buffer(bytes, kUntouched);
      break;
    case Operation::allgather:
      p.send = make_input(rank, c.count, c.dtype, c.salt);
      p.recv = Buffer(whole * elem, kUntouched);
      if (c.in_place) {
        if (bytes) std::memcpy(p.recv.data() + static_cast<std::size_t>(rank) * bytes, p.send.data(), bytes);
        p.sendbuf = p.recv.data() + static_cast<std::size_t>(rank) * bytes;
        p.recvbuf = p.recv.data();
        return p;
      }
      break;
    case Operation::reduce_scatter:
      p.send = make_input(rank, whole, c.dtype, c.salt);
      p.recv = c.in_place ? Buffer() : Buffer(bytes, kUntouched);
      if (c.in_place) {
        p.sendbuf = p.send.data();
        p.recvbuf = p.send.data() + static_cast<std::size_t>(rank) * bytes;
        return p;
      }
      break;
    default: break;
  }
  p.sendbuf = p.send.data();
  p.recvbuf = c.in_place ? p.send.data() : p.recv.data();
  return p;
}

// What the call left on this rank, and a check that it left the rest alone: out-of-place inputs, and a
// non-root's output of reduce (its input, in place).
Buffer result_of(const Case& c, const Placed& p) {
  const int rank = world_rank();
  const std::size_t bytes = c.count * size_of(c.dtype);
  if (c.operation == Operation::reduce && rank != c.root) {
    EXPECT_EQ(p.send, make_input(rank, c.count, c.dtype, c.salt)) << "non-root input changed: " << c.describe();
    if (!c.in_place) {
      EXPECT_EQ(p.recv, Buffer(bytes, kUntouched)) << "non-root output written: " << c.describe();
    }
    return {};
  }
  if (!c.in_place && c.operation != Operation::broadcast) {
    const std::size_t inputs = c.operation == Operation::reduce_scatter ? static_cast<std::size_t>(world_size()) : 1;
    EXPECT_EQ(p.send, make_input(rank, inputs * c.count, c.dtype, c.salt)) << "input changed: " << c.describe();
  }
  if (c.operation == Operation::reduce_scatter && c.in_place) {
    const auto from = p.send.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(rank) * bytes);
    return Buffer(from, from + static_cast<std::ptrdiff_t>(bytes));
  }
  return c.in_place && c.operation != Operation::allgather ? p.send : p.recv;
}

Buffer run_library(const Case& c) {
  Context ctx;
  ctx.types = g_types;
  Placed p = place(c);
  switch (c.operation) {
    case Operation::allreduce: allreduce(Algo::library, p.sendbuf, p.recvbuf, c.count, c.dtype, c.op, ctx); break;
    case Operation::allgather: allgather(Algo::library, p.sendbuf, p.recvbuf, c.count, c.dtype, ctx); break;
    case Operation::reduce_scatter:
      reduce_scatter(Algo::library, p.sendbuf, p.recvbuf, c.count, c.dtype, c.op, ctx);
      break;
    case Operation::broadcast: broadcast(Algo::library, p.sendbuf, p.recvbuf, c.count, c.dtype, c.root, ctx); break;
    case Operation::reduce: reduce(Algo::library, p.sendbuf, p.recvbuf, c.count, c.dtype, c.op, c.root, ctx); break;
    default: break;
  }
  return result_of(c, p);
}

Buffer run_shm(ShmNode& node, const Case& c) {
  Placed p = place(c);
  node.run(c.operation, p.sendbuf, p.recvbuf, c.count, c.dtype, c.op, c.root);
  return result_of(c, p);
}

// Every dtype, reduction (where one applies), count, placement and root of one operation.
template <typename Visit>
void for_every_case(Operation operation, const std::vector<std::size_t>& counts, Visit visit) {
  const int n = world_size();
  const std::vector<RedOp> ops = reduces(operation) ? std::vector<RedOp>(kAllRedOps.begin(), kAllRedOps.end())
                                                    : std::vector<RedOp>{RedOp::sum};
  const std::vector<int> roots = operation == Operation::broadcast || operation == Operation::reduce
                                     ? std::vector<int>{0, n - 1}
                                     : std::vector<int>{0};
  for (DataType dtype : kAllDataTypes)
    for (RedOp op : ops)
      for (std::size_t count : counts)
        for (bool in_place : {false, true})
          for (int root : roots) visit(Case{operation, dtype, op, count, in_place, root});
}

// Every case of one operation against the library and the reference.
void check_operation(ShmNode& node, Operation operation, const std::vector<std::size_t>& counts) {
  for_every_case(operation, counts, [&](const Case& c) {
    const Buffer want = expected_result(c);
    EXPECT_TRUE(same_elements(run_library(c), want, c.dtype)) << "library: " << c.describe();
    EXPECT_TRUE(same_elements(run_shm(node, c), want, c.dtype)) << "shm: " << c.describe();
  });
}

// Zero, fewer elements than ranks, a count no rank count divides, and counts of many chunks.
std::vector<std::size_t> test_counts() {
  const auto n = static_cast<std::size_t>(world_size());
  return {0, 1, 2 * n + 1, 1003};
}

class ShmOperation : public ::testing::TestWithParam<Operation> {};

TEST_P(ShmOperation, EqualsTheLibraryOnTinySlots) {
  ShmNode node(MPI_COMM_WORLD, tiny_slots());
  check_operation(node, GetParam(), test_counts());
}

TEST_P(ShmOperation, EqualsTheLibraryStreamingOnAThreeSlotRing) {
  ShmNode node(MPI_COMM_WORLD, streaming_slots());
  check_operation(node, GetParam(), {0, 5, 4099});
}

TEST_P(ShmOperation, EqualsTheLibraryOnDefaultSlotsBeyondTheSegment) {
  // 3 MiB of float: three times one rank's whole ring of default slots.
  ShmNode node(MPI_COMM_WORLD);
  const std::size_t count = (std::size_t{3} << 20) / 4 + 7;
  const int n = world_size();
  for (bool in_place : {false, true}) {
    const Case c{GetParam(), DataType::float32, RedOp::sum, count, in_place, n - 1};
    EXPECT_TRUE(same_elements(run_shm(node, c), expected_result(c), c.dtype)) << c.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(EveryOperation, ShmOperation, ::testing::ValuesIn(kShmOperations),
                         [](const auto& info) { return std::string(name(info.param)); });

// Hundreds of calls back to back, of every operation and of sizes from zero to many chunks in a random
// order (the same on every rank), each with its own inputs: a chunk overwritten before a slow rank read it,
// or read before it was written, shows as a wrong element of the next call or this one.
TEST(Shm, BackToBackCallsOfMixedOperationsAndSizes) {
  for (const ShmOptions& options : {tiny_slots(), streaming_slots()}) {
    ShmNode node(MPI_COMM_WORLD, options);
    std::mt19937 random(12345);  // the same sequence on every rank
    for (unsigned call = 0; call < 300; ++call) {
      const Operation operation = kShmOperations[random() % kShmOperations.size()];
      const DataType dtype = kAllDataTypes[random() % kAllDataTypes.size()];
      const RedOp op = kAllRedOps[random() % kAllRedOps.size()];
      const std::size_t count = random() % 3 == 0 ? random() % 8 : random() % 3000;
      const Case c{operation, dtype, reduces(operation) ? op : RedOp::sum, count, random() % 2 == 0,
                   static_cast<int>(random() % static_cast<unsigned>(world_size())), call};
      EXPECT_TRUE(same_elements(run_shm(node, c), expected_result(c), dtype)) << c.describe();
    }
  }
}

// Several calls in flight on one node, completed in reverse order, then polled with test() only: each waits
// on the slots the earlier ones hold, so waiting on the last must progress the others.
TEST(Shm, CallsInFlightCompleteInAnyOrderOfWaiting) {
  ShmNode node(MPI_COMM_WORLD, tiny_slots());
  std::vector<Case> cases;
  for (unsigned k = 0; k < 6; ++k)
    cases.push_back(Case{kShmOperations[k % kShmOperations.size()], DataType::int32, RedOp::sum, 500 + 37 * k,
                         k % 2 == 1, static_cast<int>(k % static_cast<unsigned>(world_size())), k});
  for (bool wait_in_reverse : {true, false}) {
    std::vector<std::unique_ptr<Placed>> placed;
    std::vector<Work> works;
    for (const Case& c : cases) {
      placed.push_back(std::make_unique<Placed>(place(c)));
      works.push_back(node.start(c.operation, placed.back()->sendbuf, placed.back()->recvbuf, c.count, c.dtype,
                                 c.op, c.root));
    }
    if (wait_in_reverse) {
      for (auto w = works.rbegin(); w != works.rend(); ++w) w->wait();
    } else {
      bool all_done = false;
      while (!all_done) {
        all_done = true;
        for (Work& w : works) all_done = w.test() && all_done;
      }
    }
    for (std::size_t k = 0; k < cases.size(); ++k) {
      EXPECT_TRUE(works[k].done());
      EXPECT_TRUE(same_elements(result_of(cases[k], *placed[k]), expected_result(cases[k]), cases[k].dtype))
          << cases[k].describe();
    }
  }
}

// Operations of many chunks in flight together, all started before any is waited for: the one behind reaches
// its first chunk while the one ahead still has its last to fill, and every rank must still publish its
// counters in chunk order (a counter that went back once hid a chunk others had relied on, and the node hung).
TEST(Shm, ManyChunkOperationsInFlightKeepTheCountersInOrder) {
  ShmNode node(MPI_COMM_WORLD, {4096, 4, 0, false});
  for (unsigned round = 0; round < 20; ++round) {
    std::vector<Case> cases;
    for (unsigned k = 0; k < 4; ++k)
      cases.push_back(Case{k % 2 == 0 ? Operation::reduce_scatter : Operation::allreduce, DataType::float32, RedOp::sum,
                           4096 + 97 * k, false, 0, round * 4 + k});
    std::vector<std::unique_ptr<Placed>> placed;
    std::vector<Work> works;
    for (const Case& c : cases) {
      placed.push_back(std::make_unique<Placed>(place(c)));
      works.push_back(node.start(c.operation, placed.back()->sendbuf, placed.back()->recvbuf, c.count, c.dtype, c.op, c.root));
    }
    for (Work& w : works) w.wait();
    for (std::size_t k = 0; k < cases.size(); ++k)
      EXPECT_TRUE(same_elements(result_of(cases[k], *placed[k]), expected_result(cases[k]), cases[k].dtype))
          << cases[k].describe();
  }
}

TEST(Shm, TrafficCountsTheBytesWrittenForOtherRanks) {
  ShmNode node(MPI_COMM_WORLD, tiny_slots());
  const std::size_t count = 301, bytes = count * 4;
  const auto n = static_cast<std::size_t>(world_size());
  std::vector<std::byte> in(n * bytes), out(n * bytes);
  Work w = node.iallreduce(in.data(), out.data(), count, DataType::float32, RedOp::sum);
  w.wait();
  EXPECT_EQ(w.traffic().intra_bytes, bytes);
  EXPECT_EQ(w.traffic().inter_bytes, 0u);
  w = node.ireduce_scatter(in.data(), out.data(), count, DataType::float32, RedOp::sum);
  w.wait();
  EXPECT_EQ(w.traffic().intra_bytes, (n - 1) * bytes);
  w = node.ibroadcast(in.data(), out.data(), count, DataType::float32, 1);
  w.wait();
  EXPECT_EQ(w.traffic().intra_bytes, world_rank() == 1 ? bytes : 0u);
}

TEST(Shm, UnalignedCopyOutputsStream) {
  // int8 blocks at odd addresses, streamed: the aligned body and the unaligned head and tail of each copy.
  ShmNode node(MPI_COMM_WORLD, streaming_slots());
  const int n = world_size(), rank = world_rank();
  const std::size_t count = 10007;
  Buffer in = make_input(rank, count, DataType::int8), out(static_cast<std::size_t>(n) * count + 3, kUntouched);
  node.allgather(in.data(), out.data() + 3, count, DataType::int8);
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(0, std::memcmp(out.data() + 3 + static_cast<std::size_t>(r) * count,
                             make_input(r, count, DataType::int8).data(), count))
        << "block " << r;
  EXPECT_EQ(out[0], kUntouched);
  Buffer bcast(count + 1, kUntouched);
  node.broadcast(in.data(), bcast.data() + 1, count, DataType::int8, n - 1);
  EXPECT_EQ(0, std::memcmp(bcast.data() + 1, make_input(n - 1, count, DataType::int8).data(), count));
}

TEST(Shm, RejectsBadArguments) {
  ShmNode node(MPI_COMM_WORLD, tiny_slots());
  int x = 0;
  EXPECT_THROW(node.start(Operation::alltoall, &x, &x, 1, DataType::int32), std::invalid_argument);
  EXPECT_THROW(node.start(Operation::sendrecv, &x, &x, 1, DataType::int32), std::invalid_argument);
  EXPECT_THROW(node.broadcast(&x, &x, 1, DataType::int32, world_size()), std::invalid_argument);
  EXPECT_THROW(node.reduce(&x, &x, 1, DataType::int32, RedOp::sum, -1), std::invalid_argument);
  EXPECT_THROW(node.allreduce(nullptr, &x, 1, DataType::int32, RedOp::sum), std::invalid_argument);
  EXPECT_FALSE(ShmNode::supports(Operation::alltoall));
  EXPECT_TRUE(ShmNode::supports(Operation::reduce));
  // Bad options are refused on every rank alike, before any segment is made.
  EXPECT_THROW(ShmNode(MPI_COMM_WORLD, ShmOptions{64, 1, 0, false}), std::invalid_argument);
  EXPECT_THROW(ShmNode(MPI_COMM_WORLD, ShmOptions{100, 2, 0, false}), std::invalid_argument);
}

// The direct path's one-pass reduction against successive reduce_into calls, bit for bit: random values
// (16-bit floats round after every operation), three inputs, outputs streamed, unaligned, and one that is
// an input (in place), with counts around the 64-byte lines it works in.
TEST(ReduceIntoAll, EqualsSuccessiveReduceIntoBitForBit) {
  std::mt19937 random(777);
  std::uniform_real_distribution<double> real(-3, 3);
  for (DataType dtype : kAllDataTypes)
    for (RedOp op : kAllRedOps)
      for (std::size_t count : {0, 1, 63, 64, 1031}) {
        const std::size_t elem = size_of(dtype), bytes = count * elem;
        std::vector<Buffer> inputs(3, Buffer(bytes));
        for (Buffer& in : inputs)
          for (std::size_t i = 0; i < count; ++i) {
            const double v = dtype == DataType::int8 || dtype == DataType::int32 ? std::floor(real(random) * 40) : real(random);
            store_value(in.data(), i, dtype, v);
          }
        Buffer want = inputs[0];
        for (std::size_t r = 1; r < inputs.size(); ++r) reduce_into(want.data(), inputs[r].data(), count, dtype, op);
        if (op == RedOp::avg) finish_avg(want.data(), count, dtype, 3);
        for (bool stream : {false, true}) {
          Buffer aligned(bytes + 64), unaligned(bytes + 64 + elem);
          Buffer in_place = inputs[2];
          std::byte* at_aligned = aligned.data() + (64 - reinterpret_cast<std::uintptr_t>(aligned.data()) % 64) % 64;
          std::byte* at_unaligned = unaligned.data() + elem;
          if (reinterpret_cast<std::uintptr_t>(at_unaligned) % 16 == 0) at_unaligned += elem;
          const std::vector<const std::byte*> from{inputs[0].data(), inputs[1].data(), in_place.data()};
          const std::vector<std::byte*> to{at_aligned, at_unaligned, in_place.data()};
          reduce_into_all(to, from, count, dtype, op, op == RedOp::avg ? 3 : 0, stream);
          const std::string what = std::string(name(dtype)) + " " + std::string(name(op)) + " count " +
                                   std::to_string(count) + (stream ? " streamed" : "");
          EXPECT_TRUE(same_elements(Buffer(at_aligned, at_aligned + bytes), want, dtype)) << "aligned " << what;
          EXPECT_TRUE(same_elements(Buffer(at_unaligned, at_unaligned + bytes), want, dtype)) << "unaligned " << what;
          EXPECT_TRUE(same_elements(in_place, want, dtype)) << "in place " << what;
        }
      }
}

// Registered buffers: the direct path.

// A call of place() moved into registered memory: the buffers copied to rank-dependent offsets (multiples of
// 8 bytes, so neither page- nor line-aligned, and different on every rank) within `region`, the call's
// pointers translated; copy_back() returns the copies' contents to `p` for result_of().
struct Registered {
  Placed p;
  std::byte* send_copy = nullptr;
  std::byte* recv_copy = nullptr;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;

  void copy_back() {
    if (!p.send.empty()) std::memcpy(p.send.data(), send_copy, p.send.size());
    if (!p.recv.empty()) std::memcpy(p.recv.data(), recv_copy, p.recv.size());
  }
};

std::byte* translated(const void* at, const Buffer& from, std::byte* to) {
  const auto address = reinterpret_cast<std::uintptr_t>(at), start = reinterpret_cast<std::uintptr_t>(from.data());
  return at && address >= start && address < start + from.size() ? to + (address - start) : nullptr;
}

Registered place_registered(const Case& c, std::byte* region, std::size_t region_bytes) {
  const auto rank = static_cast<std::size_t>(world_rank());
  Registered r{place(c)};
  r.send_copy = region + 8 * (1 + 3 * rank);
  r.recv_copy = r.send_copy + (r.p.send.size() + 7) / 8 * 8 + 8 * (5 - rank % 3);
  if (r.recv_copy + r.p.recv.size() > region + region_bytes) throw std::logic_error("region too small for the case");
  if (!r.p.send.empty()) std::memcpy(r.send_copy, r.p.send.data(), r.p.send.size());
  if (!r.p.recv.empty()) std::memcpy(r.recv_copy, r.p.recv.data(), r.p.recv.size());
  auto copy_of = [&](const void* at) {
    std::byte* there = translated(at, r.p.send, r.send_copy);
    return there ? there : translated(at, r.p.recv, r.recv_copy);
  };
  r.sendbuf = copy_of(r.p.sendbuf);
  r.recvbuf = copy_of(r.p.recvbuf);
  return r;
}

// Runs c on registered memory, blocking, and checks that it took the direct path (unless its count is 0).
Buffer run_registered(ShmNode& node, const Case& c, std::byte* region, std::size_t region_bytes) {
  Registered r = place_registered(c, region, region_bytes);
  const std::uint64_t before = node.direct_operations();
  node.run(c.operation, r.sendbuf, r.recvbuf, c.count, c.dtype, c.op, c.root);
  EXPECT_EQ(node.direct_operations(), before + (c.count > 0 ? 1 : 0)) << "direct path: " << c.describe();
  r.copy_back();
  return result_of(c, r.p);
}

constexpr std::size_t kRegionBytes = std::size_t{2} << 20;

class ShmRegistered : public ::testing::TestWithParam<Operation> {};

// Every dtype, reduction, count (zero; fewer than the ranks; not divisible by them; several pieces of the
// direct path), placement and root, against the library and the reference.
TEST_P(ShmRegistered, EqualsTheLibrary) {
  ShmNode node(MPI_COMM_WORLD, tiny_slots());
  ShmBuffer memory = node.allocate(kRegionBytes);
  std::vector<std::size_t> counts = test_counts();
  counts.push_back(20011);
  for_every_case(GetParam(), counts, [&](const Case& c) {
    const Buffer want = expected_result(c);
    EXPECT_TRUE(same_elements(run_library(c), want, c.dtype)) << "library: " << c.describe();
    EXPECT_TRUE(same_elements(run_registered(node, c, memory.data(), memory.size()), want, c.dtype))
        << "registered: " << c.describe();
  });
}

INSTANTIATE_TEST_SUITE_P(EveryOperation, ShmRegistered, ::testing::ValuesIn(kShmOperations),
                         [](const auto& info) { return std::string(name(info.param)); });

TEST(ShmBuffers, AreRegisteredWhileTheyLive) {
  ShmNode node(MPI_COMM_WORLD, tiny_slots());
  const std::size_t bytes = 1000 * static_cast<std::size_t>(world_rank() + 1) + 3;  // differs from rank to rank
  ShmBuffer buffer = node.allocate(bytes);
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(buffer.size(), bytes);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % 4096, 0u);
  EXPECT_TRUE(node.registered(buffer.data(), bytes));
  EXPECT_TRUE(node.registered(buffer.data() + 1, bytes - 1));
  EXPECT_FALSE(node.registered(buffer.data(), bytes + 1));
  EXPECT_FALSE(node.registered(buffer.data() + bytes, 1));
  int x = 0;
  EXPECT_FALSE(node.registered(&x, sizeof x));
  ShmBuffer moved = std::move(buffer);
  EXPECT_EQ(buffer.data(), nullptr);
  EXPECT_TRUE(node.registered(moved.data(), bytes));
  const std::byte* at = moved.data();
  moved = ShmBuffer();
  EXPECT_FALSE(node.registered(at, 1));
}

// Buffers that fill their allocations exactly, on the direct path; sizes differ from rank to rank.
TEST(ShmBuffers, WholeAllocationsTakeTheDirectPath) {
  ShmNode node(MPI_COMM_WORLD, tiny_slots());
  const int n = world_size(), rank = world_rank();
  const std::size_t count = 777;
  ShmBuffer in = node.allocate(count * 4), out = node.allocate(count * 4 * static_cast<std::size_t>(n));
  const Buffer input = make_input(rank, count, DataType::int32);
  std::memcpy(in.data(), input.data(), input.size());
  node.allgather(in.data(), out.data(), count, DataType::int32);
  EXPECT_EQ(node.direct_operations(), 1u);
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(0, std::memcmp(out.data() + static_cast<std::size_t>(r) * count * 4,
                             make_input(r, count, DataType::int32).data(), count * 4))
        << "block " << r;
  // One byte beyond the allocation on one rank only would break the contract; beyond it on every rank, the
  // slot path takes the call.
  node.allreduce(in.data(), out.data() + out.size() - count * 4 + 4, count, DataType::int32, RedOp::sum);
  EXPECT_EQ(node.direct_operations(), 1u);
}

// Freeing registered memory completes the operations in flight first (they read it here and on the peers),
// and allocating does too, so a rank that waits for them before allocating meets one that waits after.
TEST(ShmBuffers, AllocatingAndFreeingCompleteTheOperationsInFlight) {
  ShmNode node(MPI_COMM_WORLD, tiny_slots());
  const int n = world_size(), rank = world_rank();
  const std::size_t count = 4099;
  ShmBuffer out = node.allocate(count * 4);
  auto check = [&](unsigned salt) {
    return same_elements(Buffer(out.data(), out.data() + count * 4),
                         reference_reduction(count, DataType::int32, RedOp::sum, n, salt), DataType::int32);
  };
  for (unsigned round = 0; round < 5; ++round) {
    ShmBuffer in = node.allocate(count * 4);
    Buffer input = make_input(rank, count, DataType::int32, round);
    std::memcpy(in.data(), input.data(), input.size());
    Work w = node.iallreduce(in.data(), out.data(), count, DataType::int32, RedOp::sum);
    if (rank == 0) w.wait();
    ShmBuffer more = node.allocate(64);
    EXPECT_TRUE(w.test());
    EXPECT_TRUE(check(round)) << "round " << round;
    input = make_input(rank, count, DataType::int32, round + 100);
    std::memcpy(in.data(), input.data(), input.size());
    w = node.iallreduce(in.data(), out.data(), count, DataType::int32, RedOp::sum);
    in = ShmBuffer();
    EXPECT_TRUE(w.test());
    EXPECT_TRUE(check(round + 100)) << "round " << round;
  }
  EXPECT_EQ(node.direct_operations(), 10u);
}

// Hundreds of calls, each at random (the same sequence on every rank) on registered memory or the caller's
// own, blocking or several started before any is waited for (in an order of waiting each rank draws itself):
// the two paths interleave, and a direct call must wait for the slot-path calls ahead of it on this rank
// while its peers may still be finishing them.
TEST(ShmRegistered, MixedWithTheSlotPathBackToBackAndInFlight) {
  for (const ShmOptions& options : {tiny_slots(), streaming_slots()}) {
    ShmNode node(MPI_COMM_WORLD, options);
    constexpr std::size_t kInFlight = 4;
    ShmBuffer memory = node.allocate(kInFlight * kRegionBytes / 8);
    std::mt19937 random(4321);                                             // the same on every rank
    std::mt19937 waits(static_cast<unsigned>(world_rank()) * 7919 + 1);  // this rank's own
    unsigned salt = 0;
    for (unsigned batch = 0; batch < 120; ++batch) {
      const std::size_t calls = 1 + random() % kInFlight;
      std::vector<Case> cases;
      std::vector<bool> on_registered;
      std::vector<std::unique_ptr<Registered>> placed;
      std::vector<Work> works;
      for (std::size_t k = 0; k < calls; ++k) {
        const Operation operation = kShmOperations[random() % kShmOperations.size()];
        const DataType dtype = kAllDataTypes[random() % kAllDataTypes.size()];
        const RedOp op = kAllRedOps[random() % kAllRedOps.size()];
        const std::size_t count = random() % 3 == 0 ? random() % 8 : random() % 3000;
        cases.push_back(Case{operation, dtype, reduces(operation) ? op : RedOp::sum, count, random() % 2 == 0,
                             static_cast<int>(random() % static_cast<unsigned>(world_size())), ++salt});
        on_registered.push_back(random() % 2 == 0);
        std::byte* region = memory.data() + k * (memory.size() / kInFlight);
        placed.push_back(std::make_unique<Registered>(place_registered(cases.back(), region, memory.size() / kInFlight)));
        Registered& r = *placed.back();
        const void* send = on_registered.back() ? r.sendbuf : r.p.sendbuf;
        void* recv = on_registered.back() ? r.recvbuf : r.p.recvbuf;
        works.push_back(node.start(operation, send, recv, count, dtype, cases.back().op, cases.back().root));
      }
      std::vector<std::size_t> order(calls);
      for (std::size_t k = 0; k < calls; ++k) order[k] = k;
      std::shuffle(order.begin(), order.end(), waits);
      for (std::size_t k : order) works[k].wait();
      for (std::size_t k = 0; k < calls; ++k) {
        if (on_registered[k]) placed[k]->copy_back();
        EXPECT_TRUE(same_elements(result_of(cases[k], placed[k]->p), expected_result(cases[k]), cases[k].dtype))
            << (on_registered[k] ? "registered: " : "own buffers: ") << cases[k].describe();
      }
    }
  }
}

// A direct call whose input is the output of a slot-path call still in flight: it waits for that call, so it
// reads the finished result.
TEST(ShmRegistered, ReadsTheOutputOfAnEarlierCallInFlight) {
  ShmNode node(MPI_COMM_WORLD, tiny_slots());
  const int n = world_size();
  const std::size_t count = 5000;
  ShmBuffer middle = node.allocate(count * 4), out = node.allocate(count * 4);
  for (unsigned round = 0; round < 10; ++round) {
    const Buffer in = make_input(world_rank(), count, DataType::int32, round);
    Work first = node.iallreduce(in.data(), middle.data(), count, DataType::int32, RedOp::sum);  // own input
    Work second = node.iallreduce(middle.data(), out.data(), count, DataType::int32, RedOp::sum);
    second.wait();
    EXPECT_TRUE(first.test());  // complete already: test() does not wait
    Buffer want = reference_reduction(count, DataType::int32, RedOp::sum, n, round);
    for (std::size_t i = 0; i < count; ++i) store_value(want.data(), i, DataType::int32, n * load_value(want.data(), i, DataType::int32));
    EXPECT_TRUE(same_elements(Buffer(out.data(), out.data() + count * 4), want, DataType::int32)) << "round " << round;
  }
  EXPECT_EQ(node.direct_operations(), 10u);
}

// A reservation started on registered buffers after a later call was started: the later one waits for it.
TEST(ShmRegistered, RunsOnAReservationInItsPlace) {
  ShmNode node(MPI_COMM_WORLD, tiny_slots());
  const int n = world_size(), rank = world_rank();
  const std::size_t count = 3001;
  ShmBuffer in = node.allocate(count * 8), out = node.allocate(count * 8 * static_cast<std::size_t>(n));
  ShmNode::Reservation early = node.reserve();
  const Case later{Operation::allreduce, DataType::float64, RedOp::max, 1234, false, 0, 9};
  Placed p = place(later);
  Work second = node.start(later.operation, p.sendbuf, p.recvbuf, later.count, later.dtype, later.op);
  const Buffer input = make_input(rank, count, DataType::float64, 3);
  std::memcpy(in.data(), input.data(), input.size());
  Work first = node.start(std::move(early), Operation::allgather, in.data(), out.data(), count, DataType::float64);
  second.wait();
  EXPECT_TRUE(first.test());
  EXPECT_EQ(node.direct_operations(), 1u);
  EXPECT_TRUE(same_elements(result_of(later, p), expected_result(later), later.dtype));
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(0, std::memcmp(out.data() + static_cast<std::size_t>(r) * count * 8,
                             make_input(r, count, DataType::float64, 3).data(), count * 8))
        << "block " << r;
}

// On the direct path a rank counts the bytes it reads from and writes into other ranks' buffers: an allreduce
// reads its 1/n from n - 1 inputs and writes it to n - 1 outputs; an allgather writes its block to n - 1 outputs.
TEST(ShmRegistered, TrafficCountsTheBytesMovedBetweenRanks) {
  ShmNode node(MPI_COMM_WORLD, tiny_slots());
  const std::size_t count = 301, bytes = count * 4;
  const auto n = static_cast<std::size_t>(world_size());
  ShmBuffer in = node.allocate(n * bytes), out = node.allocate(n * bytes);
  Work w = node.iallreduce(in.data(), out.data(), count, DataType::float32, RedOp::sum);
  w.wait();
  unsigned long long moved = w.traffic().intra_bytes, total = 0;
  STRATA_MPI_CHECK(MPI_Allreduce(&moved, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
  EXPECT_EQ(total, 2 * (n - 1) * bytes);
  EXPECT_EQ(w.traffic().inter_bytes, 0u);
  w = node.iallgather(in.data(), out.data(), count, DataType::float32);
  w.wait();
  EXPECT_EQ(w.traffic().intra_bytes, (n - 1) * bytes);
  w = node.ireduce_scatter(in.data(), out.data(), count, DataType::float32, RedOp::sum);
  w.wait();
  EXPECT_EQ(w.traffic().intra_bytes, (n - 1) * bytes);
  EXPECT_EQ(node.direct_operations(), 3u);
}

// Failures of the current test on each rank, gathered to rank 0 at the end of the test, so that only rank 0
// prints yet a failure on any rank is shown with its message.
class GatherFailures : public ::testing::EmptyTestEventListener {
 public:
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed())
      failures_ += std::string(result.file_name() ? result.file_name() : "?") + ":" +
                   std::to_string(result.line_number()) + ": " + result.message() + "\n";
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const std::vector<std::string> all = gather_strings(MPI_COMM_WORLD, failures_);
    failures_.clear();
    for (std::size_t r = 1; r < all.size(); ++r)
      if (!all[r].empty())
        std::cout << "[  rank " << r << " ] FAILED " << info.test_suite_name() << "." << info.name() << ":\n"
                  << all[r] << std::flush;
  }

 private:
  std::string failures_;
};

}  // namespace
}  // namespace strata::coll

int main(int argc, char** argv) {
  try {
    STRATA_MPI_CHECK(MPI_Init(&argc, &argv));
    STRATA_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    ::testing::InitGoogleTest(&argc, argv);
    // An exception on one rank must reach the catch below (MPI_Abort), not leave the others waiting.
    GTEST_FLAG_SET(catch_exceptions, false);
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (strata::world_rank() != 0) delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new strata::coll::GatherFailures);
    int failed = 0;
    {
      const strata::coll::MpiTypes types;
      strata::coll::g_types = &types;
      failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
      strata::coll::g_types = nullptr;
    }
    int any_failed = 0;
    STRATA_MPI_CHECK(MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    STRATA_MPI_CHECK(MPI_Finalize());
    return any_failed;
  } catch (const std::exception& e) {
    std::cerr << "test_shm_mpi: rank " << strata::world_rank() << ": " << e.what() << "; aborting the job\n"
              << std::flush;
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
