// A collective or point-to-point operation in flight, and the coroutine machinery Strata's own algorithms are
// written in.
//
// An algorithm is a coroutine (`Step`) that posts MPI_Isend/MPI_Irecv and then `co_await`s them; a phase of
// a larger algorithm is itself a Step that the larger one `co_await`s. Each operation owns its coroutine
// frame, its scratch memory and its tags, so any number may be in flight on one communicator at once.
//
// How progress happens on the CPU: nothing runs in the background. An algorithm advances only inside
// Work::test() and Work::wait(), called by the thread that started it: test() checks the requests the
// algorithm waits on (MPI_Testall, which also drives the MPI library's own progress) and, when they are
// complete, runs the algorithm on to its next set of messages. A caller overlapping communication with
// compute calls test() between pieces of compute (e.g. after each layer of the backward pass); the library
// path (MPI_I* collectives) progresses the same way, as Open MPI has no progress thread by default.
// Algorithms that wait on memory other ranks write rather than on messages (collectives/shm.h) `co_await` an
// Until condition instead, which test() asks the same way.
#pragma once

#include <mpi.h>

#include <array>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace strata::coll {

// Bytes this rank sent, split by whether the receiver is on its node. The library path reports zeros: MPI
// does not say what it sent.
struct Traffic {
  std::uint64_t intra_bytes = 0;
  std::uint64_t inter_bytes = 0;
  std::uint64_t total() const { return intra_bytes + inter_bytes; }
  Traffic& operator+=(const Traffic& other);
};

// Where a running coroutine chain waits: the requests (or the condition) of its innermost Step and the Step
// to resume.
struct Requests;
struct Scheduler {
  Requests* waiting = nullptr;
  std::function<bool()>* condition = nullptr;
  std::coroutine_handle<> resume_point;
};

// A coroutine of an algorithm. Lazily started; co_await on a Step runs it as a phase of the caller.
class Step {
 public:
  struct promise_type {
    Scheduler* scheduler = nullptr;
    std::coroutine_handle<> continuation;  // the Step that co_awaits this one, if any
    std::exception_ptr error;

    Step get_return_object() { return Step(std::coroutine_handle<promise_type>::from_promise(*this)); }
    std::suspend_always initial_suspend() noexcept { return {}; }
    auto final_suspend() noexcept {
      struct ToContinuation {
        bool await_ready() noexcept { return false; }
        std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> self) noexcept {
          auto next = self.promise().continuation;
          return next ? next : std::noop_coroutine();
        }
        void await_resume() noexcept {}
      };
      return ToContinuation{};
    }
    void return_void() {}
    void unhandled_exception() { error = std::current_exception(); }
  };

  Step() = default;
  explicit Step(std::coroutine_handle<promise_type> handle) : handle_(handle) {}
  Step(Step&& other) noexcept : handle_(std::exchange(other.handle_, {})) {}
  Step& operator=(Step&& other) noexcept {
    if (this != &other) {
      if (handle_) handle_.destroy();
      handle_ = std::exchange(other.handle_, {});
    }
    return *this;
  }
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;
  ~Step() {
    if (handle_) handle_.destroy();
  }

  bool done() const { return !handle_ || handle_.done(); }
  std::coroutine_handle<promise_type> handle() const { return handle_; }

  // co_await step: runs it as a phase, under the caller's scheduler, and rethrows what it threw.
  bool await_ready() const noexcept { return done(); }
  template <typename Caller>
  std::coroutine_handle<> await_suspend(std::coroutine_handle<Caller> caller) noexcept {
    handle_.promise().scheduler = caller.promise().scheduler;
    handle_.promise().continuation = caller;
    return handle_;
  }
  void await_resume() const {
    if (handle_ && handle_.promise().error) std::rethrow_exception(handle_.promise().error);
  }

 private:
  std::coroutine_handle<promise_type> handle_;
};

// co_await requests: suspends until every request completes (complete ones cost nothing). A step waits on a
// few at a time (a send and a receive), so they sit in place, and only longer lists take heap memory: small
// messages then cost no allocation per step.
struct Requests {
  MPI_Request* add();  // a slot for one more request, to pass to MPI_Isend/MPI_Irecv
  void clear();
  MPI_Request* data() { return spilled_.empty() ? in_place_.data() : spilled_.data(); }
  int size() const { return count_; }

  bool await_ready();
  void await_suspend(std::coroutine_handle<Step::promise_type> waiter) noexcept {
    waiter.promise().scheduler->waiting = this;
    waiter.promise().scheduler->resume_point = waiter;
  }
  void await_resume() const noexcept {}

 private:
  std::array<MPI_Request, 4> in_place_{};
  std::vector<MPI_Request> spilled_;  // all of them, once there are more than fit in place
  int count_ = 0;
};

// co_await Yield{}: suspends until the next Work::test(), for a step that progresses other operations itself
// (a pipeline of several in flight) rather than waiting on messages of its own.
struct Yield {
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<Step::promise_type> waiter) noexcept {
    waiter.promise().scheduler->waiting = nullptr;
    waiter.promise().scheduler->condition = nullptr;
    waiter.promise().scheduler->resume_point = waiter;
  }
  void await_resume() const noexcept {}
};

// co_await Until{condition}: suspends until condition() returns true (a true one costs nothing). test() calls
// it once per call, so it must be cheap and must not block.
struct Until {
  std::function<bool()> condition;
  bool await_ready() { return condition(); }
  void await_suspend(std::coroutine_handle<Step::promise_type> waiter) noexcept {
    waiter.promise().scheduler->condition = &condition;
    waiter.promise().scheduler->resume_point = waiter;
  }
  void await_resume() const noexcept {}
};

// The handle a caller holds. Destroying one that is still in flight waits for it first, because its
// messages read and write the caller's buffers.
class Work {
 public:
  Work() = default;  // an operation that is already complete

  // Starts an algorithm: `make(Traffic*)` returns its Step, given the counter it adds sent bytes to. The step
  // runs until it first waits on messages. `keep_alive` holds what the step's frame points into (scratch
  // buffers) until the operation is destroyed.
  template <typename Make>
  static Work start(Make make, std::shared_ptr<void> keep_alive = {}) {
    auto state = std::make_unique<State>();
    state->keep_alive = std::move(keep_alive);
    state->step = make(&state->traffic);
    Work work(std::move(state));
    work.launch();
    return work;
  }

  Work(Work&&) noexcept = default;
  Work& operator=(Work&& other) noexcept;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  // Inline where nothing is in flight: the library's blocking calls return a complete Work, and their latency
  // is measured against a bare MPI call.
  ~Work() {
    if (state_ && !done()) finish_in_destructor();
  }

  // Progresses the operation; true once it is complete (then its results are in the caller's buffers).
  // Rethrows an error the algorithm raised.
  bool test();
  void wait() {
    if (!state_) return;
    while (!test()) {
    }
  }
  bool done() const { return !state_ || state_->step.done(); }
  // Bytes this rank sent (own algorithms; zeros for the library path), complete once done().
  Traffic traffic() const { return state_ ? state_->traffic : Traffic{}; }

 private:
  struct State {
    Step step;
    Scheduler scheduler;
    std::shared_ptr<void> keep_alive;
    Traffic traffic;
  };
  explicit Work(std::unique_ptr<State> state) : state_(std::move(state)) {}
  void launch();
  void rethrow_if_failed() const;
  void finish_in_destructor() noexcept;
  std::unique_ptr<State> state_;
};

}  // namespace strata::coll
