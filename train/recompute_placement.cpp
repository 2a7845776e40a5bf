#include "train/recompute_placement.h"

#include <glpk.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>

namespace strata::train {
namespace {

// Capacities and memory are measured figures: a sum that exceeds its bound by less than this share of it is
// rounding (of the figures, and of the solver's arithmetic), not a violation.
constexpr double kRelativeSlack = 1e-6;

bool within(double value, double bound) { return value <= bound + kRelativeSlack * std::max(std::fabs(bound), 1e-300); }

std::string format_ms(double seconds) {
  std::ostringstream out;
  out.precision(6);
  out << seconds * 1e3 << " ms";
  return out.str();
}

std::string format_bytes(double bytes) { return std::to_string(std::llround(bytes)) + " bytes"; }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Whether op i's output is held at check point c (the end of window c) under decision d.
bool held_at(const RecomputableOp& op, const OpPlacement& d, int c) {
  if (c >= op.deadline_window) return false;
  if (d.mode == RecomputeMode::keep) return c >= op.forward_window;
  if (d.mode == RecomputeMode::window) return c >= d.window;
  return false;
}

// ---- GLPK ------------------------------------------------------------------------------------------------

// Owns one glp_prob.
class GlpkProblem {
 public:
  GlpkProblem() : problem_(glp_create_prob()) {
    if (!problem_) throw std::runtime_error("GLPK: glp_create_prob returned no problem");
  }
  ~GlpkProblem() { glp_delete_prob(problem_); }
  GlpkProblem(const GlpkProblem&) = delete;
  GlpkProblem& operator=(const GlpkProblem&) = delete;
  glp_prob* get() const { return problem_; }

