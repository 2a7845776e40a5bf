// Tests of Strata's collectives, run under mpirun with 2 to 5 ranks (tests/unit/run_collectives_mpi.sh):
// every own algorithm must give exactly what the MPI library gives, and what a local reference computes,
// for every operation, type, reduction, awkward count and in/out-of-place call; and the layouts, grids and
// byte counts must be what they claim. Inputs are small integers, so sums and products are exact in every
// type whatever the order of reduction, and results can be compared bit for bit.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/mpi_error.h"
#include "bench/harness/check.h"
#include "collectives/algorithms.h"
#include "collectives/layout.h"
#include "collectives/types.h"

namespace strata::coll {
namespace {

const MpiTypes* g_types = nullptr;  // owned by main, which frees it before MPI_Finalize

using Buffer = std::vector<std::byte>;
constexpr std::byte kUntouched{0x5a};  // fills output buffers, to see what was (not) written

using strata::world_rank;
using strata::world_size;

std::vector<std::string> gather_to_rank0(const std::string& mine) { return gather_strings(MPI_COMM_WORLD, mine); }

int rank_in(MPI_Comm comm) {
  int rank = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  return rank;
}

int size_of_comm(MPI_Comm comm) {
  int size = 0;
  STRATA_MPI_CHECK(MPI_Comm_size(comm, &size));
  return size;
}

std::vector<int> divisors_of(int n) {
  std::vector<int> divisors;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) divisors.push_back(d);
  return divisors;
}

std::vector<int> members(MPI_Comm comm) { return world_ranks_of(comm); }

// Values in -2..2: with at most 5 ranks every sum, product and average numerator is exact even in bfloat16
// and fits in int8.
Buffer make_input(int rank, std::size_t count, DataType dtype) {
  Buffer buf(count * size_of(dtype));
  for (std::size_t i = 0; i < count; ++i) {
    const auto in_0_to_4 = static_cast<int>((static_cast<std::size_t>(rank) * 7 + i * 3) % 5);
    store_value(buf.data(), i, dtype, in_0_to_4 - 2);
  }
  return buf;
}

Buffer untouched(std::size_t bytes) { return Buffer(bytes, kUntouched); }

Buffer slice(const Buffer& buf, std::size_t offset, std::size_t bytes) {
  return Buffer(buf.begin() + static_cast<std::ptrdiff_t>(offset),
                buf.begin() + static_cast<std::ptrdiff_t>(offset + bytes));
}

Buffer reference_reduction(std::size_t count, DataType dtype, RedOp op, int n) {
  Buffer result = make_input(0, count, dtype);
  for (int r = 1; r < n; ++r) reduce_into(result.data(), make_input(r, count, dtype).data(), count, dtype, op);
  if (op == RedOp::avg) finish_avg(result.data(), count, dtype, n);
  return result;
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
  Algo algo;
  DataType dtype;
  RedOp op;
  std::size_t count;
  bool in_place;
  int root;
  int rank;  // in the communicator the case runs on
  int n;

  std::string describe() const {
    return std::string(name(operation)) + " algo=" + std::string(name(algo)) + " dtype=" + std::string(name(dtype)) +
           " op=" + std::string(name(op)) + " count=" + std::to_string(count) + (in_place ? " in-place" : "") +
           " root=" + std::to_string(root) + " rank=" + std::to_string(rank) + "/" + std::to_string(n);
  }
};

// Runs one case with this rank's input and returns what the operation leaves on this rank (nothing for
// reduce on a non-root). Also checks that out-of-place calls leave the input alone.
Buffer run_case(const Case& c, const Context& ctx) {
  const int rank = c.rank;
  const int n = c.n;
  const std::size_t elem = size_of(c.dtype);
  const std::size_t bytes = c.count * elem;
  const auto whole = static_cast<std::size_t>(n) * c.count;
  switch (c.operation) {
    case Operation::allreduce: {
      Buffer in = make_input(rank, c.count, c.dtype);
      if (c.in_place) {
        allreduce(c.algo, in.data(), in.data(), c.count, c.dtype, c.op, ctx);
        return in;
      }
      Buffer out = untouched(bytes);
      allreduce(c.algo, in.data(), out.data(), c.count, c.dtype, c.op, ctx);
      EXPECT_EQ(in, make_input(rank, c.count, c.dtype)) << "input changed: " << c.describe();
      return out;
    }
    case Operation::allgather: {
      Buffer in = make_input(rank, c.count, c.dtype);
      Buffer out = untouched(whole * elem);
      std::byte* my_block = out.data() + static_cast<std::size_t>(rank) * bytes;
      if (c.in_place) std::copy(in.begin(), in.end(), my_block);
      allgather(c.algo, c.in_place ? my_block : in.data(), out.data(), c.count, c.dtype, ctx);
      return out;
    }
    case Operation::reduce_scatter: {
      Buffer in = make_input(rank, whole, c.dtype);
      const std::size_t my_offset = static_cast<std::size_t>(rank) * bytes;
      if (c.in_place) {
        reduce_scatter(c.algo, in.data(), in.data() + my_offset, c.count, c.dtype, c.op, ctx);
        return slice(in, my_offset, bytes);
      }
      Buffer out = untouched(bytes);
      reduce_scatter(c.algo, in.data(), out.data(), c.count, c.dtype, c.op, ctx);
      EXPECT_EQ(in, make_input(rank, whole, c.dtype)) << "input changed: " << c.describe();
      return out;
    }
    case Operation::alltoall: {
      Buffer in = make_input(rank, whole, c.dtype);
      if (c.in_place) {
        alltoall(c.algo, in.data(), in.data(), c.count, c.dtype, ctx);
        return in;
      }
      Buffer out = untouched(whole * elem);
      alltoall(c.algo, in.data(), out.data(), c.count, c.dtype, ctx);
      return out;
    }
    case Operation::broadcast: {
      Buffer in = rank == c.root ? make_input(rank, c.count, c.dtype) : untouched(bytes);
      if (c.in_place) {
        broadcast(c.algo, in.data(), in.data(), c.count, c.dtype, c.root, ctx);
        return in;
      }
      Buffer out = untouched(bytes);
      broadcast(c.algo, in.data(), out.data(), c.count, c.dtype, c.root, ctx);
      return out;
    }
    case Operation::reduce: {
      Buffer in = make_input(rank, c.count, c.dtype);
      if (c.in_place) {
        reduce(c.algo, in.data(), in.data(), c.count, c.dtype, c.op, c.root, ctx);
        if (rank != c.root) {
          EXPECT_EQ(in, make_input(rank, c.count, c.dtype)) << "non-root input changed: " << c.describe();
        }
        return rank == c.root ? in : Buffer();
      }
      Buffer out = untouched(bytes);
      reduce(c.algo, in.data(), out.data(), c.count, c.dtype, c.op, c.root, ctx);
      if (rank != c.root) {
        EXPECT_EQ(out, untouched(bytes)) << "non-root output written: " << c.describe();
      }
      return rank == c.root ? out : Buffer();
    }
    case Operation::sendrecv: {
      Buffer in = make_input(rank, c.count, c.dtype);
      if (c.in_place) {
        sendrecv(c.algo, in.data(), in.data(), c.count, c.dtype, ctx);
        return in;
      }
      Buffer out = untouched(bytes);
      sendrecv(c.algo, in.data(), out.data(), c.count, c.dtype, ctx);
      return out;
    }
  }
  return {};
}

Buffer expected_result(const Case& c) {
  const int rank = c.rank;
  const int n = c.n;
  const std::size_t bytes = c.count * size_of(c.dtype);
  const auto whole = static_cast<std::size_t>(n) * c.count;
  Buffer want;
  switch (c.operation) {
    case Operation::allreduce: return reference_reduction(c.count, c.dtype, c.op, n);
    case Operation::allgather:
      for (int r = 0; r < n; ++r) {
        const Buffer block = make_input(r, c.count, c.dtype);
        want.insert(want.end(), block.begin(), block.end());
      }
      return want;
    case Operation::reduce_scatter:
      return slice(reference_reduction(whole, c.dtype, c.op, n), static_cast<std::size_t>(rank) * bytes, bytes);
    case Operation::alltoall:
      for (int r = 0; r < n; ++r) {
        const Buffer block = slice(make_input(r, whole, c.dtype), static_cast<std::size_t>(rank) * bytes, bytes);
        want.insert(want.end(), block.begin(), block.end());
      }
      return want;
    case Operation::broadcast: return make_input(c.root, c.count, c.dtype);
    case Operation::reduce: return rank == c.root ? reference_reduction(c.count, c.dtype, c.op, n) : Buffer();
    case Operation::sendrecv: return make_input((rank + n - 1) % n, c.count, c.dtype);
  }
  return want;
}

bool reduces(Operation operation) {
  return operation == Operation::allreduce || operation == Operation::reduce_scatter ||
         operation == Operation::reduce;
}
bool has_root(Operation operation) { return operation == Operation::broadcast || operation == Operation::reduce; }

// Zero, fewer elements than ranks, a count no rank count divides evenly, and one spanning many segments.
std::vector<std::size_t> test_counts(int n) {
  return {0, 1, 2 * static_cast<std::size_t>(n) + 1, 1003};
}

Context small_segment_context(Context ctx) {
  ctx.segment_bytes = 96;  // many pipeline segments even for small test buffers
  return ctx;
}

Context plain_world_context() {
  Context ctx;
  ctx.types = g_types;
  return small_segment_context(ctx);
}

// Every case of one operation for the given algorithms, each against the library and the reference.
void check_operation(Operation operation, const std::vector<Algo>& algos, const Context& ctx) {
  const int rank = rank_in(ctx.comm);
  const int n = size_of_comm(ctx.comm);
  std::vector<int> roots{0};
  if (has_root(operation) && n > 1) roots.push_back(n - 1);
  const std::vector<RedOp> ops = reduces(operation) ? std::vector<RedOp>(kAllRedOps.begin(), kAllRedOps.end())
                                                    : std::vector<RedOp>{RedOp::sum};
  for (DataType dtype : kAllDataTypes)
    for (RedOp op : ops)
      for (std::size_t count : test_counts(n))
        for (bool in_place : {false, true})
          for (int root : roots) {
            Case c{operation, Algo::library, dtype, op, count, in_place, root, rank, n};
            const Buffer want = expected_result(c);
            EXPECT_TRUE(same_elements(run_case(c, ctx), want, dtype)) << c.describe();
            for (Algo algo : algos) {
              c.algo = algo;
              EXPECT_TRUE(same_elements(run_case(c, ctx), want, dtype)) << c.describe();
            }
          }
}

std::vector<Algo> flat_algos(Operation operation) {
  std::vector<Algo> algos;
  for (Algo algo : {Algo::ring, Algo::recursive_doubling})
    if (is_supported(operation, algo)) algos.push_back(algo);
  return algos;
}

// ---- types ----------------------------------------------------------------------------------------------

TEST(Types, NamesFollowNcclTests) {
  const std::vector<std::string_view> names{"int8", "int32", "float", "double", "half", "bfloat16"};
  const std::vector<std::size_t> sizes{1, 4, 4, 8, 2, 2};
  for (std::size_t i = 0; i < kAllDataTypes.size(); ++i) {
    EXPECT_EQ(name(kAllDataTypes[i]), names[i]);
    EXPECT_EQ(size_of(kAllDataTypes[i]), sizes[i]);
    EXPECT_EQ(parse_datatype(names[i]), kAllDataTypes[i]);
  }
  for (RedOp op : kAllRedOps) EXPECT_EQ(parse_redop(name(op)), op);
  EXPECT_EQ(name(RedOp::avg), "avg");
  EXPECT_EQ(parse_datatype("float32"), std::nullopt);
  EXPECT_EQ(parse_datatype(""), std::nullopt);
  EXPECT_EQ(parse_redop("mean"), std::nullopt);
}

TEST(Types, HalfRoundsToNearestEven) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);  // largest half
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(float_to_half(2049.0f), float_to_half(2048.0f));  // tie, to the even mantissa
  EXPECT_EQ(float_to_half(2051.0f), float_to_half(2052.0f));  // tie, to the even mantissa
  EXPECT_EQ(float_to_half(0x1p-24f), 0x0001);                 // smallest subnormal
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);                 // tie, to even (zero)
  EXPECT_EQ(float_to_half(0x3p-25f), 0x0002);                 // tie, to even
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::quiet_NaN()) & 0x7c00, 0x7c00);
  EXPECT_NE(float_to_half(std::numeric_limits<float>::quiet_NaN()) & 0x03ff, 0);
}

