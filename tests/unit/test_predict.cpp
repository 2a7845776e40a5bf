// A step predicted from its trace (project/predict.h): closed forms through predict's own path (one GEMM, one
// allreduce with a late rank, a two-stage pipeline with known times), the breakdown's mapping of waits to
// strata-step's phases, the interval from the description's spreads, and on a traced step the phases every op carries
// and components that add up to each rank's step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "project/predict.h"
#include "project/step_prediction.h"
#include "train/trainer.h"

namespace strata::project {
namespace {

constexpr double kRel = 1e-12;

#define EXPECT_CLOSE(got, want) EXPECT_NEAR((got), (want), kRel * std::max(1e-9, std::abs(static_cast<double>(want)))) << "got " << (got) << " want " << (want)

// Round numbers: fp32 at 1 TFLOP/s x 0.5, memory 100 GB/s at full efficiency (an elementwise op of E elements of 4 B
// takes 4E / 1e11 s), links of 10 GB/s and 1 us inside a node, 1 GB/s and 10 us between.
System test_system() {
  System s;
  s.name = "test";
  s.device.devices_per_node = 8;
  s.device.compute["fp32"].peak_flops = {1e12, 0, ""};
  s.device.compute["fp32"].efficiency = {{{1, 0.5}}, 0, ""};
  s.device.memory_bandwidth = {1e11, 0, ""};
  s.device.memory_efficiency = {1.0, 0, ""};
  s.intra_node.bandwidth = {1e10, 0, ""};
  s.intra_node.latency = {1e-6, 0, ""};
  s.inter_node.bandwidth = {1e9, 0, ""};
  s.inter_node.latency = {1e-5, 0, ""};
  s.overlap_slowdown = {0, 0, ""};
  return s;
}

double elementwise_s(double elements) { return 4 * elements / 1e11; }

train::TraceOp compute(const char* phase, double elements, std::vector<int> depends_on = {}) {
  train::TraceOp op;
  op.kind = train::TraceOpKind::elementwise, op.name = "work", op.phase = phase, op.elements = elements;
  op.depends_on = std::move(depends_on);
  return op;
}

train::TraceOp allreduce(int group, double count, std::vector<int> depends_on, int element_bytes = 4, const char* phase = "") {
  train::TraceOp op;
  op.kind = train::TraceOpKind::collective, op.name = "allreduce", op.phase = phase, op.group = group;
  op.collective = coll::Operation::allreduce, op.count = count, op.element_bytes = element_bytes;
  op.algorithm = "ring", op.depends_on = std::move(depends_on);
  return op;
}

train::TraceOp transfer(bool send, int group, int peer, double count, std::vector<int> depends_on) {
  train::TraceOp op;
  op.kind = send ? train::TraceOpKind::send : train::TraceOpKind::recv, op.name = send ? "send" : "recv";
  op.group = group, op.peer = peer, op.count = count, op.depends_on = std::move(depends_on);
  return op;
}

TEST(Predict, OneGemmTakesItsRooflineTimeAsForward) {
  train::StepTrace trace;
  train::TraceOp gemm;
  gemm.kind = train::TraceOpKind::gemm, gemm.name = "qkv", gemm.phase = "forward", gemm.m = 256, gemm.n = 512, gemm.k = 128;
  trace.ranks = {{0, 1, {gemm}}};
  const double t = 2.0 * 256 * 512 * 128 / (1e12 * 0.5);
  const Prediction p = predict(test_system(), trace, {"fp32", 4});
  EXPECT_CLOSE(p.step_s, t);
  EXPECT_CLOSE(p.mean.forward_s, t);
  EXPECT_CLOSE(p.mean.step_s, t);
  EXPECT_EQ(p.mean.backward_s + p.mean.comm_exposed_s + p.mean.idle_s + p.mean.optimizer_s, 0);
  // No spreads: the interval is the point.
  EXPECT_CLOSE(p.step_low_s, t);
  EXPECT_CLOSE(p.step_high_s, t);
}

// Two ranks reduce 4 MB; rank 1 computes twice as long first, so rank 0 waits for it inside the collective (strata-step
// counts that wait as exposed communication, as the simulator's "idle" would not).
TEST(Predict, OneAllreduceWithALateRankMatchesTheClosedForm) {
  const double e = 1e6, count = 1e6;
  train::StepTrace trace;
  trace.groups = {{"dp", {0, 1}}};
  trace.ranks_per_node = 2;
  for (int r = 0; r < 2; ++r)
    trace.ranks.push_back({r, 1, {compute("backward", (r + 1) * e), allreduce(0, count, {0}), compute("optimizer", e, {1})}});
  const double ta = elementwise_s(e), tar = 1e-6 + 4 * count * 1.0 / 1e10;  // n = 2: bus factor 2 (n - 1) / n = 1
  const Prediction p = predict(test_system(), trace, {"fp32", 4});
  EXPECT_CLOSE(p.step_s, 3 * ta + tar);
  EXPECT_CLOSE(p.ranks[0].backward_s, ta);
  EXPECT_CLOSE(p.ranks[0].comm_exposed_s, ta + tar);
  EXPECT_CLOSE(p.ranks[0].exposed_by_role.at("dp"), ta + tar);
  EXPECT_CLOSE(p.ranks[0].optimizer_s, ta);
  EXPECT_CLOSE(p.ranks[1].comm_exposed_s, tar);
  EXPECT_CLOSE(p.mean.backward_s, 1.5 * ta);
  EXPECT_CLOSE(p.mean.comm_exposed_s, 0.5 * ta + tar);
  EXPECT_CLOSE(p.mean.idle_s, 0);
  // The mean over ranks weighs each traced rank by the ranks it stands for.
  trace.ranks[0].weight = 3;
  EXPECT_CLOSE(predict(test_system(), trace, {"fp32", 4}).mean.backward_s, (3 * ta + 2 * ta) / 4);
  trace.ranks[0].weight = 1;
  // The same group on two nodes (one rank each) takes the inter-node tier.
  trace.ranks_per_node = 1;
  EXPECT_CLOSE(predict(test_system(), trace, {"fp32", 4}).step_s, 3 * ta + 1e-5 + 4 * count / 1e9);
}

// Waits strata-step does not count as communication: a scalar (fp64) reduction counts in the phase it was issued in,
// the tied token table's reduction as idle; a tensor-parallel collective is comm_tp and exposed.
TEST(Predict, WaitsFollowStrataStepsAccounting) {
  const double e = 1e6;
  const double ta = elementwise_s(e);
  auto wait_of = [&](const char* role, int element_bytes, const char* phase) {
    train::StepTrace trace;
    trace.groups = {{role, {0, 1}}};
    trace.ranks_per_node = 2;
    for (int r = 0; r < 2; ++r)
      trace.ranks.push_back({r, 1, {compute("backward", (r + 1) * e), allreduce(0, 1, {0}, element_bytes, phase),
                                    compute("optimizer", e, {1})}});
    return predict(test_system(), trace, {"fp32", 4}).ranks[0];
  };
  const double tiny = 1e-6 + 8.0 / 1e10;  // one fp64 element
  const StepComponents norm = wait_of("dp", 8, "optimizer");
  EXPECT_CLOSE(norm.optimizer_s, ta + ta + tiny);
  EXPECT_EQ(norm.comm_exposed_s, 0);
  const StepComponents embedding = wait_of("embedding", 4, "");
  EXPECT_CLOSE(embedding.idle_s, ta + 1e-6 + 4.0 / 1e10);
  EXPECT_EQ(embedding.comm_exposed_s, 0);
  const StepComponents tp = wait_of("tp", 4, "backward");
  EXPECT_CLOSE(tp.comm_tp_s, ta + 1e-6 + 4.0 / 1e10);
  EXPECT_CLOSE(tp.comm_exposed_s, tp.comm_tp_s);
  EXPECT_CLOSE(tp.exposed_by_role.at("tp"), tp.comm_tp_s);
  EXPECT_EQ(tp.pipeline_wait_s, 0);
  EXPECT_EQ(wait_kind(train::StepTrace{{{"dp_by_piece", {0, 1}}}, {}, 1, "fp32", 4, {}}, allreduce(0, 1, {})), WaitKind::data_parallel);
  EXPECT_EQ(wait_role(train::StepTrace{{{"dp_by_piece", {0, 1}}}, {}, 1, "fp32", 4, {}}, allreduce(0, 1, {})), "dp");
}

// Two stages, one micro-batch: stage 0's forward, its output to stage 1, stage 1's forward and backward, the gradient
// back, stage 0's backward: 2 (t_f + t_b + t_x), (p - 1 + m)(t_f + t_b) plus a transfer each way. Stage 0 waits
// t_f + t_b + 2 t_x for the gradient; stage 1 waits t_f + t_x for its input and t_x for its send to leave.
TEST(Predict, TwoStagePipelineMatchesTheClosedForm) {
  const double ef = 2e6, eb = 5e6, count = 1e6;
  train::StepTrace trace;
  trace.groups = {{"pp", {0, 1}}};
  trace.ranks_per_node = 2;
  trace.ranks.push_back({0, 1, {compute("forward", ef), transfer(true, 0, 1, count, {0}), transfer(false, 0, 1, count, {0}),
                                compute("backward", eb, {2})}});
  trace.ranks.push_back({1, 1, {transfer(false, 0, 0, count, {}), compute("forward", ef, {0}), compute("backward", eb),
                                transfer(true, 0, 0, count, {2})}});
  const double tf = elementwise_s(ef), tb = elementwise_s(eb), tx = 1e-6 + 4 * count / 1e10;
  const Prediction p = predict(test_system(), trace, {"fp32", 4});
  EXPECT_CLOSE(p.step_s, 2 * (tf + tb + tx));
  EXPECT_CLOSE(p.ranks[0].pipeline_wait_s, tf + tb + 2 * tx);
  EXPECT_CLOSE(p.ranks[0].exposed_by_role.at("pp"), tf + tb + 2 * tx);
  EXPECT_CLOSE(p.ranks[1].pipeline_wait_s, tf + 2 * tx);
  EXPECT_CLOSE(p.ranks[1].step_s, 2 * tf + tb + 2 * tx);
  for (const StepComponents& c : p.ranks) {
    EXPECT_CLOSE(c.forward_s, tf);
    EXPECT_CLOSE(c.backward_s, tb);
    EXPECT_CLOSE(c.comm_exposed_s, c.pipeline_wait_s);
    EXPECT_CLOSE(c.idle_s, 0);
  }
  // 2-byte elements halve the transfers.
  const double tx2 = 1e-6 + 2 * count / 1e10;
  EXPECT_CLOSE(predict(test_system(), trace, {"fp32", 2}).step_s, 2 * (elementwise_s(ef) / 2 + elementwise_s(eb) / 2 + tx2));
}

// The interval: every figure at the ends of its spread. Compute through memory bandwidth (spread 0.1) and a transfer
// through the tier (latency and bandwidth spreads 0.5): the ends are the closed form with each time scaled by 1 -+ s.
TEST(Predict, TheIntervalTakesEachFigureToTheEndOfItsSpread) {
  System s = test_system();
  s.device.memory_bandwidth.relative_spread = 0.1;
  s.intra_node.latency.relative_spread = 0.5;
  s.intra_node.bandwidth.relative_spread = 0.5;
  const double e = 1e6, count = 1e6;
  train::StepTrace trace;
  trace.groups = {{"pp", {0, 1}}};
  trace.ranks_per_node = 2;
  trace.ranks.push_back({0, 1, {compute("forward", e), transfer(true, 0, 1, count, {0})}});
  trace.ranks.push_back({1, 1, {transfer(false, 0, 0, count, {}), compute("forward", e, {0})}});
  const double tc = elementwise_s(e), tx = 1e-6 + 4 * count / 1e10;
  const Prediction p = predict(s, trace, {"fp32", 4});
  EXPECT_CLOSE(p.step_s, 2 * tc + tx);
  EXPECT_CLOSE(p.step_low_s, 2 * tc * 0.9 + tx * 0.5);
  EXPECT_CLOSE(p.step_high_s, 2 * tc * 1.1 + tx * 1.5);
  // A spread above 0.9 counts as 0.9 toward the faster end, whole toward the slower; efficiencies stay at most 1.
  s.overlap_slowdown = {0.2, 2.0, ""};
  s.device.compute["fp32"].efficiency.relative_spread = 0.8;
  EXPECT_CLOSE(spread_end(s, -1).overlap_slowdown.value, 0.2 * 0.1);
  EXPECT_CLOSE(spread_end(s, +1).overlap_slowdown.value, 0.2 * 3.0);
  EXPECT_CLOSE(spread_end(s, -1).device.compute.at("fp32").efficiency.points[0].efficiency, 1.0);
  EXPECT_CLOSE(spread_end(s, +1).device.compute.at("fp32").efficiency.points[0].efficiency, 0.5 / 1.8);
  // A fitted collective's range moves by its RMS residual.
  CollectiveModel model;
  model.op = coll::Operation::allreduce, model.algorithm = "ring", model.group = GroupKind::intra_node, model.ranks = 2;
  SizeRange range;
  range.model = {{1e-6, 0, ""}, {1e10, 0, ""}};
  range.residual = 0.25;
  model.ranges = {range};
  s.collectives = {model};
  const System slow = spread_end(s, +1);
  EXPECT_CLOSE(slow.collectives[0].seconds(4e6, 2), 1.25 * model.seconds(4e6, 2));
  // A named attention kernel's speeds, as rates: slower at the slow end, faster at the fast one.
  s.device.attention_kernels["slow"] = {{0.8, 0.25, ""}, {0.5, 0.5, ""}};
  EXPECT_CLOSE(spread_end(s, +1).device.attention_kernels.at("slow").forward.value, 0.8 / 1.25);
  EXPECT_CLOSE(spread_end(s, +1).device.attention_kernels.at("slow").backward.value, 0.5 / 1.5);
  EXPECT_CLOSE(spread_end(s, -1).device.attention_kernels.at("slow").backward.value, 0.5 / 0.5);
}

// A traced step: every op carries the phase strata-step times it in, and on every traced rank the components add up
// to the rank's own step.
TEST(Predict, TracedStepsCarryPhasesAndTheirComponentsAddUp) {
  train::TrainConfig c;
  c.model.name = "predict";
  c.model.layers = 4, c.model.hidden = 64, c.model.heads = 4, c.model.kv_heads = 4, c.model.vocab = 128, c.model.max_seq = 32;
  c.micro_batch = 2, c.seq = 32, c.accumulation = 4;
  c.recompute = train::Recompute::full;
  c.strategy = train::parse_strategy("NNG");
  const train::StepTrace trace = train::trace_step(c, {2, 2, 2}, {4, "tp,pp,dp", {}});
  std::map<std::string, int> phases;
  for (const train::TraceRank& r : trace.ranks)
    for (const train::TraceOp& op : r.ops) ++phases[std::string(op.phase)];
  EXPECT_GT(phases["forward"], 0);
  EXPECT_GT(phases["backward"], 0);
  EXPECT_GT(phases["recompute"], 0);
  EXPECT_GT(phases["optimizer"], 0);
  for (const train::TraceRank& r : trace.ranks) {
    // Per micro-batch and layer of the stage (2 of 4 layers): four GEMMs recomputed, eight in the backward proper (the
    // input and weight gradients of each), and the head's two on the last stage; the forward's four, and the head's.
    std::map<std::string, int> gemms;
    for (const train::TraceOp& op : r.ops) {
      if (op.kind == train::TraceOpKind::gemm) ++gemms[std::string(op.phase)];
      if (op.name == "adamw") {
        EXPECT_EQ(op.phase, "optimizer");
      }
    }
    const bool head = &r == &trace.ranks.back();
    EXPECT_EQ(gemms["recompute"], c.accumulation * 2 * 4);
    EXPECT_EQ(gemms["backward"], c.accumulation * (2 * 8 + (head ? 2 : 0)));
    EXPECT_EQ(gemms["forward"], c.accumulation * (2 * 4 + (head ? 1 : 0)));
  }
  System s = test_system();
  s.overlap_slowdown = {0.3, 0, ""};
  const Prediction p = predict(s, trace, {"fp32", 4});
  for (const StepComponents& r : p.ranks) {
    const double sum = r.forward_s + r.backward_s + r.recompute_window_s + r.optimizer_s + r.comm_exposed_s + r.idle_s;
    EXPECT_NEAR(sum, r.step_s, 1e-9 * r.step_s);
    EXPECT_GT(r.recompute_s, 0);
    EXPECT_LE(r.recompute_s, r.backward_s);
    EXPECT_GT(r.comm_tp_s, 0);
    EXPECT_LE(r.comm_tp_s + r.pipeline_wait_s, r.comm_exposed_s * (1 + 1e-12));
  }
  EXPECT_LE(p.step_low_s, p.step_s);
  EXPECT_GE(p.step_high_s, p.step_s);
}

// A two-layer model's step, micro-batches of two sequences of 32, two of them, under `strategy` on `grid` (tp, pp, dp),
// two ranks per node.
train::StepTrace small_trace(const std::string& strategy, const coll::GridShape& grid) {
  train::TrainConfig c;
  c.model.name = "sharded";
  c.model.layers = 2, c.model.hidden = 64, c.model.heads = 4, c.model.kv_heads = 4, c.model.vocab = 128, c.model.max_seq = 32;
  c.micro_batch = 2, c.seq = 32, c.accumulation = 2;
  c.strategy = train::parse_strategy(strategy);
  return train::trace_step(c, grid, {2, "tp,pp,dp", {}});
}

// A framework's sharding collectives (WorkloadOptions::sharding_algorithm): exactly the data-parallel all-gathers and
// reduce-scatters are costed under its name; a description without collectives of that name gives the step of the
// traced algorithms, one with slower ones a slower step, the same on both simulators.
TEST(Predict, ShardingCollectivesAreCostedUnderTheFrameworksAlgorithm) {
  const train::StepTrace trace = small_trace("GGG", {1, 1, 4});  // dp over two nodes
  const WorkloadOptions plain{"fp32", 4};
  WorkloadOptions framework = plain;
  framework.sharding_algorithm = "framework";
  const Workload traced = workload_of(trace, plain), costed = workload_of(trace, framework);
  int renamed = 0, kept = 0;
  for (std::size_t r = 0; r < trace.ranks.size(); ++r)
    for (std::size_t i = 0; i < trace.ranks[r].ops.size(); ++i) {
      const train::TraceOp& t = trace.ranks[r].ops[i];
      if (t.kind != train::TraceOpKind::collective) continue;
      const bool sharding = (t.collective == coll::Operation::allgather ||
                             t.collective == coll::Operation::reduce_scatter) &&
                            trace.groups.at(static_cast<std::size_t>(t.group)).role.rfind("dp", 0) == 0;
      EXPECT_EQ(costed.ranks[r].ops[i].algorithm, sharding ? "framework" : traced.ranks[r].ops[i].algorithm) << t.name;
      (sharding ? renamed : kept) += 1;
    }
  EXPECT_GT(renamed, 0);
  EXPECT_GT(kept, 0);  // the gradient norm's and the loss's allreduces

  System s = test_system();
  EXPECT_CLOSE(predict(s, trace, framework).step_s, predict(s, trace, plain).step_s);
  for (coll::Operation op : {coll::Operation::allgather, coll::Operation::reduce_scatter}) {
    CollectiveModel slow;
    slow.op = op, slow.algorithm = "framework", slow.group = GroupKind::hierarchical, slow.ranks = 4;
    SizeRange range;
    range.model = {{1e-5, 0, ""}, {1e7, 0, ""}};  // a hundredth of the inter-node tier's bandwidth
    slow.ranges = {range};
    s.collectives.push_back(slow);
  }
  const double as_traced = predict(s, trace, plain).step_s, as_framework = predict(s, trace, framework).step_s;
  EXPECT_CLOSE(as_traced, predict(test_system(), trace, plain).step_s);
  EXPECT_GT(as_framework, 2 * as_traced);
  EXPECT_NEAR(predict(s, trace, framework, {true, false}).step_s, as_framework, 1e-9 * as_framework);
}

// A framework that reduces gradients in fp32 under bf16 compute (WorkloadOptions::gradient_reduction_bytes): the
// data-parallel reduce-scatters and allreduces of the step's floats move 4-byte elements, everything else (the
// parameter all-gathers, fp64 scalars) what it moved; the step is slower, the same on both simulators, and bf16
// reductions under a 4-byte step make it faster.
TEST(Predict, GradientReductionsMoveTheFrameworksElementSize) {
  const train::StepTrace trace = small_trace("GGG", {1, 1, 4});
  const WorkloadOptions bf16{"fp32", 2};
  WorkloadOptions fp32_reductions = bf16;
  fp32_reductions.gradient_reduction_bytes = 4;
  const Workload plain = workload_of(trace, bf16), wide = workload_of(trace, fp32_reductions);
  int doubled = 0, kept = 0;
  for (std::size_t r = 0; r < trace.ranks.size(); ++r)
    for (std::size_t i = 0; i < trace.ranks[r].ops.size(); ++i) {
      const train::TraceOp& t = trace.ranks[r].ops[i];
      if (t.kind != train::TraceOpKind::collective) continue;
      const bool gradients = t.element_bytes == 4 && t.collective != coll::Operation::allgather &&
                             trace.groups.at(static_cast<std::size_t>(t.group)).role.rfind("dp", 0) == 0;
      EXPECT_EQ(wide.ranks[r].ops[i].bytes, (gradients ? 2 : 1) * plain.ranks[r].ops[i].bytes) << t.name;
      EXPECT_EQ(collective_element_bytes(trace, t, fp32_reductions), gradients ? 4 : t.element_bytes == 8 ? 8 : 2);
      (gradients ? doubled : kept) += 1;
    }
  EXPECT_GT(doubled, 0);
  EXPECT_GT(kept, 0);  // the parameter gathers and the fp64 scalars

  System s = test_system();
  const double narrow = predict(s, trace, bf16).step_s, widened = predict(s, trace, fp32_reductions).step_s;
  EXPECT_GT(widened, narrow);
  EXPECT_NEAR(predict(s, trace, fp32_reductions, {true, false}).step_s, widened, 1e-9 * widened);
  // bf16 reductions under a 4-byte step: half the reductions' bytes.
  const WorkloadOptions fp32{"fp32", 4};
  WorkloadOptions bf16_reductions = fp32;
  bf16_reductions.gradient_reduction_bytes = 2;
  EXPECT_LT(predict(s, trace, bf16_reductions).step_s, predict(s, trace, fp32).step_s);
}

// On a grid of every dimension the gradient reductions are the dp groups' reductions and the tied embedding's
// allreduce across the first and last stage; the tensor-parallel allreduces (activations) and the pipeline's
// transfers keep the step's element size.
TEST(Predict, GradientReductionsAreTheDataParallelAndEmbeddingGroupsOnly) {
  const train::StepTrace trace = small_trace("NNN", {2, 2, 2});
  WorkloadOptions fp32_reductions{"fp32", 2};
  fp32_reductions.gradient_reduction_bytes = 4;
  std::map<std::string, std::pair<int, int>> by_role;  // role -> (ops at 4 bytes, ops at 2 bytes)
  for (const train::TraceRank& rank : trace.ranks)
    for (const train::TraceOp& t : rank.ops) {
      if (t.kind != train::TraceOpKind::collective || t.element_bytes != 4) continue;
      const std::string& role = trace.groups.at(static_cast<std::size_t>(t.group)).role;
      const int bytes = collective_element_bytes(trace, t, fp32_reductions);
      ASSERT_TRUE(bytes == 4 || bytes == 2) << t.name;
      (bytes == 4 ? by_role[role].first : by_role[role].second) += 1;
    }
  EXPECT_GT(by_role["dp"].first, 0);
  EXPECT_EQ(by_role["dp"].second, 0);
  EXPECT_GT(by_role["embedding"].first, 0);
  EXPECT_EQ(by_role["embedding"].second, 0);
  EXPECT_EQ(by_role["tp"].first, 0);
  EXPECT_GT(by_role["tp"].second, 0);
  for (const train::TraceRank& rank : trace.ranks)
    for (const train::TraceOp& t : rank.ops) {
      if (t.kind != train::TraceOpKind::send && t.kind != train::TraceOpKind::recv) continue;
      EXPECT_EQ(workload_op(trace, t, fp32_reductions).bytes, t.count * 2) << t.name;
    }
}

// A workload's memory layout: logits kept in fp32 under the fp32 loss (the cast Megatron's cross entropy saves its
// softmax in), at the element size under the fused one; dropout masks as the workload says; unfused attention keeps
// the scores; fp8 GEMMs keep their inputs in 1 byte.
TEST(Predict, TheMemoryLayoutFollowsTheWorkload) {
  WorkloadOptions w;
  w.dtype = "bf16", w.element_bytes = 2;
  train::GpuLayout layout = gpu_layout(w);
  EXPECT_EQ(layout.gemm_input_bytes, 0);
  w.dtype = "fp8";
  EXPECT_EQ(gpu_layout(w).gemm_input_bytes, 1);
  w.dtype = "bf16";
  EXPECT_EQ(layout.element_bytes, 2);
  EXPECT_EQ(layout.logit_bytes, 2);
  EXPECT_TRUE(layout.dropout);
  EXPECT_TRUE(layout.flash_attention);
  w.loss = "fp32", w.dropout = false, w.attention = "unfused";
  layout = gpu_layout(w);
  EXPECT_EQ(layout.logit_bytes, 4);
  EXPECT_FALSE(layout.dropout);
  EXPECT_FALSE(layout.flash_attention);
  w.loss = "fp32-fused";  // Megatron-Core's loss fusion saves the same fp32 softmax
  EXPECT_EQ(gpu_layout(w).logit_bytes, 4);
}

// A loss on fp32 logits: per logit 38 bytes forward and 14 backward pass by pass ("fp32"), 22 and 10 with
// Megatron-Core's loss fusion ("fp32-fused"), whether the trace fuses the forward into one op (no tensor parallelism)
// or splits it into the max and the sum (tensor parallelism); every other op keeps its bytes, and the fused loss
// ("fused") moves the elements' size.
TEST(Predict, AnFp32LossMovesMegatronsBytesPerLogit) {
  struct Mode {
    const char* loss;
    double forward, max, backward;  // bytes per logit: the forward, its cast with the max, the backward
  };
  for (const Mode mode : {Mode{"fp32", 38, 10, 14}, Mode{"fp32-fused", 22, 6, 10}}) {
    // The forward's bytes per logit whichever way the trace splits it.
    EXPECT_EQ(loss_bytes_per_element(mode.loss, "cross-entropy"), mode.forward);
    EXPECT_EQ(loss_bytes_per_element(mode.loss, "logit max"), mode.max);
    EXPECT_EQ(loss_bytes_per_element(mode.loss, "sum of exponentials"), mode.forward - mode.max);
    EXPECT_FALSE(loss_bytes_per_element(mode.loss, "gelu").has_value());
    EXPECT_FALSE(loss_bytes_per_element("fused", "cross-entropy").has_value());
    EXPECT_TRUE(fp32_logits(mode.loss));
    for (const coll::GridShape grid : {coll::GridShape{1, 1, 2}, coll::GridShape{2, 1, 1}}) {
      const train::StepTrace trace = small_trace("NNN", grid);
      const WorkloadOptions fused{"bf16", 2};
      WorkloadOptions fp32_loss = fused;
      fp32_loss.loss = mode.loss;
      double backward = 0, forward = 0, logits = 0;
      int forward_ops = 0, others = 0;
      for (const train::TraceOp& t : trace.ranks.front().ops) {
        if (t.kind != train::TraceOpKind::elementwise) continue;
        EXPECT_EQ(elementwise_bytes(t, fused), t.elements * 2) << t.name;
        EXPECT_EQ(elementwise_name(t, fused), t.name);
        const double bytes = elementwise_bytes(t, fp32_loss);
        const Op op = workload_op(trace, t, fp32_loss);
        EXPECT_EQ(op.bytes, bytes) << t.name;
        if (t.name == "cross-entropy backward") {
          backward += bytes, logits += t.elements / 2;
        } else if (const std::optional<double> per_element = loss_bytes_per_element(mode.loss, t.name)) {
          EXPECT_EQ(bytes, *per_element * t.elements) << t.name;
          forward += bytes;
          ++forward_ops;
        } else {
          EXPECT_EQ(bytes, t.elements * 2) << t.name;
          ++others;
          continue;
        }
        // Priced as the framework's passes, not as a measured rate of the step's fused loss kernel.
        EXPECT_EQ(op.name, std::string(t.name) + " (" + mode.loss + " passes)");
        EXPECT_EQ(elementwise_kernel_of(op.name), "");
      }
      ASSERT_GT(logits, 0) << grid.tp;
      EXPECT_EQ(forward_ops, grid.tp == 1 ? 2 : 4) << grid.tp;  // the fused op, or the max and the sum, per micro-batch
      EXPECT_GT(others, 0);
      // The forward ops' elements are the logits and a few per row (the max's and the sum's results).
      EXPECT_GE(forward, mode.forward * logits) << mode.loss << " tp " << grid.tp;
      EXPECT_LE(forward, 1.05 * mode.forward * logits) << mode.loss << " tp " << grid.tp;
      EXPECT_EQ(backward, mode.backward * logits) << mode.loss << " tp " << grid.tp;
    }
  }
  EXPECT_FALSE(fp32_logits("fused"));
}

// A loss the project does not know is refused by name, not priced as the fused one; each known mode predicts.
TEST(Predict, AnUnknownLossIsRefused) {
  const train::StepTrace trace = small_trace("NNN", coll::GridShape{1, 1, 2});
  for (const std::string& loss : loss_modes()) {
    WorkloadOptions options{"fp32", 4};
    options.loss = loss;
    EXPECT_GT(predict(test_system(), trace, options).step_s, 0) << loss;
  }
  WorkloadOptions unknown{"fp32", 4};
  unknown.loss = "fp16";
  try {
    predict(test_system(), trace, unknown);
    ADD_FAILURE() << "an unknown loss predicted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("fp16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::project
