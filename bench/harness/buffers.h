// What the benchmark problems (bench/cases/) and the strata-bench-* programs share: buffers allocated as a plain C
// benchmark allocates them (page-aligned, once, written before any timed call so none takes a page fault), medians,
// and sizes in words.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/harness/harness.h"

namespace strata {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using PageAlignedFloats = std::unique_ptr<float[], FreeDeleter>;

inline PageAlignedFloats page_aligned_floats(std::size_t count) {
  const std::size_t bytes = std::max<std::size_t>((count * sizeof(float) + 4095) / 4096 * 4096, 4096);
  auto* p = static_cast<float*>(std::aligned_alloc(4096, bytes));
  if (!p) throw RuntimeError("out of memory for " + std::to_string(bytes) + " bytes");
  std::memset(p, 0, bytes);
  return PageAlignedFloats(p);
}

// nvbench's L2 flush on the CPU: a buffer of this rank's own, allocated once and written whole before a timed call,
// outside its interval, so the call meets its operands where other work leaves them rather than in the core's caches.
class CacheFlush {
 public:
  // `bytes` rounded up to whole floats, so a request of a few bytes still writes; 0: no buffer, write() does nothing.
  explicit CacheFlush(std::size_t bytes)
      : floats_((bytes + sizeof(float) - 1) / sizeof(float)), buffer_(floats_ ? page_aligned_floats(floats_) : nullptr) {}
  // A new value each time, so no write repeats what the buffer holds.
  void write() { std::fill(buffer_.get(), buffer_.get() + floats_, written_ += 1); }
  std::size_t bytes() const { return floats_ * sizeof(float); }
  bool empty() const { return floats_ == 0; }

 private:
  std::size_t floats_;
  PageAlignedFloats buffer_;
  float written_ = 0;
};

inline double median_of(std::vector<double> v) { return summarize(std::move(v)).median; }

// "64 MiB", "16 KiB", "8 B"; a size that is not a whole number of the unit in the next unit down.
inline std::string human_bytes(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 20) && bytes % (std::size_t{1} << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (std::size_t{1} << 10) && bytes % (std::size_t{1} << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace strata