TEST(Types, SixteenBitFloatsRoundTripEveryValue) {
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0) continue;  // NaN payloads need not survive
    ASSERT_EQ(float_to_half(half_to_float(h)), h) << "half bits " << bits;
    if ((h & 0x7f80) == 0x7f80 && (h & 0x007f) != 0) continue;
    ASSERT_EQ(float_to_bfloat16(bfloat16_to_float(h)), h) << "bfloat16 bits " << bits;
  }
  EXPECT_EQ(half_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
}

TEST(Types, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16(1.0f + 0x1p-8f), 0x3f80);        // tie, to even
  EXPECT_EQ(float_to_bfloat16(1.0f + 0x3p-8f), 0x3f82);        // tie, to even
  EXPECT_EQ(float_to_bfloat16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to infinity
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Types, ReduceIntoEveryTypeAndOp) {
  const std::vector<double> a{3, -2, 5, 0};
  const std::vector<double> b{-1, 4, 5, 2};
  const std::vector<std::pair<RedOp, std::vector<double>>> expected{
      {RedOp::sum, {2, 2, 10, 2}},  {RedOp::avg, {2, 2, 10, 2}}, {RedOp::prod, {-3, -8, 25, 0}},
      {RedOp::min, {-1, -2, 5, 0}}, {RedOp::max, {3, 4, 5, 2}}};
  for (DataType dtype : kAllDataTypes)
    for (const auto& [op, want] : expected) {
      Buffer dst(a.size() * size_of(dtype));
      Buffer src(dst.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        store_value(dst.data(), i, dtype, a[i]);
        store_value(src.data(), i, dtype, b[i]);
      }
      reduce_into(dst.data(), src.data(), a.size(), dtype, op);
      for (std::size_t i = 0; i < a.size(); ++i)
        EXPECT_EQ(load_value(dst.data(), i, dtype), want[i]) << name(dtype) << " " << name(op) << " element " << i;
    }
}

