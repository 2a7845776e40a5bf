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

bool ShardPlan::optimizer_grads_in_intra_piece() const {
  return strategy_.grads == Sharding::none && strategy_.optimizer != Sharding::none;
}

std::size_t ShardPlan::optimizer_grads_offset(const UnitShape& u) const {
  const Sharding gs = strategy_.grads, os = strategy_.optimizer;
  if (gs == Sharding::global || os != Sharding::global || (gs == Sharding::none && os == Sharding::none)) return 0;
  return static_cast<std::size_t>(node_) * u.piece_g;  // my global piece inside my intra piece
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
  if (gs == Sharding::none && os == Sharding::none) return {{Over::all, true, true, true, 0, u.padded}};
  std::vector<Reduction> steps;
  const bool whole = gs == Sharding::none;
  if (whole) steps.push_back({Over::intra, false, true, false, 0, u.piece_i});
  // Across nodes, in place on the intra piece: in the store (G = I) or in the buffer the step above filled.
  if (os == Sharding::intra) steps.push_back({Over::inter, true, !whole, !whole, 0, u.piece_i});
  else steps.push_back({Over::inter, false, !whole, !whole, static_cast<std::size_t>(node_) * u.piece_g, u.piece_g});
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
