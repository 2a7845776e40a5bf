// Recomputation overlapped with communication on the CPU step (see overlap.h).
#include "train/overlap.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "train/step_formulas.h"

namespace strata::train {

StepProfile profile_of(const StepStats& stats, int micro_batches) {
  StepProfile p;
  p.receive_waits = stats.receive_waits;
  p.forward_op_seconds = stats.forward_op_seconds;
  for (auto& chunk : p.forward_op_seconds)
    for (auto& layer : chunk)
      for (double& seconds : layer) seconds /= micro_batches;
  return p;
}

void recompute_everything(TrainConfig& c, int pp) {
  c.recompute = Recompute::overlap;
  c.kept_ops.clear();
  for (int layers : stage_partition(c.model, pp * c.virtual_stages, c.stage_layers))
    c.kept_ops.emplace_back(static_cast<std::size_t>(layers), KeptOps{false, false, false});
  c.window_recomputes.clear();
}

OverlapProblem overlap_problem(const TrainConfig& config, int pp, int pp_rank, int tp, bool sp, const StepProfile& profile,
                               double memory_limit_bytes, double slowdown) {
  TrainConfig c = config;
  recompute_everything(c, pp);
  const int stages = pp * c.virtual_stages;
  const std::vector<StagePlan> plans = rank_stages(c, pp, pp_rank);
  const PipelineShape shape{pp, c.accumulation, c.virtual_stages};
  const std::vector<PipelineAction> actions = pipeline_actions(c.schedule, shape, pp_rank);
  if (profile.receive_waits.size() != actions.size() || profile.forward_op_seconds.size() != plans.size())
    throw std::invalid_argument("recompute overlap: the profile is of another schedule or stage split");

  OverlapProblem out;
  PlacementProblem& problem = out.problem;
  problem.slowdown = slowdown;
  // Nothing kept: each layer's input and the head per set, and the recompute space, which the recomputed ops of
  // the micro-batch whose backward is next fill (they count against the limit themselves).
  const LayerActivationFloats floats = layer_activation_floats(c.model, c.micro_batch, c.seq, tp, sp);
  double allocated = 0, recompute_space = 0;
  for (const StagePlan& plan : plans) {
    allocated += activation_bytes(c.model, c.micro_batch, c.seq, Recompute::overlap, tp, sp, plan);
    recompute_space += 4 * plan.layers * (floats.op[0] + floats.op[1] + floats.op[2]);
  }
  const double base = allocated - recompute_space;
  problem.memory_limit_bytes = std::max(allocated, memory_limit_bytes);
  // Windows: the backwards that wait for a gradient, in schedule order.
  std::vector<int> window_of_action(actions.size(), -1);
  for (std::size_t k = 0; k < actions.size(); ++k) {
    const PipelineAction& a = actions[k];
    const int stage = stage_of(shape, pp_rank, a.chunk);
    if (a.pass != PipelineAction::Pass::backward || stage == stages - 1) continue;
    window_of_action[k] = static_cast<int>(problem.windows.size());
    problem.windows.push_back({"recv grad mb " + std::to_string(a.micro) + " stage " + std::to_string(stage),
                               profile.receive_waits[k], base});
    out.window_action.push_back(static_cast<int>(k));
  }
  const int windows = static_cast<int>(problem.windows.size());
  // The first window after action k.
  auto first_window_after = [&](std::size_t k) {
    for (std::size_t j = k + 1; j < actions.size(); ++j)
      if (window_of_action[j] >= 0) return window_of_action[j];
    return windows;
  };
  for (int micro = 0; micro < c.accumulation; ++micro)
    for (std::size_t chunk = 0; chunk < plans.size(); ++chunk) {
      std::size_t forward = 0, backward = 0;
      for (std::size_t k = 0; k < actions.size(); ++k)
        if (actions[k].micro == micro && actions[k].chunk == static_cast<int>(chunk))
          (actions[k].pass == PipelineAction::Pass::forward ? forward : backward) = k;
      const int deadline = window_of_action[backward] >= 0 ? window_of_action[backward] + 1 : first_window_after(backward);
      const int earliest = window_of_action[backward] >= 0 ? deadline - 1 : deadline;
      const StagePlan& plan = plans[chunk];
      for (int l = plan.first_layer; l < plan.first_layer + plan.layers; ++l)
        for (int o = 0; o < kLayerOps; ++o) {
          RecomputableOp op;
          op.name = "mb" + std::to_string(micro) + ".L" + std::to_string(l) + "." + name(static_cast<LayerOp>(o));
          op.layer = l;
          op.time_s = profile.forward_op_seconds[chunk][static_cast<std::size_t>(l - plan.first_layer)][static_cast<std::size_t>(o)];
          op.output_bytes = 4 * floats.op[static_cast<std::size_t>(o)];
          op.forward_window = std::min(first_window_after(forward), earliest);
          op.earliest_window = earliest;
          op.deadline_window = deadline;
          if (o > 0) op.producers.push_back(static_cast<int>(problem.ops.size()) - 1);  // core <- pre, post <- core
          problem.ops.push_back(std::move(op));
          out.ops.push_back({micro, static_cast<int>(chunk), l, static_cast<LayerOp>(o)});
        }
    }
  check_problem(problem);
  return out;
}

void apply_placement(const OverlapProblem& problem, const Placement& placement, int pp, int pp_rank, TrainConfig& c) {
  if (placement.size() != problem.ops.size())
    throw std::invalid_argument("recompute overlap: the placement decides " + std::to_string(placement.size()) + " ops of " +
                                std::to_string(problem.ops.size()));
  recompute_everything(c, pp);
  const std::vector<int> partition = stage_partition(c.model, pp * c.virtual_stages, c.stage_layers);
  std::vector<int> first_layer(partition.size(), 0);
  std::partial_sum(partition.begin(), partition.end() - 1, first_layer.begin() + 1);
  for (std::size_t i = 0; i < placement.size(); ++i) {
    const OverlapProblem::OpRef& ref = problem.ops[i];
    const std::size_t stage = static_cast<std::size_t>(stage_of({pp, c.accumulation, c.virtual_stages}, pp_rank, ref.chunk));
    const std::size_t layer = static_cast<std::size_t>(ref.layer - first_layer[stage]);
    if (placement[i].mode == RecomputeMode::keep) c.kept_ops[stage][layer][static_cast<std::size_t>(ref.op)] = true;
    if (placement[i].mode == RecomputeMode::window)
      c.window_recomputes.push_back({problem.window_action.at(static_cast<std::size_t>(placement[i].window)), ref.micro,
                                     ref.chunk, ref.layer, ref.op});
  }
  // An op kept for one micro-batch is kept for all (its space is in every set): none of them recomputes it.
  std::erase_if(c.window_recomputes, [&](const TrainConfig::WindowRecompute& w) {
    const std::size_t stage = static_cast<std::size_t>(stage_of({pp, c.accumulation, c.virtual_stages}, pp_rank, w.chunk));
    return c.kept_ops[stage][static_cast<std::size_t>(w.layer - first_layer[stage])][static_cast<std::size_t>(w.op)];
  });
}

std::vector<TrainConfig> placed_rank_configs(const TrainConfig& config, const coll::GridShape& grid,
                                             const std::function<Placement(const PlacementProblem&)>& placement_of) {
  const bool sp = config.sequence_parallel && grid.tp > 1;
  std::vector<TrainConfig> configs;
  for (int rank = 0; rank < grid.pp; ++rank) {
    TrainConfig c = config;
    recompute_everything(c, grid.pp);
    StepProfile profile;
    profile.receive_waits.assign(pipeline_actions(c.schedule, {grid.pp, c.accumulation, c.virtual_stages}, rank).size(), 0.0);
    for (const StagePlan& plan : rank_stages(c, grid.pp, rank))
      profile.forward_op_seconds.emplace_back(static_cast<std::size_t>(plan.layers), std::array<double, kLayerOps>{});
    const OverlapProblem problem = overlap_problem(c, grid.pp, rank, grid.tp, sp, profile);
    apply_placement(problem, placement_of(problem.problem), grid.pp, rank, c);
    configs.push_back(std::move(c));
  }
  return configs;
}

Placement agree(coll::ProcessGroups& groups, const Placement& placement) {
  std::vector<int32_t> flat;
  for (const OpPlacement& p : placement) flat.push_back(static_cast<int32_t>(p.mode)), flat.push_back(p.window);
  // The tensor-parallel group's first rank's, then the data-parallel group's first rank's (which holds its tensor-
  // parallel group's first rank's by then).
  for (coll::Group* group : {&groups.tp(), &groups.dp()})
    group->broadcast(coll::Algo::library, flat.data(), flat.size(), coll::DataType::int32, 0, coll::Waiting::at_once).wait();
  Placement agreed(placement.size());
  for (std::size_t i = 0; i < agreed.size(); ++i)
    agreed[i] = {static_cast<RecomputeMode>(flat[2 * i]), static_cast<int>(flat[2 * i + 1])};
  return agreed;
}

}  // namespace strata::train
