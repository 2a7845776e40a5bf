// Small helpers of the CPU measurements (peak, bandwidth): pinning a measuring thread to a CPU, and the median
// the bandwidth figures report.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <vector>

namespace strata {

// Best effort: a thread that cannot be pinned still measures, only less steadily.
inline void pin_this_thread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

// 0 for no values.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace strata
