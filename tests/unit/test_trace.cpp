// The step traced (train/trace.h): every rank's graph runs on the step simulator without deadlock for every
// schedule, grid and strategy; its operations are the step's (GEMM shapes of each layer, one forward and one
// backward per layer and micro-batch, the data-parallel collectives the formulas count); a grid of thousands of
// ranks is traced on one rank per stage.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "project/compact_runs.h"
#include "project/trace_workload.h"
#include "train/tracer.h"
#include "train/step_formulas.h"
#include "train/trainer.h"

namespace strata::train {
namespace {

TrainConfig small_config() {
  TrainConfig c;
  c.model.name = "trace";
  c.model.layers = 4, c.model.hidden = 64, c.model.heads = 4, c.model.kv_heads = 4, c.model.vocab = 128, c.model.max_seq = 32;
  c.micro_batch = 2, c.seq = 32, c.accumulation = 4;
  return c;
}

project::System fast_system() {
  project::System s;
  s.name = "test";
  s.device.devices_per_node = 4;
  project::ComputePeak fp32;
  fp32.peak_flops.value = 1e12;
  fp32.efficiency.points = {{1, 0.5}};
  s.device.compute["fp32"] = fp32;
  s.device.memory_bandwidth.value = 1e11, s.device.memory_efficiency.value = 0.8;
  s.intra_node.bandwidth.value = 1e11, s.intra_node.latency.value = 1e-6;
  s.inter_node.bandwidth.value = 1e10, s.inter_node.latency.value = 5e-6;
  return s;
}

int count(const StepTrace& t, int rank_index, TraceOpKind kind) {
  int n = 0;
  for (const TraceOp& op : t.ranks[static_cast<std::size_t>(rank_index)].ops) n += op.kind == kind;
  return n;
}

TEST(Trace, EveryScheduleGridAndStrategySimulatesWithoutDeadlock) {
  struct Case {
    coll::GridShape grid;
    Schedule schedule;
    int v;
    const char* strategy;
    Recompute recompute;
    bool sp;
  };
  const std::vector<Case> cases = {
      {{1, 1, 1}, Schedule::one_f_one_b, 1, "NNN", Recompute::none, false},
      {{1, 2, 1}, Schedule::gpipe, 1, "NNN", Recompute::full, false},
      {{1, 2, 2}, Schedule::one_f_one_b, 1, "GGG", Recompute::selective, false},
      {{2, 2, 2}, Schedule::interleaved, 2, "NIG", Recompute::none, true},
      {{2, 4, 4}, Schedule::one_f_one_b, 1, "IIG", Recompute::full, false},
      {{1, 2, 4}, Schedule::interleaved, 2, "ING", Recompute::none, false}};
  for (const Case& k : cases) {
    TrainConfig c = small_config();
    c.schedule = k.schedule, c.virtual_stages = k.v, c.strategy = parse_strategy(k.strategy), c.recompute = k.recompute;
    c.sequence_parallel = k.sp;
    const std::string what = coll::format_grid(k.grid) + " " + name(k.schedule) + " " + k.strategy;
    const StepTrace trace = trace_step(c, k.grid, {2, "tp,pp,dp", {}});
    ASSERT_EQ(static_cast<int>(trace.ranks.size()), k.grid.pp) << what;
    // Each stage's rank: per micro-batch and layer of its stages, six GEMMs forward (QKV, attention out, MLP up and
    // down: 4) and backward (input and weight of each: 8), plus the head's on the last stage.
    for (int r = 0; r < k.grid.pp; ++r) {
      EXPECT_EQ(trace.ranks[static_cast<std::size_t>(r)].weight, k.grid.tp * k.grid.dp) << what;
      const int layers = c.model.layers / k.grid.pp;
      const int head = r == k.grid.pp - 1 ? 3 : 0;  // logits forward; their input and weight gradients
      const int recomputed = k.recompute == Recompute::full ? 4 : 0;
      EXPECT_EQ(count(trace, r, TraceOpKind::gemm), c.accumulation * (layers * (12 + recomputed) + head)) << what << " rank " << r;
      const int attention_calls = c.accumulation * layers * (k.recompute == Recompute::none ? 2 : 3);
      EXPECT_EQ(count(trace, r, TraceOpKind::attention), attention_calls) << what << " rank " << r;
    }
    const project::Timeline timeline = project::simulate(fast_system(), project::workload_of(trace));
    EXPECT_GT(timeline.step_s, 0) << what;
  }
}

// Sequence parallelism reduce-scatters each row-parallel output: every rank contributes the whole (b s, h)
// activation and keeps its b s / tp rows. The traced count is one rank's share; the projection's size is S of
// docs/metrics.md, the whole input b s h elements, in the predicted step's element size.
TEST(Trace, ASequenceParallelReduceScatterIsTheWholeActivation) {
  TrainConfig c = small_config();
  c.sequence_parallel = true;
  const int tp = 4;
  const StepTrace trace = trace_step(c, {tp, 1, 1}, {4, "tp,pp,dp", {}});
  ASSERT_EQ(trace.ranks.size(), 1u);
  const std::vector<TraceOp>& ops = trace.ranks[0].ops;
  const double activation = static_cast<double>(c.micro_batch) * c.seq * c.model.hidden;
  for (int element_bytes : {4, 2}) {
    const project::Workload workload = project::workload_of(trace, {"fp32", element_bytes});
    ASSERT_EQ(workload.ranks.size(), 1u);
    ASSERT_EQ(workload.ranks[0].ops.size(), ops.size());
    std::map<std::string, int> seen;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const TraceOp& op = ops[i];
      if (op.kind != TraceOpKind::collective || op.collective != coll::Operation::reduce_scatter) continue;
      ASSERT_EQ(trace.groups.at(static_cast<std::size_t>(op.group)).ranks.size(), static_cast<std::size_t>(tp)) << op.name;
      EXPECT_EQ(op.count, activation / tp) << op.name;
      const project::Op& predicted = workload.ranks[0].ops[i];
      EXPECT_EQ(predicted.collective, coll::Operation::reduce_scatter) << op.name;
      EXPECT_EQ(predicted.bytes, activation * element_bytes) << op.name << ", " << element_bytes << " B elements";
      ++seen[std::string(op.name)];
    }
    // Each layer's two row-parallel outputs, every micro-batch.
    EXPECT_EQ(seen["reduce-scatter attention out"], c.accumulation * c.model.layers);
    EXPECT_EQ(seen["reduce-scatter mlp out"], c.accumulation * c.model.layers);
  }
}

// A collective the rank waits for right after starting it is blocking (timed by a description's blocking-mode model):
// the tensor-parallel allreduces inside the passes and the loss's; the data-parallel reductions overlapped with
// backward are not, nor those the end of the step waits for together; with overlap off, each is.
TEST(Trace, CollectivesWaitedForAtOnceAreBlocking) {
  TrainConfig c = small_config();
  const StepTrace tp = trace_step(c, {2, 1, 1}, {4, "tp,pp,dp", {}});
  int tp_total = 0;
  for (const TraceOp& op : tp.ranks[0].ops) {
    if (op.kind != TraceOpKind::collective) continue;
    const bool tensor_parallel = tp.groups.at(static_cast<std::size_t>(op.group)).role == "tp";
    if (!tensor_parallel) continue;
    ++tp_total;
    EXPECT_TRUE(op.blocking) << op.name;
  }
  EXPECT_GT(tp_total, 4 * c.accumulation * c.model.layers - 1);
  // The simulator's ops carry it to the description's blocking-mode models.
  const project::Workload workload = project::workload_of(tp, {"fp32", 4});
  for (std::size_t i = 0; i < tp.ranks[0].ops.size(); ++i)
    EXPECT_EQ(workload.ranks[0].ops[i].blocking, tp.ranks[0].ops[i].blocking) << i;

  for (const bool overlap : {true, false}) {
    c.overlap = overlap;
    const StepTrace dp = trace_step(c, {1, 1, 2}, {4, "tp,pp,dp", {}});
    int reductions = 0, blocking = 0;
    for (const TraceOp& op : dp.ranks[0].ops) {
      if (op.kind == TraceOpKind::collective && dp.groups.at(static_cast<std::size_t>(op.group)).role.starts_with("dp"))
        ++reductions, blocking += op.blocking;
    }
    ASSERT_GT(reductions, 2) << "overlap " << overlap;
    if (overlap) {
      EXPECT_LT(blocking, reductions) << "overlapped reductions are not waited for at once";
    } else {
      EXPECT_EQ(blocking, reductions) << "without overlap each reduction is waited for as it is issued";
    }
  }

  // The compacted workload (predict's and the search's) carries the mark too.
  const project::WorkloadOptions options{"fp32", 4};
  project::CompactRuns runs(tp, options);
  std::vector<double> alone = runs.shape_seconds(fast_system());
  const project::Workload& compact = runs.workload(alone);
  int compact_blocking = 0, traced_blocking = 0;
  for (const project::Op& op : compact.ranks[0].ops) compact_blocking += op.blocking;
  for (const TraceOp& op : tp.ranks[0].ops) traced_blocking += op.blocking;
  EXPECT_EQ(compact_blocking, traced_blocking);
}

// The tracer's rule, op by op: a collective is blocking when it was waited for by itself before anything else was
// recorded.
TEST(Trace, OnlyACollectiveWaitedForAloneIsBlocking) {
  TraceGroups groups;
  Tracer tracer(groups);
  const coll::Group group("dp", std::vector<int>{0, 1}, 0, std::vector<int>{0, 0}, tracer);
  std::vector<coll::Work> works;  // a traced operation's Work waits for the tracer's word when it goes
  auto allreduce = [&] {
    works.push_back(tracer.collective(group, coll::Operation::allreduce, coll::Algo::library, 8, coll::DataType::float32));
    return tracer.last_operation();
  };
  const int alone = allreduce();
  tracer.complete(alone);
  const int first = allreduce(), second = allreduce();  // one wait for both: the second queues behind the first
  tracer.complete(first, false);
  tracer.complete(second, false);
  const int behind = allreduce();
  tracer.gemm("gemm", 4, 4, 4);  // recorded before the wait: the rank computed meanwhile
  tracer.complete(behind);
  const int earlier = allreduce(), last = allreduce();
  tracer.complete(earlier);  // by itself, but another was issued after it
  tracer.complete(last);     // by itself and the last recorded, although the earlier one was in flight when it began
  const std::vector<TraceOp> ops = tracer.take();
  EXPECT_TRUE(ops.at(static_cast<std::size_t>(alone)).blocking);
  EXPECT_TRUE(ops.at(static_cast<std::size_t>(last)).blocking);
  for (const int op : {first, second, behind, earlier}) EXPECT_FALSE(ops.at(static_cast<std::size_t>(op)).blocking) << op;
}

// The passes that move tensor-parallel collectives beside GEMMs take away the mark of each one they move.
TEST(Trace, OverlapPassesClearTheBlockingMark) {
  TrainConfig c = small_config();
  c.sequence_parallel = true;
  StepTrace trace = trace_step(c, {2, 1, 1}, {4, "tp,pp,dp", {}});
  auto blocking_tp = [&] {
    int n = 0;
    for (const TraceOp& op : trace.ranks[0].ops)
      n += op.kind == TraceOpKind::collective && op.blocking && trace.groups.at(static_cast<std::size_t>(op.group)).role == "tp";
    return n;
  };
  const int before = blocking_tp();
  const int moved = overlap_tensor_parallel_communication(trace);
  ASSERT_GT(moved, 0);
  EXPECT_EQ(blocking_tp(), before - moved);
  // Every forward all-gather feeds a linear layer (its bias fill, which reads nothing gathered, then its GEMM): all
  // of them run beside their GEMM.
  int forward_gathers = 0;
  for (const TraceOp& op : trace.ranks[0].ops)
    if (op.kind == TraceOpKind::collective && op.collective == coll::Operation::allgather && op.phase == "forward" &&
        trace.groups.at(static_cast<std::size_t>(op.group)).role == "tp") {
      ++forward_gathers;
      EXPECT_FALSE(op.blocking) << op.name << " was not moved beside its GEMM";
    }
  EXPECT_GE(forward_gathers, 2 * c.accumulation * c.model.layers);
}

// A grid of 10,240 ranks (tp 8, pp 16, dp 80) of GPT-3 175B, interleaved: one rank per stage traced, each standing
// for 640; the trace takes seconds, not the 10,240 ranks' worth.
TEST(Trace, ThousandsOfRanksTraceOnOneRankPerStage) {
  TrainConfig c;
  c.model = preset("gpt3-175b");
  c.micro_batch = 1, c.seq = 2048, c.accumulation = 16;
  c.schedule = Schedule::interleaved, c.virtual_stages = 2, c.strategy = parse_strategy("NNG");
  c.recompute = Recompute::selective, c.sequence_parallel = true;
  const auto start = std::chrono::steady_clock::now();
  const StepTrace trace = trace_step(c, {8, 16, 80}, {8, "tp,pp,dp", {}});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ trace    ] GPT-3 175B on 10,240 ranks (tp 8, pp 16, dp 80, interleaved): %zu ranks traced in %.2f s\n",
              trace.ranks.size(), seconds);
  ASSERT_EQ(trace.ranks.size(), 16u);
  int weight = 0;
  for (const TraceRank& r : trace.ranks) weight += r.weight;
  EXPECT_EQ(weight, 10240);
}

