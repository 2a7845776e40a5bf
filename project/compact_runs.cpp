// Implementation of the compacted runs (see compact_runs.h).
#include "project/compact_runs.h"

#include <limits>
#include <unordered_map>

namespace strata::project {

CompactRuns::CompactRuns(const train::StepTrace& trace, const WorkloadOptions& options, bool within_phases)
    : trace_(trace) {
  const int groups = static_cast<int>(trace.groups.size());
  workload_.groups.reserve(trace.groups.size());
  for (int g = 0; g < groups; ++g) workload_.groups.push_back({g, trace.groups[static_cast<std::size_t>(g)].ranks});
  std::unordered_map<ShapeKey, int, ShapeHash> shape_ids;
  index_.resize(trace.ranks.size());
  shape_.resize(trace.ranks.size());
  for (std::size_t r = 0; r < trace.ranks.size(); ++r) {
    const std::vector<train::TraceOp>& ops = trace.ranks[r].ops;
    const std::size_t n = ops.size();
    // A run ends at an op something other than the next compute op depends on (the next compute op after a compute
    // op d is the one whose last compute op before it is d).
    std::vector<char> ends_run(n, 0);
    for (std::size_t j = 0, last = n; j < n; ++j) {
      const bool compute = is_compute(ops[j].kind);
      for (int d : ops[j].depends_on) {
        const auto dd = static_cast<std::size_t>(d);
        if (d < 0 || dd >= j) continue;  // the simulator refuses it
        if (!(compute && dd == last)) ends_run[dd] = 1;
      }
      if (compute) last = j;
    }
    RankGraph graph{trace.ranks[r].rank, trace.ranks[r].weight, {}};
    graph.ops.reserve(n / 2);
    std::vector<int>& index = index_[r];
    std::vector<int>& shape = shape_[r];
    index.assign(n, -1);
    shape.assign(n, -1);
    int open = -1, last_compute = -1;
    auto remap = [&](const train::TraceOp& t, Op& op) {
      op.depends_on.clear();
      for (int d : t.depends_on) {
        const int mapped = d >= 0 && static_cast<std::size_t>(d) < n ? index[static_cast<std::size_t>(d)] : d;
        if (std::find(op.depends_on.begin(), op.depends_on.end(), mapped) == op.depends_on.end()) op.depends_on.push_back(mapped);
      }
    };
    for (std::size_t i = 0; i < n; ++i) {
      const train::TraceOp& t = ops[i];
      if (!is_compute(t.kind)) {
        Op op = communication_op(trace, t, options);
        remap(t, op);
        graph.ops.push_back(std::move(op));
        index[i] = static_cast<int>(graph.ops.size()) - 1;
        continue;
      }
      const ShapeKey key{t.kind, t.m, t.n, t.k, t.batch, t.heads, t.seq_q, t.seq_kv, t.head_dim, t.causal, t.backward,
                         t.elements, t.kind == train::TraceOpKind::elementwise ? std::string_view(t.name) : std::string_view()};
      const auto [found, added] = shape_ids.emplace(key, static_cast<int>(shapes_.size()));
      if (added) shapes_.push_back(workload_op(trace, t, options));
      shape[i] = found->second;
      bool joins = open >= 0 && last_compute >= 0 && !ends_run[static_cast<std::size_t>(last_compute)] &&
                   (!within_phases || ops[static_cast<std::size_t>(last_compute)].phase == t.phase);
      for (int d : t.depends_on)
        if (joins && !(d >= 0 && static_cast<std::size_t>(d) < i && is_compute(ops[static_cast<std::size_t>(d)].kind))) joins = false;
      if (!joins) {
        Op op = timed_op("", 0);
        remap(t, op);
        graph.ops.push_back(std::move(op));
        open = static_cast<int>(graph.ops.size()) - 1;
      }
      index[i] = open;
      last_compute = static_cast<int>(i);
    }
    workload_.ranks.push_back(std::move(graph));
  }
}

std::vector<double> CompactRuns::shape_seconds(const System& system) const {
  std::vector<double> seconds;
  seconds.reserve(shapes_.size());
  for (const Op& op : shapes_) {
    const double t = compute_seconds(system, op);
    const bool valid = std::isfinite(t) && t >= 0 && op.bytes >= 0 && op.m >= 0 && op.n >= 0 && op.k >= 0;
    seconds.push_back(valid ? t : std::numeric_limits<double>::quiet_NaN());
  }
  return seconds;
}

const Workload& CompactRuns::workload(const std::vector<double>& shape_seconds) {
  for (std::size_t r = 0; r < workload_.ranks.size(); ++r) {
    std::vector<Op>& ops = workload_.ranks[r].ops;
    for (Op& op : ops)
      if (op.kind == OpKind::timed) op.seconds = 0;
    for (std::size_t i = 0; i < shape_[r].size(); ++i)
      if (shape_[r][i] >= 0) ops[static_cast<std::size_t>(index_[r][i])].seconds += shape_seconds[static_cast<std::size_t>(shape_[r][i])];
  }
  return workload_;
}

Timeline CompactRuns::expand(Timeline compact, const std::vector<double>& shape_seconds, bool intervals) const {
  Timeline out;
  out.step_s = compact.step_s;
  out.breakdown = std::move(compact.breakdown);
  out.mean = std::move(compact.mean);
  out.ops.resize(trace_.ranks.size());
  std::size_t total = 0;
  for (const train::TraceRank& rank : trace_.ranks) total += rank.ops.size();
  if (intervals) out.intervals.reserve(total);
  const int groups = static_cast<int>(trace_.groups.size());
  for (std::size_t r = 0; r < trace_.ranks.size(); ++r) {
    const std::vector<train::TraceOp>& ops = trace_.ranks[r].ops;
    const std::vector<Op>& runs = workload_.ranks[r].ops;
    const std::vector<OpTiming>& at = compact.ops[r];
    std::vector<OpTiming>& mine = out.ops[r];
    mine.resize(ops.size());
    std::vector<double> done(runs.size(), 0.0);  // alone-time of each run's ops before the current one
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const auto w = static_cast<std::size_t>(index_[r][i]);
      const OpTiming& run = at[w];
      if (shape_[r][i] < 0) {
        mine[i] = run;
      } else {
        const double whole = runs[w].seconds, own = shape_seconds[static_cast<std::size_t>(shape_[r][i])];
        const double before = done[w], after = before + own;
        const double span = run.end - run.start;
        OpTiming& t = mine[i];
        t.start = whole > 0 ? run.start + span * (before / whole) : run.start;
        t.end = after >= whole ? run.end : run.start + span * (after / whole);
        t.reached = before == 0 ? run.reached : t.start;
        done[w] = after;
      }
      if (intervals) {
        const train::TraceOp& t = ops[i];
        OpKind kind = OpKind::elementwise;
        int stream = kComputeStream;
        switch (t.kind) {
          case train::TraceOpKind::gemm: kind = OpKind::gemm; break;
          case train::TraceOpKind::attention: kind = OpKind::attention; break;
          case train::TraceOpKind::elementwise: break;
          case train::TraceOpKind::collective: kind = OpKind::collective, stream = communication_stream(t.group); break;
          case train::TraceOpKind::send: kind = OpKind::send, stream = communication_stream(t.group); break;
          case train::TraceOpKind::recv: kind = OpKind::recv, stream = communication_stream(groups + t.group); break;
        }
        out.intervals.push_back({trace_.ranks[r].rank, stream, std::string(t.name), kind, mine[i].start, mine[i].end});
      }
    }
  }
  return out;
}

Op CompactRuns::communication_op(const train::StepTrace& trace, const train::TraceOp& t, const WorkloadOptions& options) {
  Op op;
  op.kind = t.kind == train::TraceOpKind::collective ? OpKind::collective
            : t.kind == train::TraceOpKind::send     ? OpKind::send
                                                     : OpKind::recv;
  if (t.kind == train::TraceOpKind::collective) {
    const int size = static_cast<int>(trace.groups.at(static_cast<std::size_t>(t.group)).ranks.size());
    op.collective = t.collective;
    op.group = t.group;
    op.bytes = collective_bytes(t, size, collective_element_bytes(trace, t, options));
    op.stream = communication_stream(t.group);
    op.algorithm = costed_algorithm(trace, t, options);
    op.blocking = t.blocking;
  } else {
    op.peer = t.peer;
    op.bytes = t.count * element_bytes_of(t, options.element_bytes);
    const int groups = static_cast<int>(trace.groups.size());
    op.stream = communication_stream(t.kind == train::TraceOpKind::send ? t.group : groups + t.group);
  }
  return op;
}
}  // namespace strata::project
