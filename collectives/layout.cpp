// Node layout (real or emulated) and the parallelism grid, built from MPI_COMM_WORLD.
#include "collectives/layout.h"

#include <stdexcept>
#include <algorithm>
#include <charconv>
#include <utility>

#include "collectives/mpi_error.h"

namespace strata::coll {

using strata::split;
using strata::shared_memory_node_of_rank;
using strata::world_ranks_of;
using strata::world_rank;
using strata::world_size;

namespace {


std::vector<int> emulated_node_of_rank(int ranks_per_node, int size) {
  if (ranks_per_node < 0 || size % ranks_per_node != 0)
    throw std::invalid_argument("ranks per node " + std::to_string(ranks_per_node) + " must be positive and divide the " +
                     std::to_string(size) + " ranks of the job");
  std::vector<int> node_of_rank;
  for (int r = 0; r < size; ++r) node_of_rank.push_back(r / ranks_per_node);
  return node_of_rank;
}

int parse_grid_size(std::string_view key, std::string_view value) {
  int parsed = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
  if (error != std::errc() || end != value.data() + value.size() || parsed < 1)
    throw std::invalid_argument("grid size " + std::string(key) + "=" + std::string(value) + " is not a positive integer");
  return parsed;
}

// The first TP group (consecutive world ranks) that spans two nodes, or -1.
int first_tp_group_across_nodes(int tp, const std::vector<int>& node_of_rank) {
  for (std::size_t start = 0; start < node_of_rank.size(); start += static_cast<std::size_t>(tp))
    for (std::size_t r = start; r < start + static_cast<std::size_t>(tp); ++r)
      if (node_of_rank[r] != node_of_rank[start]) return static_cast<int>(start);
  return -1;
}

}  // namespace


Layout::Layout(int ranks_per_node)
    : emulated_(ranks_per_node != 0),
      world_rank_(coll::world_rank()),
      node_of_rank_(emulated_ ? emulated_node_of_rank(ranks_per_node, coll::world_size()) : shared_memory_node_of_rank()) {
  node_count_ = *std::max_element(node_of_rank_.begin(), node_of_rank_.end()) + 1;
  local_rank_ = static_cast<int>(std::count(node_of_rank_.begin(), node_of_rank_.begin() + world_rank_, node()));
  intra_ = split(MPI_COMM_WORLD, node(), world_rank_);
  inter_ = split(MPI_COMM_WORLD, local_rank_, node());
}

int Layout::ranks_on_node(int node) const {
  return static_cast<int>(std::count(node_of_rank_.begin(), node_of_rank_.end(), node));
}

std::vector<int> Layout::node_of_ranks_in(MPI_Comm comm) const {
  std::vector<int> nodes;
  for (int w : world_ranks_of(comm)) nodes.push_back(node_of_rank_.at(static_cast<std::size_t>(w)));
  return nodes;
}

GridShape parse_grid(std::string_view spec) {
  if (spec.empty()) throw std::invalid_argument("grid is empty; expected e.g. tp=2,pp=1,dp=2");
  GridShape shape;
  bool seen[3] = {false, false, false};
  while (!spec.empty()) {
    const std::size_t comma = spec.find(',');
    const std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    const std::size_t equals = item.find('=');
    if (equals == std::string_view::npos)
      throw std::invalid_argument("grid item '" + std::string(item) + "' is not of the form tp=N, pp=N or dp=N");
    const std::string_view key = item.substr(0, equals);
    const std::string_view value = item.substr(equals + 1);
    const int which = key == "tp" ? 0 : key == "pp" ? 1 : key == "dp" ? 2 : -1;
    if (which < 0) throw std::invalid_argument("grid key '" + std::string(key) + "' is unknown; expected tp, pp or dp");
    if (seen[which]) throw std::invalid_argument("grid key '" + std::string(key) + "' is given twice");
    seen[which] = true;
    (which == 0 ? shape.tp : which == 1 ? shape.pp : shape.dp) = parse_grid_size(key, value);
  }
  return shape;
}

std::string format_grid(const GridShape& shape) {
  return "tp=" + std::to_string(shape.tp) + ",pp=" + std::to_string(shape.pp) + ",dp=" + std::to_string(shape.dp);
}

Grid::Grid(const GridShape& shape, const Layout& layout) : shape_(shape) {
  if (shape.size() != layout.world_size())
    throw std::invalid_argument("grid " + format_grid(shape) + " needs " + std::to_string(shape.size()) +
                     " ranks but the job has " + std::to_string(layout.world_size()));
  if (const int start = first_tp_group_across_nodes(shape.tp, layout.node_of_rank()); start >= 0) {
    const int node = layout.node_of_rank()[static_cast<std::size_t>(start)];
    throw std::invalid_argument("grid " + format_grid(shape) + ": the TP group of world ranks " + std::to_string(start) + ".." +
                     std::to_string(start + shape.tp - 1) + " spans more than one node; tp must divide the ranks " +
                     "per node (node " + std::to_string(node) + " has " + std::to_string(layout.ranks_on_node(node)) +
                     ")");
  }
  const int rank = layout.world_rank();
  tp_index_ = rank % shape.tp;
  pp_index_ = (rank / shape.tp) % shape.pp;
  dp_index_ = rank / (shape.tp * shape.pp);
  tp_ = split(MPI_COMM_WORLD, tp_group(), tp_index_);
  pp_ = split(MPI_COMM_WORLD, pp_group(), pp_index_);
  dp_ = split(MPI_COMM_WORLD, dp_group(), dp_index_);
}

}  // namespace strata::coll
