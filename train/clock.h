// The host steady clock in seconds: the clock of a step's timeline (and of bench/harness/timer.h's host_now()).
#pragma once

#include <chrono>

namespace strata::train {

inline double host_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace strata::train
