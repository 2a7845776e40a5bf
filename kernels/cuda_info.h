// What the CUDA side of a build and machine is: library versions for the results, device names, counts.
// Declared unconditionally; defined in cuda_info.cu when Strata is built with CUDA.
#pragma once

#include <cstddef>
#include <map>
#include <string>

namespace strata::cuda {

int device_count();  // 0 when there is no driver or no GPU
// Runtime, driver and cuBLASLt versions, and the device count ("none" where unavailable). NCCL's version is
// the collectives' (coll::nccl_version).
std::map<std::string, std::string> versions();
std::string device_name(int device);
// Compute capability as major * 10 + minor (90 for H100).
int compute_capability(int device);
void set_device(int device);
std::size_t device_memory_bytes(int device);  // the device's total memory

// Device memory with an owner, and synchronous copies, for benchmarks that stage inputs and read results.
class DeviceMemory {
 public:
  explicit DeviceMemory(std::size_t bytes);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* get() const { return pointer_; }
  std::size_t size() const { return bytes_; }

 private:
  void* pointer_ = nullptr;
  std::size_t bytes_ = 0;
};
void copy_to_device(void* device, const void* host, std::size_t bytes);
void copy_to_host(void* host, const void* device, std::size_t bytes);
// Device to device, finished on return; the ranges must not overlap.
void copy_on_device(void* dst, const void* src, std::size_t bytes);

}  // namespace strata::cuda
