// Implementation of the published-step validation (see published.h).
#include "bench/project/published.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "bench/harness/check.h"
#include "bench/harness/cli.h"
#include "bench/harness/harness.h"
#include "bench/harness/json_file.h"
#include "bench/harness/output_files.h"
#include "bench/project/prediction.h"
#include "bench/harness/shipped_files.h"
#include "bench/cases/step_config.h"
#include "bench/project/system_json.h"

namespace strata {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kFormat = "strata-published-steps";

// One row as the validation reads it: its configuration as strata-step's flags, or why it cannot be predicted.
struct Row {
  std::string id, part, gpu, family, table;
  std::string generation;  // "A100" or "H100"
  StepFlags flags;
  int gpus = 0;
  std::string dtype;
  std::string attention = "flash";  // flash, unfused (the scores materialised), or a kernel the description names
  bool tp_comm_overlap = false, overlap_param_gather = false;  // predict's defaults where the row says nothing
  std::string sharding_collectives;  // the description's algorithm of the framework's sharding collectives
  int gradient_reduction_bytes = 0;  // grad_reduce_dtype: 4 for fp32, 2 for bf16 or fp16; 0: as the step's elements
  std::string loss = "fused";  // or fp32 / fp32-fused: the framework's cross entropy on fp32 logits
  bool dropout = true;         // the model's dropout masks held in memory
  std::string sharding_buffers = "strata";  // how its framework holds sharded states in flight (memory only)
  double measured_s = 0;
  bool derived = false;  // the step time is derived from a published throughput
  std::string skipped;   // why the row is not predicted; empty when it is
};

std::string text_of(const json& value) { return value.is_string() ? value.get<std::string>() : value.dump(); }

class RowReader {
 public:
  RowReader(const json& row, std::string where) : row_(row), where_(std::move(where)) {}

  // A field that must be there: UsageError naming the row and the field otherwise.
  std::string text(const std::string& name) const {
    if (!row_.contains(name) || !row_[name].is_string()) fail(name, "a string is required");
    return row_[name].get<std::string>();
  }
  // An integer field; nullopt when null or absent (a figure the source does not state).
  std::optional<int64_t> integer(const std::string& name) const {
    if (!row_.contains(name) || row_[name].is_null()) return std::nullopt;
    if (!row_[name].is_number()) fail(name, "a number is required, got " + text_of(row_[name]));
    const double value = row_[name].get<double>();
    if (!std::isfinite(value) || value != std::floor(value) || value < 0 || value > 1e15)
      fail(name, "a whole number >= 0 is required, got " + text_of(row_[name]));
    return static_cast<int64_t>(value);
  }
  std::optional<double> number(const std::string& name) const {
    if (!row_.contains(name) || row_[name].is_null()) return std::nullopt;
    if (!row_[name].is_number() || !std::isfinite(row_[name].get<double>()) || row_[name].get<double>() <= 0)
      fail(name, "a positive number is required, got " + text_of(row_[name]));
    return row_[name].get<double>();
  }
  std::optional<std::string> optional_text(const std::string& name) const {
    if (!row_.contains(name) || row_[name].is_null()) return std::nullopt;
    if (!row_[name].is_string()) fail(name, "a string is required, got " + text_of(row_[name]));
    return row_[name].get<std::string>();
  }
  bool flag(const std::string& name, bool otherwise = false) const {
    if (!row_.contains(name) || row_[name].is_null()) return otherwise;
    if (!row_[name].is_boolean()) fail(name, "true or false is required, got " + text_of(row_[name]));
    return row_[name].get<bool>();
  }
  [[noreturn]] void fail(const std::string& name, const std::string& what) const {
    throw UsageError(where_ + ": field " + name + ": " + what);
  }

