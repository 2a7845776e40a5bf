// What a training step should cost, from the model's shape, the grid, the schedule and the strategy alone
// (docs/strategies.md's table of collectives; docs/metrics.md's memory rules): the bytes each rank sends per tier and to other
// pipeline stages, and the bytes it holds per category. The step's measured figures are stored beside these, and
// the tests hold the two equal.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "collectives/process_group.h"
#include "train/trainer.h"
#include "train/gpt.h"
#include "train/model_config.h"
#include "train/strategy.h"

namespace strata::train {

// The data-parallel layout as one rank sees it: n ranks in g groups of m, and whether its outgoing hop in
// the data-parallel ring (to dp rank + 1) crosses nodes.
struct DataParallelShape {
  int n = 1, m = 1, g = 1;
  int tp = 1;  // the tensor-parallel degree: each data-parallel rank holds a shard of the model
  int pp = 1, pp_rank = 0;  // the pipeline: each data-parallel group runs the stages of one pipeline rank
  bool dp_hop_crosses_nodes = false;
  bool even = true;  // every node the group uses holds m of its ranks (PaRO's intra and inter groups need it)
};
DataParallelShape data_parallel_shape(coll::ProcessGroups& groups);
// The layout of pipeline rank `stage`'s first rank (tp 0, dp 0) in a job of `grid` on nodes of `ranks_per_node`, the
// grid laid out in `order` as coll::ProcessGroups lays it out (rank r on node r / ranks_per_node): what
// data_parallel_shape reads from those groups, worked out arithmetically (no groups are built: the search asks it of
// every candidate; a unit test holds the two equal).
DataParallelShape stage_data_parallel_shape(const coll::GridShape& grid, int ranks_per_node, const std::string& order,
                                            int stage);

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
// are left out. With a pipeline, only the units of the rank's stages count (the last stage's copy of the token
// table as a unit of its own), and a stage's backward reaches down to its first layer when an earlier stage
// trains.
coll::Traffic expected_traffic(const TrainConfig& config, const DataParallelShape& shape);

// Bytes this rank sends to other pipeline stages in one step: each of its stages but the last sends its output,
// (R, C) floats per micro-batch, and each stage below which something trains sends its input's gradient back,
// as much; R = micro-batch x sequence rows (over tp under sequence parallelism).
double pipeline_sent_bytes(const TrainConfig& config, const DataParallelShape& shape);

// Floats of one layer's activations on one rank for one micro-batch (fp32, flash attention so no (T, T) scores;
// N = B T rows, R the rows of the residual stream held here (N, or N / tp under sequence parallelism), C hidden;
// under tensor parallelism the shard's A = heads x D, Q = (heads + 2 kv) D, KV = kv D, F the MLP width, a heads,
// V the vocabulary rows): the layer's input R C (always kept), and per op (gpt.h's LayerOp)
//   pre   N C + 2 R + N Q             ln1, its mean and rstd, qkv
//   core  2 N A + 2 N KV + N a        q, k, v in head layout, the attention output, its log-sum-exp
//   post  N A + 3 N C + R C + 2 R + 2 N F   the merged attention output, its projection, x_mid, ln2 and its
//                                     statistics, the MLP's pre- and post-GELU and its output
// one layer in all N (4 C + 3 A + Q + 2 KV + 2 F + a) + R (2 C + 4); the head R (C + 2) + N (C + V + 4) (the last
// layer's output, the final norm, its statistics, the logits, losses and row statistics); a stage without the
// head holds its output R C instead.
struct LayerActivationFloats {
  double input = 0;
  std::array<double, kLayerOps> op{};
  double head = 0, stage_output = 0;
};
LayerActivationFloats layer_activation_floats(const ModelConfig& model, int micro_batch, int seq, int tp = 1, bool sp = false);

// Bytes of the activations a stage of the CPU model keeps for its backward pass (4 per float):
//   sets x (each layer's input and kept ops + the head or the stage's output)
//   + the recomputed ops' space: one layer's (the largest) for full and selective, every layer's own for overlap
// with sets the micro-batches in flight (StagePlan::activation_sets). For the whole model on one set, with
// one layer's floats A and the head's H (docs/metrics.md's per-layer formula is Korthikanti's 16-bit count with
// dropout masks and materialised scores; this model is fp32 with flash attention and no dropout):
//   none       4 (L A + H)
//   full       4 (L R C + (A - R C) + H)
//   selective  4 (L (A - core) + core + H)
double activation_bytes(const ModelConfig& model, int micro_batch, int seq, Recompute recompute = Recompute::none,
                        int tp = 1, bool sp = false, const StagePlan& stage = {});
// FLOPs per token of each op of one layer's forward, in model_flops_per_token's convention (2 per multiply-add
// of each weight, 2 h s for causal attention's forward): pre 2 (2 h + Q h + Q), core 2 h s, post
// 2 (h^2 + h + 2 h + F h + F + h F + h); together 2 N_layer + 2 h s.
std::array<double, kLayerOps> op_flops_per_token(const ModelConfig& model, int seq);
// FLOPs per token that recomputation adds to the model FLOPs in backward: each op not kept, once per layer
// (full 2 N_layers + 2 L h s, selective 2 L h s, none 0; overlap: the ops kept_ops, per stage and layer, does
// not keep, whether recomputed in a window or on demand).
double recompute_flops_per_token(const ModelConfig& model, int seq, Recompute recompute,
                                 const std::vector<std::vector<KeptOps>>& kept_ops = {});
// The workspace the backward pass reuses for every layer: 4 N (6 C + Q + 2 KV + 2 F) + 8 C bytes; under tensor
// parallelism 4 N (3 C + 3 A + Q + 2 KV + 2 F) + 8 C with the shard's A (attention channels), Q, KV, F.
// Sequence parallelism: the residual stream's gradients of R rows, and a gathered one of N plus 2 C for the norms'
// gradients: 4 (2 R C + 2 N C + N (3 A + Q + 2 KV + 2 F) + 2 C) + 8 C.
double workspace_bytes(const ModelConfig& model, int micro_batch, int seq, int tp = 1, bool sp = false);

// What a rank is expected to hold, per category, before anything is allocated, for the units and stages it
// runs. Model states follow model_state_memory (fp32: 4, 4, 8 bytes) on the units the rank holds; activations
// the formula above for each of its stages and workspace one per stage; communication buffers are a bound, in
// units of the largest padded unit: four when parameters are gathered (this unit, the next, the embeddings and
// the final norm), four more when gradients are reduced per micro-batch (the unit being written, those still
// being reduced, their reduction targets; whole gradients are reduced in place in their store); with a pipeline,
// per stage the received gradient of its output and copies of its input's gradient waiting for the stage below,
// one per micro-batch in flight there (one more than here in 1F1B), (R, C) floats each.
MemoryUse memory_estimate(const TrainConfig& config, const DataParallelShape& shape);
// The data-parallel part of those communication buffers (fp32), the same for every pipeline layout: the parameter
// gathers' and the gradient reductions' (which a mixed-precision step may hold in another element size), and both.
struct DataParallelBuffers {
  double gathers = 0, reductions = 0;
  double total() const { return gathers + reductions; }
};
DataParallelBuffers data_parallel_buffers(const TrainConfig& config, const DataParallelShape& shape);
inline double data_parallel_buffer_bytes(const TrainConfig& config, const DataParallelShape& shape) {
  return data_parallel_buffers(config, shape).total();
}
// Of the units a rank holds, in elements: their parameters, the trainable ones among them, the largest unit and the
// largest layer unit padded to the data-parallel degree as the step gathers them, the embeddings' and final norm's
// units together (padded likewise), and the largest single tensor (a weight matrix, or the token table).
struct HeldSizes {
  double parameters = 0, trainable = 0, largest_unit = 0, largest_layer = 0, outer_units = 0, largest_tensor = 0;
};
HeldSizes held_sizes(const TrainConfig& config, const DataParallelShape& shape);

}  // namespace strata::train