// An op's name outlives the trace it came from: a copy holds the names its views read (the sanitizer build reads
// them after the original is gone).
TEST(Trace, NamesLiveAsLongAsAnyCopyOfTheTrace) {
  TrainConfig c = small_config();
  c.schedule = Schedule::one_f_one_b;
  StepTrace copy;
  std::set<std::string> names;
  {
    const StepTrace trace = trace_step(c, {2, 2, 2}, {4, "tp,pp,dp", {}});
    copy = trace;
    for (const TraceRank& rank : trace.ranks)
      for (const TraceOp& op : rank.ops) names.insert(std::string(op.name));
  }
  std::set<std::string> read_after;
  for (const TraceRank& rank : copy.ranks)
    for (const TraceOp& op : rank.ops) read_after.insert(std::string(op.name));
  EXPECT_EQ(read_after, names);
  EXPECT_TRUE(names.count("send activations mb 0 stage 0")) << "a transfer's name, made for it";
}

// The permissions of the mapping that holds `address` in /proc/self/maps ("---p": reserved, no access).
std::string permissions_at(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string range, permissions;
    fields >> range >> permissions;
    const std::size_t dash = range.find('-');
    const std::uintptr_t begin = std::stoull(range.substr(0, dash), nullptr, 16);
    const std::uintptr_t end = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (begin <= at && at < end) return permissions;
  }
  return "unmapped";
}