TEST(Types, IntegerSumsWrapAndAveragesTruncate) {
  std::int8_t small[2] = {100, -128};
  const std::int8_t small_add[2] = {100, -1};
  reduce_into(small, small_add, 2, DataType::int8, RedOp::sum);
  EXPECT_EQ(small[0], -56);
  EXPECT_EQ(small[1], 127);
  std::int32_t big = std::numeric_limits<std::int32_t>::max();
  const std::int32_t one = 1;
  reduce_into(&big, &one, 1, DataType::int32, RedOp::sum);
  EXPECT_EQ(big, std::numeric_limits<std::int32_t>::min());

  std::int32_t values[3] = {-7, 7, 9};
  finish_avg(values, 3, DataType::int32, 2);
  EXPECT_EQ(values[0], -3);
  EXPECT_EQ(values[1], 3);
  EXPECT_EQ(values[2], 4);
  std::int8_t tiny = -100;
  finish_avg(&tiny, 1, DataType::int8, 200);  // the divisor does not fit in int8
  EXPECT_EQ(tiny, 0);
  std::uint16_t half = float_to_half(3.0f);
  finish_avg(&half, 1, DataType::float16, 2);
  EXPECT_EQ(half_to_float(half), 1.5f);
}

TEST(Types, MpiDatatypesHaveTheElementSize) {
  for (DataType dtype : kAllDataTypes) {
    int size = 0;
    STRATA_MPI_CHECK(MPI_Type_size(g_types->datatype(dtype), &size));
    EXPECT_EQ(static_cast<std::size_t>(size), size_of(dtype)) << name(dtype);
    for (RedOp op : kAllRedOps) EXPECT_NE(g_types->op(dtype, op), MPI_OP_NULL);
  }
}

