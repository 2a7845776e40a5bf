// Stage partitioning (see partition.h).
#include "train/partition.h"

#include <limits>
#include <stdexcept>
#include <string>

#include "collectives/mpi_error.h"
#include "train/trainer.h"

namespace strata::train {

std::vector<int> even_partition(int layers, int stages) {
  if (stages < 1 || layers < stages)
    throw std::invalid_argument(std::to_string(layers) + " layers cannot fill " + std::to_string(stages) + " stages");
  std::vector<int> split(static_cast<std::size_t>(stages), layers / stages);
  for (int s = 0; s < layers % stages; ++s) ++split[static_cast<std::size_t>(s)];
  return split;
}

std::vector<int> balanced_partition(int layers, int stages, const StageCost& cost) {
  if (stages < 1 || layers < stages)
    throw std::invalid_argument(std::to_string(layers) + " layers cannot fill " + std::to_string(stages) + " stages");
  constexpr double kNone = std::numeric_limits<double>::infinity();
  // best[s][e]: the least slowest-stage time of stages 0..s-1 covering layers [0, e); from[s][e]: where stage
  // s - 1 starts in that split.
  std::vector<std::vector<double>> best(static_cast<std::size_t>(stages) + 1, std::vector<double>(static_cast<std::size_t>(layers) + 1, kNone));
  std::vector<std::vector<int>> from(best.size(), std::vector<int>(best[0].size(), -1));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int e = s; e <= layers - (stages - s); ++e)
      // Later starts first, so an equal split keeps the one with more layers on earlier stages.
      for (int b = e - 1; b >= s - 1; --b) {
        const double before = best[static_cast<std::size_t>(s) - 1][static_cast<std::size_t>(b)];
        if (before == kNone || (cost.fits && !cost.fits(s - 1, b, e))) continue;
        const double slowest = std::max(before, cost.seconds(s - 1, b, e));
        if (slowest < best[static_cast<std::size_t>(s)][static_cast<std::size_t>(e)]) {
          best[static_cast<std::size_t>(s)][static_cast<std::size_t>(e)] = slowest;
          from[static_cast<std::size_t>(s)][static_cast<std::size_t>(e)] = b;
        }
      }
  if (best[static_cast<std::size_t>(stages)][static_cast<std::size_t>(layers)] == kNone)
    throw std::invalid_argument("no split of " + std::to_string(layers) + " layers into " + std::to_string(stages) +
                                " stages fits in memory");
  std::vector<int> split(static_cast<std::size_t>(stages));
  for (int s = stages, e = layers; s > 0; --s) {
    const int b = from[static_cast<std::size_t>(s)][static_cast<std::size_t>(e)];
    split[static_cast<std::size_t>(s) - 1] = e - b;
    e = b;
  }
  return split;
}

StageCost LayerCosts::cost() const {
  StageCost c;
  c.seconds = [this](int stage, int first, int end) {
    double t = 0;
    for (int l = first; l < end; ++l) {
      const std::size_t i = static_cast<std::size_t>(l);
      t += forward[i] + backward[i] + (recompute.empty() ? 0 : recompute[i]);
    }
    if (stage == 0) t += embedding;
    if (end == static_cast<int>(forward.size())) t += head;
    return t;
  };
  return c;
}

LayerCosts layer_costs(const StepStats& stats, const std::vector<StagePlan>& stages, const ModelConfig& model, MPI_Comm comm) {
  const std::size_t L = static_cast<std::size_t>(model.layers);
  // forward, backward and recompute per layer, then the embeddings and the head: the holder's figures, zeros
  // elsewhere, the largest over the ranks.
  std::vector<double> all(3 * L + 2, 0.0);
  for (std::size_t chunk = 0; chunk < stages.size(); ++chunk) {
    const StagePlan& plan = stages[chunk];
    for (int i = 0; i < plan.layers; ++i) {
      const std::size_t l = static_cast<std::size_t>(plan.first_layer + i), at = static_cast<std::size_t>(i);
      const auto& ops = stats.forward_op_seconds[chunk][at];
      all[l] = ops[0] + ops[1] + ops[2];
      all[L + l] = stats.layer_backward_seconds[chunk][at];
      all[2 * L + l] = stats.layer_recompute_seconds[chunk][at];
    }
    if (plan.embedding && !plan.head) all[3 * L] = stats.stage_extra_seconds[chunk];
    if (plan.head && !plan.embedding) all[3 * L + 1] = stats.stage_extra_seconds[chunk];
    if (plan.head && plan.embedding) all[3 * L + 1] = stats.stage_extra_seconds[chunk];  // one stage: all its extras
  }
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, all.data(), static_cast<int>(all.size()), MPI_DOUBLE, MPI_MAX, comm));
  LayerCosts costs;
  costs.forward.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(L));
  costs.backward.assign(all.begin() + static_cast<std::ptrdiff_t>(L), all.begin() + static_cast<std::ptrdiff_t>(2 * L));
  costs.recompute.assign(all.begin() + static_cast<std::ptrdiff_t>(2 * L), all.begin() + static_cast<std::ptrdiff_t>(3 * L));
  costs.embedding = all[3 * L], costs.head = all[3 * L + 1];
  return costs;
}

}  // namespace strata::train
