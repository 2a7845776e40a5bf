// The search over training configurations (project/search.h) and PaRO's rule beside it (project/paro_rule.h): the
// enumeration refuses what does not divide and what does not fit, ranks by the simulated step and prunes nothing that
// belongs in the top k; its compacted workloads and equivalent strategies predict the same step; its lower bounds stay
// at or below the step; the rule's terms are the ring volumes of docs/strategies.md's table and pick the obvious winner in
// extreme scenarios.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>

#include <unistd.h>

#include "bench/project/system_json.h"
#include "collectives/process_group.h"
#include "project/paro_rule.h"
#include "project/search.h"
#include "train/step_formulas.h"
#include "train/tracer.h"

namespace strata::project {
namespace {

// Four devices per node, round figures; fp32 so the executor's own memory accounting applies unscaled.
System small_system() {
  System s;
  s.name = "search test";
  s.device.name = "test device";
  s.device.devices_per_node = 4;
  s.device.compute["fp32"].peak_flops = {1e12, 0, ""};
  s.device.compute["fp32"].efficiency = {{{1e6, 0.3}, {1e9, 0.6}}, 0, ""};
  s.device.compute["bf16"].peak_flops = {8e12, 0, ""};
  s.device.compute["bf16"].efficiency = {{{1e6, 0.3}, {1e9, 0.6}}, 0, ""};
  s.device.memory_bandwidth = {2e11, 0, ""};
  s.device.memory_efficiency = {0.8, 0, ""};
  s.intra_node.bandwidth = {5e10, 0, ""};
  s.intra_node.latency = {2e-6, 0, ""};
  s.inter_node.bandwidth = {5e9, 0, ""};
  s.inter_node.latency = {8e-6, 0, ""};
  s.overlap_slowdown = {0.2, 0, ""};
  return s;
}

train::ModelConfig small_model() {
  train::ModelConfig m;
  m.name = "search-test";
  m.layers = 4, m.hidden = 64, m.heads = 4, m.kv_heads = 4, m.vocab = 128, m.max_seq = 32;
  return m;
}

SearchSpace small_space() {
  SearchSpace space;
  space.model = small_model();
  space.devices = 8;
  space.global_batch = 32;
  space.seq = 32;
  space.micro_batch_sizes = {1, 2};
  space.recompute = {train::Recompute::none, train::Recompute::full};  // selective where a test needs it
  space.dtype = "fp32";
  space.memory_limit = 1e12;
  space.top = 5;
  return space;
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

// Every configuration of the space that fits, simulated.
std::vector<Evaluation> every_configuration(const SearchSpace& space, const System& system) {
  SearchSpace all = space;
  all.prune = false;
  all.top = 100000;
  return search(system, all).top;
}

// ---- the workload the search simulates ----

TEST(Search, CompactedWorkloadPredictsTheSameStepFromFewerOperations) {
  const System system = small_system();
  struct Case {
    coll::GridShape grid;
    train::Schedule schedule;
    int v;
    const char* strategy;
    train::Recompute recompute;
    const char* trainable;
  };
  const std::vector<Case> cases = {
      {{1, 1, 8}, train::Schedule::one_f_one_b, 1, "GGG", train::Recompute::none, "all"},
      {{2, 2, 2}, train::Schedule::interleaved, 2, "NIG", train::Recompute::selective, "all"},
      {{1, 4, 2}, train::Schedule::gpipe, 1, "IIG", train::Recompute::full, "all"},
      {{4, 2, 1}, train::Schedule::one_f_one_b, 1, "NNN", train::Recompute::none, "all"},
      {{1, 2, 4}, train::Schedule::one_f_one_b, 1, "ING", train::Recompute::full, "last:1"},
      {{2, 1, 4}, train::Schedule::one_f_one_b, 1, "NNG", train::Recompute::selective, "0.5"}};
  for (const Case& k : cases) {
    train::TrainConfig c;
    c.model = small_model();
    c.micro_batch = 2, c.seq = 32, c.accumulation = 4;
    c.schedule = k.schedule, c.virtual_stages = k.v, c.strategy = train::parse_strategy(k.strategy);
    c.recompute = k.recompute, c.sequence_parallel = k.grid.tp > 1, c.trainable = train::parse_trainable(k.trainable);
    const std::string what = coll::format_grid(k.grid) + " " + k.strategy + " " + train::name(k.schedule);
    const train::StepTrace trace = train::trace_step(c, k.grid, {4, "tp,pp,dp", {}});
    for (const WorkloadOptions& options : {WorkloadOptions{"fp32", 4}, WorkloadOptions{"bf16", 2}}) {
      // The reference (every traced op) against the search's evaluation (runs across phases, no interval).
      const Prediction exact = predict(system, trace, options, {true, false});
      PredictOptions search_way{false, false};
      search_way.interval = false, search_way.phases = false;
      const Prediction fast = predict(system, trace, options, search_way);
      EXPECT_LT(fast.simulated_operations, exact.simulated_operations * 3 / 4) << what;
      const Timeline &a = exact.timeline, &b = fast.timeline;
      EXPECT_LE(relative(b.step_s, a.step_s), 1e-12) << what << ": " << b.step_s << " against " << a.step_s;
      EXPECT_EQ(fast.step_low_s, fast.step_s) << what;
      EXPECT_EQ(fast.step_high_s, fast.step_s) << what;
      EXPECT_LE(relative(b.mean.compute_s, a.mean.compute_s), 1e-12) << what;
      EXPECT_NEAR(b.mean.idle_s, a.mean.idle_s, 1e-12 * a.step_s) << what;
      ASSERT_EQ(a.mean.exposed_communication_s.size(), b.mean.exposed_communication_s.size()) << what;
      for (const auto& [group, seconds] : a.mean.exposed_communication_s)
        EXPECT_NEAR(b.mean.exposed_communication_s.at(group), seconds, 1e-12 * a.step_s) << what << " group " << group;
      for (std::size_t r = 0; r < a.breakdown.size(); ++r) {
        EXPECT_NEAR(b.breakdown[r].compute_s, a.breakdown[r].compute_s, 1e-12 * a.step_s) << what;
        EXPECT_NEAR(b.breakdown[r].idle_s, a.breakdown[r].idle_s, 1e-12 * a.step_s) << what;
      }
    }
  }
}

// ---- enumeration ----

TEST(Search, RefusesWhatDoesNotDivideAndNamesWhy) {
  const System system = small_system();
  SearchSpace space = small_space();
  space.micro_batch_sizes = {1, 2, 4};  // dp 8 x 4 takes the global batch in one micro-batch
  space.prune = false;
  space.top = 100000;
  const SearchResult r = search(system, space);
  ASSERT_FALSE(r.top.empty());
  for (const Evaluation& e : r.top) {
    const Candidate& c = e.candidate;
    SCOPED_TRACE(c.label());
    EXPECT_EQ(c.tp * c.pp * c.dp, 8);
    EXPECT_EQ(4 % c.tp, 0);                              // a tensor-parallel group inside a node
    EXPECT_EQ(space.model.heads % c.tp, 0);
    EXPECT_EQ(space.model.layers % (c.pp * c.virtual_stages), 0);
    EXPECT_EQ(c.dp * c.micro_batch * c.micro_batches, space.global_batch);
    EXPECT_TRUE(train::schedule_refusal(c.schedule, {c.pp, c.micro_batches, c.virtual_stages}).empty());
    EXPECT_TRUE(train::refusal_reason(c.strategy).empty());
    EXPECT_EQ(c.sequence_parallel, c.tp > 1);
  }
  // Four layers do not divide into pp 4 x v 2 stages; one stage does not interleave.
  EXPECT_GT(r.refusal_reasons.at("divisibility: the layers do not divide into pp x v stages"), 0);
  EXPECT_GT(r.refusal_reasons.at("schedule: interleaved needs two pipeline stages or more"), 0);
  EXPECT_EQ(r.enumerated, r.fitting + r.equivalent + [&] {
    std::int64_t refused = 0;
    for (const auto& [kind, count] : r.refused) refused += count;
    return refused;
  }());
  // GPipe is searched where its order differs from 1F1B's, and left out as equivalent where it is the same.
  const auto gpipe = [&](bool one) {
    return std::count_if(r.top.begin(), r.top.end(), [&](const Evaluation& e) {
      return e.candidate.schedule == train::Schedule::gpipe && (e.candidate.micro_batches == 1) == one;
    });
  };
  EXPECT_GT(gpipe(false), 0);
  EXPECT_EQ(gpipe(true), 0);
  EXPECT_GT(r.equivalent_to.at("gpipe = 1f1b (the same order of passes)"), 0);
  EXPECT_EQ(r.simulated, r.fitting);  // no pruning asked for
  EXPECT_EQ(static_cast<std::int64_t>(r.top.size()), r.simulated);

  // Degrees named by the user that do not divide are refused with their reason; the global batch must divide.
  SearchSpace named = small_space();
  named.tp = {3}, named.pp = {1};
  EXPECT_TRUE(search(system, named).top.empty());
  EXPECT_GT(search(system, named).refusal_reasons.at("divisibility: tp does not divide the devices"), 0);
  named = small_space();
  named.global_batch = 12;  // dp 8 x micro-batch 1 does not divide 12
  const SearchResult odd = search(system, named);
  EXPECT_GT(odd.refusal_reasons.at("divisibility: the global batch does not divide into dp x micro-batch"), 0);
  for (const Evaluation& e : odd.top) EXPECT_EQ(e.candidate.dp * e.candidate.micro_batch * e.candidate.micro_batches, 12);
  named = small_space();
  named.strategies = {train::parse_strategy("NGN")};
  EXPECT_GT(search(system, named).refused.at(RefusalKind::strategy), 0);
}

TEST(Search, RespectsTheMemoryLimit) {
  const System system = small_system();
  SearchSpace space = small_space();
  space.prune = false;
  space.top = 100000;
  const SearchResult unlimited = search(system, space);
  std::vector<double> needs;
  for (const Evaluation& e : unlimited.top) needs.push_back(e.memory.total());
  std::sort(needs.begin(), needs.end());
  // A limit between the configurations' needs: those above it are refused, and nothing kept exceeds it.
  space.memory_limit = needs[needs.size() / 2];
  const SearchResult limited = search(system, space);
  EXPECT_GT(limited.refused.at(RefusalKind::memory), 0);
  EXPECT_LT(limited.top.size(), unlimited.top.size());
  for (const Evaluation& e : limited.top) {
    EXPECT_LE(e.memory.total(), space.memory_limit) << e.candidate.label();
    // The rank counted is the one that needs the most.
    for (int r = 0; r < e.candidate.pp; ++r) {
      const train::MemoryUse use =
          train::memory_estimate(train_config(space, e.candidate), data_parallel_layout(e.candidate, 4, 8, r));
      EXPECT_LE(use.params + use.grads + use.optimizer + use.activations + use.workspace + use.comm_buffers,
                e.memory.total() * (1 + 1e-12));
    }
  }
  // Below the smallest need: nothing fits, and the search says so by its counts.
  space.memory_limit = needs.front() / 2;
  const SearchResult none = search(system, space);
  EXPECT_TRUE(none.top.empty());
  EXPECT_EQ(none.fitting, 0);
  EXPECT_GT(none.refused.at(RefusalKind::memory), 0);
}

TEST(Search, SixteenBitMemoryIsMixedPrecision) {
  SearchSpace space = small_space();
  Candidate c;
  c.dp = 8, c.strategy = train::parse_strategy("NNG"), c.micro_batches = 4;
  const RankMemory fp32 = memory_per_rank(space, c, 4);
  space.dtype = "bf16";
  const RankMemory bf16 = memory_per_rank(space, c, 4);
  // States 4/4/8 -> 2/2/12 bytes per parameter; activations a GPU step's (predict's formula, flash attention, the
  // fused loss's logits at 2 bytes); workspace and buffers at 2 bytes an element.
  EXPECT_DOUBLE_EQ(bf16.use.params, fp32.use.params / 2);
  EXPECT_DOUBLE_EQ(bf16.use.grads, fp32.use.grads / 2);
  EXPECT_DOUBLE_EQ(bf16.use.optimizer, fp32.use.optimizer * 1.5);
  train::GpuLayout fused_loss;
  fused_loss.logit_bytes = 2;
  EXPECT_DOUBLE_EQ(bf16.use.activations,
                   train::gpu_activation_peak(train_config(space, c), 1, 0, 1, false, fused_loss));
  EXPECT_DOUBLE_EQ(bf16.use.workspace, fp32.use.workspace / 2);
  EXPECT_DOUBLE_EQ(bf16.use.comm_buffers, fp32.use.comm_buffers / 2);
  // NNG over 8 ranks: 2 + 2 + 12 / 8 bytes per parameter held, the model's parameters (one stage holds all).
  const double psi = static_cast<double>(small_model().parameters());
  EXPECT_NEAR(bf16.use.params + bf16.use.grads + bf16.use.optimizer, psi * (2 + 2 + 12.0 / 8), psi * 0.05);
}

TEST(Search, DataParallelLayoutFollowsTheGrid) {
  Candidate c;
  c.tp = 1, c.pp = 1, c.dp = 16;
  train::DataParallelShape s = data_parallel_layout(c, 8, 16, 0);
  EXPECT_EQ(s.m, 8);
  EXPECT_EQ(s.g, 2);
  c.tp = 2, c.pp = 2, c.dp = 4;  // 4 consecutive ranks per data-parallel slot: 2 of each group per node
  s = data_parallel_layout(c, 8, 16, 1);
  EXPECT_EQ(s.m, 2);
  EXPECT_EQ(s.g, 2);
  c.tp = 8, c.pp = 2, c.dp = 4;
  s = data_parallel_layout(c, 8, 64, 0);
  EXPECT_EQ(s.m, 1);
  EXPECT_EQ(s.g, 4);
  c.tp = 3, c.pp = 1, c.dp = 8;  // ranks 0, 3, ..., 21 on nodes of 8: 3, 3, 2
  EXPECT_THROW(data_parallel_layout(c, 8, 24, 0), std::invalid_argument);
}

// The layout of a stage's data-parallel group is worked out arithmetically; the executor's groups (built in trace
// mode, as a job of that grid places them) are the reference. Grids of tp 1, 2, 4, 8, pp 1, 2, 4 and dp 1, 2, 3, 4, 8
// (up to 64 ranks) in four grid orders on nodes of 1, 2, 4 and 8 ranks: the same shape from both, evenness included.
TEST(Search, DataParallelLayoutIsTheExecutorsGroups) {
  int compared = 0, uneven = 0;
  for (const char* order : {"tp,pp,dp", "dp,tp,pp", "pp,dp,tp", "tp,dp,pp"})
    for (int per_node : {1, 2, 4, 8})
      for (int tp : {1, 2, 4, 8})
        for (int pp : {1, 2, 4})
          for (int dp : {1, 2, 3, 4, 8}) {
            const int ranks = tp * pp * dp, on_node = std::min(per_node, ranks);  // a job smaller than a node: on one
            if (ranks > 64 || ranks % on_node != 0) continue;                    // a traced job needs whole nodes
            for (int r = 0; r < pp; ++r) {
              train::TraceGroups probe_groups, traced_groups;
              train::Tracer probe(probe_groups), tracer(traced_groups);
              const coll::ProcessGroups places({tp, pp, dp}, on_node, order, 0, probe);
              coll::ProcessGroups groups({tp, pp, dp}, on_node, order, places.world_rank_of(0, r, 0), tracer);
              const train::DataParallelShape reference = train::data_parallel_shape(groups);
              std::map<int, int> on_nodes;
              for (int node : groups.dp().node_of_rank()) ++on_nodes[node];
              const bool even = std::all_of(on_nodes.begin(), on_nodes.end(),
                                            [&](const auto& entry) { return entry.second == on_nodes.begin()->second; });
              const train::DataParallelShape s = train::stage_data_parallel_shape({tp, pp, dp}, on_node, order, r);
              SCOPED_TRACE(std::string(order) + ": tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " dp " + std::to_string(dp) +
                           " on nodes of " + std::to_string(per_node) + ", pipeline rank " + std::to_string(r));
              EXPECT_EQ(s.n, reference.n);
              EXPECT_EQ(s.m, reference.m);
              EXPECT_EQ(s.g, reference.g);
              EXPECT_EQ(s.tp, reference.tp);
              EXPECT_EQ(s.pp, reference.pp);
              EXPECT_EQ(s.pp_rank, reference.pp_rank);
              EXPECT_EQ(s.dp_hop_crosses_nodes, reference.dp_hop_crosses_nodes);
              EXPECT_EQ(s.even, even);
              EXPECT_EQ(reference.even, even);
              ++compared, uneven += !even;
            }
          }
  EXPECT_GT(compared, 400);
  EXPECT_GT(uneven, 10);
}

// ---- ranking and pruning ----

TEST(Search, RanksByPredictedStepAndPrunesNothingOfTheTopK) {
  const System system = small_system();
  SearchSpace space = small_space();
  space.top = 6;
  space.prune = false;
  const SearchResult full = search(system, space);
  ASSERT_EQ(full.top.size(), 6u);
  for (std::size_t i = 1; i < full.top.size(); ++i) EXPECT_LE(full.top[i - 1].step_s, full.top[i].step_s);
  // The top k is the k smallest predicted steps of every configuration that fits.
  SearchSpace all = space;
  all.top = 100000;
  std::vector<double> steps;
  for (const Evaluation& e : search(system, all).top) steps.push_back(e.step_s);
  std::sort(steps.begin(), steps.end());
  for (std::size_t i = 0; i < full.top.size(); ++i) EXPECT_DOUBLE_EQ(full.top[i].step_s, steps[i]);
  // Each step is evaluate()'s for its configuration.
  for (const Evaluation& e : full.top) EXPECT_DOUBLE_EQ(evaluate(system, space, e.candidate).step_s, e.step_s);

  // With the bounds, and on two threads, the same top k from fewer simulations.
  for (int threads : {1, 2}) {
    space.prune = true, space.threads = threads;
    const SearchResult pruned = search(system, space);
    ASSERT_EQ(pruned.top.size(), full.top.size());
    for (std::size_t i = 0; i < full.top.size(); ++i) EXPECT_DOUBLE_EQ(pruned.top[i].step_s, full.top[i].step_s) << i;
    EXPECT_EQ(pruned.fitting, full.fitting);
    EXPECT_EQ(pruned.simulated + pruned.pruned, pruned.fitting);
    EXPECT_GE(pruned.least_pruned_bound_s, pruned.top.back().step_s);
    EXPECT_LT(pruned.simulated, full.simulated);
    std::printf("[ search   ] %lld of %lld fitting configurations simulated with the bounds (%d thread%s)\n",
                static_cast<long long>(pruned.simulated), static_cast<long long>(pruned.fitting), threads,
                threads > 1 ? "s" : "");
  }
}

// Where communication is free the bounds come within rounding of the steps: every configuration near the k-th best
// is simulated, and the top k is the same with and without them.
TEST(Search, TightBoundsKeepTheTopK) {
  System free = small_system();
  free.intra_node.bandwidth.value = free.inter_node.bandwidth.value = 1e18;
  free.intra_node.latency.value = free.inter_node.latency.value = 0;
  free.overlap_slowdown.value = 0;
  SearchSpace space = small_space();
  space.global_batch = 64;  // four micro-batches or more: the strategy's bound counts every compute operation
  space.top = 8;
  space.prune = false;
  const SearchResult full = search(free, space);
  space.prune = true;
  const SearchResult pruned = search(free, space);
  ASSERT_EQ(pruned.top.size(), full.top.size());
  for (std::size_t i = 0; i < full.top.size(); ++i)
    EXPECT_DOUBLE_EQ(pruned.top[i].step_s, full.top[i].step_s) << i << " " << full.top[i].candidate.label();
  int tight = 0;
  for (const Evaluation& e : pruned.top) tight += e.lower_bound_s > 0.99 * e.step_s;
  EXPECT_GT(tight, 0);
  // What was left out could not have entered: its bounds reach the k-th best step, and the nearest of them is close.
  EXPECT_GE(pruned.least_pruned_bound_s, pruned.top.back().step_s);
  EXPECT_LT(pruned.least_pruned_bound_s, 1.1 * pruned.top.back().step_s);
  std::printf("[ search   ] free communication: %lld of %lld simulated with the bounds, %d of the top %zu bounded within 1%%\n",
              static_cast<long long>(pruned.simulated), static_cast<long long>(pruned.fitting), tight, pruned.top.size());
}

TEST(Search, LowerBoundsStayAtOrBelowTheSimulatedStep) {
  const System system = small_system();
  for (const char* trainable : {"all", "last:1"}) {
    SearchSpace space = small_space();
    space.trainable = train::parse_trainable(trainable);
    space.micro_batch_sizes = {2};  // 2 to 16 micro-batches: the second bound applies from 4
    space.recompute = {train::Recompute::none, train::Recompute::full, train::Recompute::selective};
    BoundCache cache;
    int checked = 0, refined = 0;
    for (const Evaluation& e : every_configuration(space, system)) {
      const Candidate& c = e.candidate;
      const double first = lower_bound_s(system, space, c, cache), second = refined_lower_bound_s(system, space, c, cache);
      EXPECT_LE(first, e.step_s) << trainable << " " << c.label();
      EXPECT_LE(second, e.step_s) << trainable << " " << c.label();
      EXPECT_GE(second, first) << c.label();
      ++checked, refined += second > first;
    }
    EXPECT_GT(checked, 100);
    EXPECT_GT(refined, 10);
    std::printf("[ bounds   ] trainable %s: %d configurations, the strategy's bound tighter in %d\n", trainable, checked,
                refined);
  }
}

// Gradients reduced in their own element size (SearchSpace::gradient_reduction_bytes, as predict's): 2-byte reductions
// under a 4-byte step make no configuration slower and the data-parallel ones faster, each step is predict's for its
// configuration, and the bounds stay at or below the steps.
TEST(Search, GradientReductionsTakeTheirOwnElementSize) {
  const System system = small_system();
  SearchSpace space = small_space();
  space.micro_batch_sizes = {2};
  SearchSpace narrow = space;
  narrow.gradient_reduction_bytes = 2;
  std::map<std::string, double> wide_step;
  for (const Evaluation& e : every_configuration(space, system)) wide_step[e.candidate.label()] = e.step_s;
  BoundCache cache;
  int faster = 0;
  for (const Evaluation& e : every_configuration(narrow, system)) {
    const Candidate& c = e.candidate;
    ASSERT_TRUE(wide_step.count(c.label())) << c.label();
    EXPECT_LE(e.step_s, wide_step[c.label()] * (1 + 1e-12)) << c.label();
    faster += c.dp > 1 && e.step_s < wide_step[c.label()] * (1 - 1e-6);
    EXPECT_LE(refined_lower_bound_s(system, narrow, c, cache), e.step_s) << c.label();
    const StepCase step = step_case(narrow, c, system.device.devices_per_node);
    EXPECT_EQ(step.workload.gradient_reduction_bytes, 2);
    EXPECT_LT(relative(predict_step(step, system).prediction.step_s, e.step_s), 1e-9) << c.label();
  }
  EXPECT_GT(faster, 0);
}

// How attention and the loss run (SearchSpace::attention, loss, dropout, as predict's): a kernel at half the described
// speed and the loss in fp32 passes make no configuration faster and some slower, each step is predict's for its
// configuration, the bounds stay at or below the steps; without dropout no configuration needs more memory; a kernel or
// loss the search does not know is refused by name.
TEST(Search, AttentionKernelLossAndDropoutAsPredicts) {
  System system = small_system();
  system.device.attention_kernels["half-speed"] = {{0.5, 0, ""}, {0.5, 0, ""}};
  SearchSpace space = small_space();
  space.micro_batch_sizes = {2};
  std::map<std::string, Evaluation> described;
  for (const Evaluation& e : every_configuration(space, system)) described.emplace(e.candidate.label(), e);
  SearchSpace slower = space;
  slower.attention = "half-speed", slower.loss = "fp32", slower.dropout = false;
  BoundCache cache, described_cache;
  int slowed = 0, bound_raised = 0, smaller = 0;
  for (const Evaluation& e : every_configuration(slower, system)) {
    const Candidate& c = e.candidate;
    ASSERT_TRUE(described.count(c.label())) << c.label();
    const Evaluation& before = described.at(c.label());
    EXPECT_GE(e.step_s, before.step_s * (1 - 1e-12)) << c.label();
    slowed += e.step_s > before.step_s * (1 + 1e-6);
    const double bound = refined_lower_bound_s(system, slower, c, cache);
    EXPECT_LE(bound, e.step_s) << c.label();
    bound_raised += bound > refined_lower_bound_s(system, space, c, described_cache) * (1 + 1e-6);
    const StepCase step = step_case(slower, c, system.device.devices_per_node);
    EXPECT_EQ(step.workload.attention, "half-speed");
    EXPECT_EQ(step.workload.loss, "fp32");
    EXPECT_FALSE(step.workload.dropout);
    EXPECT_LT(relative(predict_step(step, system).prediction.step_s, e.step_s), 1e-9) << c.label();
  }
  EXPECT_EQ(slowed, static_cast<int>(described.size()));
  EXPECT_GT(bound_raised, 0);  // the bounds price the kernel and the loss the steps run
  // A kernel faster than the described one: bounds that priced the described kernel would exceed the steps.
  system.device.attention_kernels["four-times-faster"] = {{4, 0, ""}, {4, 0, ""}};
  SearchSpace faster = space;
  faster.attention = "four-times-faster";
  BoundCache faster_cache;
  int bound_lowered = 0;
  for (const Evaluation& e : every_configuration(faster, system)) {
    const Candidate& c = e.candidate;
    EXPECT_LE(lower_bound_s(system, faster, c, faster_cache), e.step_s) << c.label();
    const double bound = refined_lower_bound_s(system, faster, c, faster_cache);
    EXPECT_LE(bound, e.step_s) << c.label();
    bound_lowered += bound < refined_lower_bound_s(system, space, c, described_cache) * (1 - 1e-6);
  }
  EXPECT_GT(bound_lowered, 0);
  SearchSpace bf16 = space;  // dropout masks are counted in the GPU (16-bit) memory estimate
  bf16.dtype = "bf16";
  SearchSpace no_dropout = bf16;
  no_dropout.dropout = false;
  std::map<std::string, double> with_masks;
  for (const Evaluation& e : every_configuration(bf16, system)) with_masks[e.candidate.label()] = e.memory.total();
  for (const Evaluation& e : every_configuration(no_dropout, system))
    smaller += e.memory.total() < with_masks.at(e.candidate.label());
  EXPECT_GT(smaller, 0);
  SearchSpace unknown = space;
  unknown.prune = false;  // refused up front, not as each configuration's failure (which the search counts)
  unknown.attention = "no-such-kernel";
  EXPECT_THROW(search(system, unknown), std::invalid_argument);
  unknown.attention = "flash";
  unknown.loss = "fp16";
  EXPECT_THROW(search(system, unknown), std::invalid_argument);
}

// ---- equivalent configurations ----

TEST(Search, EquivalentStrategiesPredictTheSameStep) {
  const System system = small_system();
  struct Layout {
    int devices, tp, pp, dp;
  };
  int pairs = 0;
  std::set<std::string> kinds;
  // Four nodes of four with one data-parallel rank per node (m = 1), and one node (g = 1).
  for (const Layout& l : {Layout{16, 4, 1, 4}, Layout{16, 4, 2, 2}, Layout{16, 1, 4, 4}, Layout{4, 1, 1, 4},
                          Layout{4, 2, 1, 2}, Layout{4, 1, 2, 2}}) {
    SearchSpace space = small_space();
    space.devices = l.devices, space.global_batch = 16;
    for (const train::Strategy& s : train::runnable_strategies()) {
      Candidate c;
      c.tp = l.tp, c.pp = l.pp, c.dp = l.dp, c.strategy = s, c.micro_batch = 1;
      c.micro_batches = space.global_batch / l.dp, c.sequence_parallel = l.tp > 1;
      const train::DataParallelShape shape = data_parallel_layout(c, 4, space.devices, 0);
      const train::Strategy same = equivalent_strategy(s, shape.m, shape.g);
      if (same == s) continue;
      ASSERT_TRUE(train::refusal_reason(same).empty()) << s.name() << " -> " << same.name();
      Candidate other = c;
      other.strategy = same;
      const Evaluation a = evaluate(system, space, c), b = evaluate(system, space, other);
      EXPECT_LE(relative(a.step_s, b.step_s), 1e-12) << c.label() << " against " << same.name();
      EXPECT_LE(b.memory.total(), a.memory.total() * (1 + 1e-12)) << c.label() << " against " << same.name();
      ++pairs;
      kinds.insert(s.name() + "=" + same.name() + (shape.m == 1 ? " m1" : " g1"));
    }
  }
  EXPECT_GE(pairs, 20);
  for (const char* kind : {"INI=NNI m1", "ING=NNG m1", "IIG=NIG m1", "IGG=NGG m1", "III=NII m1", "NNI=NNG g1",
                           "NII=NIG g1", "INI=ING g1", "III=IIG g1"})
    EXPECT_TRUE(kinds.count(kind)) << kind;
  EXPECT_EQ(equivalent_strategy(train::parse_strategy("NNI"), 1, 4).name(), "NNI");  // not NNN: see search.h
  EXPECT_EQ(equivalent_strategy(train::parse_strategy("IGG"), 4, 4).name(), "IGG");
  // One micro-batch: GPipe and 1F1B run the same passes in the same order.
  Candidate gpipe;
  gpipe.pp = 2, gpipe.dp = 4, gpipe.micro_batches = 1, gpipe.micro_batch = 8, gpipe.schedule = train::Schedule::gpipe;
  Candidate ofob = gpipe;
  ofob.schedule = train::Schedule::one_f_one_b;
  EXPECT_DOUBLE_EQ(evaluate(system, small_space(), gpipe).step_s, evaluate(system, small_space(), ofob).step_s);
}

TEST(Search, RefusesAnUnsearchableSpace) {
  const System system = small_system();
  SearchSpace s = small_space();
  s.memory_limit = 0;
  EXPECT_THROW(search(system, s), std::invalid_argument);
  s = small_space();
  s.devices = 0;
  EXPECT_THROW(search(system, s), std::invalid_argument);
  s = small_space();
  s.seq = 64;  // beyond the position table
  EXPECT_THROW(search(system, s), std::invalid_argument);
  s = small_space();
  s.dtype = "fp8";
  EXPECT_THROW(search(system, s), std::invalid_argument);
  s = small_space();
  s.recompute = {train::Recompute::overlap};
  EXPECT_THROW(search(system, s), std::invalid_argument);
  s = small_space();
  s.trainable = train::parse_trainable("last:9");
  EXPECT_THROW(search(system, s), std::invalid_argument);
}

// The rate is printed, not asserted (make bench judges the 175B search): a GPT-3 1.3B search on 64 A100s.
TEST(Search, PrintsItsRate) {
  const System a100 = read_system(std::string(STRATA_SYSTEMS_DIR) + "/a100-80gb-sxm-hdr200.json");
  SearchSpace space;
  space.model = train::preset("gpt3-1.3b");
  space.devices = 64, space.global_batch = 512, space.seq = 2048, space.memory_limit = 80e9, space.threads = 2;
  const SearchResult r = search(a100, space);
  ASSERT_FALSE(r.top.empty());
  std::printf("[ rate     ] GPT-3 1.3B on 64 A100s: %lld configurations in %.2f s (%.0f/s), %lld fit, %lld simulated "
              "(%.1f/s), best %s at %.3f s\n",
              static_cast<long long>(r.enumerated), r.seconds, r.rate(), static_cast<long long>(r.fitting),
              static_cast<long long>(r.simulated), r.simulated / r.seconds, r.top.front().candidate.label().c_str(),
              r.top.front().step_s);
}

// ---- the system description's device memory ----

TEST(Search, SystemsDescribeTheirDeviceMemory) {
  const std::pair<const char*, double> shipped[] = {
      {"a100-80gb-sxm-hdr200.json", 80e9}, {"a100-40gb-sxm-hdr200.json", 40e9}, {"h100-sxm-ndr400.json", 80e9}};
  for (const auto& [file, capacity] : shipped) {
    const System s = read_system(std::string(STRATA_SYSTEMS_DIR) + "/" + file);
    ASSERT_TRUE(s.device.memory_capacity.has_value()) << file;
    EXPECT_DOUBLE_EQ(s.device.memory_capacity->value, capacity) << file;
    EXPECT_FALSE(s.device.memory_capacity->source.empty());
  }
  System s = small_system();
  EXPECT_FALSE(find_problem(s).has_value());
  s.device.memory_capacity = Quantity{-1, 0, ""};
  ASSERT_TRUE(find_problem(s).has_value());
  EXPECT_NE(find_problem(s)->find("device.memory_capacity"), std::string::npos);
  s.device.memory_capacity = Quantity{40e9, 0.01, "test"};
  const auto path = std::filesystem::temp_directory_path() / ("strata-search-" + std::to_string(::getpid()) + ".json");
  write_system(path.string(), s);
  const System back = read_system(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(back.device.memory_capacity.has_value());
  EXPECT_DOUBLE_EQ(back.device.memory_capacity->value, 40e9);
  EXPECT_EQ(back.device.memory_capacity->source, "test");
}

// ---- PaRO's rule ----

ParoScenario hand_scenario() {
  ParoScenario x;
  x.parameters = 1000, x.trainable = 1000, x.backward_parameters = 800;
  x.ranks = 4, x.ranks_per_group = 2;  // two groups of two
  x.micro_batches = 3;
  x.intra_bandwidth = 100, x.inter_bandwidth = 10;
  x.param_element_bytes = x.grad_element_bytes = 2;
  x.compute_s = 1, x.optimizer_s_per_element = 0.001;
  return x;
}

TEST(ParoRule, TermsAreTheRingVolumesOverEachTiersBandwidth) {
  const ParoScenario x = hand_scenario();
  auto terms = [&](const char* s) { return paro_terms(train::parse_strategy(s), x); };
  // NNN: one allreduce of the gradients (2000 B) over all four ranks across nodes: 2 (3/4) 2000 / 10.
  ParoTerms t = terms("NNN");
  EXPECT_DOUBLE_EQ(t.param_s, 0);
  EXPECT_DOUBLE_EQ(t.gradient_s, 0);
  EXPECT_DOUBLE_EQ(t.syncg_s, 300);
  EXPECT_DOUBLE_EQ(t.syncp_s, 0);
  EXPECT_DOUBLE_EQ(t.optimizer_s, 1);
  EXPECT_DOUBLE_EQ(t.total_s(), 3 * 1 + 300 + 1);
  // GGG: per micro-batch (1000 + 800) x 2 B gathered and 2000 B reduce-scattered over all four, across nodes.
  t = terms("GGG");
  EXPECT_DOUBLE_EQ(t.param_s, 0.75 * 3600 / 10);
  EXPECT_DOUBLE_EQ(t.gradient_s, 0.75 * 2000 / 10);
  EXPECT_DOUBLE_EQ(t.syncg_s + t.syncp_s, 0);
  EXPECT_DOUBLE_EQ(t.optimizer_s, 0.25);
  EXPECT_DOUBLE_EQ(t.total_s(), 3 * (1 + 270 + 150) + 0.25);
  // NIG: intra reduce-scatter per micro-batch; the intra shard (500 elements) reduce-scattered across the two nodes;
  // the parameters gathered over all four after the update.
  t = terms("NIG");
  EXPECT_DOUBLE_EQ(t.gradient_s, 0.5 * 2000 / 100);
  EXPECT_DOUBLE_EQ(t.syncg_s, 0.5 * 1000 / 10);
  EXPECT_DOUBLE_EQ(t.syncp_s, 0.75 * 2000 / 10);
  // IIG: gathers inside the node; the inter allgather rebuilds the intra shard.
  t = terms("IIG");
  EXPECT_DOUBLE_EQ(t.param_s, 0.5 * 3600 / 100);
  EXPECT_DOUBLE_EQ(t.syncp_s, 0.5 * 1000 / 10);
  // NII: the intra shard allreduced across nodes, parameters gathered inside the node.
  t = terms("NII");
  EXPECT_DOUBLE_EQ(t.syncg_s, 2 * 0.5 * 1000 / 10);
  EXPECT_DOUBLE_EQ(t.syncp_s, 0.5 * 2000 / 100);
  EXPECT_DOUBLE_EQ(t.optimizer_s, 0.5);
  // ING: whole gradients kept, then reduce-scattered inside the node and across nodes once.
  t = terms("ING");
  EXPECT_DOUBLE_EQ(t.gradient_s, 0);
  EXPECT_DOUBLE_EQ(t.syncg_s, 0.5 * 2000 / 100 + 0.5 * 1000 / 10);
  EXPECT_DOUBLE_EQ(t.syncp_s, 0.5 * 1000 / 10);
  // Memory: 2 Ψ / d_P + 2 Ψ' / d_G + 12 Ψ' / d_OS plus what every strategy holds.
  ParoScenario y = x;
  y.other_memory_bytes = 100;
  EXPECT_DOUBLE_EQ(paro_terms(train::parse_strategy("NNN"), y).memory_bytes, 16000 + 100);
  EXPECT_DOUBLE_EQ(paro_terms(train::parse_strategy("IIG"), y).memory_bytes, 1000 + 1000 + 3000 + 100);
  // One node: a collective over all ranks stays inside it.
  y = x;
  y.ranks_per_group = 4;
  EXPECT_DOUBLE_EQ(paro_terms(train::parse_strategy("NNN"), y).syncg_s, 2 * 0.75 * 2000 / 100);
  EXPECT_DOUBLE_EQ(paro_terms(train::parse_strategy("NIG"), y).syncg_s, 0);  // one group: nothing across
  // Refused strategies and impossible scenarios throw.
  EXPECT_THROW(paro_terms(train::parse_strategy("NGN"), x), std::invalid_argument);
  y = x;
  y.ranks_per_group = 3;
  EXPECT_THROW(paro_terms(train::parse_strategy("NNN"), y), std::invalid_argument);
}

TEST(ParoRule, PicksTheObviousWinnerInExtremeScenarios) {
  // Many micro-batches and a slow inter-node link: gradients reduced inside the node every micro-batch and across
  // nodes once (I gradients) beat a global reduction every micro-batch (G) and a whole allreduce (N, N).
  ParoScenario x = hand_scenario();
  x.parameters = x.trainable = x.backward_parameters = 1e9;
  x.ranks = 64, x.ranks_per_group = 8;
  x.micro_batches = 64;
  x.intra_bandwidth = 300e9, x.inter_bandwidth = 300e9 / 1000;
  x.optimizer_s_per_element = 0;
  // Unlimited memory: whole gradients summed locally and reduced once, inside the node and then the shard across
  // (NNI: 1.46 s of communication against NII's 1.84 s, NIG's 7.7 s and NNN's 13.1 s).
  std::optional<ParoChoice> choice = paro_choose(x);
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->strategy.name(), "NNI");
  // Only gradients sharded inside the node, against globally every micro-batch: I.
  choice = paro_choose(x, {train::parse_strategy("IGG"), train::parse_strategy("IIG")});
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->strategy.name(), "IIG");
  // A memory limit that shards the optimizer over all ranks and the parameters or gradients inside the node: the
  // gradients still cross nodes once per step (ING 2.2 s, IIG 2.6 s, NIG 7.7 s).
  x.memory_limit = 2 * 1e9 + 2 * 1e9 / 8 + 12 * 1e9 / 64 + 1;
  choice = paro_choose(x);
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->strategy.name(), "ING");
  EXPECT_NE(choice->strategy.grads, train::Sharding::global);
  // Few trainable parameters (Ψ' = Ψ / 16) and parameters that must be sharded: ING (the large frozen parameters
  // sharded inside the node, the small gradients whole, reduced once).
  x = hand_scenario();
  x.parameters = 16e9, x.trainable = 1e9, x.backward_parameters = 1e9;
  x.ranks = 64, x.ranks_per_group = 8, x.micro_batches = 16;
  x.intra_bandwidth = 300e9, x.inter_bandwidth = 25e9;
  x.optimizer_s_per_element = 28 / 1.6e12;
  x.memory_limit = 2 * 16e9 / 8 + 2 * 1e9 + 12 * 1e9 / 8;  // parameters whole do not fit
  choice = paro_choose(x);
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->strategy.name(), "ING");
  // Nothing fits: no choice.
  x.memory_limit = 1;
  EXPECT_FALSE(paro_choose(x).has_value());
}

