// strata-test-record-steps: a stand-in for a training step, so the step records (bench/harness/records.h) can be
// proven end to end under mpirun before a real step exists. Every value it records that a test can predict
// follows a rule stated here:
//   per timed iteration i on rank r: phases forward (a timed 1 ms sleep), backward (a timed 2 ms sleep,
//   entered twice, so summed), bubble (recorded as exactly 0.001 * (r + 1) * (i + 1) s);
//   events: r + 1 "matmul" events (0.1 ms sleeps) on stream "compute" (bytes 1000 * (k + 1) for the k-th) and one
//   "allreduce" on stream "comm", group "world", bytes 8 * --count, around a real MPI_Allreduce;
//   memory: "activations" noted as 1000 * (r + 1) * (i + 1) B each iteration (high-water: that of the last
//   iteration), "parameters" 4096 B;
//   metrics: loss = 1 / (i + 1) + case, grad_norm = r + i (unit 1), step_time (unit s);
//   cases: body_calls, the calls the harness's timed loop made of the body, warm-up included (--warmup + --iters).
#include <chrono>
#include <thread>

#include "bench/harness/harness.h"
#include "bench/harness/records.h"

namespace {

using namespace strata;

void sleep_ms(double ms) { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms)); }

int run_steps(int argc, char** argv) {
  HarnessOptions h;
  h.warmup = 1;
  h.iters = 2;
  int cases = 2, count = 256;
  Cli cli("strata-test-record-steps", "Records phases, events, memory and metrics of a pretend step (for tests).");
  add_harness_options(cli, h);
  cli.option("cases", 0, "cases to run", cases, 1);
  cli.option("count", 0, "doubles in the allreduce", count, 1);
  if (!cli.parse(argc, argv)) return 0;

  Run run("strata-test-record-steps", argc, argv, h, cli.resolved_json(), "cpu");
  StepRecorder recorder(run);
  run.set_case_count(cases);
  run.cases().add_column("count", ColumnKind::int64, "1", "doubles in the allreduce");
  run.cases().add_column("body_calls", ColumnKind::int64, "1", "calls of the timed loop's body, warm-up included");
  const int rank = run.context().self.rank;
  std::vector<double> in(static_cast<size_t>(count), 1.0), out(in.size());

  for (int c = 0; c < cases; ++c) {
    int call = 0;
    HostTimer timer;
    std::vector<double> samples = run.measure(timer, [&] {
      const int iteration = call++ - h.warmup;
      if (iteration < 0) {  // warm-up: the same work, nothing recorded
        sleep_ms(3);
        STRATA_MPI_CHECK(MPI_Allreduce(in.data(), out.data(), count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
        return;
      }
      recorder.begin_iteration(iteration);
      const double step_start = host_now();
      {
        auto forward = recorder.phase("forward");
        sleep_ms(1);
      }
      for (int twice = 0; twice < 2; ++twice) {
        auto backward = recorder.phase("backward");
        sleep_ms(1);
      }
      recorder.add_phase("bubble", 0.001 * (rank + 1) * (iteration + 1));
      for (int k = 0; k <= rank; ++k) {
        double start = host_now();
        sleep_ms(0.1);
        recorder.add_event("matmul", "compute", start, host_now(), 1000 * (k + 1));
      }
      double start = host_now();
      STRATA_MPI_CHECK(MPI_Allreduce(in.data(), out.data(), count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
      recorder.add_event("allreduce", "comm", start, host_now(), int64_t{8} * count, "world");
      recorder.note_memory("activations", int64_t{1000} * (rank + 1) * (iteration + 1));
      recorder.note_memory("parameters", 4096);
      recorder.add_metric("loss", 1.0 / (iteration + 1) + c);
      recorder.add_metric("grad_norm", rank + iteration);
      recorder.add_metric("step_time", host_now() - step_start, "s");
    });
    run.record(samples, 0, "steps-" + std::to_string(c), [&](Table& t) { t.set("count", count).set("body_calls", call); },
               [](Table&, const CaseResult&) {}, [&](const CaseResult& result) { recorder.write_case(result.index); });
  }
  return run.finish();
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-test-record-steps", [&] { return run_steps(argc, argv); });
}
