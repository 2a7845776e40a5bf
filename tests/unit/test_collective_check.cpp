// Unit tests of strata-collective's conventions and checks (collectives/operations.h, check.h): nccl-tests'
// sizes and bus-bandwidth factors for every entry of the operations table, its in-place layouts, and a check
// that passes exact results and catches a wrong element.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "collectives/algorithms.h"  // name(Algo)
#include "collectives/check.h"

using namespace strata::coll;

TEST(CollectiveConventions, BusFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(Operation::allreduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(Operation::allgather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(Operation::reduce_scatter, 8), 0.875);
  EXPECT_DOUBLE_EQ(bus_factor(Operation::alltoall, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(Operation::broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(Operation::reduce, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(Operation::sendrecv, 8), 1.0);
}

TEST(CollectiveConventions, SizesFollowNcclTestsAndOsu) {
  // allreduce: S is one rank's buffer.
  Counts a = counts_for(Operation::allreduce, 1024, 4, 4);
  EXPECT_EQ(a.count, 256u);
  EXPECT_EQ(a.size_bytes, 1024u);
  EXPECT_EQ(a.bytes_per_rank, 1024u);
  // allgather: S is the gathered buffer; each rank contributes S/n (OSU's size).
  Counts g = counts_for(Operation::allgather, 1024, 4, 4);
  EXPECT_EQ(g.count, 64u);
  EXPECT_EQ(g.recv_elems, 256u);
  EXPECT_EQ(g.bytes_per_rank, 256u);
  EXPECT_EQ(g.size_bytes, 1024u);
  // reduce_scatter: S is the whole input; rounded down to whole blocks per rank.
  Counts r = counts_for(Operation::reduce_scatter, 1000, 4, 3);
  EXPECT_EQ(r.count, 83u);
  EXPECT_EQ(r.size_bytes, 83u * 3 * 4);
  // alltoall: S is one rank's send buffer of n blocks.
  Counts t = counts_for(Operation::alltoall, 1024, 4, 4);
  EXPECT_EQ(t.count, 64u);
  EXPECT_EQ(t.send_elems, 256u);
}

TEST(CollectiveCheck, ExactResultsPassAndAWrongElementIsCounted) {
  for (DataType dtype : kAllDataTypes) {
    for (RedOp op : kAllRedOps) {
      const int n = 5;
      Counts c = counts_for(Operation::allreduce, 64 * size_of(dtype), size_of(dtype), n);
      // The exact result, element by element, as a correct allreduce would leave it.
      std::vector<unsigned char> out(c.recv_elems * size_of(dtype));
      for (std::size_t i = 0; i < c.count; ++i)
        store_value(out.data(), i, dtype, expected_reduction(op, dtype, n, i, Operation::allreduce));
      CheckSpec spec{Operation::allreduce, dtype, op};
      EXPECT_EQ(count_wrong(spec, c, out, 0, n, 0), 0) << name(dtype) << " " << name(op);
      store_value(out.data(), 7, dtype, load_value(out.data(), 7, dtype) + 3);
      EXPECT_EQ(count_wrong(spec, c, out, 0, n, 0), 1) << name(dtype) << " " << name(op);
    }
  }
}

TEST(CollectiveCheck, InputsDifferAcrossRanksAndAreNeverAllZero) {
  CheckSpec spec{Operation::allgather, DataType::float32, RedOp::sum};
  Counts c = counts_for(Operation::allgather, 4096, 4, 2);
  auto r0 = check_inputs(spec, c, 0), r1 = check_inputs(spec, c, 1);
  EXPECT_NE(r0, r1);
  bool nonzero = false;
  for (std::size_t i = 0; i < c.send_elems; ++i) nonzero |= load_value(r0.data(), i, DataType::float32) != 0;
  EXPECT_TRUE(nonzero);
}

// nccl-tests' getCollByteCount and getBw (src/<operation>.cu, nccl-tests 2.19), written out here as an
// independent statement of the conventions the operations table must follow: sendcount, recvcount and
// paramcount for `count` elements of S on n ranks, the bytes algbw divides, and the bus factor. nccl-tests
// also trims per-rank blocks to whole 16-byte units (a performance choice Strata does not copy): the
// comparison uses counts where the trim changes nothing.
struct NcclTestsCounts {
  std::size_t send, recv, param, algbw_bytes;
  double factor;
};
NcclTestsCounts nccl_tests(Operation op, std::size_t count, std::size_t elt, int nranks) {
  const auto n = static_cast<std::size_t>(nranks);
  const std::size_t base = (count / n) & ~(16 / elt - 1);
  const double ring = double(nranks - 1) / nranks;
  switch (op) {
    case Operation::allreduce: return {count, count, count, count * elt, 2 * ring};
    case Operation::allgather: return {base, base * n, base, base * elt * n, ring};
    case Operation::reduce_scatter: return {base * n, base, base, base * elt * n, ring};
    case Operation::alltoall: return {base * n, base * n, base, base * n * elt, ring};
    case Operation::broadcast:
    case Operation::reduce:
    case Operation::sendrecv: return {count, count, count, count * elt, 1.0};
  }
  return {};
}

TEST(CollectiveConventions, EveryTableEntryFollowsNcclTests) {
  for (Operation op : kAllOperations)
    for (DataType dtype : kAllDataTypes)
      for (int n = 1; n <= 9; ++n) {
        const std::size_t elt = size_of(dtype), count = 48 * static_cast<std::size_t>(n);  // blocks of 48 elements
        const NcclTestsCounts want = nccl_tests(op, count, elt, n);
        const Counts got = counts_for(op, count * elt, elt, n);
        const std::string what = std::string(name(op)) + " " + std::string(name(dtype)) + " n=" + std::to_string(n);
        EXPECT_EQ(got.count, want.param) << what;
        EXPECT_EQ(got.send_elems, want.send) << what;
        EXPECT_EQ(got.recv_elems, want.recv) << what;
        EXPECT_EQ(got.size_bytes, want.algbw_bytes) << what;
        EXPECT_EQ(got.size_bytes, std::max(want.send, want.recv) * elt) << what << ": S as nccl-tests prints it";
        EXPECT_DOUBLE_EQ(bus_factor(op, n), want.factor) << what;
      }
}

TEST(CollectiveConventions, OsuShareIsOneRanksBlockWhereTheOperationSplitsByRank) {
  for (Operation op : kAllOperations) {
    const Counts c = counts_for(op, 4 * 1200, 4, 4);
    const bool per_rank_share = op == Operation::allgather || op == Operation::reduce_scatter;
    EXPECT_EQ(c.bytes_per_rank, per_rank_share ? c.size_bytes / 4 : c.size_bytes) << name(op);
  }
}

TEST(OperationsTable, NamesParseBackAndUnknownNamesDoNot) {
  for (Operation op : kAllOperations) {
    EXPECT_EQ(info(op).operation, op);
    EXPECT_EQ(parse_operation(name(op)), op);
  }
  EXPECT_FALSE(parse_operation("allreduce ").has_value());
  EXPECT_FALSE(parse_operation("gather").has_value());
}

TEST(OperationsTable, ReductionsAndRootsAreTheOnesNcclTakesThemFor) {
  for (Operation op : kAllOperations) {
    const bool reduction = op == Operation::allreduce || op == Operation::reduce_scatter || op == Operation::reduce;
    EXPECT_EQ(is_reduction(op), reduction) << name(op);
    EXPECT_EQ(info(op).rooted, op == Operation::broadcast || op == Operation::reduce) << name(op);
  }
}

// The process groups offer a subset of the blocking algorithms, HO-Ring and shm (theirs only), and an operation with
// any has a call.
TEST(OperationsTable, GroupAlgorithmsAreBlockingAlgorithmsWithACall) {
  for (Operation op : kAllOperations) {
    bool any = false;
    for (Algo algo : kAllAlgos) {
      if (info(op).group_algos.has(algo)) {
        EXPECT_EQ(is_supported(op, algo), algo != Algo::horing && algo != Algo::shm) << name(op) << " " << name(algo);
      }
      any |= info(op).group_algos.has(algo);
    }
    EXPECT_EQ(any, info(op).start != nullptr) << name(op);
    EXPECT_TRUE(is_supported(op, Algo::library)) << name(op);
    EXPECT_NE(info(op).run, nullptr) << name(op);
  }
}

// In place, as NCCL lays it out: allgather's input at the rank's block of the output, reduce_scatter's
// output at the rank's block of the input, otherwise one buffer; both inside max(send, recv) bytes.
TEST(OperationsTable, InPlaceOffsetsAreNcclsLayout) {
  const int n = 5, rank = 3;
  for (Operation op : kAllOperations) {
    const Counts c = counts_for(op, 4 * 1000, 4, n);
    const InPlaceOffsets at = in_place_offsets(op, c, 4, rank);
    const std::size_t block = c.count * 4 * rank;
    EXPECT_EQ(at.send, op == Operation::allgather ? block : 0) << name(op);
    EXPECT_EQ(at.recv, op == Operation::reduce_scatter ? block : 0) << name(op);
    const std::size_t buffer = std::max(c.send_elems, c.recv_elems) * 4;
    EXPECT_LE(at.send + c.send_elems * 4, buffer) << name(op);
    EXPECT_LE(at.recv + c.recv_elems * 4, buffer) << name(op);
  }
}