 private:
  glp_prob* problem_;
};

const char* glpk_error_name(int code) {
  switch (code) {
    case GLP_EBOUND: return "GLP_EBOUND (a variable or row has incorrect bounds)";
    case GLP_EROOT: return "GLP_EROOT (no optimal basis of the relaxation)";
    case GLP_ENODFS: return "GLP_ENODFS (the relaxation has no dual feasible solution)";
    case GLP_EFAIL: return "GLP_EFAIL (the search failed)";
    case GLP_ESTOP: return "GLP_ESTOP (the search was stopped)";
    default: return "an unexpected code";
  }
}

// A small 0-1 program: rows bounded above (or fixed), a primary objective and a tie-break objective.
struct BinaryProgram {
  struct Row {
    std::vector<std::pair<int, double>> entries;  // (column, coefficient)
    double upper = 0;
    bool equality = false;
  };
  int columns = 0;
  std::vector<Row> rows;
  std::vector<double> primary;   // per column
  std::vector<double> secondary;
};

struct BinarySolution {
  std::vector<bool> value;  // per column
  bool proven_optimal = false;
};

enum class GlpkOutcome { solved, infeasible, no_solution_in_time };

// A feasible 0-1 point handed to GLPK's search as its first incumbent, so a search cut off by the time limit
// still returns at least that point and prunes against it from the start.
struct Incumbent {
  std::vector<double> values;  // 1-based, as glp_ios_heur_sol takes them
  bool offered = false;
};

void offer_incumbent(glp_tree* tree, void* info) {
  auto* incumbent = static_cast<Incumbent*>(info);
  if (glp_ios_reason(tree) != GLP_IHEUR || incumbent->offered) return;
  incumbent->offered = true;
  glp_ios_heur_sol(tree, incumbent->values.data());  // refused only when no better than what the search has
}

// The relaxation by the simplex method, then branch and cut from its basis. GLPK's MIP presolver is off:
// it would hand the search a transformed problem that the incumbent's columns no longer describe (the
// simplex method presolves the relaxation itself).
GlpkOutcome run_intopt(glp_prob* lp, double time_left_s, Incumbent& incumbent, bool& proven) {
  const auto start = std::chrono::steady_clock::now();
  glp_smcp simplex;
  glp_init_smcp(&simplex);
  simplex.msg_lev = GLP_MSG_OFF;
  simplex.tm_lim = static_cast<int>(std::clamp(time_left_s * 1e3, 1.0, 2e9));
  const int simplex_rc = glp_simplex(lp, &simplex);
  if (simplex_rc != 0 && simplex_rc != GLP_ETMLIM)
    throw std::runtime_error("GLPK: glp_simplex failed on the relaxation (code " + std::to_string(simplex_rc) + ")");
  if (glp_get_status(lp) == GLP_NOFEAS) return GlpkOutcome::infeasible;
  if (glp_get_status(lp) != GLP_OPT) return GlpkOutcome::no_solution_in_time;

  glp_iocp parm;
  glp_init_iocp(&parm);
  parm.presolve = GLP_OFF;
  parm.msg_lev = GLP_MSG_OFF;
  parm.tol_int = 1e-9;
  parm.bt_tech = GLP_BT_BPH;  // best projection: on these programs it finds good placements far sooner
  parm.fp_heur = GLP_ON;
  parm.cb_func = offer_incumbent;
  parm.cb_info = &incumbent;
  incumbent.offered = false;
  parm.tm_lim = static_cast<int>(std::clamp((time_left_s - seconds_since(start)) * 1e3, 1.0, 2e9));
  const int rc = glp_intopt(lp, &parm);
  if (rc != 0 && rc != GLP_ETMLIM && rc != GLP_EMIPGAP)
    throw std::runtime_error(std::string("GLPK: glp_intopt failed with ") + glpk_error_name(rc) + " (code " +
                             std::to_string(rc) + ")");
  const int status = glp_mip_status(lp);
  if (status == GLP_NOFEAS) return GlpkOutcome::infeasible;
  if (status == GLP_UNDEF) {
    if (rc == GLP_ETMLIM) return GlpkOutcome::no_solution_in_time;
    throw std::runtime_error("GLPK: glp_intopt returned no solution and no reason (status GLP_UNDEF)");
  }
  proven = rc == 0 && status == GLP_OPT;
  return GlpkOutcome::solved;
}

// Minimises the primary objective, then the secondary among solutions within a rounding of the best primary.
// `start` is a feasible point, offered to both searches.
std::optional<BinarySolution> solve_binary_program(const BinaryProgram& program, const std::vector<bool>& start,
                                                   double time_limit_s) {
  const auto started = std::chrono::steady_clock::now();
  glp_term_out(GLP_OFF);
  GlpkProblem owned;
  glp_prob* lp = owned.get();
  glp_set_obj_dir(lp, GLP_MIN);
  glp_add_cols(lp, program.columns);
  for (int j = 1; j <= program.columns; ++j) {
    glp_set_col_kind(lp, j, GLP_BV);
    glp_set_obj_coef(lp, j, program.primary[j - 1]);
  }
  const int row_count = static_cast<int>(program.rows.size()) + 1;  // the last row: the primary, for stage 2
  glp_add_rows(lp, row_count);
  std::vector<int> ia{0}, ja{0};
  std::vector<double> ar{0};
  for (int i = 1; i < row_count; ++i) {
    const BinaryProgram::Row& row = program.rows[i - 1];
    if (row.equality) glp_set_row_bnds(lp, i, GLP_FX, row.upper, row.upper);
    else glp_set_row_bnds(lp, i, GLP_UP, 0.0, row.upper);
    // Blocks that share a window add to the same column: GLPK takes each (row, column) once.
    std::map<int, double> merged;
    for (const auto& [column, coefficient] : row.entries) merged[column] += coefficient;
    for (const auto& [column, coefficient] : merged) {
      ia.push_back(i);
      ja.push_back(column + 1);
      ar.push_back(coefficient);
    }
  }
  double primary_total = 0;
  for (int j = 1; j <= program.columns; ++j) {
    if (program.primary[j - 1] == 0) continue;
    primary_total += std::fabs(program.primary[j - 1]);
    ia.push_back(row_count);
    ja.push_back(j);
    ar.push_back(program.primary[j - 1]);
  }
  glp_set_row_bnds(lp, row_count, GLP_FR, 0.0, 0.0);  // free until stage 1 has a bound for it
  glp_load_matrix(lp, static_cast<int>(ia.size()) - 1, ia.data(), ja.data(), ar.data());

  Incumbent incumbent;
  incumbent.values.assign(program.columns + 1, 0.0);
  for (int j = 1; j <= program.columns; ++j) incumbent.values[j] = start[j - 1] ? 1.0 : 0.0;

  bool proven_first = false;
  const GlpkOutcome first = run_intopt(lp, time_limit_s, incumbent, proven_first);
  if (first == GlpkOutcome::infeasible) return std::nullopt;
  BinarySolution solution;
  solution.value = start;  // what stands when the search found nothing better in time
  solution.proven_optimal = false;
  if (first == GlpkOutcome::solved) {
    for (int j = 1; j <= program.columns; ++j) solution.value[j - 1] = glp_mip_col_val(lp, j) > 0.5;
    solution.proven_optimal = proven_first;
  }

  // Stage 2: the tie-break under the best primary found, from stage 1's point.
  const bool any_secondary = std::any_of(program.secondary.begin(), program.secondary.end(),
                                         [](double c) { return c != 0; });
  if (!any_secondary) return solution;
  double best_primary = 0;
  for (int j = 0; j < program.columns; ++j) best_primary += solution.value[j] ? program.primary[j] : 0.0;
  glp_set_row_bnds(lp, row_count, GLP_UP, 0.0, best_primary + 1e-9 * std::max(primary_total, 1.0));
  for (int j = 1; j <= program.columns; ++j) {
    glp_set_obj_coef(lp, j, program.secondary[j - 1]);
    incumbent.values[j] = solution.value[j - 1] ? 1.0 : 0.0;
  }
  bool proven_second = false;
  const double time_left_s = time_limit_s - seconds_since(started);
  const GlpkOutcome second =
      time_left_s > 0 ? run_intopt(lp, time_left_s, incumbent, proven_second) : GlpkOutcome::no_solution_in_time;
  if (second != GlpkOutcome::solved) {
    solution.proven_optimal = false;  // the first stage's placement stands, its tie-break not searched out
    return solution;
  }
  for (int j = 1; j <= program.columns; ++j) solution.value[j - 1] = glp_mip_col_val(lp, j) > 0.5;
  solution.proven_optimal = proven_first && proven_second;
  return solution;
}

void check_options(const PlacementOptions& options) {
  if (!(options.time_limit_s > 0) || !std::isfinite(options.time_limit_s))
    throw std::invalid_argument("recompute placement: the search time limit must be a finite number of seconds > 0");
  if (!(options.block_tolerance >= 0) || !(options.block_tolerance < 1))
    throw std::invalid_argument("recompute placement: the block tolerance must lie in [0, 1)");
}

// ---- the program of a pattern ----------------------------------------------------------------------------

// A pattern decides for K template ops at once; block b applies it to its ops blocks[b][k], with window
// offsets counted from refs[b]. The whole problem is one pattern of one block holding every op, offset 0.
struct Pattern {
  std::vector<std::vector<int>> blocks;      // (B, K) op indices
  std::vector<int> refs;                     // (B) window each block's offsets count from
  std::vector<std::vector<int>> producers;   // (K) template producers inside the block
};

// Builds and solves the pattern's program with the capacity and memory that other blocks already use, and
// returns the decision of each template op as (mode, offset), or nothing when no pattern fits.
std::optional<std::pair<std::vector<OpPlacement>, bool>> solve_pattern(const PlacementProblem& problem,
                                                                       const Pattern& pattern,
                                                                       const std::vector<double>& used_capacity_s,
                                                                       const std::vector<double>& used_bytes,
                                                                       const std::vector<OpPlacement>& start,
                                                                       double time_limit_s) {
  const int windows = static_cast<int>(problem.windows.size());
  const std::vector<int>& representative = pattern.blocks.front();
  const int templates = static_cast<int>(representative.size());

  // Normalise so the program's coefficients are near 1 whatever the units.
  double time_scale = 1e-300, byte_scale = 1e-300;
  for (const RecomputableOp& op : problem.ops) {
    time_scale = std::max(time_scale, op.time_s);
    byte_scale = std::max(byte_scale, op.output_bytes);
  }

  // Columns: per template op, keep, on demand, then one per window offset in its range.
  BinaryProgram program;
  std::vector<int> first_column(templates), first_offset(templates), offsets(templates);
  for (int k = 0; k < templates; ++k) {
    const RecomputableOp& op = problem.ops[representative[k]];
    first_column[k] = program.columns;
    first_offset[k] = op.earliest_window - pattern.refs.front();
    offsets[k] = std::max(op.deadline_window - op.earliest_window, 0);
    program.columns += 2 + offsets[k];
  }
  program.primary.assign(program.columns, 0.0);
  program.secondary.assign(program.columns, 0.0);
  auto keep_column = [&](int k) { return first_column[k]; };
  auto on_demand_column = [&](int k) { return first_column[k] + 1; };
  auto window_column = [&](int k, int j) { return first_column[k] + 2 + j; };  // offset first_offset[k] + j

  std::vector<BinaryProgram::Row> capacity(windows), memory(windows);
  for (int k = 0; k < templates; ++k) {
    BinaryProgram::Row one;
    one.equality = true;
    one.upper = 1;
    for (int j = 0; j < 2 + offsets[k]; ++j) one.entries.push_back({first_column[k] + j, 1.0});
    program.rows.push_back(one);

    for (size_t b = 0; b < pattern.blocks.size(); ++b) {
      const RecomputableOp& op = problem.ops[pattern.blocks[b][k]];
      program.primary[on_demand_column(k)] += op.time_s / time_scale;
      program.secondary[keep_column(k)] += op.output_bytes / byte_scale;
      for (int c = op.forward_window; c < std::min(op.deadline_window, windows); ++c)
        memory[c].entries.push_back({keep_column(k), op.output_bytes / byte_scale});
      for (int j = 0; j < offsets[k]; ++j) {
        const int w = pattern.refs[b] + first_offset[k] + j;
        capacity[w].entries.push_back({window_column(k, j), problem.slowdown * op.time_s / time_scale});
        for (int c = w; c < std::min(op.deadline_window, windows); ++c)
          memory[c].entries.push_back({window_column(k, j), op.output_bytes / byte_scale});
      }
    }

    // Producers: x(k, o) <= keep(p) + sum over o' <= o of x(p, o').
    for (int p : pattern.producers[k]) {
      for (int j = 0; j < offsets[k]; ++j) {
        const int offset = first_offset[k] + j;
        BinaryProgram::Row row;
        row.upper = 0;
        row.entries.push_back({window_column(k, j), 1.0});
        row.entries.push_back({keep_column(p), -1.0});
        for (int jp = 0; jp < offsets[p] && first_offset[p] + jp <= offset; ++jp)
          row.entries.push_back({window_column(p, jp), -1.0});
        program.rows.push_back(row);
      }
    }
  }
  for (int w = 0; w < windows; ++w) {
    if (!capacity[w].entries.empty()) {
      capacity[w].upper = std::max(problem.windows[w].capacity_s - used_capacity_s[w], 0.0) / time_scale;
      program.rows.push_back(capacity[w]);
    }
    if (!memory[w].entries.empty()) {
      memory[w].upper = (problem.memory_limit_bytes - problem.windows[w].base_bytes - used_bytes[w]) / byte_scale;
      program.rows.push_back(memory[w]);
    }
  }

  // The start's decisions as columns (its windows are offsets, as the decisions returned below).
  std::vector<bool> start_columns(program.columns, false);
  for (int k = 0; k < templates; ++k) {
    const OpPlacement& d = start[k];
    if (d.mode == RecomputeMode::keep) start_columns[keep_column(k)] = true;
    else if (d.mode == RecomputeMode::on_demand) start_columns[on_demand_column(k)] = true;
    else start_columns[window_column(k, d.window - first_offset[k])] = true;
  }
  const std::optional<BinarySolution> solution = solve_binary_program(program, start_columns, time_limit_s);
  if (!solution) return std::nullopt;
  std::vector<OpPlacement> decisions(templates);  // window holds the offset from the block's ref
  for (int k = 0; k < templates; ++k) {
    if (solution->value[keep_column(k)]) decisions[k] = {RecomputeMode::keep, -1};
    else if (solution->value[on_demand_column(k)]) decisions[k] = {RecomputeMode::on_demand, -1};
    else {
      for (int j = 0; j < offsets[k]; ++j)
        if (solution->value[window_column(k, j)]) decisions[k] = {RecomputeMode::window, first_offset[k] + j};
    }
  }
  return std::make_pair(decisions, solution->proven_optimal);
}

// ---- identical blocks ------------------------------------------------------------------------------------

struct Block {
  int layer = 0;
  std::vector<int> ops;               // in problem order
  int ref = 0;                        // the first deadline among its ops: where its backward begins
  std::vector<std::vector<int>> local_producers;  // per op: producer positions in the block, -1 outside
};

bool close(double a, double b, double tolerance) {
  return std::fabs(a - b) <= tolerance * std::max(std::fabs(a), std::fabs(b));
}

bool identical(const PlacementProblem& problem, const Block& a, const Block& b, double tolerance) {
  if (a.ops.size() != b.ops.size()) return false;
  for (size_t k = 0; k < a.ops.size(); ++k) {
    const RecomputableOp& x = problem.ops[a.ops[k]];
    const RecomputableOp& y = problem.ops[b.ops[k]];
    if (!close(x.time_s, y.time_s, tolerance) || !close(x.output_bytes, y.output_bytes, tolerance)) return false;
    if (x.earliest_window - a.ref != y.earliest_window - b.ref) return false;
    if (x.deadline_window - a.ref != y.deadline_window - b.ref) return false;
    if (a.local_producers[k] != b.local_producers[k]) return false;
  }
  return true;
}

std::vector<Block> blocks_by_layer(const PlacementProblem& problem) {
  std::map<int, Block> by_layer;
  for (int i = 0; i < static_cast<int>(problem.ops.size()); ++i) {
    Block& block = by_layer[problem.ops[i].layer];
    block.layer = problem.ops[i].layer;
    block.ops.push_back(i);
  }
  std::vector<Block> blocks;
  for (auto& [layer, block] : by_layer) {
    block.ref = problem.ops[block.ops.front()].deadline_window;
    for (int i : block.ops) block.ref = std::min(block.ref, problem.ops[i].deadline_window);
    for (int i : block.ops) {
      std::vector<int> local;
      for (int p : problem.ops[i].producers) {
        const auto at = std::find(block.ops.begin(), block.ops.end(), p);
        local.push_back(at == block.ops.end() ? -1 : static_cast<int>(at - block.ops.begin()));
      }
      block.local_producers.push_back(local);
    }
    blocks.push_back(std::move(block));
  }
  return blocks;
}

// An op in a window whose producer is on demand, or recomputed later, falls back to on demand; repeated
// until nothing changes, since each fallback can break its own consumers. Falling back only frees capacity
// and memory, so the other constraints stay met.
void repair_producers(const PlacementProblem& problem, Placement& placement) {
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < problem.ops.size(); ++i) {
      if (placement[i].mode != RecomputeMode::window) continue;
      for (int p : problem.ops[i].producers) {
        const OpPlacement& producer = placement[p];
        const bool ready = producer.mode == RecomputeMode::keep ||
                           (producer.mode == RecomputeMode::window && producer.window <= placement[i].window);
        if (!ready) {
          placement[i] = {RecomputeMode::on_demand, -1};
          changed = true;
          break;
        }
      }
    }
  }
}

