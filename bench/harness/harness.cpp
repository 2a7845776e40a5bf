// Implementation of the measurement harness (see harness.h).
#include "bench/harness/harness.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "bench/harness/blas_core.h"
#include "kernels/blas.h"
#include "kernels/cpu_gemm.h"
#include "results/h5.h"
#include "results/schema.h"
#include "results/writer.h"

namespace strata {

namespace {
std::atomic<int> g_signal{0};
// The write end of the pipe that wakes a Run's signal thread; -1 when no Run is listening.
std::atomic<int> g_signal_pipe{-1};
constexpr char kSignalled = 'S', kStopListening = 'Q';
extern "C" void remember_signal(int signal) {
  g_signal.store(signal);
  const int fd = g_signal_pipe.load();
  if (fd >= 0 && ::write(fd, &kSignalled, 1) < 0) {
    // The pipe is full: the thread is already awake.
  }
}
// -t auto: how long a rank may go without progress before the watchdog looks for a stopped or late rank.
constexpr double kAutoTimeoutSeconds = 600;
// Seconds a rank ending on a signal waits for rank 0 to close the run and exit first.
constexpr double kRank0EndWait = 0.5;
}  // namespace

void add_harness_options(Cli& cli, HarnessOptions& o) {
  cli.option("warmup", 'w', "untimed iterations before timing, per case", o.warmup, 0);
  cli.option("iters", 'n', "timed iterations per case", o.iters, 1);
  cli.option("max-time", 0, "seconds of timed iterations per case before stopping early (0: none)", o.max_time, 0.0);
  cli.option("output", 'O', "results file to append this run to (default: new file in results/runs/)", o.output);
  cli.option("blas-threads", 0, "CPU BLAS threads per rank", o.blas_threads, 1);
  cli.flag("quiet", 'q', "no progress on stderr (a failed output check and a wait for the output file still show)",
           o.quiet);
  cli.option("progress-interval", 0, "seconds between progress lines on stderr (the first and last case always; "
             "0: every case)", o.progress_interval, 0.0);
  cli.add("timeout", 't', "S|auto[:S]", "seconds a rank may go without progress (an iteration, a step, a case's "
          "setup) before the job is ended, naming the rank that did not arrive (0: none); auto: look every " +
          format_fixed(kAutoTimeoutSeconds, 0) + " s (or S) and end it only for a rank proven stopped or stuck",
          [&o](const std::string& text) {
            parse_watchdog_limit(text, kAutoTimeoutSeconds);
            o.timeout = text;
          },
          [&o] { return nlohmann::json(o.timeout); });
  cli.option("inject-wrong-element", 0, "testing the checks: this world rank (-2: every rank) corrupts one output "
             "element per case", o.inject_wrong_element, -2);
  cli.option("inject-hang", 0, "testing the timeout: this world rank (-2: every rank) stalls before the last case",
             o.inject_hang, -2);
}

void check_output_is_no_input(const HarnessOptions& options) {
  std::string refusal;
  if (world_rank() == 0) try {
      check_outputs(options.inputs, {{"-O/--output", options.output, ""}}, {});
    } catch (const std::invalid_argument& e) {
      refusal = e.what();
    }
  refusal = broadcast_string(MPI_COMM_WORLD, refusal);
  if (!refusal.empty()) throw UsageError(refusal);
}

void ConsoleTable::print_header() const {
  std::string line = "#";
  for (const auto& c : columns_) {
    std::string cell = c.header;
    if (static_cast<int>(cell.size()) < c.width) cell.insert(0, static_cast<size_t>(c.width) - cell.size(), ' ');
    line += " " + cell;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void ConsoleTable::print_row(const std::vector<std::string>& cells) const {
  std::string line = " ";
  for (size_t i = 0; i < columns_.size(); ++i) {
    std::string cell = i < cells.size() ? cells[i] : "";
    int width = columns_[i].width;
    if (static_cast<int>(cell.size()) < width) cell.insert(0, static_cast<size_t>(width) - cell.size(), ' ');
    line += " " + cell;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::string format_fixed(double value, int decimals) {
  if (!std::isfinite(value)) return "n/a";
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

std::string format_si(double value, int digits) {
  if (!std::isfinite(value)) return "n/a";
  const char* prefixes[] = {"", "k", "M", "G", "T", "P"};
  int p = 0;
  while (std::fabs(value) >= 1000 && p < 5) value /= 1000, ++p;
  char text[64];
  std::snprintf(text, sizeof text, "%.*g %s", digits, value, prefixes[p]);
  return text;
}

Run::Run(std::string benchmark, int argc, const char* const* argv, const HarnessOptions& options,
         std::string config_json, std::string device)
    : benchmark_(std::move(benchmark)), options_(options), started_(std::chrono::steady_clock::now()) {
  if (options_.blas_threads > 1 && blas::is_single_threaded_build())
    throw UsageError("--blas-threads " + std::to_string(options_.blas_threads) +
                     " needs a threaded BLAS, but this OpenBLAS is the single-threaded build");
  const int world = world_size();
  for (const auto& [flag, rank] : {std::pair{"--inject-hang", options_.inject_hang},
                                   std::pair{"--inject-wrong-element", options_.inject_wrong_element}})
    if (rank >= world)
      throw UsageError(std::string(flag) + " " + std::to_string(rank) + ": no such rank (the job has " +
                       std::to_string(world) + " rank" + (world == 1 ? ")" : "s, 0 to " + std::to_string(world - 1) + ")"));
  cpu_gemm::set_threads(options_.blas_threads);
  context_ = collect_context(argc, argv, device);
  cpu_gemm::set_threads(options_.blas_threads);  // measuring the machine runs the libraries on one thread
  // Threads beyond the hardware threads of the smallest node cannot run at once: a typo, not a setting.
  int hardware_threads = std::max(1, context_.machine.description.topology.hardware_threads);
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &hardware_threads, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  for (const auto& [flag, threads] : {std::pair{"--blas-threads", options_.blas_threads}, {"--threads", options_.kernel_threads}})
    if (threads > hardware_threads)
      throw UsageError(std::string(flag) + " " + std::to_string(threads) + " exceeds the " + std::to_string(hardware_threads) +
                       " hardware threads of a node of this job");
  if (is_root()) {
    std::fputs(machine_summary(context_.machine, context_.blas_core).c_str(), stdout);
    std::fflush(stdout);
  }

  // Rank 0 checks and opens the output; every rank learns the verdict so all exit the same way.
  std::string error;
  if (is_root()) {
    try {
      run_id_ = new_run_id();
      output_path_ = options_.output;
      if (output_path_.empty()) {
        std::filesystem::create_directories("results/runs");
        output_path_ = "results/runs/" + benchmark_ + "-" + run_id_ + ".h5";
      }
      auto attrs = context_.run_attrs;
      attrs["benchmark"] = benchmark_;
      attrs["config_json"] = config_json;
      attrs["start_utc"] = utc_now_iso();
      check_outputs(options_.inputs, {{"-O/--output", output_path_, ""}}, {});
      writer_ = std::make_unique<ResultsWriter>(output_path_, run_id_, attrs, [this](double seconds) {
        // Not progress: without it a quiet run would stall for up to `seconds` without a word.
        std::fprintf(stderr, "[%s] %s; waiting up to %.0f s for it to finish\n", benchmark_.c_str(),
                     in_use_message(output_path_).c_str(), seconds);
      });
      writer_->write_env(context_.env);
      write_ranks_table();
    } catch (const std::invalid_argument& e) {
      error = e.what();
    } catch (const std::filesystem::filesystem_error& e) {
      error = std::string("cannot create the results folder: ") + e.what();
    }
  }
  error = broadcast_string(MPI_COMM_WORLD, error);
  if (!error.empty()) throw UsageError(error);
  output_path_ = broadcast_string(MPI_COMM_WORLD, output_path_);
  run_id_ = broadcast_string(MPI_COMM_WORLD, run_id_);

  cases_.add_column("case", ColumnKind::int64, "1");
  cases_.add_column("label", ColumnKind::string, "");
  summary_.add_column("case", ColumnKind::int64, "1");
  summary_.add_column("iterations", ColumnKind::int64, "1");
  for (RankView view : kRankViews)
    for (const char* stat : kStatNames)
      summary_.add_column(std::string("time_") + rank_view_name(view) + "_" + stat, ColumnKind::float64, "s",
                          rank_view_description(view));
  summary_.add_column("time_slowest_rank_median", ColumnKind::float64, "s", "the largest of the ranks' own medians");
  summary_.add_column("time_fastest_rank_median", ColumnKind::float64, "s", "the smallest of the ranks' own medians");
  summary_.add_column("slowest_rank", ColumnKind::int64, "1", "rank with the largest own median");
  summary_.add_column("wrong_elements", ColumnKind::int64, "1", "output elements outside tolerance, summed over ranks");
  samples_.add_column("case", ColumnKind::int64, "1");
  samples_.add_column("rank", ColumnKind::int64, "1");
  samples_.add_column("iteration", ColumnKind::int64, "1");
  samples_.add_column("time", ColumnKind::float64, "s", "elapsed time of one operation in one timed iteration");

  watchdog_ = std::make_unique<Watchdog>(parse_watchdog_limit(options_.timeout, kAutoTimeoutSeconds),
                                         [this](const std::string& message) {
                                           try {
                                             mark_failed(message);
                                           } catch (const std::exception&) {
                                             // The job ends all the same; the run keeps the status it has.
                                           }
                                         });
  listen_for_signals();
}

// SIGTERM and SIGINT end this rank at once, whatever its main thread is doing. A launcher ending a job (a rank died,
// a time limit) signals every rank, and Open MPI's mpirun kills whatever is left as soon as one of them exits, then
// returns without waiting for it: a rank that waited for its main thread (inside MPI, for a dead peer, or in a long
// case) would outlive the launcher, and so would rank 0 if the others exited while it still closed the run. So rank 0
// closes the run as interrupted (the completed cases stay), tells the others and exits; they exit when it has.
void Run::listen_for_signals() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    throw RuntimeError(std::string("the signal pipe could not be created: ") + std::strerror(errno));
  signal_wake_[0] = fds[0], signal_wake_[1] = fds[1];
  g_signal_pipe.store(fds[1]);
  std::signal(SIGINT, remember_signal);
  std::signal(SIGTERM, remember_signal);
  signal_thread_ = std::thread([this, fd = fds[0]] {
    for (;;) {
      pollfd wake{fd, POLLIN, 0};
      if (::poll(&wake, 1, -1) < 0 && errno != EINTR) return;
      char byte = 0;
      while (::read(fd, &byte, 1) == 1) {
        if (byte == kStopListening) return;
        if (byte == kSignalled) end_on_signal(g_signal.load());
      }
    }
  });
}

void Run::end_on_signal(int signal) {
  if (is_root()) {
    // Bounded: a main thread inside a large write must not keep this rank alive past the launcher.
    std::unique_lock lock(writer_mutex_, std::chrono::milliseconds(200));
    if (lock.owns_lock() && writer_ && !finished_) {
      try {
        writer_->finish(schema::kStatusInterrupted);
        finished_ = true;
        writer_.reset();  // closed: its lock is free before this process is gone, whatever the launcher does then
      } catch (const std::exception&) {
        // The run keeps the "interrupted" status written at its start.
      }
    }
    std::fprintf(stderr, "%s: interrupted by signal %d; completed cases are kept\n", benchmark_.c_str(), signal);
    std::fflush(stderr);
    watchdog_->announce_rank0_end();
  } else {
    watchdog_->await_rank0_end(kRank0EndWait);  // rank 0 may be gone already, or stopped: bounded
  }
  std::_Exit(128 + signal);
}

Run::~Run() {
  watchdog_.reset();  // its thread may be closing the run
  if (signal_thread_.joinable()) {
    g_signal_pipe.store(-1);
    if (::write(signal_wake_[1], &kStopListening, 1) < 0) {
      // Cannot happen on a pipe this thread drains; the join below would then wait for a signal.
    }
    signal_thread_.join();
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
  }
  for (int fd : signal_wake_)
    if (fd >= 0) ::close(fd);
  std::unique_lock lock(writer_mutex_, std::chrono::seconds(10));
  if (lock.owns_lock() && writer_ && !finished_) {
    try {
      writer_->finish(g_signal.load() ? schema::kStatusInterrupted : schema::kStatusFailed);
    } catch (...) {
      // Destructors must not throw; the run keeps the "interrupted" status written at its start.
    }
  }
}

void Run::write_ranks_table() {
  Table ranks(schema::kRanks);
  ranks.add_column("rank", ColumnKind::int64, "1");
  ranks.add_column("host", ColumnKind::string, "");
  ranks.add_column("node_index", ColumnKind::int64, "1");
  ranks.add_column("local_rank", ColumnKind::int64, "1");
  ranks.add_column("ranks_on_node", ColumnKind::int64, "1");
  ranks.add_column("affinity", ColumnKind::string, "", "CPU list the rank may run on (sched_getaffinity)");
  ranks.add_column("device", ColumnKind::string, "");
  for (const auto& p : context_.ranks) {
    ranks.set("rank", p.rank).set("host", p.host).set("node_index", p.node_index).set("local_rank", p.local_rank);
    ranks.set("ranks_on_node", p.ranks_on_node).set("affinity", p.affinity).set("device", p.device);
    ranks.end_row();
  }
  writer_->append(ranks);
  writer_->flush();
}

void Run::begin_case(const std::string& what, int records) {
  current_case_ = what;
  const bool stalls = options_.inject_hang == context_.self.rank || options_.inject_hang == -2;
  if (stalls && case_index_ + records >= total_cases_) {
    const double limit = parse_watchdog_limit(options_.timeout, kAutoTimeoutSeconds).seconds;
    std::this_thread::sleep_for(std::chrono::duration<double>(limit > 0 ? 20 * limit : 3600));
  }
  watchdog_->progress("the setup of " + what);
}

std::vector<double> Run::measure(Timer& timer, const std::function<void()>& body, int ops_per_sample,
                                 const std::function<void()>& before_iteration) {
  MeasureSpec spec{options_.warmup, options_.iters, options_.max_time, ops_per_sample};
  watchdog_->progress("the timed iterations of " + current_case_);
  return strata::measure(MPI_COMM_WORLD, spec, timer, body, [&] {
    watchdog_->tick();
    if (before_iteration) before_iteration();
  });
}

void Run::check_interrupt() {
  int mine = g_signal.load(), any = 0;
  STRATA_MPI_CHECK(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (any) throw Interrupted{any};
}

CaseResult Run::record(const std::vector<double>& my_samples, int64_t wrong_elements, const std::string& label,
                       const std::function<void(Table&)>& fill_case,
                       const std::function<void(Table&, const CaseResult&)>& fill_summary,
                       const std::function<void(const CaseResult&)>& more_tables) {
  watchdog_->progress("the recording of " + label);
  CaseResult result;
  result.index = case_index_++;
  result.iterations = static_cast<int>(my_samples.size());
  int ranks = context_.n_ranks;
  std::vector<double> all = gather_doubles(MPI_COMM_WORLD, my_samples);
  int64_t wrong_total = 0;
  STRATA_MPI_CHECK(MPI_Allreduce(&wrong_elements, &wrong_total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
  if (wrong_total) check_failed_ = true;
  result.wrong_elements = wrong_total;
  // Rows of every table of the case, held until all are known: an error or a stop on the way leaves no part of it.
  struct CaseRows {
    Run& run;
    ~CaseRows() {
      run.recording_case_ = false;
      run.case_tables_.clear();
      run.cases_.clear_rows(), run.samples_.clear_rows(), run.summary_.clear_rows();
    }
  } rows{*this};

  if (is_root()) {
    int iters = result.iterations;
    result.rankmax = summarize(per_iteration(all, ranks, iters, RankView::max_over_ranks));
    result.rankmean = summarize(per_iteration(all, ranks, iters, RankView::mean_over_ranks));
    result.rank_medians = per_rank_median(all, ranks, iters);
    result.samples = all;
    size_t slowest = 0, fastest = 0;
    for (size_t r = 0; r < result.rank_medians.size(); ++r) {
      if (result.rank_medians[r] > result.rank_medians[slowest]) slowest = r;
      if (result.rank_medians[r] < result.rank_medians[fastest]) fastest = r;
    }

    cases_.set("case", result.index).set("label", label);
    fill_case(cases_);
    cases_.end_row();

    summary_.set("case", result.index).set("iterations", iters);
    for (RankView view : kRankViews)
      for (const char* stat : kStatNames)
        summary_.set(std::string("time_") + rank_view_name(view) + "_" + stat, stat_value(result.view(view), stat));
    summary_.set("time_slowest_rank_median", result.rank_medians[slowest]);
    summary_.set("time_fastest_rank_median", result.rank_medians[fastest]);
    summary_.set("slowest_rank", static_cast<int64_t>(slowest));
    summary_.set("wrong_elements", wrong_total);
    fill_summary(summary_, result);
    summary_.end_row();

    for (int r = 0; r < ranks; ++r)
      for (int i = 0; i < iters; ++i) {
        samples_.set("case", result.index).set("rank", r).set("iteration", i);
        samples_.set("time", all[static_cast<size_t>(r) * iters + i]);
        samples_.end_row();
      }
  }
  recording_case_ = true;
  if (more_tables) more_tables(result);
  if (is_root()) {
    {
      std::lock_guard lock(writer_mutex_);
      if (!finished_) {
        writer_->append(cases_);
        writer_->append(samples_);
        writer_->append(summary_);
        for (const Table& table : case_tables_) writer_->append(table);
        writer_->flush();
      }
    }
    const auto now = std::chrono::steady_clock::now();
    const int done = result.index + 1;
    const bool due = !last_progress_line_ ||
                     progress_line_due(done, total_cases_,
                                       std::chrono::duration<double>(now - *last_progress_line_).count(),
                                       options_.progress_interval);
    if (!options_.quiet && due) {
      last_progress_line_ = now;
      double elapsed = std::chrono::duration<double>(now - started_).count();
      std::string left = total_cases_ > done ? ", about " + format_fixed(elapsed / done * (total_cases_ - done), 0) + " s left" : "";
      std::fprintf(stderr, "[%s] case %d/%d %s done; %.1f s elapsed%s\n", benchmark_.c_str(), done,
                   std::max(total_cases_, done), label.c_str(), elapsed, left.c_str());
    }
  }
  check_interrupt();
  watchdog_->progress("the work after case " + std::to_string(result.index + 1) + " (" + label + ")");
  return result;
}

bool progress_line_due(int done, int total, double seconds_since_last_line, double interval) {
  // A line per case would bury the tables of a sweep of hundreds of small cases.
  return (total > 0 && done >= total) || seconds_since_last_line >= interval;
}

void Run::append_table(const Table& rows) {
  if (recording_case_) {
    case_tables_.push_back(rows);
    return;
  }
  std::lock_guard lock(writer_mutex_);
  if (!writer_ || finished_) return;
  writer_->append(rows);
  writer_->flush();
}

void Run::mark_failed(const std::string& reason) {
  // Bounded: a main thread stuck inside a write must not keep the job from ending.
  std::unique_lock lock(writer_mutex_, std::chrono::seconds(10));
  if (!lock.owns_lock() || !writer_ || finished_) return;
  writer_->set_run_attr("failure", reason);
  writer_->finish(schema::kStatusFailed);
  finished_ = true;
  writer_.reset();  // the job is ending: the file is closed, and free to read, before this rank exits
}

int Run::finish() {
  watchdog_->progress("the end of the run");
  STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  std::lock_guard lock(writer_mutex_);
  if (writer_ && !finished_) writer_->finish(check_failed_ ? schema::kStatusFailed : schema::kStatusOk);
  finished_ = true;
  if (is_root() && (!options_.quiet || check_failed_))  // quiet hides progress, never a failed check
    std::fprintf(stderr, "[%s] results: %s (run %s)%s\n", benchmark_.c_str(), output_path_.c_str(), run_id_.c_str(),
                 check_failed_ ? "; OUTPUT CHECK FAILED" : "");
  return check_failed_ ? 1 : 0;
}

double host_memory_per_rank() {
  double kib = INFINITY;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  while (meminfo >> key) {
    if (key == "MemAvailable:") {
      meminfo >> kib;
      break;
    }
    meminfo.ignore(256, '\n');
  }
  const Comm node = split_shared_memory(MPI_COMM_WORLD);
  double per_rank = kib * 1024 / node.size();
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &per_rank, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD));
  return per_rank;
}

std::string format_gib(double bytes) { return format_fixed(bytes / double(int64_t{1} << 30), 3) + " GiB"; }

void check_fits_in_memory(const std::string& what, double bytes, double limit, const std::string& limit_source) {
  if (bytes <= limit) return;
  throw UsageError(what + " needs about " + format_gib(bytes) + " per rank, above the limit of " + format_gib(limit) +
                   " (" + limit_source + ")");
}

void add_flop_rate_columns(Table& summary, const std::string& flop_name) {
  summary.add_column("flop_rate_per_rank", ColumnKind::float64, "FLOP/s",
                     flop_name + " / median over iterations of the per-iteration mean over ranks");
  summary.add_column("flop_rate_aggregate", ColumnKind::float64, "FLOP/s",
                     "ranks x " + flop_name + " / median over iterations of the per-iteration max over ranks");
  summary.add_column("flop_rate_slowest_rank", ColumnKind::float64, "FLOP/s", flop_name + " / the slowest rank's own median");
  summary.add_column("peak_per_rank", ColumnKind::float64, "FLOP/s", "0 when unknown");
  summary.add_column("peak_fraction", ColumnKind::float64, "1", "flop_rate_per_rank / peak_per_rank; 0 when unknown");
  summary.add_column("above_peak", ColumnKind::int64, "1",
                     "1 when a fraction of peak (peak_fraction, or a step's MFU/HFU) exceeds 1, which cannot be true: "
                     "the peak or the FLOP count is wrong");
}

namespace {

bool warn_above_peak(const std::string& label, const std::string& what, double fraction) {
  if (!(fraction > 1)) return false;
  std::fprintf(stderr, "warning: %s: %s %.1f %% is above 100 %% and cannot be true (the peak or the FLOP count is "
                       "wrong); the case is marked above_peak\n",
               label.c_str(), what.c_str(), 100 * fraction);
  return true;
}

}  // namespace

std::string format_peak_percent(double fraction, int decimals, bool sign) {
  if (!(fraction > 0)) return "n/a";
  return format_fixed(100 * fraction, decimals) + (sign ? "%" : "") + (fraction > 1 ? "!" : "");
}

void set_flop_rates(Table& row, double flop, const CaseResult& result, int ranks, double peak_per_rank,
                    const std::string& label, const std::vector<std::pair<std::string, double>>& more) {
  const double per_rank = flop / result.rankmean.median;
  const double slowest = *std::max_element(result.rank_medians.begin(), result.rank_medians.end());
  row.set("flop_rate_per_rank", per_rank).set("flop_rate_aggregate", ranks * flop / result.rankmax.median);
  row.set("flop_rate_slowest_rank", flop / slowest).set("peak_per_rank", peak_per_rank);
  const double fraction = peak_per_rank > 0 ? per_rank / peak_per_rank : 0.0;
  // One warning a row, naming the figure the program reports first (a step's MFU before its fraction of peak).
  bool above = false;
  for (const auto& [what, other] : more) above = above || warn_above_peak(label, what, other);
  above = above || warn_above_peak(label, "the fraction of peak", fraction);
  row.set("peak_fraction", fraction).set("above_peak", int64_t{above ? 1 : 0});
}

int program_main(int argc, char** argv, const char* program, const std::function<int()>& body) {
  run_openblas_on_the_right_core(argv);
  MpiSession mpi(&argc, &argv);
  h5::silence_library_errors();
  int rank = world_rank();
  try {
    return body();
  } catch (const std::invalid_argument& e) {
    if (rank == 0) std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 2;
  } catch (const Interrupted& i) {
    if (rank == 0) std::fprintf(stderr, "%s: interrupted by signal %d; completed cases are kept\n", program, i.signal);
    return 128 + i.signal;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: error: %s\n", program, rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}

void print_on_root(const char* format, ...) {
  if (world_rank() != 0) return;
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
}

}  // namespace strata
