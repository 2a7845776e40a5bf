// The sharding arithmetic (see shard_plan.h).
#include "train/shard_plan.h"

namespace strata::train {

UnitShape ShardPlan::shape(std::size_t size) const {
  const std::size_t n = static_cast<std::size_t>(n_);
  UnitShape u;
  u.size = size;
  u.padded = (size + n - 1) / n * n;
  u.piece_g = u.padded / n;
  u.piece_i = u.padded / static_cast<std::size_t>(m_);
  return u;
}

std::size_t ShardPlan::held(const UnitShape& u, Sharding s) const {
  return s == Sharding::none ? u.padded : s == Sharding::intra ? u.piece_i : u.piece_g;
}

std::size_t ShardPlan::piece_offset(const UnitShape& u, Sharding s) const {
  return s == Sharding::none    ? 0
         : s == Sharding::intra ? static_cast<std::size_t>(local_) * u.piece_i
                                : static_cast<std::size_t>(my_piece()) * u.piece_g;
}

std::size_t ShardPlan::optimizer_grads_offset(const UnitShape& u) const {
  const Sharding gs = strategy_.grads, os = strategy_.optimizer;
  if (gs == Sharding::none) return piece_offset(u, os);  // the whole unit reduced in place to the optimizer's piece
  if (gs == Sharding::intra && os == Sharding::global) return static_cast<std::size_t>(node_) * u.piece_g;  // in my intra piece
  return 0;
}

std::size_t ShardPlan::optimizer_params_offset(const UnitShape& u) const {
  const Sharding ps = strategy_.params, os = strategy_.optimizer;
  if (ps == Sharding::none) return piece_offset(u, os);
  if (ps == Sharding::intra && os == Sharding::global) return static_cast<std::size_t>(node_) * u.piece_g;
  return 0;
}

std::vector<ShardPlan::Reduction> ShardPlan::final_reductions(const UnitShape& u) const {
  const Sharding gs = strategy_.grads, os = strategy_.optimizer;
  if (gs == Sharding::global) return {};
  if (gs == Sharding::none && os == Sharding::none) return {{Over::all, true, 0, 0, u.padded}};
  std::vector<Reduction> steps;
  // Whole gradients: a reduce-scatter inside the node first, to my intra piece where it sits in the unit.
  const std::size_t intra_piece = gs == Sharding::none ? piece_offset(u, Sharding::intra) : 0;
  if (gs == Sharding::none) steps.push_back({Over::intra, false, 0, intra_piece, u.piece_i});
  // Across nodes, on the intra piece: all of it (O = I), or my global piece of it (O = G).
  if (os == Sharding::intra) steps.push_back({Over::inter, true, intra_piece, intra_piece, u.piece_i});
  else steps.push_back({Over::inter, false, intra_piece, intra_piece + static_cast<std::size_t>(node_) * u.piece_g, u.piece_g});
  return steps;
}

ShardPlan::Synchronise ShardPlan::synchronise(const UnitShape& u) const {
  const Sharding ps = strategy_.params, os = strategy_.optimizer;
  if (ps == os) return {};
  if (ps == Sharding::none && os == Sharding::intra) return {Over::intra, piece_offset(u, os), u.piece_i};
  if (ps == Sharding::none) return {Over::pieces, piece_offset(u, os), u.piece_g};
  return {Over::inter, static_cast<std::size_t>(node_) * u.piece_g, u.piece_g};
}

}  // namespace strata::train
