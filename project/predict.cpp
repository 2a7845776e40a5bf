// A step predicted from its trace (see predict.h).
#include "project/predict.h"

#include "project/compact_runs.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <stdexcept>

namespace strata::project {

namespace {

// The factor a time takes at one end of a relative spread s: 1 - s (s counted up to 0.9) toward the faster end,
// 1 + s toward the slower; a rate is divided by it.
double time_factor(double spread, int direction) {
  const double s = std::max(0.0, spread);
  return direction < 0 ? 1 - std::min(s, 0.9) : 1 + s;
}

void scale_time(Quantity& q, int direction) { q.value *= time_factor(q.relative_spread, direction); }
void scale_rate(Quantity& q, int direction) { q.value /= time_factor(q.relative_spread, direction); }

void scale_curve(EfficiencyCurve& curve, int direction) {
  for (EfficiencyPoint& p : curve.points)
    p.efficiency = std::min(1.0, p.efficiency / time_factor(curve.relative_spread, direction));
}

void scale_tier(NetworkTier& tier, int direction) {
  scale_rate(tier.bandwidth, direction);
  scale_time(tier.latency, direction);
  for (auto& [op, model] : tier.collectives) {
    scale_rate(model.bandwidth, direction);
    scale_time(model.latency, direction);
  }
}

// The phase component a compute op's time, or a wait counted in its phase, adds to.
double* phase_component(StepComponents& c, std::string_view phase) {
  if (phase == "forward") return &c.forward_s;
  if (phase == "backward") return &c.backward_s;
  if (phase == "recompute_window") return &c.recompute_window_s;
  if (phase == "optimizer") return &c.optimizer_s;
  return &c.idle_s;
}

void add_wait(StepComponents& c, const train::StepTrace& trace, const train::TraceOp& op, double seconds) {
  switch (wait_kind(trace, op)) {
    case WaitKind::tensor_parallel: c.comm_tp_s += seconds; break;
    case WaitKind::pipeline: c.pipeline_wait_s += seconds; break;
    case WaitKind::data_parallel: break;
    case WaitKind::in_phase:
      // A recomputation's scalar waits do not occur; a wait issued in one counts in backward, as its time does.
      *phase_component(c, op.phase == "recompute" ? std::string_view("backward") : op.phase) += seconds;
      return;
  }
  c.comm_exposed_s += seconds;
  c.exposed_by_role[wait_role(trace, op)] += seconds;
}

}  // namespace

WaitKind wait_kind(const train::StepTrace& trace, const train::TraceOp& op) {
  if (op.kind == train::TraceOpKind::send || op.kind == train::TraceOpKind::recv) return WaitKind::pipeline;
  if (op.kind != train::TraceOpKind::collective) return WaitKind::in_phase;
  const std::string& role = trace.groups.at(static_cast<std::size_t>(op.group)).role;
  if (op.element_bytes == 8 || role == "embedding") return WaitKind::in_phase;
  return role == "tp" ? WaitKind::tensor_parallel : WaitKind::data_parallel;
}

std::string wait_role(const train::StepTrace& trace, const train::TraceOp& op) {
  if (op.kind == train::TraceOpKind::send || op.kind == train::TraceOpKind::recv) return "pp";
  if (op.group < 0) return "";
  const std::string& role = trace.groups.at(static_cast<std::size_t>(op.group)).role;
  return role == "dp_by_piece" ? "dp" : role;
}

StepComponents components_of(const train::StepTrace& trace, const Timeline& timeline, std::size_t rank) {
  if (rank >= trace.ranks.size() || trace.ranks.size() != timeline.ops.size() ||
      trace.ranks[rank].ops.size() != timeline.ops[rank].size())
    throw std::invalid_argument("components: the timeline is not of this trace");
  const std::vector<train::TraceOp>& ops = trace.ranks[rank].ops;
  const std::vector<OpTiming>& at = timeline.ops[rank];
  StepComponents c;
  for (const OpTiming& t : at) c.step_s = std::max(c.step_s, t.end);
  double cursor = 0;  // the compute stream is accounted for up to here
  // [cursor, until) waited for `waited` (operations, not compute), each in the order it ended.
  auto account_waits = [&](std::vector<int> waited, double until) {
    std::sort(waited.begin(), waited.end(), [&](int a, int b) {
      return at[static_cast<std::size_t>(a)].end < at[static_cast<std::size_t>(b)].end;
    });
    for (int w : waited) {
      const double end = std::min(at[static_cast<std::size_t>(w)].end, until);
      if (end <= cursor) continue;
      add_wait(c, trace, ops[static_cast<std::size_t>(w)], end - cursor);
      cursor = end;
    }
    if (until > cursor) c.idle_s += until - cursor;
    cursor = std::max(cursor, until);
  };
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const train::TraceOp& op = ops[i];
    if (!is_compute(op.kind)) continue;
    if (at[i].start > cursor) {
      std::vector<int> waited;
      for (int d : op.depends_on)
        if (!is_compute(ops[static_cast<std::size_t>(d)].kind)) waited.push_back(d);
      account_waits(std::move(waited), at[i].start);
    }
    const double seconds = at[i].end - at[i].start;
    if (op.phase == "recompute") c.backward_s += seconds, c.recompute_s += seconds;
    else *phase_component(c, op.phase) += seconds;
    cursor = std::max(cursor, at[i].end);
  }
  // After the last compute op: the operations the rank still waits for.
  std::vector<int> last;
  for (std::size_t i = 0; i < ops.size(); ++i)
    if (!is_compute(ops[i].kind) && at[i].end > cursor) last.push_back(static_cast<int>(i));
  account_waits(std::move(last), c.step_s);
  return c;
}

