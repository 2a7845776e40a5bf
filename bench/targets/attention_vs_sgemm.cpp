// Benchmark: CPU flash attention against the cblas_sgemm rate of the two GEMM shapes it is made of,
// S = Q K^T (seq x seq x dim) and O = P V (seq x dim x seq), one thread per rank, fp32. Attention rates use
// the flash-attention FLOP convention, so the ratio says how much of the GEMM rate survives the softmax,
// the blocking and the masking. Runs on one rank, or under mpirun on several at once, where each rank times
// its own copy and the table adds the ranks' rates (the point being to see shared caches and memory
// bandwidth under load); with several ranks the single-rank table is measured first, the others idle.
//
// The cases are timed round-robin, one call of each per repetition, so that a change in machine load
// during the run lands on the GEMM reference and on the kernels alike instead of skewing their ratio.
//
//   strata-bench-attention [-s/--seq N] [-H/--heads N] [-D/--dim N] [--reps N] [--smoke]
// Exits 3 when a ratio misses its target, so a script can tell. --smoke runs a tiny problem (sequence 128, two
// heads, two rounds) for the test suite: the checks and the table, without judging the targets.
// The C API is all this program uses; the deprecated C++ bindings do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/mpi_error.h"
#include "bench/harness/check.h"
#include "bench/harness/cli.h"
#include "bench/harness/harness.h"
#include "kernels/attention.h"

namespace {

namespace att = strata::attention;

struct Settings {
  int seq = 2048;
  int heads = 8;
  int dim = 64;
  int reps = 10;
  bool smoke = false;
};

// Returns false when --help was asked for.
bool parse(int argc, char** argv, Settings& s) {
  strata::Cli cli("strata-bench-attention",
                  "CPU flash attention against the sgemm rate of its two GEMM shapes; fp32, one thread per rank.");
  cli.option("seq", 's', "sequence length", s.seq, 1);
  cli.option("heads", 'H', "heads", s.heads, 1);
  cli.option("dim", 'D', "head dimension", s.dim, 1);
  cli.option("reps", 0, "timed rounds of every case", s.reps, 1);
  cli.flag("smoke", 0, "a tiny problem for the test suite: checks and table, targets not judged", s.smoke);
  if (!cli.parse(argc, argv)) return false;
  if (s.smoke) s.seq = 128, s.heads = 2, s.reps = 2;
  // Beyond this the buffers alone outgrow any machine this runs on; refused before anything is allocated.
  constexpr int largest = 1 << 24;
  for (auto [name, value] : {std::pair{"--seq", s.seq}, {"--heads", s.heads}, {"--dim", s.dim}, {"--reps", s.reps}})
    if (value > largest)
      throw strata::UsageError(std::string(name) + " must be at most " + std::to_string(largest) + ", got " +
                               std::to_string(value));
  return true;
}

// Uniform in [-1, 1] with exact zeros replaced, so no product in the kernels is trivially zero.
std::vector<float> random_values(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) {
    x = dist(rng);
    if (x == 0.0f) x = 0.5f;
  }
  return v;
}

// Forward results of one masking mode: the backward of that mode needs its own O and lse.
struct ForwardResult {
  std::vector<float> o, lse;
};

// Inputs and outputs of one attention problem, (B=1, H, S, D) throughout.
struct Problem {
  Problem(const Settings& s, std::mt19937& rng)
      : full{1, s.heads, s.heads, s.seq, s.seq, s.dim, false},
        causal{1, s.heads, s.heads, s.seq, s.seq, s.dim, true},
        q(random_values(att::q_elements(full), rng)),
        k(random_values(att::kv_elements(full), rng)),
        v(random_values(att::kv_elements(full), rng)),
        d_o(random_values(att::q_elements(full), rng)),
        dq(q.size()),
        dk(k.size()),
        dv(v.size()) {}

  const att::Shape full, causal;
  std::vector<float> q, k, v, d_o, dq, dk, dv;
};