// One pattern for many blocks leaves capacity and memory unused (blocks differ in what is free around them):
// each on-demand op, longest first, moves into the latest window that still takes it (the latest holds its
// output for the shortest time), or else is kept, where capacity, memory and its producers allow. Repeated
// until nothing moves, since a placed producer can make room for its consumers.
void fill_greedily(const PlacementProblem& problem, Placement& placement) {
  const int windows = static_cast<int>(problem.windows.size());
  std::vector<double> load_s(windows, 0.0);
  for (size_t i = 0; i < placement.size(); ++i)
    if (placement[i].mode == RecomputeMode::window) load_s[placement[i].window] += problem.slowdown * problem.ops[i].time_s;
  std::vector<double> held = memory_at_check_points(problem, placement);
  std::vector<int> order(problem.ops.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return problem.ops[a].time_s > problem.ops[b].time_s; });
  auto fits_memory = [&](const RecomputableOp& op, int from) {
    for (int c = from; c < op.deadline_window; ++c)
      if (!within(held[c] + op.output_bytes, problem.memory_limit_bytes)) return false;
    return true;
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (int i : order) {
      if (placement[i].mode != RecomputeMode::on_demand) continue;
      const RecomputableOp& op = problem.ops[i];
      auto producers_ready_by = [&](int w) {
        return std::all_of(op.producers.begin(), op.producers.end(), [&](int p) {
          return placement[p].mode == RecomputeMode::keep ||
                 (placement[p].mode == RecomputeMode::window && placement[p].window <= w);
        });
      };
      for (int w = op.deadline_window - 1; w >= op.earliest_window && !moved; --w) {
        if (producers_ready_by(w) && within(load_s[w] + problem.slowdown * op.time_s, problem.windows[w].capacity_s) &&
            fits_memory(op, w)) {
          placement[i] = {RecomputeMode::window, w};
          load_s[w] += problem.slowdown * op.time_s;
          moved = true;
        }
      }
      if (!moved && fits_memory(op, op.forward_window)) {
        placement[i] = {RecomputeMode::keep, -1};
        moved = true;
      }
      if (moved) {
        for (int c = 0; c < windows; ++c)
          if (held_at(op, placement[i], c)) held[c] += op.output_bytes;
        break;  // the order restarts: the placed op may unblock a longer consumer
      }
    }
  }
}

}  // namespace