// ---- algorithms -----------------------------------------------------------------------------------------

TEST(Algorithms, NamesAndSupport) {
  for (Algo algo : kAllAlgos) EXPECT_EQ(parse_algo(name(algo)), algo);
  for (Operation operation : kAllOperations) {
    EXPECT_EQ(parse_operation(name(operation)), operation);
    EXPECT_TRUE(is_supported(operation, Algo::library));
    EXPECT_TRUE(is_supported(operation, Algo::ring));
  }
  EXPECT_EQ(parse_algo("tree"), std::nullopt);
  EXPECT_FALSE(is_supported(Operation::alltoall, Algo::recursive_doubling));
  EXPECT_FALSE(is_supported(Operation::broadcast, Algo::hierarchical));
  EXPECT_TRUE(is_supported(Operation::reduce_scatter, Algo::hierarchical));
  const Context ctx = plain_world_context();
  int value = 0;
  EXPECT_THROW(alltoall(Algo::hierarchical, &value, &value, 1, DataType::int32, ctx), std::invalid_argument);
  EXPECT_THROW(broadcast(Algo::ring, &value, &value, 1, DataType::int32, world_size(), ctx), std::invalid_argument);
}

TEST(Algorithms, AllreduceMatchesLibrary) {
  check_operation(Operation::allreduce, flat_algos(Operation::allreduce), plain_world_context());
}
TEST(Algorithms, AllgatherMatchesLibrary) {
  check_operation(Operation::allgather, flat_algos(Operation::allgather), plain_world_context());
}
TEST(Algorithms, ReduceScatterMatchesLibrary) {
  check_operation(Operation::reduce_scatter, flat_algos(Operation::reduce_scatter), plain_world_context());
}
TEST(Algorithms, AlltoallMatchesLibrary) {
  check_operation(Operation::alltoall, flat_algos(Operation::alltoall), plain_world_context());
}
TEST(Algorithms, BroadcastMatchesLibrary) {
  check_operation(Operation::broadcast, flat_algos(Operation::broadcast), plain_world_context());
}
TEST(Algorithms, ReduceMatchesLibrary) {
  check_operation(Operation::reduce, flat_algos(Operation::reduce), plain_world_context());
}
TEST(Algorithms, SendrecvMatchesLibrary) {
  check_operation(Operation::sendrecv, flat_algos(Operation::sendrecv), plain_world_context());
}

// Device buffers: the library path's copies between the caller's buffers go through Context::device_copy (a
// host memmove on device pointers would fault), and the paths that need host memory are refused.
std::size_t device_copies = 0;
void counting_copy(void* dst, const void* src, std::size_t bytes) {
  ++device_copies;
  std::memmove(dst, src, bytes);
}

