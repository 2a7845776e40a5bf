// Recomputation overlapped with communication (`--recompute overlap`, Lynx, docs/strategies.md#overlapped-recomputation-lynx) on this CPU
// step: one pipeline rank's placement problem (recompute_placement.h) built from a measured step, and the
// trainer's configuration from a placement. The construction is our derivation; docs/design/training.md says so.
//
// Windows. On this executor a rank waits, with nothing else to run, for the gradient of a stage's output before
// that micro-batch's backward (1F1B's warm-up, steady and cool-down phases; GPipe's backward phase): each such
// wait is a window, its length measured in a step that recomputes every op on demand (full recomputation, the
// baseline). The tensor-parallel collectives block inside the passes, and the data-parallel reductions overlap
// backward with their final wait after the last backward, when nothing is left to recompute: neither offers a
// window here.
// Ops. Each layer of each micro-batch has three recomputable ops (gpt.h's LayerOp: pre, core, post; core reads
// pre's qkv, post reads core's output), each timed in the measured step's forward. A stage holds one
// micro-batch's recomputed ops at a time (its layers' recompute space), so micro-batch i's ops may be recomputed
// only in the window right before its own backward, if that backward waits for a gradient at all.
// Memory. The base at every window is what the rank holds whatever is decided: each layer's input and the head,
// per micro-batch in flight. The limit is that plus the recompute space, which the ops recomputed in a window fill,
// unless the caller gives more; a kept op costs its output from its forward to its backward, and the trainer keeps
// an op of a layer for every micro-batch (its space is in every set) when the placement keeps it for any, which
// can hold more than the placement counted.
#pragma once

#include <functional>
#include <vector>

#include "collectives/process_group.h"
#include "train/recompute_placement.h"
#include "train/trainer.h"

namespace strata::train {

// What a measured step tells the placement, on one pipeline rank.
struct StepProfile {
  std::vector<double> receive_waits;  // per action of the rank's schedule (StepStats::receive_waits)
  std::vector<std::vector<std::array<double, kLayerOps>>> forward_op_seconds;  // per chunk, layer, op; per micro-batch
};
// The profile of a step, its op times averaged over its micro-batches.
StepProfile profile_of(const StepStats& stats, int micro_batches);

struct OverlapProblem {
  PlacementProblem problem;
  // Per op of the problem: its micro-batch, chunk, layer and op; per window, the action it precedes.
  struct OpRef {
    int micro = 0, chunk = 0, layer = 0;
    LayerOp op = LayerOp::pre;
  };
  std::vector<OpRef> ops;
  std::vector<int> window_action;
};

// Recompute::overlap with nothing kept and nothing in windows (every op recomputed on demand into its layer's
// space): the configuration a memory estimate is made for before a placement exists.
void recompute_everything(TrainConfig& config, int pp);

// The problem of pipeline rank `pp_rank` under `config` (whose recompute mode is ignored), with the measured
// profile; memory_limit_bytes 0: the base (nothing may be kept). slowdown: compute in a window against alone.
OverlapProblem overlap_problem(const TrainConfig& config, int pp, int pp_rank, int tp, bool sp, const StepProfile& profile,
                               double memory_limit_bytes = 0, double slowdown = 1.0);

// The configuration that runs `placement` on pipeline rank `pp_rank`: recompute overlap, the kept ops of its
// stages (every other stage's entries all recomputed), and the recomputations in windows.
void apply_placement(const OverlapProblem& problem, const Placement& placement, int pp, int pp_rank, TrainConfig& config);

// Each pipeline rank's configuration under a stored placement (as strata-step stores it with an overlap case, and a
// prediction of that case reads it): the rank's ops and windows rebuilt from `config` and `grid` alone (no measured
// times: they matter only to a solver), then `placement_of` the rank's problem applied.
std::vector<TrainConfig> placed_rank_configs(const TrainConfig& config, const coll::GridShape& grid,
                                             const std::function<Placement(const PlacementProblem&)>& placement_of);

// The placement of the stage's first rank (tensor- and data-parallel coordinate 0) on every rank of the stage:
// recomputations in windows run collectives (tensor-parallel ones inside the ops, the gathers of sharded
// parameters before them), which every rank of those groups must start in the same order. Collective over the
// tensor-parallel and the data-parallel group.
Placement agree(coll::ProcessGroups& groups, const Placement& placement);

}  // namespace strata::train
