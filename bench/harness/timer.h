// Timers for one timed iteration. Host work uses the host's steady clock; GPU work uses device events
// (bench/harness/timer_cuda.h), because a host clock around asynchronous launches measures only the launch.
#pragma once

#include <chrono>

namespace strata {

// Seconds on this rank's host steady clock: the clock of the step records' timeline (bench/harness/records.h).
inline double host_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Timer {
 public:
  virtual ~Timer() = default;
  virtual void start() = 0;
  virtual double stop() = 0;  // seconds since start(), after the timed work has completed
  virtual const char* description() const = 0;
};

class HostTimer final : public Timer {
 public:
  void start() override { begin_ = std::chrono::steady_clock::now(); }
  double stop() override { return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count(); }
  const char* description() const override { return "host steady_clock"; }

 private:
  std::chrono::steady_clock::time_point begin_;
};

}  // namespace strata
