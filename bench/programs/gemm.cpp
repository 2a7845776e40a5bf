// strata-gemm: matrix multiplication throughput, every rank at once, on the CPU (CBLAS) or GPU (cuBLASLt).
// C (M, N) = A (M, K) W (N, K)^T, the layout of a transformer's linear layer. FLOPs = 2MNK. Reports per-rank
// and aggregate FLOP/s and the fraction of peak, and checks every case against a higher-precision reference.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "bench/harness/axes.h"
#include "bench/harness/gpu_device.h"
#include "bench/cases/gemm_cases.h"
#include "bench/harness/harness.h"
#include "bench/harness/shapes.h"
#include "kernels/cpu_gemm.h"
#include "kernels/cuda_info.h"
#include "train/model_config.h"
#ifdef STRATA_HAVE_CUDA
#include "bench/harness/timer_cuda.h"
#include "kernels/gemm_cuda.h"
#endif

namespace {

using namespace strata;
using gemm::DType;

struct GemmOptions {
  std::string backend = "cpu";
  std::string libraries = "auto";
  std::string dtypes = "fp32";
  std::string shapes;
  std::string square;
  std::string presets;
  int64_t tokens = 2048;
  int tp = 1;
  bool training = false;  // --preset: the backward GEMMs and the LM head's too
  int check_samples = 64;
  int64_t seed = 1;
};

// --library: "auto" is the machine's fastest FP32 library (OpenBLAS for fp64, which oneDNN lacks); "all" is
// every library built that has the dtype; a list names them.
std::vector<cpu_gemm::Backend> libraries_for(const std::string& text, DType dtype, cpu_gemm::Backend fastest) {
  if (text == "auto") return {dtype == DType::fp64 ? cpu_gemm::Backend::openblas : fastest};
  std::vector<cpu_gemm::Backend> chosen;
  if (text == "all") {
    for (cpu_gemm::Backend b : cpu_gemm::available_backends())
      if (dtype != DType::fp64 || cpu_gemm::supports_fp64(b)) chosen.push_back(b);
    return chosen;
  }
  for (const auto& name : split_list(text, "--library")) {
    auto b = cpu_gemm::parse_backend(name);
    if (!b) throw UsageError("unknown --library '" + name + "' (auto, all, openblas, onednn)");
    if (!cpu_gemm::available(*b)) throw UsageError("--library " + name + ": this build has no " + name);
    if (dtype == DType::fp64 && !cpu_gemm::supports_fp64(*b))
      throw UsageError("--library " + name + " has no fp64 GEMM (fp64: openblas)");
    chosen.push_back(*b);
  }
  return chosen;
}

// "256:2048" doubles from 256 to 2048; "512,1024" lists sizes.
std::vector<int64_t> parse_square(const std::string& text) {
  std::vector<int64_t> sizes;
  if (auto colon = text.find(':'); colon != std::string::npos) {
    int64_t low = parse_int(text.substr(0, colon), "--square start");
    int64_t high = parse_int(text.substr(colon + 1), "--square end");
    if (low <= 0 || high < low) throw UsageError("--square " + text + ": expected 0 < START <= END");
    for (int64_t s = low; s <= high; s *= 2) sizes.push_back(s);
  } else {
    for (const auto& part : split_list(text, "--square")) {
      int64_t s = parse_int(part, "--square");
      if (s <= 0) throw UsageError("--square sizes must be positive, got " + part);
      sizes.push_back(s);
    }
  }
  return sizes;
}

// The cases: the product of the axes backend, dtype, library and shape (M, N, K and where the shape came from,
// stepping together), less the (dtype, library) pairs --library does not give that dtype.
struct GemmCases {
  Axes axes;
  std::vector<AxisPoint> points;
};

GemmCases plan_cases(const GemmOptions& o, cpu_gemm::Backend fastest) {
  std::vector<std::string> dtypes;
  for (const auto& text : split_list(o.dtypes, "--dtype")) {
    auto d = gemm::parse_dtype(text);
    if (!d) throw UsageError("unknown dtype '" + text + "' (fp32, fp64, tf32, fp16, bf16, fp8)");
    bool cpu_has = *d == DType::fp32 || *d == DType::fp64;
    if (o.backend == "cpu" && !cpu_has)
      throw UsageError("dtype " + text + " is not available on the cpu backend (cpu: fp32, fp64)");
    if (o.backend == "cuda" && *d == DType::fp64)
      throw UsageError("dtype fp64 is not available on the cuda backend (cuda: fp32, tf32, fp16, bf16, fp8)");
    dtypes.push_back(gemm::name(*d));
  }
  std::vector<std::vector<AxisValue>> shapes;  // (m, n, k, source): "explicit", "square" or "<model>/<layer>"
  auto add_shape = [&shapes](const gemm::Shape& s, const std::string& source) {
    shapes.push_back({s.m, s.n, s.k, source});
  };
  if (!o.shapes.empty())
    for (const auto& text : split_list(o.shapes, "--shapes")) add_shape(gemm::parse_shape(text), "explicit");
  if (!o.square.empty())
    for (int64_t s : parse_square(o.square)) add_shape({s, s, s}, "square");
  if (!o.presets.empty())
    for (const auto& name : split_list(o.presets, "--preset")) {
      const train::ModelConfig model = train::preset(name);
      std::vector<train::LayerGemm> gemms = train::layer_gemms(model, o.tokens, o.tp);
      if (o.training) {
        // The tied LM head (vocabulary rows over tp, as train/gpt.cpp's "lm head"); each forward GEMM
        // C (M, N) = A (M, K) W (N, K)^T has an input gradient (M, K, N) and a weight gradient (N, K, M).
        gemms.push_back({"lm_head", o.tokens, (model.vocab + o.tp - 1) / o.tp, model.hidden});
        for (std::size_t i = 0, forward = gemms.size(); i < forward; ++i) {
          const train::LayerGemm g = gemms[i];
          gemms.push_back({g.name + "_input", g.m, g.k, g.n});
          gemms.push_back({g.name + "_weight", g.n, g.k, g.m});
        }
      }
      for (const auto& layer : gemms) add_shape({layer.m, layer.n, layer.k}, name + "/" + layer.name);
    }
  if (shapes.empty())
    for (int64_t s : parse_square("256:2048")) add_shape({s, s, s}, "square");

  // Each dtype's libraries; the axis holds their union in the order first named.
  std::vector<std::vector<std::string>> libraries_of;
  std::vector<std::string> libraries;
  for (const auto& d : dtypes) {
    libraries_of.emplace_back();
    const std::vector<cpu_gemm::Backend> chosen =
        o.backend == "cpu" ? libraries_for(o.libraries, *gemm::parse_dtype(d), fastest) : std::vector<cpu_gemm::Backend>{};
    for (cpu_gemm::Backend b : chosen) libraries_of.back().push_back(cpu_gemm::name(b));
    if (o.backend != "cpu") libraries_of.back().push_back("cublaslt");
    for (const auto& name : libraries_of.back())
      if (std::find(libraries.begin(), libraries.end(), name) == libraries.end()) libraries.push_back(name);
  }

  GemmCases cases;
  cases.axes.add("backend", std::vector<std::string>{o.backend})
      .add("dtype", dtypes)
      .add("library", libraries)
      .add_zipped({{"m", "1"}, {"n", "1"}, {"k", "1"}, {"shape_source", ""}}, shapes);
  for (AxisPoint& point : cases.axes.product()) {
    const auto d = std::find(dtypes.begin(), dtypes.end(), point.text("dtype")) - dtypes.begin();
    const auto& allowed = libraries_of[static_cast<size_t>(d)];
    if (std::find(allowed.begin(), allowed.end(), point.text("library")) != allowed.end())
      cases.points.push_back(std::move(point));
  }
  return cases;
}

// One backend's work for one case, behind the same four calls.
struct Workload {
  std::function<void()> run;
  std::function<void()> poison;
  std::function<gemm::CheckResult(int, uint64_t)> check;
  std::function<void()> corrupt;  // --inject-wrong-element
  Timer* timer;
  std::string algorithm;
  double peak_per_rank = 0;
  std::string peak_source;
};

void add_gemm_options(Cli& cli, GemmOptions& o, HarnessOptions& h, bool& list_presets) {
  cli.choice("backend", 0, "where the GEMM runs", o.backend, {"cpu", "cuda"});
  cli.option("library", 0, "cpu GEMM library: auto (the machine's fastest), all, or a list of openblas,onednn",
             o.libraries);
  cli.option("dtype", 'd', "comma-separated dtypes: fp32,fp64 (cpu); fp32,tf32,fp16,bf16,fp8 (cuda)", o.dtypes);
  cli.option("shapes", 0, "comma-separated MxNxK shapes", o.shapes);
  cli.option("square", 0, "square sizes: START:END (doubling) or a list", o.square);
  cli.option("preset", 0, "transformer layer shapes of these models (comma-separated; see --list-presets)", o.presets);
  cli.option("tokens", 0, "tokens (batch x sequence) for --preset shapes", o.tokens, 1);
  cli.option("tp", 0, "tensor-parallel degree dividing --preset shapes", o.tp, 1);
  cli.flag("training", 0, "with --preset: every GEMM of a training step: the layers' four, the tied LM head, and the "
           "input and weight gradients of each (as the CPU step calls them)", o.training);
  cli.option("check-samples", 0, "output elements checked against the reference per rank and case", o.check_samples, 4);
  cli.option("seed", 0, "random seed of the inputs", o.seed, 0);
  cli.flag("list-presets", 0, "print the preset models and exit", list_presets);
  add_harness_options(cli, h);
}

// The largest case of the plan (by host bytes: A, W and C; on the GPU path also the inputs' float copies for the
// check and their staging), refused before the run starts where the host cannot hold it; the device bytes it needs.
struct LargestCase {
  std::string label;
  double device_bytes = 0;
};

LargestCase check_host_memory(const GemmOptions& o, const GemmCases& planned) {
  double host_bytes = 0;
  LargestCase largest;
  for (const AxisPoint& point : planned.points) {
    const DType d = *gemm::parse_dtype(point.text("dtype"));
    const double m = double(point.integer("m")), n = double(point.integer("n")), k = double(point.integer("k"));
    const double in = gemm::input_bytes(d), out = gemm::output_bytes(d);
    const double host = o.backend == "cpu" ? (m * k + n * k) * in + m * n * out : (m * k + n * k) * (4 + in) + m * n * out;
    if (host > host_bytes)
      host_bytes = host, largest.label = point.text("dtype") + " " + std::to_string(point.integer("m")) + "x" +
                                         std::to_string(point.integer("n")) + "x" + std::to_string(point.integer("k"));
    largest.device_bytes = std::max(largest.device_bytes, (m * k + n * k) * in + m * n * out);
  }
  check_fits_in_memory("strata-gemm case " + largest.label, host_bytes, host_memory_per_rank(),
                       "the node's available memory over its ranks");
  return largest;
}

// The GPU this rank drives, the largest case checked against the smallest GPU's memory; "cpu" (device -1) for the CPU.
RankGpu gemm_device(const GemmOptions& o, [[maybe_unused]] const LargestCase& largest) {
  if (o.backend != "cuda") return {-1, "cpu"};
#ifdef STRATA_HAVE_CUDA
  const RankGpu gpu = select_rank_gpu("--backend cuda");
  double device_limit = 0.9 * double(cuda::device_memory_bytes(gpu.device));  // the smallest GPU decides, on every rank
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &device_limit, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD));
  check_fits_in_memory("strata-gemm case " + largest.label + " on the GPU", largest.device_bytes, device_limit,
                       "nine tenths of the GPU's memory");
  return gpu;
