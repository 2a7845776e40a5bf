// Benchmark: pipeline parallelism's figures, measured side by side in one run on two pipeline stages (make bench
// runs np 2 as tp 1 x pp 2 and np 4 as tp 2 x pp 2), every case on the same model, micro-batches, tokens and
// initialisation:
//
// 1. Recomputation overlapped with the pipeline's waits (`--recompute overlap`, Lynx, docs/strategies.md#overlapped-recomputation-lynx)
//    against on-demand recomputation (`full`) and against keeping every activation (`none`), all under 1F1B:
//    step time and the ratios overlap/full and overlap/none; each mode's exposed recomputation fraction
//    (recomputation on the critical path: on demand, plus the part of a window's that ran after the awaited
//    gradient had come; over the step); and the share of overlap's recomputation that ran hidden in windows.
//    The placement is strata-step's: one warm-up step and one measured step recomputing everything on demand
//    (full) give every op's time and every window's length, train/overlap.h builds each pipeline rank's problem,
//    Lynx's heuristic solves it under strata-step's default limit (what overlap allocates with nothing kept: the
//    layers' inputs and every layer's own recompute space, so it keeps the ops that space holds anyway; on 1F1B's
//    last stage, one micro-batch in flight, all of them), and each stage's ranks agree on its first rank's
//    placement. Printed beside the figures: how much of full's recomputation overlap keeps, hides and exposes;
//    per stage, the windows' length and the most they can hide beside what they hid; activations per mode.
// 2. The measured bubble against (p - 1) / (v m) for GPipe, 1F1B and interleaved 1F1B (v = 2), recomputation off:
//    each rank's pipeline wait over its compute in the pipelined passes (forward + backward + recomputation in
//    windows), mean over ranks (strata-step's bubble_fraction); and beside it the same with the step's idle time
//    counted as a wait too (the last stage waits for the first to finish its cool-down inside the allreduce of
//    the tied token table's gradient, which is idle time, not a pipeline receive).
// Checks (exit 1 when one fails): the recomputation modes train along the same losses as keeping everything
// (1e-6 relative), the schedules along the same losses up to fp32 summation order (1e-5), and the bytes sent to
// the other stage are train/step_formulas.h's. No target: the paper reports up to 1.37x over on-demand
// recomputation on GPU clusters; these figures say what this machine shows. At 4 ranks on 2 cores the ranks
// that wait spin on the cores the others compute on, so the np-4 figures are printed "not judged".
// Rounds interleave every case, the order rotating by round; medians are quoted.
//
//   strata-bench-pipeline [--layers N] [--hidden N] [--heads N] [--vocab N] [--seq N] [--micro-batch N]
//                         [--microbatches M] [--rounds N] [--smoke]
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/harness/cli.h"
#include "bench/harness/harness.h"
#include "bench/harness/stats.h"
#include "bench/harness/timer.h"
#include "collectives/mpi_error.h"
#include "collectives/process_group.h"
#include "kernels/cpu_gemm.h"
#include "train/data.h"
#include "train/overlap.h"
#include "train/recompute_placement.h"
#include "train/step_formulas.h"
#include "train/trainer.h"

namespace {

using namespace strata;
using namespace strata::train;

double median(std::vector<double> v) { return v.empty() ? NAN : summarize(std::move(v)).median; }

struct Settings {
  int layers = 8, hidden = 128, heads = 4, vocab = 256, seq = 64, micro_batch = 2, microbatches = 8, rounds = 21;
  bool smoke = false;
};

// What a rank reports per timed step, gathered on rank 0.
enum Field { kElapsed, kRecompute, kWindow, kHidden, kWait, kCompute, kIdle, kFields };
using Fields = std::array<double, kFields>;

// One case: a trainer, and per timed step every rank's figures (on rank 0).
struct Case {
  std::string name;
  Schedule schedule = Schedule::one_f_one_b;
  int virtual_stages = 1;
  Recompute recompute = Recompute::none;
  TrainConfig config;
  std::unique_ptr<Trainer> trainer;
  int64_t steps = 0;
  std::vector<std::vector<Fields>> timed;  // [step][rank]
  std::vector<double> losses;              // this rank's, per timed step
  double sent_bytes = 0, sent_formula = 0;  // this rank's, last step
  double activations = 0;                   // this rank's, as allocated

