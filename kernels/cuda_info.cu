// Implementation of the CUDA information queries (see cuda_info.h).
#include "kernels/cuda_info.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "kernels/error.h"

namespace strata::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the sticky error and report none
    return 0;
  }
  return count;
}

namespace {
std::string dotted(int version, int major_div, int minor_div) {
  return std::to_string(version / major_div) + "." + std::to_string((version % major_div) / minor_div);
}
}  // namespace

std::map<std::string, std::string> versions() {
  std::map<std::string, std::string> out;
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  out["cuda_runtime"] = dotted(runtime, 1000, 10);
  out["cuda_driver"] = driver > 0 ? dotted(driver, 1000, 10) : "none";
  out["cublaslt"] = std::to_string(cublasLtGetVersion());
  out["cuda_devices"] = std::to_string(device_count());
  return out;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  STRATA_KERNEL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

int compute_capability(int device) {
  int major = 0, minor = 0;
  STRATA_KERNEL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  STRATA_KERNEL_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

void set_device(int device) { STRATA_KERNEL_CUDA_CHECK(cudaSetDevice(device)); }

std::size_t device_memory_bytes(int device) {
  cudaDeviceProp properties{};
  STRATA_KERNEL_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  return properties.totalGlobalMem;
}

DeviceMemory::DeviceMemory(std::size_t bytes) : bytes_(bytes) {
  STRATA_KERNEL_CUDA_CHECK(cudaMalloc(&pointer_, bytes == 0 ? 1 : bytes));
}

DeviceMemory::~DeviceMemory() { cudaFree(pointer_); }

// Each copy is enqueued on the legacy stream and waited for: a pageable upload may return before its DMA
// lands, and a device-to-device copy returns at once, while the caller (MPI, a check) reads the result next.
void copy_to_device(void* device, const void* host, std::size_t bytes) {
  if (bytes == 0) return;
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, cudaStreamLegacy));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

void copy_to_host(void* host, const void* device, std::size_t bytes) {
  if (bytes == 0) return;
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, cudaStreamLegacy));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

void copy_on_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cudaStreamLegacy));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

}  // namespace strata::cuda