#else
  throw UsageError("--backend cuda: this strata-gemm was built without CUDA");
#endif
}

void declare_gemm_columns(Run& run, const GemmCases& cases) {
  cases.axes.declare_columns(run.cases());
  run.cases()
      .add_column("flop", ColumnKind::float64, "FLOP", "2MNK per GEMM per rank")
      .add_column("bytes", ColumnKind::float64, "B", "A, W read once and C written once, per GEMM per rank");
  add_flop_rate_columns(run.summary(), "2MNK");
  run.summary()
      .add_column("peak_source", ColumnKind::string, "")
      .add_column("algorithm", ColumnKind::string, "")
      .add_column("check_samples", ColumnKind::int64, "1", "output elements checked per rank")
      .add_column("check_worst_ratio", ColumnKind::float64, "1",
                  "max over ranks and checked elements of |c - ref| / tolerance (<= 1 passes)");
}

// One case on the CPU or the GPU, behind the Workload's calls; it owns its buffers.
struct CaseWork {
  Workload work;
  std::unique_ptr<gemm::CpuGemm> cpu;
#ifdef STRATA_HAVE_CUDA
  std::unique_ptr<gemm::CudaGemm> gpu;
  std::unique_ptr<Timer> gpu_timer;
#endif
};

std::unique_ptr<CaseWork> case_work(const GemmOptions& o, const HarnessOptions& h, const MachineDescription& machine,
                                    const gemm::Shape& shape, DType dtype, const std::string& library, uint64_t seed,
                                    [[maybe_unused]] int device, HostTimer& host_timer) {
  auto w = std::make_unique<CaseWork>();
  CaseWork& c = *w;
  if (o.backend == "cpu") {
    const cpu_gemm::Backend backend = *cpu_gemm::parse_backend(library);
    c.cpu = std::make_unique<gemm::CpuGemm>(shape, dtype, seed, backend);
    gemm::CpuGemm* cpu = c.cpu.get();
    const PeakFigure& peak = dtype == DType::fp64 ? machine.fp64 : machine.fp32;
    c.work = {[cpu] { cpu->run(); }, [cpu] { cpu->poison_output(); },
              [cpu](int n, uint64_t s) { return cpu->check(n, s); }, [cpu] { cpu->corrupt_output(); }, &host_timer,
              std::string(dtype == DType::fp32 ? "sgemm " : "dgemm ") + cpu_gemm::library(backend) + " (" +
                  cpu_gemm::kernel(backend) + ")",
              peak.per_rank(h.blas_threads), peak_source(peak, h.blas_threads)};
    return w;
  }
#ifdef STRATA_HAVE_CUDA
  try {
    c.gpu = std::make_unique<gemm::CudaGemm>(shape, dtype, seed, device);
  } catch (const std::invalid_argument& e) {  // the kernels' word for a request this device cannot serve
    throw UsageError(e.what());
  }
  c.gpu_timer = make_cuda_event_timer(c.gpu->stream());
  gemm::CudaGemm* gpu = c.gpu.get();
  const gemm::GpuPeak peak = gemm::gpu_peak(device, dtype);
  c.work = {[gpu] { gpu->run(); }, [gpu] { gpu->poison_output(); },
            [gpu](int n, uint64_t s) { return gpu->check(n, s); }, [gpu] { gpu->corrupt_output(); }, c.gpu_timer.get(),
            gpu->algorithm(), peak.flops, peak.source};
#endif
  return w;
}

