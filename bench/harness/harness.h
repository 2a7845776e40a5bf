// The measurement harness every Strata benchmark runs on: options shared by all programs, timers,
// the timed loop (warm-up, ranks start each iteration together, optional time budget), progress on
// stderr, the results table on stdout, and one Run that gathers every rank's samples and writes the
// cases / samples / summary / ranks tables of the HDF5 schema (results/SCHEMA.md).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/harness/check.h"
#include "bench/harness/cli.h"
#include "bench/harness/context.h"
#include "bench/harness/output_files.h"
#include "collectives/mpi.h"
#include "bench/harness/stats.h"
#include "bench/harness/timer.h"
#include "bench/harness/watchdog.h"
#include "results/table.h"

namespace strata {

class ResultsWriter;

struct HarnessOptions {
  int warmup = 3;
  int iters = 10;
  double max_time = 0;     // seconds of timed iterations per case; 0 = no budget (run all iters)
  bool quiet = false;
  // Seconds between progress lines on stderr: the first and the last case's line always, and between them one
  // whenever this long has passed since the last (0: every case).
  double progress_interval = 10;
  std::string output;      // results file; empty = a new file under results/runs/
  int blas_threads = 1;    // CPU BLAS threads per rank
  int kernel_threads = 1;  // a program's own kernel threads per rank (--threads), held to the node like blas_threads
  // Testing the output checks: this world rank corrupts one output element of every case after the untimed
  // checked run and before its check (-1: never; -2: every rank), so a test can prove a wrong result fails
  // the run and is counted on every rank.
  int inject_wrong_element = -1;
  // Files the program reads, named by their flags (set by the program, not a flag): the output is none of them.
  std::vector<FileArg> inputs;
  // -t/--timeout: seconds a rank may go without progress before the job is ended (0: no watchdog), "auto" or
  // "auto:S" (bench/harness/watchdog.h). A program sets its own default before add_harness_options.
  std::string timeout = "auto";
  // Testing the watchdog: this world rank stalls before the last case, 20 times the limit (-1: never; -2: every rank).
  int inject_hang = -1;
};
inline bool injects_wrong_element(const HarnessOptions& options, int rank) {
  return options.inject_wrong_element == rank || options.inject_wrong_element == -2;
}
void add_harness_options(Cli& cli, HarnessOptions& options);
// Whether the progress line of case `done` (counting from 1) of `total` (0: not known) is printed, given the time
// since the last line (the first case's is always printed): the last case's, and one whenever `interval` seconds
// have passed.
bool progress_line_due(int done, int total, double seconds_since_last_line, double interval);
// Collective: refuses (UsageError on every rank, rank 0 judging) an --output that is one of options.inputs. Run
// checks it too; a program that reads its inputs before it starts the Run calls this first.
void check_output_is_no_input(const HarnessOptions& options);

// printf on world rank 0 only (the benchmarks' tables of figures), the format checked as printf's.
[[gnu::format(printf, 1, 2)]] void print_on_root(const char* format, ...);

struct MeasureSpec {
  int warmup = 3;
  int iters = 10;
  double budget_s = 0;     // stop early once every rank has spent this long in timed iterations
  int ops_per_sample = 1;  // body runs this many operations; samples are per operation
};

// Collective over `comm`: every rank runs the same number of iterations. Each iteration starts after a
// barrier, so ranks start together and the time includes only the body. Returns this rank's samples.
// A template over the timer and the body, as Google Benchmark's loop is: with a HostTimer and a lambda nothing
// but the body and the clock reads runs between them, which a 0.1 us collective would otherwise feel.
// `before_iteration` runs before each iteration's barrier, outside the timed region (the watchdog's tick).
template <typename TimerType, typename Body, typename BeforeIteration>
std::vector<double> measure(MPI_Comm comm, const MeasureSpec& spec, TimerType& timer, Body&& body,
                            BeforeIteration&& before_iteration) {
  for (int i = 0; i < spec.warmup; ++i) {
    before_iteration();
    timer.start();
    body();
    timer.stop();  // also waits for device work to finish
  }
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(spec.iters));
  double spent = 0;
  for (int i = 0; i < spec.iters; ++i) {
    before_iteration();
    STRATA_MPI_CHECK(MPI_Barrier(comm));
    timer.start();
    body();
    const double elapsed = timer.stop();
    samples.push_back(elapsed / spec.ops_per_sample);
    spent += elapsed;
    // Ranks agree on stopping, outside the timed region, so all run the same number of iterations.
    if (spec.budget_s > 0 && i + 1 < spec.iters && allreduce_max(comm, spent) >= spec.budget_s) break;
  }
  return samples;
}
template <typename TimerType, typename Body>
std::vector<double> measure(MPI_Comm comm, const MeasureSpec& spec, TimerType& timer, Body&& body) {
  return measure(comm, spec, timer, std::forward<Body>(body), [] {});
}

