// strata-step: a GPT model trained for real on a grid of tensor, pipeline and data parallelism, under data-parallel
// partitioning strategies (DP, ZeRO-1/2/3 and every runnable PaRO strategy, docs/strategies.md), pipeline schedules and
// recomputation modes (none, full, selective, and overlapped with communication as Lynx does), one case per
// strategy and mode on the same model, data and initialisation, so they can be compared side by side. Each step
// prints one line (loss, gradient norm, learning rate, time, tokens/s, MFU); each case records the step time over
// ranks, phases (forward, backward, recomputation on the critical path and hidden, optimizer, exposed communication
// per tier, pipeline waits, idle), one step's timeline, memory per category against the formula, and the bytes each
// rank sent per tier and to other stages against the formulas (train/step_formulas.h).
//
// MFU convention: model FLOPs 6 N + 6 L h s per token (llm.c's count, causal attention as half), over the step
// time (median over timed steps of the per-step maximum over ranks) and the measured FP32 peak of every rank.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>

#include "bench/harness/axes.h"
#include "bench/harness/harness.h"
#include "bench/harness/records.h"
#include "bench/cases/step_config.h"
#include "bench/harness/token_file.h"
#include "collectives/process_group.h"
#include "train/data.h"
#include "bench/cases/recompute_policy.h"
#include "train/memory.h"
#include "train/overlap.h"
#include "train/partition.h"
#include "train/step_formulas.h"
#include "train/trainer.h"
#ifdef STRATA_HAVE_CUDA
#include "kernels/gemm_cuda.h"
#include "train/trainer_cuda.h"
#endif

namespace {

using namespace strata;
using namespace strata::train;

// strata-step's own flags beside the step's (bench/cases/step_config.h).
struct Options : StepFlags {
  std::string data = "synthetic";
  double lr = 3e-4, min_lr = 3e-5, weight_decay = 0.1, max_grad_norm = 1.0;
  int lr_warmup = 0, lr_steps = 0;
  int64_t seed = 1;
  int threads = 1;
  std::string library = "auto";
  std::string backend = "cpu";
  double memory_limit_gib = 0;
  int timeline_steps = 1;
  std::string recompute_solver = "heuristic", recompute_policy;
  double recompute_time_limit = 10;
};

// Bytes a rank may hold: --memory-limit, else the node's available memory shared by its ranks. Collective.
double memory_limit(const Options& o) {
  const double available = host_memory_per_rank();
  return o.memory_limit_gib > 0 ? o.memory_limit_gib * double(1 << 30) : available;
}


// The harness's median; NaN for no steps.
double median(std::vector<double> v) { return v.empty() ? NAN : summarize(std::move(v)).median; }

double allreduce_sum(double value) {
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  return value;
}

// recompute is a part of backward: the forward work it does again first, on demand; recompute_window a compute
// phase of its own: recomputation run while waiting for a stage's output gradient (overlap), recompute_hidden the
// part of it done before that gradient arrived; comm_tp and pipeline_wait parts of comm_exposed: the
// tensor-parallel collectives, which block, and the waits for other stages; pipeline_hidden the time transfers
// between stages were in flight while the rank computed.
constexpr const char* kPhases[] = {"forward", "backward", "optimizer", "comm_exposed", "idle", "recompute", "comm_tp",
                                   "pipeline_wait", "recompute_window", "recompute_hidden", "pipeline_hidden"};
constexpr MemoryCategory kCategories[] = {MemoryCategory::parameters, MemoryCategory::gradients, MemoryCategory::optimizer,
                                          MemoryCategory::activations, MemoryCategory::workspace, MemoryCategory::comm_buffers};
double formula_of(const MemoryUse& m, MemoryCategory c) {
  switch (c) {
    case MemoryCategory::parameters: return m.params;
    case MemoryCategory::gradients: return m.grads;
    case MemoryCategory::optimizer: return m.optimizer;
    case MemoryCategory::activations: return m.activations;
    case MemoryCategory::workspace: return m.workspace;
    case MemoryCategory::comm_buffers: return m.comm_buffers;
  }
  return 0;
}

// One step of `config` with every recomputation on demand (overlap's baseline, full): what a partition and a
// placement are made from.
StepStats measured_step(TrainConfig config, coll::ProcessGroups& groups, const TokenSource& data) {
  if (config.recompute == Recompute::overlap) {
    config.recompute = Recompute::full;
    config.kept_ops.clear(), config.window_recomputes.clear();
  }
  Trainer trainer(config, groups, data);
  trainer.step(1);  // the first step touches every page and prepares the GEMM kernels: not representative
  return trainer.step(2);
}

// --partition balanced: a step on the even split measures every layer, the embeddings and the head; the split whose
// slowest stage is fastest, among those whose stages fit in `limit` bytes per rank (activations with the stage's
// micro-batches in flight and the model states of its units), runs.
std::vector<int> balanced_stages(const TrainConfig& config, coll::ProcessGroups& groups, const TokenSource& data,
                                 const DataParallelShape& shape, double limit) {
  TrainConfig c = config;
  const int stages = shape.pp * c.virtual_stages;
  c.stage_layers = even_partition(c.model.layers, stages);
  if (c.recompute == Recompute::overlap) c.recompute = Recompute::full, c.kept_ops.clear();
  const StepStats stats = measured_step(c, groups, data);
  const LayerCosts costs = layer_costs(stats, rank_stages(c, shape.pp, shape.pp_rank), c.model, MPI_COMM_WORLD);
  StageCost cost = costs.cost();
  // The micro-batches in flight of each stage do not depend on the split.
  std::vector<int> sets(static_cast<std::size_t>(stages), 1);
  for (int r = 0; r < shape.pp; ++r)
    for (const StagePlan& plan : rank_stages(c, shape.pp, r)) {
      int stage = 0;
      for (int l = 0; l < plan.first_layer; stage += (l += c.stage_layers[static_cast<std::size_t>(stage)], 1)) {}
      sets[static_cast<std::size_t>(stage)] = plan.activation_sets;
    }
  const ParameterLayout layout(c.model, tensor_shard(c.model, shape.tp, 0));
  cost.fits = [&, sets](int stage, int first, int end) {
    StagePlan plan{first, end - first, stage == 0, end == c.model.layers, sets[static_cast<std::size_t>(stage)], {}};
    const double layer_floats = static_cast<double>(layout.layer(0).size);
    const double psi = layer_floats * (end - first);
    const ModelStateMemory states = model_state_memory(c.strategy, psi, psi, shape.m, shape.n);
    return activation_bytes(c.model, c.micro_batch, c.seq, c.recompute, shape.tp, c.sequence_parallel && shape.tp > 1, plan) +
           states.total() <= limit;
  };
  return balanced_partition(c.model.layers, stages, cost);
}

// --recompute overlap: a step recomputing on demand measures every op and the waits for other stages; a placement
// from a policy file or a solver (agreed over the stage's tensor- and data-parallel ranks, which run collectives
// inside their recomputations) becomes the configuration. The whole pipeline's placement, as a policy file holds it, comes back
// on rank 0 for the run's record.
struct Placed {
  PlacementResult chosen;
  double heuristic_exposed_s = NAN, heuristic_search_s = NAN;  // beside the optimum, when the optimal solver ran
  std::string policy;                                         // JSON, on world rank 0
};

// The form of a policy file alone (JSON, its format and version, a placement array), for a run whose ops are not
// known before a measured step (--partition balanced).
void check_policy_form(const std::string& path) {
  nlohmann::json policy = read_policy_json(path);
  if (policy.is_object() && policy.contains("placement") && policy["placement"].is_array())
    policy["placement"] = nlohmann::json::array();
  (void)placement_from_json(PlacementProblem{}, policy, path);
}

// The entries of a policy file that belong to this rank's ops. `claimed` gets one flag per entry of the file (1:
// an op of this rank) and `names` each entry's op, so the caller can name the entries no rank of the pipeline claims.
Placement policy_for_rank(const std::string& path, const PlacementProblem& problem, std::vector<int>& claimed,
                          std::vector<std::string>& names) {
  nlohmann::json policy = read_policy_json(path);
  if (policy.is_object() && policy.contains("placement") && policy["placement"].is_array()) {
    std::set<std::string> mine;
    for (const RecomputableOp& op : problem.ops) mine.insert(op.name);
    nlohmann::json kept = nlohmann::json::array();
    for (const nlohmann::json& entry : policy["placement"]) {
      const bool named = entry.is_object() && entry.contains("op") && entry["op"].is_string();
      const bool ours = !named || mine.count(entry["op"].get<std::string>());  // malformed: refused below, here
      if (ours) kept.push_back(entry);
      claimed.push_back(ours ? 1 : 0);
      names.push_back(named ? entry["op"].get<std::string>() : "?");
    }
    policy["placement"] = kept;
  }
  Placement placement = placement_from_json(problem, policy, path);
  // A window's measured length varies from run to run: a policy that overfills one runs, with the excess on the
  // critical path. Its structure (windows before the backward, producers first) and memory must hold.
  PlacementProblem unbounded = problem;
  for (RecomputeWindow& w : unbounded.windows) w.capacity_s = 1e30;
  if (const auto violation = find_violation(unbounded, placement))
    throw UsageError("recompute policy " + path + " does not fit this run: " + *violation);
  return placement;
}

// A check some ranks may fail alone (each reads its own part of a file): every rank throws the message of the
// lowest failing rank, so the job ends together with exit 2 instead of leaving the others waiting.
template <typename Body>
void on_every_rank(const Body& body) {
  std::string message;
  try {
    body();
  } catch (const std::invalid_argument& e) {
    message = e.what();
  }
  int rank = 0, size = 1;
  STRATA_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  STRATA_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  int first = message.empty() ? size : rank;
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (first == size) return;
  int length = static_cast<int>(message.size());
  STRATA_MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT, first, MPI_COMM_WORLD));
  message.resize(static_cast<std::size_t>(length));
  STRATA_MPI_CHECK(MPI_Bcast(message.data(), length, MPI_CHAR, first, MPI_COMM_WORLD));
  throw UsageError(message);
}

