// Unit tests of strata-collective's conventions and checks (collectives/check.h): nccl-tests' sizes and
// bus-bandwidth factors, and a check that passes exact results and catches a wrong element.
#include <gtest/gtest.h>

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
