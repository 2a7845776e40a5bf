// strata-project: the projection layer's programs, one subcommand each (`strata-project COMMAND ...`).
//   calibrate FILE... -o system.json   a system description fitted from Strata's result files
//   predict --system system.json ...   one training step predicted on a system description
//   validate STEPFILE... --system ...  every measured strata-step case predicted and compared
//   search --system FILE --model M --gpus N --global-batch B   configurations ranked by predicted step time
// Runs on one process without MPI: it reads files and computes. Bad input (flags, files that are not Strata
// results, a description with a bad field, runs that cannot give a whole description) prints one message and
// exits 2 without touching the output; any other failure exits 1.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/project/published.h"
#include "bench/harness/json_file.h"
#include "bench/project/calibration_input.h"
#include "bench/harness/buffers.h"
#include "bench/harness/check.h"
#include "bench/harness/cli.h"
#include "bench/harness/harness.h"
#include "bench/harness/output_files.h"
#include "bench/project/prediction.h"
#include "bench/project/project_search.h"
#include "bench/project/project_speed.h"
#include "bench/cases/step_config.h"
#include "bench/project/system_json.h"
#include "bench/project/timeline_trace.h"
#include "project/calibrate.h"
#include "results/error.h"
#include "results/h5.h"
#include "results/reader.h"
#include "train/trainer.h"

