// Which layers each pipeline stage runs. `uniform` gives every stage L / S layers; `balanced` (recomputation-aware,
// as Lynx's later version partitions) moves layers between stages so that the slowest stage's time, recomputation
// included, is least: stages take contiguous layers in order, the first stage also runs the embeddings and the last
// the head, and a stage may be refused for memory.
#pragma once

#include <mpi.h>

#include <functional>
#include <vector>

namespace strata::train {

// The time of running layers [first, end) as stage `stage` of S (its embeddings or head included when it is the
// first or the last), and whether that stage fits in memory.
struct StageCost {
  std::function<double(int stage, int first, int end)> seconds;
  std::function<bool(int stage, int first, int end)> fits;  // empty: everything fits
};

// The layers per stage (each >= 1, summing to `layers`) whose slowest stage is fastest, by dynamic programming
// over contiguous splits (exact); ties go to the split that puts more layers on earlier stages.
// std::invalid_argument when fewer layers than stages or no split fits.
std::vector<int> balanced_partition(int layers, int stages, const StageCost& cost);

// As even as the layers allow: the remainder of L / S to the earliest stages.
std::vector<int> even_partition(int layers, int stages);

// Per-layer times of a measured step and the extras of the first and last stage, from which StageCost's seconds
// is the sum over the stage's layers plus its extras. recompute: per layer, the recomputation on the critical
// path (all of it when on demand; under overlap what the measured stage could not hide in its windows, spread over
// its layers); empty for none.
struct LayerCosts {
  std::vector<double> forward, backward, recompute;  // per layer: one step's worth, over its micro-batches
  double embedding = 0, head = 0;                   // the first stage's lookup, the last stage's norm, head and loss
  StageCost cost() const;
};

struct StepStats;
struct StagePlan;
struct ModelConfig;

// The costs of a measured step: every layer's times from the pipeline rank that ran it (the slowest of its
// tensor- and data-parallel replicas), on every rank. Collective over `comm` (the world).
LayerCosts layer_costs(const StepStats& stats, const std::vector<StagePlan>& stages, const ModelConfig& model,
                       MPI_Comm comm);

}  // namespace strata::train
