// strata-interference: how much a compute kernel and a collective slow each other when they overlap the way
// Strata's CPU training step overlaps them: every rank starts a non-blocking collective on the process group,
// runs `--calls` kernel calls (a layer each), tests the collective between calls, as the step does at its layer
// boundaries, and waits for it after the last call. Nothing progresses the collective in the background: the
// test calls do its copies and reductions on the computing thread, and the MPI library's shared-memory path
// moves its bytes with the same cores, caches and memory the kernel uses. So the overlapped compute section's
// time holds the kernels and that progress work (the test time is stored beside it), and the collective ends
// no earlier than the first test after its last message: what the step sees, not what a device with a copy
// engine would.
//
// Each round times, on every rank: the calls alone; the collective alone (started, then waited for); both
// overlapped. Rounds alternate the order of the three, after warm-up rounds. Per (kernel, collective, size), four
// cases: each section alone and overlapped; the overlapped ones store the slowdown (median overlapped / median
// alone, over rounds of the per-round max over ranks).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "bench/harness/axes.h"
#include "bench/cases/gemm_cases.h"
#include "bench/harness/harness.h"
#include "bench/harness/shapes.h"
#include "collectives/algorithms.h"
#include "collectives/check.h"
#include "collectives/layout.h"
#include "collectives/operations.h"
#include "collectives/process_group.h"
#include "kernels/attention.h"
#include "kernels/gemm_check.h"

namespace {

using namespace strata;
using coll::Algo;
using coll::DataType;
using coll::Operation;
using coll::RedOp;

struct Options {
  std::string kernels = "gemm,attention";
  std::string gemm = "512x512x512";
  int heads = 8, seq = 512, dim = 64;
  int calls = 4;
  std::string collectives = "allreduce";
  std::string algos = "ring";
  std::string minbytes = "1M", maxbytes = "16M";
  int stepfactor = 4;
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A kernel the overlapped section calls `calls` times: fp32 on the CPU, one thread, as the training step's layers.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void run() = 0;
  // Output elements outside tolerance after the rounds (GEMM: against float64; attention: against its output
  // before any overlap, bit for bit, as the kernel is deterministic on fixed threads).
  virtual int64_t check() = 0;
  virtual void corrupt() = 0;  // --inject-wrong-element
  std::string name, shape;
  double flop = 0;
};

class GemmKernel final : public Kernel {
 public:
  GemmKernel(const gemm::Shape& s, uint64_t seed, cpu_gemm::Backend library) : gemm_(s, gemm::DType::fp32, seed, library), seed_(seed) {
    name = "gemm";
    shape = s.text();
    flop = s.flops();
  }
  void run() override { gemm_.run(); }
  int64_t check() override { return gemm_.check(16, seed_).wrong; }
  void corrupt() override { gemm_.corrupt_output(); }

 private:
  gemm::CpuGemm gemm_;
  uint64_t seed_;
};

class AttentionKernel final : public Kernel {
 public:
  AttentionKernel(const attention::Shape& s, uint64_t seed)
      : shape_(s), q_(attention::q_elements(s)), k_(attention::kv_elements(s)), v_(k_.size()), o_(q_.size()),
        lse_(attention::lse_elements(s)) {
    gemm::fill_uniform(q_.data(), q_.size(), seed);
    gemm::fill_uniform(k_.data(), k_.size(), seed + 1);
    gemm::fill_uniform(v_.data(), v_.size(), seed + 2);
    name = "attention";
    shape = "b" + std::to_string(s.batch) + " h" + std::to_string(s.heads_q) + " s" + std::to_string(s.seq_q) + " d" +
            std::to_string(s.head_dim) + " causal fwd";
    flop = attention::forward_flops(s);
    run();
    expected_ = o_;
  }
  void run() override { attention::flash_forward(shape_, q_.data(), k_.data(), v_.data(), o_.data(), lse_.data(), {}); }
  int64_t check() override {
    int64_t wrong = 0;
    for (size_t i = 0; i < o_.size(); ++i) wrong += o_[i] == expected_[i] ? 0 : 1;
    return wrong;
  }
  void corrupt() override { o_[0] = 2 * o_[0] + 1; }

 private:
  attention::Shape shape_;
  std::vector<float> q_, k_, v_, o_, lse_, expected_;
};

// One collective on the world's process group, its buffers and its check.
struct Collective {
  Operation op;
  Algo algo;
  coll::Counts counts;
  coll::CheckSpec spec;
  std::vector<unsigned char> in, out;