// A traced step's buffers are addresses only: a released reservation stays reserved (inaccessible) and is handed
// to the next reservation of its size, once.
TEST(Trace, AddressSpaceReservationsAreReusedBySizeAndStayInaccessible) {
  const std::size_t floats = 3 * 1024 * 1023;  // a size nothing else here reserves
  TrackedBuffer<float> first(MemoryCategory::workspace, floats, Backing::address_space);
  const float* address = first.data();
  EXPECT_EQ(permissions_at(address), "---p");
  first.release();
  EXPECT_EQ(permissions_at(address), "---p") << "kept for the next reservation of its size";
  TrackedBuffer<float> again(MemoryCategory::workspace, floats, Backing::address_space);
  EXPECT_EQ(again.data(), address);
  EXPECT_EQ(permissions_at(again.data()), "---p");
  TrackedBuffer<float> beside(MemoryCategory::workspace, floats, Backing::address_space);
  EXPECT_NE(beside.data(), again.data());
  TrackedBuffer<float> other(MemoryCategory::workspace, floats + 1024, Backing::address_space);
  EXPECT_NE(other.data(), address);
  const float* larger = other.data();
  other.release();
  TrackedBuffer<float> smaller(MemoryCategory::workspace, floats, Backing::address_space);
  EXPECT_NE(smaller.data(), larger) << "a larger reservation handed to a smaller request";
}

// What is kept is bounded in bytes (8 TiB; the address space is 128 TiB): past it, the oldest is unmapped.
TEST(Trace, KeptReservationsAreBoundedInBytes) {
  const std::size_t floats = (std::size_t{5} << 40) / sizeof(float);  // 5 TiB of addresses, no memory
  TrackedBuffer<float> older(MemoryCategory::workspace, floats, Backing::address_space);
  TrackedBuffer<float> newer(MemoryCategory::workspace, floats, Backing::address_space);
  const float* older_address = older.data();
  const float* newer_address = newer.data();
  older.release();
  newer.release();
  EXPECT_EQ(permissions_at(newer_address), "---p");
  EXPECT_NE(permissions_at(older_address), "---p") << "10 TiB kept";
  TrackedBuffer<float> again(MemoryCategory::workspace, floats, Backing::address_space);
  EXPECT_EQ(again.data(), newer_address);
}

}  // namespace
}  // namespace strata::train