TEST(ParoRule, ComparisonSimulatesTheRulesChoiceBesideTheSearch) {
  const System a100 = read_system(std::string(STRATA_SYSTEMS_DIR) + "/a100-80gb-sxm-hdr200.json");
  ParoComparisonScenario s;
  s.model_name = "gpt3-1.3b", s.model = train::preset("gpt3-1.3b");
  s.nodes = 2, s.micro_batches = 4, s.bandwidth_ratio = 16;
  const ParoComparisonRow row = compare_paro(a100, s, 1, 1024, train::Recompute::full, "bf16", 80e9);
  EXPECT_DOUBLE_EQ(row.bandwidth_ratio, 16);
  EXPECT_EQ(row.fitting, 14);
  ASSERT_FALSE(row.rule_choice.empty());
  ASSERT_FALSE(row.search_choice.empty());
  EXPECT_TRUE(row.rule_fits);
  // The search's choice is the fastest simulated strategy; the rule's is simulated beside it.
  for (const auto& [strategy, step] : row.simulated_s) EXPECT_GE(step, row.search_step_s) << strategy;
  EXPECT_DOUBLE_EQ(row.simulated_s.at(row.rule_choice), row.rule_step_s);
  EXPECT_EQ(row.agree, row.rule_choice == row.search_choice);
  EXPECT_GT(row.rule_total_s, 0);
  // The rule's inputs: Ψ the model's parameters, Ψ' all of them, Ψ_b the layers.
  const ParoScenario x = paro_scenario(a100, s, 1, 1024, train::Recompute::full, "bf16", 0, 80e9);
  EXPECT_DOUBLE_EQ(x.parameters, static_cast<double>(s.model.parameters()));
  EXPECT_DOUBLE_EQ(x.trainable, x.parameters);
  EXPECT_DOUBLE_EQ(x.backward_parameters, static_cast<double>(s.model.layers) * static_cast<double>(s.model.parameters_per_layer()));
  EXPECT_EQ(x.ranks, 16);
  EXPECT_EQ(x.ranks_per_group, 8);
  EXPECT_DOUBLE_EQ(x.inter_bandwidth, a100.intra_node.bandwidth.value / 16);
}

}  // namespace
}  // namespace strata::project
