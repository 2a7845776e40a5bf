// A traced step's runs of compute ops compacted into single timed ops: the structure built once per trace, the
// alone-times filled per system. Identical shapes are costed once. predict runs it three times (the description and
// the ends of its spreads) and spreads each run's time back over its ops (expand); without the interval and the
// phases (the search's evaluation) it simulates it once. A run never crosses an op something else depends on, or an
// op that depends on communication (nor, within phases, a phase: forward, backward, recompute, optimizer), so the
// compacted step has the traced step's timing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "project/simulate.h"
#include "project/trace_workload.h"
#include "train/trace.h"

namespace strata::project {

class CompactRuns {
 public:
  // within_phases: a run ends where the traced phase changes (predict's breakdown spreads a run's time over its
  // ops); without it runs are longer, the same timeline from fewer operations (the search).
  CompactRuns(const train::StepTrace& trace, const WorkloadOptions& options, bool within_phases = true);

  // The alone-time of each distinct compute op on `system`; NaN where the simulator would refuse the op.
  std::vector<double> shape_seconds(const System& system) const;

  static bool has_valid(const std::vector<double>& shape_seconds) {
    return std::none_of(shape_seconds.begin(), shape_seconds.end(), [](double t) { return std::isnan(t); });
  }

  // The compacted workload with these alone-times.
  const Workload& workload(const std::vector<double>& shape_seconds);
  // The same, moved out: the runs are spent (the search simulates each candidate's workload once).
  Workload take_workload(const std::vector<double>& shape_seconds) && {
    workload(shape_seconds);
    return std::move(workload_);
  }

  // The timeline of every traced op from the compacted one: a run's wall time spread over its ops by their shares of
  // its alone-time (the last ends where the run ends).
  Timeline expand(Timeline compact, const std::vector<double>& shape_seconds, bool intervals) const;

 private:
  // workload_op's communication op, without the name (a workload's names are for messages and Chrome traces, which
  // the reference path and expand() give) and with no dependencies yet.
  static Op communication_op(const train::StepTrace& trace, const train::TraceOp& t, const WorkloadOptions& options);

  struct ShapeKey {
    train::TraceOpKind kind;
    std::int64_t m, n, k, batch, heads, seq_q, seq_kv, head_dim;
    bool causal, backward;
    double elements;
    std::string_view name;  // elementwise: kernels may have rates of their own
    bool operator==(const ShapeKey&) const = default;
  };
  struct ShapeHash {
    std::size_t operator()(const ShapeKey& k) const {
      std::size_t h = std::hash<std::string_view>()(k.name) ^ static_cast<std::size_t>(k.kind);
      for (std::int64_t v : {k.m, k.n, k.k, k.batch, k.heads, k.seq_q, k.seq_kv, k.head_dim})
        h = (h ^ static_cast<std::size_t>(v)) * 1099511628211ull;
      h = (h ^ std::hash<double>()(k.elements)) * 1099511628211ull;
      return h ^ (k.causal ? 0x9e3779b9u : 0u) ^ (k.backward ? 0x7f4a7c15u : 0u);
    }
  };
  const train::StepTrace& trace_;
  Workload workload_;
  std::vector<std::vector<int>> index_;  // [rank][traced op] -> the compacted workload's op
  std::vector<std::vector<int>> shape_;  // [rank][traced op] -> its distinct compute op; -1: communication
  std::vector<Op> shapes_;
};


}  // namespace strata::project
