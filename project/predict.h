// A training step predicted on a system description: its trace (train/trace.h, the step executor's own graph)
// simulated (simulate.h) at the description's nominal figures and at both ends of their spreads, and the simulated
// timeline read back as the components strata-step measures, so a prediction and a measured step compare phase by
// phase. Computes only from what it is given: the trace, the description and the workload's dtype.
//
// Components (StepComponents), per traced rank, with strata-step's conventions (train/trainer.h, StepStats):
// - forward, backward, recompute_window, optimizer: the simulated time of the compute ops issued in that phase
//   (TraceOp::phase); backward includes the recomputation on demand, which `recompute` also counts; compute
//   outside the phases (a transfer's copy) is idle, as strata-step counts it.
// - The gaps of the compute stream (the rank waits for an operation before its next compute op, or for its last
//   operations after its last compute op) go to what the rank waited for, in the order those operations ended:
//   a tensor-parallel collective (tp group; blocking inside the passes) is comm_tp; a send or receive between
//   stages is pipeline_wait (the bubble with its transfers); a data-parallel collective (dp, dp_intra, dp_inter,
//   dp_by_piece) is exposed communication of its group; all three add to comm_exposed. The scalar reductions
//   (fp64: the gradient norm, the loss) and the tied token table's allreduce are waited for outside strata-step's
//   accounting of communication: their waits count in the phase they were issued in (the norm's in the optimizer),
//   else as idle.
// - idle: the rest of the rank's own step (its last op's end).
// The mean over all ranks weighs each traced rank by the ranks it stands for, as strata-step's phases are means
// over ranks; the step time is the last op's end over all ranks, as strata-step's is the slowest rank's.
//
// Interval: the description's spreads. The step is simulated twice more, on the description with every figure at
// the end of its own relative spread that makes the step faster, and at the end that makes it slower
// (spread_end): measured GEMM and attention points by their spread, efficiency curves and named attention kernels'
// speeds by theirs, memory bandwidth and efficiency, each tier's latency and bandwidth, each fitted collective range
// (or chunked fit) by its RMS residual, the overlap and communication slowdowns by their spreads. A relative spread counts up to 0.9 (a rate at most 10 times
// faster). The interval is a corner of the description, not a confidence interval: it holds when the errors of
// the figures all lean the same way.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "project/simulate.h"
#include "project/trace_workload.h"
#include "train/trace.h"

namespace strata::project {

struct StepComponents {
  double step_s = 0;  // the rank's own step: its last op's end
  double forward_s = 0, backward_s = 0, recompute_s = 0, recompute_window_s = 0, optimizer_s = 0;
  double comm_exposed_s = 0, comm_tp_s = 0, pipeline_wait_s = 0;
  double idle_s = 0;
  // comm_exposed by the role of the group waited for: tp, pp, dp (the dp group and its piece order), dp_intra,
  // dp_inter.
  std::map<std::string, double> exposed_by_role;
};

// How strata-step counts a wait for a traced operation (see the header comment).
enum class WaitKind { tensor_parallel, pipeline, data_parallel, in_phase };
WaitKind wait_kind(const train::StepTrace& trace, const train::TraceOp& op);
// The role a wait for `op` is reported under: the group's role ("dp_by_piece" as "dp"; transfers "pp").
std::string wait_role(const train::StepTrace& trace, const train::TraceOp& op);

// The components of traced rank `rank` (an index into trace.ranks) in a timeline simulated from
// workload_of(trace); std::invalid_argument when the timeline is not of that trace.
StepComponents components_of(const train::StepTrace& trace, const Timeline& timeline, std::size_t rank);
// Over all ranks, each traced rank weighted by the ranks it stands for; step_s is the mean of the ranks' own steps.
StepComponents mean_components(const train::StepTrace& trace, const Timeline& timeline);
// The same from each traced rank's components_of.
StepComponents mean_components(const train::StepTrace& trace, const std::vector<StepComponents>& ranks);

// The description with every figure at the end of its relative spread: direction -1 the faster end, +1 the
// slower (see the header comment).
System spread_end(const System& system, int direction);

struct Prediction {
  Timeline timeline;       // at the nominal figures
  double step_s = 0;       // the last op's end over all ranks
  double step_low_s = 0;   // on spread_end(system, -1)
  double step_high_s = 0;  // on spread_end(system, +1)
  StepComponents mean;     // mean_components at the nominal figures (PredictOptions::phases)
  std::vector<StepComponents> ranks;  // per traced rank (PredictOptions::phases)
  std::size_t simulated_operations = 0;  // of the workload simulated (after compaction)
};

struct PredictOptions {
  // The reference: every traced op simulated on its own (workload_of), SimulateMethod::scan. Otherwise each run of
  // a rank's compute ops in one phase that nothing but the next of them waits on (compact_runs) is simulated as one
  // op of their summed alone-time with the event queue, and the run's wall time is spread back over its ops by
  // their alone-times. The step, its interval and the components are the reference's up to rounding (the tests
  // hold them within 1e-9): the compute stream runs a run's work back to back either way, the overlap slowdown acts
  // on whichever op is running, and a run stays inside one phase. Only a single op's start and end inside a run
  // whose rate changed midway differ (they are where its share of the run's alone-time puts them).
  bool exact = false;
  bool intervals = true;  // fill timeline.intervals (a Chrome trace of the timeline)
  // Simulate the description's spreads' ends too (step_low_s, step_high_s); without: both are step_s.
  bool interval = true;
  // The per-phase components (mean, ranks) and the timeline per traced op (and its intervals). Without: runs of
  // compute ops may cross phases (fewer operations, the same step, compute, idle and exposed communication:
  // timeline.mean), the timeline's ops are the compacted workload's and it has no intervals (the search's
  // evaluation); with `exact` there are no runs, and only the components are left out.
  bool phases = true;
};

// Simulates `trace` on `system` whose devices_per_node is taken as the trace's ranks_per_node (the traced job's
// nodes); std::invalid_argument for a system the simulator refuses, a dtype the device lacks or a loss mode that is
// not one of loss_modes().
Prediction predict(const System& system, const train::StepTrace& trace, const WorkloadOptions& options,
                   const PredictOptions& how = {});

}  // namespace strata::project