// A policy file's placement of this rank's ops, checked on every rank. Collective over the world.
Placement read_policy(const std::string& path, const PlacementProblem& problem) {
  Placement placement;
  std::vector<int> claimed;
  std::vector<std::string> names;
  on_every_rank([&] { placement = policy_for_rank(path, problem, claimed, names); });
  // Each op is on one pipeline rank: an entry no rank claims names no op of this run. Every rank read the same
  // file, so the flags line up entry by entry.
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, claimed.data(), static_cast<int>(claimed.size()), MPI_INT, MPI_MAX,
                                 MPI_COMM_WORLD));
  std::string unknown;
  int count = 0;
  for (size_t i = 0; i < claimed.size(); ++i)
    if (!claimed[i] && ++count <= 5) unknown += (unknown.empty() ? "'" : ", '") + names[i] + "'";
  if (count > 0)
    throw UsageError("recompute policy " + path + ": " + std::to_string(count) + " entr" + (count == 1 ? "y names" : "ies name") +
                     " no op of this run: unknown op " + unknown + (count > 5 ? ", ..." : ""));
  return placement;
}

// The shape of a measured profile with every time zero: a policy's ops, windows and structure do not depend on the
// measurement (only the windows' lengths do, which a policy may overfill), so a file is checked against this before
// anything is written.
StepProfile unmeasured_profile(const TrainConfig& c, int pp, int pp_rank) {
  StepProfile profile;
  profile.receive_waits.assign(pipeline_actions(c.schedule, {pp, c.accumulation, c.virtual_stages}, pp_rank).size(), 0.0);
  for (const StagePlan& plan : rank_stages(c, pp, pp_rank))
    profile.forward_op_seconds.emplace_back(static_cast<std::size_t>(plan.layers), std::array<double, kLayerOps>{});
  return profile;
}

