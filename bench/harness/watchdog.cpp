// Implementation of the watchdog (see watchdog.h).
#include "bench/harness/watchdog.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "bench/harness/check.h"
#include "bench/harness/cli.h"
#include "collectives/mpi.h"

namespace strata {

namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}
// A limit past 10^9 s (31 years) is as good as none: capped so that now + limit stays inside int64 nanoseconds.
int64_t to_ns(double seconds) { return static_cast<int64_t>(std::min(seconds, 1e9) * 1e9); }

// The ranks that check at the limit itself: the first two and the last, so that whichever single rank stalls, one
// of them is left to report. The others check a grace period later, only where these did not end the job.
bool checks_first(int rank, int size) { return rank <= 1 || rank == size - 1; }
constexpr double kOthersGrace = 20;     // seconds after the limit at which the other ranks check
constexpr double kAnswerWindow = 3;     // seconds a check waits for the answers (a stopped rank never answers)
constexpr double kProbeWindow = 10;     // seconds the first question, at the start, waits for every rank's answer
constexpr double kAskEvery = 0.25;      // seconds between questions to the ranks that have not answered
constexpr double kCloseWait = 12;       // seconds a reporter waits for rank 0 to close the run (its write lock: 10 s)
constexpr size_t kDatagram = 1400;      // one message, below any path's MTU

// A file descriptor that closes itself.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// "0", "0, 2", "1-3", "0, 2-5".
std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    text += (text.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) text += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return text;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", seconds);
  return text;
}

// The messages between the watchdogs' threads: "strata-watchdog TOKEN KIND FROM ID COUNT AGE TEXT". The token is
// the job's, so a datagram of another job (a port reused) is ignored.
enum class Kind : char { ask = 'Q', answer = 'A', close_run = 'F', closed = 'C', rank0_ends = 'E' };
struct Message {
  Kind kind;
  int from;
  uint64_t id;     // which check an answer belongs to
  uint64_t count;  // the sender's progress
  double age;      // seconds since the sender's last progress
  std::string text;
};

}  // namespace

struct Watchdog::State {
  WatchdogLimit limit;
  OnExpiry on_expiry;
  int rank = 0, size = 1;
  uint64_t token = 0;
  Fd socket, wake;
  std::vector<sockaddr_in> peers;
  std::vector<char> reachable;  // a peer whose channel could not be opened cannot be asked, nor blamed for silence

  std::atomic<uint64_t> count{0};
  std::atomic<int64_t> last_progress_ns{0};
  std::mutex mutex;  // guards what
  std::string what = "the start of the run";
  std::atomic<bool> stopping{false};
  std::mutex ending_mutex;
  std::condition_variable ending;
  bool rank0_ended = false;  // guarded by ending_mutex

  // The watchdog's thread only.
  int64_t not_before_ns = 0;          // no check before this time (after a check that found nobody to blame)
  uint64_t check_id = 0;
  std::vector<std::optional<Message>> answers;
  bool closed_by_rank0 = false;       // a reporter's: rank 0 confirmed that the run is closed
  bool someone_reports = false;       // another rank reported, or will: this one waits for the job to end
  std::string own_report;             // what this rank found, reported only if the reporter does not end the job
  uint64_t noted_count = UINT64_MAX;  // -t auto: the progress at which a stall with nobody to blame was noted
  std::thread thread;

