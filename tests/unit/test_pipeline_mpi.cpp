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

#include <cmath>
#include <map>
#include <string>

#include "tests/unit/single_rank_step.h"
#include "train/overlap.h"
#include "train/step_formulas.h"

namespace strata::train {
namespace {

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

TrainConfig base_config() {
  TrainConfig c;
  c.model.name = "pp-check";
  c.model.layers = 4, c.model.hidden = 32, c.model.heads = 4, c.model.kv_heads = 2, c.model.vocab = 64;
  c.model.max_seq = 16;
  c.micro_batch = 2, c.seq = 16, c.accumulation = 4;
  c.lr.max_lr = 1e-3f, c.lr.min_lr = 1e-3f;
  c.max_grad_norm = 0.5f;
  c.adamw.weight_decay = 0.1f;
  c.adamw.eps = 1e-6f;
  c.seed = 13;
  return c;
}

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
    TrainConfig c = base_config();
    c.strategy = parse_strategy(g.strategy);
    c.schedule = g.schedule, c.virtual_stages = g.virtual_stages, c.stage_layers = g.stage_layers;
    c.recompute = g.recompute, c.sequence_parallel = g.sp, c.trainable = parse_trainable(g.trainable);
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
    const TensorShard shard = tensor_shard(c.model, g.grid.tp, groups.tp_index());
    std::vector<float> expected(ParameterLayout(c.model, shard).total());
    take_shard(c.model, shard, ref.params.data(), expected.data());
    const std::vector<float> params = trainer.full_parameters();
    ASSERT_EQ(params.size(), expected.size()) << what;
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < params.size(); ++i)
      if (std::fabs(params[i] - expected[i]) > worst) worst = std::fabs(params[i] - expected[i]), at = i;
    EXPECT_LT(worst, 2e-5) << what << ": parameter " << at << " is " << params[at] << ", the single-rank step's " << expected[at];
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
    TrainConfig c = base_config();
    c.strategy = parse_strategy(g.strategy), c.comm_algo = coll::Algo::ring;
    c.schedule = g.schedule, c.virtual_stages = g.virtual_stages, c.stage_layers = g.stage_layers;
    c.recompute = g.recompute, c.sequence_parallel = g.sp, c.trainable = parse_trainable(g.trainable);
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
    TrainConfig c = base_config();
    c.strategy = parse_strategy(g.strategy), c.comm_algo = coll::Algo::ring;
    c.schedule = g.schedule, c.virtual_stages = g.virtual_stages, c.stage_layers = g.stage_layers;
    c.recompute = g.recompute, c.sequence_parallel = g.sp, c.trainable = parse_trainable(g.trainable);
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
          ++traced[op.name];
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
        placement = agree(groups.tp(), solve_heuristic(problem.problem).placement);
      } else {
        for (const RecomputableOp& op : problem.problem.ops)
          placement.push_back(op.earliest_window < op.deadline_window ? OpPlacement{RecomputeMode::window, op.earliest_window}
                                                                     : OpPlacement{RecomputeMode::on_demand, -1});
      }
      // The tensor-parallel group runs its first rank's placement: it fits that rank's measured windows.
      EXPECT_FALSE(heuristic && groups.tp_index() == 0 && find_violation(problem.problem, placement).has_value()) << what;
      apply_placement(problem, placement, g.grid.pp, groups.pp_index(), c);
      Trainer trainer(c, groups, *data);
      double in_windows = 0;
      for (int step = 1; step <= steps; ++step) {
        const StepStats stats = trainer.step(step);
        in_windows += stats.recompute_window_seconds;
        EXPECT_NEAR(stats.loss, ref.losses[static_cast<std::size_t>(step) - 1], 1e-5 * ref.losses[0]) << what << " step " << step;
        EXPECT_NEAR(stats.grad_norm, ref.norms[static_cast<std::size_t>(step) - 1], 1e-4 * ref.norms[0]) << what << " step " << step;
      }
      if (!heuristic && !problem.problem.windows.empty()) {
        EXPECT_GT(in_windows, 0) << what << ": nothing ran in the windows";
      }
      const TensorShard shard = tensor_shard(c.model, g.grid.tp, groups.tp_index());
      std::vector<float> expected(ParameterLayout(c.model, shard).total());
      take_shard(c.model, shard, ref.params.data(), expected.data());
      const std::vector<float> params = trainer.full_parameters();
      ASSERT_EQ(params.size(), expected.size()) << what;
      double worst = 0;
      for (std::size_t i = 0; i < params.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(params[i] - expected[i])));
      EXPECT_LT(worst, 2e-5) << what;
    }
}

}  // namespace
}  // namespace strata::train
