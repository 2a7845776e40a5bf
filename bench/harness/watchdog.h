// The watchdog every program runs under (-t/--timeout): it ends a job whose ranks stopped making progress and
// names the rank that did not arrive, whichever it is, rank 0 included.
//
// Each rank notes its progress (a case begins, an iteration or a step starts, a case is recorded); a rank with no
// progress for the limit asks every other rank where it is, over a channel of its own: a UDP socket per rank that
// the watchdog's thread serves, so the question is answered while the rank's main thread waits inside MPI (only
// the main thread may call MPI). A rank that does not answer is stopped or gone; one that answers from an earlier
// point than the others did not arrive where they wait. The lowest rank that is neither reports: on stderr and,
// through rank 0, which holds the results file, as the run's failure; then the job ends with exit code 124.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace strata {

struct WatchdogLimit {
  double seconds = 0;  // a rank's longest time without progress; 0: no watchdog
  // true: the job ends at the limit even when every rank answers from the same point (all of them waiting in one
  // operation, or all of them still computing). false (-t auto): the job ends only when a rank is proven stopped
  // (no answer) or stuck behind the others (no progress for the limit either); otherwise the check repeats a limit
  // later, so a long legitimate iteration is never cut.
  bool strict = true;
};

class Watchdog {
 public:
  // Called on rank 0, on the watchdog's thread, with the report, before the job ends (the run is closed with it).
  using OnExpiry = std::function<void(const std::string& message)>;
  // Collective over MPI_COMM_WORLD (all ranks pass the same limit): opens each rank's channel and learns the others'.
  // The channel is open without a limit too, for the end of a job (announce_rank0_end).
  Watchdog(WatchdogLimit limit, OnExpiry on_expiry);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  bool checks_progress() const { return limit_.seconds > 0; }
  // This rank reached a new point and is now in `what` (e.g. "the setup of allreduce 4096 B"): its limit restarts.
  // Every rank passes the same points in the same order (how far each got is what the check compares).
  void progress(std::string what);
  // As progress(), keeping what the rank does: cheap enough for every timed iteration (no lock, no allocation).
  void tick();

  // Ending a job on a signal: rank 0 tells the others once it has closed the run and exits; they wait for that (or
  // `seconds`) and exit with it, so no rank is left behind to be killed after the launcher has returned.
  void announce_rank0_end();
  bool await_rank0_end(double seconds);

 private:
  struct State;
  WatchdogLimit limit_;
  std::unique_ptr<State> state_;
};

// Parses -t/--timeout: seconds (0: none), "auto" (`auto_seconds`, not strict) or "auto:SECONDS". Throws UsageError
// naming the flag.
WatchdogLimit parse_watchdog_limit(const std::string& text, double auto_seconds);

}  // namespace strata