namespace {

using namespace strata;

std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

int calibrate(int argc, char** argv) {
  std::vector<std::string> files;
  std::string output, name, base_path, device = "auto";
  bool quiet = false;
  Cli cli("strata-project calibrate",
          "A system description (JSON, project/SYSTEM.md) fitted from strata-gemm, strata-attention, "
          "strata-collective and strata-interference result files.");
  cli.positionals("FILE", "Strata result files (HDF5); every usable run of them is read", files, 1);
  cli.option("output", 'o', "the system description to write (JSON); left untouched on any error", output);
  cli.option("name", 0, "the description's name (default: host, device and date)", name);
  cli.option("base", 0, "a system description (e.g. a spec sheet's) whose figures stand in for what the files do "
             "not measure, each marked as not measured", base_path);
  cli.choice("device", 0, "which device the description is of: the GPU when a GEMM run used one (auto), or say",
             device, {"auto", "cpu", "cuda"});
  cli.flag("quiet", 'q', "print only errors", quiet);
  if (!cli.parse(argc, argv)) return 0;
  // Refused before anything is read, so a typo costs nothing.
  if (output.empty()) throw UsageError("-o/--output FILE is required: where to write the system description");
  std::vector<FileArg> inputs = {{"--base", base_path, ""}};
  for (const std::string& file : files) inputs.push_back({"FILE", file, ""});
  check_outputs(inputs, {}, {{"-o/--output", output, "a system description (JSON)"}});
  std::optional<project::System> base;
  if (!base_path.empty()) base = read_system(base_path);

  CalibrationFiles read = read_calibration_input(files, device);
  read.input.name = !name.empty() ? name
                                  : (read.host.empty() ? "" : read.host + ": ") + read.input.device_name +
                                        ", calibrated " + utc_date();
  const project::Calibration result = project::calibrate(read.input, base ? &*base : nullptr, base_path);
  if (!quiet) {
    std::printf("# strata-project calibrate: %s\n", read.input.provenance.c_str());
    for (const std::string& note : read.notes) std::printf("# note: %s\n", note.c_str());
    std::printf("# residual: RMS of (fit - measured) / measured over the sizes or points fitted\n");
    for (const std::string& line : result.report) std::printf("%s\n", line.c_str());
  }
  if (!result.missing.empty()) {
    std::string message = "the result files cannot give a whole system description:";
    for (const std::string& missing : result.missing) message += "\n  - " + missing;
    message += "\n  add the runs named, or pass --base FILE (a description whose figures stand in, each marked as "
               "not measured)";
    throw UsageError(message);
  }
  write_system(output, result.system);
  if (!quiet) std::printf("# system description: %s\n", output.c_str());
  return 0;
}

// ---- predict and validate ---------------------------------------------------------------------------------

// A time in the unit that reads best.
std::string duration(double seconds) {
  if (!std::isfinite(seconds)) return "n/a";
  if (std::abs(seconds) >= 1) return format_fixed(seconds, 3) + " s";
  if (std::abs(seconds) >= 1e-3) return format_fixed(seconds * 1e3, 3) + " ms";
  return format_fixed(seconds * 1e6, 1) + " us";
}

void print_prediction(const project::StepCase& step, const project::PredictedStep& p) {
  const project::Prediction& r = p.prediction;
  const project::StepComponents& m = r.mean;
  std::printf("# %s: step %s [%s, %s] | %.0f tok/s | MFU %.2f%% | HFU %.2f%% | traced in %.3f s, simulated in %.3f s\n",
              step.label.c_str(), duration(r.step_s).c_str(), duration(r.step_low_s).c_str(),
              duration(r.step_high_s).c_str(), p.tokens_per_s, 100 * p.mfu, 100 * p.hfu, p.trace_s, p.simulate_s);
  std::string roles;
  for (const auto& [role, seconds] : m.exposed_by_role)
    if (seconds > 0) roles += (roles.empty() ? "" : ", ") + role + " " + duration(seconds);
  std::printf("#   mean over ranks: forward %s | backward %s (recompute %s) | recompute in windows %s | optimizer %s | "
              "exposed comm %s%s | pipeline wait (bubble) %s | idle %s\n",
              duration(m.forward_s).c_str(), duration(m.backward_s).c_str(), duration(m.recompute_s).c_str(),
              duration(m.recompute_window_s).c_str(), duration(m.optimizer_s).c_str(), duration(m.comm_exposed_s).c_str(),
              roles.empty() ? "" : (" (" + roles + ")").c_str(), duration(m.pipeline_wait_s).c_str(),
              duration(m.idle_s).c_str());
  const train::MemoryUse& mem = p.memory;
  std::printf("#   memory/rank (formula, max over ranks): parameters %s, gradients %s, optimizer %s, activations %s, "
              "workspace %s, communication buffers %s; total %s\n",
              format_gib(mem.params).c_str(), format_gib(mem.grads).c_str(), format_gib(mem.optimizer).c_str(), format_gib(mem.activations).c_str(),
              format_gib(mem.workspace).c_str(), format_gib(mem.comm_buffers).c_str(), format_gib(mem.total()).c_str());
  if (p.fits >= 0)
    std::printf("#   device memory %s: %s\n", format_gib(p.memory_capacity).c_str(),
                p.fits ? "fits" : "does NOT fit (warning on stderr)");
  std::fflush(stdout);
}

// A prediction whose memory per rank exceeds the device's: the step as configured would not run there. On stderr
// even with --quiet: the step time of a configuration that cannot run is no answer.
void warn_does_not_fit(const project::StepCase& step, const project::PredictedStep& p, const std::string& system_path) {
  const train::MemoryUse& m = p.memory;
  std::fprintf(stderr,
               "strata-project predict: warning: %s does not fit: %s per rank predicted (parameters %s, gradients %s, "
               "optimizer %s, activations %s, workspace %s, communication buffers %s), above the device's memory "
               "capacity of %s (%s device.memory_capacity)\n",
               step.label.c_str(), format_gib(m.total()).c_str(), format_gib(m.params).c_str(),
               format_gib(m.grads).c_str(), format_gib(m.optimizer).c_str(), format_gib(m.activations).c_str(),
               format_gib(m.workspace).c_str(), format_gib(m.comm_buffers).c_str(), format_gib(p.memory_capacity).c_str(),
               system_path.c_str());
}

// Where the timeline of prediction `index` of `count` goes: FILE itself for one, FILE with the index before its
// extension for several.
std::string timeline_path(const std::string& path, std::size_t index, std::size_t count) {
  if (count == 1) return path;
  const std::filesystem::path p(path);
  return (p.parent_path() / (p.stem().string() + "-" + std::to_string(index) + p.extension().string())).string();
}

std::string case_label(const train::Strategy& strategy, train::Recompute mode) {
  return strategy.name() + (mode == train::Recompute::none ? "" : std::string(" recompute ") + train::name(mode));
}

// strata-project predict's flags beside the step's.
struct PredictFlags {
  StepFlags step;
  std::string system_path, output, timeline, dtype = "auto", policy_path, attention = "flash", simulator = "fast";
  std::string tp_comm_overlap = "off", overlap_param_gather = "off", sharding_collectives, grad_reduce_dtype = "auto";
  std::string loss = "fused", dropout = "on", sharding_buffers = "strata";
  int nodes = 0, gpus = 0, element_bytes = 0;
  bool quiet = false;
};

void add_predict_options(Cli& cli, PredictFlags& o) {
  StepFlags& f = o.step;
  cli.option("system", 0, "the system description (JSON, project/SYSTEM.md), or a shipped one by name (e.g. "
             "h100-sxm-ndr400)", o.system_path);
  add_model_flags(cli, f);
  add_batch_flags(cli, f);
  add_grid_flags(cli, f);
  cli.option("recompute", 0, "what backward computes again: none, full, selective, overlap (with --recompute-policy), "
             "comma-separated, or all (overlap only with a policy); one prediction per strategy and mode", f.recompute);
  cli.option("recompute-policy", 0, "overlap's placement (strata-recompute-policy JSON, as strata-step stores it); predict "
             "places no recomputation itself", o.policy_path);
  cli.option("nodes", 0, "nodes of the job: ranks = nodes x the description's devices per node (default 1, or the "
             "--grid's ranks)", o.nodes, 0);
  cli.option("gpus", 0, "ranks (devices) of the job, instead of --nodes", o.gpus, 0);
  cli.option("dtype", 0, "of GEMMs and attention (auto: bf16 where the description's device has it, else fp32)", o.dtype);
  cli.option("attention", 0, "how attention runs: flash (the fused kernel the description's attention figures "
             "describe), unfused (the scores materialised, as frameworks ran it before flash attention), or another "
             "kernel the description names in device.attention_kernels", o.attention);
  cli.option("element-bytes", 0, "bytes of an activation, gradient and collective element (0: 2 for bf16 and fp16, "
             "else 4)", o.element_bytes, 0);
  cli.choice("grad-reduce-dtype", 0, "of the data-parallel gradient reductions (auto: the elements' --element-bytes; fp32 "
             "as PyTorch FSDP's reduce_dtype float32, e.g. Composer's mixed precision DEFAULT, or Megatron-Core's "
             "grad_reduce_in_fp32 do)", o.grad_reduce_dtype, kGradReduceDtypes);
  cli.choice("loss", 0, "how the cross entropy runs over the logits: fused (kernels on the logits as they are, "
             "keeping them at the elements' size: the step's own, Transformer Engine's), fp32 (cast to fp32 and run "
             "pass by pass, keeping an fp32 softmax, as Megatron-Core's vocab-parallel cross entropy does without "
             "--cross-entropy-loss-fusion, and Megatron-LM's without --fp16-lm-cross-entropy) or fp32-fused (those "
             "passes compiled into three, as Megatron-Core's native --cross-entropy-loss-fusion runs them)", o.loss,
             kLossModes);
  cli.choice("dropout", 0, "whether the model trains with dropout, whose 1-byte masks the predicted activations hold "
             "(on: GPT-3's and Megatron-LM's models; off: MPT's, Llama's and Nemotron's); memory only", o.dropout,
             {"on", "off"});
  cli.choice("sharding-buffers", 0, kShardingBuffersHelp, o.sharding_buffers, train::sharding_buffer_names());
  cli.alias("overlap-grad-reduce", "overlap");
  cli.choice("tp-comm-overlap", 0, "tensor-parallel all-gathers and reduce-scatters beside the GEMMs that read or write "
             "them (Megatron-Core's --tp-comm-overlap, off by default there too; needs --sp)", o.tp_comm_overlap, {"on", "off"});
  cli.choice("overlap-param-gather", 0, "the optimizer's parameter all-gathers (sharded optimizer states, whole "
             "parameters: ZeRO-1/2, Megatron's distributed optimizer) beside the next forward (Megatron-Core's "
             "--overlap-param-gather, off by default there too)", o.overlap_param_gather, {"on", "off"});
  cli.option("sharding-collectives", 0, "cost the data-parallel all-gathers and reduce-scatters (ZeRO/FSDP sharding) "
             "under the description's collectives of this algorithm, as a framework issued them (e.g. zero3-2021 "
             "in the shipped A100 description); default: as traced", o.sharding_collectives);
  cli.option("timeline", 0, "write the predicted timeline as a Chrome trace (JSON; with several predictions, one file "
             "each, the index before the extension)", o.timeline);
  cli.choice("simulator", 0, "fast (runs of compute simulated as one op, an event queue) or exact (every traced op, "
             "the reference; the same step and breakdown up to rounding)", o.simulator, {"fast", "exact"});
  cli.option("output", 'O', "results file to append the run to (default: a new file in results/runs/)", o.output);
  cli.flag("quiet", 'q', "print only errors", o.quiet);
  cli.alias("microbatches", "accumulation");
}

// The dtype of GEMMs and attention (auto: bf16 where the device has it) and the element size that goes with it.
void resolve_dtype(PredictFlags& o, const project::System& system) {
  if (o.dtype == "auto") o.dtype = system.device.compute.count("bf16") ? "bf16" : "fp32";
  if (!system.device.compute.count(o.dtype)) {
    std::string have;
    for (const auto& [name, c] : system.device.compute) have += (have.empty() ? "" : ", ") + name;
    throw UsageError("--dtype " + o.dtype + ": the system's device has no such compute (it has " + have + ")");
  }
  if (o.element_bytes == 0) o.element_bytes = o.dtype == "bf16" || o.dtype == "fp16" ? 2 : 4;
  if (o.element_bytes != 2 && o.element_bytes != 4) throw UsageError("--element-bytes must be 2 or 4");
}

// The job's ranks: --gpus, --nodes x the description's devices per node, the --grid's when it gives dp, else a node.
int job_ranks(const PredictFlags& o, int per_node) {
  if (o.gpus > 0 && o.nodes > 0 && o.gpus != static_cast<long long>(o.nodes) * per_node)
    throw UsageError("--gpus " + std::to_string(o.gpus) + " and --nodes " + std::to_string(o.nodes) + " disagree: the system has " +
                     std::to_string(per_node) + " devices per node");
  const long long ranks = o.gpus > 0 ? o.gpus : o.nodes > 0 ? static_cast<long long>(o.nodes) * per_node : per_node;
  if (ranks > train::kMaxTracedRanks)
    throw UsageError((o.gpus > 0 ? "--gpus " + std::to_string(o.gpus)
                                 : "--nodes " + std::to_string(o.nodes) + " x " + std::to_string(per_node) + " devices per node") +
                     ": " + std::to_string(ranks) + " ranks, more than the " + std::to_string(train::kMaxTracedRanks) +
                     " a trace covers");
  int world = static_cast<int>(ranks);
  if (o.gpus == 0 && o.nodes == 0 && o.step.grid.find("dp=") != std::string::npos) {
    long long grid_ranks = 0;
    try {
      grid_ranks = coll::parse_grid(o.step.grid).size();
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--grid: ") + e.what());
    }
    if (grid_ranks > train::kMaxTracedRanks)
      throw UsageError("--grid " + o.step.grid + ": " + std::to_string(grid_ranks) + " ranks, more than the " +
                       std::to_string(train::kMaxTracedRanks) + " a trace covers");
    world = static_cast<int>(grid_ranks);
  }
  return world;
}

// One step to predict per strategy and mode of the plan.
std::vector<project::StepCase> predict_cases(const PredictFlags& o, const StepPlan& plan,
                                             const std::optional<nlohmann::json>& policy, int per_node) {
  std::vector<project::StepCase> steps;
  for (const train::Strategy& strategy : plan.strategies)
    for (train::Recompute mode : plan.modes) {
      project::StepCase step;
      step.label = case_label(strategy, mode);
      step.config = plan.config;
      step.config.strategy = strategy, step.config.recompute = mode;
      step.grid = plan.grid;
      step.trace.ranks_per_node = o.step.group_size > 0 ? o.step.group_size : per_node;
      step.trace.grid_order = o.step.grid_order;
      step.trace.tp_comm_overlap = o.tp_comm_overlap == "on";
      step.trace.overlap_param_gather = o.overlap_param_gather == "on";
      step.workload = {o.dtype, o.element_bytes, o.attention, o.sharding_collectives,
                       gradient_reduction_bytes(o.grad_reduce_dtype), o.loss, o.dropout == "on", o.sharding_buffers};
      step.predict = {o.simulator == "exact", !o.timeline.empty()};
      if (mode == train::Recompute::overlap) {
        if (!policy)
          throw UsageError("--recompute overlap needs a placement: --recompute-policy FILE (strata-step stores one with "
                           "each overlap case). predict places no recomputation itself: a placement fills the waits for "
                           "other stages, whose lengths a measured step gives");
        step.trace.pipeline_rank_configs = overlap_configs(step.config, plan.grid, *policy, o.policy_path);
      }
      steps.push_back(std::move(step));
    }
  if (policy && std::find(plan.modes.begin(), plan.modes.end(), train::Recompute::overlap) == plan.modes.end())
    throw UsageError("--recompute-policy is a placement for --recompute overlap, which is not asked for");
  return steps;
}

void print_predict_header(const PredictFlags& o, const StepPlan& plan, const project::System& system, int world,
                          int ranks_per_node) {
  const train::ModelConfig& model = plan.model;
  std::printf("# strata-project predict: %s (%s parameters) on %d rank(s) of %s (%d per node): tp %d x pp %d x dp %d, "
              "micro-batch %d x seq %d, %d micro-batch(es), global batch %lld rows; %s GEMMs and attention (%s), "
              "%d-byte elements%s; comm %s; overlapped: gradient reductions %s, parameter gathers %s, tensor-parallel "
              "communication %s%s\n",
              model.name.c_str(), format_si(static_cast<double>(model.parameters())).c_str(), world, system.name.c_str(),
              ranks_per_node, plan.grid.tp, plan.grid.pp, plan.grid.dp, plan.config.micro_batch,
              plan.config.seq, plan.config.accumulation, static_cast<long long>(plan.global_rows), o.dtype.c_str(),
              o.attention.c_str(), o.element_bytes,
              (std::string(o.grad_reduce_dtype == "auto" ? "" : ", gradients reduced in " + o.grad_reduce_dtype) +
               (o.loss == "fp32" ? ", the loss in fp32 pass by pass" : "") +
               (o.loss == "fp32-fused" ? ", the loss in fp32 in three fused passes" : "") +
               (o.dropout == "off" ? ", no dropout" : "") +
               (o.sharding_buffers == "strata" ? "" : ", sharded states' buffers as " + o.sharding_buffers))
                  .c_str(),
              o.step.comm_algo.c_str(), o.step.overlap.c_str(), o.overlap_param_gather.c_str(),
              o.tp_comm_overlap.c_str(),
              o.sharding_collectives.empty() ? "" : ("; sharding collectives as " + o.sharding_collectives).c_str());
  std::printf("# step: the simulated step (last op's end over ranks) [interval: the description's figures at the ends of "
              "their spreads]; MFU: 6N + 6Lhs model FLOPs per token over the description's %s peak (%s FLOP/s per rank)\n",
              o.dtype.c_str(), format_si(system.device.compute.at(o.dtype).peak_flops.value).c_str());
  std::fflush(stdout);
}

int predict(int argc, char** argv) {
  PredictFlags o;
  Cli cli("strata-project predict",
          "One training step of a model on a grid, traced and simulated on a system description: step time with the "
          "interval of the description's spreads, its breakdown, memory per rank, MFU and tokens/s.");
  add_predict_options(cli, o);
  if (!cli.parse(argc, argv)) return 0;
  o.step.micro_batch_given = cli.given("micro-batch"), o.step.accumulation_given = cli.given("accumulation");

  // Plan and check: the files, the description, the job, the steps; every file a timeline goes to.
  if (o.system_path.empty()) throw UsageError("--system FILE is required: the system description to predict on");
  o.system_path = find_system_file(o.system_path);
  const std::vector<FileArg> inputs = {{"--system", o.system_path, ""}, {"--recompute-policy", o.policy_path, ""}};
  check_outputs(inputs, {{"-O/--output", o.output, ""}}, {{"--timeline", o.timeline, "a Chrome trace (JSON)"}});
  check_results_output(o.output);
  const project::System system = read_system(o.system_path);
  check_sharding_algorithm(system, o.sharding_collectives, "--sharding-collectives");
  check_attention(system, o.attention, "--attention");
  const int per_node = system.device.devices_per_node;
  resolve_dtype(o, system);
  const int world = job_ranks(o, per_node);
  StepPlan plan = plan_step(o.step, world);
  if (o.tp_comm_overlap == "on" && !plan.config.sequence_parallel)
    throw UsageError("--tp-comm-overlap on needs --sp (and --tp 2 or more): the tensor-parallel communication it "
                     "overlaps with the GEMMs is sequence parallelism's all-gathers and reduce-scatters (Megatron-Core "
                     "requires it too)");
  std::optional<nlohmann::json> policy;
  if (!o.policy_path.empty()) policy = read_json_file(o.policy_path, "recompute policy");
  if (o.step.recompute == "all" && !policy) std::erase(plan.modes, train::Recompute::overlap);  // placed only from a policy
  const std::vector<project::StepCase> steps = predict_cases(o, plan, policy, per_node);
  if (!o.timeline.empty() && steps.size() > 1) {
    std::vector<FileArg> timelines;
    for (std::size_t i = 0; i < steps.size(); ++i)
      timelines.push_back({"--timeline", timeline_path(o.timeline, i, steps.size()), "a Chrome trace (JSON)"});
    check_outputs(inputs, {{"-O/--output", o.output, ""}}, timelines);
  }

  // Every prediction before anything is written: a configuration the step refuses leaves the output untouched.
  if (!o.quiet) print_predict_header(o, plan, system, world, steps.front().trace.ranks_per_node);
  std::vector<project::PredictedStep> predicted;
  for (const project::StepCase& step : steps) {
    const auto start = std::chrono::steady_clock::now();
    predicted.push_back(project::predict_step(step, system));
    if (predicted.back().fits == 0) warn_does_not_fit(step, predicted.back(), o.system_path);
    if (!o.quiet) {
      print_prediction(step, predicted.back());
      std::printf("#   predicted in %.2f s (this machine)\n",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      std::fflush(stdout);
    }
  }

  // Record: the timelines before the run, as a run in the file says its whole output was written.
  if (!o.timeline.empty())
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const std::string path = timeline_path(o.timeline, i, steps.size());
      write_file_atomically(path, timeline_to_chrome_trace(predicted[i].prediction.timeline, predicted[i].streams, predicted[i].phases).dump());
      if (!o.quiet) std::printf("# timeline (%s): %s\n", steps[i].label.c_str(), path.c_str());
    }
  ProjectRun run(o.output, "predict", argc, argv, cli.resolved_json(), {{"system", system.name}, {"system_file", o.system_path}});
  Table table = prediction_table();
  for (std::size_t i = 0; i < steps.size(); ++i) add_prediction_row(table, static_cast<int64_t>(i), steps[i], predicted[i], system.name);
  run.append(table);
  run.finish();
  if (!o.quiet) std::printf("# results: %s\n", run.path().c_str());
  return 0;
}

// ---- validate ---------------------------------------------------------------------------------------------

// The step flags strata-step stores in its run's configuration that decide the step's configuration.
const char* const kStepFlags[] = {"model", "layers", "hidden", "heads", "kv-heads", "vocab", "mlp-hidden", "seq",
                                  "micro-batch", "accumulation", "global-batch", "paro", "zero", "group-size",
                                  "trainable", "comm-algo", "overlap", "tp", "pp", "grid", "grid-order", "sp",
                                  "schedule", "virtual-stages", "stage-layers", "partition", "recompute"};

// The step's flags from a run's config_json, parsed by the same code strata-step parses them with.
StepFlags step_flags_of(const std::string& config_json, const std::string& where) {
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(config_json);
  } catch (const nlohmann::json::parse_error& e) {
    throw BadResultsFile(where + ": config_json is not JSON: " + e.what());
  }
  if (!config.is_object()) throw BadResultsFile(where + ": config_json is not an object");
  StepFlags f;
  Cli cli("strata-step", "");
  add_model_flags(cli, f);
  add_batch_flags(cli, f);
  add_grid_flags(cli, f);
  cli.option("partition", 0, "", f.partition);
  cli.option("recompute", 0, "", f.recompute);
  std::vector<std::string> args = {"strata-step"};
  for (const char* flag : kStepFlags) {
    if (!config.contains(flag)) continue;
    const nlohmann::json& value = config[flag];
    if (value.is_string() && value.get<std::string>().empty()) continue;
    args.push_back("--" + std::string(flag) + "=" + (value.is_string() ? value.get<std::string>() : value.dump()));
  }
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    cli.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const std::invalid_argument& e) {
    throw BadResultsFile(where + ": its stored options do not parse: " + e.what());
  }
  return f;
}

