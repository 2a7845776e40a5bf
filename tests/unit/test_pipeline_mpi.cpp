// Pipeline parallelism, composed with tensor parallelism and the data-parallel strategies, against the
// single-rank step of the same global batch (single_rank_step.h), under mpirun at 2, 4 and 8 ranks: the same loss
// and gradient norm at every step and, on each rank, its tensor-parallel shard of the single-rank step's parameters
// after three steps, for every schedule, recomputation mode and a hand-set stage split, with accumulation and
// clipping on.
//
// Tolerance as test_data_parallel_mpi.cpp derives it (both sides fp32, differing only in the order of sums: here
// also the token table's gradient, summed from the first stage's lookup and the last stage's head): loss 1e-5
// relative, norm 1e-4 relative, parameters 2e-5 absolute. A stage that ran the wrong micro-batch, a gradient
// sent to the wrong stage or missed, or a token table copy left behind moves the loss by 1e-3 or more.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "tests/unit/single_rank_step.h"
#include "train/overlap.h"
#include "train/step_formulas.h"

namespace strata::train {
namespace {

TrainConfig base_config() { return check_config("pp-check", 4, 4, 13); }

struct GridCase {
  coll::GridShape grid;
  Schedule schedule = Schedule::one_f_one_b;
  int virtual_stages = 1;
  const char* strategy = "NNN";
  Recompute recompute = Recompute::none;
  bool sp = false;
  std::vector<int> stage_layers = {};
  const char* trainable = "all";
  int ranks_per_node = 0;
};

std::string describe(const GridCase& g) {
  return coll::format_grid(g.grid) + " " + name(g.schedule) + (g.virtual_stages > 1 ? " v" + std::to_string(g.virtual_stages) : "") +
         " " + g.strategy + " recompute " + name(g.recompute) + (g.sp ? " sp" : "") + " trainable " + g.trainable +
         (g.stage_layers.empty() ? "" : " uneven stages");
}

// The configuration of a case, on Strata's ring (which counts the bytes it sends).
TrainConfig config_of(const GridCase& g) {
  TrainConfig c = base_config();
  c.strategy = parse_strategy(g.strategy), c.comm_algo = coll::Algo::ring;
  c.schedule = g.schedule, c.virtual_stages = g.virtual_stages, c.stage_layers = g.stage_layers;
  c.recompute = g.recompute, c.sequence_parallel = g.sp, c.trainable = parse_trainable(g.trainable);
  return c;
}

std::vector<GridCase> cases(int n) {
  using S = Schedule;
  using R = Recompute;
  if (n == 2)
    return {{{1, 2, 1}, S::gpipe},
            {{1, 2, 1}, S::one_f_one_b},
            {{1, 2, 1}, S::interleaved, 2},
            {{1, 2, 1}, S::one_f_one_b, 1, "NNN", R::full},
            {{1, 2, 1}, S::interleaved, 2, "NNN", R::selective},
            {{1, 2, 1}, S::one_f_one_b, 1, "NNN", R::none, false, {1, 3}},
            {{1, 2, 1}, S::one_f_one_b, 1, "NNN", R::none, false, {3, 1}, "last:1"},
            {{1, 2, 1}, S::gpipe, 1, "NNN", R::none, false, {1, 3}, "last:2"}};
  if (n == 4)
    return {{{1, 2, 2}, S::one_f_one_b, 1, "NNG"},
            {{1, 2, 2}, S::interleaved, 2, "GGG"},
            {{1, 2, 2}, S::gpipe, 1, "NGG", R::full},
            {{1, 4, 1}, S::one_f_one_b},
            {{2, 2, 1}, S::one_f_one_b, 1, "NNN", R::none, true},
            {{2, 2, 1}, S::interleaved, 2, "NNN", R::full}};
  if (n == 8)
    return {{{2, 2, 2}, S::one_f_one_b, 1, "NIG", R::none, false, {}, "all", 4},
            {{2, 2, 2}, S::interleaved, 2, "IIG", R::selective, true, {}, "all", 4},
            {{1, 2, 4}, S::one_f_one_b, 1, "ING", R::none, false, {}, "last:2", 4}};
  return {};
}

TEST(Pipeline, EveryScheduleAndGridMatchesTheSingleRankStep) {
  const int n = world_size(), steps = 3;
  const std::vector<GridCase> all = cases(n);
  if (all.empty()) GTEST_SKIP() << "cases for 2, 4 and 8 ranks";
  const auto data = synthetic_tokens(64, 5);
  for (const GridCase& g : all) {
    const std::string what = describe(g);
    TrainConfig c = config_of(g);
    c.comm_algo = coll::Algo::library;
    const Reference ref = single_rank(c, g.grid.dp, steps, *data);
    coll::ProcessGroups groups(g.grid, g.ranks_per_node);
    Trainer trainer(c, groups, *data);
    for (int step = 1; step <= steps; ++step) {
      const StepStats stats = trainer.step(step);
      EXPECT_NEAR(stats.loss, ref.losses[static_cast<std::size_t>(step) - 1], 1e-5 * ref.losses[0]) << what << " step " << step;
      EXPECT_NEAR(stats.grad_norm, ref.norms[static_cast<std::size_t>(step) - 1], 1e-4 * ref.norms[0]) << what << " step " << step;
      if (groups.pp_index() + 1 < g.grid.pp) {  // every stage but the last sends its activations on
        EXPECT_GT(stats.pipeline.sends, 0) << what;
      }
    }
    EXPECT_TRUE(parameters_match(c.model, g.grid.tp, groups.tp_index(), ref, trainer.full_parameters(), 2e-5)) << what;
  }
}

// On Strata's ring every data-parallel collective counts its bytes, and the pipeline counts what it sends: both
// must be the formulas (train/step_formulas.h) for the units and stages each rank holds. Activations and workspace
// are their formulas exactly (with the schedule's micro-batches in flight), model states up to padding, and the
// communication buffers stay within their bound.
TEST(Pipeline, BytesAndMemoryAreTheFormulas) {
  const int n = world_size();
  const std::vector<GridCase> all = cases(n);
  if (all.empty()) GTEST_SKIP() << "cases for 2, 4 and 8 ranks";
  const auto data = synthetic_tokens(64, 5);
  for (const GridCase& g : all) {
    const std::string what = describe(g);
    const TrainConfig c = config_of(g);
    coll::ProcessGroups groups(g.grid, g.ranks_per_node);
    const DataParallelShape shape = data_parallel_shape(groups);
    Trainer trainer(c, groups, *data);
    trainer.step(1);
    const StepStats stats = trainer.step(2);
    const coll::Traffic formula = expected_traffic(c, shape);
    EXPECT_DOUBLE_EQ(stats.traffic.intra_bytes, formula.intra_bytes) << what;
    EXPECT_DOUBLE_EQ(stats.traffic.inter_bytes, formula.inter_bytes) << what;
    EXPECT_DOUBLE_EQ(stats.pipeline.sent_bytes, pipeline_sent_bytes(c, shape)) << what;
    const MemoryUse used = trainer.memory(), estimate = memory_estimate(c, shape);
    EXPECT_DOUBLE_EQ(used.activations, estimate.activations) << what;
    EXPECT_DOUBLE_EQ(used.workspace, estimate.workspace) << what;
    EXPECT_LE(used.comm_buffers, estimate.comm_buffers) << what;
    const double slack = 4.0 * (c.model.layers + 2) * shape.n * 3;  // each unit padded to a multiple of n
    EXPECT_NEAR(used.params, estimate.params, slack) << what;
    EXPECT_NEAR(used.grads, estimate.grads, slack) << what;
    EXPECT_NEAR(used.optimizer, estimate.optimizer, 2 * slack) << what;
  }
}

// The traced step (trace_step, run without MPI for a grid of any size) holds what the running step launches: every
// collective of the data-parallel strategy and of tensor parallelism and every pipeline transfer, by name, on
// the ranks traced (the first tensor- and data-parallel rank of each stage); the scalar reductions of the loss and
// the norm and the token table's sum between the stages are the trace's alone (the timeline leaves them out).
TEST(Pipeline, TheTraceHoldsWhatTheStepRuns) {
  const int n = world_size();
  const std::vector<GridCase> all = cases(n);
  if (all.empty()) GTEST_SKIP() << "cases for 2, 4 and 8 ranks";
  const auto data = synthetic_tokens(64, 5);
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  for (const GridCase& g : all) {
    const std::string what = describe(g);
    const TrainConfig c = config_of(g);
    coll::ProcessGroups groups(g.grid, g.ranks_per_node);
    Trainer trainer(c, groups, *data);
    const StepStats stats = trainer.step(1, true);
    std::map<std::string, int> ran;
    for (const TimelineEvent& e : stats.timeline)
      if (e.stream == "comm") ++ran[e.operation];
    const StepTrace trace = trace_step(c, g.grid, {g.ranks_per_node > 0 ? g.ranks_per_node : n, "tp,pp,dp", {}});
    for (const TraceRank& rank : trace.ranks) {
      if (rank.rank != me) continue;
      std::map<std::string, int> traced;
      for (const TraceOp& op : rank.ops)
        if (op.kind != TraceOpKind::gemm && op.kind != TraceOpKind::attention && op.kind != TraceOpKind::elementwise &&
            op.name != "allreduce norm" && op.name != "allreduce loss" && op.name != "allreduce embedding grads")
          ++traced[std::string(op.name)];
      EXPECT_EQ(traced, ran) << what << ": rank " << me;
    }
  }
}

// Recomputation overlapped with communication: a placement built from a measured step (every op recomputed in
// the window before its backward where there is one, on demand elsewhere; and Lynx's heuristic's, agreed over
// the tensor-parallel group) trains exactly as keeping everything, with tensor-parallel collectives and sharded
// parameter gathers inside the windows, and the windows really run.
TEST(Pipeline, OverlappedRecomputationMatchesTheSingleRankStep) {
  const int n = world_size(), steps = 3;
  std::vector<GridCase> all;
  using S = Schedule;
  if (n == 2) all = {{{1, 2, 1}, S::one_f_one_b}, {{1, 2, 1}, S::gpipe}};
  if (n == 4) all = {{{2, 2, 1}, S::one_f_one_b, 1, "NNN", Recompute::overlap, true}, {{1, 2, 2}, S::one_f_one_b, 1, "GGG"}};
  if (n == 8) all = {{{2, 2, 2}, S::interleaved, 2, "NIG", Recompute::overlap, false, {}, "all", 4}};
  if (all.empty()) GTEST_SKIP() << "cases for 2, 4 and 8 ranks";
  const auto data = synthetic_tokens(64, 5);
  for (const GridCase& g : all)
    for (bool heuristic : {false, true}) {
      const std::string what = describe(g) + (heuristic ? " heuristic placement" : " every op in its window");
      TrainConfig c = base_config();
      c.strategy = parse_strategy(g.strategy);
      c.schedule = g.schedule, c.virtual_stages = g.virtual_stages, c.sequence_parallel = g.sp;
      const Reference ref = single_rank(c, g.grid.dp, steps, *data);
      coll::ProcessGroups groups(g.grid, g.ranks_per_node);
      TrainConfig profiled = c;
      profiled.recompute = Recompute::full;
      StepProfile profile;
      {
        Trainer measuring(profiled, groups, *data);
        profile = profile_of(measuring.step(1), c.accumulation);
      }
      const OverlapProblem problem = overlap_problem(c, g.grid.pp, groups.pp_index(), g.grid.tp, g.sp, profile);
      Placement placement;
      if (heuristic) {
        // Ranks of a stage measure different windows and may place differently: another data-parallel rank's own
        // placement is everything on demand, and only the agreement makes the stage run one placement (its
        // windows gather sharded layers, which the data-parallel ranks must do in the same order).
        placement = solve_heuristic(problem.problem).placement;
        if (groups.dp_index() != 0)
          for (OpPlacement& p : placement) p = {RecomputeMode::on_demand, -1};
        placement = agree(groups, placement);
      } else {
        for (const RecomputableOp& op : problem.problem.ops)
          placement.push_back(op.earliest_window < op.deadline_window ? OpPlacement{RecomputeMode::window, op.earliest_window}
                                                                     : OpPlacement{RecomputeMode::on_demand, -1});
      }
      if (heuristic) {
        // The stage runs its first rank's placement, solved on that rank's measured windows: on the other ranks a
        // window measured shorter may be overfilled (the excess runs on the critical path), the rest holds.
        PlacementProblem check = problem.problem;
        if (groups.tp_index() != 0 || groups.dp_index() != 0)
          for (RecomputeWindow& w : check.windows) w.capacity_s = 1e30;
        EXPECT_FALSE(find_violation(check, placement).has_value()) << what << ": " << find_violation(check, placement).value_or("");
      }
      // Where every op has a window before its backward, each is recomputed there and none again on demand (a
      // recomputation run before another action, a forward between it and its backward, is redone on demand).
      const bool every_op_in_a_window =
          !heuristic && std::all_of(placement.begin(), placement.end(), [](const OpPlacement& p) { return p.mode == RecomputeMode::window; });
      apply_placement(problem, placement, g.grid.pp, groups.pp_index(), c);
      Trainer trainer(c, groups, *data);
      double in_windows = 0;
      for (int step = 1; step <= steps; ++step) {
        const StepStats stats = trainer.step(step);
        in_windows += stats.recompute_window_seconds;
        if (every_op_in_a_window) {
          EXPECT_EQ(stats.recompute_seconds, 0.0) << what << " step " << step << ": recomputed on demand again";
        }
        EXPECT_NEAR(stats.loss, ref.losses[static_cast<std::size_t>(step) - 1], 1e-5 * ref.losses[0]) << what << " step " << step;
        EXPECT_NEAR(stats.grad_norm, ref.norms[static_cast<std::size_t>(step) - 1], 1e-4 * ref.norms[0]) << what << " step " << step;
      }
      if (!heuristic && !problem.problem.windows.empty()) {
        EXPECT_GT(in_windows, 0) << what << ": nothing ran in the windows";
      }
      EXPECT_TRUE(parameters_match(c.model, g.grid.tp, groups.tp_index(), ref, trainer.full_parameters(), 2e-5)) << what;
    }
}

}  // namespace
}  // namespace strata::train