const char* mode_name(RecomputeMode mode) {
  switch (mode) {
    case RecomputeMode::keep: return "keep";
    case RecomputeMode::on_demand: return "on-demand";
    case RecomputeMode::window: return "window";
  }
  return "?";
}

void check_problem(const PlacementProblem& problem) {
  const int windows = static_cast<int>(problem.windows.size());
  const int ops = static_cast<int>(problem.ops.size());
  auto fail = [](const std::string& what) { throw std::invalid_argument("recompute placement: " + what); };
  if (!(problem.slowdown >= 1) || !std::isfinite(problem.slowdown))
    fail("the interference slowdown must be a finite number >= 1, not " + std::to_string(problem.slowdown));
  if (!(problem.memory_limit_bytes >= 0) || !std::isfinite(problem.memory_limit_bytes))
    fail("the memory limit must be a finite number of bytes >= 0");
  std::set<std::string> labels, names;
  for (const RecomputeWindow& w : problem.windows) {
    if (w.label.empty()) fail("a window has no label");
    if (!labels.insert(w.label).second) fail("two windows are labelled '" + w.label + "'");
    if (!(w.capacity_s >= 0) || !std::isfinite(w.capacity_s))
      fail("window '" + w.label + "' has a capacity that is not a finite number of seconds >= 0");
    if (!(w.base_bytes >= 0) || !std::isfinite(w.base_bytes)) fail("window '" + w.label + "' has a bad base memory");
  }
  for (int i = 0; i < ops; ++i) {
    const RecomputableOp& op = problem.ops[i];
    if (op.name.empty()) fail("op " + std::to_string(i) + " has no name");
    if (!names.insert(op.name).second) fail("two ops are named '" + op.name + "'");
    if (!(op.time_s >= 0) || !std::isfinite(op.time_s)) fail("op '" + op.name + "' has a bad time");
    if (!(op.output_bytes >= 0) || !std::isfinite(op.output_bytes)) fail("op '" + op.name + "' has bad output bytes");
    if (op.forward_window < 0 || op.forward_window > op.earliest_window)
      fail("op '" + op.name + "' may be recomputed in window " + std::to_string(op.earliest_window) +
           ", before its forward (window " + std::to_string(op.forward_window) + ")");
    if (op.earliest_window < 0 || op.earliest_window > op.deadline_window || op.deadline_window > windows)
      fail("op '" + op.name + "' has windows [" + std::to_string(op.earliest_window) + ", " +
           std::to_string(op.deadline_window) + "), not inside [0, " + std::to_string(windows) + ")");
    for (int p : op.producers) {
      if (p < 0 || p >= ops || p == i) fail("op '" + op.name + "' names producer " + std::to_string(p));
      // The producer's output must outlive the consumer's recomputation: its backward comes later.
      if (problem.ops[p].deadline_window < op.deadline_window)
        fail("op '" + op.name + "' has producer '" + problem.ops[p].name + "' whose backward comes before its own");
    }
  }
  for (int w = 0; w < windows; ++w)
    if (!within(problem.windows[w].base_bytes, problem.memory_limit_bytes))
      fail("at window '" + problem.windows[w].label + "' the memory outside the recomputable outputs, " +
           format_bytes(problem.windows[w].base_bytes) + ", already exceeds the limit of " +
           format_bytes(problem.memory_limit_bytes) + ": no placement fits, even all on demand");
}

