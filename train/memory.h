// Memory the training step holds, by category, counted where it is allocated: every buffer of the model and
// of the data-parallel step is a TrackedBuffer, which takes page-aligned memory and adds its bytes to its
// category's current and peak figure. The figures are process-wide (a rank is a process), so a program reads
// the peaks of one strategy after resetting them when the previous one is gone. Device memory (the GPU
// model's buffers, memory_cuda.h) is counted the same way in figures of its own.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <string_view>

namespace strata::train {

enum class MemoryCategory { parameters, gradients, optimizer, activations, comm_buffers, workspace };
inline constexpr int kMemoryCategories = 6;
std::string_view name(MemoryCategory category);  // "parameters", "gradients", ... "comm_buffers", "workspace"

struct MemoryFigures {
  std::array<double, kMemoryCategories> bytes{};
  double operator[](MemoryCategory c) const { return bytes[static_cast<std::size_t>(c)]; }
  double total() const;
};

// Bytes held now, and the most held since the last reset_memory_peaks().
MemoryFigures memory_current();
MemoryFigures memory_peak();
void reset_memory_peaks();  // peak = current
// The same for device memory.
MemoryFigures device_memory_current();
MemoryFigures device_memory_peak();
void reset_device_memory_peaks();

// Where a buffer's elements are: in memory; or, for a traced step (trace.h), only in address space: the buffer
// has addresses, so the step computes the same pointers, but no memory behind them (touching one faults), and
// it counts for nothing.
enum class Backing { memory, address_space };

// A page-aligned array of T, zeroed at allocation (never timed on uninitialised memory), counted under its
// category for as long as it lives. Moves transfer the count.
template <typename T>
class TrackedBuffer {
 public:
  TrackedBuffer() = default;
  TrackedBuffer(MemoryCategory category, std::size_t count, Backing backing = Backing::memory);
  ~TrackedBuffer() { release(); }
  TrackedBuffer(TrackedBuffer&& other) noexcept { *this = static_cast<TrackedBuffer&&>(other); }
  TrackedBuffer& operator=(TrackedBuffer&& other) noexcept;
  TrackedBuffer(const TrackedBuffer&) = delete;
  TrackedBuffer& operator=(const TrackedBuffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  void fill(const T& value);
  void release();

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
  MemoryCategory category_ = MemoryCategory::workspace;
  Backing backing_ = Backing::memory;
};

namespace detail {
void* tracked_allocate(MemoryCategory category, std::size_t bytes);  // zeroed, page-aligned; bad_alloc on failure
void tracked_free(MemoryCategory category, void* memory, std::size_t bytes);
void* reserve_address_space(std::size_t bytes);  // no access, no memory; bad_alloc on failure
void release_address_space(void* memory, std::size_t bytes);
// The device figures' bookkeeping, for the allocator of memory_cuda.h: bytes allocated and freed.
void count_device_allocation(MemoryCategory category, std::size_t bytes);
void count_device_free(MemoryCategory category, std::size_t bytes);
}  // namespace detail

template <typename T>
TrackedBuffer<T>::TrackedBuffer(MemoryCategory category, std::size_t count, Backing backing)
    : data_(static_cast<T*>(backing == Backing::memory ? detail::tracked_allocate(category, count * sizeof(T))
                                                       : detail::reserve_address_space(count * sizeof(T)))),
      size_(count), category_(category), backing_(backing) {}

template <typename T>
TrackedBuffer<T>& TrackedBuffer<T>::operator=(TrackedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_, size_ = other.size_, category_ = other.category_, backing_ = other.backing_;
    other.data_ = nullptr, other.size_ = 0;
  }
  return *this;
}

template <typename T>
void TrackedBuffer<T>::fill(const T& value) {
  for (std::size_t i = 0; i < size_; ++i) data_[i] = value;
}

template <typename T>
void TrackedBuffer<T>::release() {
  if (data_ && backing_ == Backing::memory) detail::tracked_free(category_, data_, size_ * sizeof(T));
  if (data_ && backing_ == Backing::address_space) detail::release_address_space(data_, size_ * sizeof(T));
  data_ = nullptr, size_ = 0;
}

}  // namespace strata::train