  // Per timed step: f(the step's ranks); then the median over steps.
  template <typename F>
  double median_of_steps(const F& f) const {
    std::vector<double> v;
    for (const std::vector<Fields>& ranks : timed) v.push_back(f(ranks));
    return median(std::move(v));
  }
  double step() const {
    return median_of_steps([](const std::vector<Fields>& ranks) {
      double slowest = 0;
      for (const Fields& f : ranks) slowest = std::max(slowest, f[kElapsed]);
      return slowest;
    });
  }
  // The mean over ranks (or over the ranks `which` selects) of g(rank's fields), median over steps.
  template <typename G>
  double mean_over_ranks(const G& g, const std::vector<bool>& which = {}) const {
    return median_of_steps([&](const std::vector<Fields>& ranks) {
      double sum = 0;
      int n = 0;
      for (std::size_t r = 0; r < ranks.size(); ++r)
        if (which.empty() || which[r]) sum += g(ranks[r]), ++n;
      return n ? sum / n : 0.0;
    });
  }
};

// Recomputation on the critical path: on demand, and in a window after the awaited gradient came.
double exposed_recompute(const Fields& f) { return f[kRecompute] + f[kWindow] - f[kHidden]; }
double all_recompute(const Fields& f) { return f[kRecompute] + f[kWindow]; }

// nullopt after --help.
std::optional<Settings> parse_settings(int argc, char** argv) {
  Settings s;
  Cli cli("strata-bench-pipeline",
          "Two pipeline stages: overlapped recomputation against full and none, and the bubble against (p-1)/(v m).");
  cli.option("layers", 0, "layers (divisible by 4: two stages of two chunks each under interleaving)", s.layers, 4);
  cli.option("hidden", 0, "hidden size", s.hidden, 8);
  cli.option("heads", 0, "attention heads", s.heads, 1);
  cli.option("vocab", 0, "vocabulary", s.vocab, 2);
  cli.option("seq", 's', "sequence length", s.seq, 1);
  cli.option("micro-batch", 'b', "rows per micro-batch", s.micro_batch, 1);
  cli.option("microbatches", 'm', "micro-batches per step m (even: interleaving runs them in groups of the 2 stages)",
             s.microbatches, 2);
  cli.option("rounds", 'r', "interleaved rounds (medians are quoted)", s.rounds, 1);
  cli.flag("smoke", 0, "a tiny model for the test suite: the checks and the table, nothing judged", s.smoke);
  if (!cli.parse(argc, argv)) return std::nullopt;
  if (s.smoke) s.layers = 4, s.hidden = 32, s.heads = 4, s.vocab = 64, s.seq = 16, s.microbatches = 4, s.rounds = 1;
  return s;
}

// Overlap's placement on this pipeline rank, from a measured step recomputing everything on demand, applied to
// `config`; what its windows are and could hide, and how many ops it keeps.
struct OverlapPlan {
  PlacementResult plan;
  double window_capacity = 0, window_bound = 0;  // the windows' length, what they could hide
  int windows = 0, kept = 0, ops = 0;
};

OverlapPlan place_overlap(TrainConfig& config, coll::ProcessGroups& groups, const TokenSource& data, int pp, int tp,
                          int microbatches) {
  const int pp_rank = groups.pp_index();
  recompute_everything(config, pp);
  OverlapPlan out;
  TrainConfig measured = config;
  measured.recompute = Recompute::full, measured.kept_ops.clear(), measured.window_recomputes.clear();
  StepProfile profile;
  {
    Trainer trainer(measured, groups, data);
    trainer.step(1);  // the first step touches every page: not representative
    profile = profile_of(trainer.step(2), measured.accumulation);
  }
  const OverlapProblem problem = overlap_problem(config, pp, pp_rank, tp, false, profile);
  const PlacementResult heuristic = solve_heuristic(problem.problem);
  const Placement placement = agree(groups, heuristic.placement);  // one per stage
  out.plan = summarise(problem.problem, placement, heuristic.search_s, false);
  apply_placement(problem, placement, pp, pp_rank, config);
  // Each op may use only the window right before its own micro-batch's backward: a window hides at most the smaller
  // of its length and that micro-batch's recomputation.
  out.windows = static_cast<int>(problem.problem.windows.size());
  for (int w = 0; w < out.windows; ++w) {
    double eligible = 0;
    for (const RecomputableOp& op : problem.problem.ops)
      if (op.earliest_window <= w && w < op.deadline_window) eligible += op.time_s;
    const double capacity = problem.problem.windows[static_cast<std::size_t>(w)].capacity_s;
    out.window_capacity += capacity;
    out.window_bound += std::min(capacity, eligible);
  }
  for (int chunk = 0; chunk < config.virtual_stages; ++chunk)  // this rank's stages only
    for (const KeptOps& layer : config.kept_ops.at(static_cast<std::size_t>(stage_of({pp, microbatches, 1}, pp_rank, chunk))))
      for (bool k : layer) out.kept += k, ++out.ops;
  return out;
}

// One timed step of a case; every rank's figures gathered on rank 0.
void timed_step(Case& c) {
  STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  const double start = host_now();
  const StepStats stats = c.trainer->step(++c.steps);
  Fields mine{};
  mine[kElapsed] = host_now() - start;
  mine[kRecompute] = stats.recompute_seconds;
  mine[kWindow] = stats.recompute_window_seconds;
  mine[kHidden] = stats.recompute_hidden_seconds;
  mine[kWait] = stats.pipeline.wait_seconds;
  mine[kCompute] = stats.forward_seconds + stats.backward_seconds + stats.recompute_window_seconds;
  mine[kIdle] = stats.idle_seconds;
  c.sent_bytes = stats.pipeline.sent_bytes;
  c.losses.push_back(stats.loss);
  std::vector<Fields> all(static_cast<std::size_t>(world_size()));
  STRATA_MPI_CHECK(MPI_Gather(mine.data(), kFields, MPI_DOUBLE, all.data(), kFields, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  if (world_rank() == 0) c.timed.push_back(std::move(all));
}

enum { kNone, kFull, kOverlap, kGpipe, kInterleaved };  // the cases, in their order

// The checks: every mode and schedule trains along 1f1b none's losses (recomputation: the same sums; schedules
// within fp32 order), and sends the formula's bytes to the other stage. The wrong ones over all ranks.
int count_wrong(const std::vector<Case>& cases) {
  int wrong = 0;
  const int rank = world_rank();
  for (const Case& c : cases) {
    const double tolerance = c.schedule == Schedule::one_f_one_b ? 1e-6 : 1e-5;
    for (std::size_t k = 0; k < c.losses.size(); ++k)
      if (!(std::abs(c.losses[k] - cases[kNone].losses[k]) <= tolerance * std::abs(cases[kNone].losses[k]))) {
        std::fprintf(stderr, "strata-bench-pipeline: rank %d: %s: loss %.9g at timed step %zu, 1f1b none's %.9g\n", rank,
                     c.name.c_str(), c.losses[k], k + 1, cases[kNone].losses[k]);
        ++wrong;
        break;
      }
    if (c.sent_bytes != c.sent_formula) {
      std::fprintf(stderr, "strata-bench-pipeline: rank %d: %s sent %.0f B to the other stage, the formula %.0f B\n", rank,
                   c.name.c_str(), c.sent_bytes, c.sent_formula);
      ++wrong;
    }
  }
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  return wrong;
}

// Per pipeline rank (its first tensor-parallel rank speaks): activations per mode, overlap's windows and plan.
enum { kSpeaks, kActNone, kActFull, kActOverlap, kWindows, kCapacity, kBound, kPlanHidden, kPlanExposed, kSearch, kKept,
       kOps, kStageFields };
using StageFields = std::array<double, kStageFields>;

// Gathered on rank 0.
std::vector<StageFields> stage_fields(const std::vector<Case>& cases, const OverlapPlan& o, const coll::ProcessGroups& groups) {
  StageFields stage{};
  stage[kSpeaks] = groups.tp_index() == 0;
  stage[kActNone] = cases[kNone].activations, stage[kActFull] = cases[kFull].activations;
  stage[kActOverlap] = cases[kOverlap].activations;
  stage[kWindows] = o.windows, stage[kCapacity] = o.window_capacity, stage[kBound] = o.window_bound;
  stage[kPlanHidden] = o.plan.hidden_s, stage[kPlanExposed] = o.plan.exposed_s, stage[kSearch] = o.plan.search_s;
  stage[kKept] = o.kept, stage[kOps] = o.ops;
  std::vector<StageFields> stages(static_cast<std::size_t>(world_size()));
  STRATA_MPI_CHECK(MPI_Gather(stage.data(), kStageFields, MPI_DOUBLE, stages.data(), kStageFields, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  return stages;
}

// Table 1 (rank 0): overlapped recomputation against on-demand and none, in total and per stage.
void print_recompute_table(const std::vector<Case>& cases, const std::vector<StageFields>& stages,
                           const std::vector<int>& pp_ranks, int pp, const char* note) {
  const int world = static_cast<int>(stages.size());
    const Case &none = cases[kNone], &full = cases[kFull], &over = cases[kOverlap];
    auto ratio = [&](const Case& a, const Case& b) {  // median of the per-round ratios of the step
      std::vector<double> v;
      for (std::size_t r = 0; r < a.timed.size(); ++r) {
        double x = 0, y = 0;
        for (const Fields& f : a.timed[r]) x = std::max(x, f[kElapsed]);
        for (const Fields& f : b.timed[r]) y = std::max(y, f[kElapsed]);
        v.push_back(x / y);
      }
      return median(std::move(v));
    };
    std::printf("# 1. overlapped recomputation (Lynx) against on-demand (full) and none, 1F1B%s\n", note);
    std::printf("#    recompute: per rank (mean over ranks), on demand + in windows; exposed: on the critical path (on demand + "
                "in windows after the awaited gradient came), mean over ranks / step; hidden: in windows before it came / "
                "the mode's recompute\n");
    std::printf("# %-13s %10s %15s %10s %10s %14s\n", "mode", "step(ms)", "recompute(ms)", "exposed", "hidden",
                "activations");
    for (const Case* c : {&none, &full, &over}) {
      const double step = c->step(), recomputed = c->mean_over_ranks(all_recompute);
      double activations = 0;
      for (int r = 0; r < world; ++r)
        activations = std::max(activations, stages[static_cast<std::size_t>(r)][c == &none ? kActNone : c == &full ? kActFull : kActOverlap]);
      std::printf("  %-13s %10.2f %15.2f %9.1f%% %9.1f%% %11.3f MB\n", c->name.c_str(), step * 1e3, recomputed * 1e3,
                  100 * c->mean_over_ranks(exposed_recompute) / step,
                  recomputed > 0 ? 100 * c->mean_over_ranks([](const Fields& f) { return f[kHidden]; }) / recomputed : 0.0,
                  activations / 1e6);
    }
    std::printf("  step time overlap / full %.3f, overlap / none %.3f, full / none %.3f (medians of the per-round ratios)%s\n",
                ratio(over, full), ratio(over, none), ratio(full, none), note);
    const double full_recompute = full.mean_over_ranks(all_recompute);
    if (full_recompute > 0)
      std::printf("  of full's recomputation (%.2f ms per rank), overlap keeps %.1f%% (memory its limit allows: the per-layer "
                  "recompute space it holds anyway), hides %.1f%% in windows, runs %.1f%% in windows after the gradient "
                  "came and %.1f%% on demand\n",
                  full_recompute * 1e3, 100 * (1 - over.mean_over_ranks(all_recompute) / full_recompute),
                  100 * over.mean_over_ranks([](const Fields& f) { return f[kHidden]; }) / full_recompute,
                  100 * over.mean_over_ranks([](const Fields& f) { return f[kWindow] - f[kHidden]; }) / full_recompute,
                  100 * over.mean_over_ranks([](const Fields& f) { return f[kRecompute]; }) / full_recompute);
    std::printf("#    per stage: overlap's measured recomputation per rank on demand / in windows / hidden; its windows (the "
                "waits for the next stage's gradient before a backward, measured in a full step), the most they can hide "
                "(each only the recomputation of the micro-batch whose backward follows it), the placement's plan\n");
    for (int p = 0; p < pp; ++p) {
      std::vector<bool> here(static_cast<std::size_t>(world));
      for (int r = 0; r < world; ++r) here[static_cast<std::size_t>(r)] = pp_ranks[static_cast<std::size_t>(r)] == p;
      const auto& f = *std::find_if(stages.begin(), stages.end(), [&](const auto& x) {
        return x[kSpeaks] != 0 && pp_ranks[static_cast<std::size_t>(&x - stages.data())] == p;
      });
      std::printf("  stage %d: %.2f / %.2f / %.2f ms | keeps %d of %d ops | %d windows, %.2f ms long, can hide %.2f ms | "
                  "planned %.2f ms in windows, %.2f ms on demand (heuristic, %.4f s)%s\n",
                  p, over.mean_over_ranks([](const Fields& x) { return x[kRecompute]; }, here) * 1e3,
                  over.mean_over_ranks([](const Fields& x) { return x[kWindow]; }, here) * 1e3,
                  over.mean_over_ranks([](const Fields& x) { return x[kHidden]; }, here) * 1e3, static_cast<int>(f[kKept]),
                  static_cast<int>(f[kOps]), static_cast<int>(f[kWindows]), f[kCapacity] * 1e3, f[kBound] * 1e3,
                  f[kPlanHidden] * 1e3, f[kPlanExposed] * 1e3, f[kSearch],
                  p == pp - 1 ? " (the last stage waits for no gradient: no window)" : "");
    }
}

// Table 2 (rank 0): the bubble of each schedule against (p - 1) / (v m).
void print_bubble_table(const std::vector<Case>& cases, int pp, int microbatches, const char* note) {
  const Case& none = cases[kNone];
    std::printf("# 2. bubble: pipeline wait / (forward + backward + recompute in windows) per rank, mean over ranks, "
                "against (p - 1) / (v m); + idle: the step's idle time counted as a wait too (the last stage waits for the "
                "first stage's cool-down in the token table's gradient allreduce, idle time)%s\n", note);
    std::printf("# %-17s %10s %10s %10s %10s %16s\n", "schedule", "step(ms)", "measured", "+ idle", "formula",
                "measured/formula");
    for (const Case* c : {static_cast<const Case*>(&cases[kGpipe]), &none, static_cast<const Case*>(&cases[kInterleaved])}) {
      const double formula = (pp - 1.0) / (c->virtual_stages * microbatches);
      const double measured = c->mean_over_ranks([](const Fields& f) { return f[kCompute] > 0 ? f[kWait] / f[kCompute] : 0; });
      const double with_idle =
          c->mean_over_ranks([](const Fields& f) { return f[kCompute] > 0 ? (f[kWait] + f[kIdle]) / f[kCompute] : 0; });
      std::printf("  %-17s %10.2f %10.4f %10.4f %10.4f %16.3f\n", c->name.c_str(), c->step() * 1e3, measured, with_idle,
                  formula, measured / formula);
    }
}

int run(int argc, char** argv) {
  const std::optional<Settings> settings = parse_settings(argc, argv);
  if (!settings) return 0;
  const Settings& s = *settings;
  const int rank = world_rank(), world = world_size();
  const int pp = 2, tp = world / pp;
  if (world % pp != 0 || s.layers % 4 != 0 || s.microbatches % 2 != 0 || s.heads % tp != 0) {
    print_on_root("strata-bench-pipeline: needs an even number of ranks (tp = ranks / 2 dividing the %d heads), layers divisible "
        "by 4 and an even number of micro-batches; got %d ranks, %d layers, %d micro-batches\n",
        s.heads, world, s.layers, s.microbatches);
    return 2;
  }
  ModelConfig model = preset("tiny");
  model.name = "pipeline-bench", model.layers = s.layers, model.hidden = s.hidden, model.heads = s.heads;
  model.kv_heads = s.heads, model.vocab = s.vocab, model.max_seq = std::max(model.max_seq, s.seq);
  if (const std::string problem = model.validate(); !problem.empty()) {
    print_on_root("strata-bench-pipeline: model: %s\n", problem.c_str());
    return 2;
  }
  const cpu_gemm::Backend library = cpu_gemm::available(cpu_gemm::Backend::onednn) ? cpu_gemm::Backend::onednn
                                                                                    : cpu_gemm::Backend::openblas;
  cpu_gemm::set_threads(1);  // one core per rank, as strata-step's harness sets it
  coll::ProcessGroups groups({tp, pp, 1});
  const DataParallelShape shape = data_parallel_shape(groups);
  const int pp_rank = groups.pp_index();
  const auto data = synthetic_tokens(model.vocab, 1);
  TrainConfig base;
  base.model = model, base.micro_batch = s.micro_batch, base.seq = s.seq, base.accumulation = s.microbatches;
  base.runtime.library = library;
  base.lr.max_lr = base.lr.min_lr = 1e-3f;
  const bool one_core_per_rank = world == 2;
  const char* note = s.smoke ? " (smoke, not judged)" : one_core_per_rank ? "" : " (np != 2, not judged: more ranks than cores)";

  std::vector<Case> cases;
  auto add = [&](std::string name, Schedule schedule, int v, Recompute recompute) {
    Case c;
    c.name = std::move(name), c.schedule = schedule, c.virtual_stages = v, c.recompute = recompute;
    c.config = base;
    c.config.schedule = schedule, c.config.virtual_stages = v, c.config.recompute = recompute;
    cases.push_back(std::move(c));
  };
  add("1f1b none", Schedule::one_f_one_b, 1, Recompute::none);
  add("1f1b full", Schedule::one_f_one_b, 1, Recompute::full);
  add("1f1b overlap", Schedule::one_f_one_b, 1, Recompute::overlap);
  add("gpipe none", Schedule::gpipe, 1, Recompute::none);
  add("interleaved none", Schedule::interleaved, 2, Recompute::none);

  print_on_root("# strata-bench-pipeline: %d ranks as tp %d x pp %d; model %d layers, hidden %d, %d heads, vocabulary %d; micro-batch "
      "%d x seq %d, m = %d micro-batches; %s GEMMs, one thread per rank; %d rounds, the %zu cases interleaved (order "
      "rotating), medians; step: per-step max over ranks%s\n",
      world, tp, pp, s.layers, s.hidden, s.heads, s.vocab, s.micro_batch, s.seq, s.microbatches,
      cpu_gemm::name(library).c_str(), s.rounds, cases.size(), note);
  std::fflush(stdout);

  // Overlap's placement, from a measured step recomputing everything on demand; then each case's trainer, warmed up.
  const OverlapPlan overlap = place_overlap(cases[kOverlap].config, groups, *data, pp, tp, s.microbatches);
  for (Case& c : cases) {
    c.trainer = std::make_unique<Trainer>(c.config, groups, *data);
    c.activations = c.trainer->memory().activations;
    c.sent_formula = pipeline_sent_bytes(c.config, shape);
    c.trainer->step(++c.steps);  // warm-up: pages touched, the buffer pool grown
  }

  std::vector<int> pp_ranks(static_cast<std::size_t>(world));
  STRATA_MPI_CHECK(MPI_Gather(&pp_rank, 1, MPI_INT, pp_ranks.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  for (int r = 0; r < s.rounds; ++r)
    for (std::size_t k = 0; k < cases.size(); ++k) timed_step(cases[(k + static_cast<std::size_t>(r)) % cases.size()]);

  const int wrong = count_wrong(cases);
  const std::vector<StageFields> stages = stage_fields(cases, overlap, groups);
  if (rank == 0) {
    print_recompute_table(cases, stages, pp_ranks, pp, note);
    print_bubble_table(cases, pp, s.microbatches, note);
    std::printf("# checks: recompute modes on 1f1b none's losses, schedules within fp32 order, bytes to the other stage the "
                "formula: %s\n", wrong ? "FAILED (see above)" : "ok");
    std::printf("# pipeline figures: %s\n", s.smoke ? "smoke, not judged" : one_core_per_rank ? "reported (no target)"
                                                                                               : "np != 2, not judged");
    std::fflush(stdout);
  }
  return wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-bench-pipeline", [&] { return run(argc, argv); });
}
