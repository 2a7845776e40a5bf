// The host-side decisions of the NCCL process groups (collectives/nccl_plan.h), under a real mpirun (1-4
// ranks) in the CPU build: the split colours and keys rebuild every MPI group with its rank order (checked
// with MPI_Comm_split, which orders ranks as ncclCommSplit does), the one-rank-per-GPU rule, argument checks,
// and the ring traffic model against the bytes the MPI groups' ring algorithm counts as it sends.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/mpi.h"
#include "collectives/nccl_plan.h"
#include "collectives/process_group.h"

namespace strata::coll {
namespace {

int world_size_now() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Layouts each world size can be cut into: one node, one rank per node, two ranks per node.
std::vector<int> layouts() {
  std::vector<int> rpn = {0, 1};
  if (world_size_now() % 2 == 0) rpn.push_back(2);
  return rpn;
}

// Grids that give every kind of group more than one rank where the world size allows.
GridShape grid_for(int n) { return n % 2 == 0 ? GridShape{2, 1, n / 2} : GridShape{1, 1, n}; }

std::vector<Group*> every_group(ProcessGroups& g) {
  return {&g.world(), &g.tp(), &g.pp(), &g.dp(), &g.dp_intra(), &g.dp_inter()};
}

TEST(NcclPlan, SplitColorIsTheLowestMemberAndKeyTheGroupRank) {
  const SplitColor sc = split_color({7, 3, 5}, 5);
  EXPECT_EQ(sc.color, 3);
  EXPECT_EQ(sc.key, 2);
  EXPECT_EQ(split_color({4}, 4).color, 4);
  EXPECT_EQ(split_color({4}, 4).key, 0);
  EXPECT_THROW(split_color({7, 3, 5}, 4), std::invalid_argument);
  EXPECT_THROW(split_color({7, 3, 7}, 3), std::invalid_argument);
}

// Splitting the world with each rank's colour and key gives back each group, member for member, in order.
TEST(NcclPlan, SplitsRebuildEveryGroupInItsRankOrder) {
  const int n = world_size_now(), me = world_rank();
  for (int rpn : layouts())
    for (const char* order : {"tp,pp,dp", "dp,tp,pp"}) {
      ProcessGroups groups(grid_for(n), rpn, order);
      for (Group* group : every_group(groups)) {
        const std::vector<int> members = world_ranks_of(group->comm());
        const SplitColor sc = split_color(members, me);
        Comm rebuilt = split(MPI_COMM_WORLD, sc.color, sc.key);
        EXPECT_EQ(world_ranks_of(rebuilt.get()), members) << group->name() << " rpn " << rpn << " order " << order;
        EXPECT_EQ(sc.key, group->rank()) << group->name();
      }
    }
}

TEST(NcclPlan, OneRankPerGpu) {
  EXPECT_EQ(device_for_rank(0, 1, 1), 0);
  EXPECT_EQ(device_for_rank(3, 4, 8), 3);
  EXPECT_THROW(device_for_rank(0, 1, 0), std::invalid_argument);
  EXPECT_THROW(device_for_rank(4, 4, 8), std::invalid_argument);
  try {
    device_for_rank(1, 3, 2);
    ADD_FAILURE() << "3 ranks on 2 GPUs accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("3 ranks on this node but 2 GPU(s)"), std::string::npos) << e.what();
  }
}

TEST(NcclPlan, ArgumentChecks) {
  EXPECT_NO_THROW(check_root(2, 3, "dp"));
  EXPECT_THROW(check_root(3, 3, "dp"), std::invalid_argument);
  EXPECT_THROW(check_root(-1, 3, "dp"), std::invalid_argument);
  EXPECT_NO_THROW(check_peer(1, 0, 2, "pp"));
  EXPECT_THROW(check_peer(0, 0, 2, "pp"), std::invalid_argument);
  EXPECT_THROW(check_peer(2, 0, 2, "pp"), std::invalid_argument);
  EXPECT_NO_THROW(check_exchange(0, 0, 1, "pp"));
  EXPECT_THROW(check_exchange(1, 0, 1, "pp"), std::invalid_argument);
  EXPECT_THROW(check_exchange(0, -1, 1, "pp"), std::invalid_argument);
  EXPECT_THROW(ring_traffic(Operation::alltoall, 4, DataType::float32, 0, {0}), std::invalid_argument);
}

// Four ranks on two nodes: rank 1's right neighbour is on the other node, rank 0's on its own.
TEST(NcclPlan, RingTrafficByHand) {
  const std::vector<int> nodes = {0, 0, 1, 1};
  // allreduce of 10 floats: blocks 2, 3, 2, 3; rank 1 sends all but its own (3) and rank 2's (2) twice over.
  const Traffic ar = ring_traffic(Operation::allreduce, 10, DataType::float32, 1, nodes);
  EXPECT_EQ(ar.inter_bytes, (20u - 3u - 2u) * 4u);
  EXPECT_EQ(ar.intra_bytes, 0u);
  EXPECT_EQ(ring_traffic(Operation::allgather, 5, DataType::float64, 0, nodes).intra_bytes, 3u * 5u * 8u);
  EXPECT_EQ(ring_traffic(Operation::reduce_scatter, 5, DataType::int8, 3, nodes).inter_bytes, 15u);
  // Broadcast from rank 2: the chain ends at rank 1, which forwards nothing.
  EXPECT_EQ(ring_traffic(Operation::broadcast, 6, DataType::int32, 1, nodes, 2).total(), 0u);
  EXPECT_EQ(ring_traffic(Operation::broadcast, 6, DataType::int32, 3, nodes, 2).inter_bytes, 24u);
  EXPECT_EQ(ring_traffic(Operation::allreduce, 10, DataType::float32, 0, {0}).total(), 0u);
  EXPECT_EQ(message_traffic(3, DataType::float32, 0, 2, nodes).inter_bytes, 12u);
  EXPECT_EQ(message_traffic(3, DataType::float32, 2, 3, nodes).intra_bytes, 12u);
}

void expect_same(const Traffic& model, const Traffic& sent, const std::string& what) {
  EXPECT_EQ(model.intra_bytes, sent.intra_bytes) << what;
  EXPECT_EQ(model.inter_bytes, sent.inter_bytes) << what;
}

// The model counts what the MPI groups' ring algorithm sends, for every operation of the table they run as a
// ring (so a new entry is covered by its ring_elements), on every group, layout, count and root, in place.
TEST(NcclPlan, RingTrafficMatchesTheMpiRing) {
  const int n = world_size_now();
  for (Operation operation : kAllOperations) {
    const OperationInfo& op = info(operation);
    if (op.group_algos.has(Algo::ring)) {
      EXPECT_NE(op.ring_elements, nullptr) << name(operation) << " has a ring but no model";
    }
  }
  for (int rpn : layouts()) {
    ProcessGroups groups(grid_for(n), rpn);
    for (Group* g : every_group(groups)) {
      const std::size_t size = static_cast<std::size_t>(g->size());
      const std::string where = g->name() + " rpn " + std::to_string(rpn);
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}, std::size_t{1000}}) {
        std::vector<float> buf(std::max<std::size_t>(count * size, 1), 1.0f);
        for (Operation operation : kAllOperations) {
          const OperationInfo& op = info(operation);
          if (!op.group_algos.has(Algo::ring)) continue;
          const InPlaceOffsets at = in_place_offsets(operation, Counts{.count = count}, sizeof(float), g->rank());
          auto* base = reinterpret_cast<std::byte*>(buf.data());
          for (int root = 0; root < (op.rooted ? g->size() : 1); ++root) {
            const OpArgs args{base + at.send, base + at.recv, count, DataType::float32, RedOp::sum, root};
            Work work = op.start(*g, Algo::ring, args, Waiting::later);
            work.wait();
            expect_same(ring_traffic(operation, count, DataType::float32, g->rank(), g->node_of_rank(), root),
                        work.traffic(), std::string(name(operation)) + " root " + std::to_string(root) + " " + where +
                                            " count " + std::to_string(count));
          }
        }
      }
      if (g->size() > 1) {
        const int right = (g->rank() + 1) % g->size(), left = (g->rank() + g->size() - 1) % g->size();
        std::vector<float> out(9, 1.0f), in(9);
        Work recv = g->recv(in.data(), 9, DataType::float32, left);
        Work send = g->send(out.data(), 9, DataType::float32, right);
        send.wait(), recv.wait();
        expect_same(message_traffic(9, DataType::float32, g->rank(), right, g->node_of_rank()), send.traffic(),
                    "send " + where);
      }
    }
  }
}

}  // namespace
}  // namespace strata::coll

// Rank 0 prints; a rank whose test throws outside a test body aborts the job with its message.
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(catch_exceptions, false);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (strata::world_rank() != 0) delete listeners.Release(listeners.default_result_printer());
  int failed = 0;
  try {
    failed = RUN_ALL_TESTS() != 0;
  } catch (const std::exception& e) {
    std::cerr << "rank " << strata::world_rank() << ": " << e.what() << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && strata::world_rank() == 0) std::cout << "[  FAILED  ] on some rank (see above)\n";
  MPI_Finalize();
  return any;
}