ForwardResult run_forward(const Problem& p, const att::Shape& shape, const att::CpuOptions& options) {
  ForwardResult r{std::vector<float>(p.q.size()), std::vector<float>(att::lse_elements(shape))};
  att::flash_forward(shape, p.q.data(), p.k.data(), p.v.data(), r.o.data(), r.lse.data(), options);
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// Correctness gate: flash against the materialised baseline, forward and backward, before any timing.

bool matches(const char* what, const std::vector<float>& got, const std::vector<float>& want, bool causal) {
  const double tol = att::tolerance(att::Precision::fp32);
  const att::ErrorReport r = att::compare(got.data(), want.data(), got.size(), tol);
  const bool ok = att::within(r, tol);
  if (!ok) {
    std::fprintf(stderr, "MISMATCH %s%s: rel_l2 %.3g, max_abs %.3g, %zu bad of %zu\n", what,
                 causal ? " (causal)" : "", r.rel_l2, r.max_abs, r.bad, got.size());
  }
  return ok;
}

bool flash_matches_naive(Problem& p, const att::Shape& shape, const att::CpuOptions& options) {
  const std::size_t nq = p.q.size(), nkv = p.k.size(), nl = att::lse_elements(shape);
  std::vector<float> o(nq), lse(nl), dq(nq), dk(nkv), dv(nkv);
  att::naive_forward(shape, p.q.data(), p.k.data(), p.v.data(), o.data(), lse.data(), options);
  att::naive_backward(shape, p.q.data(), p.k.data(), p.v.data(), o.data(), p.d_o.data(), lse.data(), dq.data(),
                      dk.data(), dv.data(), options);
  const ForwardResult flash = run_forward(p, shape, options);
  att::flash_backward(shape, p.q.data(), p.k.data(), p.v.data(), flash.o.data(), p.d_o.data(), flash.lse.data(),
                      p.dq.data(), p.dk.data(), p.dv.data(), options);
  bool ok = matches("O", flash.o, o, shape.causal);
  ok = matches("lse", flash.lse, lse, shape.causal) && ok;
  ok = matches("dQ", p.dq, dq, shape.causal) && ok;
  ok = matches("dK", p.dk, dk, shape.causal) && ok;
  return matches("dV", p.dv, dv, shape.causal) && ok;
}

// ---------------------------------------------------------------------------------------------------------
// Timing.

struct Case {
  std::string name;
  double flops;
  std::function<void()> call;
  double target;  // minimum ratio to the sgemm reference rate; 0 when there is none
  std::vector<double> seconds{};
};

// Waits for every rank without spinning: Open MPI's blocking barrier polls, and a polling rank would take
// a core from whatever else runs on the machine while rank 0 measures alone.
void quiet_barrier() {
  MPI_Request request;
  STRATA_MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &request));
  int done = 0;
  while (!done) {
    STRATA_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Two warm-up rounds, then `reps` timed rounds of every case in turn. With `together`, every rank runs each
// call after a common barrier; otherwise rank 0 runs alone while the others wait.
void time_round_robin(std::vector<Case>& cases, int reps, bool together, int rank) {
  if (!together && rank != 0) {
    quiet_barrier();
    return;
  }
  for (int rep = -2; rep < reps; ++rep) {
    for (Case& c : cases) {
      if (together) STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
      const auto start = std::chrono::steady_clock::now();
      c.call();
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (rep >= 0) c.seconds.push_back(elapsed);
    }
  }
  if (!together) quiet_barrier();
}

// GFLOP/s from the median, slowest and fastest repetition: rank 0's alone, or summed over ranks when they
// all ran.
struct Rate {
  double median, low, high;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

Rate rate(double flops, const std::vector<double>& seconds, bool together, int rank) {
  Rate mine{0.0, 0.0, 0.0};
  if (together || rank == 0) {
    const auto [fastest, slowest] = std::minmax_element(seconds.begin(), seconds.end());
    mine = {flops / median(seconds) * 1e-9, flops / *slowest * 1e-9, flops / *fastest * 1e-9};
  }
  if (!together) return mine;
  Rate sum{};
  STRATA_MPI_CHECK(MPI_Allreduce(&mine, &sum, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  return sum;
}

void sgemm(int m, int n, int k, const std::vector<float>& a, const std::vector<float>& b, std::vector<float>& c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(),
              n);
}

void print_row(const std::string& name, const Rate& r) {
  std::printf("  %-40s %8.1f %8.1f..%-8.1f", name.c_str(), r.median, r.low, r.high);
}

// One table: the two sgemm shapes, then the attention kernels relative to them.
// Returns the number of ratios that missed their target (on rank 0; 0 elsewhere).
int measure(Problem& p, const Settings& s, bool together, int rank, int ranks) {
  const att::CpuOptions options;  // one thread, AVX-512 block products where built for them
  att::CpuOptions blas_options;
  blas_options.products = att::BlockProducts::blas;
  std::mt19937 rng(1234 + rank);
  const int n = s.seq, d = s.dim;
  // S = Q K^T is (n x n x d); O = P V is (n x d x n), as M x N x K.
  const std::vector<float> a_wide = random_values(static_cast<std::size_t>(n) * d, rng);
  const std::vector<float> b_wide = random_values(static_cast<std::size_t>(d) * n, rng);
  const std::vector<float> a_square = random_values(static_cast<std::size_t>(n) * n, rng);
  const std::vector<float> b_tall = random_values(static_cast<std::size_t>(n) * d, rng);
  std::vector<float> c_square(static_cast<std::size_t>(n) * n), c_tall(static_cast<std::size_t>(n) * d);
  const double gemm_flops = 2.0 * n * n * d;

  // Each backward reads the O and lse of its own masking mode; timed forwards write to scratch.
  const ForwardResult full_fwd = run_forward(p, p.full, options);
  const ForwardResult causal_fwd = run_forward(p, p.causal, options);
  ForwardResult scratch{std::vector<float>(p.q.size()), std::vector<float>(att::lse_elements(p.full))};

  auto forward = [&](const att::Shape& shape, const att::CpuOptions& opt) {
    return [&, shape, opt] {
      att::flash_forward(shape, p.q.data(), p.k.data(), p.v.data(), scratch.o.data(), scratch.lse.data(), opt);
    };
  };
  auto backward = [&](const att::Shape& shape, const ForwardResult& fwd, const att::CpuOptions& opt) {
    return [&, shape, opt] {
      att::flash_backward(shape, p.q.data(), p.k.data(), p.v.data(), fwd.o.data(), p.d_o.data(), fwd.lse.data(),
                          p.dq.data(), p.dk.data(), p.dv.data(), opt);
    };
  };
  auto naive = [&](const att::Shape& shape) {
    return [&, shape] {
      att::naive_forward(shape, p.q.data(), p.k.data(), p.v.data(), scratch.o.data(), scratch.lse.data(), options);
    };
  };

  char scores_name[64], values_name[64];
  std::snprintf(scores_name, sizeof scores_name, "sgemm %dx%dx%d (Q K^T)", n, n, d);
  std::snprintf(values_name, sizeof values_name, "sgemm %dx%dx%d (P V)", n, d, n);
  std::vector<Case> cases;
  cases.push_back({scores_name, gemm_flops, [&] { sgemm(n, n, d, a_wide, b_wide, c_square); }, 0.0});
  cases.push_back({values_name, gemm_flops, [&] { sgemm(n, d, n, a_square, b_tall, c_tall); }, 0.0});
  const std::size_t first_kernel = cases.size();
  cases.push_back({"flash forward", att::forward_flops(p.full), forward(p.full, options), 0.85});
  cases.push_back({"flash forward causal", att::forward_flops(p.causal), forward(p.causal, options), 0.80});
  cases.push_back({"flash backward", att::backward_flops(p.full), backward(p.full, full_fwd, options), 0.65});
  cases.push_back(
      {"flash backward causal", att::backward_flops(p.causal), backward(p.causal, causal_fwd, options), 0.65});
  cases.push_back({"flash forward, cblas_sgemm blocks", att::forward_flops(p.full), forward(p.full, blas_options), 0});
  cases.push_back(
      {"flash backward, cblas_sgemm blocks", att::backward_flops(p.full), backward(p.full, full_fwd, blas_options), 0});
  cases.push_back({"naive forward", att::forward_flops(p.full), naive(p.full), 0.0});
  cases.push_back({"naive forward causal", att::forward_flops(p.causal), naive(p.causal), 0.0});

  time_round_robin(cases, s.reps, together, rank);
  std::vector<Rate> rates;
  for (const Case& c : cases) rates.push_back(rate(c.flops, c.seconds, together, rank));

  // The reference rate: both shapes' FLOPs over both shapes' time, as one attention forward spends them.
  std::vector<double> both_seconds(cases[0].seconds.size());
  for (std::size_t i = 0; i < both_seconds.size(); ++i) both_seconds[i] = cases[0].seconds[i] + cases[1].seconds[i];
  const Rate reference = rate(2 * gemm_flops, both_seconds, together, rank);
  const double mean_rate = (rates[0].median + rates[1].median) / 2;
  if (rank != 0) return 0;
  int missed = 0;

  std::printf("\n%s: b=1 h=%d d=%d s=%d, fp32, 1 thread per rank, median of %d rounds\n",
              together ? ("all " + std::to_string(ranks) + " ranks at once, GFLOP/s summed over ranks").c_str()
                       : "single rank",
              s.heads, s.dim, s.seq, s.reps);
  std::printf("  %-40s %8s %18s  %9s %6s  %s\n", "", "GFLOP/s", "slowest..fastest", "/combined", "/mean",
              "target (vs combined)");
  print_row(cases[0].name, rates[0]);
  std::printf("\n");
  print_row(cases[1].name, rates[1]);
  std::printf("\n");
  print_row("sgemm combined (both FLOPs / both times)", reference);
  std::printf("  %9.2f\n", 1.0);
  std::printf("  %-40s %8.1f\n", "sgemm mean of the two rates", mean_rate);
  for (std::size_t i = first_kernel; i < cases.size(); ++i) {
    const double ratio = rates[i].median / reference.median;
    print_row(cases[i].name, rates[i]);
    std::printf("  %9.2f %6.2f", ratio, rates[i].median / mean_rate);
    if (cases[i].target > 0) {
      std::printf("  >= %.2f %s\n", cases[i].target, s.smoke ? "(smoke: not judged)" : ratio >= cases[i].target ? "PASS" : "MISS");
      missed += ratio >= cases[i].target ? 0 : 1;
    } else {
      std::printf("  (comparison, no target)\n");
    }
  }
  std::fflush(stdout);
  return missed;
}

int run(int argc, char** argv) {
  int rank = 0, ranks = 1;
  STRATA_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  STRATA_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &ranks));
  Settings s;
  if (!parse(argc, argv, s)) return 0;
  // One BLAS thread: the comparison is one core's GEMM against one core's attention.
  openblas_set_num_threads(1);

  std::mt19937 rng(42 + rank);
  Problem p(s, rng);
  int ok = flash_matches_naive(p, p.full, {}) && flash_matches_naive(p, p.causal, {});
  int all_ok = 0;
  STRATA_MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD));
  if (!all_ok) {
    if (rank == 0) std::fprintf(stderr, "flash attention does not match the naive kernel; not timing\n");
    return 1;
  }
  if (rank == 0) {
    std::printf("check: flash forward and backward match naive (causal and not) within %.0e\n",
                att::tolerance(att::Precision::fp32));
  }
  int missed = measure(p, s, false, rank, ranks);
  if (ranks > 1) missed += measure(p, s, true, rank, ranks);
  STRATA_MPI_CHECK(MPI_Bcast(&missed, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (s.smoke || missed == 0) return 0;
  if (rank == 0) std::printf("%d figure(s) missed their target\n", missed);
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-bench-attention", [&] { return run(argc, argv); });
}