  std::string activity() {
    std::lock_guard lock(mutex);
    return what;
  }
  double age() const { return static_cast<double>(now_ns() - last_progress_ns.load()) * 1e-9; }
  void send(int to, Kind kind, uint64_t id, const std::string& text = "") {
    if (to < 0 || to >= size || !reachable[static_cast<size_t>(to)]) return;
    send_to(peers[static_cast<size_t>(to)], kind, id, text);
  }
  void send_to(const sockaddr_in& to_address, Kind kind, uint64_t id, const std::string& text = "") {
    char buffer[kDatagram];
    int length = std::snprintf(buffer, sizeof buffer, "strata-watchdog %" PRIx64 " %c %d %" PRIu64 " %" PRIu64 " %.3f %s",
                               token, static_cast<char>(kind), rank, id, count.load(), age(), text.c_str());
    length = std::min(length, static_cast<int>(sizeof buffer) - 1);
    // A lost datagram is asked again; a peer that cannot be reached stays silent.
    (void)::sendto(socket.get(), buffer, static_cast<size_t>(length), MSG_DONTWAIT,
                   reinterpret_cast<const sockaddr*>(&to_address), sizeof to_address);
  }
  std::optional<Message> parse(const char* data, size_t length) const {
    const std::string text(data, length);
    uint64_t their_token = 0, id = 0, progress = 0;
    char kind = 0;
    int from = -1, consumed = 0;
    double their_age = 0;
    if (std::sscanf(text.c_str(), "strata-watchdog %" SCNx64 " %c %d %" SCNu64 " %" SCNu64 " %lf %n", &their_token, &kind,
                    &from, &id, &progress, &their_age, &consumed) != 6 ||
        their_token != token || from < 0 || from >= size)
      return std::nullopt;
    return Message{static_cast<Kind>(kind), from, id, progress, their_age, text.substr(static_cast<size_t>(consumed))};
  }
  // Answers every question waiting on the socket and keeps the answers to this rank's own check.
  void serve() {
    char buffer[kDatagram];
    for (;;) {
      sockaddr_in sender{};
      socklen_t sender_size = sizeof sender;
      const ssize_t length = ::recvfrom(socket.get(), buffer, sizeof buffer, MSG_DONTWAIT,
                                        reinterpret_cast<sockaddr*>(&sender), &sender_size);
      if (length < 0) return;  // EAGAIN: nothing more (other errors: the next poll tries again)
      const std::optional<Message> message = parse(buffer, static_cast<size_t>(length));
      if (!message) continue;
      switch (message->kind) {
        case Kind::ask:  // answered the way the question came, whatever this rank knows of the asker's address
          send_to(sender, Kind::answer, message->id, activity());
          break;
        case Kind::answer:
          if (message->id == check_id) answers[static_cast<size_t>(message->from)] = message;
          break;
        case Kind::close_run:  // rank 0: another rank reports; the run is closed with its report
          someone_reports = true;
          if (on_expiry) on_expiry(message->text);
          send(message->from, Kind::closed, message->id);
          break;
        case Kind::closed:
          closed_by_rank0 = true;
          break;
        case Kind::rank0_ends: {
          std::lock_guard lock(ending_mutex);
          rank0_ended = true;
          ending.notify_all();
          break;
        }
      }
    }
  }
  // Waits for datagrams until `until_ns`, serving them.
  void serve_until(int64_t until_ns) {
    const int64_t left = until_ns - now_ns();
    pollfd fd{socket.get(), POLLIN, 0};
    if (left > 0 && ::poll(&fd, 1, static_cast<int>(std::min<int64_t>(left / 1000000 + 1, 1000))) > 0) serve();
    if (left <= 0) serve();
  }

  // Asks every rank where it is; answers[r] holds rank r's answer, or nothing where it did not answer in time.
  void ask_everyone(double window = kAnswerWindow) {
    ++check_id;
    answers.assign(static_cast<size_t>(size), std::nullopt);
    answers[static_cast<size_t>(rank)] = Message{Kind::answer, rank, check_id, count.load(), age(), activity()};
    const int64_t end = now_ns() + to_ns(window);
    int64_t next_ask = 0;
    for (;;) {
      bool missing = false;
      for (int r = 0; r < size; ++r) missing = missing || (!answers[static_cast<size_t>(r)] && reachable[static_cast<size_t>(r)]);
      if (!missing || now_ns() >= end || stopping.load()) return;
      if (now_ns() >= next_ask) {
        for (int r = 0; r < size; ++r)
          if (!answers[static_cast<size_t>(r)]) send(r, Kind::ask, check_id);
        next_ask = now_ns() + to_ns(kAskEvery);
      }
      serve_until(std::min(end, next_ask));
    }
  }