// Prints rows aligned under a header, nccl-tests style.
class ConsoleTable {
 public:
  struct Column {
    std::string header;
    int width;
  };
  explicit ConsoleTable(std::vector<Column> columns) : columns_(std::move(columns)) {}
  void print_header() const;
  void print_row(const std::vector<std::string>& cells) const;

 private:
  std::vector<Column> columns_;
};
std::string format_fixed(double value, int decimals);
std::string format_si(double value, int digits = 3);  // 1.23e9 -> "1.23 G"

// What Run::record returns about one case (complete on rank 0).
struct CaseResult {
  int index = 0;
  int iterations = 0;
  Stats rankmax;                    // statistics of the per-iteration maximum over ranks
  Stats rankmean;                   // statistics of the per-iteration mean over ranks
  std::vector<double> rank_medians; // each rank's own median
  std::vector<double> samples;      // every rank's samples, ranks x iterations, row-major
  int64_t wrong_elements = 0;       // summed over ranks (every rank)
  const Stats& view(RankView v) const { return v == RankView::max_over_ranks ? rankmax : rankmean; }
};

// Thrown when SIGINT/SIGTERM arrived: the run is closed as "interrupted" and the program exits 128+signal.
struct Interrupted {
  int signal;
};

class Run {
 public:
  // Collective. Sets BLAS threads, collects the context, and on rank 0 validates and opens the output
  // (UsageError on every rank if it cannot be used; the file is left untouched).
  Run(std::string benchmark, int argc, const char* const* argv, const HarnessOptions& options,
      std::string config_json, std::string device);
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  ~Run();  // a run destroyed before finish() is recorded as failed (or interrupted, after a signal)

  bool is_root() const { return context_.self.rank == 0; }
  const RunContext& context() const { return context_; }
  const HarnessOptions& options() const { return options_; }
  const std::string& output_path() const { return output_path_; }
  const std::string& run_id() const { return run_id_; }

  // Benchmarks declare their own columns before the first record(); "case" is added by the harness.
  Table& cases() { return cases_; }
  Table& summary() { return summary_; }

  void set_case_count(int total) { total_cases_ = total; }
  // The watchdog's progress points (-t/--timeout); every rank calls them at the same points, in the same order.
  // A case begins: `what` names it (operation, size, group) for the reports. `records`: the record() calls the
  // case makes (a measurement reported as several rows). --inject-hang stalls here before the last case.
  void begin_case(const std::string& what, int records = 1);
  // This rank moved on to `what` (a step, a phase of a case's setup); tick(): on to the next iteration of it.
  void progress(std::string what) { watchdog_->progress(std::move(what)); }
  void tick() { watchdog_->tick(); }
  // Timed iterations of the current case (each one a progress point); `before_iteration` runs before each, outside
  // its timed interval and before its barrier.
  std::vector<double> measure(Timer& timer, const std::function<void()>& body, int ops_per_sample = 1,
                              const std::function<void()>& before_iteration = {});

