// Every data-parallel strategy against the single-rank step of the same global batch, under mpirun at 1, 2 and
// 4 ranks (4 as two emulated nodes of two), with gradient accumulation and clipping on: the same loss at every
// step and the same parameters after three steps. The reference is written here, apart from the trainer: one
// GPT model over the whole global batch, the global gradient norm, AdamW on every trainable parameter.
//
// Tolerance: both sides compute in fp32 and differ only in the order of sums (a gradient summed over ranks
// and micro-batches against one GEMM over all rows; an allreduce's order): relative differences of losses and
// gradient norms stay near 1e-6. Adam moves a parameter by lr g / (|g| + eps), so an absolute difference dg
// of a gradient (fp32 summation noise, about 6e-8 times the sum of the magnitudes it adds: 1e-9 here) moves a
// parameter by at most lr dg / eps per step. With eps 1e-6 that is 1e-3 * 1e-9 / 1e-6 = 1e-6 per step, 3e-6
// over three steps (with eps 1e-8 a near-zero gradient moved one parameter by 2e-5). The bounds below (loss
// 1e-5 relative, norm 1e-4 relative, parameters 2e-5 absolute) leave headroom, while any wrong reduction (a
// missing rank, a doubled shard, a stale parameter) moves the loss by 1e-3 or more and parameters by lr.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <stdexcept>

#include "kernels/layers.h"
#include "train/trainer.h"
#include "train/memory.h"
#include "train/step_formulas.h"
#include "tests/unit/single_rank_step.h"

