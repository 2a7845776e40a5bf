// Process-wide memory counters of the training step (see memory.h).
#include "train/memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace strata::train {

namespace {

constexpr std::size_t kPage = 4096;

// Bytes as atomics: the step allocates from one thread, but a reader (a watchdog, a test) may look at any time.
struct Counters {
  std::array<std::atomic<std::size_t>, kMemoryCategories> current{};
  std::array<std::atomic<std::size_t>, kMemoryCategories> peak{};
};
Counters& counters() {
  static Counters c;
  return c;
}
Counters& device_counters() {
  static Counters c;
  return c;
}

void add(Counters& c, MemoryCategory category, std::size_t bytes) {
  const auto i = static_cast<std::size_t>(category);
  const std::size_t now = c.current[i] += bytes;
  std::size_t peak = c.peak[i].load();
  while (now > peak && !c.peak[i].compare_exchange_weak(peak, now)) {
  }
}

void reset_peaks(Counters& c) {
  for (std::size_t i = 0; i < kMemoryCategories; ++i) c.peak[i] = c.current[i].load();
}

MemoryFigures read(const std::array<std::atomic<std::size_t>, kMemoryCategories>& values) {
  MemoryFigures f;
  for (std::size_t i = 0; i < f.bytes.size(); ++i) f.bytes[i] = static_cast<double>(values[i].load());
  return f;
}

}  // namespace

std::string_view name(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::parameters: return "parameters";
    case MemoryCategory::gradients: return "gradients";
    case MemoryCategory::optimizer: return "optimizer";
    case MemoryCategory::activations: return "activations";
    case MemoryCategory::comm_buffers: return "comm_buffers";
    case MemoryCategory::workspace: return "workspace";
  }
  return "?";
}

double MemoryFigures::total() const {
  double sum = 0;
  for (double b : bytes) sum += b;
  return sum;
}

MemoryFigures memory_current() { return read(counters().current); }
MemoryFigures memory_peak() { return read(counters().peak); }
void reset_memory_peaks() { reset_peaks(counters()); }
MemoryFigures device_memory_current() { return read(device_counters().current); }
MemoryFigures device_memory_peak() { return read(device_counters().peak); }
void reset_device_memory_peaks() { reset_peaks(device_counters()); }

namespace detail {

void* tracked_allocate(MemoryCategory category, std::size_t bytes) {
  if (bytes == 0) return nullptr;
  const std::size_t rounded = (bytes + kPage - 1) / kPage * kPage;
  void* memory = std::aligned_alloc(kPage, rounded);
  if (!memory) throw std::bad_alloc();
  std::memset(memory, 0, bytes);
  add(counters(), category, bytes);
  return memory;
}

void tracked_free(MemoryCategory category, void* memory, std::size_t bytes) {
  std::free(memory);
  counters().current[static_cast<std::size_t>(category)] -= bytes;
}

namespace {

// Released reservations kept for the next of their size: traced steps (a search traces thousands) reserve the same
// sizes again and again, and a reservation is a system call each way. Inaccessible, so reuse exposes nothing. A
// traced rank of a large model reserves hundreds of GB, so what is kept is bounded in bytes too: the address space
// is 128 TiB.
class ReservationCache {
 public:
  void* take(std::size_t bytes) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i = kept_.size(); i-- > 0;)
      if (kept_[i].second == bytes) {
        void* memory = kept_[i].first;
        kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
        kept_bytes_ -= bytes;
        return memory;
      }
    return nullptr;
  }
  void keep(void* memory, std::size_t bytes) {
    const std::lock_guard<std::mutex> lock(mutex_);
    kept_.emplace_back(memory, bytes);
    kept_bytes_ += bytes;
    while (kept_.size() > kMostKept || kept_bytes_ > kMostBytes) drop_oldest();
  }
  // Unmaps everything kept (a reservation failed: the address space may be full of it).
  void clear() {
    const std::lock_guard<std::mutex> lock(mutex_);
    while (!kept_.empty()) drop_oldest();
  }

 private:
  static constexpr std::size_t kMostKept = 256;
  static constexpr std::size_t kMostBytes = std::size_t{8} << 40;  // 8 TiB
  void drop_oldest() {
    munmap(kept_.front().first, kept_.front().second);
    kept_bytes_ -= kept_.front().second;
    kept_.erase(kept_.begin());
  }
  std::mutex mutex_;
  std::vector<std::pair<void*, std::size_t>> kept_;
  std::size_t kept_bytes_ = 0;
};

// Never destroyed: a buffer may be released during the program's exit, after function statics are gone.
ReservationCache& reservations() {
  static ReservationCache& cache = *new ReservationCache;
  return cache;
}

}  // namespace

void* reserve_address_space(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  if (void* kept = reservations().take(bytes)) return kept;
  auto reserve = [bytes] { return mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0); };
  void* memory = reserve();
  if (memory == MAP_FAILED) {
    reservations().clear();
    memory = reserve();
  }
  if (memory == MAP_FAILED) throw std::bad_alloc();
  return memory;
}

void release_address_space(void* memory, std::size_t bytes) {
  if (memory) reservations().keep(memory, bytes);
}

void count_device_allocation(MemoryCategory category, std::size_t bytes) { add(device_counters(), category, bytes); }
void count_device_free(MemoryCategory category, std::size_t bytes) {
  device_counters().current[static_cast<std::size_t>(category)] -= bytes;
}

}  // namespace detail

}  // namespace strata::train
