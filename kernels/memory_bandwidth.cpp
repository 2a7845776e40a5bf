// Implementation of the STREAM-style bandwidth measurement (see memory_bandwidth.h).
#include "kernels/memory_bandwidth.h"
#include "kernels/cpu_threads.h"

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <thread>

namespace strata {

int64_t bandwidth_array_bytes(const CpuTopology& topology) {
  const int64_t twice_cache = 2 * topology.last_level_cache_bytes();
  return std::clamp<int64_t>(twice_cache, int64_t{32} << 20, int64_t{256} << 20);
}

namespace {

using Clock = std::chrono::steady_clock;

struct FreeDeleter {
  void operator()(double* p) const { std::free(p); }
};
using Array = std::unique_ptr<double[], FreeDeleter>;

Array allocate(size_t elements) {
  constexpr size_t kAlign = 2 << 20;  // huge-page aligned, so transparent huge pages can back it
  size_t bytes = (elements * sizeof(double) + kAlign - 1) / kAlign * kAlign;
  auto* p = static_cast<double*>(std::aligned_alloc(kAlign, bytes));
  if (!p) throw std::bad_alloc();
  return Array(p);
}

// glibc's memcpy, as a shared-memory collective copies: for large sizes it streams with non-temporal stores.
void copy(const double* __restrict a, double* __restrict c, size_t begin, size_t end) {
  std::memcpy(c + begin, a + begin, (end - begin) * sizeof(double));
}

void triad(double* __restrict a, const double* __restrict b, const double* __restrict c, double s, size_t begin,
           size_t end) {
  for (size_t i = begin; i < end; ++i) a[i] = b[i] + s * c[i];
}

}  // namespace

MemoryBandwidth measure_memory_bandwidth(const BandwidthOptions& options) {
  MemoryBandwidth result;
  const size_t n = static_cast<size_t>(options.array_bytes) / sizeof(double);
  result.array_bytes = static_cast<int64_t>(n * sizeof(double));
  const int cores = std::max<int>(1, static_cast<int>(options.cpus.size()));
  result.cores = static_cast<int>(options.cpus.size());
  Array a = allocate(n), b = allocate(n), c = allocate(n);
  const double copy_bytes = 16.0 * static_cast<double>(n), triad_bytes = 24.0 * static_cast<double>(n);
  const int trials = std::max(1, options.trials);

  // Each thread touches its own slice first, so on a NUMA machine the pages live next to the core that uses
  // them; one thread alone then streams all slices.
  auto slice = [&](int t) { return std::pair{n * static_cast<size_t>(t) / cores, n * (static_cast<size_t>(t) + 1) / cores}; };
  std::vector<double> copy_all, triad_all;
  {
    std::vector<double> elapsed(static_cast<size_t>(cores));
    std::barrier sync(cores + 1);
    std::vector<std::jthread> threads;
    for (int t = 0; t < cores; ++t)
      threads.emplace_back([&, t] {
        if (!options.cpus.empty()) pin_this_thread(options.cpus[static_cast<size_t>(t)]);
        auto [begin, end] = slice(t);
        for (size_t i = begin; i < end; ++i) a[i] = 1.0, b[i] = 2.0, c[i] = 0.5;
        sync.arrive_and_wait();
        for (int trial = 0; trial < (options.cpus.empty() ? 0 : 2 * trials); ++trial) {
          sync.arrive_and_wait();
          auto start = Clock::now();
          if (trial % 2 == 0)
            copy(a.get(), c.get(), begin, end);
          else
            triad(a.get(), b.get(), c.get(), 0.5, begin, end);
          elapsed[static_cast<size_t>(t)] = std::chrono::duration<double>(Clock::now() - start).count();
          sync.arrive_and_wait();
        }
      });
    sync.arrive_and_wait();  // arrays initialised
    for (int trial = 0; trial < (options.cpus.empty() ? 0 : 2 * trials); ++trial) {
      sync.arrive_and_wait();
      sync.arrive_and_wait();
      double slowest = *std::max_element(elapsed.begin(), elapsed.end());
      (trial % 2 == 0 ? copy_all : triad_all).push_back((trial % 2 == 0 ? copy_bytes : triad_bytes) / slowest);
    }
  }
  std::vector<double> copy_one, triad_one;
  for (int trial = 0; trial < trials; ++trial) {
    auto start = Clock::now();
    copy(a.get(), c.get(), 0, n);
    copy_one.push_back(copy_bytes / std::chrono::duration<double>(Clock::now() - start).count());
    start = Clock::now();
    triad(a.get(), b.get(), c.get(), 0.5, 0, n);
    triad_one.push_back(triad_bytes / std::chrono::duration<double>(Clock::now() - start).count());
  }
  // Keeps the stores observable: the arrays are read back once after timing.
  volatile double sink = a[n / 2] + c[n / 3];
  (void)sink;
  result.copy = {median(copy_one), median(copy_all)};
  result.triad = {median(triad_one), median(triad_all)};
  return result;
}

}  // namespace strata