  coll::Work start(coll::Group& group) {
    switch (op) {
      case Operation::allreduce:
        return group.allreduce(algo, in.data(), out.data(), counts.count, DataType::float32, RedOp::sum);
      case Operation::reduce_scatter:
        return group.reduce_scatter(algo, in.data(), out.data(), counts.count, DataType::float32, RedOp::sum);
      case Operation::allgather: return group.allgather(algo, in.data(), out.data(), counts.count, DataType::float32);
      default: throw UsageError("--collective " + std::string(coll::name(op)) + ": allreduce, reduce_scatter or allgather");
    }
  }
};

// One round's times on this rank, s.
struct Round {
  double compute_alone = 0, communication_alone = 0;
  double compute_overlapped = 0, communication_overlapped = 0;
  double test = 0, exposed = 0;
};

Round time_round(Kernel& kernel, Collective& c, coll::Group& group, int calls, bool reverse) {
  Round r;
  auto compute_alone = [&] {
    STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    const double begin = now();
    for (int i = 0; i < calls; ++i) kernel.run();
    r.compute_alone = now() - begin;
  };
  auto communication_alone = [&] {
    STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    const double begin = now();
    coll::Work work = c.start(group);
    work.wait();
    r.communication_alone = now() - begin;
  };
  auto overlapped = [&] {
    STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    const double begin = now();
    coll::Work work = c.start(group);
    double done = work.done() ? now() : 0;
    for (int i = 0; i < calls; ++i) {
      kernel.run();
      if (done == 0) {  // the step's layer boundary: progress the operation in flight
        const double before = now();
        if (work.test()) done = now();
        r.test += now() - before;
      }
    }
    const double compute_end = now();
    r.compute_overlapped = compute_end - begin;
    if (done == 0) {
      work.wait();
      done = now();
      r.exposed = done - compute_end;
    }
    r.communication_overlapped = done - begin;
  };
  if (reverse) {
    overlapped(), communication_alone(), compute_alone();
  } else {
    compute_alone(), communication_alone(), overlapped();
  }
  return r;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? std::nan("") : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

void add_interference_options(Cli& cli, Options& o, HarnessOptions& h) {
  cli.option("kernel", 0, "kernels: gemm,attention", o.kernels);
  cli.option("gemm", 0, "the GEMM's MxNxK (fp32)", o.gemm);
  cli.option("heads", 'H', "attention: heads (batch 1, causal forward, flash, fp32)", o.heads, 1);
  cli.option("seq", 's', "attention: sequence length", o.seq, 1);
  cli.option("dim", 'D', "attention: head dimension", o.dim, 1);
  cli.option("calls", 0, "kernel calls per compute section, the collective tested after each", o.calls, 1);
  cli.option("collective", 0, "operations: allreduce,reduce_scatter,allgather (float sum, on all ranks)", o.collectives);
  cli.option("algo", 'a', "algorithms of the process groups: library,ring,hierarchical,horing,shm", o.algos);
  cli.option("minbytes", 'b', "smallest size S (K/M/G suffixes; nccl-tests' S)", o.minbytes);
  cli.option("maxbytes", 'e', "largest size S", o.maxbytes);
  cli.option("stepfactor", 'f', "multiply the size by this between steps", o.stepfactor, 2);
  add_harness_options(cli, h);
}

// The cases, checked before the run starts: kernel x operation x algorithm x size, each as four sections (compute and
// communication, alone and overlapped) in that order.
struct Plan {
  gemm::Shape gemm_shape;
  attention::Shape attention_shape;
  Axes axes;
};

Plan plan_interference(const Options& o) {
  std::vector<std::string> kernels = split_list(o.kernels, "--kernels");
  for (const auto& k : kernels)
    if (k != "gemm" && k != "attention") throw UsageError("unknown kernel '" + k + "' (gemm, attention)");
  Plan plan{gemm::parse_shape(o.gemm), {1, o.heads, o.heads, o.seq, o.seq, o.dim, true}, {}};
  if (std::string problem = attention::validate(plan.attention_shape); !problem.empty()) throw UsageError(problem);
  std::vector<Operation> ops;
  for (const auto& name : split_list(o.collectives, "--collective")) {
    const auto op = coll::parse_operation(name);
    if (!op || (*op != Operation::allreduce && *op != Operation::reduce_scatter && *op != Operation::allgather))
      throw UsageError("unknown --collective '" + name + "' (allreduce, reduce_scatter, allgather)");
    ops.push_back(*op);
  }
  std::vector<Algo> algos;
  for (const auto& name : split_list(o.algos, "--algo")) {
    const auto algo = coll::parse_algo(name);
    if (!algo) throw UsageError("unknown --algo '" + name + "'");
    for (Operation op : ops)
      if (!coll::Group::supports(op, *algo))
        throw UsageError("algorithm " + name + " is not available for " + std::string(coll::name(op)) +
                         " on the process groups");
    algos.push_back(*algo);
  }
  const int64_t min_bytes = parse_bytes(o.minbytes, "--minbytes"), max_bytes = parse_bytes(o.maxbytes, "--maxbytes");
  if (min_bytes <= 0 || max_bytes < min_bytes)
    throw UsageError("sizes: expected 0 < --minbytes <= --maxbytes, got " + o.minbytes + " and " + o.maxbytes);
  std::vector<int64_t> sizes;
  for (int64_t b = min_bytes; b <= max_bytes; b *= o.stepfactor) sizes.push_back(b);

  std::vector<std::string> op_names, algo_names;
  for (Operation op : ops) op_names.emplace_back(coll::name(op));
  for (Algo a : algos) algo_names.emplace_back(coll::name(a));
  plan.axes.add("kernel", kernels)
      .add("operation", op_names)
      .add("algo", algo_names)
      .add("requested_bytes", sizes, "B")
      .add_zipped({{"section", "", "compute: the kernel calls (with the tests when overlapped); communication: the "
                                   "collective from its start to the moment this rank sees it complete"},
                   {"overlapped", "1"}},
                  {{"compute", int64_t{0}}, {"communication", int64_t{0}}, {"compute", int64_t{1}},
                   {"communication", int64_t{1}}});
  return plan;
}

void declare_interference_columns(Run& run, const Axes& axes) {
  axes.declare_columns(run.cases());
  run.cases()
      .add_column("kernel_shape", ColumnKind::string, "")
      .add_column("dtype", ColumnKind::string, "")
      .add_column("flop", ColumnKind::float64, "FLOP", "one kernel call: 2MNK, or flash-attention's forward count")
      .add_column("calls", ColumnKind::int64, "1", "kernel calls per compute section")
      .add_column("size_bytes", ColumnKind::float64, "B", "nccl-tests' S of the collective")
      .add_column("group_size", ColumnKind::int64, "1");
  run.summary()
      .add_column("slowdown_vs_alone", ColumnKind::float64, "1",
                  "overlapped: median time overlapped / median time of the same section alone (per-round max over "
                  "ranks); alone: 1")
      .add_column("test_seconds", ColumnKind::float64, "s",
                  "compute overlapped: median over rounds of the slowest rank's time inside the collective's tests "
                  "(part of the section); NaN elsewhere")
      .add_column("exposed_seconds", ColumnKind::float64, "s",
                  "communication overlapped: median over rounds of the slowest rank's wait after the last kernel "
                  "call; NaN elsewhere");
}

int run_interference(int argc, char** argv) {
  HarnessOptions h;
  Options o;
  Cli cli("strata-interference",
          "A compute kernel and a collective, each alone and overlapped the way the CPU training step overlaps them "
          "(started, kernel calls with a test between, waited for): both slowdowns.");
  add_interference_options(cli, o, h);
  if (!cli.parse(argc, argv)) return 0;
  const Plan plan = plan_interference(o);
  const Axes& axes = plan.axes;
  const gemm::Shape& gemm_shape = plan.gemm_shape;
  const attention::Shape& attention_shape = plan.attention_shape;
  const std::vector<AxisPoint> points = axes.product();

  Run run("strata-interference", argc, argv, h, cli.resolved_json(), "cpu");
  run.set_case_count(static_cast<int>(points.size()));
  declare_interference_columns(run, axes);

  const coll::Layout layout;
  coll::MpiTypes types;
  MPI_Comm dup = MPI_COMM_NULL;
  STRATA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  coll::Group group("world", Comm(dup), layout.node_of_rank(), types);
  const int rank = run.context().self.rank, ranks = run.context().n_ranks;

  ConsoleTable table({{"kernel", 9}, {"op", 14}, {"algo", 8}, {"size(B)", 10}, {"section", 13}, {"alone(ms)", 10},
                      {"overlap(ms)", 11}, {"slowdown", 8}, {"test(ms)", 8}, {"#wrong", 6}});
  if (run.is_root()) {
    std::printf("# strata-interference: %d rank(s), %d call(s) per compute section, the collective tested after each\n",
                ranks, o.calls);
    std::printf("# time: median over rounds of the per-round max over ranks; slowdown = overlapped / alone\n");
    table.print_header();
  }

  const uint64_t seed = 1000003u + static_cast<uint64_t>(rank) * 7919u;
  const int rounds_total = h.warmup + h.iters;
  for (size_t index = 0; index < points.size(); index += 4) {
    const AxisPoint& point = points[index];
    const std::string what = point.text("kernel") + " beside " + point.text("operation") + " " + point.text("algo") + " " +
                             std::to_string(point.integer("requested_bytes")) + " B";
    run.begin_case(what, 4);
    std::unique_ptr<Kernel> kernel;
    if (point.text("kernel") == "gemm")
      kernel = std::make_unique<GemmKernel>(gemm_shape, seed, run.context().machine.description.default_gemm);
    else
      kernel = std::make_unique<AttentionKernel>(attention_shape, seed);
    Collective c;
    c.op = *coll::parse_operation(point.text("operation"));
    c.algo = *coll::parse_algo(point.text("algo"));
    c.counts = coll::counts_for(c.op, static_cast<size_t>(point.integer("requested_bytes")), sizeof(float), ranks);
    c.spec = {c.op, DataType::float32, RedOp::sum};
    c.in = coll::check_inputs(c.spec, c.counts, group.rank());
    c.out.assign(c.counts.recv_elems * sizeof(float) + 1, 0);

    std::vector<Round> rounds;
    const double budget_start = now();
    run.progress("the rounds of " + what);
    for (int i = 0; i < rounds_total; ++i) {
      run.tick();
      Round r = time_round(*kernel, c, group, o.calls, i % 2 == 1);
      if (i >= h.warmup) rounds.push_back(r);
      // --max-time: every rank stops after the same round, the first at which the slowest has spent the budget.
      if (h.max_time > 0 && i >= h.warmup && allreduce_max(MPI_COMM_WORLD, now() - budget_start) >= h.max_time) break;
    }
    if (injects_wrong_element(h, rank)) kernel->corrupt(), c.out[0] ^= 0x40;
    const int64_t kernel_wrong = kernel->check();
    const int64_t collective_wrong = coll::count_wrong(c.spec, c.counts, c.out, group.rank(), ranks, 0);

    auto series = [&](double Round::*member) {
      std::vector<double> v;
      for (const Round& r : rounds) v.push_back(r.*member);
      return v;
    };
    // The slowest rank's test and wait time per round, for the summary.
    auto slowest_median = [&](double Round::*member) {
      std::vector<double> per_round;
      for (const Round& r : rounds) per_round.push_back(allreduce_max(MPI_COMM_WORLD, r.*member));
      return median_of(per_round);
    };
    const double test_median = slowest_median(&Round::test);
    const double exposed_median = slowest_median(&Round::exposed);
    double alone_median[2] = {0, 0};  // compute, communication
    double Round::*members[4] = {&Round::compute_alone, &Round::communication_alone, &Round::compute_overlapped,
                                 &Round::communication_overlapped};
    for (size_t k = 0; k < 4; ++k) {
      const AxisPoint& p = points[index + k];
      const bool overlapped = p.integer("overlapped") != 0;
      const int slot = p.text("section") == "compute" ? 0 : 1;
      const int64_t wrong = slot == 0 ? kernel_wrong : collective_wrong;
      CaseResult r = run.record(
          series(members[k]), wrong,
          p.text("kernel") + " " + p.text("section") + (overlapped ? " overlapped with " : " alone, ") +
              p.text("operation") + " " + p.text("algo") + " " + std::to_string(c.counts.size_bytes) + " B",
          [&](Table& t) {
            axes.fill(t, p);
            t.set("kernel_shape", kernel->shape).set("dtype", "fp32").set("flop", kernel->flop).set("calls", o.calls);
            t.set("size_bytes", static_cast<double>(c.counts.size_bytes)).set("group_size", ranks);
          },
          [&](Table& t, const CaseResult& res) {
            if (!overlapped) alone_median[slot] = res.rankmax.median;
            t.set("slowdown_vs_alone", overlapped ? res.rankmax.median / alone_median[slot] : 1.0);
            t.set("test_seconds", overlapped && slot == 0 ? test_median : std::nan(""));
            t.set("exposed_seconds", overlapped && slot == 1 ? exposed_median : std::nan(""));
          });
      if (run.is_root()) {
        const double alone = alone_median[slot];
        table.print_row({p.text("kernel"), p.text("operation"), p.text("algo"), std::to_string(c.counts.size_bytes),
                         p.text("section"), format_fixed(alone * 1e3, 3),
                         overlapped ? format_fixed(r.rankmax.median * 1e3, 3) : "",
                         overlapped ? format_fixed(r.rankmax.median / alone, 3) : "",
                         overlapped && slot == 0 ? format_fixed(test_median * 1e3, 3) : "",
                         std::to_string(r.wrong_elements)});
      }
    }
  }
  if (run.is_root()) std::printf("# results: %s\n", run.output_path().c_str());
  return run.finish();
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-interference", [&] { return run_interference(argc, argv); });
}
