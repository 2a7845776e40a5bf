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
// time (median over timed steps of the per-step maximum over ranks) and the measured FP32 peak of every rank (its
// measured bf16 dot-product peak with --dtype bf16; the tensor cores' dense bf16 peak on GPUs).
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
#include "kernels/cpu_features.h"
#include "kernels/cpu_gemm.h"
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
  std::string dtype = "auto";
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

// What every case of the run shares.
struct StepJob {
  const Options& o;
  const HarnessOptions& h;
  const ModelConfig& model;
  const TrainConfig& config;
  coll::GridShape grid;
  coll::ProcessGroups& groups;
  const DataParallelShape& shape;
  const TokenSource& data;
  double rank_limit = 0;  // bytes a rank may hold (memory_limit)
  bool on_gpu = false;
  int64_t global_rows = 0;                 // rows per step
  double psi = 0, psi_trainable = 0;       // parameters, and those that train
#ifdef STRATA_HAVE_CUDA
  coll::NcclProcessGroups* nccl = nullptr;
#endif
};

// The cases: the product of the strategies (slowest) and the recomputation modes. The run's model, batch,
// grid and options are axes of one value, so every `cases` column is declared once and filled from the point.
Axes step_axes(const std::vector<Strategy>& plan, const std::vector<Recompute>& modes, const StepJob& r) {
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
      .add("dtype", text(r.on_gpu ? "bf16" : cpu_gemm::name(r.config.runtime.precision)),
           "the GEMMs' arithmetic: fp32, or bf16 (operands rounded to bf16, sums in fp32, fp32 master weights)")
      .add("recompute", mode_names, "what backward computes again: none, full (each layer), selective (the attention core), "
           "overlap (a placement's ops, in the waits for other stages or on demand)");
  return axes;
}

// One case: a strategy and a recomputation mode, typed, beside its point of the axes.
struct StepCase {
  AxisPoint point;
  Strategy strategy;
  Recompute mode = Recompute::none;
  std::string label;  // "NNG", "NNG recompute full"
};

std::vector<StepCase> step_cases(const Axes& axes, const std::vector<Strategy>& plan, const std::vector<Recompute>& modes) {
  const std::vector<AxisPoint> points = axes.product();
  std::vector<StepCase> cases;
  // The axes' product runs the strategies slowest and the modes fastest, as these loops do.
  for (const Strategy& strategy : plan)
    for (Recompute mode : modes) {
      const AxisPoint& point = points.at(cases.size());
      if (point.text("strategy") != strategy.name() || point.text("recompute") != name(mode))
        throw std::logic_error("strata-step: the cases and the axes' points are out of step");
      cases.push_back({point, strategy, mode, strategy.name() + (mode == Recompute::none ? "" : std::string(" recompute ") + name(mode))});
    }
  return cases;
}

void add_step_options(Cli& cli, Options& o, HarnessOptions& h) {
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
  cli.choice("dtype", 0, "the GEMMs' arithmetic: fp32, or bf16 operands summed in fp32 with fp32 master weights (auto: "
             "fp32 on the CPU, bf16 on GPUs, whose step is bf16 only)", o.dtype, {"auto", "fp32", "bf16"});
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
}

// The options' own checks, before any rank talks to another.
void check_options(const Options& o, HarnessOptions& h) {
  if (o.data != "synthetic" && o.data != "repeat") h.inputs.push_back({"--data", o.data, ""});
  h.inputs.push_back({"--recompute-policy", o.recompute_policy, ""});
  check_output_is_no_input(h);
  if (o.backend == "cuda" && o.dtype == "fp32")
    throw UsageError("--dtype fp32 --backend cuda: the GPU step is mixed precision only (bf16 compute, fp32 master weights)");
#ifndef STRATA_HAVE_CUDA
  if (o.backend == "cuda")
    throw UsageError("--backend cuda: this build has no GPU step (built without CUDA: STRATA_CUDA=OFF, or no nvcc, "
                     "cuBLASLt or NCCL found)");
#endif
  if (o.backend == "cpu" && o.dtype == "bf16") {
    if (o.library == "openblas") throw UsageError("--dtype bf16 --library openblas: OpenBLAS has no bf16 GEMM (use onednn or auto)");
    if (const std::string why = cpu_gemm::bf16_refusal(detect_cpu_features()); !why.empty())
      throw UsageError("--dtype bf16: " + why + "; the step runs in fp32 here (--dtype fp32)");
  }
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
}