TEST(Algorithms, DeviceBuffersCopyThroughTheRuntimeHook) {
  Context ctx = plain_world_context();
  ctx.device_copy = &counting_copy;
  const int rank = world_rank(), n = world_size();
  const std::size_t count = 5;

  // Broadcast out of place: the root's copy of its input into its output is the hook's.
  device_copies = 0;
  std::vector<int32_t> send(count), recv(count, -1);
  for (std::size_t i = 0; i < count; ++i) send[i] = static_cast<int32_t>(100 + i);
  broadcast(Algo::library, send.data(), recv.data(), count, DataType::int32, 0, ctx);
  for (std::size_t i = 0; i < count; ++i) EXPECT_EQ(recv[i], static_cast<int32_t>(100 + i));
  EXPECT_EQ(device_copies, rank == 0 ? 1u : 0u);

  // Reduce-scatter in place: MPI leaves the block at the start of the buffer, the hook moves it to rank's.
  device_copies = 0;
  std::vector<int32_t> buffer(count * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<int32_t>(i) + rank;
  int32_t* mine = buffer.data() + static_cast<std::size_t>(rank) * count;
  reduce_scatter(Algo::library, buffer.data(), mine, count, DataType::int32, RedOp::sum, ctx);
  const int32_t rank_sum = n * (n - 1) / 2;
  for (std::size_t i = 0; i < count; ++i)
    EXPECT_EQ(mine[i], n * static_cast<int32_t>(static_cast<std::size_t>(rank) * count + i) + rank_sum) << i;
  EXPECT_EQ(device_copies, rank == 0 ? 0u : 1u);  // rank 0's block is already in place

  // Strata's own algorithms and avg work on host memory.
  EXPECT_THROW(allreduce(Algo::ring, send.data(), recv.data(), count, DataType::int32, RedOp::sum, ctx), std::invalid_argument);
  EXPECT_THROW(broadcast(Algo::recursive_doubling, send.data(), recv.data(), count, DataType::int32, 0, ctx),
               std::invalid_argument);
  EXPECT_THROW(allreduce(Algo::library, send.data(), recv.data(), count, DataType::int32, RedOp::avg, ctx),
               std::invalid_argument);
}

// Algorithms must use ranks of the communicator they are given, never world ranks: run every operation on
// halves of the job whose rank order is the reverse of the world's.
TEST(Algorithms, MatchLibraryOnASubCommunicator) {
  const Comm half = split(MPI_COMM_WORLD, world_rank() % 2, -world_rank());
  Context ctx = plain_world_context();
  ctx.comm = half.get();
  for (Operation operation : kAllOperations) check_operation(operation, flat_algos(operation), ctx);
}

// The ring's segmented reduction and the splitting of long messages, on buffers small enough for a unit
// test: 12-byte segments (a whole number of elements only for 1-, 2- and 4-byte types, so 8-byte types round
// to one element) and messages cut every 5 bytes, so pieces end inside elements. The operations whose ring
// paths segment or split; the rest share the same Link.
TEST(Algorithms, TinySegmentsAndSplitMessagesMatchLibrary) {
  Context ctx = plain_world_context();
  ctx.ring_segment_bytes = 12;
  ctx.max_message_bytes = 5;
  for (Operation operation : {Operation::allreduce, Operation::reduce_scatter, Operation::allgather})
    check_operation(operation, flat_algos(operation), ctx);
}

// A test that throws on one rank must end the whole job with the message, not leave the other ranks waiting
// in their next collective until the ctest timeout. Run by the collectives_mpi_abort_on_throw test, which
// sets STRATA_TEST_THROW_ON_RANK and expects the message; skipped otherwise.
TEST(Harness, AThrowOnOneRankAbortsTheJob) {
  const char* which = std::getenv("STRATA_TEST_THROW_ON_RANK");
  if (which == nullptr) GTEST_SKIP() << "set STRATA_TEST_THROW_ON_RANK to run (collectives_mpi_abort_on_throw)";
  if (world_rank() == std::atoi(which)) throw std::runtime_error("injected failure on this rank");
  STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // the other ranks wait here for the one that threw
}

// Every way of cutting the job into equal emulated nodes, from one rank per node to one node.
TEST(Algorithms, HierarchicalMatchesLibraryOnEveryEmulatedLayout) {
  for (int ranks_per_node : divisors_of(world_size())) {
    SCOPED_TRACE("ranks per node " + std::to_string(ranks_per_node));
    const Layout layout(ranks_per_node);
    const Context ctx = small_segment_context(world_context(layout, *g_types));
    for (Operation operation : {Operation::allreduce, Operation::allgather, Operation::reduce_scatter})
      check_operation(operation, {Algo::hierarchical}, ctx);
  }
}

// Nodes need not hold consecutive ranks (mpirun --map-by node deals ranks round-robin): node r % N.
TEST(Algorithms, HierarchicalMatchesLibraryWithRoundRobinNodes) {
  const int n = world_size();
  const int rank = world_rank();
  for (int nodes : divisors_of(n)) {
    SCOPED_TRACE(std::to_string(nodes) + " round-robin nodes");
    const Comm intra = split(MPI_COMM_WORLD, rank % nodes, rank);
    const Comm inter = split(MPI_COMM_WORLD, rank / nodes, rank % nodes);
    Context ctx = plain_world_context();
    ctx.intra = intra.get();
    ctx.inter = inter.get();
    for (int r = 0; r < n; ++r) ctx.node_of_rank.push_back(r % nodes);
    for (Operation operation : {Operation::allreduce, Operation::allgather, Operation::reduce_scatter})
      check_operation(operation, {Algo::hierarchical}, ctx);
  }
}

TEST(Algorithms, HierarchicalRejectsUnevenNodes) {
  const int n = world_size();
  if (n < 3) GTEST_SKIP() << "two ranks cannot make uneven nodes";
  Context ctx = plain_world_context();
  ctx.intra = MPI_COMM_WORLD;
  ctx.inter = MPI_COMM_WORLD;
  for (int r = 0; r < n; ++r) ctx.node_of_rank.push_back(std::max(0, r - 1));  // node 0 holds ranks 0 and 1
  std::vector<float> buf(static_cast<std::size_t>(n), 1.0f);
  try {
    allreduce(Algo::hierarchical, buf.data(), buf.data(), buf.size(), DataType::float32, RedOp::sum, ctx);
    ADD_FAILURE() << "uneven nodes accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("same number of ranks on every node"), std::string::npos) << e.what();
  }
}

// ---- traffic ----------------------------------------------------------------------------------------------

// Ring allreduce sends every block but one in each of its two passes: 2 (n - 1) / n of the buffer, up to the
// uneven split; and all of it goes to the right neighbour.
TEST(Traffic, RingAllreduceSendsTwiceTheShareOfTheBuffer) {
  const int n = world_size();
  const int rank = world_rank();
  const std::size_t count = 1003;
  const std::size_t bytes = count * sizeof(float);
  for (int ranks_per_node : divisors_of(n)) {
    const Layout layout(ranks_per_node);
    const Context ctx = world_context(layout, *g_types);
    std::vector<float> buf(count, 1.0f);
    const Traffic traffic = allreduce(Algo::ring, buf.data(), buf.data(), count, DataType::float32, RedOp::sum, ctx);
    auto share = [&](int r) {
      const auto un = static_cast<std::size_t>(n);
      return count / un + (static_cast<std::size_t>(r) < count % un ? 1 : 0);
    };
    const std::size_t sent_elements = 2 * count - share(rank) - share((rank + 1) % n);
    EXPECT_EQ(traffic.total(), sent_elements * sizeof(float)) << "ranks per node " << ranks_per_node;
    const double ideal = 2.0 * (n - 1) / n * static_cast<double>(bytes);
    EXPECT_NEAR(static_cast<double>(traffic.total()), ideal, 2.0 * sizeof(float));
    const bool right_is_local = layout.node_of_rank()[static_cast<std::size_t>((rank + 1) % n)] == layout.node();
    EXPECT_EQ(right_is_local ? traffic.inter_bytes : traffic.intra_bytes, 0u) << "ranks per node " << ranks_per_node;
    EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [n](float v) { return v == static_cast<float>(n); }));
  }
}

