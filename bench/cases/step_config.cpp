#include "bench/cases/step_config.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <stdexcept>

#include "bench/harness/check.h"
#include "bench/harness/cli.h"
#include "collectives/process_group.h"
#include "train/gpt.h"
#include "train/partition.h"
#include "train/schedule.h"

namespace strata {

using namespace strata::train;

void add_model_flags(Cli& cli, StepFlags& o) {
  cli.option("model", 'm', "model preset (tiny, gpt2-124m, gpt2-350m, ..., gpt3-1.3b, ...)", o.model);
  cli.option("layers", 0, "layers (0: the preset's)", o.layers, 0);
  cli.option("hidden", 0, "hidden size (0: the preset's)", o.hidden, 0);
  cli.option("heads", 0, "attention heads (0: the preset's)", o.heads, 0);
  cli.option("kv-heads", 0, "key/value heads, grouped-query (0: the preset's, or --heads)", o.kv_heads, 0);
  cli.option("vocab", 0, "vocabulary (0: the preset's)", o.vocab, 0);
  cli.option("mlp-hidden", 0, "MLP width (0: the preset's, 4 x hidden)", o.mlp_hidden, 0);
  cli.option("seq", 's', "sequence length", o.seq, 1);
  cli.option("positions", 0, "position table (0: the preset's; a custom shape's at least --seq)", o.positions, 0);
}

namespace {

// The algorithms the process groups run every collective of the step with (allreduce, allgather, reduce_scatter).
std::vector<coll::Algo> step_algorithms() {
  std::vector<coll::Algo> algos;
  for (coll::Algo a : coll::kAllAlgos)
    if (coll::Group::supports(coll::Operation::allreduce, a) && coll::Group::supports(coll::Operation::allgather, a) &&
        coll::Group::supports(coll::Operation::reduce_scatter, a))
      algos.push_back(a);
  return algos;
}

}  // namespace

void add_batch_flags(Cli& cli, StepFlags& o) {
  cli.option("micro-batch", 'b', "rows per rank per micro-batch", o.micro_batch, 1);
  cli.option("accumulation", 'a', "micro-batches per optimizer step", o.accumulation, 1);
  cli.option("global-batch", 0, "rows per step over all ranks (sets --micro-batch; 0: dp x accumulation x micro-batch)",
             o.global_batch, 0);
  cli.option("paro", 0, "PaRO strategies P.G.OS from N, I, G (e.g. NNG,IIG) or all", o.paro);
  cli.option("zero", 'z', "ZeRO stages 0-3 (comma-separated) or all; default 0 when --paro is not given", o.zero);
  cli.option("group-size", 'g', "ranks per group (an emulated node) for I strategies; 0: real nodes", o.group_size, 0);
  cli.option("trainable", 0, "all, a fraction of the layers from the last (0.25), or last:K", o.trainable);
  cli.choice("comm-algo", 0, "algorithms of the step's collectives", o.comm_algo, names_of(step_algorithms()));
  cli.choice("overlap", 0, "reduce gradients during backward (as Megatron-Core's --overlap-grad-reduce) and gather "
             "sharded parameters ahead", o.overlap, {"on", "off"});
}

void add_grid_flags(Cli& cli, StepFlags& o) {
  cli.option("tp", 0, "tensor-parallel degree T (Megatron-LM's split; T consecutive ranks, inside a node); the "
             "data-parallel degree is the ranks over T x P", o.tp, 1);
  cli.option("pp", 0, "pipeline stages P (pipeline ranks)", o.pp, 1);
  cli.option("grid", 0, "the whole grid instead of --tp/--pp: tp=T,pp=P,dp=D (dp left out: the ranks over T x P)", o.grid);
  cli.option("grid-order", 0, "order of the grid's dimensions, fastest varying first (tp inside a node by default)", o.grid_order);
  cli.flag("sp", 0, "sequence parallelism with --tp (Megatron-LM's): norms and residuals on 1/T of the tokens", o.sp);
  cli.choice("schedule", 0, "pipeline schedule", o.schedule, names_of(kAllSchedules));
  cli.option("virtual-stages", 0, "model chunks per pipeline rank v (interleaved)", o.virtual_stages, 1);
  cli.option("stage-layers", 0, "layers of each of the P x v stages, comma-separated (default: L / (P v) each)", o.stage_layers);
}

std::vector<Recompute> recompute_modes(const std::string& text, bool pipeline) {
  if (text == "all" && pipeline) return {Recompute::none, Recompute::full, Recompute::selective, Recompute::overlap};
  if (text == "all") return {Recompute::none, Recompute::full, Recompute::selective};
  std::vector<Recompute> out;
  for (const std::string& item : split_list(text, "--recompute")) {
    const std::optional<Recompute> mode = parse_recompute(item);
    if (!mode) throw UsageError("--recompute: unknown mode '" + item + "' (" + join_names(names_of(kAllRecomputes), ", ", ", ") + " or all)");
    out.push_back(*mode);
  }
  return out;
}

std::vector<Strategy> strategies(const StepFlags& o) {
  if (!o.paro.empty() && !o.zero.empty()) throw UsageError("--paro and --zero both given: choose one");
  std::vector<Strategy> out;
  if (o.paro == "all") return runnable_strategies();
  if (o.zero == "all") return {zero_stage(0), zero_stage(1), zero_stage(2), zero_stage(3)};
  for (const std::string& item : split_list(o.paro.empty() ? (o.zero.empty() ? "0" : o.zero) : o.paro, o.paro.empty() ? "--zero" : "--paro")) {
    Strategy s = o.paro.empty() ? zero_stage(static_cast<int>(parse_int(item, "--zero"))) : parse_strategy(item);
    if (const std::string why = refusal_reason(s); !why.empty())
      throw UsageError("strategy " + s.name() + " is not run: " + why);
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

ModelConfig model_of(const StepFlags& o) {
  ModelConfig m = preset(o.model);
  auto over = [](int& field, int value) {
    if (value > 0) field = value;
  };
  over(m.layers, o.layers), over(m.hidden, o.hidden), over(m.heads, o.heads), over(m.vocab, o.vocab);
  over(m.mlp_hidden, o.mlp_hidden);
  m.kv_heads = o.kv_heads > 0 ? o.kv_heads : (o.heads > 0 ? m.heads : m.kv_heads);
  const bool custom = o.layers || o.hidden || o.heads || o.kv_heads || o.vocab || o.mlp_hidden;
  if (custom) m.name += "+custom";
  // A shape of one's own trains at the sequence it is given, as Megatron-LM sizes its position table.
  if (o.positions > 0) m.max_seq = o.positions;
  else if (custom) m.max_seq = std::max(m.max_seq, o.seq);
  if (const std::string problem = m.validate(); !problem.empty()) throw UsageError("model: " + problem);
  if (o.seq > m.max_seq)
    throw UsageError("--seq " + std::to_string(o.seq) + " exceeds the model's position table (" + std::to_string(m.max_seq) +
                     "; --positions sets it)");
  return m;
}

StepPlan plan_step(StepFlags& o, int world) {
  StepPlan plan;
  plan.model = model_of(o);
  const ModelConfig& model = plan.model;
  plan.strategies = strategies(o);
  plan.modes = recompute_modes(o.recompute, o.pp > 1 || o.grid.find("pp=") != std::string::npos);
  plan.trainable = [&] {
    try {
      return parse_trainable(o.trainable);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }();
  (void)trainable_units(model, plan.trainable);  // refuses last:K beyond the model's layers
  coll::GridShape grid{o.tp, o.pp, 0};
  if (!o.grid.empty()) {
    if (o.tp != 1 || o.pp != 1) throw UsageError("--grid and --tp/--pp both given: choose one");
    try {
      grid = coll::parse_grid(o.grid);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--grid: ") + e.what());
    }
    if (o.grid.find("dp=") == std::string::npos) grid.dp = 0;
  }
  if (grid.dp == 0) {
    if (world % (grid.tp * grid.pp) != 0)
      throw UsageError("--tp " + std::to_string(grid.tp) + (grid.pp > 1 ? " x --pp " + std::to_string(grid.pp) : "") +
                       " does not divide the " + std::to_string(world) + " ranks");
    grid.dp = world / (grid.tp * grid.pp);
  }
  if (grid.size() != world)
    throw UsageError("--grid " + coll::format_grid(grid) + " has " + std::to_string(grid.size()) + " ranks, the job " +
                     std::to_string(world));
  try {
    (void)coll::parse_grid_order(o.grid_order);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--grid-order: ") + e.what());
  }
  o.tp = grid.tp;
  try {
    (void)tensor_shard(model, o.tp, 0);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--tp: ") + e.what());
  }
  const int dp_ranks = grid.dp;
  if (o.sp && o.tp < 2) throw UsageError("--sp needs --tp 2 or more");
  if (o.group_size > 0 && world % o.group_size != 0)
    throw UsageError("--group-size " + std::to_string(o.group_size) + " does not divide the " + std::to_string(world) + " ranks");
  if (o.group_size > 0 && o.group_size % o.tp != 0)
    throw UsageError("--group-size " + std::to_string(o.group_size) + " is not a multiple of --tp " + std::to_string(o.tp) +
                     ": tensor-parallel groups stay inside a node");
  TrainConfig& config = plan.config;
  config.model = model, config.seq = o.seq, config.accumulation = o.accumulation, config.trainable = plan.trainable;
  config.micro_batch = o.micro_batch;
  if (o.global_batch > 0 && o.micro_batch_given && !o.accumulation_given) {
    // Megatron-LM's reading: the global batch and the micro-batch are given, the micro-batches per step follow.
    const int64_t per_micro_batch = static_cast<int64_t>(dp_ranks) * o.micro_batch;
    if (o.global_batch % per_micro_batch != 0)
      throw UsageError("--global-batch " + std::to_string(o.global_batch) + " is not divisible by " + std::to_string(dp_ranks) +
                       " data-parallel ranks x --micro-batch " + std::to_string(o.micro_batch));
    if (o.global_batch / per_micro_batch > std::numeric_limits<int>::max())
      throw UsageError("--global-batch " + std::to_string(o.global_batch) + " over " + std::to_string(per_micro_batch) +
                       " rows a micro-batch is more micro-batches than a step can count");
    config.accumulation = static_cast<int>(o.global_batch / per_micro_batch);
    o.accumulation = config.accumulation;
  } else if (o.global_batch > 0) {
    const int64_t per_step = static_cast<int64_t>(dp_ranks) * o.accumulation;
    if (o.global_batch % per_step != 0)
      throw UsageError("--global-batch " + std::to_string(o.global_batch) + " is not divisible by " + std::to_string(dp_ranks) +
                       " data-parallel ranks x " + std::to_string(o.accumulation) + " micro-batches");
    const int64_t from_global = o.global_batch / per_step;
    if (o.micro_batch_given && from_global != o.micro_batch)
      throw UsageError("--global-batch " + std::to_string(o.global_batch) + " over " + std::to_string(dp_ranks) +
                       " data-parallel ranks x --accumulation " + std::to_string(o.accumulation) + " is a micro-batch of " +
                       std::to_string(from_global) + ", but --micro-batch says " + std::to_string(o.micro_batch) +
                       ": give two of the three");
    if (from_global > std::numeric_limits<int>::max())
      throw UsageError("--global-batch " + std::to_string(o.global_batch) + " is a micro-batch of " +
                       std::to_string(from_global) + " rows, more than a step can count");
    config.micro_batch = static_cast<int>(from_global);
  }
  config.comm_algo = *coll::parse_algo(o.comm_algo);
  config.sequence_parallel = o.sp;
  if (o.sp && (static_cast<int64_t>(config.micro_batch) * o.seq) % o.tp != 0)
    throw UsageError("--sp: the " + std::to_string(static_cast<int64_t>(config.micro_batch) * o.seq) +
                     " tokens of a micro-batch do not divide among --tp " + std::to_string(o.tp) + " ranks");
  config.overlap = o.overlap == "on";
  config.schedule = *parse_schedule(o.schedule);
  config.virtual_stages = o.virtual_stages;
  if (!o.stage_layers.empty()) {
    if (o.partition == "balanced") throw UsageError("--stage-layers and --partition balanced both given: choose one");
    for (const std::string& item : split_list(o.stage_layers, "--stage-layers"))
      config.stage_layers.push_back(static_cast<int>(parse_int(item, "--stage-layers")));
  }
  if (const std::string why = schedule_refusal(config.schedule, {grid.pp, o.accumulation, o.virtual_stages}); !why.empty())
    throw UsageError("--schedule " + o.schedule + " on " + std::to_string(grid.pp) + " stage(s), " +
                     std::to_string(o.accumulation) + " micro-batch(es), " + std::to_string(o.virtual_stages) +
                     " chunk(s) per rank: " + why);
  try {
    if (o.partition == "balanced") (void)even_partition(model.layers, grid.pp * o.virtual_stages);
    else (void)stage_partition(model, grid.pp * o.virtual_stages, config.stage_layers);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  plan.grid = grid;
  plan.global_rows = static_cast<int64_t>(dp_ranks) * o.accumulation * config.micro_batch;
  return plan;
}

}  // namespace strata
