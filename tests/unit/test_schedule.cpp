// Pipeline schedules (train/schedule.h): every rank's list runs each forward and backward once and in dependency
// order, the messages between two ranks are sent in the order they are received (so point-to-point operations
// matched in order, as the process groups match them, pair up right), the activations in flight are the
// schedules' known counts, and on the step simulator (project/simulate.h) with uniform stages and free transfers
// the idle time is the closed form: (p - 1) / m of the ideal time for GPipe and 1F1B, (p - 1) / (v m) interleaved.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "project/simulate.h"
#include "train/schedule.h"

namespace strata::train {
namespace {

using Pass = PipelineAction::Pass;

struct Case {
  Schedule schedule;
  PipelineShape shape;
};

std::vector<Case> cases() {
  std::vector<Case> all;
  for (int p : {1, 2, 3, 4})
    for (int m : {1, 2, 4, 8}) {
      all.push_back({Schedule::gpipe, {p, m, 1}});
      all.push_back({Schedule::one_f_one_b, {p, m, 1}});
      for (int v : {2, 3})
        if (p >= 2 && m % p == 0) all.push_back({Schedule::interleaved, {p, m, v}});
    }
  return all;
}

std::string label(const Case& c) {
  return std::string(name(c.schedule)) + " p=" + std::to_string(c.shape.stages) + " m=" + std::to_string(c.shape.micro_batches) +
         " v=" + std::to_string(c.shape.chunks);
}

TEST(Schedule, EveryPassRunsOnceAfterWhatItNeeds) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(label(c));
    const int p = c.shape.stages, m = c.shape.micro_batches, v = c.shape.chunks;
    for (int r = 0; r < p; ++r) {
      std::set<std::tuple<int, int, int>> seen;  // pass, micro, chunk
      for (const PipelineAction& a : pipeline_actions(c.schedule, c.shape, r)) {
        EXPECT_TRUE(seen.insert({static_cast<int>(a.pass), a.micro, a.chunk}).second) << "twice: micro " << a.micro;
        if (a.pass == Pass::backward) {
          EXPECT_TRUE(seen.count({static_cast<int>(Pass::forward), a.micro, a.chunk})) << "backward before forward";
        }
      }
      EXPECT_EQ(seen.size(), static_cast<std::size_t>(2 * m * v));
    }
  }
}

TEST(Schedule, MessagesBetweenTwoRanksLeaveInTheOrderTheyAreReceived) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(label(c));
    const int p = c.shape.stages, last = p * c.shape.chunks - 1;
    // (from, to) -> the messages in the order the sender sends them, and in the order the receiver receives them.
    std::map<std::pair<int, int>, std::vector<std::tuple<int, int, int>>> sent, received;
    for (int r = 0; r < p; ++r)
      for (const PipelineAction& a : pipeline_actions(c.schedule, c.shape, r)) {
        const int s = stage_of(c.shape, r, a.chunk), kind = static_cast<int>(a.pass);
        const int from_stage = a.pass == Pass::forward ? s - 1 : s + 1, to_stage = a.pass == Pass::forward ? s + 1 : s - 1;
        if (from_stage >= 0 && from_stage <= last) received[{from_stage % p, r}].push_back({kind, a.micro, from_stage});
        if (to_stage >= 0 && to_stage <= last) sent[{r, to_stage % p}].push_back({kind, a.micro, s});
      }
    EXPECT_EQ(sent, received);
  }
}

TEST(Schedule, InFlightMicroBatchesAreTheKnownCounts) {
  for (int p : {2, 4})
    for (int m : {1, 3, 8})
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(in_flight(pipeline_actions(Schedule::gpipe, {p, m, 1}, r), 1), std::vector<int>{m});
        EXPECT_EQ(in_flight(pipeline_actions(Schedule::one_f_one_b, {p, m, 1}, r), 1), std::vector<int>{std::min(m, p - r)});
      }
  // Interleaved, rank 0 of 2 stages, 2 chunks, 4 micro-batches: chunk 0 runs micro-batches 0..3 forward before
  // its first backward (4 warm-up forwards: chunk 0 then chunk 1 of micro-batches 0 and 1, then 2 and 3 of chunk
  // 0 in the steady phase); chunk 1 never holds more than a group of 2.
  EXPECT_EQ(in_flight(pipeline_actions(Schedule::interleaved, {2, 4, 2}, 0), 2), (std::vector<int>{4, 2}));
}