Placed place_recomputation(TrainConfig& c, coll::ProcessGroups& groups, const TokenSource& data, const Options& o,
                           const DataParallelShape& shape, double activation_limit) {
  const StepProfile profile = profile_of(measured_step(c, groups, data), c.accumulation);
  const OverlapProblem problem = overlap_problem(c, shape.pp, shape.pp_rank, shape.tp, c.sequence_parallel && shape.tp > 1,
                                                 profile, activation_limit);
  Placed placed;
  PlacementOptions options;
  options.time_limit_s = o.recompute_time_limit;
  Placement placement;
  if (!o.recompute_policy.empty()) {
    placement = read_policy(o.recompute_policy, problem.problem);
    placed.chosen = summarise(problem.problem, placement, 0, false);
  } else if (o.recompute_solver == "heuristic") {
    placed.chosen = solve_heuristic(problem.problem, options);
  } else {
    const PlacementResult heuristic = solve_heuristic(problem.problem, options);
    placed.heuristic_exposed_s = heuristic.exposed_s, placed.heuristic_search_s = heuristic.search_s;
    placed.chosen = solve_optimal(problem.problem, options);
  }
  placement = agree(groups, placed.chosen.placement);
  apply_placement(problem, placement, shape.pp, shape.pp_rank, c);
  // The pipeline's policy: each stage's entries from its first tensor- and data-parallel rank, to world rank 0.
  const bool speaks = groups.tp_index() == 0 && groups.dp_index() == 0;
  const std::string mine = speaks ? placement_to_json(problem.problem, placement)["placement"].dump() : "";
  const std::vector<std::string> parts = gather_strings(MPI_COMM_WORLD, mine);
  nlohmann::json entries = nlohmann::json::array();
  for (const std::string& part : parts)
    if (!part.empty())
      for (const nlohmann::json& entry : nlohmann::json::parse(part)) entries.push_back(entry);
  placed.policy = nlohmann::json{{"format", "strata-recompute-policy"}, {"version", 1}, {"placement", entries}}.dump();
  return placed;
}

// The cases: the product of the strategies (slowest) and the recomputation modes. The run's model, batch,
// grid and options are axes of one value, so every `cases` column is declared once and filled from the point.
struct StepRun {
  const Options& o;
  const ModelConfig& model;
  const TrainConfig& config;
  const DataParallelShape& shape;
  int64_t global_rows;
  double psi, psi_trainable;
};
Axes step_axes(const std::vector<Strategy>& plan, const std::vector<Recompute>& modes, const StepRun& r) {
  std::vector<std::string> strategy_names, mode_names;
  for (const Strategy& s : plan) strategy_names.push_back(s.name());
  for (Recompute mode : modes) mode_names.emplace_back(name(mode));
  auto one = [](int64_t value) { return std::vector<int64_t>{value}; };
  auto text = [](std::string value) { return std::vector<std::string>{std::move(value)}; };
  Axes axes;
  axes.add("strategy", strategy_names, "P.G.OS: N whole, I sharded in a group, G sharded over all")
      .add("model", text(r.model.name)).add("layers", one(r.model.layers)).add("hidden", one(r.model.hidden))
      .add("heads", one(r.model.heads)).add("kv_heads", one(r.model.kv_heads)).add("vocab", one(r.model.vocab))
      .add("seq", one(r.o.seq)).add("micro_batch", one(r.config.micro_batch), "1", "rows per rank")
      .add("accumulation", one(r.o.accumulation)).add("global_batch", one(r.global_rows), "1", "rows per step")
      .add("dp", one(r.shape.n)).add("tp", one(r.shape.tp), "1", "tensor-parallel degree")
      .add("pp", one(r.shape.pp), "1", "pipeline stages (ranks)")
      .add("schedule", text(name(r.config.schedule)), "pipeline schedule: gpipe, 1f1b, interleaved")
      .add("virtual_stages", one(r.config.virtual_stages), "1", "model chunks per pipeline rank (interleaved)")
      .add("partition", text(r.o.stage_layers.empty() ? r.o.partition : "given"),
           "stage split: uniform, balanced (measured costs), given (--stage-layers)")
      .add("sp", one(r.o.sp ? 1 : 0), "1", "sequence parallelism (1: on)")
      .add("group_size", one(r.shape.m), "1", "m: data-parallel ranks per group")
      .add("groups", one(r.shape.g), "1", "g: groups (nodes)")
      .add("parameters", std::vector<double>{r.psi}, "1", "Ψ")
      .add("trainable_parameters", std::vector<double>{r.psi_trainable}, "1", "Ψ'")
      .add("trainable", text(r.o.trainable)).add("comm_algo", text(r.o.comm_algo))
      .add("overlap", one(r.config.overlap ? 1 : 0)).add("data", text(r.o.data))
      .add("recompute", mode_names, "what backward computes again: none, full (each layer), selective (the attention core), "
           "overlap (a placement's ops, in the waits for other stages or on demand)");
  return axes;
}

