// PaRO's choice rule (see paro_rule.h).
#include "project/paro_rule.h"

#include <cmath>
#include <stdexcept>

namespace strata::project {

namespace {

using train::Sharding;

// Bytes one rank sends in a ring over k ranks: (k - 1)/k S for allgather and reduce-scatter, twice for allreduce.
double ring(int k, double bytes, bool allreduce = false) {
  if (k <= 1) return 0;
  return (allreduce ? 2.0 : 1.0) * (k - 1) / k * bytes;
}

}  // namespace

ParoTerms paro_terms(const train::Strategy& s, const ParoScenario& x) {
  if (const std::string why = train::refusal_reason(s); !why.empty()) throw std::invalid_argument(why);
  const int n = x.ranks, m = x.ranks_per_group;
  if (n < 1 || m < 1 || n % m != 0)
    throw std::invalid_argument("PaRO rule: " + std::to_string(n) + " ranks do not form groups of " + std::to_string(m));
  if (!(x.intra_bandwidth > 0) || !(x.inter_bandwidth > 0))
    throw std::invalid_argument("PaRO rule: the intra- and inter-node bandwidths must be positive");
  if (x.micro_batches < 1) throw std::invalid_argument("PaRO rule: at least one micro-batch");
  const int g = n / m;
  const double intra = x.intra_bandwidth, inter = x.inter_bandwidth, global = g > 1 ? inter : intra;
  const double psi = x.parameters, trainable = x.trainable, shard = trainable / m;
  const double bp = x.param_element_bytes, bg = x.grad_element_bytes;

  ParoTerms t;
  t.micro_batches = x.micro_batches;
  t.compute_s = x.compute_s;
  // Per micro-batch: parameters gathered for forward and again for the layers backward reaches.
  const double gathered = (psi + x.backward_parameters) * bp;
  if (s.params == Sharding::intra) t.param_s = ring(m, gathered) / intra;
  if (s.params == Sharding::global) t.param_s = ring(n, gathered) / global;
  // Per micro-batch: gradients reduced into the form G keeps.
  if (s.grads == Sharding::intra) t.gradient_s = ring(m, trainable * bg) / intra;
  if (s.grads == Sharding::global) t.gradient_s = ring(n, trainable * bg) / global;
  // Once: gradients into the optimizer's partition.
  const bool optimizer_intra = s.optimizer == Sharding::intra;
  if (s.grads == Sharding::intra) {
    t.syncg_s = ring(g, shard * bg, optimizer_intra) / inter;
  } else if (s.grads == Sharding::none) {
    if (s.optimizer == Sharding::none) t.syncg_s = ring(n, trainable * bg, true) / global;
    else t.syncg_s = ring(m, trainable * bg) / intra + ring(g, shard * bg, optimizer_intra) / inter;
  }
  // Once, after the update: the parameter holders gather the optimizer's shards.
  if (s.params != s.optimizer) {
    if (s.params == Sharding::intra) t.syncp_s = ring(g, shard * bp) / inter;
    else if (s.optimizer == Sharding::intra) t.syncp_s = ring(m, trainable * bp) / intra;
    else t.syncp_s = ring(n, trainable * bp) / global;
  }
  t.optimizer_s = trainable / train::shard_degree(s.optimizer, m, n) * x.optimizer_s_per_element;
  t.memory_bytes = train::model_state_memory(s, psi, trainable, m, n, x.state_bytes).total() + x.other_memory_bytes;
  t.fits = x.memory_limit <= 0 || t.memory_bytes <= x.memory_limit;
  return t;
}

std::optional<ParoChoice> paro_choose(const ParoScenario& scenario, const std::vector<train::Strategy>& candidates) {
  const std::vector<train::Strategy> all = candidates.empty() ? train::runnable_strategies() : candidates;
  std::optional<ParoChoice> best;
  for (const train::Strategy& s : all) {
    const ParoTerms terms = paro_terms(s, scenario);
    if (!terms.fits) continue;
    if (!best || terms.total_s() < best->terms.total_s()) best = ParoChoice{s, terms};
  }
  return best;
}

}  // namespace strata::project
