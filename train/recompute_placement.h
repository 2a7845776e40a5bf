// Where each recomputable operation's recomputation goes when recomputation is overlapped with communication
// (`--recompute overlap`, Lynx, docs/strategies.md#overlapped-recomputation-lynx). The construction is our derivation: the paper's exact
// constraints are not public.
//
// A rank's step offers windows, in time order: the waits on tensor-parallel collectives in backward, on the
// gradient from the next pipeline stage, on gradient-bucket reductions. Each recomputable operation is either
//   kept       its output is held from its forward to its backward, no recomputation;
//   on demand  recomputed when its backward needs it, on the critical path (exposed);
//   window w   recomputed while the rank waits in window w, hidden (w before its consumer's backward).
// Constraints:
//   capacity    sum over the ops of window w of s * t_i <= capacity_w (s >= 1: compute slows down while
//               communication runs beside it);
//   producers   an op placed in window w needs each recomputable producer kept or placed in a window <= w
//               (an on-demand op may have producers of any decision: they are ready by its backward);
//   memory      at every check point, base_c + the outputs held <= limit.
// Check points: one per window, at its end, where the window's recomputed outputs are all allocated (memory
// only grows inside a window, and only backward frees, between windows). Op i's output is held at check
// point c when kept and forward_i <= c < deadline_i, when placed in w <= c < deadline_i, never when on
// demand (it is recomputed and consumed inside the backward step).
// Objective: least exposed recomputation, sum of t_i over the on-demand ops; among placements with the same
// exposure, fewest kept bytes (solved lexicographically: exposure first, then kept bytes under it).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace strata::train {

struct RecomputeWindow {
  std::string label;        // e.g. "tp allreduce bwd L3", "pp recv mb 2", "dp bucket 5"; unique
  double capacity_s = 0;    // the measured length of the wait
  double base_bytes = 0;    // activation memory held at this window's check point by everything else
};

struct RecomputableOp {
  std::string name;          // unique, e.g. "L3.attn_core"
  int layer = 0;             // the transformer block it belongs to (blocks are matched by the heuristic)
  double time_s = 0;         // measured forward time of the op, the cost of recomputing it once
  double output_bytes = 0;   // what keeping its output costs
  int forward_window = 0;    // first window after its forward: a kept output is held from here
  int earliest_window = 0;   // first window that may recompute it (>= forward_window)
  int deadline_window = 0;   // first window too late: its consumer's backward starts before this window
  std::vector<int> producers;  // indices of the recomputable ops whose outputs it reads
};

struct PlacementProblem {
  std::vector<RecomputeWindow> windows;  // in time order
  std::vector<RecomputableOp> ops;
  double slowdown = 1.0;                 // s: recompute time placed in a window costs s * t of its capacity
  double memory_limit_bytes = 0;
};

enum class RecomputeMode { keep, on_demand, window };
const char* mode_name(RecomputeMode mode);  // "keep", "on-demand", "window"

struct OpPlacement {
  RecomputeMode mode = RecomputeMode::keep;
  int window = -1;  // the window's index when mode == window
  bool operator==(const OpPlacement&) const = default;
};
using Placement = std::vector<OpPlacement>;  // one per op of the problem, in its order

struct PlacementOptions {
  double time_limit_s = 60;        // GLPK's search limit per solve; past it the best placement found is kept
  double block_tolerance = 0.02;   // relative difference of times and bytes under which two blocks are identical
};

struct PlacementResult {
  Placement placement;
  double exposed_s = 0;        // the objective: on-demand recomputation on the critical path
  double hidden_s = 0;         // recomputation placed in windows (unscaled t)
  double kept_bytes = 0;       // the tie-break
  double peak_bytes = 0;       // the highest check point, base included
  double search_s = 0;         // measured wall time of the search
  bool proven_optimal = false; // GLPK closed the gap within the time limit (heuristic: never)
  int identical_block_classes = 0;  // heuristic only: how many block patterns were solved
};

// Throws std::invalid_argument naming the first malformed field (negative times, windows out of range,
// slowdown < 1, duplicate names, a producer whose backward comes before its consumer's, ...), and
// std::invalid_argument when even recomputing everything on demand exceeds the memory limit at a window.
void check_problem(const PlacementProblem& problem);

// The first violated constraint, as a sentence naming the op and window; nothing when the placement is valid.
std::optional<std::string> find_violation(const PlacementProblem& problem, const Placement& placement);

double exposed_recompute_s(const PlacementProblem& problem, const Placement& placement);
double hidden_recompute_s(const PlacementProblem& problem, const Placement& placement);
double kept_bytes(const PlacementProblem& problem, const Placement& placement);
// Bytes held at each check point (one per window), base included.
std::vector<double> memory_at_check_points(const PlacementProblem& problem, const Placement& placement);
double peak_memory_bytes(const PlacementProblem& problem, const Placement& placement);

// The whole problem as one mixed-integer program (a binary per op and decision) through GLPK: the relaxation
// by the simplex method, then branch and cut starting from the heuristic's placement as its incumbent, so the
// result is never worse than the heuristic's and, past the time limit, is the best found (proven_optimal
// false). search_s includes the heuristic's time.
PlacementResult solve_optimal(const PlacementProblem& problem, const PlacementOptions& options = {});

// Lynx's heuristic: ops are grouped into blocks by layer; blocks with the same op count, times and bytes
// (within block_tolerance), producer structure and window offsets (each op's earliest and deadline window
// relative to its block's first deadline) are identical; when their outputs start being held (forward_window)
// and the windows' capacities may differ, since every block's own figures enter the pattern's rows. One pattern per class of identical blocks is
// solved as a small program whose variables are the pattern's and whose capacity and memory rows add up
// every block of the class applying it at its own offsets, with the real times and bytes; classes are
// solved largest first on what the earlier ones left. Producers in another block are assumed kept by the
// pattern; where the global placement breaks one, the consumer falls back to on demand (the repair). Last,
// what the shared pattern left on demand moves, longest first, into the latest window or the memory that
// still takes it (blocks differ in what is free around them).
PlacementResult solve_heuristic(const PlacementProblem& problem, const PlacementOptions& options = {});

// heuristic exposure / optimal exposure - 1 (0 when both are zero).
double heuristic_gap(const PlacementResult& heuristic, const PlacementResult& optimal);

// Fills the summary fields of a result from its placement.
PlacementResult summarise(const PlacementProblem& problem, Placement placement, double search_s, bool proven_optimal);

}  // namespace strata::train
