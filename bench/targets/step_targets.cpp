// Benchmark: the training step against its own parts, measured side by side in one run.
//
// 1. One rank, a GPT-2-124M-shaped model at a CPU-sized batch: the step (forward, backward, AdamW through the
//    data-parallel trainer at one rank) against the sum of the same kernels timed alone on buffers of the
//    same shapes: every linear GEMM (forward, input and weight gradients), attention forward and backward,
//    layer norms, GELU, residuals, the LM head and its loss, the embeddings, the gradient norm, AdamW. The step
//    adds only glue (head permutes, zeroing, hooks). Per phase too (forward, backward, optimizer as strata-step
//    times them; the loss's kernel counts in forward). Target: step <= 1.15x the sum.
// 2. The same world at every rank (run under mpirun -np 2): DP (ZeRO-0) against ZeRO-1, 2, 3 and the PaRO
//    strategy NIG at the same global batch, Strata's ring: step-time ratios to DP, the fraction of the step
//    spent waiting for communication, and the ring formula's bytes per rank beside them. No target: the figures
//    say what sharding costs here.
// 3. With part 2, the same strategies with overlap on against off, on the same trainers (the switch changes only
//    when collectives are waited for): step-time ratio on/off and the exposed-communication fraction of each.
//    On the CPU a collective progresses only when the step tests it between units and while it waits, and here
//    the ranks share the cores that compute, so overlap has little to hide behind: no target, the figure says
//    what overlap achieves on this machine.
// Rounds interleave the step and the kernels (part 1), and the strategies and overlap on and off (parts 2 and
// 3, the order of on and off alternating by round); medians are quoted.
//
//   strata-bench-step [--model NAME] [--seq N] [--micro-batch N] [--rounds N] [--per-kernel] [--smoke]
// Exits 3 when part 1 misses its target; --smoke runs the tiny model for the test suite, not judged.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/harness/check.h"
#include "bench/harness/cli.h"
#include "bench/harness/harness.h"
#include "bench/harness/stats.h"
#include "bench/harness/timer.h"
#include "collectives/mpi_error.h"
#include "collectives/process_group.h"
#include "kernels/attention.h"
#include "kernels/cpu_gemm.h"
#include "kernels/layers.h"
#include "kernels/linear.h"
#include "train/data.h"
#include "train/trainer.h"
#include "train/step_formulas.h"