TEST(Schedule, RefusalsSayWhy) {
  EXPECT_NE(schedule_refusal(Schedule::interleaved, {4, 6, 2}).find("not a multiple"), std::string::npos);
  EXPECT_NE(schedule_refusal(Schedule::interleaved, {1, 4, 2}).find("2 pipeline stages"), std::string::npos);
  EXPECT_NE(schedule_refusal(Schedule::interleaved, {2, 4, 1}).find("2 model chunks"), std::string::npos);
  EXPECT_NE(schedule_refusal(Schedule::one_f_one_b, {2, 4, 2}).find("one model chunk"), std::string::npos);
  EXPECT_EQ(schedule_refusal(Schedule::one_f_one_b, {2, 1, 1}), "");
  EXPECT_THROW(pipeline_actions(Schedule::gpipe, {2, 4, 1}, 2), std::invalid_argument);
  for (const char* text : {"gpipe", "1f1b", "interleaved"}) EXPECT_STREQ(name(*parse_schedule(text)), text);
  EXPECT_FALSE(parse_schedule("zero-bubble").has_value());
}

// The ranks' lists as a workload of the step simulator: a chunk's forward takes tf / v and its backward tb / v,
// transfers are free.
project::Workload workload(const Case& c, double tf, double tb) {
  const int p = c.shape.stages, v = c.shape.chunks, last = p * v - 1;
  project::Workload w;
  for (int r = 0; r < p; ++r) {
    std::vector<project::Op> ops;
    for (const PipelineAction& a : pipeline_actions(c.schedule, c.shape, r)) {
      const int s = stage_of(c.shape, r, a.chunk);
      const bool forward = a.pass == Pass::forward;
      const int from = forward ? s - 1 : s + 1, to = forward ? s + 1 : s - 1;
      const std::string what = std::string(forward ? "F" : "B") + std::to_string(a.micro) + "." + std::to_string(s);
      if (from >= 0 && from <= last) ops.push_back(project::recv_op("recv " + what, from % p, 0));
      ops.push_back(project::timed_op(what, (forward ? tf : tb) / v));
      if (to >= 0 && to <= last) ops.push_back(project::send_op("send " + what, to % p, 0));
    }
    w.ranks.push_back({r, 1, ops});
  }
  return w;
}

TEST(Schedule, IdleTimeIsTheClosedFormOnUniformStages) {
  project::System system;
  system.device.devices_per_node = 64;
  project::ComputePeak fp32;
  fp32.peak_flops.value = 1e12;
  fp32.efficiency.points = {{1, 1.0}};
  system.device.compute["fp32"] = fp32;
  system.device.memory_bandwidth.value = 1, system.device.memory_efficiency.value = 1;
  system.intra_node.bandwidth.value = 1e30, system.inter_node.bandwidth.value = 1e30;  // free transfers
  system.overlap_slowdown.value = 0;
  const double tf = 1e-3, tb = 2e-3;
  for (const Case& c : cases()) {
    SCOPED_TRACE(label(c));
    const int p = c.shape.stages, m = c.shape.micro_batches, v = c.shape.chunks;
    const project::Timeline t = project::simulate(system, workload(c, tf, tb));
    const double ideal = m * (tf + tb);
    const double bubble = (p - 1.0) / (v * m);  // v = 1 but interleaved
    EXPECT_NEAR(t.step_s, ideal * (1 + bubble), 1e-9) << "step";
    for (const project::Breakdown& b : t.breakdown) EXPECT_NEAR(b.idle_s / ideal, bubble, 1e-9) << "idle";
  }
}

}  // namespace
}  // namespace strata::train