int to_int(const std::string& text) {
  try {
    std::size_t used = 0;
    const int value = std::stoi(text, &used);
    return used == text.size() ? value : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

// A column of a run's table by name; a missing one names the run and what it needs.
const Column& column_of(const Table& table, const std::string& name, const std::string& where) {
  if (!table.has_column(name))
    throw BadResultsFile(where + " has no column " + name + " (a strata-step run of an older version?)");
  return table.column(name);
}

struct MeasuredCase {
  std::string file, run_id;  // the first run of the command that measured the case
  int64_t step_case = 0;
  double step_s = 0;
  std::map<std::string, double> phases;
  int runs = 1;  // runs of the same command whose median step_s and phases are (the first's file and id above)
};

// A measured strata-step case as a step to predict: the run's plan with the case's strategy, recomputation, stages
// and (overlap) placement, on the run's nodes.
project::StepCase step_case_of(const Table& cases, std::size_t r, const StepPlan& plan, const StepFlags& f, int world,
                               int run_nodes, bool exact, const std::string& at_cases, const std::string& case_where) {
  project::StepCase step;
  step.config = plan.config;
  step.grid = plan.grid;
  try {
    step.config.strategy = train::parse_strategy(column_of(cases, "strategy", at_cases).texts.at(r));
  } catch (const std::invalid_argument& e) {
    throw BadResultsFile(case_where + ": " + e.what());
  }
  const std::string mode_name = column_of(cases, "recompute", at_cases).texts.at(r);
  const std::optional<train::Recompute> mode = train::parse_recompute(mode_name);
  if (!mode) throw BadResultsFile(case_where + ": unknown recompute mode '" + mode_name + "'");
  step.config.recompute = *mode;
  step.config.stage_layers.clear();
  for (const std::string& item : split(column_of(cases, "stage_layers", at_cases).texts.at(r), ','))
    step.config.stage_layers.push_back(static_cast<int>(parse_int(item, case_where + " stage_layers")));
  step.label = case_label(step.config.strategy, *mode);
  step.trace.ranks_per_node = f.group_size > 0 ? f.group_size : world / run_nodes;
  step.trace.grid_order = f.grid_order;
  step.workload = {"fp32", 4};
  step.predict.exact = exact;
  if (*mode == train::Recompute::overlap) {
    const std::string text = column_of(cases, "recompute_policy", at_cases).texts.at(r);
    nlohmann::json policy;
    try {
      policy = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      throw BadResultsFile(case_where + ": its recompute_policy is not JSON: " + e.what());
    }
    step.trace.pipeline_rank_configs = overlap_configs(step.config, plan.grid, policy, case_where);
  }
  return step;
}

// The cases of every strata-step run with status ok in the files, as steps to predict beside their measured step
// and phases; `notes` names the runs skipped. Runs of the same command (its flags but the output file, on as many
// ranks and nodes: make run's passes, a job's repeats) measured the same cases in separate processes: each case is
// predicted once and held to the median over those runs of its step and of each phase. A process's memory layout and
// the machine's minute move a small step by 10-30 % on a shared VM; the median of a few processes is steadier.
struct MeasuredSteps {
  std::vector<project::StepCase> steps;
  std::vector<MeasuredCase> measured;
  std::vector<std::string> notes;
};

MeasuredSteps read_measured_steps(const std::vector<std::string>& files, bool exact) {
  MeasuredSteps out;
  std::map<std::string, std::size_t> case_of_command;  // the command and case, as below, to its index in out
  std::vector<std::vector<double>> step_runs;          // per case: each run's step
  std::vector<std::map<std::string, std::vector<double>>> phase_runs;  // per case and phase: each run's
  for (const std::string& path : files) {
    const ResultsReader reader(path);
    std::size_t found = 0;
    for (const std::string& id : reader.runs()) {
      const std::map<std::string, std::string> attrs = reader.run_attrs(id);
      if (!attrs.count("benchmark") || attrs.at("benchmark") != "strata-step") continue;
      const std::string where = path + " run " + id + " (strata-step)";
      const std::string status = attrs.count("status") ? attrs.at("status") : "";
      if (status != "ok") {
        out.notes.push_back(where + ": status " + (status.empty() ? "missing" : status) + ": skipped");
        continue;
      }
      const std::string config_json = attrs.count("config_json") ? attrs.at("config_json") : "{}";
      StepFlags f = step_flags_of(config_json, where);
      nlohmann::json command = nlohmann::json::parse(config_json);  // parsed by step_flags_of already
      // Passes of one case differ at most in where they wrote and what they printed.
      for (const char* display : {"output", "quiet", "progress-interval"}) command.erase(display);
      const int world = to_int(attrs.count("n_ranks") ? attrs.at("n_ranks") : "");
      const int run_nodes = to_int(attrs.count("n_nodes") ? attrs.at("n_nodes") : "");
      if (world < 1 || run_nodes < 1) throw BadResultsFile(where + ": no n_ranks or n_nodes attribute");
      StepPlan plan;
      try {
        plan = plan_step(f, world);
      } catch (const std::invalid_argument& e) {
        throw BadResultsFile(where + ": its configuration is refused: " + e.what());
      }
      const Table cases = reader.table(id, "cases"), summary = reader.table(id, "summary");
      const std::string at_cases = where + " table cases", at_summary = where + " table summary";
      std::map<int64_t, std::size_t> summary_row;
      const Column& summary_case = column_of(summary, "case", at_summary);
      for (std::size_t r = 0; r < summary.rows(); ++r) summary_row[summary_case.ints.at(r)] = r;
      for (std::size_t r = 0; r < cases.rows(); ++r) {
        const int64_t index = column_of(cases, "case", at_cases).ints.at(r);
        const auto row = summary_row.find(index);
        if (row == summary_row.end()) continue;  // a case cut short: no summary
        const std::string case_where = where + " case " + std::to_string(index);
        const std::string key = command.dump() + " ranks " + std::to_string(world) + " nodes " + std::to_string(run_nodes) +
                                " case " + std::to_string(index);
        auto [at, first] = case_of_command.emplace(key, out.steps.size());
        if (first) {
          out.steps.push_back(step_case_of(cases, r, plan, f, world, run_nodes, exact, at_cases, case_where));
          out.measured.push_back(MeasuredCase{path, id, index, 0, {}, 1});
          step_runs.emplace_back(), phase_runs.emplace_back();
        }
        const std::size_t c = at->second;
        step_runs[c].push_back(column_of(summary, "time_rankmax_median", at_summary).reals.at(row->second));
        for (const std::string& name : project::step_components())
          phase_runs[c][name].push_back(column_of(summary, "phase_" + name, at_summary).reals.at(row->second));
        ++found;
      }
    }
    if (found == 0)
      throw UsageError(path + " holds no strata-step case of a run with status ok: nothing to validate (validate reads "
                       "strata-step runs; calibrate reads the benchmarks)");
  }
  for (std::size_t c = 0; c < out.measured.size(); ++c) {
    out.measured[c].runs = static_cast<int>(step_runs[c].size());
    out.measured[c].step_s = median_of(step_runs[c]);
    for (const auto& [name, values] : phase_runs[c]) out.measured[c].phases[name] = median_of(values);
  }
  return out;
}

// The `validation` table (results/SCHEMA.md): per predicted case, the measured and predicted step and phases.
Table validation_table() {
  Table validation("validation");
  using K = ColumnKind;
  validation.add_column("case", K::int64, "1", "the prediction's index in this run's prediction table")
      .add_column("step_file", K::string, "", "the file of the strata-step run").add_column("step_run", K::string, "", "its run id")
      .add_column("step_case", K::int64, "1", "the case in the strata-step run")
      .add_column("step_runs", K::int64, "1", "runs of the same strata-step command measuring the case (step_run the first)")
      .add_column("label", K::string, "")
      .add_column("ranks", K::int64, "1").add_column("tp", K::int64, "1").add_column("pp", K::int64, "1")
      .add_column("dp", K::int64, "1").add_column("strategy", K::string, "").add_column("recompute", K::string, "")
      .add_column("schedule", K::string, "")
      .add_column("step_time_measured", K::float64, "s", "median over timed steps of the per-step max over ranks; over "
                  "step_runs runs, the median of theirs")
      .add_column("step_time_predicted", K::float64, "s", "simulated: the last op's end over all ranks")
      .add_column("step_time_low", K::float64, "s", "at the faster end of the description's spreads")
      .add_column("step_time_high", K::float64, "s", "at the slower end of the description's spreads")
      .add_column("step_time_error", K::float64, "1", "predicted / measured - 1")
      .add_column("within_interval", K::int64, "1", "1: the measured step lies in [low, high]");
  for (const std::string& name : project::step_components())
    validation.add_column("phase_" + name + "_measured", K::float64, "s", "median over timed steps, mean over ranks (over "
                          "step_runs runs, the median of theirs)")
        .add_column("phase_" + name + "_predicted", K::float64, "s", "simulated, mean over ranks")
        .add_column("phase_" + name + "_error", K::float64, "1", "(predicted - measured) / the measured step");
  return validation;
}

void add_validation_row(Table& validation, std::size_t i, const project::StepCase& s, const project::PredictedStep& p,
                        const MeasuredCase& m) {
  const double error = p.prediction.step_s / m.step_s - 1;
  validation.set("case", static_cast<int64_t>(i)).set("step_file", m.file).set("step_run", m.run_id).set("step_case", m.step_case)
      .set("step_runs", static_cast<int64_t>(m.runs)).set("label", s.label).set("ranks", static_cast<int64_t>(s.grid.size())).set("tp", s.grid.tp).set("pp", s.grid.pp)
      .set("dp", s.grid.dp).set("strategy", s.config.strategy.name()).set("recompute", train::name(s.config.recompute))
      .set("schedule", train::name(s.config.schedule))
      .set("step_time_measured", m.step_s).set("step_time_predicted", p.prediction.step_s)
      .set("step_time_low", p.prediction.step_low_s).set("step_time_high", p.prediction.step_high_s)
      .set("step_time_error", error)
      .set("within_interval", p.prediction.step_low_s <= m.step_s && m.step_s <= p.prediction.step_high_s ? 1 : 0);
  for (const std::string& name : project::step_components()) {
    const double predicted_phase = project::component(p.prediction.mean, name), measured_phase = m.phases.at(name);
    validation.set("phase_" + name + "_measured", measured_phase).set("phase_" + name + "_predicted", predicted_phase)
        .set("phase_" + name + "_error", (predicted_phase - measured_phase) / m.step_s);
  }
  validation.end_row();
}

// The validation as a Markdown table: per case the measured and predicted step with its interval and error, and
// each phase's error as a share of the measured step.
void print_validation(const MeasuredSteps& in, const std::vector<project::PredictedStep>& predicted) {
  int most_runs = 1;
  for (const MeasuredCase& m : in.measured) most_runs = std::max(most_runs, m.runs);
  std::printf("# measured: median over timed steps of the per-step max over ranks; phases: median over steps, mean over "
              "ranks%s. error: predicted / measured - 1; phase errors: (predicted - measured) / measured step, in %%\n",
              most_runs > 1 ? "; a case measured by several runs of its command: the median over them (runs column)" : "");
  std::string header = "| case | ranks | tp x pp x dp | strategy | runs | measured | predicted [interval] | error |";
  std::string rule = "|---|---|---|---|---|---|---|---|";
  for (const std::string& name : project::step_components()) header += " " + name + " |", rule += "---|";
  std::printf("%s\n%s\n", header.c_str(), rule.c_str());
  for (std::size_t i = 0; i < in.steps.size(); ++i) {
    const project::StepCase& s = in.steps[i];
    const project::PredictedStep& p = predicted[i];
    const MeasuredCase& m = in.measured[i];
    std::string row = "| " + std::to_string(i) + " | " + std::to_string(s.grid.size()) + " | " + std::to_string(s.grid.tp) +
                      " x " + std::to_string(s.grid.pp) + " x " + std::to_string(s.grid.dp) + " | " + s.label +
                      (s.grid.pp > 1 ? " " + std::string(train::name(s.config.schedule)) : "") + " | " +
                      std::to_string(m.runs) + " | " + duration(m.step_s) + " | " + duration(p.prediction.step_s) + " [" + duration(p.prediction.step_low_s) +
                      ", " + duration(p.prediction.step_high_s) + "] | " +
                      format_fixed(100 * (p.prediction.step_s / m.step_s - 1), 1) + "% |";
    for (const std::string& name : project::step_components())
      row += " " + format_fixed(100 * (project::component(p.prediction.mean, name) - m.phases.at(name)) / m.step_s, 1) + " |";
    std::printf("%s\n", row.c_str());
  }
}

int validate(int argc, char** argv) {
  std::vector<std::string> files;
  std::string system_path, output;
  bool quiet = false;
  Cli cli("strata-project validate",
          "Every measured strata-step case of the files predicted on a system description fitted from benchmark runs "
          "only, beside its measured step and phases, with the errors.");
  PublishedOptions published;
  cli.positionals("STEPFILE", "Strata result files with strata-step runs (HDF5)", files, 0);
  cli.option("system", 0, "the system description (JSON, e.g. strata-project calibrate's, or a shipped one by name), never "
             "fitted from step runs",
             system_path);
  cli.option("published", 0, "instead of STEPFILEs: a set of published training steps (project/published/steps.json, or by name: steps), "
             "each row predicted on the description of its GPU", published.file);
  cli.option("systems", 0, "with --published: GPU=FILE,... descriptions instead of the set's own (GPU: a row's, e.g. H100-80GB, or a generation: A100, H100)", published.systems);
  cli.choice("part", 0, "with --published: the rows to predict", published.part, {"all", "calibration", "held-out"});
  cli.option("only", 0, "with --published: these rows (ids, comma-separated)", published.only);
  cli.flag("bench", 0, "with --published: judge the held-out errors against their targets (exit 3 when missed)",
           published.bench);
  std::string simulator = "fast";
  cli.choice("simulator", 0, "fast or exact, as predict's", simulator, {"fast", "exact"});
  cli.option("output", 'O', "results file to append the run to (default: a new file in results/runs/)", output);
  cli.flag("quiet", 'q', "print only the error table's summary line and errors", quiet);
  if (!cli.parse(argc, argv)) return 0;
  if (!published.file.empty()) {
    if (!files.empty() || !system_path.empty())
      throw UsageError("--published predicts the set's rows on their GPUs' descriptions: give no STEPFILE and no --system");
    published.output = output, published.quiet = quiet, published.exact = simulator == "exact";
    return validate_published(published, argc, argv, cli.resolved_json());
  }
  for (const char* flag : {"systems", "only", "bench"})
    if (cli.given(flag)) throw UsageError(std::string("--") + flag + " applies to --published only");
  if (files.empty()) throw UsageError("expected at least one STEPFILE argument, or --published FILE (see --help)");
  if (system_path.empty()) throw UsageError("--system FILE is required: the system description to predict on");
  system_path = find_system_file(system_path);
  std::vector<FileArg> inputs = {{"--system", system_path, ""}};
  for (const std::string& file : files) inputs.push_back({"STEPFILE", file, ""});
  check_outputs(inputs, {{"-O/--output", output, ""}}, {});
  check_results_output(output);
  const project::System system = read_system(system_path);
  if (const std::string field = fitted_from_steps(system); !field.empty())
    throw UsageError("system description " + system_path + ": its " + field +
                     " says it was fitted from strata-step runs; validation needs a description fitted from benchmark runs "
                     "only (strata-project calibrate reads strata-gemm, strata-attention, strata-collective and "
                     "strata-interference runs), never from the steps it checks");
  if (!system.device.compute.count("fp32"))
    throw UsageError("system description " + system_path + " has no fp32 compute: the CPU step runs in fp32");

  const MeasuredSteps in = read_measured_steps(files, simulator == "exact");
  std::vector<project::PredictedStep> predicted;
  for (std::size_t i = 0; i < in.steps.size(); ++i) {
    const MeasuredCase& m = in.measured[i];
    try {
      predicted.push_back(project::predict_step(in.steps[i], system));
    } catch (const UsageError&) {
      throw;
    } catch (const std::invalid_argument& e) {
      throw UsageError(m.file + " run " + m.run_id + " case " + std::to_string(m.step_case) + ": " + e.what());
    }
  }

  Table validation = validation_table();
  Table prediction = prediction_table();
  double sum_abs = 0, worst = 0;
  std::size_t worst_at = 0;
  for (std::size_t i = 0; i < in.steps.size(); ++i) {
    add_prediction_row(prediction, static_cast<int64_t>(i), in.steps[i], predicted[i], system.name);
    add_validation_row(validation, i, in.steps[i], predicted[i], in.measured[i]);
    const double error = std::abs(predicted[i].prediction.step_s / in.measured[i].step_s - 1);
    sum_abs += error;
    if (error >= worst) worst = error, worst_at = i;
  }
  const double mean_abs = sum_abs / static_cast<double>(in.steps.size());

  ProjectRun run(output, "validate", argc, argv, cli.resolved_json(),
                 {{"system", system.name}, {"system_file", system_path}, {"system_comment", system.comment}});
  run.append(prediction);
  run.append(validation);
  run.finish();

  if (!quiet) {
    std::printf("# strata-project validate: %zu strata-step case(s) of %zu file(s) predicted on %s (%s)\n", in.steps.size(),
                files.size(), system.name.c_str(), system_path.c_str());
    for (const std::string& note : in.notes) std::printf("# note: %s\n", note.c_str());
    print_validation(in, predicted);
  }
  std::printf("# step time error over %zu case(s): mean absolute %.1f%%, worst %.1f%% (case %zu: %s)\n", in.steps.size(),
              100 * mean_abs, 100 * worst, worst_at, in.steps[worst_at].label.c_str());
  if (!quiet) std::printf("# results: %s\n", run.path().c_str());
  return 0;
}

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int, char**);
};