std::optional<std::string> find_violation(const PlacementProblem& problem, const Placement& placement) {
  const int windows = static_cast<int>(problem.windows.size());
  if (placement.size() != problem.ops.size())
    return "the placement decides " + std::to_string(placement.size()) + " ops but the problem has " +
           std::to_string(problem.ops.size());
  for (size_t i = 0; i < placement.size(); ++i) {
    const RecomputableOp& op = problem.ops[i];
    const OpPlacement& d = placement[i];
    if (d.mode != RecomputeMode::window) continue;
    if (d.window < 0 || d.window >= windows)
      return "op '" + op.name + "' is placed in window " + std::to_string(d.window) + " but there are " +
             std::to_string(windows) + " windows";
    if (d.window < op.earliest_window)
      return "op '" + op.name + "' is placed in window '" + problem.windows[d.window].label +
             "', before the first window it may use ('" + problem.windows[op.earliest_window].label + "')";
    if (d.window >= op.deadline_window)
      return "op '" + op.name + "' is placed in window '" + problem.windows[d.window].label +
             "', after its backward has started";
  }
  for (size_t i = 0; i < placement.size(); ++i) {
    if (placement[i].mode != RecomputeMode::window) continue;
    for (int p : problem.ops[i].producers) {
      const OpPlacement& producer = placement[p];
      const std::string where = "op '" + problem.ops[i].name + "' is recomputed in window '" +
                                problem.windows[placement[i].window].label + "' but its producer '" +
                                problem.ops[p].name + "'";
      if (producer.mode == RecomputeMode::on_demand) return where + " is recomputed on demand, later";
      if (producer.mode == RecomputeMode::window && producer.window > placement[i].window)
        return where + " is recomputed later, in window '" + problem.windows[producer.window].label + "'";
    }
  }
  std::vector<double> load_s(windows, 0.0);
  for (size_t i = 0; i < placement.size(); ++i)
    if (placement[i].mode == RecomputeMode::window)
      load_s[placement[i].window] += problem.slowdown * problem.ops[i].time_s;
  for (int w = 0; w < windows; ++w)
    if (!within(load_s[w], problem.windows[w].capacity_s))
      return "window '" + problem.windows[w].label + "' holds " + format_ms(load_s[w]) +
             " of recomputation (slowdown included) but lasts " + format_ms(problem.windows[w].capacity_s);
  const std::vector<double> held = memory_at_check_points(problem, placement);
  for (int w = 0; w < windows; ++w)
    if (!within(held[w], problem.memory_limit_bytes))
      return "at the end of window '" + problem.windows[w].label + "' " + format_bytes(held[w]) +
             " are held, over the limit of " + format_bytes(problem.memory_limit_bytes);
  return std::nullopt;
}