  [[noreturn]] void end_job(const std::string& message, bool rank0_answered) {
    std::fprintf(stderr, "strata: %s; ending the job\n", message.c_str());
    std::fflush(stderr);
    if (rank == 0) {
      if (on_expiry) on_expiry(message);
    } else {
      // Rank 0 holds the file. A stopped rank 0 may still close it when the launcher wakes it to end it.
      send(0, Kind::close_run, check_id, message);
      const int64_t end = now_ns() + to_ns(rank0_answered ? kCloseWait : 0);
      int64_t next_send = now_ns() + to_ns(1);
      while (!closed_by_rank0 && now_ns() < end) {
        if (now_ns() >= next_send) send(0, Kind::close_run, check_id, message), next_send = now_ns() + to_ns(1);
        serve_until(std::min(end, next_send));
      }
    }
    // Not MPI_Abort: only the main thread may call MPI here. A rank that exits without finalising makes mpirun
    // and srun end the whole job, with this exit code.
    std::_Exit(124);
  }

  // The limit passed without progress on this rank: find the rank that did not arrive and end the job.
  void check() {
    if (someone_reports) {  // the reporter has had its time and the job still runs: end it
      if (own_report.empty()) std::_Exit(124);
      end_job(own_report, false);
    }
    const std::string here = activity();
    const uint64_t here_count = count.load();
    if (!reachable[static_cast<size_t>(rank)]) {  // no channel: the others cannot be asked
      if (!limit.strict) {
        not_before_ns = now_ns() + to_ns(limit.seconds);
        return;
      }
      end_job("rank " + std::to_string(rank) + " timed out after " + seconds_text(limit.seconds) + " s in " + here +
                  " (which rank did not arrive is unknown: this rank's watchdog cannot ask the others)",
              false);
    }
    ask_everyone();
    if (count.load() != here_count) return;  // this rank moved on while it asked: not stalled after all
    uint64_t top = 0;
    for (const auto& a : answers)
      if (a) top = std::max(top, a->count);
    // Silent: stopped or gone. Behind: at an earlier point than the others, which only counts where no rank is
    // silent (in the middle of a collective, the ranks that wait for a stopped one are at different points), and
    // without a strict limit only for a rank that has not moved for the limit either (a straggler in a long
    // iteration is behind for a while, and moving).
    std::vector<int> silent, behind, waiting;
    for (int r = 0; r < size; ++r)
      if (!answers[static_cast<size_t>(r)] && reachable[static_cast<size_t>(r)]) silent.push_back(r);
    for (int r = 0; r < size; ++r) {
      const auto& a = answers[static_cast<size_t>(r)];
      if (!a) continue;
      if (silent.empty() && a->count < top && (limit.strict || a->age >= limit.seconds)) behind.push_back(r);
      else waiting.push_back(r);
    }
    // The reporter: the lowest of the ranks that check first and are not to blame; any such rank where none is.
    int reporter = -1;
    for (int r : waiting)
      if (checks_first(r, size)) {
        reporter = r;
        break;
      }
    if (reporter < 0 && !waiting.empty()) reporter = waiting.front();
    const bool blamed = !silent.empty() || !behind.empty();
    if (!blamed && !limit.strict) {
      // -t auto: every rank answers from the same point, so nothing proves a hang; look again a limit later.
      if (reporter == rank && noted_count != here_count) {
        std::fprintf(stderr, "strata: no progress for %s s in %s, but every rank answers from there; waiting (-t SECONDS "
                             "ends the job at a limit)\n", seconds_text(limit.seconds).c_str(), here.c_str());
        std::fflush(stderr);
        noted_count = here_count;
      }
      not_before_ns = now_ns() + to_ns(limit.seconds);
      return;
    }
    if (reporter != rank) {
      someone_reports = true;
      own_report = waiting.empty() || std::find(waiting.begin(), waiting.end(), rank) == waiting.end()
                       ? std::string()  // this rank is one to blame: the others report it
                       : report(here, silent, behind, waiting);
      not_before_ns = now_ns() + to_ns(kAnswerWindow + kCloseWait + kOthersGrace);
      return;
    }
    end_job(report(here, silent, behind, waiting), answers[0].has_value());
  }

