// strata-elementwise: the CPU training step's elementwise kernels (layer norm, GELU, the residual add, copies, the
// heads' layouts, biases, gradient accumulation, AdamW, the gradient's squared norm, the loss over the vocabulary;
// kernels/layers.h) at the shapes a model's step calls them,
// every rank at once. Bytes are the elements the step's trace counts for the same call, 4 bytes each; GB/s = bytes /
// time. What a system description's per-kernel rates
// are fitted from (strata-project calibrate), as the GEMM and attention points are from strata-gemm and
// strata-attention. Every case is checked against a float64 reference. AdamW and the gradients' squared norm are
// timed with their operands outside the core's private caches, where the step meets them: before each of their
// timed calls (untimed) the rank writes twice its L1d + L2 of other data.
#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "bench/harness/axes.h"
#include "bench/harness/buffers.h"
#include "bench/cases/elementwise_cases.h"
#include "bench/harness/harness.h"
#include "train/model_config.h"

namespace {

using namespace strata;

struct ElementwiseOptions {
  std::string presets = "tiny";
  std::string kernels = "all";
  int64_t tokens = 256;
  int tp = 1;
  int threads = 1;
  int64_t seed = 1;
};

// One layer's shapes on one of tp ranks: the norms replicated, the projections and the MLP split as Megatron-LM
// splits them (train::tensor_shard).
elementwise::LayerShape layer_shape(const train::ModelConfig& m, int64_t tokens, int tp) {
  train::TensorShard shard;
  try {
    shard = train::tensor_shard(m, tp, 0);
  } catch (const std::invalid_argument& e) {
    throw UsageError("--tp " + std::to_string(tp) + " on " + m.name + ": " + e.what());
  }
  const int64_t h = m.hidden, q = shard.qkv_channels(m), a = shard.attention_channels(m), f = shard.mlp;
  return {tokens, h, f, 4 * h + (q * h + q) + (a * h + h) + (f * h + f) + (h * f + h), shard.heads, shard.kv_heads,
          m.head_dim(), shard.vocab_rows};
}

Axes plan_cases(const ElementwiseOptions& o) {
  std::vector<std::string> kernels;
  if (o.kernels == "all") kernels = elementwise::kernel_names();
  else
    for (const std::string& name : split_list(o.kernels, "--kernels")) {
      const auto& known = elementwise::kernel_names();
      if (std::find(known.begin(), known.end(), name) == known.end()) {
        std::string names;
        for (const std::string& k : known) names += k + ", ";
        throw UsageError("--kernels: unknown kernel '" + name + "' (" + names + "or all)");
      }
      kernels.push_back(name);
    }
  std::vector<std::vector<AxisValue>> shapes;  // (model, rows, channels, mlp, layer parameters, heads, kv heads, width, vocab)
  for (const std::string& name : split_list(o.presets, "--preset")) {
    train::ModelConfig model;
    try {
      model = train::preset(name);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--preset: ") + e.what());
    }
    const elementwise::LayerShape s = layer_shape(model, o.tokens, o.tp);
    shapes.push_back({name, s.rows, s.channels, s.mlp, s.layer_parameters, s.heads, s.kv_heads, s.head_dim, s.vocab});
  }
  Axes axes;
  axes.add("kernel", kernels)
      .add_zipped({{"model", ""}, {"rows", "1"}, {"channels", "1"}, {"mlp", "1"}, {"layer_parameters", "1"}, {"heads", "1"},
                   {"kv_heads", "1"}, {"head_dim", "1"}, {"vocab", "1"}}, shapes)
      .add("tp", std::vector<int64_t>{o.tp})
      .add("threads", std::vector<int64_t>{o.threads});
  return axes;
}

int run_elementwise(int argc, char** argv) {
  HarnessOptions h;
  ElementwiseOptions o;
  Cli cli("strata-elementwise", "The CPU training step's elementwise kernels at a model's shapes; bytes as the step's "
          "trace counts them (elements read and written x 4 B), GB/s = bytes / time.");
  cli.option("preset", 0, "models whose layer shapes are measured (comma-separated)", o.presets);
  cli.option("kernels", 'k', "comma-separated kernels, or all", o.kernels);
  cli.option("tokens", 0, "tokens (micro-batch x sequence) per rank", o.tokens, 1);
  cli.option("tp", 0, "tensor-parallel degree: the MLP width and the layer's parameters on one of tp ranks", o.tp, 1);
  cli.option("threads", 'T', "kernel threads per rank", o.threads, 1);
  cli.option("seed", 0, "random seed of the inputs", o.seed, 0);
  add_harness_options(cli, h);
  if (!cli.parse(argc, argv)) return 0;
  if (o.threads > 1 && h.blas_threads > 1)
    throw UsageError("--threads and --blas-threads both above 1 would oversubscribe the cores");
  h.kernel_threads = o.threads;
  const Axes axes = plan_cases(o);  // bad input refused before anything is written
  const std::vector<AxisPoint> points = axes.product();

  Run run("strata-elementwise", argc, argv, h, cli.resolved_json(), "cpu");
  run.set_case_count(static_cast<int>(points.size()));
  axes.declare_columns(run.cases());
  run.cases()
      .add_column("elements", ColumnKind::float64, "1", "elements read and written per call, as the step's trace counts them")
      .add_column("bytes", ColumnKind::float64, "B", "elements x 4 (fp32), per call per rank")
      .add_column("evict_bytes", ColumnKind::int64, "B",
                  "bytes each rank writes before each timed call, outside its interval (0: operands left in cache)");
  run.summary()
      .add_column("bandwidth_rank", ColumnKind::float64, "B/s", "bytes / median over iterations of the per-iteration mean over ranks")
      .add_column("check_worst_ratio", ColumnKind::float64, "1",
                  "max over ranks and elements of |got - float64 reference| / tolerance (<= 1 passes)");

  ConsoleTable table({{"kernel", 26}, {"model", 10}, {"rows", 6}, {"C", 6}, {"F", 6}, {"bytes", 10}, {"time(us)", 10},
                      {"GB/s/rank", 10}, {"check", 6}});
  if (run.is_root()) {
    std::printf("# strata-elementwise: %d rank(s), %d kernel thread(s) per rank, tp %d, %lld tokens per rank\n",
                run.context().n_ranks, o.threads, o.tp, static_cast<long long>(o.tokens));
    std::printf("# time: median over iterations of the per-iteration max over ranks; GB/s/rank from the mean over ranks\n");
    table.print_header();
  }
  const int rank = run.context().self.rank;
  HostTimer timer;
  // Twice the core's private caches (4 MiB where hwloc does not know both).
  const CpuTopology& topology = run.context().machine.description.topology;
  const bool caches_known = topology.l1d_bytes > 0 && topology.l2_bytes > 0;
  CacheFlush evict(static_cast<std::size_t>(caches_known ? 2 * (topology.l1d_bytes + topology.l2_bytes) : int64_t{4} << 20));
  for (size_t index = 0; index < points.size(); ++index) {
    const AxisPoint& point = points[index];
    const std::string& kernel = point.text("kernel");
    const elementwise::LayerShape shape{point.integer("rows"),    point.integer("channels"),
                                        point.integer("mlp"),     point.integer("layer_parameters"),
                                        point.integer("heads"),   point.integer("kv_heads"),
                                        point.integer("head_dim"), point.integer("vocab")};
    run.begin_case(kernel + " " + point.text("model"));
    const uint64_t seed = static_cast<uint64_t>(o.seed) * 1000003u + static_cast<uint64_t>(rank) * 7919u + index;
    elementwise::Problem problem(kernel, shape, seed, o.threads);
    // Untimed checked run on fresh outputs, then the timed loop.
    problem.prepare_check();
    problem.run();
    if (injects_wrong_element(h, rank)) problem.corrupt_output();
    const elementwise::CheckResult check = problem.check();
    const double worst = allreduce_max(MPI_COMM_WORLD, check.worst_ratio);
    const bool cold = elementwise::operands_leave_core_caches(kernel);
    std::vector<double> samples = run.measure(timer, [&] { problem.run(); }, 1, [&] {
      if (cold) evict.write();
    });
    const double bytes = problem.bytes();
    CaseResult r = run.record(samples, check.wrong, kernel + " " + point.text("model"),
        [&](Table& row) {
          axes.fill(row, point);
          row.set("elements", bytes / 4).set("bytes", bytes).set("evict_bytes", cold ? static_cast<int64_t>(evict.bytes()) : 0);
        },
        [&](Table& row, const CaseResult& res) {
          row.set("bandwidth_rank", bytes / res.rankmean.median).set("check_worst_ratio", worst);
        });
    if (run.is_root())
      table.print_row({kernel, point.text("model"), std::to_string(shape.rows), std::to_string(shape.channels),
                       std::to_string(shape.mlp), format_fixed(bytes, 0), format_fixed(r.rankmax.median * 1e6, 2),
                       format_fixed(bytes / r.rankmean.median / 1e9, 2), worst <= 1 ? "ok" : "FAIL"});
  }
  if (run.is_root()) std::printf("# results: %s\n", run.output_path().c_str());
  return run.finish();
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-elementwise", [&] { return run_elementwise(argc, argv); });
}