StepComponents mean_components(const train::StepTrace& trace, const Timeline& timeline) {
  std::vector<StepComponents> ranks;
  ranks.reserve(trace.ranks.size());
  for (std::size_t r = 0; r < trace.ranks.size(); ++r) ranks.push_back(components_of(trace, timeline, r));
  return mean_components(trace, ranks);
}

StepComponents mean_components(const train::StepTrace& trace, const std::vector<StepComponents>& ranks) {
  if (ranks.size() != trace.ranks.size()) throw std::invalid_argument("components: not one per traced rank");
  StepComponents mean;
  double weights = 0;
  for (std::size_t r = 0; r < trace.ranks.size(); ++r) {
    const StepComponents& c = ranks[r];
    const double w = trace.ranks[r].weight;
    weights += w;
    mean.step_s += w * c.step_s;
    mean.forward_s += w * c.forward_s, mean.backward_s += w * c.backward_s, mean.recompute_s += w * c.recompute_s;
    mean.recompute_window_s += w * c.recompute_window_s, mean.optimizer_s += w * c.optimizer_s;
    mean.comm_exposed_s += w * c.comm_exposed_s, mean.comm_tp_s += w * c.comm_tp_s;
    mean.pipeline_wait_s += w * c.pipeline_wait_s, mean.idle_s += w * c.idle_s;
    for (const auto& [role, seconds] : c.exposed_by_role) mean.exposed_by_role[role] += w * seconds;
  }
  if (weights > 0) {
    for (double* v : {&mean.step_s, &mean.forward_s, &mean.backward_s, &mean.recompute_s, &mean.recompute_window_s,
                      &mean.optimizer_s, &mean.comm_exposed_s, &mean.comm_tp_s, &mean.pipeline_wait_s, &mean.idle_s})
      *v /= weights;
    for (auto& [role, seconds] : mean.exposed_by_role) seconds /= weights;
  }
  return mean;
}

System spread_end(const System& system, int direction) {
  System s = system;
  for (auto& [dtype, compute] : s.device.compute) {
    scale_curve(compute.efficiency, direction);
    for (auto& [pass, curve] : compute.attention_efficiency) scale_curve(curve, direction);
    for (GemmPoint& p : compute.gemm_points) scale_time(p.seconds, direction);
    for (AttentionPoint& p : compute.attention_points) scale_time(p.seconds, direction);
  }
  scale_rate(s.device.memory_bandwidth, direction);
  for (auto& [kernel, rate] : s.device.elementwise_kernels) scale_rate(rate, direction);
  for (auto& [kernel, speed] : s.device.attention_kernels) {
    scale_rate(speed.forward, direction);
    scale_rate(speed.backward, direction);
  }
  if (s.device.elementwise_bandwidth) scale_rate(*s.device.elementwise_bandwidth, direction);
  s.device.memory_efficiency.value =
      std::min(1.0, s.device.memory_efficiency.value / time_factor(s.device.memory_efficiency.relative_spread, direction));
  scale_tier(s.intra_node, direction);
  scale_tier(s.inter_node, direction);
  for (CollectiveModel& model : s.collectives) {
    for (SizeRange& range : model.ranges) {
      const double f = time_factor(range.residual, direction);
      range.model.latency.value *= f;
      range.model.bandwidth.value /= f;
    }
    const double f = time_factor(model.chunked.residual, direction);
    model.chunked.latency.value *= f;
    model.chunked.per_chunk.value *= f;
    model.chunked.bandwidth.value /= f;
    for (CollectivePoint& p : model.points) scale_time(p.seconds, direction);
  }
  scale_time(s.overlap_slowdown, direction);
  if (s.communication_slowdown) scale_time(*s.communication_slowdown, direction);
  return s;
}

