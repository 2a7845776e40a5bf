#include "bench/project/prediction.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>

#include "build_info.h"
#include "bench/harness/check.h"
#include "bench/harness/context.h"
#include "bench/cases/recompute_policy.h"
#include "git_commit.h"
#include "results/schema.h"
#include "results/writer.h"
#include "train/overlap.h"

namespace strata {

using namespace strata::train;

using project::PredictedStep;
using project::StepCase;

int gradient_reduction_bytes(const std::string& dtype) { return dtype == "fp32" ? 4 : dtype == "auto" ? 0 : 2; }

void check_attention(const project::System& system, const std::string& attention, const std::string& flag) {
  if (attention == "flash" || attention == "unfused" || system.device.attention_kernels.contains(attention)) return;
  std::string names = "flash, unfused";
  for (const auto& [kernel, speed] : system.device.attention_kernels) names += ", " + kernel;
  throw UsageError(flag + " " + attention + ": the system description '" + system.name + "' has no attention kernel " +
                   "of that name (it takes " + names + ")");
}

void check_sharding_algorithm(const project::System& system, const std::string& algorithm, const std::string& flag) {
  if (algorithm.empty()) return;
  std::set<std::string> have;
  for (const project::CollectiveModel& m : system.collectives) {
    if (m.algorithm == algorithm) return;
    have.insert(m.algorithm);
  }
  std::string names;
  for (const std::string& name : have) names += (names.empty() ? "" : ", ") + name;
  throw UsageError(flag + " " + algorithm + ": the system description '" + system.name + "' has no collectives of that " +
                   "algorithm (it has " + (names.empty() ? std::string("none") : names) + ")");
}

StepCase first_step_case(const StepPlan& plan, const StepFlags& flags, const std::string& label, int ranks_per_node) {
  StepCase step;
  step.label = label;
  step.config = plan.config;
  step.config.strategy = plan.strategies.front(), step.config.recompute = plan.modes.front();
  step.grid = plan.grid;
  step.trace.ranks_per_node = ranks_per_node;
  step.trace.grid_order = flags.grid_order;
  return step;
}

std::vector<TrainConfig> overlap_configs(const TrainConfig& config, const coll::GridShape& grid, const nlohmann::json& policy,
                                         const std::string& source) {
  if (!policy.is_object() || !policy.contains("placement") || !policy["placement"].is_array())
    throw UsageError("recompute policy " + source + ": \"placement\" must be an array");
  std::size_t claimed = 0;
  // Each rank's problem takes the policy's entries that name its ops (and any malformed entry, for its message).
  auto placement_of = [&](const PlacementProblem& problem) {
    std::set<std::string> mine;
    for (const RecomputableOp& op : problem.ops) mine.insert(op.name);
    nlohmann::json own = policy;
    own["placement"] = nlohmann::json::array();
    for (const nlohmann::json& entry : policy["placement"])
      if (!entry.is_object() || !entry.contains("op") || !entry["op"].is_string() || mine.count(entry["op"].get<std::string>()))
        own["placement"].push_back(entry);
    claimed += own["placement"].size();
    return placement_from_json(problem, own, source);
  };
  std::vector<TrainConfig> configs = placed_rank_configs(config, grid, placement_of);
  if (claimed != policy["placement"].size())
    throw UsageError("recompute policy " + source + ": " + std::to_string(policy["placement"].size() - claimed) +
                     " entries name no op of this configuration");
  return configs;
}

std::string fitted_from_steps(const project::System& s) {
  std::vector<std::pair<std::string, std::string>> texts = {{"comment", s.comment}, {"device.source", s.device.source},
                                                            {"device.memory_bandwidth", s.device.memory_bandwidth.source},
                                                            {"device.memory_efficiency", s.device.memory_efficiency.source},
                                                            {"network.intra_node", s.intra_node.source},
                                                            {"network.intra_node.bandwidth", s.intra_node.bandwidth.source},
                                                            {"network.intra_node.latency", s.intra_node.latency.source},
                                                            {"network.inter_node", s.inter_node.source},
                                                            {"network.inter_node.bandwidth", s.inter_node.bandwidth.source},
                                                            {"network.inter_node.latency", s.inter_node.latency.source},
                                                            {"overlap_slowdown", s.overlap_slowdown.source}};
  if (s.communication_slowdown) texts.emplace_back("communication_slowdown", s.communication_slowdown->source);
  if (s.collective_contention) texts.emplace_back("collective_contention", s.collective_contention->source);
  if (s.ring_latency) texts.emplace_back("network.ring_latency", s.ring_latency->source);
  for (const auto& [dtype, c] : s.device.compute) {
    const std::string at = "device.compute." + dtype;
    texts.emplace_back(at + ".peak_flops", c.peak_flops.source);
    texts.emplace_back(at + ".efficiency", c.efficiency.source);
    for (const auto& [pass, curve] : c.attention_efficiency) texts.emplace_back(at + ".attention_efficiency." + pass, curve.source);
  }
  for (const auto& [kernel, speed] : s.device.attention_kernels) {
    texts.emplace_back("device.attention_kernels." + kernel + ".forward", speed.forward.source);
    texts.emplace_back("device.attention_kernels." + kernel + ".backward", speed.backward.source);
  }
  for (std::size_t i = 0; i < s.collectives.size(); ++i)
    texts.emplace_back("collectives[" + std::to_string(i) + "]", s.collectives[i].source);
  for (const auto& [kernel, rate] : s.device.elementwise_kernels)
    texts.emplace_back("device.elementwise.kernels." + kernel, rate.source);
  if (s.device.elementwise_bandwidth) texts.emplace_back("device.elementwise.bandwidth", s.device.elementwise_bandwidth->source);
  for (const auto& [field, text] : texts)
    if (text.find("strata-step") != std::string::npos) return field;
  return "";
}

namespace {

const char* const kRoles[] = {"tp", "pp", "dp", "dp_intra", "dp_inter"};
const char* const kMemory[] = {"parameters", "gradients", "optimizer", "activations", "workspace", "comm_buffers"};

double memory_of(const MemoryUse& m, const std::string& category) {
  if (category == "parameters") return m.params;
  if (category == "gradients") return m.grads;
  if (category == "optimizer") return m.optimizer;
  if (category == "activations") return m.activations;
  if (category == "workspace") return m.workspace;
  return m.comm_buffers;
}

}  // namespace

Table prediction_table() {
  Table t("prediction");
  using K = ColumnKind;
  t.add_column("case", K::int64, "1", "prediction index within the run, from 0")
      .add_column("label", K::string, "")
      .add_column("model", K::string, "")
      .add_column("layers", K::int64, "1").add_column("hidden", K::int64, "1").add_column("heads", K::int64, "1")
      .add_column("kv_heads", K::int64, "1").add_column("vocab", K::int64, "1").add_column("mlp_hidden", K::int64, "1")
      .add_column("parameters", K::float64, "1", "N, the model's")
      .add_column("seq", K::int64, "1").add_column("micro_batch", K::int64, "1", "rows per rank")
      .add_column("accumulation", K::int64, "1", "micro-batches per step")
      .add_column("global_batch", K::int64, "1", "rows per step")
      .add_column("strategy", K::string, "", "P.G.OS")
      .add_column("recompute", K::string, "")
      .add_column("tp", K::int64, "1").add_column("pp", K::int64, "1").add_column("dp", K::int64, "1")
      .add_column("ranks", K::int64, "1").add_column("ranks_per_node", K::int64, "1", "the traced job's nodes")
      .add_column("grid_order", K::string, "")
      .add_column("schedule", K::string, "").add_column("virtual_stages", K::int64, "1")
      .add_column("stage_layers", K::string, "1", "layers of each pipeline stage, in stage order")
      .add_column("sp", K::int64, "1", "sequence parallelism (1: on)")
      .add_column("comm_algo", K::string, "")
      .add_column("overlap", K::int64, "1", "gradient reductions during backward (1: on)")
      .add_column("overlap_param_gather", K::int64, "1", "the optimizer's parameter gathers beside the next forward (1: on)")
      .add_column("tp_comm_overlap", K::int64, "1", "tensor-parallel communication beside the GEMMs (1: on)")
      .add_column("sharding_collectives", K::string, "",
                  "the description's algorithm the data-parallel allgathers and reduce-scatters were costed under "
                  "(empty: as traced)")
      .add_column("system", K::string, "", "the system description's name")
      .add_column("dtype", K::string, "", "of GEMMs and attention")
      .add_column("attention", K::string, "",
                  "how attention ran: flash (the description's fused kernel), unfused (the scores materialised) or "
                  "another kernel the description names")
      .add_column("element_bytes", K::int64, "B",
                  "of activations, gradients and the step's collectives (the gradient reductions': "
                  "gradient_reduction_bytes where it is set)")
      .add_column("loss", K::string, "",
                  "how the cross entropy ran over the logits: fused (kernels on the logits as they are), fp32 (pass by "
                  "pass, as Megatron's unfused vocab-parallel cross entropy) or fp32-fused (Megatron-Core's loss "
                  "fusion)")
      .add_column("dropout", K::int64, "",
                  "1: the model's dropout masks are held as activations in a 16-bit step's memory estimate (the fp32 "
                  "estimate, the CPU step's, has none)")
      .add_column("sharding_buffers", K::string, "",
                  "how a 16-bit step's memory estimate holds the sharded parameters' gathers and gradients' reductions "
                  "in flight: strata (the step's own pools), fsdp (PyTorch FSDP) or deepspeed (DeepSpeed ZeRO's "
                  "defaults)")
      .add_column("gradient_reduction_bytes", K::int64, "B",
                  "of the data-parallel gradient reductions' elements where the framework reduces in another precision "
                  "(0: element_bytes)")
      .add_column("step_time", K::float64, "s", "simulated: the last op's end over all ranks")
      .add_column("step_time_low", K::float64, "s",
                  "simulated on the description with every figure at the faster end of its relative spread")
      .add_column("step_time_high", K::float64, "s",
                  "simulated on the description with every figure at the slower end of its relative spread");
  for (const std::string& name : project::step_components())
    t.add_column("phase_" + name, K::float64, "s", "simulated, mean over ranks, strata-step's phase convention");
  for (const char* role : kRoles)
    t.add_column(std::string("comm_exposed_") + role, K::float64, "s",
                 "simulated waits for the group role's operations, mean over ranks");
  t.add_column("tokens_per_s", K::float64, "1/s", "tokens of the global batch over the predicted step")
      .add_column("flop", K::float64, "FLOP", "model FLOPs per rank per step: (6N + 6Lhs) x tokens / ranks")
      .add_column("flop_recompute", K::float64, "FLOP", "recomputed FLOPs per rank per step")
      .add_column("peak_per_rank", K::float64, "FLOP/s", "the description's dense peak of the dtype")
      .add_column("mfu", K::float64, "1", "model FLOPs / (predicted step x peak x ranks)")
      .add_column("hfu", K::float64, "1", "(model + recomputed FLOPs) / (predicted step x peak x ranks)");
  for (const char* category : kMemory)
    t.add_column(std::string("memory_") + category, K::float64, "B",
                 "formula (train/step_formulas.h; element_bytes 2: a GPU step's, train/gpu_memory.h), max over ranks");
  t.add_column("memory_capacity", K::float64, "B", "the description's device.memory_capacity; 0: not given")
      .add_column("fits", K::int64, "1", "1: the memory per rank (all categories) is within the capacity; 0: above it; "
                  "-1: no capacity given");
  t.add_column("trace_seconds", K::float64, "s", "wall time of tracing the step")
      .add_column("simulate_seconds", K::float64, "s", "wall time of the three simulations");
  return t;
}

void add_prediction_row(Table& t, int64_t index, const StepCase& step, const PredictedStep& p, const std::string& system_name) {
  const TrainConfig& c = step.config;
  const project::StepComponents& mean = p.prediction.mean;
  t.set("case", index).set("label", step.label).set("model", c.model.name)
      .set("layers", c.model.layers).set("hidden", c.model.hidden).set("heads", c.model.heads)
      .set("kv_heads", c.model.kv_heads).set("vocab", c.model.vocab).set("mlp_hidden", c.model.mlp())
      .set("parameters", static_cast<double>(c.model.parameters()))
      .set("seq", c.seq).set("micro_batch", c.micro_batch).set("accumulation", c.accumulation)
      .set("global_batch", static_cast<int64_t>(step.grid.dp) * c.accumulation * c.micro_batch)
      .set("strategy", c.strategy.name()).set("recompute", name(c.recompute))
      .set("tp", step.grid.tp).set("pp", step.grid.pp).set("dp", step.grid.dp)
      .set("ranks", static_cast<int64_t>(step.grid.size()))
      .set("ranks_per_node", static_cast<int64_t>(std::min<long long>(step.trace.ranks_per_node, step.grid.size())))
      .set("grid_order", step.trace.grid_order).set("schedule", name(c.schedule)).set("virtual_stages", c.virtual_stages)
      .set("stage_layers", p.stage_layers).set("sp", c.sequence_parallel ? 1 : 0)
      .set("comm_algo", std::string(coll::name(c.comm_algo))).set("overlap", c.overlap ? 1 : 0)
      .set("overlap_param_gather", step.trace.overlap_param_gather ? 1 : 0)
      .set("tp_comm_overlap", step.trace.tp_comm_overlap ? 1 : 0)
      .set("sharding_collectives", step.workload.sharding_algorithm)
      .set("system", system_name).set("dtype", step.workload.dtype).set("attention", step.workload.attention)
      .set("element_bytes", step.workload.element_bytes)
      .set("gradient_reduction_bytes", step.workload.gradient_reduction_bytes).set("loss", step.workload.loss)
      .set("dropout", step.workload.dropout ? 1 : 0).set("sharding_buffers", step.workload.sharding_buffers)
      .set("step_time", p.prediction.step_s).set("step_time_low", p.prediction.step_low_s)
      .set("step_time_high", p.prediction.step_high_s);
  for (const std::string& n : project::step_components()) t.set("phase_" + n, project::component(mean, n));
  for (const char* role : kRoles) {
    const auto it = mean.exposed_by_role.find(role);
    t.set(std::string("comm_exposed_") + role, it == mean.exposed_by_role.end() ? 0.0 : it->second);
  }
  t.set("tokens_per_s", p.tokens_per_s).set("flop", p.flop_per_rank).set("flop_recompute", p.recompute_flop_per_rank)
      .set("peak_per_rank", p.peak_per_rank).set("mfu", p.mfu).set("hfu", p.hfu);
  for (const char* category : kMemory) t.set(std::string("memory_") + category, memory_of(p.memory, category));
  t.set("memory_capacity", p.memory_capacity).set("fits", static_cast<int64_t>(p.fits));
  t.set("trace_seconds", p.trace_s).set("simulate_seconds", p.simulate_s);
  t.end_row();
}

void check_results_output(const std::string& path) {
  if (!path.empty()) validate_output_path(path);
}

ProjectRun::ProjectRun(const std::string& path, const std::string& command, int argc, const char* const* argv,
                       const std::string& config_json, const std::map<std::string, std::string>& attributes) {
  run_id_ = new_run_id();
  path_ = path;
  if (path_.empty()) {
    std::filesystem::create_directories("results/runs");
    path_ = "results/runs/strata-project-" + run_id_ + ".h5";
  }
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const std::string hosts = nlohmann::json(std::vector<std::string>{host}).dump();
  std::map<std::string, std::string> attrs = attributes;
  attrs.emplace("benchmark", "strata-project");
  attrs["command"] = command;
  attrs["command_line"] = command_line(argc, argv);
  attrs["config_json"] = config_json;
  attrs["start_utc"] = utc_now_iso();
  attrs["launcher"] = "singleton";
  attrs["slurm_job_id"] = attrs["slurm_nodelist"] = attrs["slurm_tasks_per_node"] = "";
  attrs["n_nodes"] = attrs["n_ranks"] = attrs["ranks_per_node"] = "1";
  attrs["hosts"] = hosts;
  writer_ = std::make_unique<ResultsWriter>(path_, run_id_, attrs, [this](double seconds) {
    std::fprintf(stderr, "strata-project: %s; waiting up to %.0f s for it to finish\n", in_use_message(path_).c_str(),
                 seconds);
  });
  writer_->write_env({{"hosts", hosts}, {"command_line", attrs["command_line"]}, {"compiler", STRATA_BUILD_COMPILER},
                      {"cxx_flags", STRATA_BUILD_CXX_FLAGS}, {"build_type", STRATA_BUILD_TYPE},
                      {"sanitizers", STRATA_BUILD_SANITIZE}, {"git_commit", STRATA_GIT_COMMIT}});
}

ProjectRun::~ProjectRun() {
  if (writer_ && !finished_) {
    try {
      writer_->finish(schema::kStatusFailed);
    } catch (...) {
      // A destructor must not throw; the run keeps the "interrupted" status written at its start.
    }
  }
}

void ProjectRun::append(const Table& table) {
  writer_->append(table);
  writer_->flush();
}

void ProjectRun::set_run_attr(const std::string& name, const std::string& value) { writer_->set_run_attr(name, value); }

void ProjectRun::finish() {
  writer_->finish(schema::kStatusOk);
  finished_ = true;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp-" + std::to_string(getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw UsageError("cannot write " + path);
    out << text;
    out.close();
    if (!out) {
      std::filesystem::remove(temporary);
      throw UsageError("cannot write " + path);
    }
  }
  std::filesystem::rename(temporary, path);
}

}  // namespace strata
