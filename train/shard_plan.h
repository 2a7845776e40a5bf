// How a data-parallel strategy cuts each unit of the model and where each state's shard sits (trainer.h's
// "Sharding"): the arithmetic the CPU trainer and the GPU one both ask, so the two shard alike.
//
// n data-parallel ranks in g groups (nodes) of m; the rank with local index l on node k holds global piece
// l g + k. A unit of `size` elements is padded to a multiple of n and cut into n pieces of piece_g elements; an
// intra piece (what an I-sharded state holds) is g consecutive global pieces, piece_i = padded / m.
#pragma once

#include <cstddef>
#include <vector>

#include "train/strategy.h"

namespace strata::train {

struct UnitShape {
  std::size_t size = 0, padded = 0, piece_g = 0, piece_i = 0;
};

class ShardPlan {
 public:
  ShardPlan(const Strategy& strategy, int n, int m, int g, int local, int node)
      : strategy_(strategy), n_(n), m_(m), g_(g), local_(local), node_(node) {}

  const Strategy& strategy() const { return strategy_; }
  int my_piece() const { return local_ * g_ + node_; }
  UnitShape shape(std::size_t size) const;

  // Elements of a unit a state sharded this way holds on this rank, and where they start in the padded unit.
  std::size_t held(const UnitShape& u, Sharding s) const;
  std::size_t piece_offset(const UnitShape& u, Sharding s) const;

  // After the last reduction, where the optimizer's shard of the unit's gradient starts in the gradient store's
  // unit (the reductions run in place there).
  std::size_t optimizer_grads_offset(const UnitShape& u) const;
  // Where the parameters the optimizer updates start in the unit's parameter store.
  std::size_t optimizer_params_offset(const UnitShape& u) const;

  // After the update, how the parameter holders get the new values: nothing (P = O), or an allgather over the
  // intra group (P = N, O = I), the ranks in piece order (P = N, O = G), or the inter group (P = I, O = G: the
  // inter ranks rebuild the intra piece from their global pieces), of `count` elements per rank from offset
  // `from` of the parameter store into the store.
  enum class Over { none, intra, inter, pieces, all };  // all: the data-parallel group in rank order
  struct Synchronise {
    Over over = Over::none;
    std::size_t from = 0, count = 0;
  };
  Synchronise synchronise(const UnitShape& u) const;

  // A collective over a unit: `count` elements per rank over `over` (Over::none: there is none).
  struct UnitCollective {
    Over over = Over::none;
    std::size_t count = 0;
  };
  // Before a unit's forward and backward, where parameters are sharded: an allgather of each rank's held piece over
  // the intra group (P = I) or the ranks in piece order (P = G) into the whole padded unit.
  UnitCollective parameter_gather(const UnitShape& u) const { return {over_of(strategy_.params), held(u, strategy_.params)}; }
  // The whole unit from the optimizer's shards (fp32 master weights where the optimizer holds them, as on the GPU).
  UnitCollective master_gather(const UnitShape& u) const {
    return {over_of(strategy_.optimizer), held(u, strategy_.optimizer)};
  }
  // After each micro-batch's backward, where gradients are sharded: a reduce-scatter of the unit's gradient over the
  // group the gradients are sharded over into the kept shard (summed into it after the first micro-batch). Whole gradients accumulate and are
  // reduced at the last micro-batch alone (final_reductions).
  UnitCollective micro_batch_reduction(const UnitShape& u) const { return {over_of(strategy_.grads), held(u, strategy_.grads)}; }

  // At the last micro-batch, the reductions that turn what the gradient store holds into the optimizer's shard, one
  // after another (docs/strategies.md's table): with whole gradients and whole optimizer states an allreduce of the
  // unit over the group; with whole gradients and sharded states a reduce-scatter inside the node to my intra
  // piece, then the step across nodes on it; with intra gradients (G = I) the step across nodes alone: an allreduce
  // of the intra piece (O = I) or a reduce-scatter of it to my global piece (O = G); with global gradients none
  // (the global shard is final after every micro-batch). Each runs in place in the gradient store's unit, reading
  // from element `in_offset` and leaving its result at `out_offset` (NCCL's in-place layout: out = in + group rank
  // x count for a reduce-scatter), as Megatron-Core's distributed optimizer and DeepSpeed's ZeRO reduce in their
  // gradient buffers: the trainer holds no copy of the gradient for it (the library, ring, shm and NCCL
  // reduce-scatters work in place; the hierarchical ones stage their input in scratch). What the store holds outside
  // the optimizer's shard afterwards is undefined until the gradients are zeroed.
  struct Reduction {
    Over over = Over::none;
    bool allreduce = true;  // else a reduce-scatter
    std::size_t in_offset = 0, out_offset = 0;
    std::size_t count = 0;  // the call's count argument
  };
  std::vector<Reduction> final_reductions(const UnitShape& u) const;

 private:
  // The group a state sharded this way is spread over.
  static Over over_of(Sharding s) { return s == Sharding::none ? Over::none : s == Sharding::intra ? Over::intra : Over::pieces; }
  Strategy strategy_;
  int n_, m_, g_, local_, node_;
};

}  // namespace strata::train