namespace strata::train {
namespace {

TrainConfig base_config() {
  TrainConfig c = check_config("dp-check", 2, 2, 11);
  if (const char* algo = std::getenv("STRATA_TEST_COMM_ALGO")) {  // ctest runs the equivalence on each algorithm
    const std::optional<coll::Algo> parsed = coll::parse_algo(algo);
    if (!parsed) throw std::invalid_argument(std::string("STRATA_TEST_COMM_ALGO: no algorithm named ") + algo);
    c.comm_algo = *parsed;
  }
  return c;
}

// Layouts of this many ranks: (ranks per emulated node, label).
std::vector<int> layouts() {
  const int n = world_size();
  if (n == 1) return {0};
  if (n == 2) return {0, 1};  // one node of two; two nodes of one
  return {2};                 // two ranks per node
}

void check_every_strategy(const TrainConfig& base, const std::vector<Strategy>& strategies, bool overlap) {
  const int n = world_size(), steps = 3;
  const auto data = synthetic_tokens(base.model.vocab, 5);
  const Reference ref = single_rank(base, n, steps, *data);
  for (int rpn : layouts()) {
    coll::ProcessGroups groups({1, 1, n}, rpn);
    for (const Strategy& strategy : strategies) {
      // STRATA_TEST_STRATEGIES=NII,GGG narrows a run to those, for debugging one strategy.
      if (const char* only = std::getenv("STRATA_TEST_STRATEGIES"); only && std::string(only).find(strategy.name()) == std::string::npos)
        continue;
      TrainConfig c = base;
      c.strategy = strategy;
      c.overlap = overlap;
      Trainer trainer(c, groups, *data);
      const std::string what = strategy.name() + " rpn " + std::to_string(rpn) + (overlap ? " overlap" : " blocking") + " " +
                               std::string(coll::name(c.comm_algo));
      for (int step = 1; step <= steps; ++step) {
        const StepStats stats = trainer.step(step);
        EXPECT_NEAR(stats.loss, ref.losses[static_cast<std::size_t>(step) - 1], 1e-5 * ref.losses[0]) << what << " step " << step;
        EXPECT_NEAR(stats.grad_norm, ref.norms[static_cast<std::size_t>(step) - 1], 1e-4 * ref.norms[0]) << what << " step " << step;
      }
      const std::vector<float> params = trainer.full_parameters();
      ASSERT_EQ(params.size(), ref.params.size());
      double worst = 0;
      std::size_t at = 0;
      for (std::size_t i = 0; i < params.size(); ++i)
        if (std::fabs(params[i] - ref.params[i]) > worst) worst = std::fabs(params[i] - ref.params[i]), at = i;
      EXPECT_LT(worst, 2e-5) << what << ": parameter " << at << " is " << params[at] << ", the single-rank step's "
                             << ref.params[at];
    }
  }
}

TEST(DataParallel, EveryStrategyMatchesTheSingleRankStep) {
  const TrainConfig base = base_config();
  ASSERT_GT(single_rank(base, 1, 1, *synthetic_tokens(64, 5)).norms[0], base.max_grad_norm) << "clipping must be active";
  check_every_strategy(base, runnable_strategies(), true);
}

TEST(DataParallel, BlockingCommunicationGivesTheSameSteps) {
  check_every_strategy(base_config(), {parse_strategy("NNN"), parse_strategy("NNG"), parse_strategy("NIG"), parse_strategy("GGG")},
                       false);
}

// A benchmark switches overlap between steps of one trainer (set_overlap): the steps stay the single-rank ones.
TEST(DataParallel, OverlapSwitchedBetweenStepsGivesTheSameSteps) {
  const int n = world_size(), steps = 4;
  const TrainConfig base = base_config();
  const auto data = synthetic_tokens(base.model.vocab, 5);
  const Reference ref = single_rank(base, n, steps, *data);
  coll::ProcessGroups groups({1, 1, n}, n >= 4 ? 2 : 0);
  for (const char* name : {"NIG", "GGG"}) {
    TrainConfig c = base;
    c.strategy = parse_strategy(name);
    Trainer trainer(c, groups, *data);
    for (int step = 1; step <= steps; ++step) {
      trainer.set_overlap(step % 2 == 0);
      const StepStats stats = trainer.step(step);
      EXPECT_NEAR(stats.loss, ref.losses[static_cast<std::size_t>(step) - 1], 1e-5 * ref.losses[0]) << name << " step " << step;
      EXPECT_NEAR(stats.grad_norm, ref.norms[static_cast<std::size_t>(step) - 1], 1e-4 * ref.norms[0]) << name << " step " << step;
    }
    const std::vector<float> params = trainer.full_parameters();
    ASSERT_EQ(params.size(), ref.params.size());
    double worst = 0;
    for (std::size_t i = 0; i < params.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(params[i] - ref.params[i])));
    EXPECT_LT(worst, 2e-5) << name;
  }
}

TEST(DataParallel, PartialTrainingMatchesTheSingleRankStep) {
  TrainConfig c = base_config();
  c.trainable = parse_trainable("last:1");
  check_every_strategy(c, {parse_strategy("ING"), parse_strategy("NNG"), parse_strategy("IIG")}, true);
}

// Tensor parallelism of degree 2 composed with the data-parallel strategies (with sequence parallelism and
// recomputation too): the same losses, gradient norms and, on each rank, the shard of the single-rank step's
// parameters after 3 steps.
TEST(DataParallel, TensorParallelShardsMatchTheSingleRankStep) {
  const int n = world_size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks (tensor parallelism of 2)";
  const TrainConfig base = base_config();
  const int steps = 3, dp = n / 2;
  const auto data = synthetic_tokens(base.model.vocab, 5);
  const Reference ref = single_rank(base, dp, steps, *data);
  for (int rpn : n >= 4 ? std::vector<int>{0, 4} : std::vector<int>{0}) {
    coll::ProcessGroups groups({2, 1, dp}, rpn);
    for (const char* name : {"NNN", "NNG", "GGG", "IIG"})
      for (int variant = 0; variant < 3; ++variant) {  // plain; full recomputation; sequence parallelism
        if (variant > 0 && std::string(name) != "GGG" && std::string(name) != "NNN") continue;
        const Recompute mode = variant == 1 ? Recompute::full : Recompute::none;
        TrainConfig c = base;
        c.strategy = parse_strategy(name);
        c.recompute = mode;
        c.sequence_parallel = variant == 2;
        Trainer trainer(c, groups, *data);
        const std::string what = std::string(name) + " tp 2 x dp " + std::to_string(dp) + " rpn " + std::to_string(rpn) +
                                 " recompute " + train::name(mode) + (c.sequence_parallel ? " sp" : "");
        for (int step = 1; step <= steps; ++step) {
          const StepStats stats = trainer.step(step);
          EXPECT_NEAR(stats.loss, ref.losses[static_cast<std::size_t>(step) - 1], 1e-5 * ref.losses[0]) << what << " step " << step;
          EXPECT_NEAR(stats.grad_norm, ref.norms[static_cast<std::size_t>(step) - 1], 1e-4 * ref.norms[0]) << what << " step " << step;
        }
        EXPECT_TRUE(parameters_match(c.model, 2, groups.tp_index(), ref, trainer.full_parameters(), 2e-5)) << what;
      }
  }
}

TEST(DataParallel, ModelStateMemoryIsTheFormulasUpToPadding) {
  const int n = world_size();
  coll::ProcessGroups groups({1, 1, n}, n >= 4 ? 2 : 0);
  const auto data = synthetic_tokens(64, 5);
  for (const Strategy& s : runnable_strategies()) {
    TrainConfig c = base_config();
    c.strategy = s;
    Trainer trainer(c, groups, *data);
    const double psi = static_cast<double>(c.model.parameters());
    const ModelStateMemory formula = model_state_memory(s, psi, psi, groups.dp_intra().size(), n);
    const MemoryUse used = trainer.memory();
    // Each of the model's units is padded to a multiple of n elements: at most n - 1 per unit and state.
    const double slack = 4.0 * (c.model.layers + 2) * n * 3;
    EXPECT_NEAR(used.params, formula.params, slack) << s.name();
    EXPECT_NEAR(used.grads, formula.grads, slack) << s.name();
    EXPECT_NEAR(used.optimizer, formula.optimizer, 2 * slack) << s.name();
  }
}

// On Strata's ring the step counts every byte it sends; they must be the formula's, per tier, for every strategy,
// with accumulation and with part of the model frozen (the backward pass then stops early and gathers less).
TEST(DataParallel, BytesPerTierAreTheFormulasOnRings) {
  const int n = world_size();
  coll::ProcessGroups groups({1, 1, n}, n >= 4 ? 2 : 0);
  const DataParallelShape shape = data_parallel_shape(groups);
  const auto data = synthetic_tokens(64, 5);
  for (const char* trainable : {"all", "last:1"})
    for (const Strategy& s : runnable_strategies()) {
      TrainConfig c = base_config();
      c.strategy = s, c.comm_algo = coll::Algo::ring, c.trainable = parse_trainable(trainable);
      Trainer trainer(c, groups, *data);
      const StepStats stats = trainer.step(1);
      const coll::Traffic formula = expected_traffic(c, shape);
      EXPECT_DOUBLE_EQ(stats.traffic.intra_bytes, formula.intra_bytes) << s.name() << " " << trainable;
      EXPECT_DOUBLE_EQ(stats.traffic.inter_bytes, formula.inter_bytes) << s.name() << " " << trainable;
      if (n > 1) {
        EXPECT_GT(formula.intra_bytes + formula.inter_bytes, 0) << s.name();
      }
    }
}

// Activations and workspace are what the formulas count; the pool of communication buffers stays within the
// estimate's bound and is what the step holds between steps; the timeline and the tier figures agree.
TEST(DataParallel, MemoryTimelineAndTiersAreConsistent) {
  const int n = world_size();
  coll::ProcessGroups groups({1, 1, n}, n >= 4 ? 2 : 0);
  const DataParallelShape shape = data_parallel_shape(groups);
  const auto data = synthetic_tokens(64, 5);
  for (const char* name : {"NNN", "NNG", "NIG", "GGG", "ING"}) {
    TrainConfig c = base_config();
    c.strategy = parse_strategy(name), c.record_timeline = true;
    Trainer trainer(c, groups, *data);
    const MemoryFigures before = memory_current();
    trainer.step(1);
    const StepStats stats = trainer.step(2);
    const MemoryUse used = trainer.memory(), estimate = memory_estimate(c, shape);
    EXPECT_DOUBLE_EQ(used.activations, estimate.activations) << name;
    EXPECT_DOUBLE_EQ(used.workspace, estimate.workspace) << name;
    EXPECT_LE(used.comm_buffers, estimate.comm_buffers) << name;
    // Between steps the pool is all the step holds beyond the model states and activations.
    EXPECT_EQ(memory_current()[MemoryCategory::comm_buffers] - before[MemoryCategory::comm_buffers], used.comm_buffers) << name;
    int forward = 0, comm_events = 0, operations = 0;
    for (const TimelineEvent& e : stats.timeline) {
      EXPECT_LE(e.start, e.end) << e.operation;
      forward += e.operation.rfind("forward", 0) == 0;  // "forward mb 1"
      comm_events += e.stream == "comm";
    }
    for (const TierComm& tier : stats.comm) {
      operations += tier.operations;
      EXPECT_GE(tier.busy_seconds, 0);
      EXPECT_LE(tier.exposed_seconds, stats.exposed_comm_seconds + 1e-9);
    }
    EXPECT_EQ(forward, c.accumulation) << name;
    EXPECT_EQ(comm_events, operations) << name;
    if (n > 1) {
      EXPECT_GT(operations, 0) << name;
    }
    const double phases = stats.forward_seconds + stats.backward_seconds + stats.optimizer_seconds +
                          stats.exposed_comm_seconds + stats.idle_seconds;
    EXPECT_NEAR(phases, stats.seconds, 1e-6 + 1e-3 * stats.seconds) << name;
  }
}

TEST(DataParallel, RefusedStrategiesAndBadTrainableSayWhy) {
  coll::ProcessGroups groups({1, 1, world_size()}, 0);
  const auto data = synthetic_tokens(64, 5);
  TrainConfig c = base_config();
  c.strategy = {Sharding::global, Sharding::none, Sharding::none};
  try {
    Trainer trainer(c, groups, *data);
    FAIL() << "GNN was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("GNN is not run"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_trainable("last:0"), std::invalid_argument);
  EXPECT_THROW(parse_trainable("1.5"), std::invalid_argument);
  EXPECT_EQ(parse_trainable("0.5").kind, Trainable::Kind::fraction);
}

}  // namespace
}  // namespace strata::train

// Rank 0 prints; an exception on one rank ends the job with its message instead of leaving the others waiting.