const Command kCommands[] = {
    {"calibrate", "fit a system description from result files", calibrate},
    {"predict", "predict a training step on a system description", predict},
    {"validate", "predict measured strata-step cases and compare", validate},
    {"search", "rank training configurations by predicted step time", project_search},
    {"speed", "time the prediction of the largest configurations against its target", project_speed},
};

std::string usage() {
  std::string text = "usage: strata-project COMMAND [options]   (strata-project COMMAND --help for its options)\n"
                     "commands:\n";
  for (const Command& c : kCommands) text += "  " + std::string(c.name) + "  " + c.summary + "\n";
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  strata::h5::silence_library_errors();
  if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    std::fputs(usage().c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  for (const Command& command : kCommands) {
    if (name != command.name) continue;
    try {
      return command.run(argc - 1, argv + 1);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "strata-project %s: error: %s\n", command.name, e.what());
      return 2;
    } catch (const std::bad_alloc&) {
      // A trace reserves address space for the step's activations and holds every op: a configuration beyond this
      // machine's memory or address space ends here.
      std::fprintf(stderr, "strata-project %s: error: out of memory (std::bad_alloc): the configuration is too large "
                   "to trace on this machine; check the model, batch and grid flags%s\n", command.name,
                   std::string(command.name) == "search" ? " (and --threads: each thread holds a trace)" : "");
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "strata-project %s: failed: %s\n", command.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "strata-project: error: unknown command '%s'\n%s", name.c_str(), usage().c_str());
  return 2;
}
