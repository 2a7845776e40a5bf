// PaRO's rule for choosing a data-parallel strategy (docs/strategies.md#choosing-a-strategy; the paper gives
// the structure, the formulas are our derivation): score each strategy by four communication terms beside the
// compute and the optimizer, skip the strategies that do not fit in memory, and take the smallest
//
//   T = A (t_compute + t_param + t_gradient) + t_syncg + t_syncp + t_optimizer
//
// with A micro-batches per step. Each term is the ring volume one rank sends (docs/strategies.md's table, as the step
// executor runs it: train/step_formulas.h's expected_traffic) over the bandwidth of the tier it crosses. n ranks
// form g groups (nodes) of m; a collective over the m ranks of a group runs at the intra-node bandwidth B', one
// over the g groups (one rank each) at the inter-node bandwidth B, and one over all n ranks at B when it spans
// nodes (g > 1; the ring crosses nodes) and at B' otherwise. A ring allgather or reduce-scatter of S bytes over k
// ranks sends (k - 1)/k S per rank, an allreduce twice that; k = 1 sends nothing.
//
// Ψ: parameters, Ψ': trainable parameters, Ψ_b: the parameters the backward pass reaches (gathers again), b_P and
// b_G the bytes of a parameter and a gradient element in collectives (2: bf16).
//   t_param     per micro-batch, P = I: intra allgather of (Ψ + Ψ_b) b_P; P = G: allgather over all n; P = N: 0
//   t_gradient  per micro-batch, G = I: intra reduce-scatter of Ψ' b_G; G = G: over all n; G = N: 0
//   t_syncg     once: G = I: inter allreduce (O = I) or reduce-scatter (O = G) of the intra shard Ψ'/m b_G;
//               G = N: allreduce over all n (O = N), or an intra reduce-scatter of Ψ' b_G and then the inter step
//               of G = I; G = G: 0
//   t_syncp     once, after the update: P = O: 0; P = N, O = I: intra allgather of Ψ' b_P; P = N, O = G: allgather
//               over all n; P = I, O = G: inter allgather of Ψ'/m b_P
//   t_compute   given (the same for every strategy, so it sets T's size but not the choice)
//   t_optimizer the optimizer's elementwise pass over its shard, Ψ'/d_OS elements
// Memory per rank: model states b_P Ψ / d_P + b_G Ψ' / d_G + b_OS Ψ' / d_OS (train::model_state_memory) plus what
// every strategy holds alike (activations, workspace), given. Latencies are left out: the rule is about volumes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "train/strategy.h"

namespace strata::project {

struct ParoScenario {
  double parameters = 0;           // Ψ: the parameters a data-parallel rank's model holds
  double trainable = 0;            // Ψ': those with gradients and optimizer states
  double backward_parameters = 0;  // Ψ_b: those the backward pass gathers again (the layers it reaches)
  int ranks = 1;                   // n: data-parallel ranks
  int ranks_per_group = 1;         // m: ranks of one group (node); g = n / m
  int micro_batches = 1;           // A
  double intra_bandwidth = 0;      // B': B/s per rank, one direction
  double inter_bandwidth = 0;      // B
  train::StateBytes state_bytes = train::kMixedPrecisionStates;
  double param_element_bytes = 2;  // b_P: a parameter in collectives
  double grad_element_bytes = 2;   // b_G: a gradient in collectives
  double compute_s = 0;            // t_compute: one micro-batch's forward and backward
  double optimizer_s_per_element = 0;  // t_optimizer = (Ψ' / d_OS) x this
  double other_memory_bytes = 0;   // per rank, the same for every strategy (activations, workspace)
  double memory_limit = 0;         // B per rank; 0: no limit
};

struct ParoTerms {
  double compute_s = 0, param_s = 0, gradient_s = 0, syncg_s = 0, syncp_s = 0, optimizer_s = 0;
  int micro_batches = 1;
  double memory_bytes = 0;  // model states + the scenario's other memory
  bool fits = true;
  double total_s() const { return micro_batches * (compute_s + param_s + gradient_s) + syncg_s + syncp_s + optimizer_s; }
};

// The terms of one strategy. std::invalid_argument for a refused strategy (train::refusal_reason) or a scenario
// whose ranks do not form equal groups, or that has no positive bandwidth.
ParoTerms paro_terms(const train::Strategy& strategy, const ParoScenario& scenario);

struct ParoChoice {
  train::Strategy strategy;
  ParoTerms terms;
};

// The strategy of `candidates` (empty: train::runnable_strategies()) with the least T among those that fit;
// nothing when none fits. Ties go to the earlier candidate.
std::optional<ParoChoice> paro_choose(const ParoScenario& scenario, const std::vector<train::Strategy>& candidates = {});

}  // namespace strata::project