double exposed_recompute_s(const PlacementProblem& problem, const Placement& placement) {
  double total = 0;
  for (size_t i = 0; i < placement.size(); ++i)
    if (placement[i].mode == RecomputeMode::on_demand) total += problem.ops[i].time_s;
  return total;
}

double hidden_recompute_s(const PlacementProblem& problem, const Placement& placement) {
  double total = 0;
  for (size_t i = 0; i < placement.size(); ++i)
    if (placement[i].mode == RecomputeMode::window) total += problem.ops[i].time_s;
  return total;
}

double kept_bytes(const PlacementProblem& problem, const Placement& placement) {
  double total = 0;
  for (size_t i = 0; i < placement.size(); ++i)
    if (placement[i].mode == RecomputeMode::keep) total += problem.ops[i].output_bytes;
  return total;
}

std::vector<double> memory_at_check_points(const PlacementProblem& problem, const Placement& placement) {
  const int windows = static_cast<int>(problem.windows.size());
  std::vector<double> held(windows);
  for (int c = 0; c < windows; ++c) {
    held[c] = problem.windows[c].base_bytes;
    for (size_t i = 0; i < placement.size(); ++i)
      if (held_at(problem.ops[i], placement[i], c)) held[c] += problem.ops[i].output_bytes;
  }
  return held;
}