// Hierarchical allreduce puts only a 1/L shard on the inter-node ring: 2 (N - 1) / N of bytes / L.
TEST(Traffic, HierarchicalAllreduceSendsOneShardAcrossNodes) {
  const int n = world_size();
  const std::size_t count = 1200;  // divisible by every ranks-per-node x nodes split of up to 5 ranks
  const std::size_t bytes = count * sizeof(double);
  for (int ranks_per_node : divisors_of(n)) {
    const Layout layout(ranks_per_node);
    const Context ctx = world_context(layout, *g_types);
    std::vector<double> buf(count, 1.0);
    const Traffic traffic =
        allreduce(Algo::hierarchical, buf.data(), buf.data(), count, DataType::float64, RedOp::sum, ctx);
    const auto nodes = static_cast<std::size_t>(n / ranks_per_node);
    const auto local = static_cast<std::size_t>(ranks_per_node);
    EXPECT_EQ(traffic.intra_bytes, 2 * (local - 1) * bytes / local) << "ranks per node " << ranks_per_node;
    EXPECT_EQ(traffic.inter_bytes, 2 * (nodes - 1) * bytes / local / nodes) << "ranks per node " << ranks_per_node;
  }
}

TEST(Traffic, LibraryPathReportsNothing) {
  const Layout layout(1);
  std::vector<int> buf(10, 1);
  const Traffic traffic =
      allreduce(Algo::library, buf.data(), buf.data(), buf.size(), DataType::int32, RedOp::sum,
                world_context(layout, *g_types));
  EXPECT_EQ(traffic.total(), 0u);
}

// ---- layout -------------------------------------------------------------------------------------------------

