// strata-project speed: how long a prediction of the largest configurations takes (see project_speed.h).
#include "bench/project/project_speed.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "bench/harness/check.h"
#include "bench/harness/cli.h"
#include "bench/project/prediction.h"
#include "bench/cases/step_config.h"
#include "bench/project/system_json.h"

namespace strata {

namespace {

struct SpeedCase {
  const char* label;
  const char* gpu;  // "a100" or "h100": which description
  StepFlags flags;
  int gpus = 0;
  std::string dtype, attention = "flash";
};

StepFlags shape(const char* model, int layers, int hidden, int heads, int vocab, int seq) {
  StepFlags f;
  f.model = model, f.layers = layers, f.hidden = hidden, f.heads = heads, f.vocab = vocab, f.seq = seq;
  if (layers > 0) f.positions = seq;
  f.micro_batch = 1, f.micro_batch_given = true;  // the global batch sets the micro-batches per step
  return f;
}

// The largest published configurations: 512 micro-batches over 64 pipeline stages, and the most GPUs.
std::vector<SpeedCase> full_cases() {
  std::vector<SpeedCase> cases;
  {  // Korthikanti et al. 2022, Table 3/5: 1T on 512 A100s, full recomputation.
    SpeedCase k{"1T, 512 A100s, tp 8 pp 64, 512 micro-batches, full recompute", "a100",
                shape("gpt2-124m", 128, 25600, 160, 51200, 2048), 512, "fp16", "unfused"};
    k.flags.grid = "tp=8,pp=64,dp=1", k.flags.global_batch = 512, k.flags.recompute = "full";
    cases.push_back(k);
  }
  {  // The same model on 10,240 A100s: data parallelism of 20 across nodes, 512 micro-batches per step.
    SpeedCase k{"1T, 10240 A100s, tp 8 pp 64 dp 20, 512 micro-batches, full recompute", "a100",
                shape("gpt2-124m", 128, 25600, 160, 51200, 2048), 10240, "fp16", "unfused"};
    k.flags.grid = "tp=8,pp=64,dp=20", k.flags.global_batch = 10240, k.flags.recompute = "full";
    cases.push_back(k);
  }
  {  // Narayanan et al. 2021, Table 1: 530B on 2,520 A100s, interleaved with 3 chunks.
    SpeedCase k{"530B, 2520 A100s, tp 8 pp 35 v 3 dp 9, 280 micro-batches", "a100",
                shape("gpt2-124m", 105, 20480, 128, 51200, 2048), 2520, "fp16", "unfused"};
    k.flags.grid = "tp=8,pp=35,dp=9", k.flags.global_batch = 2520, k.flags.recompute = "full";
    k.flags.schedule = "interleaved", k.flags.virtual_stages = 3;
    cases.push_back(k);
  }
  {  // GPT-3 175B on 10,240 H100s: interleaved, sequence parallelism, ZeRO-1, selective recomputation.
    SpeedCase k{"175B, 10240 H100s, tp 8 pp 16 v 2 dp 80, sp, ZeRO-1, selective", "h100",
                shape("gpt3-175b", 0, 0, 0, 0, 2048), 10240, "bf16"};
    k.flags.grid = "tp=8,pp=16,dp=80", k.flags.global_batch = 2560, k.flags.recompute = "selective";
    k.flags.schedule = "interleaved", k.flags.virtual_stages = 2, k.flags.sp = true, k.flags.zero = "1";
    cases.push_back(k);
  }
  return cases;
}

// The same kinds of configuration, small: the tests' run.
std::vector<SpeedCase> smoke_cases() {
  std::vector<SpeedCase> cases;
  SpeedCase a{"smoke: 8 stages, 32 micro-batches, full recompute", "a100", shape("gpt2-124m", 16, 512, 8, 1024, 256), 64,
              "fp16", "unfused"};
  a.flags.grid = "tp=8,pp=8,dp=1", a.flags.global_batch = 32, a.flags.recompute = "full";
  cases.push_back(a);
  SpeedCase b{"smoke: interleaved, sp, ZeRO-1, selective", "h100", shape("gpt2-124m", 8, 512, 8, 1024, 256), 64, "bf16"};
  b.flags.grid = "tp=4,pp=4,dp=4", b.flags.global_batch = 32, b.flags.recompute = "selective";
  b.flags.schedule = "interleaved", b.flags.virtual_stages = 2, b.flags.sp = true, b.flags.zero = "1";
  cases.push_back(b);
  return cases;
}

project::StepCase step_case(SpeedCase k, const project::System& system, bool exact) {
  StepPlan plan = plan_step(k.flags, k.gpus);
  project::StepCase step = first_step_case(plan, k.flags, k.label, system.device.devices_per_node);
  step.workload = {k.dtype, 2, k.attention};
  step.predict = {exact, false};
  return step;
}

double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

struct Timed {
  project::PredictedStep predicted;
  double wall_s = 0, cpu_s = 0;
};

Timed timed_prediction(const project::StepCase& step, const project::System& system) {
  Timed t;
  const auto wall = std::chrono::steady_clock::now();
  const double cpu = cpu_seconds();
  t.predicted = project::predict_step(step, system);
  t.cpu_s = cpu_seconds() - cpu;
  t.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
  return t;
}

}  // namespace

int project_speed(int argc, char** argv) {
  std::string a100_path = "a100-80gb-sxm-hdr200", h100_path = "h100-sxm-ndr400";  // shipped descriptions, by name
  double target = kPredictionSecondsTarget;
  bool smoke = false, exact = false;
  Cli cli("strata-project speed",
          "How long one prediction of the largest configurations takes (1T parameters over 64 pipeline stages with 512 "
          "micro-batches, on 512 and on 10,240 GPUs; 530B on 2,520; 175B on 10,240), judged against the target: exit 3 "
          "when one takes longer. Time is this process's CPU time (one core), tracing, simulating (the step and both "
          "ends of its interval) and reading the components; wall time beside it.");
  cli.option("a100", 0, "the A100 system description", a100_path);
  cli.option("h100", 0, "the H100 system description", h100_path);
  cli.option("target", 0, "seconds one prediction may take", target, 0.0);
  cli.flag("exact", 0, "also time the simulator's reference path (--simulator exact) and compare the steps", exact);
  cli.flag("smoke", 0, "small configurations of the same kinds, no verdict (the tests' run)", smoke);
  if (!cli.parse(argc, argv)) return 0;
  if (!(target > 0) || !std::isfinite(target)) throw UsageError("--target must be a positive number of seconds");
  const project::System a100 = read_system(a100_path), h100 = read_system(h100_path);

  bool missed = false;
  double worst = 0;
  for (const SpeedCase& k : smoke ? smoke_cases() : full_cases()) {
    const bool on_a100 = std::string(k.gpu) == "a100";
    const project::System& system = on_a100 ? a100 : h100;
    Timed fast;
    try {
      fast = timed_prediction(step_case(k, system, false), system);
    } catch (const std::invalid_argument& e) {
      throw UsageError("case '" + std::string(k.label) + "' on " + (on_a100 ? a100_path : h100_path) + ": " + e.what());
    }
    worst = std::max(worst, fast.cpu_s);
    const bool met = fast.cpu_s <= target;
    missed = missed || !met;
    std::printf("# %-70s step %9.3f s [%.3f, %.3f] | predicted in %6.2f s CPU (%6.2f s wall: traced %.2f, simulated %.2f)%s\n",
                k.label, fast.predicted.prediction.step_s, fast.predicted.prediction.step_low_s,
                fast.predicted.prediction.step_high_s, fast.cpu_s, fast.wall_s, fast.predicted.trace_s,
                fast.predicted.simulate_s, smoke ? "" : met ? "" : "  MISSED");
    if (exact) {
      const Timed reference = timed_prediction(step_case(k, system, true), system);
      const double difference = std::abs(fast.predicted.prediction.step_s / reference.predicted.prediction.step_s - 1);
      std::printf("#   %-68s step %9.3f s | predicted in %6.2f s CPU (%6.2f s wall); %.2fx faster, steps differ by %.1e\n",
                  "reference (--simulator exact)", reference.predicted.prediction.step_s, reference.cpu_s,
                  reference.wall_s, reference.cpu_s / std::max(fast.cpu_s, 1e-9), difference);
    }
    std::fflush(stdout);
  }
  if (smoke) {
    std::printf("# bench (smoke): slowest prediction %.2f s CPU, not judged\n", worst);
    return 0;
  }
  std::printf("# bench: slowest prediction %.2f s CPU (one core), target <= %.1f s: ratio %.2f %s\n", worst, target,
              worst / target, missed ? "MISSED" : "met");
  return missed ? 3 : 0;
}

}  // namespace strata