double peak_memory_bytes(const PlacementProblem& problem, const Placement& placement) {
  const std::vector<double> held = memory_at_check_points(problem, placement);
  return held.empty() ? 0.0 : *std::max_element(held.begin(), held.end());
}

PlacementResult summarise(const PlacementProblem& problem, Placement placement, double search_s,
                          bool proven_optimal) {
  PlacementResult result;
  result.exposed_s = exposed_recompute_s(problem, placement);
  result.hidden_s = hidden_recompute_s(problem, placement);
  result.kept_bytes = kept_bytes(problem, placement);
  result.peak_bytes = peak_memory_bytes(problem, placement);
  result.search_s = search_s;
  result.proven_optimal = proven_optimal;
  result.placement = std::move(placement);
  return result;
}

PlacementResult solve_optimal(const PlacementProblem& problem, const PlacementOptions& options) {
  check_problem(problem);
  check_options(options);
  const auto start = std::chrono::steady_clock::now();
  const int windows = static_cast<int>(problem.windows.size());
  // The heuristic's placement is the search's first incumbent, so the optimum is never worse than it and a
  // search cut off by the time limit still returns a valid placement.
  const PlacementResult heuristic = solve_heuristic(problem, options);
  Pattern whole;
  whole.blocks.emplace_back(problem.ops.size());
  std::iota(whole.blocks[0].begin(), whole.blocks[0].end(), 0);
  whole.refs = {0};
  for (const RecomputableOp& op : problem.ops) whole.producers.push_back(op.producers);
  Placement placement;
  bool proven = true;
  if (!problem.ops.empty()) {
    const double time_left_s = std::max(options.time_limit_s - seconds_since(start), 1e-3);
    const auto solved = solve_pattern(problem, whole, std::vector<double>(windows, 0.0),
                                      std::vector<double>(windows, 0.0), heuristic.placement, time_left_s);
    // All on demand fits every constraint once check_problem has passed, so no solution is GLPK's failure.
    if (!solved) throw std::runtime_error("GLPK reported the placement infeasible, though all on demand fits");
    placement = solved->first;
    proven = solved->second;
  }
  const double search_s = seconds_since(start);
  if (const auto violation = find_violation(problem, placement))
    throw std::logic_error("the optimal placement breaks a constraint: " + *violation);
  return summarise(problem, std::move(placement), search_s, proven);
}