// The plan's configuration with strata-step's optimizer, schedule of the learning rate, seed and threads.
TrainConfig step_config(const StepPlan& plan, const Options& o, const HarnessOptions& h) {
  TrainConfig config = plan.config;
  config.adamw.weight_decay = static_cast<float>(o.weight_decay);
  config.lr = {static_cast<float>(o.lr), static_cast<float>(o.min_lr), o.lr_warmup,
               o.lr_steps > 0 ? o.lr_steps : static_cast<int64_t>(h.warmup + h.iters)};
  config.max_grad_norm = static_cast<float>(o.max_grad_norm);
  config.seed = static_cast<uint64_t>(o.seed);
  config.runtime.threads = o.threads;
  const bool bf16 = o.backend == "cpu" && o.dtype == "bf16";
  config.runtime.library = o.library == "onednn" || bf16 ? cpu_gemm::Backend::onednn : cpu_gemm::Backend::openblas;
  config.runtime.precision = bf16 ? cpu_gemm::Precision::bf16 : cpu_gemm::Precision::fp32;
  return config;
}

std::unique_ptr<TokenSource> token_source(const Options& o, const ModelConfig& model, uint64_t seed, int64_t global_rows) {
  try {
    if (o.data == "synthetic") return synthetic_tokens(model.vocab, seed);
    if (o.data == "repeat") return repeated_sequences(model.vocab, 16, o.seq, seed);
    return token_stream(read_token_file(o.data), model.vocab, global_rows, o.seq);
  } catch (const std::invalid_argument& e) {
    throw UsageError("--data " + o.data + ": " + e.what());
  }
}

double trainable_parameters(const ModelConfig& model, const Trainable& trainable) {
  double psi = 0;
  const std::vector<Slice> units = ParameterLayout(model).units();
  const std::vector<bool> trains = trainable_units(model, trainable);
  for (std::size_t u = 0; u < units.size(); ++u)
    if (trains[u]) psi += static_cast<double>(units[u].size);
  return psi;
}

// A case's configuration: its strategy and mode on the run's.
TrainConfig case_config(const StepJob& job, const StepCase& k) {
  TrainConfig c = job.config;
  c.strategy = k.strategy, c.recompute = k.mode;
  return c;
}

// Bytes a rank may give overlap's kept activations beyond the model states: under --memory-limit, what is left of it
// with every op recomputed; 0 (no bound) without it.
double activation_allowance(const StepJob& job, const TrainConfig& c) {
  if (job.o.memory_limit_gib <= 0) return 0;
  const MemoryUse e = memory_estimate(c, job.shape);
  return job.rank_limit - (e.params + e.grads + e.optimizer + e.workspace + e.comm_buffers);
}

