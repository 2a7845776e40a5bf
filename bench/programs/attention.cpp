// strata-attention: scaled dot-product attention forward and backward, every rank at once: flash-style
// kernels (blocked online softmax; on the GPU fused, on tensor cores) beside a materialised-softmax
// baseline (CPU: naive; GPU: unfused cuBLASLt products and a softmax kernel). FLOPs follow
// flash-attention: forward 4*b*h*sq*skv*d (half when causal), backward 2.5x forward. Every case is
// checked against a float64 reference on fresh random inputs.
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <stdexcept>

#include "bench/harness/axes.h"
#include "bench/harness/gpu_device.h"
#include "bench/harness/harness.h"
#include "kernels/attention.h"
#include "kernels/gemm_check.h"
#ifdef STRATA_HAVE_CUDA
#include "bench/cases/attention_cases.h"
#include "bench/harness/timer_cuda.h"
#include "kernels/attention_cuda.h"
#include "kernels/cuda_info.h"
#include "kernels/gemm_cuda.h"
#endif

namespace {

using namespace strata;
using attention::Shape;

struct Options {
  int batch = 1, heads = 8, kv_heads = 0;  // kv_heads 0: same as heads
  std::string seq = "512,1024", seq_kv;    // seq_kv empty: equal to seq
  std::string dims = "64";
  std::string causal = "both";
  std::string passes = "fwd,bwd";
  std::string impls;  // empty: flash,naive on the cpu; flash,unfused on cuda
  std::string backend = "cpu";
  std::string dtype;  // empty: fp32 on the cpu; bf16 on cuda
  int threads = 1;
  int64_t seed = 1;
};

struct Case {
  Shape shape;
  std::string impl;
  std::string pass;  // fwd, bwd, fwdbwd
  std::string dtype;
};

std::vector<int> int_list(const std::string& text, const char* what) {
  std::vector<int> out;
  for (const auto& item : split_list(text, what)) {
    int64_t v = parse_int(item, what);
    if (v <= 0) throw UsageError(std::string(what) + " must be positive, got " + item);
    out.push_back(static_cast<int>(v));
  }
  return out;
}

// The case of one point of the axes.
Case case_of(const AxisPoint& p) {
  const Shape shape{static_cast<int>(p.integer("batch")), static_cast<int>(p.integer("heads_q")),
                    static_cast<int>(p.integer("heads_kv")), static_cast<int>(p.integer("seq_q")),
                    static_cast<int>(p.integer("seq_kv")), static_cast<int>(p.integer("head_dim")),
                    p.integer("causal") != 0};
  return {shape, p.text("impl"), p.text("pass"), p.text("dtype")};
}

// The cases: the product of the axes, the head dimension turning slowest and the dtype fastest. The key/value
// sequence lengths are an axis of their own when --seq-kv is given, and otherwise step with --seq.
Axes plan_cases(const Options& o) {
  const bool cpu = o.backend == "cpu";
  for (const auto& d : split_list(o.dtype, "--dtype")) {
    if (d != "fp32" && d != "fp16" && d != "bf16")
      throw UsageError("--dtype " + d + ": unknown element type (fp32 on the cpu; fp16, bf16 on cuda)");
    if (cpu ? d != "fp32" : d == "fp32")
      throw UsageError("dtype " + d + " is not available on the " + o.backend + " backend (" +
                       (cpu ? "cpu: fp32" : "cuda: fp16, bf16") + ")");
  }
  std::vector<int> seqs = int_list(o.seq, "--seq");
  std::vector<int> seqs_kv = o.seq_kv.empty() ? std::vector<int>{} : int_list(o.seq_kv, "--seq-kv");
  std::vector<int> dims = int_list(o.dims, "--dim");
  std::vector<int64_t> causal;
  if (o.causal != "yes") causal.push_back(0);
  if (o.causal != "no") causal.push_back(1);
  std::vector<std::string> impls = split_list(o.impls, "--impl"), passes = split_list(o.passes, "--pass");
  for (const auto& i : impls)
    if (cpu ? (i != "flash" && i != "naive") : (i != "flash" && i != "unfused"))
      throw UsageError("unknown implementation '" + i + "' (" + (cpu ? "cpu: flash, naive" : "cuda: flash, unfused") + ")");
  for (const auto& p : passes)
    if (p != "fwd" && p != "bwd" && p != "fwdbwd") throw UsageError("unknown pass '" + p + "' (fwd, bwd, fwdbwd)");

  const int kv_heads = o.kv_heads ? o.kv_heads : o.heads;
  Axes axes;
  axes.add("backend", std::vector<std::string>{o.backend})
      .add("batch", std::vector<int64_t>{o.batch})
      .add("heads_q", std::vector<int64_t>{o.heads})
      .add("heads_kv", std::vector<int64_t>{kv_heads})
      .add("threads", std::vector<int64_t>{o.threads})
      .add("head_dim", std::vector<int64_t>(dims.begin(), dims.end()));
  if (seqs_kv.empty()) {
    std::vector<std::vector<AxisValue>> pairs;
    for (int q : seqs) pairs.push_back({int64_t{q}, int64_t{q}});
    axes.add_zipped({{"seq_q", "1"}, {"seq_kv", "1"}}, pairs);
  } else {
    axes.add("seq_q", std::vector<int64_t>(seqs.begin(), seqs.end()))
        .add("seq_kv", std::vector<int64_t>(seqs_kv.begin(), seqs_kv.end()));
  }
  axes.add("causal", causal).add("pass", passes).add("impl", impls).add("dtype", split_list(o.dtype, "--dtype"));

  for (const AxisPoint& point : axes.product()) {
    const Case c = case_of(point);
    if (std::string problem = attention::validate(c.shape); !problem.empty()) throw UsageError(problem);
#ifdef STRATA_HAVE_CUDA
    if (!cpu) {
      std::string problem = attention::gpu::validate(c.shape, *attention::gpu::parse_dtype(c.dtype),
                                                     *attention::gpu::parse_impl(c.impl));
      if (!problem.empty()) throw UsageError(problem);
    }
#endif
  }
  return axes;
}

// One case's tensors, filled with random values (never zeros) and outputs poisoned before the check.
struct Tensors {
  std::vector<float> q, k, v, o, lse, d_o, dq, dk, dv;
  Tensors(const Shape& s, uint64_t seed)
      : q(attention::q_elements(s)), k(attention::kv_elements(s)), v(k.size()), o(q.size()),
        lse(attention::lse_elements(s)), d_o(q.size()), dq(q.size()), dk(k.size()), dv(k.size()) {
    gemm::fill_uniform(q.data(), q.size(), seed);
    gemm::fill_uniform(k.data(), k.size(), seed + 1);
    gemm::fill_uniform(v.data(), v.size(), seed + 2);
    gemm::fill_uniform(d_o.data(), d_o.size(), seed + 3);
    poison();
  }
  void poison() {
    for (auto* t : {&o, &lse, &dq, &dk, &dv}) std::fill(t->begin(), t->end(), std::numeric_limits<float>::quiet_NaN());
  }
};

// The worst relative L2 error over the checked outputs. The float64 reference runs on one slice — batch 0 and
// the query heads of one kv head, all sequence positions — so its cost stays small beside the case while every
// code path (masking, GQA grouping, ragged blocks) is exercised; the kv head is drawn from the seed.
struct CheckOutcome {
  double worst_rel_l2 = 0;
  int64_t bad = 0;
  std::string failure;  // what failed, per tensor, when bad > 0
};

// Where the checked slice of O starts: batch 0, the first query head of the kv head the seed picks.
size_t checked_o_offset(const Shape& s, uint64_t seed) {
  const int group = s.heads_q / s.heads_kv;
  const auto kv_head = static_cast<size_t>(seed % static_cast<uint64_t>(s.heads_kv));
  return kv_head * static_cast<size_t>(group) * static_cast<size_t>(s.seq_q) * static_cast<size_t>(s.head_dim);
}

CheckOutcome check_slice(const Shape& s, const Tensors& t, bool backward, uint64_t seed) {
  const int group = s.heads_q / s.heads_kv;
  const int kv_head = static_cast<int>(seed % static_cast<uint64_t>(s.heads_kv));
  Shape slice{1, group, 1, s.seq_q, s.seq_kv, s.head_dim, s.causal};
  const size_t qn = static_cast<size_t>(s.seq_q) * s.head_dim, kn = static_cast<size_t>(s.seq_kv) * s.head_dim;
  auto q_at = [&](const std::vector<float>& x) {  // the group's query heads of batch 0: contiguous
    return std::vector<double>(x.begin() + static_cast<ptrdiff_t>(kv_head * group * qn),
                               x.begin() + static_cast<ptrdiff_t>((kv_head + 1) * group * qn));
  };
  auto kv_at = [&](const std::vector<float>& x) {
    return std::vector<double>(x.begin() + static_cast<ptrdiff_t>(kv_head * kn),
                               x.begin() + static_cast<ptrdiff_t>((kv_head + 1) * kn));
  };
  std::vector<double> q = q_at(t.q), k = kv_at(t.k), v = kv_at(t.v);
  std::vector<double> o(q.size()), lse(static_cast<size_t>(group) * s.seq_q);
  attention::reference_forward(slice, q.data(), k.data(), v.data(), o.data(), lse.data());
  const double tol = attention::tolerance(attention::Precision::fp32);
  CheckOutcome out;
  auto account = [&](const char* label, const std::vector<float>& got_all, size_t offset,
                     const std::vector<double>& ref, double floor) {
    attention::ErrorReport r = attention::compare(got_all.data() + offset, ref.data(), ref.size(), tol, floor);
    out.worst_rel_l2 = std::max(out.worst_rel_l2, std::isnan(r.rel_l2) ? INFINITY : r.rel_l2);
    if (attention::within(r, tol)) return;
    out.bad += std::max<int64_t>(1, static_cast<int64_t>(r.bad));
    // Rows of the slice: query head of the group x position for o and dq, key position for dk and dv.
    out.failure += (out.failure.empty() ? "" : ", ") + attention::describe(label, r, static_cast<size_t>(s.head_dim));
  };
  account("o", t.o, static_cast<size_t>(kv_head) * group * qn, o, 0);
  if (backward) {
    std::vector<double> d_o = q_at(t.d_o), dq(q.size()), dk(k.size()), dv(v.size());
    attention::reference_backward(slice, q.data(), k.data(), v.data(), o.data(), d_o.data(), lse.data(), dq.data(),
                                  dk.data(), dv.data());
    account("dq", t.dq, static_cast<size_t>(kv_head) * group * qn, dq, 1e-6);
    account("dk", t.dk, static_cast<size_t>(kv_head) * kn, dk, 1e-6);
    account("dv", t.dv, static_cast<size_t>(kv_head) * kn, dv, 0);
  }
  return out;
}

// One case's kernels behind the same calls on either backend.
struct Workload {
  std::function<void()> forward, backward;
  std::function<CheckOutcome(bool backward)> check;
  std::function<void()> corrupt;  // --inject-wrong-element: one element of O inside the checked slice
  Timer* timer = nullptr;
  virtual ~Workload() = default;
};

struct CpuWorkload final : Workload {
  Tensors t;
  HostTimer host_timer;
  CpuWorkload(const Case& c, uint64_t seed, const attention::CpuOptions& options) : t(c.shape, seed) {
    const Shape s = c.shape;
    const bool naive = c.impl == "naive";
    forward = [this, s, naive, options] {
      (naive ? attention::naive_forward : attention::flash_forward)(s, t.q.data(), t.k.data(), t.v.data(),
                                                                    t.o.data(), t.lse.data(), options);
    };
    backward = [this, s, naive, options] {
      (naive ? attention::naive_backward : attention::flash_backward)(s, t.q.data(), t.k.data(), t.v.data(),
                                                                      t.o.data(), t.d_o.data(), t.lse.data(),
                                                                      t.dq.data(), t.dk.data(), t.dv.data(), options);
    };
    check = [this, s, seed](bool with_backward) { return check_slice(s, t, with_backward, seed); };
    corrupt = [this, s, seed] {
      float& first = t.o[checked_o_offset(s, seed)];
      first = 2 * first + 1;
    };
    timer = &host_timer;
  }
};

std::unique_ptr<Workload> cpu_workload(const Case& c, uint64_t seed, const attention::CpuOptions& options) {
  return std::make_unique<CpuWorkload>(c, seed, options);
}

#ifdef STRATA_HAVE_CUDA
struct GpuWorkload final : Workload {
  attention::gpu::Attention attention;
  std::unique_ptr<Timer> event_timer;
  GpuWorkload(const Case& c, uint64_t seed)
      : attention(c.shape, *attention::gpu::parse_dtype(c.dtype), *attention::gpu::parse_impl(c.impl), seed),
        event_timer(make_cuda_event_timer(attention.stream())) {
    attention.poison_outputs();
    forward = [this] { attention.forward(); };
    backward = [this] { attention.backward(); };
    // The same slice as on the CPU: batch 0, the query heads of one kv head, against float64.
    check = [this, seed](bool with_backward) {
      const int kv_head = static_cast<int>(seed % static_cast<uint64_t>(attention.shape().heads_kv));
      attention::gpu::CheckReport report = attention::gpu::check(attention, with_backward, 0, kv_head);
      CheckOutcome out;
      for (const attention::ErrorReport* r : {&report.o, &report.lse, &report.dq, &report.dk, &report.dv})
        out.worst_rel_l2 = std::max(out.worst_rel_l2, std::isnan(r->rel_l2) ? INFINITY : r->rel_l2);
      out.bad = report.passed ? 0 : std::max<int64_t>(1, static_cast<int64_t>(report.o.bad + report.lse.bad +
                                                                           report.dq.bad + report.dk.bad + report.dv.bad));
      if (!report.passed) out.failure = report.summary;
      return out;
    };
    corrupt = [this, seed] { attention.corrupt_output(checked_o_offset(attention.shape(), seed)); };
    timer = event_timer.get();
  }
};

std::unique_ptr<Workload> gpu_workload(const Case& c, uint64_t seed) {
  try {
    return std::make_unique<GpuWorkload>(c, seed);
  } catch (const std::invalid_argument& e) {  // the kernels' word for a request this device cannot serve
    throw UsageError(e.what());
  }
}
#else
std::unique_ptr<Workload> gpu_workload(const Case&, uint64_t) {
  throw UsageError("--backend cuda: this strata-attention was built without CUDA");
}
#endif

struct PeakOfCase {
  double flops = 0;    // per rank; 0 when unknown
  std::string source;  // GPU only
};

void add_attention_options(Cli& cli, Options& o, HarnessOptions& h) {
  cli.option("batch", 'B', "batch size", o.batch, 1);
  cli.option("heads", 'H', "query heads", o.heads, 1);
  cli.option("kv-heads", 0, "key/value heads (grouped-query; divides --heads; 0: same as --heads)", o.kv_heads, 0);
  cli.option("seq", 's', "query sequence lengths (comma-separated)", o.seq);
  cli.option("seq-kv", 0, "key/value sequence lengths (comma-separated; default: each equal to --seq)", o.seq_kv);
  cli.option("dim", 'D', "head dimensions (comma-separated)", o.dims);
  cli.choice("causal", 0, "causal mask", o.causal, {"yes", "no", "both"});
  cli.option("pass", 'p', "passes: fwd,bwd,fwdbwd", o.passes);
  cli.option("impl", 0, "implementations: flash,naive (cpu, default); flash,unfused (cuda, default)", o.impls);
  cli.choice("backend", 0, "where the kernels run", o.backend, {"cpu", "cuda"});
  cli.option("dtype", 'd', "element types: fp32 (cpu, default); fp16,bf16 (cuda; default bf16)", o.dtype);
  cli.option("threads", 'T', "kernel threads per rank", o.threads, 1);
  cli.option("seed", 0, "random seed of the inputs", o.seed, 0);
  add_harness_options(cli, h);
}

// The largest case must fit in host memory: Q, O, dO, dQ and K, V, dK, dV as floats (the inputs' float copies and the
// read-back outputs on the GPU path), the log-sum-exps, and the naive kernel's (Sq, Skv) scores per thread.
void check_host_memory(const Options& o, const std::vector<AxisPoint>& points) {
  double host_bytes = 0;
  std::string largest;
  for (const AxisPoint& point : points) {
    const Case c = case_of(point);
    const double q = double(c.shape.batch) * c.shape.heads_q * c.shape.seq_q * c.shape.head_dim;
    const double kv = double(c.shape.batch) * c.shape.heads_kv * c.shape.seq_kv * c.shape.head_dim;
    double bytes = 4 * (4 * q + 4 * kv + double(c.shape.batch) * c.shape.heads_q * c.shape.seq_q);
    if (c.impl == "naive") bytes += 4 * 2.0 * o.threads * c.shape.seq_q * c.shape.seq_kv;
    if (bytes > host_bytes) {
      host_bytes = bytes;
      largest = c.impl + " " + c.pass + " b" + std::to_string(c.shape.batch) + " h" + std::to_string(c.shape.heads_q) + " s" +
                std::to_string(c.shape.seq_q) + " d" + std::to_string(c.shape.head_dim);
    }
  }
  check_fits_in_memory("strata-attention case " + largest, host_bytes, host_memory_per_rank(),
                       "the node's available memory over its ranks");
}

void declare_attention_columns(Run& run, const Axes& axes) {
  axes.declare_columns(run.cases());
  run.cases()
      .add_column("flop", ColumnKind::float64, "FLOP",
                  "flash-attention convention: fwd 4*b*hq*sq*skv*d, half when causal; bwd 2.5x fwd; per rank")
      .add_column("bytes", ColumnKind::float64, "B", "tensors read once and written once, per rank");
  add_flop_rate_columns(run.summary(), "flop");
  run.summary()
      .add_column("check_rel_l2", ColumnKind::float64, "1", "worst relative L2 error against float64, over ranks and outputs");
}

// The case's FLOPs (flash-attention convention) and bytes (each tensor read once and written once), per rank.
std::pair<double, double> flop_and_bytes(const Case& c) {
  const Shape& s = c.shape;
  const double fwd = attention::forward_flops(s), bwd = attention::backward_flops(s);
  const double flop = c.pass == "fwd" ? fwd : c.pass == "bwd" ? bwd : fwd + bwd;
  const double elem = c.dtype == "fp32" ? 4.0 : 2.0;
  const double q_bytes = elem * attention::q_elements(s), kv_bytes = elem * attention::kv_elements(s);
  const double lse_bytes = 4.0 * attention::lse_elements(s);
  const double bytes_fwd = 2 * q_bytes + 2 * kv_bytes + lse_bytes;                       // Q,K,V in; O,lse out
  const double bytes_bwd = 3 * q_bytes + 2 * kv_bytes + lse_bytes + q_bytes + 2 * kv_bytes;  // Q,O,dO,K,V,lse in; dQ,dK,dV out
  return {flop, c.pass == "fwd" ? bytes_fwd : c.pass == "bwd" ? bytes_bwd : bytes_fwd + bytes_bwd};
}

int run_attention(int argc, char** argv) {
  HarnessOptions h;
  Options o;
  Cli cli("strata-attention", "Attention forward/backward, every rank at once; flash-attention FLOP convention.");
  add_attention_options(cli, o, h);
  if (!cli.parse(argc, argv)) return 0;
  if (o.impls.empty()) o.impls = o.backend == "cpu" ? "flash,naive" : "flash,unfused";
  if (o.dtype.empty()) o.dtype = o.backend == "cpu" ? "fp32" : "bf16";
  const Axes axes = plan_cases(o);
  const std::vector<AxisPoint> points = axes.product();
  if (o.threads > 1 && h.blas_threads > 1)
    throw UsageError("--threads and --blas-threads both above 1 would oversubscribe: the kernels hold BLAS to one "
                     "thread per kernel thread");
  h.kernel_threads = o.threads;
  check_host_memory(o, points);

  std::string device = "cpu";
  int gpu = -1;
  if (o.backend == "cuda") {
#ifdef STRATA_HAVE_CUDA
    const RankGpu rank_gpu = select_rank_gpu("--backend cuda");
    gpu = rank_gpu.device, device = rank_gpu.text;
#else
    throw UsageError("--backend cuda: this strata-attention was built without CUDA");
#endif
  }
  Run run("strata-attention", argc, argv, h, cli.resolved_json(), device);
  run.set_case_count(static_cast<int>(points.size()));
  declare_attention_columns(run, axes);

  // The CPU's measured FP32 peak; on the GPU the tensor-core peak of the case's dtype that GEMM uses (0 where
  // the table has no figure), since the attention kernels run on the same tensor cores.
  auto peak_of = [&](const std::string& dtype) -> PeakOfCase {
    if (o.backend == "cpu") return {run.context().machine.description.fp32.per_rank(o.threads), ""};
#ifdef STRATA_HAVE_CUDA
    const gemm::GpuPeak peak = gemm::gpu_peak(gpu, dtype == "fp16" ? gemm::DType::fp16 : gemm::DType::bf16);
    return {peak.flops, peak.source};
#else
    (void)dtype;
    (void)gpu;
    return {0.0, ""};
#endif
  };
  std::string gpu_peak_source;
  ConsoleTable table({{"impl", 5}, {"pass", 6}, {"causal", 6}, {"B", 3}, {"Hq", 4}, {"Hkv", 4}, {"Sq", 6}, {"Skv", 6},
                      {"D", 4}, {"time(ms)", 10}, {"GFLOP/s/rank", 12}, {"GFLOP/s(all)", 12}, {"%peak", 6}, {"rel_l2", 9}});
  if (run.is_root()) {
    std::printf("# strata-attention: %d rank(s), %s %s, %d kernel thread(s) per rank; FLOPs: flash-attention "
                "convention (fwd 4bhsqskvd, /2 causal; bwd 2.5x)\n", run.context().n_ranks, o.backend.c_str(),
                o.dtype.c_str(), o.threads);
    std::printf("# time: median over iterations of the per-iteration max over ranks; GFLOP/s/rank from the mean over ranks\n");
    table.print_header();
  }

  attention::CpuOptions kernel_options;
  kernel_options.threads = o.threads;
  const int rank = run.context().self.rank;
  for (size_t index = 0; index < points.size(); ++index) {
    const Case c = case_of(points[index]);
    const Shape& s = c.shape;
    char label[160];
    std::snprintf(label, sizeof label, "%s %s%s b%d h%d/%d s%d/%d d%d", c.impl.c_str(), c.pass.c_str(),
                  s.causal ? " causal" : "", s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_kv, s.head_dim);
    run.begin_case(label);
    const uint64_t seed = static_cast<uint64_t>(o.seed) * 1000003u + static_cast<uint64_t>(rank) * 7919u + index;
    const bool has_bwd = c.pass != "fwd";
    const PeakOfCase peak = peak_of(c.dtype);
    const double peak_per_rank = peak.flops;
    if (!peak.source.empty()) gpu_peak_source = peak.source;
    std::unique_ptr<Workload> work = o.backend == "cpu" ? cpu_workload(c, seed, kernel_options) : gpu_workload(c, seed);
    // Untimed check on poisoned outputs; the backward pass needs the forward's O and lse anyway.
    work->forward();
    if (has_bwd) work->backward();
    if (injects_wrong_element(h, rank)) work->corrupt();
    CheckOutcome check = work->check(has_bwd);
    if (check.bad > 0)  // the row's "!" says that it failed; this says where, from the rank that saw it
      std::fprintf(stderr, "strata-attention: rank %d: %s: check failed: %s\n", rank, label, check.failure.c_str());
    double worst = allreduce_max(MPI_COMM_WORLD, check.worst_rel_l2);

    std::function<void()> body = c.pass == "fwd" ? work->forward
                               : c.pass == "bwd" ? work->backward
                                                 : std::function<void()>([&] { work->forward(); work->backward(); });
    std::vector<double> samples = run.measure(*work->timer, body);

    const auto [flop, bytes] = flop_and_bytes(c);
    const int ranks = run.context().n_ranks;
    CaseResult r = run.record(samples, check.bad, label,
        [&](Table& row) {
          axes.fill(row, points[index]);
          row.set("flop", flop).set("bytes", bytes);
        },
        [&](Table& row, const CaseResult& res) {
          set_flop_rates(row, flop, res, ranks, peak_per_rank, label);
          row.set("check_rel_l2", worst);
        });
    if (run.is_root()) {
      double per_rank = flop / r.rankmean.median;
      char rel[32];
      std::snprintf(rel, sizeof rel, "%.1e%s", worst, r.wrong_elements ? "!" : "");
      table.print_row({c.impl, c.pass, s.causal ? "yes" : "no", std::to_string(s.batch), std::to_string(s.heads_q),
                       std::to_string(s.heads_kv), std::to_string(s.seq_q), std::to_string(s.seq_kv),
                       std::to_string(s.head_dim), format_fixed(r.rankmax.median * 1e3, 3),
                       format_fixed(per_rank / 1e9, 1), format_fixed(ranks * flop / r.rankmax.median / 1e9, 1),
                       format_peak_percent(peak_per_rank > 0 ? per_rank / peak_per_rank : 0), rel});
    }
  }
  if (run.is_root()) {
    if (o.backend == "cpu")
      std::printf("# %%peak per rank: %s\n", peak_source(run.context().machine.description.fp32, o.threads).c_str());
    else if (!gpu_peak_source.empty())
      std::printf("# %%peak per rank (last case): %s\n", gpu_peak_source.c_str());
    std::printf("# results: %s\n", run.output_path().c_str());
  }
  return run.finish();
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-attention", [&] { return run_attention(argc, argv); });
}