PlacementResult solve_heuristic(const PlacementProblem& problem, const PlacementOptions& options) {
  check_problem(problem);
  check_options(options);
  const auto start = std::chrono::steady_clock::now();
  const int windows = static_cast<int>(problem.windows.size());
  const std::vector<Block> blocks = blocks_by_layer(problem);

  // Classes of identical blocks, the first block of each its representative.
  std::vector<std::vector<int>> classes;
  for (int b = 0; b < static_cast<int>(blocks.size()); ++b) {
    auto match = std::find_if(classes.begin(), classes.end(), [&](const std::vector<int>& members) {
      return identical(problem, blocks[members.front()], blocks[b], options.block_tolerance);
    });
    if (match == classes.end()) classes.push_back({b});
    else match->push_back(b);
  }
  std::stable_sort(classes.begin(), classes.end(),
                   [](const auto& x, const auto& y) { return x.size() > y.size(); });

  Placement placement(problem.ops.size(), OpPlacement{RecomputeMode::on_demand, -1});
  std::vector<double> used_capacity_s(windows, 0.0), used_bytes(windows, 0.0);
  for (const std::vector<int>& members : classes) {
    Pattern pattern;
    const Block& representative = blocks[members.front()];
    for (int b : members) {
      pattern.blocks.push_back(blocks[b].ops);
      pattern.refs.push_back(blocks[b].ref);
    }
    for (const std::vector<int>& local : representative.local_producers) {
      std::vector<int> inside;
      for (int p : local)
        if (p >= 0) inside.push_back(p);
      pattern.producers.push_back(inside);
    }
    const double time_left_s = std::max(options.time_limit_s - seconds_since(start), 1e-3);
    const std::vector<OpPlacement> all_on_demand(representative.ops.size(), {RecomputeMode::on_demand, -1});
    const auto solved = solve_pattern(problem, pattern, used_capacity_s, used_bytes, all_on_demand, time_left_s);
    if (!solved) continue;  // nothing fits beside the earlier classes: this class stays on demand
    for (size_t b = 0; b < members.size(); ++b) {
      for (size_t k = 0; k < pattern.blocks[b].size(); ++k) {
        const int i = pattern.blocks[b][k];
        OpPlacement d = solved->first[k];
        if (d.mode == RecomputeMode::window) d.window += pattern.refs[b];
        placement[i] = d;
        if (d.mode == RecomputeMode::window) used_capacity_s[d.window] += problem.slowdown * problem.ops[i].time_s;
        for (int c = 0; c < windows; ++c)
          if (held_at(problem.ops[i], d, c)) used_bytes[c] += problem.ops[i].output_bytes;
      }
    }
  }
  repair_producers(problem, placement);
  fill_greedily(problem, placement);
  const double search_s = seconds_since(start);
  if (const auto violation = find_violation(problem, placement))
    throw std::logic_error("the heuristic placement breaks a constraint: " + *violation);
  PlacementResult result = summarise(problem, std::move(placement), search_s, false);
  result.identical_block_classes = static_cast<int>(classes.size());
  return result;
}

double heuristic_gap(const PlacementResult& heuristic, const PlacementResult& optimal) {
  if (optimal.exposed_s <= 0) return heuristic.exposed_s <= 0 ? 0.0 : INFINITY;
  return heuristic.exposed_s / optimal.exposed_s - 1.0;
}

}  // namespace strata::train