namespace {

using namespace strata;
using namespace strata::train;


double median(std::vector<double> v) { return summarize(std::move(v)).median; }

std::vector<float> random_floats(std::size_t n, std::mt19937& rng, float scale = 0.02f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

enum class Phase { forward, backward, optimizer };
constexpr std::array<const char*, 3> kPhaseNames = {"forward", "backward", "optimizer"};

// The phase strata-step counts a kernel in, from its name: "... fwd" and the loss forward, AdamW and the gradient
// norm in the optimizer, the rest (bwd, dx, dw) backward.
Phase phase_of(const std::string& name) {
  if (name == "adamw" || name == "grad norm") return Phase::optimizer;
  if (name.ends_with(" fwd") || name == "cross_entropy") return Phase::forward;
  return Phase::backward;
}

// The kernels of one training step of `model` on `rows` = B T tokens, each a call on buffers of its shapes,
// in the order and count the model makes them.
struct StepKernels {
  std::vector<std::pair<std::string, std::function<void()>>> calls;
  std::vector<std::vector<float>> buffers;
  std::vector<int32_t> tokens;
  volatile double norm_sink = 0;  // the gradient norm's result, kept so the call is not optimised away

  float* buffer(std::size_t n, std::mt19937& rng) {
    buffers.push_back(random_floats(n, rng));
    return buffers.back().data();
  }

  StepKernels(const ModelConfig& m, int batch, int seq, cpu_gemm::Backend library) {
    std::mt19937 rng(7);
    const std::size_t B = static_cast<std::size_t>(batch), T = static_cast<std::size_t>(seq), N = B * T;
    const std::size_t C = static_cast<std::size_t>(m.hidden), Q = static_cast<std::size_t>(m.qkv_channels()),
                      F = static_cast<std::size_t>(m.mlp()), V = static_cast<std::size_t>(m.vocab);
    const layers::CpuOptions cpu{};
    const attention::Shape shape{batch, m.heads, m.kv_heads, seq, seq, m.head_dim(), true};
    float* x = buffer(N * std::max(F, Q), rng);
    float* y = buffer(N * std::max({F, Q, V}), rng);
    float* dx = buffer(N * std::max(F, Q), rng);
    float* dy = buffer(N * std::max({F, Q, V}), rng);
    float* w = buffer(std::max({F * C, Q * C, V * C}), rng);
    float* dw = buffer(std::max({F * C, Q * C, V * C}), rng);
    float* bias = buffer(std::max({F, Q, C}), rng);
    float* dbias = buffer(std::max({F, Q, C}), rng);
    float* stats = buffer(4 * N, rng);  // layer norm: mean, rstd; loss: losses and 3N row statistics
    float* q = buffer(attention::q_elements(shape), rng);
    float* k = buffer(attention::kv_elements(shape), rng);
    float* v = buffer(attention::kv_elements(shape), rng);
    float* o = buffer(attention::q_elements(shape), rng);
    float* lse = buffer(attention::lse_elements(shape), rng);
    float* d_o = buffer(attention::q_elements(shape), rng);
    float* dq = buffer(attention::q_elements(shape), rng);
    float* dk = buffer(attention::kv_elements(shape), rng);
    float* dv = buffer(attention::kv_elements(shape), rng);
    float* wpe = buffer(static_cast<std::size_t>(m.max_seq) * C, rng);
    tokens.resize(N);
    for (std::size_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>(rng() % V);
    // The loss's inputs are logits of a trained-looking scale, so the softmax does real work.
    attention::flash_forward(shape, q, k, v, o, lse, {});  // lse of these q, k for the backward calls
    auto linear_calls = [&](const char* name, std::size_t in, std::size_t out) {
      const linear::Dims d{static_cast<int64_t>(N), static_cast<int64_t>(in), static_cast<int64_t>(out)};
      calls.emplace_back(std::string(name) + " fwd", [=] { linear::forward(library, d, y, x, w, bias); });
      calls.emplace_back(std::string(name) + " dx", [=] { linear::backward_input(library, d, dx, dy, w, false); });
      calls.emplace_back(std::string(name) + " dw", [=] { linear::backward_weight(library, d, dw, dbias, dy, x, true); });
    };
    calls.emplace_back("embedding fwd", [=, this] { layers::embedding_forward(y, tokens.data(), w, wpe, B, T, C, V, cpu); });
    for (int l = 0; l < m.layers; ++l) {
      for (int norm = 0; norm < 2; ++norm) {
        calls.emplace_back("layernorm fwd", [=] { layers::layernorm_forward(y, stats, stats + N, x, bias, dbias, N, C, cpu); });
        calls.emplace_back("layernorm bwd", [=] { layers::layernorm_backward(dx, dw, dbias, dy, x, bias, stats, stats + N, N, C, cpu); });
        calls.emplace_back("residual fwd", [=] { layers::residual_forward(y, x, dx, N * C, cpu); });
        calls.emplace_back("residual bwd", [=] { layers::accumulate(dx, dy, N * C, cpu); });
      }
      linear_calls("qkv", C, Q);
      calls.emplace_back("attention fwd", [=] { attention::flash_forward(shape, q, k, v, o, lse, {}); });
      calls.emplace_back("attention bwd", [=] { attention::flash_backward(shape, q, k, v, o, d_o, lse, dq, dk, dv, {}); });
      linear_calls("attn_proj", C, C);
      linear_calls("fc", C, F);
      calls.emplace_back("gelu fwd", [=] { layers::gelu_forward(y, x, N * F, cpu); });
      calls.emplace_back("gelu bwd", [=] { layers::gelu_backward(dx, x, dy, N * F, cpu); });
      linear_calls("fc_proj", F, C);
    }
    calls.emplace_back("layernorm fwd", [=] { layers::layernorm_forward(y, stats, stats + N, x, bias, dbias, N, C, cpu); });
    calls.emplace_back("layernorm bwd", [=] { layers::layernorm_backward(dx, dw, dbias, dy, x, bias, stats, stats + N, N, C, cpu); });
    {
      const linear::Dims d{static_cast<int64_t>(N), static_cast<int64_t>(C), static_cast<int64_t>(V)};
      calls.emplace_back("lm_head fwd", [=] { linear::forward(library, d, y, x, w, nullptr); });
      calls.emplace_back("cross_entropy", [=, this] {
        layers::softmax_cross_entropy(stats, dy, stats + N, y, tokens.data(), static_cast<float>(N), layers::whole_vocab(N, V), cpu);
      });
      calls.emplace_back("lm_head dx", [=] { linear::backward_input(library, d, dx, dy, w, false); });
      calls.emplace_back("lm_head dw", [=] { linear::backward_weight(library, d, dw, nullptr, dy, x, true); });
    }
    calls.emplace_back("embedding bwd", [=, this] { layers::embedding_backward(dw, wpe, dy, tokens.data(), B, T, C, cpu); });
    const std::size_t psi = static_cast<std::size_t>(m.parameters());
    float* params = buffer(psi, rng);
    float* grads = buffer(psi, rng);
    float* adam_m = buffer(psi, rng);
    float* adam_v = buffer(psi, rng);
    for (std::size_t i = 0; i < psi; ++i) adam_v[i] = adam_v[i] * adam_v[i];
    calls.emplace_back("grad norm", [=, this] { norm_sink = layers::squared_norm(grads, psi, {}); });
    calls.emplace_back("adamw", [=] {
      layers::AdamWConfig adamw;
      adamw.weight_decay = 0.1f;
      layers::adamw_update(params, grads, adam_m, adam_v, psi, adamw, 1, 1.0f, {});
    });
  }

  // Seconds per phase of one pass over every call; with `by_name`, each kernel's seconds (its calls summed) added
  // to its list.
  std::array<double, 3> run_all(std::map<std::string, std::vector<double>>* by_name = nullptr) {
    std::array<double, 3> by_phase{};
    std::map<std::string, double> pass;
    for (auto& [name, call] : calls) {
      const double start = host_now();
      call();
      const double seconds = host_now() - start;
      by_phase[static_cast<std::size_t>(phase_of(name))] += seconds;
      if (by_name) pass[name] += seconds;
    }
    if (by_name)
      for (const auto& [name, seconds] : pass) (*by_name)[name].push_back(seconds);
    return by_phase;
  }
};

struct Settings {
  std::string model = "gpt2-124m";
  int seq = 128, micro_batch = 2, rounds = 5;
  bool smoke = false, per_kernel = false;
};

int run(int argc, char** argv) {
  Settings s;
  Cli cli("strata-bench-step", "The training step against its kernels timed alone; DP against ZeRO and PaRO.");
  cli.option("model", 'm', "model preset", s.model);
  cli.option("seq", 's', "sequence length", s.seq, 1);
  cli.option("micro-batch", 'b', "rows per rank", s.micro_batch, 1);
  cli.option("rounds", 'r', "interleaved rounds (medians are quoted)", s.rounds, 1);
  cli.flag("per-kernel", 0, "part 1 also prints each kernel's median alone (its calls in one step summed)", s.per_kernel);
  cli.flag("smoke", 0, "the tiny model for the test suite: checks and table, targets not judged", s.smoke);
  if (!cli.parse(argc, argv)) return 0;
  if (s.smoke) s.model = "tiny", s.seq = 32, s.rounds = 1;
  // One GEMM thread per rank, as the figures say: without it oneDNN's OpenMP runtime takes every core.
  cpu_gemm::set_threads(1);
  int rank = 0, world = 1;
  STRATA_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  STRATA_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  const ModelConfig model = preset(s.model);
  const cpu_gemm::Backend library = cpu_gemm::available(cpu_gemm::Backend::onednn) ? cpu_gemm::Backend::onednn
                                                                                    : cpu_gemm::Backend::openblas;
  const int group_size = world >= 4 ? 2 : 0;
  coll::ProcessGroups groups({1, 1, world}, group_size);
  const auto data = synthetic_tokens(model.vocab, 1);
  TrainConfig base;
  base.model = model, base.micro_batch = s.micro_batch, base.seq = s.seq, base.runtime.library = library;
  base.comm_algo = coll::Algo::ring;

  if (world == 1) {  // ---- 1: the step against its kernels timed alone ----
    Trainer trainer(base, groups, *data);
    StepKernels kernels(model, s.micro_batch, s.seq, library);
    std::printf("# strata-bench-step (1 rank): %s, micro-batch %d x seq %d, %s GEMMs, one thread; %d rounds, step and "
                "kernels interleaved, medians\n", model.name.c_str(), s.micro_batch, s.seq, cpu_gemm::name(library).c_str(),
                s.rounds);
    std::fflush(stdout);
    trainer.step(1);
    kernels.run_all();  // warm-up of both
    std::vector<double> steps, sums;
    std::array<std::vector<double>, 3> step_phases, kernel_phases;
    std::map<std::string, std::vector<double>> by_name;  // kernel -> its seconds alone per round
    for (int r = 0; r < s.rounds; ++r) {
      const double start = host_now();
      const StepStats stats = trainer.step(r + 2);
      steps.push_back(host_now() - start);
      const std::array<double, 3> measured = {stats.forward_seconds, stats.backward_seconds, stats.optimizer_seconds};
      const std::array<double, 3> alone = kernels.run_all(&by_name);
      sums.push_back(alone[0] + alone[1] + alone[2]);
      for (std::size_t p = 0; p < 3; ++p) step_phases[p].push_back(measured[p]), kernel_phases[p].push_back(alone[p]);
    }
    const double ratio = median(steps) / median(sums);
    const double target = 1.15;
    for (std::size_t p = 0; p < 3; ++p)
      std::printf("  %-9s step %9.3f ms, kernels alone %9.3f ms: %.3f\n", kPhaseNames[p], median(step_phases[p]) * 1e3,
                  median(kernel_phases[p]) * 1e3, median(step_phases[p]) / median(kernel_phases[p]));
    if (s.per_kernel) {
      std::printf("  kernels alone, median per step (us; a kernel's calls in one step summed):\n");
      for (const auto& [name, seconds] : by_name) std::printf("    %-16s %9.1f\n", name.c_str(), median(seconds) * 1e6);
    }
    std::printf("  step %.3f ms, its %zu kernels alone %.3f ms: step / sum %.3f  <= %.2f %s\n", median(steps) * 1e3,
                kernels.calls.size(), median(sums) * 1e3, ratio, target,
                s.smoke ? "(smoke: not judged)" : ratio <= target ? "PASS" : "MISS");
    return !s.smoke && ratio > target ? 3 : 0;
  }

  // ---- 2 and 3: DP against ZeRO-1/2/3 and NIG at the same global batch; each with overlap on and off ----
  const char* names[] = {"NNN", "NNG", "NGG", "GGG", "NIG"};
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (const char* name : names) {
    TrainConfig c = base;
    c.strategy = parse_strategy(name);
    trainers.push_back(std::make_unique<Trainer>(c, groups, *data));
  }
  const DataParallelShape shape = data_parallel_shape(groups);
  if (rank == 0) {
    std::printf("# strata-bench-step (%d ranks as %d group(s) of %d): %s, micro-batch %d x seq %d per rank, Strata's ring; "
                "%d rounds, strategies and overlap on/off interleaved; step: median of the per-step max over ranks\n",
                world, shape.g, shape.m, model.name.c_str(), s.micro_batch, s.seq, s.rounds);
    std::printf("# %-4s %10s %8s %9s %14s %14s %14s %14s\n", "", "step(ms)", "vs DP", "exposed", "sent intra", "formula",
                "sent inter", "formula");
    std::fflush(stdout);
  }
  // [strategy][0: overlap on, 1: off]: per round, the step (max over ranks) and rank 0's wait for collectives.
  std::vector<std::array<std::vector<double>, 2>> steps(trainers.size()), exposed(trainers.size());
  std::vector<coll::Traffic> sent(trainers.size());
  std::vector<int64_t> step_index(trainers.size(), 0);
  auto timed_step = [&](std::size_t i, int off) {
    trainers[i]->set_overlap(off == 0);
    STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    const double start = host_now();
    const StepStats stats = trainers[i]->step(++step_index[i]);
    double took = host_now() - start, slowest = 0;
    STRATA_MPI_CHECK(MPI_Allreduce(&took, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    if (off == 0) sent[i] = stats.traffic;  // the same collectives either way; only when they are waited for differs
    return std::pair{slowest, stats.exposed_comm_seconds};
  };
  for (std::size_t i = 0; i < trainers.size(); ++i)
    for (int off : {0, 1}) timed_step(i, off);  // warm-up: the buffer pool grows to what each mode holds at once
  for (int r = 0; r < s.rounds; ++r)
    for (std::size_t i = 0; i < trainers.size(); ++i)
      for (int k = 0; k < 2; ++k) {
        const int off = (k + r) % 2;  // on first in even rounds, off first in odd ones
        const auto [slowest, waited] = timed_step(i, off);
        steps[i][static_cast<std::size_t>(off)].push_back(slowest);
        exposed[i][static_cast<std::size_t>(off)].push_back(waited);
      }
  int wrong = 0;  // the ring counts what the formula says, or the figures beside it mean nothing
  for (std::size_t i = 0; i < trainers.size(); ++i) {
    TrainConfig c = base;
    c.strategy = parse_strategy(names[i]);
    const coll::Traffic formula = expected_traffic(c, shape);
    wrong += sent[i].intra_bytes != formula.intra_bytes || sent[i].inter_bytes != formula.inter_bytes;
    const double step = median(steps[i][0]), dp = median(steps[0][0]);
    if (rank == 0)
      std::printf("  %-4s %10.1f %8.3f %8.1f%% %12.2f MB %12.2f MB %12.2f MB %12.2f MB\n", names[i], step * 1e3, step / dp,
                  100 * median(exposed[i][0]) / step, sent[i].intra_bytes / 1e6, formula.intra_bytes / 1e6,
                  sent[i].inter_bytes / 1e6, formula.inter_bytes / 1e6);
  }
  if (rank == 0) {
    std::printf("# overlap on: exposed is rank 0's median wait for collectives over the step; sent: rank 0, bytes per step\n");
    std::printf("# overlap on against off, the same trainers and rounds (no target: what overlap achieves here)\n");
    std::printf("# %-4s %10s %10s %8s %12s %12s\n", "", "on(ms)", "off(ms)", "on/off", "exposed on", "exposed off");
    for (std::size_t i = 0; i < trainers.size(); ++i) {
      const double on = median(steps[i][0]), off = median(steps[i][1]);
      std::printf("  %-4s %10.1f %10.1f %8.3f %11.1f%% %11.1f%%\n", names[i], on * 1e3, off * 1e3, on / off,
                  100 * median(exposed[i][0]) / on, 100 * median(exposed[i][1]) / off);
    }
  }
  if (wrong) {
    std::fprintf(stderr, "strata-bench-step: rank %d: %d strategies sent other bytes than the formula\n", rank, wrong);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-bench-step", [&] { return run(argc, argv); });
}