Prediction predict(const System& system, const train::StepTrace& trace, const WorkloadOptions& options,
                   const PredictOptions& how) {
  if (!system.device.compute.count(options.dtype))
    throw std::invalid_argument("the system's device has no " + options.dtype + " compute");
  check_loss(options.loss);
  System nodes = system;
  nodes.device.devices_per_node = std::max(1, trace.ranks_per_node);
  System low, high;  // the spreads' ends, for the interval
  if (how.interval) low = spread_end(nodes, -1), high = spread_end(nodes, +1);
  Prediction p;
  std::optional<CompactRuns> runs;
  std::vector<double> nominal, faster, slower;
  if (!how.exact) {
    runs.emplace(trace, options, /*within_phases=*/how.phases);
    nominal = runs->shape_seconds(nodes);
    if (how.interval) faster = runs->shape_seconds(low), slower = runs->shape_seconds(high);
  }
  // A distinct op with no valid alone-time (possible only in a workload with no compute too) goes the reference's way,
  // which names the op it refuses.
  const bool valid = runs && runs->has_valid(nominal) && (!how.interval || (runs->has_valid(faster) && runs->has_valid(slower)));
  if (!valid) {
    const Workload workload = workload_of(trace, options);
    const SimulateOptions reference{SimulateMethod::scan, how.intervals, true};
    const SimulateOptions step_only{SimulateMethod::scan, false, false};
    p.timeline = simulate(nodes, workload, reference);
    p.step_s = p.step_low_s = p.step_high_s = p.timeline.step_s;
    for (const RankGraph& rank : workload.ranks) p.simulated_operations += rank.ops.size();
    // A schedule's order may change between the corners; the interval holds the nominal step either way.
    if (how.interval) {
      p.step_low_s = std::min(p.step_s, simulate(low, workload, step_only).step_s);
      p.step_high_s = std::max(p.step_s, simulate(high, workload, step_only).step_s);
    }
  } else if (!how.phases && !how.interval) {
    // One simulation and nothing spread back over the traced ops: the compacted workload is moved out and the runs
    // freed before it is simulated (the search's evaluation; its memory is reused for the simulator's).
    const Workload compacted = std::move(*runs).take_workload(nominal);
    runs.reset();
    for (const RankGraph& rank : compacted.ranks) p.simulated_operations += rank.ops.size();
    p.timeline = simulate(nodes, compacted, {SimulateMethod::event_queue, false, true});
    p.step_s = p.step_low_s = p.step_high_s = p.timeline.step_s;
  } else {
    const SimulateOptions with_breakdown{SimulateMethod::event_queue, false, true};
    const SimulateOptions step_only{SimulateMethod::event_queue, false, false};
    // Indexed once; each run reads the durations the workload holds then.
    const Workload& compacted = runs->workload(nominal);
    for (const RankGraph& rank : compacted.ranks) p.simulated_operations += rank.ops.size();
    Simulation simulation(nodes, compacted);
    Timeline compact = simulation.run(nodes, with_breakdown);
    p.timeline = how.phases ? runs->expand(std::move(compact), nominal, how.intervals) : std::move(compact);
    p.step_s = p.step_low_s = p.step_high_s = p.timeline.step_s;
    if (how.interval) {
      runs->workload(faster);
      p.step_low_s = std::min(p.step_s, simulation.run(low, step_only).step_s);
      runs->workload(slower);
      p.step_high_s = std::max(p.step_s, simulation.run(high, step_only).step_s);
    }
  }
  if (!how.phases) return p;
  for (std::size_t r = 0; r < trace.ranks.size(); ++r) p.ranks.push_back(components_of(trace, p.timeline, r));
  p.mean = mean_components(trace, p.ranks);
  return p;
}

}  // namespace strata::project