 private:
  const json& row_;
  std::string where_;
};

// The MLP width of strata's two-matrix MLP with the same FLOPs and parameters: a gated MLP (SwiGLU) multiplies
// three matrices of hidden x ffn, which two of hidden x 1.5 ffn match.
int64_t mlp_width(const std::string& architecture, int64_t ffn) {
  const bool gated = architecture.find("SwiGLU") != std::string::npos || architecture.find("GeGLU") != std::string::npos;
  return gated ? ffn * 3 / 2 : ffn;
}

std::string dtype_of(const std::string& precision) {
  if (precision.find("fp8") != std::string::npos) return "fp8";
  if (precision.find("fp16") != std::string::npos) return "fp16";
  return "bf16";
}

Row read_row(const json& value, std::size_t index, const std::string& file) {
  if (!value.is_object()) throw UsageError("published set " + file + ": row " + std::to_string(index) + " is not an object");
  const std::string id = value.contains("id") && value["id"].is_string() ? value["id"].get<std::string>()
                                                                          : "#" + std::to_string(index);
  const RowReader r(value, "published set " + file + ": row " + id);
  Row row;
  row.id = r.text("id");
  row.part = r.text("split");
  if (row.part != "calibration" && row.part != "held-out") r.fail("split", "calibration or held-out, got '" + row.part + "'");
  row.gpu = r.text("gpu");
  row.family = r.optional_text("family").value_or("");
  row.table = r.optional_text("table").value_or("");
  row.generation = row.gpu.rfind("A100", 0) == 0 ? "A100" : row.gpu.rfind("H100", 0) == 0 ? "H100" : row.gpu;
  const std::optional<double> step = r.number("step_time_s"), derived = r.number("derived_step_time_s");
  if (!step && !derived) r.fail("step_time_s", "neither a published nor a derived step time");
  row.measured_s = step ? *step : *derived;
  row.derived = !step;

  // What strata's model does not have: the row is listed with the reason instead of predicted.
  std::vector<std::string> missing;
  auto need = [&](const std::string& name) {
    std::optional<int64_t> v = r.integer(name);
    if (!v || *v == 0) missing.push_back(name);
    return v.value_or(0);
  };
  const int64_t layers = need("layers"), hidden = need("hidden"), heads = need("heads"), vocab = need("vocab");
  const int64_t seq = need("seq"), tp = need("tp"), pp = need("pp"), dp = need("dp"), gpus = need("gpus");
  const int64_t micro_batch = need("micro_batch"), global_batch = need("global_batch");
  if (!missing.empty()) {
    std::string names;
    for (const std::string& m : missing) names += (names.empty() ? "" : ", ") + m;
    row.skipped = "the source does not state " + names;
    return row;
  }
  if (r.integer("cp").value_or(1) > 1) {
    row.skipped = "context parallelism (cp " + std::to_string(*r.integer("cp")) + ") is not modelled";
    return row;
  }
  if (tp * pp * dp != gpus) r.fail("gpus", std::to_string(gpus) + " is not tp x pp x dp = " + std::to_string(tp * pp * dp));
  // Stated beside the batch and the grid, these must agree with them (a transcription error otherwise).
  if (const std::optional<int64_t> accumulation = r.integer("grad_accum");
      accumulation && (global_batch % dp != 0 || global_batch / dp % micro_batch != 0 ||
                       global_batch / dp / micro_batch != *accumulation))
    r.fail("grad_accum", std::to_string(*accumulation) + " is not global_batch / (dp x micro_batch) = " +
                             std::to_string(global_batch) + " / (" + std::to_string(dp) + " x " +
                             std::to_string(micro_batch) + ")");
  if (const std::optional<int64_t> per_node = r.integer("gpus_per_node"); per_node && *per_node < 1)
    r.fail("gpus_per_node", "a whole number >= 1 is required, got 0");
  StepFlags& f = row.flags;
  f.layers = static_cast<int>(layers), f.hidden = static_cast<int>(hidden), f.heads = static_cast<int>(heads);
  f.vocab = static_cast<int>(vocab), f.seq = static_cast<int>(seq), f.positions = static_cast<int>(seq);
  f.kv_heads = static_cast<int>(r.integer("kv_heads").value_or(0));
  f.mlp_hidden = static_cast<int>(mlp_width(r.optional_text("architecture").value_or(""),
                                            r.integer("ffn_hidden").value_or(4 * hidden)));
  f.grid = "tp=" + std::to_string(tp) + ",pp=" + std::to_string(pp) + ",dp=" + std::to_string(dp);
  if (const int64_t v = r.integer("virtual_stages").value_or(1); v > 1) f.schedule = "interleaved", f.virtual_stages = static_cast<int>(v);
  f.micro_batch = static_cast<int>(micro_batch), f.micro_batch_given = true;
  f.global_batch = global_batch;
  f.recompute = r.optional_text("recompute").value_or("none");
  f.sp = r.flag("sequence_parallel");
  const int64_t zero = r.integer("zero").value_or(r.flag("distributed_optimizer") ? 1 : 0);
  if (zero > 3) r.fail("zero", "a ZeRO stage 0-3 is required");
  f.zero = std::to_string(zero);
  row.gpus = static_cast<int>(gpus);
  const std::string precision = r.optional_text("precision").value_or("bf16");
  if (precision.find("bf16") == std::string::npos && precision.find("fp16") == std::string::npos &&
      precision.find("fp8") == std::string::npos)
    r.fail("precision", "a text naming bf16, fp16 or fp8 is required, got '" + precision + "'");
  row.dtype = dtype_of(precision);
  // A kernel's name is checked against the row's description when the row is predicted.
  row.attention = r.optional_text("attention").value_or("flash");
  if (row.attention.empty()) r.fail("attention", "flash, unfused or a kernel its description names; got an empty text");
  // What the row's framework overlapped; unstated: strata-project predict's defaults (gradient reductions during
  // backward on, the rest off).
  f.overlap = r.flag("overlap_grad_reduce", true) ? "on" : "off";
  row.overlap_param_gather = r.flag("overlap_param_gather");
  row.tp_comm_overlap = r.flag("tp_comm_overlap");
  row.sharding_collectives = r.optional_text("sharding_collectives").value_or("");
  if (const std::optional<std::string> reduce = r.optional_text("grad_reduce_dtype")) {
    const bool known = std::find(kGradReduceDtypes.begin(), kGradReduceDtypes.end(), *reduce) != kGradReduceDtypes.end();
    if (!known || *reduce == "auto")
      r.fail("grad_reduce_dtype", "fp32, bf16 or fp16, got '" + *reduce + "'");
    row.gradient_reduction_bytes = gradient_reduction_bytes(*reduce);
  }
  row.loss = r.optional_text("loss").value_or("fused");
  if (std::find(kLossModes.begin(), kLossModes.end(), row.loss) == kLossModes.end())
    r.fail("loss", join_names(kLossModes) + ", got '" + row.loss + "'");
  row.dropout = r.flag("dropout", true);
  row.sharding_buffers = r.optional_text("sharding_buffers").value_or("strata");
  if (const std::vector<std::string>& names = train::sharding_buffer_names();
      std::find(names.begin(), names.end(), row.sharding_buffers) == names.end())
    r.fail("sharding_buffers", join_names(names) + ", got '" + row.sharding_buffers + "'");
  if (row.tp_comm_overlap && !f.sp)
    r.fail("tp_comm_overlap", "true needs sequence_parallel true (the overlapped communication is its all-gathers and "
                              "reduce-scatters)");
  return row;
}

// GPU name -> description file: the set's own map (paths relative to the set's folder), then --systems, whose
// names are a row's GPU ("H100-80GB") or a generation ("H100": every row of it) and must name one of the rows';
// a GPU's own entry wins over its generation's, whatever their order.
std::map<std::string, std::string> system_files(const json& set, const std::string& file, const std::string& overrides,
                                                const std::vector<Row>& rows) {
  std::map<std::string, std::string> files;
  if (set.contains("systems")) {
    if (!set["systems"].is_object()) throw UsageError("published set " + file + ": \"systems\" must map GPU names to files");
    for (const auto& [gpu, path] : set["systems"].items()) {
      if (!path.is_string()) throw UsageError("published set " + file + ": systems." + gpu + " must be a file name");
      const fs::path p = path.get<std::string>();
      files[gpu] = (p.is_absolute() ? p : fs::path(file).parent_path() / p).lexically_normal().string();
    }
  }
  if (overrides.empty()) return files;
  std::set<std::string> known;
  for (const Row& row : rows) known.insert(row.gpu), known.insert(row.generation);
  std::map<std::string, std::string> given;  // GPU or generation -> file
  for (const std::string& item : split_list(overrides, "--systems")) {
    const std::size_t equals = item.find('=');
    if (equals == std::string::npos || equals == 0 || equals + 1 == item.size())
      throw UsageError("--systems: expected GPU=FILE, got '" + item + "'");
    const std::string gpu = item.substr(0, equals);
    if (!known.count(gpu)) {
      std::string names;
      for (const std::string& name : known) names += (names.empty() ? "" : ", ") + name;
      throw UsageError("--systems: no row of " + file + " runs on '" + gpu + "' (its GPUs and generations: " + names + ")");
    }
    if (given.count(gpu)) throw UsageError("--systems: " + gpu + " given twice");
    given[gpu] = item.substr(equals + 1);
  }
  for (const Row& row : rows)
    if (auto own = given.find(row.gpu); own != given.end()) files[row.gpu] = own->second;
    else if (auto generation = given.find(row.generation); generation != given.end()) files[row.gpu] = generation->second;
  return files;
}

struct Result {
  const Row* row = nullptr;
  project::PredictedStep predicted;
  double error = 0;  // predicted / measured - 1
};

struct Summary {
  std::size_t count = 0;
  double sum_abs = 0, sum = 0, worst = 0;
  std::string worst_id;
  void add(const Result& r) {
    ++count, sum += r.error, sum_abs += std::abs(r.error);
    if (std::abs(r.error) >= worst) worst = std::abs(r.error), worst_id = r.row->id;
  }
  double mean_abs() const { return count ? sum_abs / static_cast<double>(count) : 0; }
  double mean() const { return count ? sum / static_cast<double>(count) : 0; }
};

Table published_table() {
  using K = ColumnKind;
  Table t("published_validation");
  t.add_column("case", K::int64, "1", "the row's index in the prediction table")
      .add_column("id", K::string, "", "the row's id in the published set")
      .add_column("part", K::string, "", "calibration or held-out")
      .add_column("gpu", K::string, "").add_column("generation", K::string, "", "A100 or H100")
      .add_column("family", K::string, "", "3d (tensor, pipeline, data) or sharded-dp (ZeRO, FSDP)")
      .add_column("source_table", K::string, "", "the publication and table the row comes from")
      .add_column("system_file", K::string, "", "the description it was predicted on")
      .add_column("step_time_published", K::float64, "s",
                  "as published, or derived from the published throughput with the source's own FLOP or token count")
      .add_column("derived", K::int64, "1", "1: the published figure is a throughput")
      .add_column("step_time_predicted", K::float64, "s", "simulated: the last op's end over all ranks")
      .add_column("step_time_low", K::float64, "s").add_column("step_time_high", K::float64, "s")
      .add_column("step_time_error", K::float64, "1", "predicted / published - 1");
  return t;
}

std::string percent(double fraction) { return format_fixed(100 * fraction, 1) + "%"; }

}  // namespace

