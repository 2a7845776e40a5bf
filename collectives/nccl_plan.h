// What the NCCL process groups (nccl_groups.h) decide on the host, kept apart so the CPU build tests it: the
// colour and key that split each group's communicator from the world one, the GPU of each rank, the checks of
// an operation's arguments, and the bytes each operation sends per tier.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/operations.h"
#include "collectives/types.h"
#include "collectives/work.h"  // Traffic

namespace strata::coll {

// My arguments to ncclCommSplit for a group whose members are `members` (world ranks, in group-rank order):
// the colour is the group's lowest world rank, the same on every member and distinct between the disjoint
// groups of one kind; the key is my group rank, so the NCCL ranks come out in the MPI group's order.
// std::invalid_argument when I am not a member or a world rank appears twice.
struct SplitColor {
  int color = 0;
  int key = 0;
};
SplitColor split_color(const std::vector<int>& members, int world_rank);

// The GPU of the rank with index `local_rank` among the `ranks_on_node` ranks of its (real) node: one rank per
// GPU, so std::invalid_argument when the node holds more ranks than `device_count` GPUs.
int device_for_rank(int local_rank, int ranks_on_node, int device_count);

// std::invalid_argument naming the group unless `root` is one of its ranks; unless `peer` is a rank other than
// mine (send, recv); unless `to` and `from` are ranks (sendrecv, which may name me).
void check_root(int root, int size, const char* group);
void check_peer(int peer, int rank, int size, const char* group);
void check_exchange(int to, int from, int size, const char* group);

// The bytes a rank sends in one operation on the group, split by whether the receiver is on its node
// (node_of_rank[r]: the node of group rank r). Collectives are counted as the ring over group-rank order that
// the MPI groups' Algo::ring runs (the operations table's ring_elements, operations.h), which is what NCCL's
// ring algorithm sends too: NCCL chooses its own algorithm and ring order, so the split between tiers is a
// model, not a measurement.
// `count` is the operation's count argument, as the groups take it (reduce_scatter: the count received).
// std::invalid_argument for an operation without a ring (its table entry has no ring_elements).
Traffic ring_traffic(Operation operation, std::size_t count, DataType dtype, int rank,
                     const std::vector<int>& node_of_rank, int root = 0);
// A message of count elements from `rank` to `peer`.
Traffic message_traffic(std::size_t count, DataType dtype, int rank, int peer, const std::vector<int>& node_of_rank);

}  // namespace strata::coll