// Before anything large is allocated: every case must fit in host memory (on GPUs the device refuses).
void check_memory(const StepJob& job, const std::vector<StepCase>& cases) {
  const Options& o = job.o;
  const double limit = job.rank_limit;
  double worst = 0;
  std::string worst_name, parts;
  for (const StepCase& k : cases) {
    TrainConfig c = case_config(job, k);
    if (o.partition == "balanced") c.stage_layers = even_partition(job.model.layers, job.grid.pp * o.virtual_stages);
    if (c.recompute == Recompute::overlap) recompute_everything(c, job.grid.pp);
    const MemoryUse e = memory_estimate(c, job.shape);
    const double total = e.total();
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

// A policy file is refused before the results file is touched: against every overlapped case's ops and windows, or,
// where the stages come from a measured step (--partition balanced), its form alone.
void check_policy(const StepJob& job, const std::vector<StepCase>& cases, const std::vector<Recompute>& modes) {
  const Options& o = job.o;
  if (o.recompute_policy.empty()) return;
  if (std::find(modes.begin(), modes.end(), Recompute::overlap) == modes.end())
    throw UsageError("--recompute-policy places overlapped recomputation: give --recompute overlap");
  if (o.partition == "balanced") on_every_rank([&] { check_policy_form(o.recompute_policy); });
  for (const StepCase& k : cases) {
    if (o.partition == "balanced" || k.mode != Recompute::overlap) continue;
    TrainConfig c = case_config(job, k);
    recompute_everything(c, job.grid.pp);
    const DataParallelShape& shape = job.shape;
    const OverlapProblem problem = overlap_problem(c, shape.pp, shape.pp_rank, shape.tp, c.sequence_parallel && shape.tp > 1,
                                                   unmeasured_profile(c, shape.pp, shape.pp_rank), activation_allowance(job, c));
    (void)read_policy(o.recompute_policy, problem.problem);
  }
}

void declare_step_columns(Run& run, const Axes& axes) {
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
}

// The run's rates: tokens and model FLOPs per step, and the peak MFU is taken against (the measured FP32 peak of the
// rank's threads; on GPUs the tensor cores' dense bf16 peak, as strata-gemm holds its figures to).
struct Rates {
  double tokens_per_step = 0, flop_per_rank = 0, peak = 0;
  std::string peak_text;
  double mfu(double step_s) const { return peak > 0 ? flop_per_rank / (step_s * peak) : 0.0; }
};

// A case made ready to run: its stages (balanced from a measured step, with --partition balanced) and overlap's
// placement (measured, solved or read), and the recomputed FLOPs that follow.
struct PreparedCase {
  TrainConfig config;
  Placed placed;
  std::string stage_layers;  // layers of each stage, comma-separated
  double recompute_flop_per_rank = 0;
};

PreparedCase prepare_case(const StepJob& job, const StepCase& k, const Rates& rates, Run& run) {
  const Options& o = job.o;
  const int world = static_cast<int>(job.grid.size());
  PreparedCase p;
  TrainConfig& c = p.config;
  c = case_config(job, k);
  if (o.partition == "balanced") run.progress("the stage balancing of strategy " + k.label);
  if (o.partition == "balanced") c.stage_layers = balanced_stages(c, job.groups, job.data, job.shape, job.rank_limit);
  if (k.mode == Recompute::overlap) {
    recompute_everything(c, job.grid.pp);
    const double allowance = activation_allowance(job, c);
    run.progress("the recomputation placement of strategy " + k.label);
    p.placed = place_recomputation(c, job.groups, job.data, o, job.shape, allowance);
  }
  for (int layers : stage_partition(job.model, job.grid.pp * o.virtual_stages, c.stage_layers))
    p.stage_layers += (p.stage_layers.empty() ? "" : ",") + std::to_string(layers);
  // Overlap's kept ops differ per stage; each rank knows its own: the recomputed FLOPs are summed over the stages.
  if (k.mode != Recompute::overlap) {
    p.recompute_flop_per_rank = recompute_flops_per_token(job.model, o.seq, k.mode) * rates.tokens_per_step / world;
  } else {
    std::vector<std::vector<KeptOps>> mine;
    for (const StagePlan& plan : rank_stages(c, job.grid.pp, job.shape.pp_rank)) mine.push_back(plan.kept);
    const bool speaks = job.groups.tp_index() == 0 && job.groups.dp_index() == 0;
    p.recompute_flop_per_rank =
        allreduce_sum(speaks ? recompute_flops_per_token(job.model, o.seq, k.mode, mine) : 0.0) * rates.tokens_per_step / world;
  }
  if (run.is_root() && k.mode == Recompute::overlap) {
    const PlacementResult& r = p.placed.chosen;
    const Placed& placed = p.placed;
    std::printf("# %s placement (pipeline rank 0; %s): %.2f ms of recomputation in windows, %.2f ms on demand, "
                "search %.3f s%s\n", k.label.c_str(),
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
  return p;
}

// The steps of one case as they ran: wall times of the timed steps, their statistics, the losses of the first and last
// step, the memory high-water marks.
struct TrainedCase {
  std::vector<double> samples;
  std::vector<StepStats> timed;
  double first_loss = NAN, last_loss = NAN;
  MemoryFigures peak_memory;
};

void record_step(StepRecorder& recorder, const StepStats& stats, int iteration, int pp_rank) {
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
  recorder.add_metric("pipeline_rank", pp_rank);
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
}

// The warm-up and timed steps of one case, each printed on rank 0 and recorded.
TrainedCase train_case(const StepJob& job, const StepCase& k, const TrainConfig& c, const Rates& rates, Run& run,
                       StepRecorder& recorder) {
  const HarnessOptions& h = job.h;
  TrainedCase out;
  job.on_gpu ? reset_device_memory_peaks() : reset_memory_peaks();
  // The CPU trainer, or on GPUs the data-parallel GPU trainer (which records no timeline).
  std::unique_ptr<Trainer> cpu_trainer;
  std::function<StepStats(int64_t, bool)> train_step;
#ifdef STRATA_HAVE_CUDA
  std::unique_ptr<GpuDataParallelTrainer> gpu_trainer;
  if (job.on_gpu) {
    gpu_trainer = std::make_unique<GpuDataParallelTrainer>(c, job.groups, *job.nccl, job.data);
    train_step = [&](int64_t step, bool) { return gpu_trainer->step(step); };
  }
#endif
  if (!job.on_gpu) {
    cpu_trainer = std::make_unique<Trainer>(c, job.groups, job.data);
    train_step = [&](int64_t step, bool timeline) { return cpu_trainer->step(step, timeline); };
  }
  HostTimer timer;
  double spent = 0;
  for (int i = 0; i < h.warmup + h.iters; ++i) {
    const bool timing = i >= h.warmup;
    const int iteration = i - h.warmup;
    run.progress("step " + std::to_string(i + 1) + "/" + std::to_string(h.warmup + h.iters) + " of strategy " + k.label);
    STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    timer.start();
    StepStats stats = train_step(i + 1, timing && iteration < job.o.timeline_steps);
    const double elapsed = timer.stop();
    const double slowest = allreduce_max(MPI_COMM_WORLD, elapsed);
    if (i == 0) out.first_loss = stats.loss;
    out.last_loss = stats.loss;
    if (run.is_root()) {
      std::printf("%s step %4d/%d | loss %.4f | norm %.4f | lr %.2e | %9.2f ms | %9.0f tok/s | MFU %s%s\n",
                  k.label.c_str(), i + 1, h.warmup + h.iters, stats.loss, stats.grad_norm, stats.lr, slowest * 1e3,
                  rates.tokens_per_step / slowest, format_peak_percent(rates.mfu(slowest), 2, true).c_str(),
                  timing ? "" : " (warm-up)");
      std::fflush(stdout);
    }
    if (!timing) continue;
    out.samples.push_back(elapsed);
    record_step(recorder, stats, iteration, job.shape.pp_rank);
    out.timed.push_back(std::move(stats));
    spent += elapsed;
    if (h.max_time > 0 && iteration + 1 < h.iters && allreduce_max(MPI_COMM_WORLD, spent) >= h.max_time) break;
  }
  out.peak_memory = job.on_gpu ? device_memory_peak() : memory_peak();
  return out;
}

// A case's figures over ranks beside their formulas: phases (median step, mean over ranks), the bubble, bytes sent
// per tier and to other stages, memory per category (max over ranks). Collective.
struct CaseFigures {
  std::vector<double> phases;  // per kPhases
  double bubble = 0, bubble_formula = 0, sent_pipeline = 0, sent_pipeline_formula = 0;
  std::vector<double> busy, exposed;  // per tier
  double sent_intra = 0, sent_inter = 0, formula_intra = 0, formula_inter = 0;
  MemoryUse formula_memory;
  std::vector<double> measured_memory, formula_memory_max, memory_ratio;  // per kCategories
};

CaseFigures case_figures(const StepJob& job, const TrainConfig& c, const TrainedCase& trained) {
  const int world = static_cast<int>(job.grid.size());
  const DataParallelShape& shape = job.shape;
  CaseFigures f;
  auto per_step = [&](auto field) {
    std::vector<double> v;
    for (const StepStats& s : trained.timed) v.push_back(field(s));
    return allreduce_sum(median(v)) / world;
  };
  f.phases = {per_step([](const StepStats& s) { return s.forward_seconds; }), per_step([](const StepStats& s) { return s.backward_seconds; }),
              per_step([](const StepStats& s) { return s.optimizer_seconds; }),
              per_step([](const StepStats& s) { return s.exposed_comm_seconds; }), per_step([](const StepStats& s) { return s.idle_seconds; }),
              per_step([](const StepStats& s) { return s.recompute_seconds; }),
              per_step([](const StepStats& s) { return s.tp_comm_seconds; }),
              per_step([](const StepStats& s) { return s.pipeline.wait_seconds; }),
              per_step([](const StepStats& s) { return s.recompute_window_seconds; }),
              per_step([](const StepStats& s) { return s.recompute_hidden_seconds; }),
              per_step([](const StepStats& s) { return s.pipeline.hidden_seconds(); })};
  // Each rank's pipeline idle time against its compute in the pipelined passes (the ideal time of docs/metrics.md's
  // bubble), mean over ranks.
  f.bubble = per_step([](const StepStats& s) {
    const double compute = s.forward_seconds + s.backward_seconds + s.recompute_window_seconds;
    return compute > 0 ? s.pipeline.wait_seconds / compute : 0.0;
  });
  f.bubble_formula = job.grid.pp > 1 ? (job.grid.pp - 1.0) / (job.o.virtual_stages * job.o.accumulation) : 0.0;
  f.sent_pipeline = per_step([](const StepStats& s) { return s.pipeline.sent_bytes; });
  f.sent_pipeline_formula = allreduce_sum(pipeline_sent_bytes(c, shape)) / world;
  for (std::size_t t = 0; t < kCommTiers; ++t) {
    f.busy.push_back(per_step([t](const StepStats& s) { return s.comm[t].busy_seconds; }));
    f.exposed.push_back(per_step([t](const StepStats& s) { return s.comm[t].exposed_seconds; }));
  }
  f.sent_intra = per_step([](const StepStats& s) { return s.traffic.intra_bytes; });
  f.sent_inter = per_step([](const StepStats& s) { return s.traffic.inter_bytes; });
  const coll::Traffic formula_traffic = expected_traffic(c, shape);
  f.formula_intra = allreduce_sum(formula_traffic.intra_bytes) / world;
  f.formula_inter = allreduce_sum(formula_traffic.inter_bytes) / world;
  // On GPUs the model states are mixed precision (bf16 parameters, fp32 gradients, fp32 master and moments: 2, 4
  // and 12 bytes); the GPU model's activations and workspace have no formula here.
  if (!job.on_gpu) {
    f.formula_memory = memory_estimate(c, shape);
  } else {
    const double psi = static_cast<double>(job.model.parameters());
    const ModelStateMemory states = model_state_memory(c.strategy, psi, psi, shape.m, shape.n, StateBytes{2, 4, 12});
    f.formula_memory.params = states.params, f.formula_memory.grads = states.grads, f.formula_memory.optimizer = states.optimizer;
  }
  for (MemoryCategory cat : kCategories) {
    f.measured_memory.push_back(allreduce_max(MPI_COMM_WORLD, trained.peak_memory[cat]));
    f.formula_memory_max.push_back(allreduce_max(MPI_COMM_WORLD, formula_of(f.formula_memory, cat)));
    f.memory_ratio.push_back(f.formula_memory_max.back() > 0 ? f.measured_memory.back() / f.formula_memory_max.back() : NAN);
  }
  return f;
}

// Rank 0's lines of a recorded case: step, rates, exposed communication, model states and bytes against their
// formulas, the check's verdict, memory per category against its formula.
void print_case(const StepCase& k, const CaseResult& r, const Rates& rates, const CaseFigures& f, bool counts_bytes,
                bool wrong, bool trajectory_differs) {
  const double step = r.rankmax.median;
  const double states = f.measured_memory[0] + f.measured_memory[1] + f.measured_memory[2];
  const double states_formula = f.formula_memory.params + f.formula_memory.grads + f.formula_memory.optimizer;
  std::printf("# %s: step %.2f ms (median of %d, max over ranks) | %.0f tok/s | MFU %s | exposed comm %.1f%% | "
              "model states %sB/rank (formula %sB) | sent/rank intra %s, inter %s (ring formula %s, %s)%s%s\n",
              k.label.c_str(), step * 1e3, r.iterations, rates.tokens_per_step / step,
              format_peak_percent(rates.mfu(step), 2, true).c_str(), 100 * f.phases[3] / step,
              format_si(states).c_str(),
              format_si(states_formula).c_str(), counts_bytes ? (format_si(f.sent_intra) + "B").c_str() : "n/a",
              counts_bytes ? (format_si(f.sent_inter) + "B").c_str() : "n/a", (format_si(f.formula_intra) + "B").c_str(),
              (format_si(f.formula_inter) + "B").c_str(),
              (k.mode == Recompute::none ? std::string()
                                         : " | recompute " + format_fixed(f.phases[5] * 1e3, 2) + " ms, activations " +
                                               format_si(f.measured_memory[3]) + "B/rank").c_str(),
              trajectory_differs ? " | CHECK FAILED: the losses differ from keeping every activation"
              : wrong            ? " | CHECK FAILED: step-1 loss differs"
                                 : "");
  std::string ratios;
  for (std::size_t i = 0; i < std::size(kCategories); ++i)
    ratios += std::string(i ? ", " : "") + std::string(name(kCategories[i])) + " " +
              (std::isnan(f.memory_ratio[i]) ? std::string("n/a") : format_fixed(f.memory_ratio[i], 3));
  std::printf("# %s memory/rank, measured / formula (comm_buffers: / bound; max over ranks): %s\n", k.label.c_str(), ratios.c_str());
  std::fflush(stdout);
}

int run_step(int argc, char** argv) {
  HarnessOptions h;
  // Five warm-up steps: a case's steps settle over its first few (docs/reference/strata-step.md).
  h.warmup = 5, h.iters = 5;
  Options o;
  Cli cli("strata-step", "A GPT model trained for real under data-parallel strategies (DP, ZeRO, PaRO), one case per "
                         "strategy. MFU: 6N + 6Lhs model FLOPs per token over the measured FP32 (or bf16) peak.");
  add_step_options(cli, o, h);
  if (!cli.parse(argc, argv)) return 0;
  o.micro_batch_given = cli.given("micro-batch"), o.accumulation_given = cli.given("accumulation");
  check_options(o, h);
  h.kernel_threads = o.threads;
  const bool on_gpu = o.backend == "cuda";

  // Plan: the model, grid, strategies and modes; the data; the groups; the cases.
  const int world = world_size();
  const StepPlan step_plan = plan_step(o, world);
  const ModelConfig& model = step_plan.model;
  const coll::GridShape grid = step_plan.grid;
  TrainConfig config = step_config(step_plan, o, h);
  const int64_t global_rows = static_cast<int64_t>(grid.dp) * o.accumulation * config.micro_batch;
  const std::unique_ptr<TokenSource> data = token_source(o, model, config.seed, global_rows);
  coll::ProcessGroups groups(grid, o.group_size, o.grid_order);
#ifdef STRATA_HAVE_CUDA
  // Before anything is written: a node short of GPUs is refused here.
  std::unique_ptr<coll::NcclProcessGroups> nccl;
  if (on_gpu) nccl = std::make_unique<coll::NcclProcessGroups>(groups);
#endif
  const DataParallelShape shape = data_parallel_shape(groups);
  const double psi = static_cast<double>(model.parameters());
  const double psi_trainable = trainable_parameters(model, step_plan.trainable);
  StepJob job{o, h, model, config, grid, groups, shape, *data, memory_limit(o), on_gpu};
  job.global_rows = global_rows, job.psi = psi, job.psi_trainable = psi_trainable;
  const Axes axes = step_axes(step_plan.strategies, step_plan.modes, job);
  const std::vector<StepCase> cases = step_cases(axes, step_plan.strategies, step_plan.modes);
#ifdef STRATA_HAVE_CUDA
  job.nccl = nccl.get();
  if (on_gpu)
    for (const StepCase& k : cases)
      if (const std::string why = gpu_step_refusal(case_config(job, k), grid); !why.empty())
        throw UsageError("--backend cuda: " + why);
#endif

  // Check, before the results file is touched.
  if (!on_gpu) check_memory(job, cases);
  check_policy(job, cases, step_plan.modes);

  Run run("strata-step", argc, argv, h, cli.resolved_json(), on_gpu ? "cuda" : "cpu");
  const bool cpu_bf16 = config.runtime.precision == cpu_gemm::Precision::bf16;
  if (o.library == "auto" && !cpu_bf16) config.runtime.library = run.context().machine.description.default_gemm;
  StepRecorder recorder(run);
  run.set_case_count(static_cast<int>(cases.size()));
  Rates rates;
  rates.tokens_per_step = static_cast<double>(global_rows) * o.seq;
  rates.flop_per_rank = model_flops_per_token(model, o.seq) * rates.tokens_per_step / world;
  const PeakFigure& cpu_peak = cpu_bf16 ? run.context().machine.description.bf16 : run.context().machine.description.fp32;
  rates.peak = cpu_peak.per_rank(o.threads), rates.peak_text = (cpu_bf16 ? "bf16 " : "") + peak_source(cpu_peak, o.threads);
  if (cpu_bf16 && detect_cpu_features().amx_bf16) {
    // oneDNN runs its bf16 GEMMs on AMX tiles there, several times the dot product's measured peak: no MFU rather
    // than one above 1.
    rates.peak = 0, rates.peak_text = "n/a: oneDNN's bf16 GEMMs run on AMX tiles, whose peak Strata does not measure";
  }
#ifdef STRATA_HAVE_CUDA
  if (on_gpu) {
    const gemm::GpuPeak gpu = gemm::gpu_peak(nccl->device(), gemm::DType::bf16);
    rates.peak = gpu.flops, rates.peak_text = "bf16 " + gpu.source;
  }
#endif
  const bool counts_bytes = config.comm_algo != coll::Algo::library;
  declare_step_columns(run, axes);
  if (run.is_root()) {
    std::printf("# strata-step: %s (%s parameters, %s trainable), %d rank(s): tp %d x dp %d as %d group(s) of %d, micro-batch %d x seq %d, "
                "%d micro-batch(es), global batch %lld rows (%s tokens); comm %s, overlap %s; GEMMs %s\n",
                model.name.c_str(), format_si(psi).c_str(), format_si(psi_trainable).c_str(), world, shape.tp, shape.n, shape.g, shape.m,
                config.micro_batch, o.seq, o.accumulation, static_cast<long long>(global_rows),
                format_si(rates.tokens_per_step).c_str(), o.comm_algo.c_str(), o.overlap.c_str(),
                on_gpu ? "bf16 (cuBLASLt)" : (cpu_gemm::name(config.runtime.precision) + " (" + cpu_gemm::name(config.runtime.library) + ")").c_str());
    std::printf("# MFU: 6N + 6Lhs model FLOPs per token over %s per rank (%s)\n", format_si(rates.peak).c_str(),
                rates.peak_text.c_str());
    std::fflush(stdout);
  }

  // Measure, check and record each case.
  double reference_loss = NAN;  // step 1 of the first strategy: every strategy starts from the same state
  std::map<std::string, double> kept_last_loss;  // per strategy, the last loss without recomputation
  const int rank = run.context().self.rank;
  for (const StepCase& k : cases) {
    run.begin_case("strategy " + k.label);
    const PreparedCase prepared = prepare_case(job, k, rates, run);
    const TrainConfig& c = prepared.config;
    const TrainedCase trained = train_case(job, k, c, rates, run, recorder);
    for (MemoryCategory cat : kCategories) recorder.note_memory(std::string(name(cat)), static_cast<int64_t>(trained.peak_memory[cat]));

    // The check: step 1 runs on the same parameters and tokens under every strategy, so its loss differs only
    // by the order of fp32 sums (relative 1e-6; 1e-5 allowed); a wrong gather or a missing shard moves it more.
    if (std::isnan(reference_loss)) reference_loss = trained.first_loss;
    bool wrong = !std::isfinite(trained.first_loss) || std::abs(trained.first_loss - reference_loss) > 1e-5 * std::abs(reference_loss);
    // Recomputation computes the same activations again (no dropout), so a strategy trains along the same
    // losses in every mode; only a recomputation that differs from the kept activations moves them.
    bool trajectory_differs = false;
    if (k.mode == Recompute::none) kept_last_loss[k.strategy.name()] = trained.last_loss;
    else if (auto kept = kept_last_loss.find(k.strategy.name()); kept != kept_last_loss.end())
      trajectory_differs = !(std::abs(trained.last_loss - kept->second) <= 1e-6 * std::abs(kept->second));
    wrong = wrong || trajectory_differs;
    const CaseFigures f = case_figures(job, c, trained);

    const Placed& placed = prepared.placed;
    CaseResult r = run.record(trained.samples, wrong && rank == 0 ? 1 : 0, "strategy " + k.label,
        [&](Table& row) {
          axes.fill(row, k.point);
          row.set("flop", rates.flop_per_rank).set("flop_recompute", prepared.recompute_flop_per_rank)
              .set("stage_layers", prepared.stage_layers).set("recompute_policy", placed.policy);
        },
        [&](Table& row, const CaseResult& res) {
          const double step = res.rankmax.median;
          const double mfu = rates.mfu(step);
          const double hfu = rates.peak > 0 ? (rates.flop_per_rank + prepared.recompute_flop_per_rank) / (step * rates.peak) : 0.0;
          set_flop_rates(row, rates.flop_per_rank, res, world, rates.peak, k.label, {{"MFU", mfu}, {"HFU", hfu}});
          row.set("tokens_per_s", rates.tokens_per_step / step)
              .set("mfu", mfu)
              .set("hfu", hfu)
              .set("loss_first", trained.first_loss).set("loss_last", trained.last_loss);
          for (std::size_t i = 0; i < f.phases.size(); ++i) row.set(std::string("phase_") + kPhases[i], f.phases[i]);
          for (std::size_t t = 0; t < kCommTiers; ++t) {
            const std::string tier = name(static_cast<CommTier>(t));
            row.set("comm_" + tier + "_busy", f.busy[t]).set("comm_" + tier + "_exposed", f.exposed[t]);
          }
          for (std::size_t i = 0; i < std::size(kCategories); ++i) {
            const std::string n(name(kCategories[i]));
            row.set("memory_" + n, f.measured_memory[i]).set("memory_" + n + "_formula", f.formula_memory_max[i])
                .set("memory_" + n + "_ratio", f.memory_ratio[i]);
          }
          const PlacementResult& plan = placed.chosen;
          row.set("bubble_fraction", f.bubble).set("bubble_fraction_formula", f.bubble_formula)
              .set("sent_pipeline", f.sent_pipeline).set("sent_pipeline_formula", f.sent_pipeline_formula)
              .set("recompute_exposed", f.phases[5] + f.phases[8] - f.phases[9])
              .set("placement_exposed", k.mode == Recompute::overlap ? plan.exposed_s : NAN)
              .set("placement_search", k.mode == Recompute::overlap ? plan.search_s : NAN)
              .set("heuristic_gap", std::isnan(placed.heuristic_exposed_s) ? NAN
                                    : plan.exposed_s > 0 ? placed.heuristic_exposed_s / plan.exposed_s - 1 : 0.0);
          row.set("sent_intra", counts_bytes ? f.sent_intra : NAN).set("sent_inter", counts_bytes ? f.sent_inter : NAN)
              .set("sent_intra_formula", f.formula_intra).set("sent_inter_formula", f.formula_inter);
        },
        [&](const CaseResult& res) { recorder.write_case(res.index); });
    if (run.is_root()) print_case(k, r, rates, f, counts_bytes, wrong, trajectory_differs);
  }
  if (run.is_root()) std::printf("# results: %s\n", run.output_path().c_str());
  return run.finish();
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-step", [&] { return run_step(argc, argv); });
}