int run_gemm(int argc, char** argv) {
  HarnessOptions h;
  GemmOptions o;
  bool list_presets = false;
  Cli cli("strata-gemm", "GEMM throughput: C (M,N) = A (M,K) W (N,K)^T on every rank at once; FLOPs = 2MNK.");
  add_gemm_options(cli, o, h, list_presets);
  if (!cli.parse(argc, argv)) return 0;
  if (o.training && o.presets.empty()) throw UsageError("--training names the GEMMs of a --preset's training step: give --preset");
  if (list_presets) {
    if (world_rank() == 0)
      for (const auto& n : train::preset_names()) std::printf("%s\n", n.c_str());
    return 0;
  }
  if (o.backend == "cuda" && o.libraries != "auto") throw UsageError("--library applies to the cpu backend only");
  // Checked before the run starts (so bad input writes nothing); the machine's fastest library is known after.
  const LargestCase largest = check_host_memory(o, plan_cases(o, cpu_gemm::Backend::openblas));
  const RankGpu device = gemm_device(o, largest);

  Run run("strata-gemm", argc, argv, h, cli.resolved_json(), device.text);
  const MachineDescription& machine = run.context().machine.description;
  const GemmCases cases = plan_cases(o, machine.default_gemm);
  run.set_case_count(static_cast<int>(cases.points.size()));
  declare_gemm_columns(run, cases);
  ConsoleTable table({{"backend", 7}, {"library", 8}, {"dtype", 5}, {"M", 6}, {"N", 6}, {"K", 6}, {"source", 18}, {"time(ms)", 10},
                      {"GFLOP/s/rank", 12}, {"GFLOP/s(all)", 12}, {"%peak", 6}, {"check", 6}});
  if (run.is_root()) {
    std::printf("# strata-gemm: %d rank(s) on %d node(s), backend %s, BLAS threads per rank %d\n", run.context().n_ranks,
                run.context().n_nodes, o.backend.c_str(), h.blas_threads);
    std::printf("# time: median over iterations of the per-iteration max over ranks; GFLOP/s = 2MNK/time (1e9)\n");
    std::printf("# GFLOP/s/rank uses the per-iteration mean over ranks; (all) sums the ranks; %%peak is per rank\n");
    table.print_header();
  }

  const int rank = world_rank();
  HostTimer host_timer;
  for (size_t index = 0; index < cases.points.size(); ++index) {
    const AxisPoint& point = cases.points[index];
    const gemm::Shape shape{point.integer("m"), point.integer("n"), point.integer("k")};
    const DType dtype = *gemm::parse_dtype(point.text("dtype"));
    const std::string& library = point.text("library");
    run.begin_case(gemm::name(dtype) + " " + shape.text() + " " + library);
    uint64_t seed = static_cast<uint64_t>(o.seed) * 1000003u + static_cast<uint64_t>(rank) * 7919u + index;
    const std::unique_ptr<CaseWork> owner = case_work(o, h, machine, shape, dtype, library, seed, device.device, host_timer);
    const Workload& work = owner->work;

    // Untimed correctness pass on a poisoned output, then the timed loop.
    work.poison();
    work.run();
    if (injects_wrong_element(h, rank)) work.corrupt();
    gemm::CheckResult check = work.check(o.check_samples, seed);
    double worst = allreduce_max(MPI_COMM_WORLD, check.worst_ratio);
    std::vector<double> samples = run.measure(*work.timer, work.run);

    const double flop = shape.flops();
    const double bytes = static_cast<double>(shape.m * shape.k + shape.n * shape.k) * gemm::input_bytes(dtype) +
                         static_cast<double>(shape.m * shape.n) * gemm::output_bytes(dtype);
    const int ranks = run.context().n_ranks;
    std::string label = gemm::name(dtype) + " " + shape.text();
    CaseResult result = run.record(
        samples, check.wrong, label,
        [&](Table& t) {
          cases.axes.fill(t, point);
          t.set("flop", flop).set("bytes", bytes);
        },
        [&](Table& t, const CaseResult& r) {
          set_flop_rates(t, flop, r, ranks, work.peak_per_rank, label);
          t.set("peak_source", work.peak_source).set("algorithm", work.algorithm);
          t.set("check_samples", static_cast<int64_t>(check.checked)).set("check_worst_ratio", worst);
        });
    if (run.is_root()) {
      double per_rank = flop / result.rankmean.median;
      table.print_row({o.backend, library, gemm::name(dtype), std::to_string(shape.m), std::to_string(shape.n),
                       std::to_string(shape.k), point.text("shape_source"), format_fixed(result.rankmax.median * 1e3, 3),
                       format_fixed(per_rank / 1e9, 1), format_fixed(ranks * flop / result.rankmax.median / 1e9, 1),
                       format_peak_percent(work.peak_per_rank > 0 ? per_rank / work.peak_per_rank : 0),
                       worst <= 1 ? "ok" : "FAIL"});
    }
  }
  if (run.is_root()) {
    if (o.backend == "cpu")
      std::printf("# %%peak per rank: %s\n", peak_source(machine.fp32, h.blas_threads).c_str());
    std::printf("# results: %s\n", run.output_path().c_str());
  }
  return run.finish();
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-gemm", [&] { return run_gemm(argc, argv); });
}
