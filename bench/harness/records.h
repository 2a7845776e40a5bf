// Step records: what the iterations of one case are made of on each rank, beyond one time per iteration.
// Phase times (forward, backward, optimizer, comm_exposed, bubble, recompute: any names), an event timeline
// on a clock common to all ranks, memory high-water marks per category, and scalar metrics per iteration
// (loss, grad_norm). Each rank records its own; write_case() gathers them (unequal lengths, MPI_Gatherv) to
// rank 0, which appends the `phases`, `events`, `memory` and `metrics` tables of schema 1.1
// (results/SCHEMA.md). GPU work enters the timeline through CudaEventSpans (bench/harness/timer_cuda.h), which
// turns CUDA event times into host times.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/harness/timer.h"  // host_now(): the clock every time handed to StepRecorder is on

namespace strata {

class Run;

// This rank's steady clock against rank 0's, from a ping-pong with rank 0. Of `rounds` round trips
// (t0 sent, rank 0 answers with its time, t1 received) the one with the smallest t1 - t0 gives
// offset = t_rank0 - (t0 + t1) / 2, exact to within half that round trip when the two legs differ.
struct ClockOffset {
  double offset = 0;       // s: rank-0 time = this rank's time + offset (0 on rank 0)
  double uncertainty = 0;  // s: half the smallest round trip (0 on rank 0)
  double round_trip = 0;   // s: the smallest round trip
  int rounds = 0;
};
// Collective over `comm`: every rank gets its own offset to the comm's rank 0.
ClockOffset measure_clock_offset(MPI_Comm comm, int rounds = 32);

class StepRecorder {
 public:
  // Collective over the world. Measures the clock offsets and, on rank 0, appends the run's `clock` table.
  // Construct it once per run, right after the Run, so the offsets are those of the run's start.
  explicit StepRecorder(Run& run, int clock_rounds = 32);
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  // Records from here on belong to timed iteration `iteration` (the samples table's numbering).
  void begin_iteration(int iteration) { iteration_ = iteration; }
  int iteration() const { return iteration_; }

  // Adds `seconds` to phase `name` of the current iteration: a phase entered twice in one iteration sums.
  void add_phase(const std::string& name, double seconds);
  // Times a phase from construction to destruction on the host clock.
  class PhaseScope {
   public:
    PhaseScope(StepRecorder& recorder, std::string name) : recorder_(recorder), name_(std::move(name)), start_(host_now()) {}
    ~PhaseScope() { recorder_.add_phase(name_, host_now() - start_); }
    PhaseScope(const PhaseScope&) = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;

   private:
    StepRecorder& recorder_;
    std::string name_;
    double start_;
  };
  PhaseScope phase(std::string name) { return PhaseScope(*this, std::move(name)); }

  // One event of the timeline: `start` and `end` are host_now() times of this rank; `stream` names where it
  // ran ("host", "compute", "comm"), `group` the process group of a communication ("" for none).
  void add_event(std::string operation, std::string stream, double start, double end, int64_t bytes = 0,
                 std::string group = "");
  // Keeps the largest `bytes` noted for `category` in this case (a high-water mark).
  void note_memory(const std::string& category, int64_t bytes);
  // A scalar of the current iteration (loss, grad_norm, ...), in `unit` ("1" for dimensionless).
  void add_metric(const std::string& name, double value, const std::string& unit = "1");

  // A host_now() time of this rank on the common clock: rank 0's steady clock, from its value when the
  // offsets were measured (the `start`/`end` convention of the events table).
  double to_common(double host_time) const { return host_time + clock_.offset - epoch_; }
  const ClockOffset& clock() const { return clock_; }

  // Collective over the world. Gathers every rank's records of case `case_index` (the index Run::record
  // returned for it) to rank 0, which appends them to the run; then forgets them on every rank.
  void write_case(int case_index);

 private:
  struct Phase {
    int iteration;
    std::string name;
    double seconds;
  };
  struct Event {
    int iteration;
    std::string operation, stream, group;
    double start, end;
    int64_t bytes;
  };
  struct Memory {
    std::string category;
    int64_t bytes;
  };
  struct Metric {
    int iteration;
    std::string name, unit;
    double value;
  };

  Run& run_;
  ClockOffset clock_;
  double epoch_ = 0;  // rank 0's host_now() at the clock measurement, known on every rank
  int iteration_ = 0;
  std::vector<Phase> phases_;
  std::vector<Event> events_;
  std::vector<Memory> memory_;
  std::vector<Metric> metrics_;
};

// Rank 0 of `comm` receives every rank's values concatenated in rank order (lengths may differ) and, in
// `counts`, how many each rank sent; other ranks receive empty vectors.
std::vector<int64_t> gatherv(MPI_Comm comm, const std::vector<int64_t>& mine, std::vector<int>* counts = nullptr);
std::vector<double> gatherv(MPI_Comm comm, const std::vector<double>& mine, std::vector<int>* counts = nullptr);
std::vector<std::string> gatherv(MPI_Comm comm, const std::vector<std::string>& mine, std::vector<int>* counts = nullptr);

}  // namespace strata
