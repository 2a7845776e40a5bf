// Kernels of the NCCL process-group tests (test_nccl_groups.cpp): a producer and a consumer on a compute
// stream, and a delay that holds a stream back, so that a missing event between streams shows as a wrong result.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace strata::gpu_test {

// Holds `stream` for about `nanoseconds` of GPU time.
void launch_delay(unsigned long long nanoseconds, cudaStream_t stream);
// out[i] = value for i < n, written only after about `nanoseconds`.
void launch_fill_after_delay(float* out, std::size_t n, float value, unsigned long long nanoseconds, cudaStream_t stream);
// out[i] = 2 in[i] + 1.
void launch_twice_plus_one(const float* in, float* out, std::size_t n, cudaStream_t stream);

}  // namespace strata::gpu_test