  std::string report(const std::string& here, const std::vector<int>& silent, const std::vector<int>& behind,
                     const std::vector<int>& waiting) const {
    const std::string after = seconds_text(limit.seconds);
    if (size == 1) return "rank 0 timed out after " + after + " s in " + here;
    if (silent.empty() && behind.empty())
      return "ranks " + rank_list(waiting) + " timed out after " + after + " s in " + here +
             " (every rank answers from there: none is behind)";
    std::vector<int> blamed = silent;
    blamed.insert(blamed.end(), behind.begin(), behind.end());
    std::sort(blamed.begin(), blamed.end());
    auto where = [&](int r) {
      const auto& a = answers[static_cast<size_t>(r)];
      return a ? "still in " + a->text : std::string("no answer: stopped or gone");
    };
    std::string why;
    if (blamed.size() == 1) {
      why = answers[static_cast<size_t>(blamed[0])] ? "this rank did not arrive: it is " + where(blamed[0])
                                                     : "this rank did not arrive and does not answer: it is stopped or gone";
    } else {
      why = "these ranks did not arrive:";
      for (size_t i = 0; i < blamed.size(); ++i)
        why += std::string(i ? "," : "") + " rank " + std::to_string(blamed[i]) + " (" + where(blamed[i]) + ")";
    }
    bool together = true;  // the waiting ranks are all at one point, this one's
    for (int r : waiting) together = together && answers[static_cast<size_t>(r)]->count == answers[static_cast<size_t>(rank)]->count;
    return (blamed.size() == 1 ? "rank " : "ranks ") + rank_list(blamed) + " timed out after " + after + " s in " + here +
           " (" + why + "; " + (waiting.size() == 1 ? "rank " : "ranks ") + rank_list(waiting) +
           (waiting.size() == 1 ? " waits" : " wait") + (together ? " there)" : ")");
  }

  // The ranks that check first ask everyone once at the start, when all are well: a rank that cannot be reached
  // from here (a firewall between hosts, a host name that resolves elsewhere) is never taken for a stopped one.
  void probe() {
    ask_everyone(kProbeWindow);
    std::vector<int> unreachable;
    for (int r = 0; r < size; ++r)
      if (!answers[static_cast<size_t>(r)] && reachable[static_cast<size_t>(r)]) {
        reachable[static_cast<size_t>(r)] = 0;
        unreachable.push_back(r);
      }
    if (!unreachable.empty() && !stopping.load()) {
      std::fprintf(stderr, "strata: warning: rank %d's watchdog cannot reach %s %s over UDP: a stall there is reported "
                           "without naming the rank\n", rank, unreachable.size() == 1 ? "rank" : "ranks",
                   rank_list(unreachable).c_str());
      std::fflush(stderr);
    }
  }

  void loop() {
    const bool checks = limit.seconds > 0;  // without a limit the thread only serves the channel
    const int64_t grace = checks_first(rank, size) ? 0 : to_ns(kOthersGrace);
    if (checks && checks_first(rank, size) && reachable[static_cast<size_t>(rank)]) probe();
    while (!stopping.load()) {
      const int64_t due = checks ? std::max(last_progress_ns.load() + to_ns(limit.seconds) + grace, not_before_ns)
                                 : std::numeric_limits<int64_t>::max();
      const int64_t left = due - now_ns();
      pollfd fds[2] = {{socket.get(), POLLIN, 0}, {wake.get(), POLLIN, 0}};
      // Progress moves the time due later without waking this thread: it wakes at the earlier time and waits again.
      const int timeout_ms = left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left / 1000000 + 1, 60000));
      const int ready = ::poll(fds, 2, timeout_ms);  // a closed socket (-1) is skipped
      if (ready > 0 && (fds[0].revents & POLLIN)) serve();
      if (stopping.load()) return;
      if (checks && now_ns() >= std::max(last_progress_ns.load() + to_ns(limit.seconds) + grace, not_before_ns)) check();
    }
  }
};

