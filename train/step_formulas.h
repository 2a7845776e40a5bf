// What a data-parallel step should cost, from the model's shape and the strategy alone (research.md's table of
// collectives; metrics.md's memory rules): the bytes each rank sends per tier, and the bytes it holds per
// category. The step's measured figures are stored beside these, and the tests hold the two equal.
#pragma once

#include <cstddef>

#include "collectives/process_group.h"
#include "train/data_parallel.h"
#include "train/model_config.h"
#include "train/strategy.h"

namespace strata::train {

// The data-parallel layout as one rank sees it: n ranks in g groups of m, and whether its outgoing hop in
// the data-parallel ring (to dp rank + 1) crosses nodes.
struct DataParallelShape {
  int n = 1, m = 1, g = 1;
  int tp = 1;  // the tensor-parallel degree: each data-parallel rank holds a shard of the model
  bool dp_hop_crosses_nodes = false;
};
DataParallelShape data_parallel_shape(coll::ProcessGroups& groups);

// Bytes this rank sends per tier in one step when every collective is a ring (Strata's `ring` algorithm):
// a ring allgather or reduce-scatter of a buffer of B bytes over k ranks sends (k-1)/k B, an allreduce twice
// that, all on the tier of the rank's outgoing hop (intra group: inside the node; inter group: across;
// the global group, ordered by piece l g + k, crosses nodes at every hop when g > 1). The collectives:
//   P sharded: each unit gathered in forward, each layer the backward reaches gathered again (the
//              embeddings and the final norm stay from forward), per micro-batch;
//   G sharded: each trainable unit reduce-scattered over G's group per micro-batch, and for G = I at the
//              last micro-batch across nodes (allreduce of the intra shard for O = I, reduce-scatter for G);
//   G = N:     at the last micro-batch, allreduce over all ranks (O = N), or an intra reduce-scatter
//              and then the across-node step of G = I;
//   P != O:    after the update, the parameter holders gather the optimizer's shards (intra for N/I,
//              global for N/G, inter for I/G).
// Units are padded to a multiple of n, as the step pads them. The scalar reductions (loss, gradient norm)
// are left out.
coll::Traffic expected_traffic(const ModelConfig& model, const Trainable& trainable, const Strategy& strategy,
                               const DataParallelShape& shape, int accumulation);

// Bytes of the activations the CPU model keeps for its backward pass (fp32, flash attention so no (T, T)
// scores; N = B T rows, C hidden, Q = (a + 2 kv) D, KV = kv D, F the MLP width, a heads), with
// A = 9 C + Q + 2 KV + 2 F + a + 4 one layer's and H = 2 C + V + 6 the head's:
//   none       4 N (L A + H)
//   full       4 N (L C + (A - C) + H)            each layer's input, and one layer's space to recompute in
//   selective  4 N (L (A - 2 C - 2 KV - a) + 2 C + 2 KV + a + H)   the attention core (q, k, v, its output and
//                                                 log-sum-exp) in one layer's space
// per layer the inputs of each GEMM, norm statistics, q/k/v, the attention output and its log-sum-exp, the MLP
// pre- and post-GELU; for the head the final norm and the logits.
// Under tensor parallelism (tp > 1) the channels of one rank's shard replace C in the attention (q, the
// attention output and its merged copy), Q, KV, F, a and V; the residual stream stays C wide.
// Sequence parallelism (sp) keeps the residual stream and the norms' statistics of N / tp rows (R) and the
// gathered norm outputs of all N: per layer N (4 C + 3 A + Q + 2 KV + 2 F + a) + R (2 C + 4), the head
// R (C + 2) + N (C + V + 4).
double activation_bytes(const ModelConfig& model, int micro_batch, int seq, Recompute recompute = Recompute::none,
                        int tp = 1, bool sp = false);
// FLOPs per token that recomputation adds to the model FLOPs in backward, in model_flops_per_token's
// convention (2 per multiply-add of each weight, 2 L h s for attention's forward): full, every layer's
// forward, 2 N_layers + 2 L h s; selective, the attention core, 2 L h s; none, 0.
double recompute_flops_per_token(const ModelConfig& model, int seq, Recompute recompute);
// The workspace the backward pass reuses for every layer: 4 N (6 C + Q + 2 KV + 2 F) + 8 C bytes; under tensor
// parallelism 4 N (3 C + 3 A + Q + 2 KV + 2 F) + 8 C with the shard's A (attention channels), Q, KV, F.
// Sequence parallelism: the residual stream's gradients of R rows, and a gathered one of N plus 2 C for the norms'
// gradients: 4 (2 R C + 2 N C + N (3 A + Q + 2 KV + 2 F) + 2 C) + 8 C.
double workspace_bytes(const ModelConfig& model, int micro_batch, int seq, int tp = 1, bool sp = false);

// What a rank is expected to hold, per category, before anything is allocated. Model states follow
// model_state_memory (fp32: 4, 4, 8 bytes); activations and workspace the formulas above; communication
// buffers are a bound, in units of the largest padded unit: four when parameters are gathered (this unit, the
// next, the embeddings and the final norm), four more when gradients are reduced per micro-batch (the unit
// being written, those still being reduced, their reduction targets), and Ψ'/m when an unsharded gradient is
// first reduce-scattered inside the node.
MemoryUse memory_estimate(const DataParallelConfig& config, const DataParallelShape& shape);

}  // namespace strata::train
