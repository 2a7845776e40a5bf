// The projection's fast path against its reference (project/predict.h, PredictOptions::exact; project/simulate.h,
// SimulateMethod): on traced steps of every schedule, recomputation mode, sequence parallelism, data-parallel
// strategy (ZeRO stages and PaRO's hierarchical ones, data-parallel groups across nodes) and production overlap, on a
// description of round numbers and on a shipped GPU description, the fast path predicts the same step, interval,
// components and breakdown up to rounding, and the event queue gives the scan's timeline op by op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "bench/project/system_json.h"
#include "project/predict.h"
#include "project/simulate.h"
#include "project/trace_workload.h"
#include "train/trainer.h"

namespace strata::project {
namespace {

constexpr double kRel = 1e-9;

// fp32 and bf16, memory at 100 GB/s, links of 10 GB/s inside a node and 1 GB/s between, and an overlap slowdown,
// every figure with a spread (the interval's corners are simulated on both paths too).
System round_system() {
  System s;
  s.name = "round";
  s.device.devices_per_node = 4;
  for (const char* dtype : {"fp32", "bf16"}) {
    s.device.compute[dtype].peak_flops = {dtype == std::string("fp32") ? 1e12 : 4e12, 0.1, ""};
    s.device.compute[dtype].efficiency = {{{1e3, 0.2}, {1e8, 0.6}}, 0.15, ""};
  }
  s.device.memory_bandwidth = {1e11, 0.1, ""};
  s.device.memory_efficiency = {0.8, 0.05, ""};
  s.intra_node.bandwidth = {1e10, 0.2, ""};
  s.intra_node.latency = {1e-6, 0.3, ""};
  s.inter_node.bandwidth = {1e9, 0.2, ""};
  s.inter_node.latency = {1e-5, 0.3, ""};
  s.overlap_slowdown = {0.3, 0.5, ""};
  return s;
}

struct Case {
  coll::GridShape grid;
  train::Schedule schedule;
  int virtual_stages;
  const char* strategy;
  train::Recompute recompute;
  bool sp;
  int ranks_per_node;
  bool tp_comm_overlap = false;
  bool overlap_param_gather = false;
  bool overlap = true;  // gradient reductions during backward
};

std::string describe(const Case& k) {
  return coll::format_grid(k.grid) + " " + train::name(k.schedule) + " v" + std::to_string(k.virtual_stages) + " " +
         k.strategy + " recompute " + train::name(k.recompute) + (k.sp ? " sp" : "") + " " +
         std::to_string(k.ranks_per_node) + "/node" + (k.tp_comm_overlap ? " tp-overlap" : "") +
         (k.overlap_param_gather ? " gather-overlap" : "") + (k.overlap ? "" : " no-grad-overlap");
}

double relative(double got, double want, double scale) { return std::abs(got - want) / std::max(1e-300, scale); }

#define EXPECT_SAME(got, want, scale, what) \
  EXPECT_LE(relative((got), (want), (scale)), kRel) << (what) << ": " << (got) << " against " << (want)

void expect_same_components(const StepComponents& got, const StepComponents& want, double scale, const std::string& what) {
  EXPECT_SAME(got.step_s, want.step_s, scale, what + " step");
  EXPECT_SAME(got.forward_s, want.forward_s, scale, what + " forward");
  EXPECT_SAME(got.backward_s, want.backward_s, scale, what + " backward");
  EXPECT_SAME(got.recompute_s, want.recompute_s, scale, what + " recompute");
  EXPECT_SAME(got.recompute_window_s, want.recompute_window_s, scale, what + " recompute_window");
  EXPECT_SAME(got.optimizer_s, want.optimizer_s, scale, what + " optimizer");
  EXPECT_SAME(got.comm_exposed_s, want.comm_exposed_s, scale, what + " comm_exposed");
  EXPECT_SAME(got.comm_tp_s, want.comm_tp_s, scale, what + " comm_tp");
  EXPECT_SAME(got.pipeline_wait_s, want.pipeline_wait_s, scale, what + " pipeline_wait");
  EXPECT_SAME(got.idle_s, want.idle_s, scale, what + " idle");
  for (const auto& [role, seconds] : want.exposed_by_role) {
    const auto found = got.exposed_by_role.find(role);
    EXPECT_SAME(found == got.exposed_by_role.end() ? 0.0 : found->second, seconds, scale, what + " exposed " + role);
  }
  for (const auto& [role, seconds] : got.exposed_by_role)
    if (!want.exposed_by_role.count(role)) {
      EXPECT_SAME(seconds, 0.0, scale, what + " exposed " + role);
    }
}

void expect_same_breakdown(const Breakdown& got, const Breakdown& want, double scale, const std::string& what) {
  EXPECT_SAME(got.compute_s, want.compute_s, scale, what + " compute");
  EXPECT_SAME(got.idle_s, want.idle_s, scale, what + " idle");
  for (const auto& [group, seconds] : want.exposed_communication_s) {
    const auto found = got.exposed_communication_s.find(group);
    EXPECT_SAME(found == got.exposed_communication_s.end() ? 0.0 : found->second, seconds, scale,
                what + " exposed group " + std::to_string(group));
  }
}

train::TrainConfig config_of(const Case& k) {
  train::TrainConfig c;
  c.model.name = "fast";
  c.model.layers = 8, c.model.hidden = 64, c.model.heads = 4, c.model.kv_heads = 4, c.model.vocab = 128;
  c.model.max_seq = 32;
  c.micro_batch = 1, c.seq = 32, c.accumulation = 8;
  c.schedule = k.schedule, c.virtual_stages = k.virtual_stages;
  c.strategy = train::parse_strategy(k.strategy);
  c.recompute = k.recompute;
  c.sequence_parallel = k.sp;
  c.overlap = k.overlap;
  return c;
}

const Case kCases[] = {
    {{1, 4, 1}, train::Schedule::gpipe, 1, "NNN", train::Recompute::none, false, 4},
    {{1, 4, 1}, train::Schedule::one_f_one_b, 1, "NNN", train::Recompute::full, false, 4},
    {{2, 2, 1}, train::Schedule::interleaved, 2, "NNN", train::Recompute::selective, true, 4},
    {{2, 2, 2}, train::Schedule::interleaved, 2, "NNG", train::Recompute::selective, true, 4, true, true},
    {{2, 2, 2}, train::Schedule::one_f_one_b, 1, "NNG", train::Recompute::full, true, 4, true, false},
    {{2, 1, 4}, train::Schedule::one_f_one_b, 1, "NGG", train::Recompute::none, true, 2, false, true},
    {{1, 2, 4}, train::Schedule::one_f_one_b, 1, "GGG", train::Recompute::selective, false, 2},
    {{1, 1, 8}, train::Schedule::one_f_one_b, 1, "IIG", train::Recompute::none, false, 4},
    {{1, 2, 4}, train::Schedule::gpipe, 1, "NIG", train::Recompute::full, false, 2},
    {{2, 2, 2}, train::Schedule::one_f_one_b, 1, "NNN", train::Recompute::none, false, 2, false, false, false},
};

TEST(PredictFast, GivesTheReferencesStepIntervalAndComponents) {
  const System round = round_system();
  System still = round;  // no overlap slowdown: a run's rate never changes, so every op's interval is the reference's
  still.overlap_slowdown = {0, 0, ""};
  const System a100 = read_system(std::string(STRATA_SYSTEMS_DIR) + "/a100-80gb-sxm-hdr200.json");
  for (const Case& k : kCases) {
    const train::StepTrace trace =
        train::trace_step(config_of(k), k.grid, {k.ranks_per_node, "tp,pp,dp", {}, k.tp_comm_overlap, k.overlap_param_gather});
    struct Setting {
      const System* system;
      WorkloadOptions workload;
    };
    for (const Setting& setting : {Setting{&round, {"fp32", 4, "flash"}}, Setting{&still, {"fp32", 4, "flash"}},
                                   Setting{&round, {"bf16", 2, "flash"}},
                                   Setting{&a100, {"bf16", 2, "flash"}}, Setting{&a100, {"fp16", 2, "unfused"}},
                                   Setting{&a100, {"bf16", 2, "flash-triton"}}}) {
      const std::string what = describe(k) + " on " + setting.system->name + " " + setting.workload.dtype + " " +
                               setting.workload.attention;
      const Prediction exact = predict(*setting.system, trace, setting.workload, {true, true});
      const Prediction fast = predict(*setting.system, trace, setting.workload, {false, true});
      if (setting.workload.attention == "flash-triton") {  // a slower kernel than the described flash one
        const Prediction flash = predict(*setting.system, trace, {"bf16", 2, "flash"}, {false, true});
        EXPECT_GT(fast.step_s, flash.step_s) << describe(k);
      }
      const double scale = exact.step_s;
      ASSERT_GT(scale, 0) << what;
      EXPECT_SAME(fast.step_s, exact.step_s, scale, what + " step");
      EXPECT_SAME(fast.step_low_s, exact.step_low_s, scale, what + " step (faster end)");
      EXPECT_SAME(fast.step_high_s, exact.step_high_s, scale, what + " step (slower end)");
      EXPECT_LT(exact.step_low_s, exact.step_s) << what;  // the corners are simulated, not the nominal step again
      expect_same_components(fast.mean, exact.mean, scale, what + " mean");
      ASSERT_EQ(fast.ranks.size(), exact.ranks.size()) << what;
      for (std::size_t r = 0; r < exact.ranks.size(); ++r)
        expect_same_components(fast.ranks[r], exact.ranks[r], scale, what + " rank " + std::to_string(r));
      expect_same_breakdown(fast.timeline.mean, exact.timeline.mean, scale, what + " breakdown mean");
      ASSERT_EQ(fast.timeline.breakdown.size(), exact.timeline.breakdown.size()) << what;
      for (std::size_t r = 0; r < exact.timeline.breakdown.size(); ++r)
        expect_same_breakdown(fast.timeline.breakdown[r], exact.timeline.breakdown[r], scale, what + " breakdown");
      // Every communication op, and every op's interval where no rate changed inside its run, as the reference's.
      ASSERT_EQ(fast.timeline.intervals.size(), exact.timeline.intervals.size()) << what;
      for (std::size_t i = 0; i < exact.timeline.intervals.size(); ++i) {
        const Interval& a = fast.timeline.intervals[i];
        const Interval& b = exact.timeline.intervals[i];
        ASSERT_EQ(a.rank, b.rank) << what;
        ASSERT_EQ(a.stream, b.stream) << what;
        ASSERT_EQ(a.name, b.name) << what;
        ASSERT_EQ(a.kind, b.kind) << what;
        if (!is_compute(a.kind) || setting.system->overlap_slowdown.value == 0) {
          EXPECT_SAME(a.start, b.start, scale, what + " " + b.name + " start");
          EXPECT_SAME(a.end, b.end, scale, what + " " + b.name + " end");
        }
      }
    }
  }
}

// The event queue against the scan on the uncompacted workload: every op's reach, start and end.
TEST(PredictFast, TheEventQueueGivesTheScansTimeline) {
  const System round = round_system();
  for (const Case& k : kCases) {
    const train::StepTrace trace =
        train::trace_step(config_of(k), k.grid, {k.ranks_per_node, "tp,pp,dp", {}, k.tp_comm_overlap, k.overlap_param_gather});
    System nodes = round;
    nodes.device.devices_per_node = trace.ranks_per_node;
    const Workload workload = workload_of(trace, {"fp32", 4});
    const Timeline scan = simulate(nodes, workload, {SimulateMethod::scan, true, true});
    const Timeline queue = simulate(nodes, workload, {SimulateMethod::event_queue, true, true});
    const std::string what = describe(k);
    const double scale = scan.step_s;
    EXPECT_SAME(queue.step_s, scan.step_s, scale, what + " step");
    ASSERT_EQ(queue.ops.size(), scan.ops.size());
    for (std::size_t r = 0; r < scan.ops.size(); ++r)
      for (std::size_t i = 0; i < scan.ops[r].size(); ++i) {
        const std::string op = what + " rank " + std::to_string(r) + " op " + std::to_string(i);
        EXPECT_SAME(queue.ops[r][i].reached, scan.ops[r][i].reached, scale, op + " reached");
        EXPECT_SAME(queue.ops[r][i].start, scan.ops[r][i].start, scale, op + " start");
        EXPECT_SAME(queue.ops[r][i].end, scan.ops[r][i].end, scale, op + " end");
      }
    expect_same_breakdown(queue.mean, scan.mean, scale, what + " breakdown mean");
  }
}

// Without the breakdown and intervals the step is the same; the reference refuses the same bad workloads.
TEST(PredictFast, OptionsLeaveTheStepAloneAndDeadlocksAreRefusedAlike) {
  const System round = round_system();
  const Case k = kCases[3];
  const train::StepTrace trace = train::trace_step(config_of(k), k.grid, {k.ranks_per_node, "tp,pp,dp", {}});
  System nodes = round;
  nodes.device.devices_per_node = trace.ranks_per_node;
  const Workload workload = workload_of(trace, {"fp32", 4});
  const Timeline full = simulate(nodes, workload);
  const Timeline bare = simulate(nodes, workload, {SimulateMethod::event_queue, false, false});
  EXPECT_EQ(bare.step_s, full.step_s);
  EXPECT_TRUE(bare.intervals.empty());
  EXPECT_TRUE(bare.breakdown.empty());
  EXPECT_FALSE(full.intervals.empty());

  // Two ranks each receiving before sending: neither send is ever reached.
  Workload stuck;
  stuck.ranks = {{0, 1, {recv_op("recv", 1, 8), send_op("send", 1, 8)}}, {1, 1, {recv_op("recv", 0, 8), send_op("send", 0, 8)}}};
  for (SimulateMethod method : {SimulateMethod::scan, SimulateMethod::event_queue}) {
    try {
      simulate(round, stuck, {method, true, true});
      ADD_FAILURE() << "a deadlock simulated";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("deadlocks"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace strata::project
