// Implementation of the CUDA event timer (see timer_cuda.h).
#include "bench/timer_cuda.h"

#include <cuda_runtime.h>

#include "bench/check.h"

namespace strata {

namespace {
class CudaEventTimer final : public Timer {
 public:
  explicit CudaEventTimer(cudaStream_t stream) : stream_(stream) {
    STRATA_CUDA_CHECK(cudaEventCreate(&begin_));
    STRATA_CUDA_CHECK(cudaEventCreate(&end_));
  }
  ~CudaEventTimer() override {
    cudaEventDestroy(begin_);
    cudaEventDestroy(end_);
  }
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;

  void start() override { STRATA_CUDA_CHECK(cudaEventRecord(begin_, stream_)); }
  double stop() override {
    STRATA_CUDA_CHECK(cudaEventRecord(end_, stream_));
    STRATA_CUDA_CHECK(cudaEventSynchronize(end_));
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, begin_, end_));
    return static_cast<double>(ms) * 1e-3;
  }
  const char* description() const override { return "CUDA events on the work's stream"; }

 private:
  cudaStream_t stream_;
  cudaEvent_t begin_ = nullptr, end_ = nullptr;
};
}  // namespace

std::unique_ptr<Timer> make_cuda_event_timer(void* stream) {
  return std::make_unique<CudaEventTimer>(static_cast<cudaStream_t>(stream));
}

}  // namespace strata
