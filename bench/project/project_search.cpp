// strata-project search: ranks the ways to train a model on N devices of a described system by predicted step time
// (project/search.h), prints the top k with their breakdowns and what was refused and why, and stores the top k as a
// run's `search` table (results/SCHEMA.md). --compare-paro prints PaRO's strategy rule beside the search over a grid of
// scenarios (table `paro_rule`); --bench runs the 175B search and judges its rate (exit 3 below 500 configurations/s).
#include "bench/project/project_search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/harness/check.h"
#include "bench/harness/cli.h"
#include "bench/harness/context.h"
#include "bench/project/system_json.h"
#include "bench/harness/harness.h"
#include "bench/harness/output_files.h"
#include "bench/project/prediction.h"
#include "kernels/cpu_gemm.h"
#include "project/search.h"
#include "results/writer.h"
#include "train/trainer.h"

namespace strata {

namespace {

// The run attribute `benchmark` of a search run (results/SCHEMA.md).
constexpr const char* kSearchBenchmark = "strata-project search";


constexpr double kTargetRate = 500;  // runnable configurations per second, GPT-3 175B on 1024 GPUs (make bench)

// Shapes the comparison uses beside the presets: LLaMA 7B and 65B's layers, width and heads with the GELU MLP of
// this model widened to 1.5 x LLaMA's SwiGLU width, so its two matrices hold the parameters of LLaMA's three, and
// LLaMA's 32,000-token vocabulary (train/model_config.h has no SwiGLU).
std::optional<train::ModelConfig> llama_like(const std::string& name) {
  train::ModelConfig m;
  if (name == "llama-7b-like") {
    m.layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 32, m.mlp_hidden = 16512;
  } else if (name == "llama-65b-like") {
    m.layers = 80, m.hidden = 8192, m.heads = 64, m.kv_heads = 64, m.mlp_hidden = 33024;
  } else {
    return std::nullopt;
  }
  m.name = name, m.vocab = 32000, m.max_seq = 2048;
  return m;
}

train::ModelConfig model_named(const std::string& name) {
  if (auto m = llama_like(name)) return *m;
  return train::preset(name);  // std::invalid_argument naming the presets
}

// A memory size: a number of bytes, or with a unit: KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (1024).
double parse_memory(const std::string& text) {
  static const std::vector<std::pair<std::string, double>> units = {
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"KB", 1e3},     {"MB", 1e6},        {"GB", 1e9},           {"TB", 1e12},          {"B", 1}};
  for (const auto& [unit, scale] : units)
    if (text.size() > unit.size() && text.ends_with(unit)) {
      const double value = parse_double(text.substr(0, text.size() - unit.size()), "--memory-limit");
      if (!(value > 0)) throw UsageError("--memory-limit must be positive (got " + text + ")");
      return value * scale;
    }
  const double value = parse_double(text, "--memory-limit");
  if (!(value > 0)) throw UsageError("--memory-limit must be positive (got " + text + ")");
  return value;
}

std::vector<int> int_list(const std::string& text, const std::string& what, int minimum) {
  std::vector<int> values;
  for (const std::string& part : split_list(text, what)) {
    const int64_t v = parse_int(part, what);
    if (v < minimum || v > 1 << 24) throw UsageError(what + ": " + part + " is out of range (at least " + std::to_string(minimum) + ")");
    values.push_back(static_cast<int>(v));
  }
  if (values.empty()) throw UsageError(what + " needs at least one value");
  return values;
}

std::string gb(double bytes) { return format_fixed(bytes / 1e9, 1); }

struct Options {
  std::string system_path, model, output, memory_limit, dtype = "bf16", trainable = "all";
  std::string micro_batches = "1,2,4,8", schedules = "gpipe,1f1b,interleaved", recompute = "none,full,selective";
  std::string strategies = "all", tp, pp, sequence_parallel = "on", grad_reduce_dtype = "auto";
  std::string attention = "flash", loss = "fused", dropout = "on", sharding_buffers = "strata";
  int gpus = 0, global_batch = 0, seq = 0, top = 10, interleave = 2, threads = 0;
  double target = kTargetRate;
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, vocab = 50257, mlp_hidden = 0;
  bool no_prune = false, quiet = false, bench = false, smoke = false, compare_paro = false;
  std::string paro_models = "gpt3-1.3b,llama-7b-like,llama-65b-like", paro_trainable = "all,0.0625",
              paro_nodes = "2,4,16", paro_micro_batches = "1,4,16", paro_ratios = "system,1,4,16",
              paro_recompute = "full";
};

// The model: a preset (or a LLaMA-like shape), or the dimensions.
train::ModelConfig resolve_model(const Options& o) {
  const bool dims = o.layers > 0 || o.hidden > 0 || o.heads > 0;
  if (!o.model.empty() && dims) throw UsageError("give --model or the dimensions (--layers, --hidden, --heads), not both");
  train::ModelConfig m;
  if (!o.model.empty()) {
    m = model_named(o.model);
  } else {
    if (o.layers < 1 || o.hidden < 1 || o.heads < 1)
      throw UsageError("give --model NAME, or --layers, --hidden and --heads (with --kv-heads, --vocab, --mlp-hidden)");
    m.name = "custom", m.layers = o.layers, m.hidden = o.hidden, m.heads = o.heads;
    m.kv_heads = o.kv_heads > 0 ? o.kv_heads : o.heads;
    m.vocab = o.vocab, m.mlp_hidden = o.mlp_hidden;
    m.max_seq = std::max(o.seq, 1);
  }
  if (const std::string problem = m.validate(); !problem.empty()) throw UsageError("model: " + problem);
  return m;
}

std::vector<train::Strategy> resolve_strategies(const std::string& text) {
  if (text == "all") return {};
  std::vector<train::Strategy> out;
  for (const std::string& part : split_list(text, "--strategies")) {
    const train::Strategy s = train::parse_strategy(part);  // std::invalid_argument naming the bad letter
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

project::SearchSpace resolve_space(const Options& o, const project::System& system) {
  project::SearchSpace space;
  space.model = resolve_model(o);
  if (o.gpus < 1) throw UsageError("--gpus N is required: the devices to train on");
  if (o.gpus > train::kMaxTracedRanks)
    throw UsageError("--gpus " + std::to_string(o.gpus) + ": more than the " + std::to_string(train::kMaxTracedRanks) +
                     " ranks a trace covers");
  space.devices = o.gpus;
  space.seq = o.seq > 0 ? o.seq : space.model.max_seq;
  if (space.seq > space.model.max_seq)
    throw UsageError("--seq " + std::to_string(space.seq) + " exceeds the model's position table (" +
                     std::to_string(space.model.max_seq) + ")");
  if (o.global_batch < 1) throw UsageError("--global-batch B is required: sequences per step");
  space.global_batch = o.global_batch;
  space.trainable = train::parse_trainable(o.trainable);
  train::trainable_units(space.model, space.trainable);
  space.micro_batch_sizes = int_list(o.micro_batches, "--micro-batches", 1);
  space.schedules.clear();
  for (const std::string& part : split_list(o.schedules, "--schedules")) {
    const auto s = train::parse_schedule(part);
    if (!s) throw UsageError("--schedules: unknown schedule '" + part + "' (gpipe, 1f1b, interleaved)");
    space.schedules.push_back(*s);
  }
  space.interleave_chunks = o.interleave;
  space.recompute.clear();
  for (const std::string& part : split_list(o.recompute, "--recompute")) {
    const auto r = train::parse_recompute(part);
    if (!r) throw UsageError("--recompute: unknown mode '" + part + "' (none, full, selective)");
    if (*r == train::Recompute::overlap)
      throw UsageError("--recompute overlap needs a measured placement (strata-step --recompute-policy): the search "
                       "takes none, full and selective");
    space.recompute.push_back(*r);
  }
  space.strategies = resolve_strategies(o.strategies);
  if (!o.tp.empty()) space.tp = int_list(o.tp, "--tp", 1);
  if (!o.pp.empty()) space.pp = int_list(o.pp, "--pp", 1);
  space.sequence_parallel = parse_bool(o.sequence_parallel, "--sequence-parallel");
  if (!system.device.compute.count(o.dtype)) {
    std::string have;
    for (const auto& [dtype, peak] : system.device.compute) have += (have.empty() ? "" : ", ") + dtype;
    throw UsageError("the system's device has no " + o.dtype + " compute (it has " + have + ")");
  }
  space.dtype = o.dtype;
  space.gradient_reduction_bytes = gradient_reduction_bytes(o.grad_reduce_dtype);
  check_attention(system, o.attention, "--attention");
  space.attention = o.attention, space.loss = o.loss, space.dropout = o.dropout == "on";
  space.sharding_buffers = o.sharding_buffers;
  if (!o.memory_limit.empty()) {
    space.memory_limit = parse_memory(o.memory_limit);
  } else if (system.device.memory_capacity) {
    space.memory_limit = system.device.memory_capacity->value;
  } else {
    throw UsageError("the system description gives no device.memory_capacity: pass --memory-limit BYTES (e.g. 80GB)");
  }
  space.top = o.top;
  space.prune = !o.no_prune;
  const int hardware_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.threads > hardware_threads)
    throw UsageError("--threads " + std::to_string(o.threads) + ": more than this machine's " +
                     std::to_string(hardware_threads) + " hardware threads (each holds a configuration's trace)");
  space.threads = o.threads > 0 ? o.threads : hardware_threads;
  return space;
}

// The exposed communication of the search's table: tensor, pipeline and data-parallel groups by role, the rest.
double exposed(const project::Evaluation& e, const std::string& role) {
  const auto found = e.exposed_s.find(role);
  return found == e.exposed_s.end() ? 0 : found->second;
}
double exposed_other(const project::Evaluation& e) {
  double other = 0;
  for (const auto& [role, seconds] : e.exposed_s)
    if (role != "tp" && role != "pp" && role != "dp" && role != "dp_intra" && role != "dp_inter") other += seconds;
  return other;
}

void print_top(const project::SearchSpace& space, const project::SearchResult& r) {
  std::printf("# top %zu by predicted step time (the simulator's, project/simulate.h): compute, exposed communication per "
              "group role and idle are means over ranks and add up to the step; memory: the pipeline rank that needs "
              "the most, %s; MFU: model FLOPs 6N + 6Lhs per token over the step and every device's %s peak%s\n",
              r.top.size(), project::mixed_precision(space.dtype) ? "mixed precision (2/2/12 B per parameter, 16-bit activations)"
                                                               : "fp32 (4/4/8 B per parameter, fp32 activations)",
              space.dtype.c_str(),
              space.gradient_reduction_bytes > 0
                  ? ("; gradients reduced in " + std::to_string(space.gradient_reduction_bytes) + "-byte elements").c_str()
                  : "");
  std::printf("%4s  %-52s %9s %9s %8s %8s %8s %8s %8s %8s %9s %6s %11s %9s\n", "rank", "configuration", "step s",
              "compute", "tp", "pp", "dp", "dp_intra", "dp_inter", "idle", "memory GB", "MFU %", "tokens/s", "bound s");
  int rank = 0;
  for (const project::Evaluation& e : r.top) {
    std::printf("%4d  %-52s %9.4f %9.4f %8.4f %8.4f %8.4f %8.4f %8.4f %8.4f %9s %6.2f %11.0f %9.4f\n", ++rank,
                e.candidate.label().c_str(), e.step_s, e.compute_s, exposed(e, "tp"), exposed(e, "pp") + exposed_other(e),
                exposed(e, "dp"), exposed(e, "dp_intra"), exposed(e, "dp_inter"), e.idle_s, gb(e.memory.total()).c_str(),
                100 * e.mfu, e.tokens_per_s, e.lower_bound_s);
  }
}

// Configurations the executor runs: each ruled out on memory, equivalent to another strategy, pruned or simulated.
std::int64_t runnable(const project::SearchResult& r) {
  const auto memory = r.refused.find(project::RefusalKind::memory);
  return r.fitting + r.equivalent + (memory == r.refused.end() ? 0 : memory->second);
}

void print_counts(const project::SearchResult& r) {
  const double s = r.seconds > 0 ? r.seconds : 1e-9;
  std::printf("# configurations: %lld considered in %.2f s (%.0f/s): %lld refused, %lld equivalent to another strategy "
              "on their layout, %lld fit in memory; of these %lld simulated and %lld pruned by their lower bound (%s)\n",
              static_cast<long long>(r.enumerated), r.seconds, r.enumerated / s,
              static_cast<long long>(r.enumerated - r.fitting - r.equivalent), static_cast<long long>(r.equivalent),
              static_cast<long long>(r.fitting), static_cast<long long>(r.simulated), static_cast<long long>(r.pruned),
              r.pruned ? ("each at least " + format_fixed(r.least_pruned_bound_s, 4) + " s, the k-th best step or more").c_str()
                       : "none");
  std::printf("# rate: %.0f runnable configurations/s (each ruled out on memory, equivalent, pruned or simulated), "
              "%.0f fitting/s, %.1f simulated/s; %lld probe traces for the bounds (%.2f s), tracing and simulating %.2f s, "
              "%.1f M operations traced, %.1f M simulated after compaction\n",
              runnable(r) / s, r.fitting / s, r.simulated / s, static_cast<long long>(r.probes), r.bound_seconds,
              r.simulate_seconds, r.traced_operations / 1e6, r.simulated_operations / 1e6);
  for (const auto& [kind, count] : r.refused)
    if (count > 0) std::printf("# refused (%s): %lld\n", project::name(kind), static_cast<long long>(count));
  for (const auto& [why, count] : r.refusal_reasons)
    std::printf("#   %s: %lld\n", why.c_str(), static_cast<long long>(count));
  for (const auto& [which, count] : r.equivalent_to)
    std::printf("# equivalent (%s): %lld\n", which.c_str(), static_cast<long long>(count));
}

Table search_table(const project::SearchSpace& space, const project::SearchResult& r, const std::string& system_name) {
  Table t("search");
  t.add_column("rank", ColumnKind::int64, "1", "by predicted step time, 1 the fastest");
  t.add_column("label", ColumnKind::string, "");
  t.add_column("system", ColumnKind::string, "");
  t.add_column("model", ColumnKind::string, "");
  t.add_column("devices", ColumnKind::int64, "1");
  t.add_column("global_batch", ColumnKind::int64, "1", "sequences per step");
  t.add_column("seq", ColumnKind::int64, "1");
  for (const char* c : {"tp", "pp", "dp"}) t.add_column(c, ColumnKind::int64, "1");
  t.add_column("strategy", ColumnKind::string, "", "PaRO's P.G.OS letters (ZeRO-1/2/3: NNG, NGG, GGG)");
  t.add_column("micro_batch", ColumnKind::int64, "1", "sequences per micro-batch per data-parallel rank");
  t.add_column("micro_batches", ColumnKind::int64, "1", "per step");
  t.add_column("schedule", ColumnKind::string, "");
  t.add_column("virtual_stages", ColumnKind::int64, "1");
  t.add_column("recompute", ColumnKind::string, "");
  t.add_column("sequence_parallel", ColumnKind::int64, "1");
  t.add_column("dtype", ColumnKind::string, "");
  t.add_column("gradient_reduction_bytes", ColumnKind::int64, "B",
               "of the data-parallel gradient reductions' elements (0: the step's element size)");
  t.add_column("attention", ColumnKind::string, "",
               "how attention runs: flash, unfused or a kernel of the description");
  t.add_column("loss", ColumnKind::string, "", "how the cross entropy runs: fused, fp32 or fp32-fused");
  t.add_column("dropout", ColumnKind::int64, "1", "1: dropout masks in the memory estimate");
  t.add_column("sharding_buffers", ColumnKind::string, "",
               "how the memory estimate holds sharded states in flight: strata, fsdp or deepspeed");
  t.add_column("step", ColumnKind::float64, "s", "predicted step time: the last op's end over all ranks (project/simulate.h)");
  const std::string mean = "mean over ranks, each traced rank weighted by the ranks it stands for";
  t.add_column("compute", ColumnKind::float64, "s", mean);
  for (const char* role : {"tp", "pp", "dp", "dp_intra", "dp_inter", "other"})
    t.add_column(std::string("exposed_") + role, ColumnKind::float64, "s",
                 mean + "; exposed communication of the groups of this role (pp: transfers and the pipeline group)");
  t.add_column("idle", ColumnKind::float64, "s", mean);
  const std::string memory = std::string("the pipeline rank that needs the most; ") +
                             (project::mixed_precision(space.dtype) ? "mixed precision: states 2/2/12 B per parameter, "
                                                                      "16-bit activations, workspace and buffers"
                                                                    : "fp32: states 4/4/8 B per parameter");
  for (const char* c : {"params", "grads", "optimizer", "activations", "workspace", "comm_buffers", "total"})
    t.add_column(std::string("memory_") + c, ColumnKind::float64, "B", memory);
  t.add_column("memory_pp_rank", ColumnKind::int64, "1", "the pipeline rank of the memory columns");
  t.add_column("memory_limit", ColumnKind::float64, "B");
  t.add_column("tokens_per_s", ColumnKind::float64, "1/s", "global batch x seq tokens over the predicted step");
  t.add_column("mfu", ColumnKind::float64, "1", "model FLOPs (6N + 6Lhs per token) / (step x devices x peak of dtype)");
  t.add_column("lower_bound", ColumnKind::float64, "s", "the search's lower bound on the step (project/search.h)");
  t.add_column("operations", ColumnKind::int64, "1", "traced operations, every traced rank");
  t.add_column("simulated_operations", ColumnKind::int64, "1", "after compacting runs of compute");
  int rank = 0;
  for (const project::Evaluation& e : r.top) {
    const project::Candidate& c = e.candidate;
    t.set("rank", ++rank).set("label", c.label()).set("system", system_name).set("model", space.model.name);
    t.set("devices", space.devices).set("global_batch", space.global_batch).set("seq", space.seq);
    t.set("tp", c.tp).set("pp", c.pp).set("dp", c.dp).set("strategy", c.strategy.name());
    t.set("micro_batch", c.micro_batch).set("micro_batches", c.micro_batches).set("schedule", train::name(c.schedule));
    t.set("virtual_stages", c.virtual_stages).set("recompute", train::name(c.recompute));
    t.set("sequence_parallel", c.sequence_parallel ? 1 : 0).set("dtype", space.dtype);
    t.set("gradient_reduction_bytes", space.gradient_reduction_bytes);
    t.set("attention", space.attention).set("loss", space.loss).set("dropout", space.dropout ? 1 : 0);
    t.set("sharding_buffers", space.sharding_buffers);
    t.set("step", e.step_s).set("compute", e.compute_s);
    t.set("exposed_tp", exposed(e, "tp")).set("exposed_pp", exposed(e, "pp")).set("exposed_dp", exposed(e, "dp"));
    t.set("exposed_dp_intra", exposed(e, "dp_intra")).set("exposed_dp_inter", exposed(e, "dp_inter"));
    t.set("exposed_other", exposed_other(e)).set("idle", e.idle_s);
    const train::MemoryUse& m = e.memory.use;
    t.set("memory_params", m.params).set("memory_grads", m.grads).set("memory_optimizer", m.optimizer);
    t.set("memory_activations", m.activations).set("memory_workspace", m.workspace).set("memory_comm_buffers", m.comm_buffers);
    t.set("memory_total", e.memory.total()).set("memory_pp_rank", e.memory.pp_rank).set("memory_limit", space.memory_limit);
    t.set("tokens_per_s", e.tokens_per_s).set("mfu", e.mfu).set("lower_bound", e.lower_bound_s);
    t.set("operations", static_cast<int64_t>(e.operations)).set("simulated_operations", static_cast<int64_t>(e.simulated_operations));
    t.end_row();
  }
  return t;
}

// ---- PaRO's rule beside the search ----

struct ParoGrid {
  std::vector<project::ParoComparisonScenario> scenarios;
};

ParoGrid paro_grid(const Options& o) {
  ParoGrid grid;
  std::vector<std::pair<std::string, train::ModelConfig>> models;
  for (const std::string& name : split_list(o.paro_models, "--paro-models")) models.emplace_back(name, model_named(name));
  std::vector<std::pair<std::string, train::Trainable>> trainables;
  for (const std::string& name : split_list(o.paro_trainable, "--paro-trainable")) trainables.emplace_back(name, train::parse_trainable(name));
  const std::vector<int> nodes = int_list(o.paro_nodes, "--paro-nodes", 1);
  const std::vector<int> micro_batches = int_list(o.paro_micro_batches, "--paro-micro-batches", 1);
  std::vector<double> ratios;
  for (const std::string& part : split_list(o.paro_ratios, "--paro-ratios")) {
    const double ratio = part == "system" ? 0 : parse_double(part, "--paro-ratios");
    if (ratio < 0) throw UsageError("--paro-ratios: " + part + " is negative");
    ratios.push_back(ratio);
  }
  for (const auto& [model_name, model] : models)
    for (const auto& [trainable_name, trainable] : trainables) {
      train::trainable_units(model, trainable);
      for (int n : nodes)
        for (int m : micro_batches)
          for (double ratio : ratios)
            grid.scenarios.push_back({model_name, model, trainable_name, trainable, n, m, ratio});
    }
  return grid;
}

int compare_paro(const Options& o, const project::System& system, const std::string& output, int argc, char** argv,
                 const std::string& config) {
  const ParoGrid grid = paro_grid(o);
  const int micro_batch = int_list(o.micro_batches, "--micro-batches", 1).front();
  const auto recompute = train::parse_recompute(o.paro_recompute);
  if (!recompute || *recompute == train::Recompute::overlap)
    throw UsageError("--paro-recompute: none, full or selective");
  const int seq = o.seq > 0 ? o.seq : 2048;
  double limit = 0;
  if (!o.memory_limit.empty()) limit = parse_memory(o.memory_limit);
  else if (system.device.memory_capacity) limit = system.device.memory_capacity->value;
  else throw UsageError("the system description gives no device.memory_capacity: pass --memory-limit BYTES (e.g. 80GB)");
  if (!system.device.compute.count(o.dtype)) throw UsageError("the system's device has no " + o.dtype + " compute");
  for (const auto& s : grid.scenarios)
    if (seq > s.model.max_seq) throw UsageError("--seq " + std::to_string(seq) + " exceeds " + s.model_name + "'s position table");
  if (!output.empty()) validate_output_path(output);

  if (!o.quiet)
    std::printf("# PaRO's rule (project/paro_rule.h) against the search restricted to data parallelism (tp 1, pp 1, dp N, "
                "micro-batch %d of %d tokens, 1F1B, recompute %s, %s, memory limit %s GB) on %s; the rule's choice "
                "simulated beside the search's best (regret: rule / best - 1; no*: the rule's choice does not fit the search's memory "
                "estimate, which counts communication buffers)\n",
                micro_batch, seq, train::name(*recompute), o.dtype.c_str(), gb(limit).c_str(), system.name.c_str());
  std::printf("%-16s %-9s %5s %5s %6s %7s %-6s %-6s %-5s %10s %10s %8s %10s\n", "model", "trains", "nodes", "m", "B'/B",
              "fitting", "rule", "search", "agree", "rule s", "search s", "regret %", "rule T s");
  Table t("paro_rule");
  for (const char* c : {"model", "trainable", "system", "rule_choice", "search_choice"}) t.add_column(c, ColumnKind::string, "");
  t.add_column("nodes", ColumnKind::int64, "1");
  t.add_column("devices", ColumnKind::int64, "1");
  t.add_column("micro_batches", ColumnKind::int64, "1", "per step (A)");
  t.add_column("bandwidth_ratio", ColumnKind::float64, "1", "intra-node over inter-node bandwidth, B'/B");
  t.add_column("fitting", ColumnKind::int64, "1", "strategies that fit in memory (the search's estimate)");
  t.add_column("agree", ColumnKind::int64, "1", "1: the same strategy");
  t.add_column("same_step", ColumnKind::int64, "1", "1: the rule's choice simulates to the best step (the same or a tie)");
  t.add_column("rule_fits", ColumnKind::int64, "1", "1: the rule's choice fits the search's memory estimate too");
  t.add_column("rule_step", ColumnKind::float64, "s", "the simulated step of the rule's choice");
  t.add_column("search_step", ColumnKind::float64, "s", "the simulated step of the search's best");
  t.add_column("rule_total", ColumnKind::float64, "s", "the rule's T of its choice (project/paro_rule.h)");
  int agreed = 0, tied = 0, compared = 0;
  double worst_regret = 0;
  for (const project::ParoComparisonScenario& s : grid.scenarios) {
    const project::ParoComparisonRow row = project::compare_paro(system, s, micro_batch, seq, *recompute, o.dtype, limit);
    const bool both = !row.rule_choice.empty() && !row.search_choice.empty();
    const double regret = both && row.search_step_s > 0 ? row.rule_step_s / row.search_step_s - 1 : 0;
    if (both) {
      ++compared, agreed += row.agree ? 1 : 0, tied += row.same_step && !row.agree ? 1 : 0;
      worst_regret = std::max(worst_regret, regret);
    }
    std::printf("%-16s %-9s %5d %5d %6.1f %7d %-6s %-6s %-5s %10.4f %10.4f %8.2f %10.4g\n", s.model_name.c_str(),
                s.trainable_name.c_str(), s.nodes, s.micro_batches, row.bandwidth_ratio, row.fitting,
                row.rule_choice.empty() ? "-" : row.rule_choice.c_str(), row.search_choice.empty() ? "-" : row.search_choice.c_str(),
                !both ? "-" : row.agree ? "yes" : row.same_step ? "tie" : row.rule_fits ? "no" : "no*", row.rule_step_s, row.search_step_s,
                100 * regret, row.rule_total_s);
    std::fflush(stdout);
    t.set("model", s.model_name).set("trainable", s.trainable_name).set("system", system.name);
    t.set("rule_choice", row.rule_choice).set("search_choice", row.search_choice);
    t.set("nodes", s.nodes).set("devices", s.nodes * system.device.devices_per_node).set("micro_batches", s.micro_batches);
    t.set("bandwidth_ratio", row.bandwidth_ratio).set("fitting", row.fitting).set("agree", row.agree ? 1 : 0);
    t.set("same_step", row.same_step ? 1 : 0).set("rule_fits", row.rule_fits ? 1 : 0);
    t.set("rule_step", row.rule_step_s).set("search_step", row.search_step_s).set("rule_total", row.rule_total_s);
    t.end_row();
  }
  std::printf("# agreement: the same strategy in %d of %d scenarios where both choose (%.0f%%), a strategy of the same "
              "simulated step in %d more (%.0f%% together); worst regret of the rule's choice %.1f%%\n",
              agreed, compared, compared ? 100.0 * agreed / compared : 0.0, tied,
              compared ? 100.0 * (agreed + tied) / compared : 0.0, 100 * worst_regret);
  if (!output.empty()) {
    ProjectRun run(output, "search", argc, argv, config, {{"benchmark", kSearchBenchmark}});
    run.append(t);
    run.finish();
    if (!o.quiet) std::printf("# results: %s\n", output.c_str());
  }
  return 0;
}

}  // namespace

int project_search(int argc, char** argv) {
  Options o;
  Cli cli("strata-project search",
          "Every grid (tensor x pipeline x data parallel), PaRO/ZeRO strategy, micro-batch size, schedule and "
          "recomputation mode that runs and fits in memory, ranked by predicted step time (project/search.h).");
  cli.option("system", 0, "the system description (JSON, project/SYSTEM.md), or a shipped one by name (e.g. "
             "h100-sxm-ndr400)", o.system_path);
  cli.option("model", 0, "a model preset (strata-step's, or llama-7b-like, llama-65b-like)", o.model);
  cli.option("layers", 0, "a custom model's layers", o.layers, 0);
  cli.option("hidden", 0, "its hidden width", o.hidden, 0);
  cli.option("heads", 0, "its attention heads", o.heads, 0);
  cli.option("kv-heads", 0, "its key/value heads (default: heads)", o.kv_heads, 0);
  cli.option("vocab", 0, "its vocabulary", o.vocab, 1);
  cli.option("mlp-hidden", 0, "its MLP width (default 4 x hidden), as strata-step's --mlp-hidden", o.mlp_hidden, 0);
  cli.option("gpus", 0, "devices to train on", o.gpus, 0);
  cli.option("global-batch", 0, "sequences per step", o.global_batch, 0);
  cli.option("seq", 0, "tokens per sequence (default: the model's longest)", o.seq, 0);
  cli.option("memory-limit", 0, "bytes per device, e.g. 80GB or 80e9 (default: the system's device.memory_capacity)",
             o.memory_limit);
  cli.option("top", 'k', "configurations to print and store", o.top, 1);
  cli.option("micro-batches", 0, "micro-batch sizes (sequences per data-parallel rank), comma-separated", o.micro_batches);
  cli.option("schedules", 0, "pipeline schedules: gpipe, 1f1b, interleaved", o.schedules);
  cli.option("interleave", 0, "model chunks per pipeline rank of the interleaved schedule", o.interleave, 2);
  cli.option("recompute", 0, "recomputation modes: none, full, selective", o.recompute);
  cli.option("strategies", 0, "PaRO/ZeRO strategies (NNG, zero3, ...) or all", o.strategies);
  cli.option("tp", 0, "tensor-parallel degrees to take (default: every one that divides a node)", o.tp);
  cli.option("pp", 0, "pipeline degrees to take (default: every one that divides)", o.pp);
  cli.option("sequence-parallel", 0, "sequence parallelism with tp > 1: on or off", o.sequence_parallel);
  cli.option("trainable", 0, "what trains: all, last:K layers, or a fraction of the layers", o.trainable);
  cli.option("dtype", 0, "the GEMMs' dtype on the system (16-bit: mixed-precision memory)", o.dtype);
  cli.choice("grad-reduce-dtype", 0, "of the data-parallel gradient reductions, as predict's (auto: the step's element "
             "size; fp32 as FSDP's reduce_dtype float32 or Megatron-Core's grad_reduce_in_fp32)", o.grad_reduce_dtype,
             kGradReduceDtypes);
  cli.option("attention", 0, "how attention runs, as predict's: flash (the description's kernel), unfused, or a "
             "kernel the description names in device.attention_kernels", o.attention);
  cli.choice("loss", 0, "how the cross entropy runs over the logits, as predict's: fused, fp32 or fp32-fused", o.loss,
             kLossModes);
  cli.choice("dropout", 0, "whether the model trains with dropout, as predict's (its masks in the memory estimate)",
             o.dropout, {"on", "off"});
  cli.choice("sharding-buffers", 0, kShardingBuffersHelp, o.sharding_buffers, train::sharding_buffer_names());
  cli.option("threads", 0, "configurations simulated at once (default and most: the machine's hardware threads)", o.threads, 0);
  cli.flag("no-prune", 0, "simulate every configuration that fits (no lower bounds)", o.no_prune);
  cli.option("output", 'O', "results file to append the run to (default: a new file in results/runs/; --bench: none)",
             o.output);
  cli.flag("bench", 0, "judge the rate: exit 3 below 500 runnable configurations per second", o.bench);
  cli.flag("smoke", 0, "with --bench: a small search, no verdict (the tests' run)", o.smoke);
  cli.option("target", 0, "with --bench: the rate to reach, runnable configurations per second", o.target, 0.0);
  cli.flag("compare-paro", 0,
           "PaRO's rule beside the data-parallel search over a grid of scenarios (the first of --micro-batches per "
           "micro-batch, --seq tokens, default 2048)",
           o.compare_paro);
  cli.option("paro-models", 0, "the comparison's models", o.paro_models);
  cli.option("paro-trainable", 0, "the comparison's trainable parts (all, last:K, fraction)", o.paro_trainable);
  cli.option("paro-nodes", 0, "the comparison's node counts", o.paro_nodes);
  cli.option("paro-micro-batches", 0, "the comparison's micro-batches per step", o.paro_micro_batches);
  cli.option("paro-ratios", 0, "intra/inter bandwidth ratios (system: the description's own)", o.paro_ratios);
  cli.option("paro-recompute", 0, "the comparison's recomputation mode", o.paro_recompute);
  cli.flag("quiet", 'q', "print only the results", o.quiet);
  if (!cli.parse(argc, argv)) return 0;
  cpu_gemm::set_threads(1);  // nothing here runs a GEMM: keep BLAS's threads from spinning beside the search's
  const std::string config = cli.resolved_json();
  if (o.system_path.empty()) throw UsageError("--system FILE is required: the system description to search on");
  o.system_path = find_system_file(o.system_path);
  if (o.smoke && !o.bench) throw UsageError("--smoke goes with --bench");
  check_outputs({{"--system", o.system_path, ""}}, {{"-O/--output", o.output, ""}}, {});
  const project::System system = read_system(o.system_path);

  if (o.compare_paro) {
    // PaRO's rule prices the described kernel, the fused loss, dropout masks and the executor's own buffers; the
    // comparison keeps them alike.
    for (const char* flag : {"attention", "loss", "dropout", "sharding-buffers"})
      if (cli.given(flag))
        throw UsageError(std::string("--") + flag + " is not taken by --compare-paro (its scenarios run flash "
                         "attention, the fused loss, dropout and the step's own buffers)");
    return compare_paro(o, system, o.output, argc, argv, config);
  }

  if (o.bench) {
    // The benchmark's search: GPT-3 175B on 1024 GPUs at GPT-3's batch (1536 sequences of 2048), unless given.
    if (o.model.empty() && o.layers == 0) o.model = o.smoke ? "gpt2-124m" : "gpt3-175b";
    if (o.gpus == 0) o.gpus = o.smoke ? 64 : 1024;
    if (o.global_batch == 0) o.global_batch = o.smoke ? 128 : 1536;
    if (o.seq == 0) o.seq = o.smoke ? 1024 : 2048;
  }
  const project::SearchSpace space = resolve_space(o, system);
  std::string output = o.output;
  if (output.empty() && !o.bench) {
    std::filesystem::create_directories("results/runs");
    output = "results/runs/strata-project-search-" + new_run_id() + ".h5";
  }
  if (!output.empty()) validate_output_path(output);

  if (!o.quiet)
    std::printf("# strata-project search: %s (%d layers, hidden %d, %.3g parameters) on %d devices of %s, global batch %d "
                "x %d tokens, %s, attention %s, loss %s, dropout %s, sharding buffers %s, memory limit %s GB per device\n",
                space.model.name.c_str(), space.model.layers, space.model.hidden,
                static_cast<double>(space.model.parameters()), space.devices, system.name.c_str(), space.global_batch,
                space.seq, space.dtype.c_str(), space.attention.c_str(), space.loss.c_str(),
                o.dropout.c_str(), o.sharding_buffers.c_str(), gb(space.memory_limit).c_str());
  const project::SearchResult result = project::search(system, space);
  if (result.top.empty()) {
    std::string message = "no configuration of " + std::to_string(result.enumerated) + " runs and fits in " +
                          gb(space.memory_limit) + " GB per device:";
    for (const auto& [why, count] : result.refusal_reasons) message += "\n  " + why + ": " + std::to_string(count);
    throw UsageError(message);
  }
  print_top(space, result);
  print_counts(result);

  if (!output.empty()) {
    ProjectRun run(output, "search", argc, argv, config, {{"benchmark", kSearchBenchmark}});
    run.set_run_attr("search_considered", std::to_string(result.enumerated));
    run.set_run_attr("search_runnable", std::to_string(runnable(result)));
    run.set_run_attr("search_fitting", std::to_string(result.fitting));
    run.set_run_attr("search_simulated", std::to_string(result.simulated));
    run.set_run_attr("search_pruned", std::to_string(result.pruned));
    run.set_run_attr("search_seconds", format_fixed(result.seconds, 3));
    run.append(search_table(space, result, system.name));
    run.finish();
    if (!o.quiet) std::printf("# results: %s (table search)\n", output.c_str());
  }
  if (o.bench) {
    const double rate = runnable(result) / std::max(result.seconds, 1e-9);
    if (o.smoke) {
      std::printf("# bench (smoke): %.0f runnable configurations/s, not judged\n", rate);
      return 0;
    }
    const bool met = rate >= o.target;
    std::printf("# bench: %.0f runnable configurations/s for %s on %d devices, target >= %.0f: ratio %.2f %s\n", rate,
                space.model.name.c_str(), space.devices, o.target, rate / std::max(o.target, 1e-300), met ? "met" : "MISSED");
    return met ? 0 : 3;
  }
  return 0;
}

}  // namespace strata