  // Collective. Gathers this case's samples from every rank; on rank 0 fills the standard summary columns and
  // calls the benchmark's fill functions (which set their declared columns for this case's row). `more_tables`,
  // when given, runs next on every rank (it may be collective) and adds the case's rows of the benchmark's own
  // tables through append_table. Then every table's rows of the case are appended together and the file is
  // flushed, so a case is in all its tables or, when the job stops before, in none. `wrong_elements` is this
  // rank's count of failed output checks.
  CaseResult record(const std::vector<double>& my_samples, int64_t wrong_elements, const std::string& label,
                    const std::function<void(Table&)>& fill_case,
                    const std::function<void(Table&, const CaseResult&)>& fill_summary,
                    const std::function<void(const CaseResult&)>& more_tables = {});

  // Rank 0: appends a benchmark's own table to this run and flushes; inside record's `more_tables`, the rows
  // join the case's and are written with them.
  void append_table(const Table& rows);

  bool any_check_failed() const { return check_failed_; }
  // Rank 0, from any thread: closes the run as failed with the reason (the watchdog's report). Later writes of the
  // main thread are dropped, so the file says why the job ended.
  void mark_failed(const std::string& reason);
  // Collective. Closes the run: status ok, or failed when any output check failed. Returns the exit code.
  int finish();

 private:
  void write_ranks_table();
  void check_interrupt();
  void listen_for_signals();
  [[noreturn]] void end_on_signal(int signal);

  std::string benchmark_;
  HarnessOptions options_;
  RunContext context_;
  std::string output_path_;
  std::string run_id_;
  std::unique_ptr<ResultsWriter> writer_;
  // Held around every writer call: the watchdog's thread closes the run while the main thread may write,
  // and HDF5 (serial build) takes one thread at a time. Guards finished_ too.
  std::timed_mutex writer_mutex_;
  Table cases_{"cases"}, summary_{"summary"}, samples_{"samples"};
  std::vector<Table> case_tables_;  // the benchmark's own rows of the case being recorded
  bool recording_case_ = false;
  int case_index_ = 0;
  int total_cases_ = 0;
  bool check_failed_ = false;
  bool finished_ = false;
  std::chrono::steady_clock::time_point started_;
  std::optional<std::chrono::steady_clock::time_point> last_progress_line_;
  std::string current_case_;
  int signal_wake_[2] = {-1, -1};  // the pipe a signal handler wakes signal_thread_ through
  std::thread signal_thread_;
  // Last: its thread may close the run through mark_failed, so it stops before the members above go.
  std::unique_ptr<Watchdog> watchdog_;
};

// Bytes of host memory one rank may use: the node's available memory (MemAvailable) over the ranks on the node,
// the smallest over the job's nodes; infinite where /proc/meminfo does not say. Collective over the world.
double host_memory_per_rank();
// Refuses a run whose largest case would not fit, before anything is allocated or written: UsageError naming the
// case, its estimate and the limit with where the limit comes from ("the node's available memory over its 2 ranks").
void check_fits_in_memory(const std::string& what, double bytes, double limit, const std::string& limit_source);
std::string format_gib(double bytes);  // "1.234 GiB"

// The FLOP-rate columns every compute benchmark reports, with one convention: per rank from the median of
// the per-iteration mean over ranks; aggregate = ranks x flop over the median of the per-iteration max; the
// slowest rank from its own median; the fraction of a known peak (0 when unknown). A fraction above 1 cannot be
// true (the peak or the FLOP count is wrong): the row is marked (`above_peak`) and rank 0 warns on stderr.
void add_flop_rate_columns(Table& summary, const std::string& flop_name);
// `more`: other fractions of the same peak the row reports (a step's MFU and HFU), judged the same way.
void set_flop_rates(Table& row, double flop, const CaseResult& result, int ranks, double peak_per_rank,
                    const std::string& label, const std::vector<std::pair<std::string, double>>& more = {});
// A fraction of peak as printed: "65.2" ("65.2%" with `sign`), "n/a" when unknown (<= 0 or NaN), "147.3!"
// ("147.3%!") above 100 %.
std::string format_peak_percent(double fraction, int decimals = 1, bool sign = false);

// Runs a program's body under MPI: usage errors print once and exit 2; other errors print with the rank
// and abort the job with exit 1; a signal closes the run as interrupted.
int program_main(int argc, char** argv, const char* program, const std::function<int()>& body);

}  // namespace strata
