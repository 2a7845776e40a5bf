// The CUDA event timer (bench/harness/timer_cuda.h): it must time the work enqueued on its stream between start() and
// stop(), which a host callback that sleeps a known time makes visible without any kernel.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <thread>

#include "bench/harness/timer_cuda.h"
#include "tests/gpu/gpu_test.h"

namespace strata {
namespace {

constexpr double kSleepSeconds = 0.02;

void CUDART_CB sleep_on_stream(void*) {
  std::this_thread::sleep_for(std::chrono::duration<double>(kSleepSeconds));
}

TEST(CudaEventTimer, TimesTheWorkOnItsStream) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  gpu_test::TestStream stream;
  std::unique_ptr<Timer> timer = make_cuda_event_timer(stream.get());
  const auto host_start = std::chrono::steady_clock::now();
  timer->start();
  STRATA_KERNEL_CUDA_CHECK(cudaLaunchHostFunc(stream.get(), sleep_on_stream, nullptr));
  const double seconds = timer->stop();
  const double host_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - host_start).count();
  ASSERT_TRUE(std::isfinite(seconds));
  // The events bracket the sleep (less the events' 0.5 us resolution) and lie inside the host's interval.
  EXPECT_GE(seconds, kSleepSeconds - 1e-3);
  EXPECT_LE(seconds, host_seconds);
}

TEST(CudaEventTimer, StopWaitsForTheEndEvent) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  gpu_test::TestStream stream;
  std::unique_ptr<Timer> timer = make_cuda_event_timer(stream.get());
  timer->start();
  STRATA_KERNEL_CUDA_CHECK(cudaLaunchHostFunc(stream.get(), sleep_on_stream, nullptr));
  timer->stop();
  // After stop() returns, everything enqueued before it has finished.
  EXPECT_EQ(cudaStreamQuery(stream.get()), cudaSuccess);
}

TEST(CudaEventTimer, AnEmptyIntervalIsShort) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  gpu_test::TestStream stream;
  std::unique_ptr<Timer> timer = make_cuda_event_timer(stream.get());
  timer->start();
  const double seconds = timer->stop();
  EXPECT_GE(seconds, 0.0);
  EXPECT_LT(seconds, kSleepSeconds);
}

}  // namespace
}  // namespace strata
