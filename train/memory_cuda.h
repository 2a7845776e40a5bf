// Device memory of the training step, counted by category in memory.h's device figures as TrackedBuffer
// counts host memory: the GPU model's parameters, gradients, optimizer states, activations and workspace.
// Declared without CUDA headers so any C++ file can hold one; defined in memory_cuda.cpp (CUDA builds).
#pragma once

#include <cstddef>

#include "train/memory.h"

namespace strata::train {

namespace detail {
// cudaMalloc on the current device (256-byte aligned), zeroed and counted; KernelError on failure.
void* device_allocate(MemoryCategory category, std::size_t bytes);
void device_free(MemoryCategory category, void* memory, std::size_t bytes);
}  // namespace detail

// An array of n T on the current device, zeroed at allocation (the device has finished the zeroing when the
// constructor returns, so work on any stream sees it), counted under its category for as long as it lives.
// Moves transfer the count.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(MemoryCategory category, std::size_t count)
      : data_(static_cast<T*>(detail::device_allocate(category, count * sizeof(T)))), size_(count), category_(category) {}
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = static_cast<DeviceBuffer&&>(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = other.data_, size_ = other.size_, category_ = other.category_;
      other.data_ = nullptr, other.size_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t bytes() const { return size_ * sizeof(T); }
  void release() {
    if (data_) detail::device_free(category_, data_, size_ * sizeof(T));
    data_ = nullptr, size_ = 0;
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
  MemoryCategory category_ = MemoryCategory::workspace;
};

}  // namespace strata::train