TEST(Layout, EmulatedNodesGroupConsecutiveRanks) {
  const int n = world_size();
  const int rank = world_rank();
  for (int per_node : divisors_of(n)) {
    SCOPED_TRACE("ranks per node " + std::to_string(per_node));
    const Layout layout(per_node);
    EXPECT_TRUE(layout.emulated());
    EXPECT_EQ(layout.node(), rank / per_node);
    EXPECT_EQ(layout.local_rank(), rank % per_node);
    EXPECT_EQ(layout.node_count(), n / per_node);
    for (int r = 0; r < n; ++r) EXPECT_EQ(layout.node_of_rank()[static_cast<std::size_t>(r)], r / per_node);
    std::vector<int> intra(static_cast<std::size_t>(per_node));
    std::iota(intra.begin(), intra.end(), layout.node() * per_node);
    EXPECT_EQ(members(layout.intra()), intra);
    std::vector<int> inter;
    for (int node = 0; node < n / per_node; ++node) inter.push_back(node * per_node + layout.local_rank());
    EXPECT_EQ(members(layout.inter()), inter);
  }
}

TEST(Layout, FourRanksTwoPerNode) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const Layout layout(2);
  const std::vector<std::vector<int>> intra{{0, 1}, {0, 1}, {2, 3}, {2, 3}};
  const std::vector<std::vector<int>> inter{{0, 2}, {1, 3}, {0, 2}, {1, 3}};
  EXPECT_EQ(members(layout.intra()), intra[static_cast<std::size_t>(world_rank())]);
  EXPECT_EQ(members(layout.inter()), inter[static_cast<std::size_t>(world_rank())]);
  EXPECT_EQ(layout.node_of_rank(), (std::vector<int>{0, 0, 1, 1}));
}

TEST(Layout, RealNodesAreConsistent) {
  const Layout layout;
  EXPECT_FALSE(layout.emulated());
  EXPECT_EQ(layout.node_of_rank()[static_cast<std::size_t>(world_rank())], layout.node());
  const std::vector<int> intra = members(layout.intra());
  EXPECT_EQ(static_cast<int>(intra.size()), layout.ranks_on_node(layout.node()));
  for (int r : intra) EXPECT_EQ(layout.node_of_rank()[static_cast<std::size_t>(r)], layout.node());
  EXPECT_EQ(intra[static_cast<std::size_t>(layout.local_rank())], world_rank());
  std::vector<int> inter_nodes = layout.node_of_ranks_in(layout.inter());
  EXPECT_TRUE(std::is_sorted(inter_nodes.begin(), inter_nodes.end()));
  EXPECT_EQ(std::adjacent_find(inter_nodes.begin(), inter_nodes.end()), inter_nodes.end()) << "two ranks per node";
}

TEST(Layout, RanksPerNodeMustDivideTheJob) {
  const int n = world_size();
  try {
    const Layout layout(n + 1);
    ADD_FAILURE() << "accepted " << n + 1 << " ranks per node";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("must be positive and divide"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Layout(-1), std::invalid_argument);
}

TEST(Layout, CommOwnsAndMoves) {
  Comm a = split(MPI_COMM_WORLD, 0, world_rank());
  EXPECT_EQ(a.size(), world_size());
  Comm b = std::move(a);
  EXPECT_EQ(a.get(), MPI_COMM_NULL);
  EXPECT_EQ(b.rank(), world_rank());
  a = std::move(b);
  EXPECT_EQ(b.get(), MPI_COMM_NULL);
  EXPECT_NE(a.get(), MPI_COMM_NULL);
}

// ---- grid ---------------------------------------------------------------------------------------------------

TEST(Grid, ParsesSizesInAnyOrder) {
  EXPECT_EQ(parse_grid("tp=2,pp=1,dp=2"), (GridShape{2, 1, 2}));
  EXPECT_EQ(parse_grid("dp=3,tp=2"), (GridShape{2, 1, 3}));
  EXPECT_EQ(parse_grid("pp=4"), (GridShape{1, 4, 1}));
  EXPECT_EQ(format_grid(GridShape{2, 3, 4}), "tp=2,pp=3,dp=4");
  EXPECT_EQ(parse_grid(format_grid(GridShape{2, 3, 4})), (GridShape{2, 3, 4}));
}

TEST(Grid, SizeOfTheLargestGridsHeldAtItsMaximum) {
  constexpr int most = std::numeric_limits<int>::max();
  EXPECT_EQ((GridShape{most, most, 1}).size(), static_cast<long long>(most) * most);
  EXPECT_EQ((GridShape{most, 2, 2}).size(), 4LL * most);
  EXPECT_EQ(parse_grid("tp=2147483647,pp=2147483647,dp=2147483647").size(), std::numeric_limits<long long>::max());
}

TEST(Grid, RejectsMalformedSpecsNamingTheProblem) {
  const std::vector<std::pair<std::string, std::string>> bad{
      {"", "empty"},          {"tp", "tp"},         {"tp=", "tp="},         {"tp=0", "tp=0"},
      {"tp=-1", "tp=-1"},     {"tp=x", "tp=x"},     {"tp=2x", "tp=2x"},     {"tq=2", "tq"},
      {"tp=2,tp=2", "twice"}, {"tp=2,,dp=1", "''"}, {"tp=2;dp=2", "2;dp=2"}};
  for (const auto& [spec, mentioned] : bad) {
    try {
      parse_grid(spec);
      ADD_FAILURE() << "accepted '" << spec << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(mentioned), std::string::npos) << spec << ": " << e.what();
    }
  }
}

