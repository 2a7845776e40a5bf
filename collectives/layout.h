// Where the ranks of MPI_COMM_WORLD sit: which node each is on (real, or emulated by grouping consecutive
// ranks so one machine can stand in for several), and the communicators the hierarchical algorithms and the
// parallelism grid (tensor, pipeline, data parallel) run on.
#pragma once

#include <mpi.h>

#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/mpi.h"

namespace strata::coll {

// Communicators are strata::Comm (bench/mpi.h): freed when they go out of scope, movable, not copyable.
using strata::Comm;

class Layout {
 public:
  // ranks_per_node == 0: real nodes (ranks sharing memory). Otherwise emulated nodes of ranks_per_node
  // consecutive world ranks; it must divide the world size (std::invalid_argument otherwise). Collective over
  // MPI_COMM_WORLD.
  explicit Layout(int ranks_per_node = 0);

  bool emulated() const { return emulated_; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return static_cast<int>(node_of_rank_.size()); }
  int node() const { return node_of_rank_[static_cast<std::size_t>(world_rank_)]; }
  int local_rank() const { return local_rank_; }  // my index among the ranks of my node
  int node_count() const { return node_count_; }
  int ranks_on_node(int node) const;
  // Nodes are numbered 0.. in the order of their lowest world rank; indexed by world rank.
  const std::vector<int>& node_of_rank() const { return node_of_rank_; }
  // The same for the ranks of a communicator made from MPI_COMM_WORLD (e.g. a grid group).
  std::vector<int> node_of_ranks_in(MPI_Comm comm) const;

  // Owned by the layout.
  MPI_Comm intra() const { return intra_.get(); }  // my node's ranks, by world rank
  MPI_Comm inter() const { return inter_.get(); }  // ranks with my local rank, one per node, by node

 private:
  bool emulated_ = false;
  int world_rank_ = 0;
  int local_rank_ = 0;
  int node_count_ = 0;
  std::vector<int> node_of_rank_;
  Comm intra_;
  Comm inter_;
};

// Sizes of the parallelism grid: tensor (fastest varying), pipeline, data parallel.
struct GridShape {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  // In long long, held at its maximum: a grid parsed from a user's text may hold three int maxima, whose product
  // overflows even long long; any size past int is refused by whoever needs the grid.
  long long size() const {
    const long long tp_pp = static_cast<long long>(tp) * pp;  // below 2^62 for ints
    return dp > 0 && tp_pp > std::numeric_limits<long long>::max() / dp ? std::numeric_limits<long long>::max() : tp_pp * dp;
  }
  bool operator==(const GridShape&) const = default;
};

// "tp=T,pp=P,dp=D" in any order; a size left out is 1. std::invalid_argument naming the problem otherwise.
GridShape parse_grid(std::string_view spec);
std::string format_grid(const GridShape& shape);

// My place in the grid, world rank = tp + T * (pp + P * dp), and the communicator of each kind of group.
// A TP group must lie inside one node (tensor parallelism needs the fastest links), so T must divide the
// ranks per node. Collective over MPI_COMM_WORLD.
class Grid {
 public:
  Grid(const GridShape& shape, const Layout& layout);

  const GridShape& shape() const { return shape_; }
  // My coordinate, which is also my rank in the group of that kind.
  int tp_index() const { return tp_index_; }
  int pp_index() const { return pp_index_; }
  int dp_index() const { return dp_index_; }
  // Which group of that kind I belong to, numbered by the other two coordinates, the faster one first.
  int tp_group() const { return pp_index_ + shape_.pp * dp_index_; }
  int pp_group() const { return tp_index_ + shape_.tp * dp_index_; }
  int dp_group() const { return tp_index_ + shape_.tp * pp_index_; }

  MPI_Comm tp() const { return tp_.get(); }
  MPI_Comm pp() const { return pp_.get(); }
  MPI_Comm dp() const { return dp_.get(); }

  static int world_rank_of(const GridShape& shape, int tp_index, int pp_index, int dp_index) {
    return tp_index + shape.tp * (pp_index + shape.pp * dp_index);
  }

 private:
  GridShape shape_;
  int tp_index_ = 0;
  int pp_index_ = 0;
  int dp_index_ = 0;
  Comm tp_;
  Comm pp_;
  Comm dp_;
};

}  // namespace strata::coll
