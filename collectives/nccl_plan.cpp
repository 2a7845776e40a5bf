// Implementation of the host-side decisions of the NCCL process groups (see nccl_plan.h).
#include "collectives/nccl_plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace strata::coll {

namespace {

std::string in_group(const char* group) { return std::string(" of group ") + group; }

// Bytes to the ring's right neighbour, counted on the tier of the link to it.
Traffic to_right(std::uint64_t bytes, int rank, const std::vector<int>& node_of_rank) {
  const int n = static_cast<int>(node_of_rank.size());
  return message_traffic(bytes, DataType::int8, rank, (rank + 1) % n, node_of_rank);
}

}  // namespace

SplitColor split_color(const std::vector<int>& members, int world_rank) {
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw std::invalid_argument("split: a world rank appears twice among a group's members");
  const auto mine = std::find(members.begin(), members.end(), world_rank);
  if (mine == members.end())
    throw std::invalid_argument("split: world rank " + std::to_string(world_rank) + " is not a member of the group");
  return {sorted.front(), static_cast<int>(mine - members.begin())};
}

int device_for_rank(int local_rank, int ranks_on_node, int device_count) {
  if (local_rank < 0 || local_rank >= ranks_on_node)
    throw std::invalid_argument("local rank " + std::to_string(local_rank) + " of " + std::to_string(ranks_on_node));
  if (ranks_on_node > device_count)
    throw std::invalid_argument(std::to_string(ranks_on_node) + " ranks on this node but " + std::to_string(device_count) +
                                " GPU(s): NCCL needs one rank per GPU");
  return local_rank;
}

void check_root(int root, int size, const char* group) {
  if (root < 0 || root >= size) throw std::invalid_argument("broadcast root " + std::to_string(root) + " is not a rank" + in_group(group));
}

void check_peer(int peer, int rank, int size, const char* group) {
  if (peer < 0 || peer >= size || peer == rank)
    throw std::invalid_argument("peer " + std::to_string(peer) + " is not another rank" + in_group(group));
}

void check_exchange(int to, int from, int size, const char* group) {
  if (to < 0 || to >= size || from < 0 || from >= size)
    throw std::invalid_argument("sendrecv to " + std::to_string(to) + " from " + std::to_string(from) + ": not ranks" +
                                in_group(group));
}

Traffic ring_traffic(Operation operation, std::size_t count, DataType dtype, int rank,
                     const std::vector<int>& node_of_rank, int root) {
  const int n = static_cast<int>(node_of_rank.size());
  if (rank < 0 || rank >= n) throw std::invalid_argument("ring_traffic: rank out of range");
  const OperationInfo& op = info(operation);
  if (!op.ring_elements) throw std::invalid_argument("ring_traffic: no ring model for " + std::string(name(operation)));
  if (op.rooted) check_root(root, n, "ring_traffic");
  return to_right(op.ring_elements(count, rank, n, root) * size_of(dtype), rank, node_of_rank);
}

Traffic message_traffic(std::size_t count, DataType dtype, int rank, int peer, const std::vector<int>& node_of_rank) {
  const std::uint64_t bytes = count * size_of(dtype);
  Traffic traffic;
  if (node_of_rank.at(static_cast<std::size_t>(rank)) == node_of_rank.at(static_cast<std::size_t>(peer)))
    traffic.intra_bytes = bytes;
  else
    traffic.inter_bytes = bytes;
  return traffic;
}

}  // namespace strata::coll