TEST(Grid, GroupsFollowTheRankFormula) {
  const int n = world_size();
  const int rank = world_rank();
  const Layout one_node(n);
  for (int tp : divisors_of(n))
    for (int pp : divisors_of(n / tp)) {
      const GridShape shape{tp, pp, n / tp / pp};
      SCOPED_TRACE(format_grid(shape));
      const Grid grid(shape, one_node);
      EXPECT_EQ(Grid::world_rank_of(shape, grid.tp_index(), grid.pp_index(), grid.dp_index()), rank);
      const int t = grid.tp_index(), p = grid.pp_index(), d = grid.dp_index();
      std::vector<int> tp_members, pp_members, dp_members;
      for (int i = 0; i < shape.tp; ++i) tp_members.push_back(Grid::world_rank_of(shape, i, p, d));
      for (int i = 0; i < shape.pp; ++i) pp_members.push_back(Grid::world_rank_of(shape, t, i, d));
      for (int i = 0; i < shape.dp; ++i) dp_members.push_back(Grid::world_rank_of(shape, t, p, i));
      EXPECT_EQ(members(grid.tp()), tp_members);
      EXPECT_EQ(members(grid.pp()), pp_members);
      EXPECT_EQ(members(grid.dp()), dp_members);
      EXPECT_EQ(grid.tp_group(), rank / shape.tp);
    }
}

TEST(Grid, TwoWayTensorTwoWayDataOnFourRanks) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const Layout layout(2);
  const Grid grid(parse_grid("tp=2,pp=1,dp=2"), layout);
  const std::size_t rank = static_cast<std::size_t>(world_rank());
  const std::vector<std::vector<int>> tp{{0, 1}, {0, 1}, {2, 3}, {2, 3}};
  const std::vector<std::vector<int>> dp{{0, 2}, {1, 3}, {0, 2}, {1, 3}};
  EXPECT_EQ(members(grid.tp()), tp[rank]);
  EXPECT_EQ(members(grid.dp()), dp[rank]);
  EXPECT_EQ(members(grid.pp()), std::vector<int>{world_rank()});
  EXPECT_EQ(grid.tp_index(), world_rank() % 2);
  EXPECT_EQ(grid.dp_index(), world_rank() / 2);
  EXPECT_EQ(grid.tp_group(), world_rank() / 2);
  EXPECT_EQ(grid.dp_group(), world_rank() % 2);
  // The data-parallel group crosses the two nodes.
  EXPECT_EQ(layout.node_of_ranks_in(grid.dp()), (std::vector<int>{0, 1}));
}

TEST(Grid, RejectsWrongSizeAndTensorGroupsAcrossNodes) {
  const int n = world_size();
  EXPECT_THROW(Grid(GridShape{n + 1, 1, 1}, Layout(n)), std::invalid_argument);
  const Layout one_per_node(1);
  try {
    const Grid grid(GridShape{n, 1, 1}, one_per_node);
    ADD_FAILURE() << "a TP group across nodes was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("spans more than one node"), std::string::npos) << e.what();
  }
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
    const std::vector<std::string> all = gather_to_rank0(failures_);
    failures_.clear();
    for (std::size_t r = 1; r < all.size(); ++r)  // rank 0's own failures were printed as they happened
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
    // Errors come back as codes, so STRATA_MPI_CHECK can name the failing call.
    STRATA_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    ::testing::InitGoogleTest(&argc, argv);
    // An exception on one rank must reach the catch below (MPI_Abort): caught by GoogleTest, it would only
    // fail that rank's test while the others wait for it in the next collective.
    GTEST_FLAG_SET(catch_exceptions, false);
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (strata::coll::world_rank() != 0) delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new strata::coll::GatherFailures);
    int failed = 0;
    {
      const strata::coll::MpiTypes types;  // freed here, before MPI_Finalize
      strata::coll::g_types = &types;
      failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
      strata::coll::g_types = nullptr;
    }
    // Rank 0's summary covers rank 0 only: name the ranks that failed, and give every rank the same exit code.
    const std::vector<std::string> verdicts = strata::coll::gather_to_rank0(failed ? "failed" : "");
    for (std::size_t r = 0; r < verdicts.size(); ++r)
      if (!verdicts[r].empty()) std::cout << "[  FAILED  ] on rank " << r << "\n";
    int any_failed = 0;
    STRATA_MPI_CHECK(MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    STRATA_MPI_CHECK(MPI_Finalize());
    return any_failed;
  } catch (const std::exception& e) {
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::cerr << "test_collectives_mpi: rank " << rank << ": " << e.what() << "; aborting the job\n" << std::flush;
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