int validate_published(const PublishedOptions& options, int argc, char** argv, const std::string& config_json) {
  PublishedOptions o = options;
  o.file = resolve_shipped_file(o.file, "project/published");  // "steps": the set Strata ships
  if (o.part != "all" && o.part != "calibration" && o.part != "held-out")
    throw UsageError("--part: calibration, held-out or all, got '" + o.part + "'");
  const json set = read_json_file(o.file, "published set");
  if (!set.is_object() || !set.contains("format") || set["format"] != kFormat)
    throw UsageError("published set " + o.file + ": \"format\" must be \"" + kFormat + "\"");
  if (!set.contains("version") || set["version"] != 1) throw UsageError("published set " + o.file + ": \"version\" must be 1");
  if (!set.contains("rows") || !set["rows"].is_array() || set["rows"].empty())
    throw UsageError("published set " + o.file + ": \"rows\" must be a non-empty array");
  std::vector<Row> rows;
  std::set<std::string> ids;
  for (std::size_t i = 0; i < set["rows"].size(); ++i) {
    Row row = read_row(set["rows"][i], i, o.file);
    if (!ids.insert(row.id).second) throw UsageError("published set " + o.file + ": row id " + row.id + " is there twice");
    rows.push_back(std::move(row));
  }
  const std::map<std::string, std::string> files = system_files(set, o.file, o.systems, rows);
  std::set<std::string> only;
  if (!o.only.empty())
    for (const std::string& id : split_list(o.only, "--only")) {
      if (!ids.count(id)) throw UsageError("--only: no row " + id + " in " + o.file);
      only.insert(id);
    }
  std::vector<FileArg> inputs = {{"--published", o.file, ""}};
  for (const auto& [gpu, path] : files) inputs.push_back({"--systems", path, ""});
  check_outputs(inputs, {{"-O/--output", o.output, ""}}, {});
  check_results_output(o.output);

  // Every row of the part, predicted before anything is written.
  std::map<std::string, project::System> systems;
  std::vector<Result> results;
  std::vector<std::pair<const Row*, std::string>> skipped;
  std::vector<project::StepCase> cases;
  for (const Row& row : rows) {
    if (o.part != "all" && row.part != o.part) continue;
    if (!only.empty() && !only.count(row.id)) continue;
    if (!row.skipped.empty()) {
      skipped.emplace_back(&row, row.skipped);
      continue;
    }
    const auto file = files.find(row.gpu);
    if (file == files.end()) throw UsageError("published set " + o.file + ": row " + row.id + ": no description for GPU '" +
                                              row.gpu + "' (the set's \"systems\", or --systems GPU=FILE)");
    if (!systems.count(file->second)) systems.emplace(file->second, read_system(file->second));
    const project::System& system = systems.at(file->second);
    if (!system.device.compute.count(row.dtype))
      throw UsageError("system description " + file->second + " has no " + row.dtype + " compute, which row " + row.id + " needs");
    check_sharding_algorithm(system, row.sharding_collectives, "published set " + o.file + ": row " + row.id +
                                                                  ": sharding_collectives");
    check_attention(system, row.attention, "published set " + o.file + ": row " + row.id + ": attention");
    StepFlags flags = row.flags;
    StepPlan plan;
    try {
      plan = plan_step(flags, row.gpus);
    } catch (const std::invalid_argument& e) {
      throw UsageError("published set " + o.file + ": row " + row.id + ": its configuration is refused: " + e.what());
    }
    project::StepCase step = first_step_case(plan, flags, row.id, system.device.devices_per_node);
    step.trace.tp_comm_overlap = row.tp_comm_overlap;
    step.trace.overlap_param_gather = row.overlap_param_gather;
    step.workload = {row.dtype, 2, row.attention, row.sharding_collectives, row.gradient_reduction_bytes, row.loss,
                     row.dropout, row.sharding_buffers};
    step.predict.exact = o.exact;
    Result result;
    result.row = &row;
    try {
      result.predicted = project::predict_step(step, system);
    } catch (const std::invalid_argument& e) {
      throw UsageError("published set " + o.file + ": row " + row.id + ": " + e.what());
    }
    result.error = result.predicted.prediction.step_s / row.measured_s - 1;
    if (!o.quiet) {
      std::printf("# %-44s %-11s %-4s predicted %10.3f s, published %10.3f s%s: %+6.1f%% (%.2f s)\n", row.id.c_str(),
                  row.part.c_str(), row.generation.c_str(), result.predicted.prediction.step_s, row.measured_s,
                  row.derived ? " (derived)" : "", 100 * result.error, result.predicted.trace_s + result.predicted.simulate_s);
      std::fflush(stdout);
    }
    results.push_back(std::move(result));
    cases.push_back(std::move(step));
  }
  if (results.empty()) {
    std::string why;
    for (const auto& [row, reason] : skipped) why += (why.empty() ? "; not predicted: " : ", ") + row->id + " (" + reason + ")";
    throw UsageError("published set " + o.file + ": no row to predict (--part " + o.part + ")" + why);
  }

  Table prediction = prediction_table(), table = published_table();
  std::map<std::pair<std::string, std::string>, Summary> summaries;  // (part, generation)
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const Row& row = *r.row;
    add_prediction_row(prediction, static_cast<int64_t>(i), cases[i], r.predicted, systems.at(files.at(row.gpu)).name);
    table.set("case", static_cast<int64_t>(i)).set("id", row.id).set("part", row.part).set("gpu", row.gpu)
        .set("generation", row.generation).set("family", row.family).set("source_table", row.table)
        .set("system_file", files.at(row.gpu)).set("step_time_published", row.measured_s)
        .set("derived", int64_t{row.derived ? 1 : 0}).set("step_time_predicted", r.predicted.prediction.step_s)
        .set("step_time_low", r.predicted.prediction.step_low_s).set("step_time_high", r.predicted.prediction.step_high_s)
        .set("step_time_error", r.error);
    table.end_row();
    summaries[{row.part, row.generation}].add(r);
  }
  ProjectRun run(o.output, "validate", argc, argv, config_json, {{"published_set", o.file}});
  run.append(prediction);
  run.append(table);
  run.finish();

  std::printf("# strata-project validate --published %s: %zu row(s) predicted, %zu not (below); error: predicted / "
              "published - 1 of the step time (published, or derived from the published throughput)\n",
              o.file.c_str(), results.size(), skipped.size());
  for (const auto& [row, why] : skipped) std::printf("# not predicted: %s (%s): %s\n", row->id.c_str(), row->part.c_str(), why.c_str());
  for (const Result& r : results)
    if (r.predicted.fits == 0)
      std::printf("# memory: %s (%s) is predicted to need %s per GPU, %.1f%% above the %s of its description\n",
                  r.row->id.c_str(), r.row->gpu.c_str(), format_gib(r.predicted.memory.total()).c_str(),
                  100 * (r.predicted.memory.total() / r.predicted.memory_capacity - 1),
                  format_gib(r.predicted.memory_capacity).c_str());
  std::printf("| part | GPU | rows | mean |error| | mean error | worst |error| |\n|---|---|---|---|---|---|\n");
  bool missed = false;
  for (const auto& [key, s] : summaries) {
    std::printf("| %s | %s | %zu | %s | %s | %s (%s) |\n", key.first.c_str(), key.second.c_str(), s.count,
                percent(s.mean_abs()).c_str(), percent(s.mean()).c_str(), percent(s.worst).c_str(), s.worst_id.c_str());
    if (key.first == "held-out" && (s.mean_abs() > kPublishedMeanTarget || s.worst > kPublishedWorstTarget)) missed = true;
  }
  if (o.bench)
    for (const auto& [key, s] : summaries)
      if (key.first == "held-out")
        std::printf("held-out %s: mean |error| %s (target <= %s), worst %s (target <= %s): %s\n", key.second.c_str(),
                    percent(s.mean_abs()).c_str(), percent(kPublishedMeanTarget).c_str(), percent(s.worst).c_str(),
                    percent(kPublishedWorstTarget).c_str(),
                    s.mean_abs() <= kPublishedMeanTarget && s.worst <= kPublishedWorstTarget ? "PASS" : "MISS");
  if (!o.quiet) std::printf("# results: %s\n", run.path().c_str());
  return o.bench && missed ? 3 : 0;
}

}  // namespace strata
