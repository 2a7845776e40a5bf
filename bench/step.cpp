// strata-step: a GPT model trained for real under data-parallel partitioning strategies (DP, ZeRO-1/2/3 and
// every runnable PaRO strategy, research.md), one strategy per case on the same model, data and
// initialisation, so they can be compared side by side. Each step prints one line (loss, gradient norm,
// learning rate, time, tokens/s, MFU); each case records the step time over ranks, phases (forward, backward,
// optimizer, exposed communication per tier, idle), one step's timeline, memory per category against the
// formula, and the bytes each rank sent per tier against the formula (train/step_formulas.h).
//
// MFU convention: model FLOPs 6 N + 6 L h s per token (llm.c's count, causal attention as half), over the step
// time (median over timed steps of the per-step maximum over ranks) and the measured FP32 peak of every rank.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>

#include "bench/axes.h"
#include "bench/harness.h"
#include "bench/records.h"
#include "bench/token_file.h"
#include "collectives/process_group.h"
#include "train/data.h"
#include "train/trainer.h"
#include "train/memory.h"
#include "train/step_formulas.h"

namespace {

using namespace strata;
using namespace strata::train;

struct Options {
  std::string model = "gpt2-124m";
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, vocab = 0, mlp_hidden = 0;  // 0: the preset's
  int seq = 128;
  int micro_batch = 1;
  int accumulation = 1;
  int64_t global_batch = 0;  // rows; 0: dp x accumulation x micro_batch
  std::string paro, zero;
  int group_size = 0;
  std::string trainable = "all";
  std::string comm_algo = "library";
  std::string overlap = "on";
  std::string data = "synthetic";
  double lr = 3e-4, min_lr = 3e-5, weight_decay = 0.1, max_grad_norm = 1.0;
  int lr_warmup = 0, lr_steps = 0;
  int64_t seed = 1;
  int threads = 1;
  std::string library = "auto";
  std::string backend = "cpu";
  double memory_limit_gib = 0;
  int timeline_steps = 1;
  std::string recompute = "none";
  int tp = 1;
  bool sp = false;
};

// --recompute none,full | all: the modes, in the order given.
std::vector<Recompute> recompute_modes(const std::string& text) {
  if (text == "all") return {Recompute::none, Recompute::full, Recompute::selective};
  std::vector<Recompute> out;
  for (const std::string& item : split(text, ',')) {
    const std::optional<Recompute> mode = parse_recompute(item);
    if (!mode) throw UsageError("--recompute: unknown mode '" + item + "' (none, full, selective or all)");
    out.push_back(*mode);
  }
  return out;
}

// --paro NNG,III | all and --zero 0,3 | all name strategies on one code path; refused ones say why.
std::vector<Strategy> strategies(const Options& o) {
  if (!o.paro.empty() && !o.zero.empty()) throw UsageError("--paro and --zero both given: choose one");
  std::vector<Strategy> out;
  if (o.paro == "all") return runnable_strategies();
  if (o.zero == "all") return {zero_stage(0), zero_stage(1), zero_stage(2), zero_stage(3)};
  for (const std::string& item : split(o.paro.empty() ? (o.zero.empty() ? "0" : o.zero) : o.paro, ',')) {
    Strategy s = o.paro.empty() ? zero_stage(static_cast<int>(parse_int(item, "--zero"))) : parse_strategy(item);
    if (const std::string why = refusal_reason(s); !why.empty())
      throw UsageError("strategy " + s.name() + " is not run: " + why);
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

ModelConfig model_of(const Options& o) {
  ModelConfig m = preset(o.model);
  auto over = [](int& field, int value) {
    if (value > 0) field = value;
  };
  over(m.layers, o.layers), over(m.hidden, o.hidden), over(m.heads, o.heads), over(m.vocab, o.vocab);
  over(m.mlp_hidden, o.mlp_hidden);
  m.kv_heads = o.kv_heads > 0 ? o.kv_heads : (o.heads > 0 ? m.heads : m.kv_heads);
  if (o.layers || o.hidden || o.heads || o.kv_heads || o.vocab || o.mlp_hidden) m.name += "+custom";
  if (const std::string problem = m.validate(); !problem.empty()) throw UsageError("model: " + problem);
  if (o.seq > m.max_seq)
    throw UsageError("--seq " + std::to_string(o.seq) + " exceeds the model's position table (" + std::to_string(m.max_seq) + ")");
  return m;
}

// Bytes a rank may hold: --memory-limit, else the node's available memory shared by its ranks.
double memory_limit(const Options& o, int ranks_on_node) {
  if (o.memory_limit_gib > 0) return o.memory_limit_gib * double(1 << 30);
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key) {
    if (key == "MemAvailable:") {
      meminfo >> kib;
      return kib * 1024 / ranks_on_node;
    }
    meminfo.ignore(256, '\n');
  }
  return INFINITY;  // unknown: no check
}

std::string gib(double bytes) { return format_fixed(bytes / double(1 << 30), 3) + " GiB"; }

// The harness's median; NaN for no steps.
double median(std::vector<double> v) { return v.empty() ? NAN : summarize(std::move(v)).median; }

double allreduce_sum(double value) {
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  return value;
}

// recompute is a part of backward: the forward work it does again first; comm_tp a part of comm_exposed: the
// tensor-parallel collectives, which block.
constexpr const char* kPhases[] = {"forward", "backward", "optimizer", "comm_exposed", "idle", "recompute", "comm_tp"};
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
      .add("sp", one(r.o.sp ? 1 : 0), "1", "sequence parallelism (1: on)")
      .add("group_size", one(r.shape.m), "1", "m: data-parallel ranks per group")
      .add("groups", one(r.shape.g), "1", "g: groups (nodes)")
      .add("parameters", std::vector<double>{r.psi}, "1", "Ψ")
      .add("trainable_parameters", std::vector<double>{r.psi_trainable}, "1", "Ψ'")
      .add("trainable", text(r.o.trainable)).add("comm_algo", text(r.o.comm_algo))
      .add("overlap", one(r.config.overlap ? 1 : 0)).add("data", text(r.o.data))
      .add("recompute", mode_names, "what backward computes again: none, full (each layer), selective (the attention core)");
  return axes;
}

int run_step(int argc, char** argv) {
  HarnessOptions h;
  h.warmup = 1, h.iters = 5;
  Options o;
  Cli cli("strata-step", "A GPT model trained for real under data-parallel strategies (DP, ZeRO, PaRO), one case per "
                         "strategy. MFU: 6N + 6Lhs model FLOPs per token over the measured FP32 peak.");
  cli.option("model", 'm', "model preset (tiny, gpt2-124m, gpt2-350m, ..., gpt3-1.3b, ...)", o.model);
  cli.option("layers", 0, "layers (0: the preset's)", o.layers, 0);
  cli.option("hidden", 0, "hidden size (0: the preset's)", o.hidden, 0);
  cli.option("heads", 0, "attention heads (0: the preset's)", o.heads, 0);
  cli.option("kv-heads", 0, "key/value heads, grouped-query (0: the preset's, or --heads)", o.kv_heads, 0);
  cli.option("vocab", 0, "vocabulary (0: the preset's)", o.vocab, 0);
  cli.option("mlp-hidden", 0, "MLP width (0: the preset's, 4 x hidden)", o.mlp_hidden, 0);
  cli.option("seq", 's', "sequence length", o.seq, 1);
  cli.option("micro-batch", 'b', "rows per rank per micro-batch", o.micro_batch, 1);
  cli.option("accumulation", 'a', "micro-batches per optimizer step", o.accumulation, 1);
  cli.option("global-batch", 0, "rows per step over all ranks (sets --micro-batch; 0: dp x accumulation x micro-batch)",
             o.global_batch, 0);
  cli.option("paro", 0, "PaRO strategies P.G.OS from N, I, G (e.g. NNG,IIG) or all", o.paro);
  cli.option("zero", 'z', "ZeRO stages 0-3 (comma-separated) or all; default 0 when --paro is not given", o.zero);
  cli.option("group-size", 'g', "ranks per group (an emulated node) for I strategies; 0: real nodes", o.group_size, 0);
  cli.option("trainable", 0, "all, a fraction of the layers from the last (0.25), or last:K", o.trainable);
  cli.choice("comm-algo", 0, "algorithms of the step's collectives", o.comm_algo, {"library", "ring", "hierarchical", "horing", "shm"});
  cli.choice("overlap", 0, "reduce gradients during backward and gather parameters ahead", o.overlap, {"on", "off"});
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
  cli.option("tp", 0, "tensor-parallel degree T (Megatron-LM's split; T consecutive ranks, inside a node); the "
             "data-parallel degree is the ranks over T", o.tp, 1);
  cli.flag("sp", 0, "sequence parallelism with --tp (Megatron-LM's): norms and residuals on 1/T of the tokens", o.sp);
  cli.option("recompute", 0, "what backward computes again instead of keeping: none, full (each layer from its input), "
             "selective (the attention core), comma-separated, or all; one case per strategy and mode", o.recompute);
  add_harness_options(cli, h);
  cli.alias("steps", "iters");
  if (!cli.parse(argc, argv)) return 0;
  if (o.backend == "cuda")
    throw UsageError("--backend cuda: the GPU training step is not built yet; strata-step trains on the CPU");
  if (o.threads > 1 && h.blas_threads > 1)
    throw UsageError("--threads and --blas-threads both above 1 would oversubscribe the cores");

  const ModelConfig model = model_of(o);
  const std::vector<Strategy> plan = strategies(o);
  const std::vector<Recompute> modes = recompute_modes(o.recompute);
  const Trainable trainable = [&] {
    try {
      return parse_trainable(o.trainable);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }();
  (void)trainable_units(model, trainable);  // refuses last:K beyond the model's layers
  const int world = world_size();
  if (world % o.tp != 0) throw UsageError("--tp " + std::to_string(o.tp) + " does not divide the " + std::to_string(world) + " ranks");
  try {
    (void)tensor_shard(model, o.tp, 0);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--tp: ") + e.what());
  }
  const int dp_ranks = world / o.tp;
  if (o.sp && o.tp < 2) throw UsageError("--sp needs --tp 2 or more");
  if (o.group_size > 0 && world % o.group_size != 0)
    throw UsageError("--group-size " + std::to_string(o.group_size) + " does not divide the " + std::to_string(world) + " ranks");
  if (o.group_size > 0 && o.group_size % o.tp != 0)
    throw UsageError("--group-size " + std::to_string(o.group_size) + " is not a multiple of --tp " + std::to_string(o.tp) +
                     ": tensor-parallel groups stay inside a node");
  TrainConfig config;
  config.model = model, config.seq = o.seq, config.accumulation = o.accumulation, config.trainable = trainable;
  config.micro_batch = o.micro_batch;
  if (o.global_batch > 0) {
    const int64_t per_step = static_cast<int64_t>(dp_ranks) * o.accumulation;
    if (o.global_batch % per_step != 0)
      throw UsageError("--global-batch " + std::to_string(o.global_batch) + " is not divisible by " + std::to_string(dp_ranks) +
                       " data-parallel ranks x " + std::to_string(o.accumulation) + " micro-batches");
    config.micro_batch = static_cast<int>(o.global_batch / per_step);
  }
  config.comm_algo = *coll::parse_algo(o.comm_algo);
  config.sequence_parallel = o.sp;
  if (o.sp && (static_cast<int64_t>(config.micro_batch) * o.seq) % o.tp != 0)
    throw UsageError("--sp: the " + std::to_string(static_cast<int64_t>(config.micro_batch) * o.seq) +
                     " tokens of a micro-batch do not divide among --tp " + std::to_string(o.tp) + " ranks");
  config.overlap = o.overlap == "on";
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

  coll::ProcessGroups groups({o.tp, 1, dp_ranks}, o.group_size);
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
  // Before anything large is allocated: every strategy must fit.
  {
    const double limit = memory_limit(o, split_shared_memory(MPI_COMM_WORLD).size());
    double worst = 0;
    std::string worst_name, parts;
    for (const AxisPoint& point : points) {
      TrainConfig c = config;
      c.strategy = strategy_of(point), c.recompute = mode_of(point);
      const MemoryUse e = memory_estimate(c, shape);
      const double total = e.params + e.grads + e.optimizer + e.activations + e.workspace + e.comm_buffers;
      if (total > worst) {
        worst = total, worst_name = c.strategy.name() + (c.recompute == Recompute::none
                                                             ? "" : std::string(" with ") + name(c.recompute) + " recomputation");
        parts = "parameters " + gib(e.params) + ", gradients " + gib(e.grads) + ", optimizer " + gib(e.optimizer) +
                ", activations " + gib(e.activations + e.workspace) + ", communication buffers " + gib(e.comm_buffers);
      }
    }
    const double over = allreduce_max(MPI_COMM_WORLD, worst > limit ? 1.0 : 0.0);
    if (over > 0)
      throw UsageError("strategy " + worst_name + " needs about " + gib(worst) + " per rank (" + parts + "), above the limit of " +
                       (std::isfinite(limit) ? gib(limit) : std::string("?")) +
                       (o.memory_limit_gib > 0 ? " (--memory-limit)" : " (available memory over the node's ranks)") +
                       ": use a smaller model, micro-batch or sequence, or a sharded strategy");
  }
  config.runtime.library = o.library == "onednn" ? cpu_gemm::Backend::onednn : cpu_gemm::Backend::openblas;

  Run run("strata-step", argc, argv, h, cli.resolved_json(), "cpu");
  if (o.library == "auto") config.runtime.library = run.context().machine.description.default_gemm;
  StepRecorder recorder(run);
  run.set_case_count(static_cast<int>(points.size()));
  const double tokens_per_step = static_cast<double>(global_rows) * o.seq;
  const double flop_per_rank = model_flops_per_token(model, o.seq) * tokens_per_step / world;
  const PeakFigure& fp32 = run.context().machine.description.fp32;
  const double peak = fp32.per_rank(o.threads);
  const bool counts_bytes = config.comm_algo != coll::Algo::library;

  axes.declare_columns(run.cases());
  run.cases()
      .add_column("flop", ColumnKind::float64, "FLOP", "model FLOPs per rank per step: (6N + 6Lhs) x tokens / ranks")
      .add_column("flop_recompute", ColumnKind::float64, "FLOP",
                  "recomputed FLOPs per rank per step: full (2 N_layers + 2Lhs), selective (2Lhs) per token x tokens / ranks");
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
                peak_source(fp32, o.threads).c_str());
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
    const double recompute_flop_per_rank = recompute_flops_per_token(model, o.seq, mode) * tokens_per_step / world;
    MemoryFigures peak_memory;
    std::vector<double> samples;
    std::vector<StepStats> timed;
    double first_loss = NAN, last_loss = NAN;
    {
      reset_memory_peaks();
      Trainer trainer(c, groups, *data);
      double spent = 0;
      for (int k = 0; k < h.warmup + h.iters; ++k) {
        const bool timing = k >= h.warmup;
        const int iteration = k - h.warmup;
        STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        timer.start();
        StepStats stats = trainer.step(k + 1, timing && iteration < o.timeline_steps);
        const double elapsed = timer.stop();
        const double slowest = allreduce_max(MPI_COMM_WORLD, elapsed);
        if (k == 0) first_loss = stats.loss;
        last_loss = stats.loss;
        if (run.is_root()) {
          const double tok_s = tokens_per_step / slowest;
          std::printf("%s step %4d/%d | loss %.4f | norm %.4f | lr %.2e | %9.2f ms | %9.0f tok/s | MFU %5.2f%%%s\n",
                      label.c_str(), k + 1, h.warmup + h.iters, stats.loss, stats.grad_norm, stats.lr, slowest * 1e3,
                      tok_s, peak > 0 ? 100 * flop_per_rank / (slowest * peak) : 0.0, timing ? "" : " (warm-up)");
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
      peak_memory = memory_peak();
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
        per_step([](const StepStats& s) { return s.tp_comm_seconds; })};
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
    const MemoryUse formula_memory = memory_estimate(c, shape);
    std::vector<double> measured_memory, formula_memory_max, memory_ratio;
    for (MemoryCategory cat : kCategories) {
      measured_memory.push_back(allreduce_max(MPI_COMM_WORLD, peak_memory[cat]));
      formula_memory_max.push_back(allreduce_max(MPI_COMM_WORLD, formula_of(formula_memory, cat)));
      memory_ratio.push_back(formula_memory_max.back() > 0 ? measured_memory.back() / formula_memory_max.back() : NAN);
    }

    CaseResult r = run.record(samples, wrong && rank == 0 ? 1 : 0, "strategy " + label,
        [&](Table& row) {
          axes.fill(row, point);
          row.set("flop", flop_per_rank).set("flop_recompute", recompute_flop_per_rank);
        },
        [&](Table& row, const CaseResult& res) {
          set_flop_rates(row, flop_per_rank, res, world, peak);
          const double step = res.rankmax.median;
          row.set("tokens_per_s", tokens_per_step / step)
              .set("mfu", peak > 0 ? flop_per_rank / (step * peak) : 0.0)
              .set("hfu", peak > 0 ? (flop_per_rank + recompute_flop_per_rank) / (step * peak) : 0.0)
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
          row.set("sent_intra", counts_bytes ? sent_intra : NAN).set("sent_inter", counts_bytes ? sent_inter : NAN)
              .set("sent_intra_formula", formula_intra).set("sent_inter_formula", formula_inter);
        });
    recorder.write_case(r.index);
    if (run.is_root()) {
      const double step = r.rankmax.median;
      const double states = measured_memory[0] + measured_memory[1] + measured_memory[2];
      const double states_formula = formula_memory.params + formula_memory.grads + formula_memory.optimizer;
      std::printf("# %s: step %.2f ms (median of %d, max over ranks) | %.0f tok/s | MFU %.2f%% | exposed comm %.1f%% | "
                  "model states %sB/rank (formula %sB) | sent/rank intra %s, inter %s (ring formula %s, %s)%s%s\n",
                  label.c_str(), step * 1e3, r.iterations, tokens_per_step / step,
                  peak > 0 ? 100 * flop_per_rank / (step * peak) : 0.0, 100 * phase_medians[3] / step, format_si(states).c_str(),
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
