// Shared helpers of strata-gpu-tests: skipping (with the reason) where no CUDA device can be used, owned device
// arrays, and a stream. A new GPU test file includes this header and starts each test with
// STRATA_SKIP_WITHOUT_CUDA_DEVICE(), so a machine without a GPU reports the tests skipped, never passed.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "kernels/error.h"

namespace strata::gpu_test {

// "" when device 0 can be used, otherwise "no CUDA device: <the runtime's message>". Selects device 0.
std::string cuda_unavailable_reason();

// A generator seeded from STRATA_TEST_SEED (default fixed), with the seed printed and recorded in the test's
// properties so a failure can be reproduced.
std::mt19937_64 seeded_rng();

// Every element within tol * (|want| + rms(want)) or abs_floor, reporting the worst; NaN never passes.
void expect_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                  double tol, double abs_floor = 0.0);

// Device memory for n elements of T, freed on every path.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : size_(n) {
    STRATA_KERNEL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), (n == 0 ? 1 : n) * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  std::size_t size() const { return size_; }
  void upload(const std::vector<T>& host) {
    STRATA_KERNEL_CUDA_CHECK(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    // A pageable upload may return before its DMA lands, and the tests' streams are non-blocking (not ordered
    // after the legacy stream): wait, so the next kernel reads what was uploaded.
    STRATA_KERNEL_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Synchronous: waits for all work on the device first.
  std::vector<T> download() const {
    std::vector<T> host(size_);
    STRATA_KERNEL_CUDA_CHECK(cudaDeviceSynchronize());
    STRATA_KERNEL_CUDA_CHECK(cudaMemcpy(host.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// A non-blocking stream, as the training step uses, so that a kernel relying on the legacy stream shows.
class TestStream {
 public:
  TestStream() { STRATA_KERNEL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~TestStream() { cudaStreamDestroy(stream_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const { STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace strata::gpu_test

#define STRATA_SKIP_WITHOUT_CUDA_DEVICE()                                                      \
  do {                                                                                         \
    if (const std::string strata_reason_ = ::strata::gpu_test::cuda_unavailable_reason();      \
        !strata_reason_.empty())                                                               \
      GTEST_SKIP() << strata_reason_;                                                          \
  } while (0)