int run_step(int argc, char** argv) {
  HarnessOptions h;
  h.warmup = 1, h.iters = 5;
  Options o;
  Cli cli("strata-step", "A GPT model trained for real under data-parallel strategies (DP, ZeRO, PaRO), one case per "
                         "strategy. MFU: 6N + 6Lhs model FLOPs per token over the measured FP32 peak.");
  add_model_flags(cli, o);
  add_batch_flags(cli, o);
  cli.option("data", 0, "synthetic (uniform tokens), repeat (a learnable task), or an llm.c token file", o.data);
  cli.option("lr", 0, "peak learning rate", o.lr, 0.0);
  cli.option("min-lr", 0, "learning rate at the end of the cosine decay", o.min_lr, 0.0);
  cli.option("lr-warmup", 0, "warm-up steps of the learning rate", o.lr_warmup, 0);
  cli.option("lr-steps", 0, "steps of the cosine decay (0: warmup + iters)", o.lr_steps, 0);
  cli.option("weight-decay", 0, "AdamW weight decay", o.weight_decay, 0.0);
  cli.option("max-grad-norm", 0, "clip gradients to this global norm (0: no clipping)", o.max_grad_norm, 0.0);
  cli.option("seed", 0, "seed of the initialisation and the synthetic data", o.seed, 0);
  cli.option("threads", 'T', "kernel threads per rank", o.threads, 1);
  cli.choice("library", 0, "CPU GEMM library (auto: the faster one measured on this machine)", o.library,
             {"auto", "openblas", "onednn"});
  cli.choice("backend", 0, "where the step runs", o.backend, {"cpu", "cuda"});
  cli.option("memory-limit", 0, "GiB a rank may hold (0: the node's available memory over its ranks)", o.memory_limit_gib, 0.0);
  cli.option("timeline-steps", 0, "timed steps whose timeline is recorded", o.timeline_steps, 0);
  add_grid_flags(cli, o);
  cli.choice("partition", 0, "stage split: uniform, or balanced (layers moved so the slowest stage, recomputation "
             "included, is fastest, from a measured step)", o.partition, {"uniform", "balanced"});
  cli.option("recompute", 0, "what backward computes again instead of keeping: none, full (each layer from its input), "
             "selective (the attention core), overlap (placed in the waits for other stages, Lynx), comma-separated, or "
             "all; one case per strategy and mode", o.recompute);
  cli.choice("recompute-solver", 0, "overlap's placement: heuristic (one block's pattern for every identical block) or "
             "optimal (a mixed-integer program in GLPK; the heuristic's gap to it is reported)", o.recompute_solver,
             {"heuristic", "optimal"});
  cli.option("recompute-policy", 0, "overlap's placement from a JSON file (as stored with a run) instead of a solver",
             o.recompute_policy);
  cli.option("recompute-time-limit", 0, "seconds the optimal solver may search", o.recompute_time_limit, 0.001);
  add_harness_options(cli, h);
  cli.alias("steps", "iters");
  cli.alias("microbatches", "accumulation");
  if (!cli.parse(argc, argv)) return 0;
  o.micro_batch_given = cli.given("micro-batch"), o.accumulation_given = cli.given("accumulation");
  if (o.data != "synthetic" && o.data != "repeat") h.inputs.push_back({"--data", o.data, ""});
  h.inputs.push_back({"--recompute-policy", o.recompute_policy, ""});
  check_output_is_no_input(h);
  const bool on_gpu = o.backend == "cuda";
#ifndef STRATA_HAVE_CUDA
  if (on_gpu)
    throw UsageError("--backend cuda: this build has no GPU step (built without CUDA: STRATA_CUDA=OFF, or no nvcc, "
                     "cuBLASLt or NCCL found)");
#endif
  if (o.threads > 1 && h.blas_threads > 1)
    throw UsageError("--threads and --blas-threads both above 1 would oversubscribe the cores");
  if (o.min_lr > o.lr) {
    char text[96];
    std::snprintf(text, sizeof text, "--min-lr %g is above --lr %g", o.min_lr, o.lr);
    throw UsageError(std::string(text) + ": the cosine decay ends at or below the peak learning rate");
  }
  if (o.timeline_steps > h.iters)
    throw UsageError("--timeline-steps " + std::to_string(o.timeline_steps) + " exceeds the " + std::to_string(h.iters) +
                     " timed steps (--iters)");
  h.kernel_threads = o.threads;

  const int world = world_size();
  StepPlan step_plan = plan_step(o, world);
  const ModelConfig& model = step_plan.model;
  const std::vector<Strategy>& plan = step_plan.strategies;
  const std::vector<Recompute>& modes = step_plan.modes;
  const Trainable& trainable = step_plan.trainable;
  const coll::GridShape grid = step_plan.grid;
  const int dp_ranks = grid.dp;
  TrainConfig config = step_plan.config;
  config.adamw.weight_decay = static_cast<float>(o.weight_decay);
  config.lr = {static_cast<float>(o.lr), static_cast<float>(o.min_lr), o.lr_warmup,
               o.lr_steps > 0 ? o.lr_steps : static_cast<int64_t>(h.warmup + h.iters)};
  config.max_grad_norm = static_cast<float>(o.max_grad_norm);
  config.seed = static_cast<uint64_t>(o.seed);
  config.runtime.threads = o.threads;

  const int64_t global_rows = static_cast<int64_t>(dp_ranks) * o.accumulation * config.micro_batch;
  std::unique_ptr<TokenSource> data;
  try {
    if (o.data == "synthetic") data = synthetic_tokens(model.vocab, config.seed);
    else if (o.data == "repeat") data = repeated_sequences(model.vocab, 16, o.seq, config.seed);
    else data = token_stream(read_token_file(o.data), model.vocab, global_rows, o.seq);
  } catch (const std::invalid_argument& e) {
    throw UsageError("--data " + o.data + ": " + e.what());
  }

  coll::ProcessGroups groups(grid, o.group_size, o.grid_order);
#ifdef STRATA_HAVE_CUDA
  // Before anything is written: a node short of GPUs is refused here.
  std::unique_ptr<coll::NcclProcessGroups> nccl;
  if (on_gpu) nccl = std::make_unique<coll::NcclProcessGroups>(groups);
#endif
  const DataParallelShape shape = data_parallel_shape(groups);
  const double psi = static_cast<double>(model.parameters());
  double psi_trainable = 0;
  {
    const std::vector<Slice> units = ParameterLayout(model).units();
    const std::vector<bool> trains = trainable_units(model, trainable);
    for (std::size_t u = 0; u < units.size(); ++u)
      if (trains[u]) psi_trainable += static_cast<double>(units[u].size);
  }
  const Axes axes = step_axes(plan, modes, {o, model, config, shape, global_rows, psi, psi_trainable});
  const std::vector<AxisPoint> points = axes.product();
  auto strategy_of = [](const AxisPoint& point) { return parse_strategy(point.text("strategy")); };
  auto mode_of = [](const AxisPoint& point) { return *parse_recompute(point.text("recompute")); };
#ifdef STRATA_HAVE_CUDA
  if (on_gpu)
    for (const AxisPoint& point : points) {
      TrainConfig c = config;
      c.strategy = strategy_of(point), c.recompute = mode_of(point);
      if (const std::string why = gpu_step_refusal(c, grid); !why.empty()) throw UsageError("--backend cuda: " + why);
    }
#endif
  // Before anything large is allocated: every strategy must fit (host memory; on GPUs the device refuses).
  const double rank_limit = memory_limit(o);
  if (!on_gpu) {
    const double limit = rank_limit;
    double worst = 0;
    std::string worst_name, parts;
    for (const AxisPoint& point : points) {
      TrainConfig c = config;
      c.strategy = strategy_of(point), c.recompute = mode_of(point);
      if (o.partition == "balanced") c.stage_layers = even_partition(model.layers, grid.pp * o.virtual_stages);
      if (c.recompute == Recompute::overlap) recompute_everything(c, grid.pp);
      const MemoryUse e = memory_estimate(c, shape);
      const double total = e.params + e.grads + e.optimizer + e.activations + e.workspace + e.comm_buffers;
      if (total > worst) {
        worst = total, worst_name = c.strategy.name() + (c.recompute == Recompute::none
                                                             ? "" : std::string(" with ") + name(c.recompute) + " recomputation");
        parts = "parameters " + format_gib(e.params) + ", gradients " + format_gib(e.grads) + ", optimizer " + format_gib(e.optimizer) +
                ", activations " + format_gib(e.activations + e.workspace) + ", communication buffers " + format_gib(e.comm_buffers);
      }
    }
    const double over = allreduce_max(MPI_COMM_WORLD, worst > limit ? 1.0 : 0.0);
    if (over > 0)
      throw UsageError("strategy " + worst_name + " needs about " + format_gib(worst) + " per rank (" + parts + "), above the limit of " +
                       (std::isfinite(limit) ? format_gib(limit) : std::string("?")) +
                       (o.memory_limit_gib > 0 ? " (--memory-limit)" : " (available memory over the node's ranks)") +
                       ": use a smaller model, micro-batch or sequence, or a sharded strategy");
  }
  config.runtime.library = o.library == "onednn" ? cpu_gemm::Backend::onednn : cpu_gemm::Backend::openblas;
  // A policy file is refused before the results file is touched: against every overlapped case's ops and windows,
  // or, where the stages come from a measured step (--partition balanced), its form alone.
  if (!o.recompute_policy.empty()) {
    if (std::find(modes.begin(), modes.end(), Recompute::overlap) == modes.end())
      throw UsageError("--recompute-policy places overlapped recomputation: give --recompute overlap");
    if (o.partition == "balanced") on_every_rank([&] { check_policy_form(o.recompute_policy); });
    for (const AxisPoint& point : points) {
      if (o.partition == "balanced" || mode_of(point) != Recompute::overlap) continue;
      TrainConfig c = config;
      c.strategy = strategy_of(point);
      recompute_everything(c, grid.pp);
      const MemoryUse e = memory_estimate(c, shape);
      const double allowance = o.memory_limit_gib > 0 ? rank_limit - (e.params + e.grads + e.optimizer + e.workspace + e.comm_buffers) : 0;
      const OverlapProblem problem = overlap_problem(c, shape.pp, shape.pp_rank, shape.tp, c.sequence_parallel && shape.tp > 1,
                                                     unmeasured_profile(c, shape.pp, shape.pp_rank), allowance);
      (void)read_policy(o.recompute_policy, problem.problem);
    }
  }

  Run run("strata-step", argc, argv, h, cli.resolved_json(), on_gpu ? "cuda" : "cpu");
  if (o.library == "auto") config.runtime.library = run.context().machine.description.default_gemm;
  StepRecorder recorder(run);
  run.set_case_count(static_cast<int>(points.size()));
  const double tokens_per_step = static_cast<double>(global_rows) * o.seq;
  const double flop_per_rank = model_flops_per_token(model, o.seq) * tokens_per_step / world;
  const PeakFigure& fp32 = run.context().machine.description.fp32;
  double peak = fp32.per_rank(o.threads);
  std::string peak_text = peak_source(fp32, o.threads);
#ifdef STRATA_HAVE_CUDA
  if (on_gpu) {  // bf16 compute: the tensor cores' dense bf16 peak, as strata-gemm holds its figures to
    const gemm::GpuPeak gpu = gemm::gpu_peak(nccl->device(), gemm::DType::bf16);
    peak = gpu.flops, peak_text = "bf16 " + gpu.source;
  }
#endif
  const bool counts_bytes = config.comm_algo != coll::Algo::library;

  axes.declare_columns(run.cases());
  run.cases()
      .add_column("flop", ColumnKind::float64, "FLOP", "model FLOPs per rank per step: (6N + 6Lhs) x tokens / ranks")
      .add_column("flop_recompute", ColumnKind::float64, "FLOP",
                  "recomputed FLOPs per rank per step: full (2 N_layers + 2Lhs), selective (2Lhs), overlap (the ops it does "
                  "not keep) per token x tokens / ranks")
      .add_column("stage_layers", ColumnKind::string, "1", "layers of each pipeline stage, in stage order")
      .add_column("recompute_policy", ColumnKind::string, "",
                  "overlap: the placement of every op (strata-recompute-policy JSON, --recompute-policy reads it)");
  Table& summary = run.summary();
  add_flop_rate_columns(summary, "flop");
  summary.add_column("tokens_per_s", ColumnKind::float64, "1/s", "tokens of the global batch over the median step (max over ranks)")
      .add_column("mfu", ColumnKind::float64, "1", "model FLOPs (6N + 6Lhs per token) / (median step x peak x ranks)")
      .add_column("hfu", ColumnKind::float64, "1", "hardware FLOPs (model + recomputed) / (median step x peak x ranks)")
      .add_column("loss_first", ColumnKind::float64, "1", "loss of step 1").add_column("loss_last", ColumnKind::float64, "1");
  for (const char* phase : kPhases)
    summary.add_column(std::string("phase_") + phase, ColumnKind::float64, "s", "median over timed steps, mean over ranks");
  for (int t = 0; t < kCommTiers; ++t) {
    const std::string tier = name(static_cast<CommTier>(t));
    summary.add_column("comm_" + tier + "_busy", ColumnKind::float64, "s", "collectives in flight, median step, mean over ranks")
        .add_column("comm_" + tier + "_exposed", ColumnKind::float64, "s", "waited for, median step, mean over ranks");
  }
  for (MemoryCategory c : kCategories) {
    const std::string n(name(c));
    summary.add_column("memory_" + n, ColumnKind::float64, "B", "high-water mark, max over ranks")
        .add_column("memory_" + n + "_formula", ColumnKind::float64, "B",
                    c == MemoryCategory::comm_buffers ? "bound (train/step_formulas.h), max over ranks" : "formula, max over ranks")
        .add_column("memory_" + n + "_ratio", ColumnKind::float64, "1",
                    std::string("memory_") + n + " / memory_" + n + "_formula; NaN where the formula is 0");
  }
  summary.add_column("bubble_fraction", ColumnKind::float64, "1",
                     "pipeline wait / (forward + backward + recompute in windows) per rank, median step, mean over ranks")
      .add_column("bubble_fraction_formula", ColumnKind::float64, "1", "(p - 1) / (v m): uniform stages, free transfers")
      .add_column("sent_pipeline", ColumnKind::float64, "B", "to other stages per step, mean over ranks")
      .add_column("sent_pipeline_formula", ColumnKind::float64, "B", "(R, C) floats per micro-batch and direction, mean over ranks")
      .add_column("recompute_exposed", ColumnKind::float64, "s",
                  "recomputation on the critical path: on demand + in windows after the gradient came; median step, mean over ranks")
      .add_column("placement_exposed", ColumnKind::float64, "s", "overlap: on-demand recomputation the placement plans, pipeline rank 0")
      .add_column("placement_search", ColumnKind::float64, "s", "overlap: the solver's search time, pipeline rank 0")
      .add_column("heuristic_gap", ColumnKind::float64, "1",
                  "overlap, optimal solver: the heuristic's planned on-demand time / the optimum's - 1; NaN otherwise");
  summary.add_column("sent_intra", ColumnKind::float64, "B", "per step, mean over ranks; NaN: the library algorithm counts none")
      .add_column("sent_inter", ColumnKind::float64, "B", "per step, mean over ranks; NaN: the library algorithm counts none")
      .add_column("sent_intra_formula", ColumnKind::float64, "B", "ring volumes per step, mean over ranks")
      .add_column("sent_inter_formula", ColumnKind::float64, "B", "ring volumes per step, mean over ranks");

  if (run.is_root()) {
    std::printf("# strata-step: %s (%s parameters, %s trainable), %d rank(s): tp %d x dp %d as %d group(s) of %d, micro-batch %d x seq %d, "
                "%d micro-batch(es), global batch %lld rows (%s tokens); comm %s, overlap %s\n",
                model.name.c_str(), format_si(psi).c_str(), format_si(psi_trainable).c_str(), world, shape.tp, shape.n, shape.g, shape.m,
                config.micro_batch, o.seq, o.accumulation, static_cast<long long>(global_rows),
                format_si(tokens_per_step).c_str(), o.comm_algo.c_str(), o.overlap.c_str());
    std::printf("# MFU: 6N + 6Lhs model FLOPs per token over %s per rank (%s)\n", format_si(peak).c_str(),
                peak_text.c_str());
    std::fflush(stdout);
  }

  double reference_loss = NAN;  // step 1 of the first strategy: every strategy starts from the same state
  std::map<std::string, double> kept_last_loss;  // per strategy, the last loss without recomputation
  const int rank = run.context().self.rank;
  HostTimer timer;
  for (const AxisPoint& point : points) {
    const Strategy strategy = strategy_of(point);
    const Recompute mode = mode_of(point);
    TrainConfig c = config;
    c.strategy = strategy, c.recompute = mode;
    const std::string label = strategy.name() + (mode == Recompute::none ? "" : std::string(" recompute ") + name(mode));
    run.begin_case("strategy " + label);
    if (o.partition == "balanced") run.progress("the stage balancing of strategy " + label);
    if (o.partition == "balanced") c.stage_layers = balanced_stages(c, groups, *data, shape, rank_limit);
    Placed placed;
    if (mode == Recompute::overlap) {
      recompute_everything(c, grid.pp);
      const MemoryUse e = memory_estimate(c, shape);
      const double allowance = o.memory_limit_gib > 0 ? rank_limit - (e.params + e.grads + e.optimizer + e.workspace + e.comm_buffers) : 0;
      run.progress("the recomputation placement of strategy " + label);
      placed = place_recomputation(c, groups, *data, o, shape, allowance);
    }
    const std::string stage_layers = [&] {
      std::string text;
      for (int layers : stage_partition(model, grid.pp * o.virtual_stages, c.stage_layers))
        text += (text.empty() ? "" : ",") + std::to_string(layers);
      return text;
    }();
    // Overlap's kept ops differ per stage; each rank knows its own: the recomputed FLOPs are summed over the stages.
    const double recompute_flop_per_rank = [&] {
      if (mode != Recompute::overlap) return recompute_flops_per_token(model, o.seq, mode) * tokens_per_step / world;
      std::vector<std::vector<KeptOps>> mine;
      for (const StagePlan& plan : rank_stages(c, grid.pp, shape.pp_rank)) mine.push_back(plan.kept);
      const bool speaks = groups.tp_index() == 0 && groups.dp_index() == 0;
      return allreduce_sum(speaks ? recompute_flops_per_token(model, o.seq, mode, mine) : 0.0) * tokens_per_step / world;
    }();
    if (run.is_root() && mode == Recompute::overlap) {
      const PlacementResult& r = placed.chosen;
      std::printf("# %s placement (pipeline rank 0; %s): %.2f ms of recomputation in windows, %.2f ms on demand, "
                  "search %.3f s%s\n", label.c_str(),
                  !o.recompute_policy.empty() ? ("policy " + o.recompute_policy).c_str() : o.recompute_solver.c_str(),
                  r.hidden_s * 1e3, r.exposed_s * 1e3, r.search_s,
                  std::isnan(placed.heuristic_exposed_s)
                      ? ""
                      : (" | heuristic " + format_fixed(placed.heuristic_exposed_s * 1e3, 2) + " ms on demand in " +
                         format_fixed(placed.heuristic_search_s, 3) + " s, gap to the optimum " +
                         format_fixed(100 * (r.exposed_s > 0 ? placed.heuristic_exposed_s / r.exposed_s - 1 : 0), 1) + "%" +
                         (r.proven_optimal ? "" : " (optimum not proven)")).c_str());
      std::fflush(stdout);
    }
    MemoryFigures peak_memory;
    std::vector<double> samples;
    std::vector<StepStats> timed;
    double first_loss = NAN, last_loss = NAN;
    {
      on_gpu ? reset_device_memory_peaks() : reset_memory_peaks();
      // The CPU trainer, or on GPUs the data-parallel GPU trainer (which records no timeline).
      std::unique_ptr<Trainer> cpu_trainer;
      std::function<StepStats(int64_t, bool)> train_step;
#ifdef STRATA_HAVE_CUDA
      std::unique_ptr<GpuDataParallelTrainer> gpu_trainer;
      if (on_gpu) {
        gpu_trainer = std::make_unique<GpuDataParallelTrainer>(c, groups, *nccl, *data);
        train_step = [&](int64_t step, bool) { return gpu_trainer->step(step); };
      }
#endif
      if (!on_gpu) {
        cpu_trainer = std::make_unique<Trainer>(c, groups, *data);
        train_step = [&](int64_t step, bool timeline) { return cpu_trainer->step(step, timeline); };
      }
      double spent = 0;
      for (int k = 0; k < h.warmup + h.iters; ++k) {
        const bool timing = k >= h.warmup;
        const int iteration = k - h.warmup;
        run.progress("step " + std::to_string(k + 1) + "/" + std::to_string(h.warmup + h.iters) + " of strategy " + label);
        STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        timer.start();
        StepStats stats = train_step(k + 1, timing && iteration < o.timeline_steps);
        const double elapsed = timer.stop();
        const double slowest = allreduce_max(MPI_COMM_WORLD, elapsed);
        if (k == 0) first_loss = stats.loss;
        last_loss = stats.loss;
        if (run.is_root()) {
          const double tok_s = tokens_per_step / slowest;
          std::printf("%s step %4d/%d | loss %.4f | norm %.4f | lr %.2e | %9.2f ms | %9.0f tok/s | MFU %s%s\n",
                      label.c_str(), k + 1, h.warmup + h.iters, stats.loss, stats.grad_norm, stats.lr, slowest * 1e3,
                      tok_s, format_peak_percent(peak > 0 ? flop_per_rank / (slowest * peak) : 0, 2, true).c_str(),
                      timing ? "" : " (warm-up)");
          std::fflush(stdout);
        }
        if (!timing) continue;
        samples.push_back(elapsed);
        recorder.begin_iteration(iteration);
        recorder.add_phase("forward", stats.forward_seconds);
        recorder.add_phase("backward", stats.backward_seconds);
        recorder.add_phase("optimizer", stats.optimizer_seconds);
        recorder.add_phase("comm_exposed", stats.exposed_comm_seconds);
        recorder.add_phase("idle", stats.idle_seconds);
        recorder.add_phase("recompute", stats.recompute_seconds);
        recorder.add_phase("comm_tp", stats.tp_comm_seconds);
        recorder.add_phase("pipeline_wait", stats.pipeline.wait_seconds);
        recorder.add_phase("pipeline_hidden", stats.pipeline.hidden_seconds());
        recorder.add_phase("recompute_window", stats.recompute_window_seconds);
        recorder.add_phase("recompute_hidden", stats.recompute_hidden_seconds);
        recorder.add_metric("pipeline_rank", shape.pp_rank);
        recorder.add_metric("sent_pipeline", stats.pipeline.sent_bytes, "B");
        recorder.add_metric("sent_tp_buffers", stats.tp_comm_bytes, "B");
        for (int t = 0; t < kCommTiers; ++t) {
          const std::string tier = name(static_cast<CommTier>(t));
          recorder.add_phase("comm_" + tier + "_exposed", stats.comm[static_cast<std::size_t>(t)].exposed_seconds);
          recorder.add_phase("comm_" + tier + "_hidden", stats.comm[static_cast<std::size_t>(t)].hidden_seconds());
        }
        recorder.add_metric("loss", stats.loss);
        recorder.add_metric("grad_norm", stats.grad_norm);
        recorder.add_metric("lr", stats.lr);
        recorder.add_metric("sent_intra", stats.traffic.intra_bytes, "B");
        recorder.add_metric("sent_inter", stats.traffic.inter_bytes, "B");
        for (const TimelineEvent& e : stats.timeline) recorder.add_event(e.operation, e.stream, e.start, e.end, static_cast<int64_t>(e.bytes), e.group);
        timed.push_back(std::move(stats));
        spent += elapsed;
        if (h.max_time > 0 && iteration + 1 < h.iters && allreduce_max(MPI_COMM_WORLD, spent) >= h.max_time) break;
      }
      peak_memory = on_gpu ? device_memory_peak() : memory_peak();
    }
    for (MemoryCategory cat : kCategories) recorder.note_memory(std::string(name(cat)), static_cast<int64_t>(peak_memory[cat]));

    // The check: step 1 runs on the same parameters and tokens under every strategy, so its loss differs only
    // by the order of fp32 sums (relative 1e-6; 1e-5 allowed); a wrong gather or a missing shard moves it more.
    if (std::isnan(reference_loss)) reference_loss = first_loss;
    bool wrong = !std::isfinite(first_loss) || std::abs(first_loss - reference_loss) > 1e-5 * std::abs(reference_loss);
    // Recomputation computes the same activations again (no dropout), so a strategy trains along the same
    // losses in every mode; only a recomputation that differs from the kept activations moves them.
    bool trajectory_differs = false;
    if (mode == Recompute::none) kept_last_loss[strategy.name()] = last_loss;
    else if (auto kept = kept_last_loss.find(strategy.name()); kept != kept_last_loss.end())
      trajectory_differs = !(std::abs(last_loss - kept->second) <= 1e-6 * std::abs(kept->second));
    wrong = wrong || trajectory_differs;
    auto per_step = [&](auto field) {
      std::vector<double> v;
      for (const StepStats& s : timed) v.push_back(field(s));
      return allreduce_sum(median(v)) / world;
    };
    std::vector<double> phase_medians = {
        per_step([](const StepStats& s) { return s.forward_seconds; }), per_step([](const StepStats& s) { return s.backward_seconds; }),
        per_step([](const StepStats& s) { return s.optimizer_seconds; }),
        per_step([](const StepStats& s) { return s.exposed_comm_seconds; }), per_step([](const StepStats& s) { return s.idle_seconds; }),
        per_step([](const StepStats& s) { return s.recompute_seconds; }),
        per_step([](const StepStats& s) { return s.tp_comm_seconds; }),
        per_step([](const StepStats& s) { return s.pipeline.wait_seconds; }),
        per_step([](const StepStats& s) { return s.recompute_window_seconds; }),
        per_step([](const StepStats& s) { return s.recompute_hidden_seconds; }),
        per_step([](const StepStats& s) { return s.pipeline.hidden_seconds(); })};
    // Each rank's pipeline idle time against its compute in the pipelined passes (the ideal time of
    // docs/metrics.md's bubble), mean over ranks.
    const double bubble = per_step([](const StepStats& s) {
      const double compute = s.forward_seconds + s.backward_seconds + s.recompute_window_seconds;
      return compute > 0 ? s.pipeline.wait_seconds / compute : 0.0;
    });
    const double bubble_formula = grid.pp > 1 ? (grid.pp - 1.0) / (o.virtual_stages * o.accumulation) : 0.0;
    const double sent_pipeline = per_step([](const StepStats& s) { return s.pipeline.sent_bytes; });
    const double sent_pipeline_formula = allreduce_sum(pipeline_sent_bytes(c, shape)) / world;
    std::vector<double> busy, exposed;
    for (std::size_t t = 0; t < kCommTiers; ++t) {
      busy.push_back(per_step([t](const StepStats& s) { return s.comm[t].busy_seconds; }));
      exposed.push_back(per_step([t](const StepStats& s) { return s.comm[t].exposed_seconds; }));
    }
    const double sent_intra = per_step([](const StepStats& s) { return s.traffic.intra_bytes; });
    const double sent_inter = per_step([](const StepStats& s) { return s.traffic.inter_bytes; });
    const coll::Traffic formula_traffic = expected_traffic(c, shape);
    const double formula_intra = allreduce_sum(formula_traffic.intra_bytes) / world;
    const double formula_inter = allreduce_sum(formula_traffic.inter_bytes) / world;
    // On GPUs the model states are mixed precision (bf16 parameters, fp32 gradients, fp32 master and moments: 2, 4
    // and 12 bytes); the GPU model's activations and workspace have no formula here.
    const MemoryUse formula_memory = [&] {
      if (!on_gpu) return memory_estimate(c, shape);
      const double psi = static_cast<double>(model.parameters());
      const ModelStateMemory states = model_state_memory(c.strategy, psi, psi, shape.m, shape.n, StateBytes{2, 4, 12});
      MemoryUse use;
      use.params = states.params, use.grads = states.grads, use.optimizer = states.optimizer;
      return use;
    }();
    std::vector<double> measured_memory, formula_memory_max, memory_ratio;
    for (MemoryCategory cat : kCategories) {
      measured_memory.push_back(allreduce_max(MPI_COMM_WORLD, peak_memory[cat]));
      formula_memory_max.push_back(allreduce_max(MPI_COMM_WORLD, formula_of(formula_memory, cat)));
      memory_ratio.push_back(formula_memory_max.back() > 0 ? measured_memory.back() / formula_memory_max.back() : NAN);
    }

    CaseResult r = run.record(samples, wrong && rank == 0 ? 1 : 0, "strategy " + label,
        [&](Table& row) {
          axes.fill(row, point);
          row.set("flop", flop_per_rank).set("flop_recompute", recompute_flop_per_rank).set("stage_layers", stage_layers)
              .set("recompute_policy", placed.policy);
        },
        [&](Table& row, const CaseResult& res) {
          const double step = res.rankmax.median;
          const double mfu = peak > 0 ? flop_per_rank / (step * peak) : 0.0;
          const double hfu = peak > 0 ? (flop_per_rank + recompute_flop_per_rank) / (step * peak) : 0.0;
          set_flop_rates(row, flop_per_rank, res, world, peak, label, {{"MFU", mfu}, {"HFU", hfu}});
          row.set("tokens_per_s", tokens_per_step / step)
              .set("mfu", mfu)
              .set("hfu", hfu)
              .set("loss_first", first_loss).set("loss_last", last_loss);
          for (std::size_t i = 0; i < phase_medians.size(); ++i) row.set(std::string("phase_") + kPhases[i], phase_medians[i]);
          for (std::size_t t = 0; t < kCommTiers; ++t) {
            const std::string tier = name(static_cast<CommTier>(t));
            row.set("comm_" + tier + "_busy", busy[t]).set("comm_" + tier + "_exposed", exposed[t]);
          }
          for (std::size_t i = 0; i < std::size(kCategories); ++i) {
            const std::string n(name(kCategories[i]));
            row.set("memory_" + n, measured_memory[i]).set("memory_" + n + "_formula", formula_memory_max[i])
                .set("memory_" + n + "_ratio", memory_ratio[i]);
          }
          const PlacementResult& plan = placed.chosen;
          row.set("bubble_fraction", bubble).set("bubble_fraction_formula", bubble_formula)
              .set("sent_pipeline", sent_pipeline).set("sent_pipeline_formula", sent_pipeline_formula)
              .set("recompute_exposed", phase_medians[5] + phase_medians[8] - phase_medians[9])
              .set("placement_exposed", mode == Recompute::overlap ? plan.exposed_s : NAN)
              .set("placement_search", mode == Recompute::overlap ? plan.search_s : NAN)
              .set("heuristic_gap", std::isnan(placed.heuristic_exposed_s) ? NAN
                                    : plan.exposed_s > 0 ? placed.heuristic_exposed_s / plan.exposed_s - 1 : 0.0);
          row.set("sent_intra", counts_bytes ? sent_intra : NAN).set("sent_inter", counts_bytes ? sent_inter : NAN)
              .set("sent_intra_formula", formula_intra).set("sent_inter_formula", formula_inter);
        },
        [&](const CaseResult& res) { recorder.write_case(res.index); });
    if (run.is_root()) {
      const double step = r.rankmax.median;
      const double states = measured_memory[0] + measured_memory[1] + measured_memory[2];
      const double states_formula = formula_memory.params + formula_memory.grads + formula_memory.optimizer;
      std::printf("# %s: step %.2f ms (median of %d, max over ranks) | %.0f tok/s | MFU %s | exposed comm %.1f%% | "
                  "model states %sB/rank (formula %sB) | sent/rank intra %s, inter %s (ring formula %s, %s)%s%s\n",
                  label.c_str(), step * 1e3, r.iterations, tokens_per_step / step,
                  format_peak_percent(peak > 0 ? flop_per_rank / (step * peak) : 0, 2, true).c_str(), 100 * phase_medians[3] / step,
                  format_si(states).c_str(),
                  format_si(states_formula).c_str(), counts_bytes ? (format_si(sent_intra) + "B").c_str() : "n/a",
                  counts_bytes ? (format_si(sent_inter) + "B").c_str() : "n/a", (format_si(formula_intra) + "B").c_str(),
                  (format_si(formula_inter) + "B").c_str(),
                  (mode == Recompute::none ? std::string()
                                           : " | recompute " + format_fixed(phase_medians[5] * 1e3, 2) + " ms, activations " +
                                                 format_si(measured_memory[3]) + "B/rank").c_str(),
                  trajectory_differs ? " | CHECK FAILED: the losses differ from keeping every activation"
                  : wrong            ? " | CHECK FAILED: step-1 loss differs"
                                     : "");
      std::string ratios;
      for (std::size_t i = 0; i < std::size(kCategories); ++i)
        ratios += std::string(i ? ", " : "") + std::string(name(kCategories[i])) + " " +
                  (std::isnan(memory_ratio[i]) ? std::string("n/a") : format_fixed(memory_ratio[i], 3));
      std::printf("# %s memory/rank, measured / formula (comm_buffers: / bound; max over ranks): %s\n", label.c_str(), ratios.c_str());
      std::fflush(stdout);
    }
  }
  if (run.is_root()) std::printf("# results: %s\n", run.output_path().c_str());
  return run.finish();
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-step", [&] { return run_step(argc, argv); });
}