Watchdog::Watchdog(WatchdogLimit limit, OnExpiry on_expiry) : limit_(limit) {
  state_ = std::make_unique<State>();
  State& s = *state_;
  s.limit = limit;
  s.on_expiry = std::move(on_expiry);
  s.rank = world_rank();
  s.size = world_size();
  s.last_progress_ns = now_ns();

  // Each rank's channel: a UDP socket on every address, its port published with the rank's host name.
  struct Address {
    char host[MPI_MAX_PROCESSOR_NAME + 1];
    int port;
  };
  Address mine{};
  int length = 0;
  STRATA_MPI_CHECK(MPI_Get_processor_name(mine.host, &length));
  std::string problem;
  s.socket = Fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  any.sin_port = 0;
  socklen_t size = sizeof any;
  if (s.socket.get() < 0) {
    problem = std::string("socket: ") + std::strerror(errno);
  } else if (::bind(s.socket.get(), reinterpret_cast<const sockaddr*>(&any), sizeof any) != 0) {
    problem = std::string("bind: ") + std::strerror(errno);
  } else if (::getsockname(s.socket.get(), reinterpret_cast<sockaddr*>(&any), &size) != 0) {
    problem = std::string("getsockname: ") + std::strerror(errno);
  } else {
    mine.port = ntohs(any.sin_port);
  }
  s.wake = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (s.wake.get() < 0) throw RuntimeError(std::string("the watchdog's eventfd failed: ") + std::strerror(errno));
  if (!problem.empty()) {
    std::fprintf(stderr, "strata: warning: rank %d's watchdog cannot be asked by the others (%s): a stall it sees is "
                         "reported without the rank that caused it\n", s.rank, problem.c_str());
    mine.port = 0;
  }
  std::vector<Address> all(static_cast<size_t>(s.size));
  STRATA_MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, MPI_COMM_WORLD));
  if (s.rank == 0) s.token = std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
  STRATA_MPI_CHECK(MPI_Bcast(&s.token, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD));

  s.peers.resize(all.size());
  s.reachable.assign(all.size(), 0);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].port == 0) continue;
    sockaddr_in& peer = s.peers[r];
    peer.sin_family = AF_INET;
    peer.sin_port = htons(static_cast<uint16_t>(all[r].port));
    if (std::strcmp(all[r].host, mine.host) == 0) {
      peer.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      s.reachable[r] = 1;
      continue;
    }
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    addrinfo* found = nullptr;
    if (::getaddrinfo(all[r].host, nullptr, &hints, &found) == 0 && found) {
      peer.sin_addr = reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr;
      s.reachable[r] = 1;
    }
    if (found) ::freeaddrinfo(found);
  }
  if (!s.reachable[static_cast<size_t>(s.rank)]) s.socket = Fd();
  s.thread = std::thread([&s] { s.loop(); });
}

Watchdog::~Watchdog() {
  state_->stopping = true;
  const uint64_t one = 1;
  if (::write(state_->wake.get(), &one, sizeof one) < 0) {
    // The thread still sees `stopping` at its next wake-up, at most a minute later.
  }
  state_->thread.join();
}

void Watchdog::progress(std::string what) {
  {
    std::lock_guard lock(state_->mutex);
    state_->what = std::move(what);
  }
  tick();
}

void Watchdog::announce_rank0_end() {
  for (int r = 1; r < state_->size; ++r) state_->send(r, Kind::rank0_ends, 0);
}

bool Watchdog::await_rank0_end(double seconds) {
  std::unique_lock lock(state_->ending_mutex);
  return state_->ending.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return state_->rank0_ended; });
}

void Watchdog::tick() {
  state_->count.fetch_add(1, std::memory_order_relaxed);
  state_->last_progress_ns.store(now_ns(), std::memory_order_relaxed);
}

WatchdogLimit parse_watchdog_limit(const std::string& text, double auto_seconds) {
  const bool automatic = text.rfind("auto", 0) == 0;
  if (automatic && text.size() == 4) return {auto_seconds, false};
  const std::string number = automatic && text[4] == ':' ? text.substr(5) : text;
  double seconds = -1;
  try {
    seconds = parse_double(number, "--timeout");
  } catch (const UsageError&) {
    // Reported below with the forms the flag takes.
  }
  if (!(seconds >= 0) || !std::isfinite(seconds) || (automatic && !(seconds > 0)))
    throw UsageError("--timeout takes seconds >= 0 (0: none), auto or auto:SECONDS, got '" + text + "'");
  return {seconds, !automatic};
}

}  // namespace strata
