// Kernels of the NCCL process-group tests (see nccl_groups_kernels.h).
#include "tests/gpu/nccl_groups_kernels.h"

#include "kernels/error.h"

namespace strata::gpu_test {

namespace {

__device__ unsigned long long global_nanoseconds() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ void spin(unsigned long long nanoseconds) {
  const unsigned long long start = global_nanoseconds();
  while (global_nanoseconds() - start < nanoseconds) __nanosleep(1000);
}

__global__ void delay_kernel(unsigned long long nanoseconds) { spin(nanoseconds); }

// One block: its threads wait together, then write.
__global__ void fill_after_delay_kernel(float* out, std::size_t n, float value, unsigned long long nanoseconds) {
  if (threadIdx.x == 0) spin(nanoseconds);
  __syncthreads();
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = value;
}

__global__ void twice_plus_one_kernel(const float* in, float* out, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = 2.0f * in[i] + 1.0f;
}

}  // namespace

void launch_delay(unsigned long long nanoseconds, cudaStream_t stream) {
  delay_kernel<<<1, 1, 0, stream>>>(nanoseconds);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

void launch_fill_after_delay(float* out, std::size_t n, float value, unsigned long long nanoseconds, cudaStream_t stream) {
  fill_after_delay_kernel<<<1, 256, 0, stream>>>(out, n, value, nanoseconds);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

void launch_twice_plus_one(const float* in, float* out, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  twice_plus_one_kernel<<<blocks, 256, 0, stream>>>(in, out, n);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::gpu_test
