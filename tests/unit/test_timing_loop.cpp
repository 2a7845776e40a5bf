// Tests of the harness's timed loop (measure() in bench/harness/harness.h), run alone and under mpirun with 2 ranks:
// --warmup and --iters are honoured (calls counted), a sample holds the body and nothing else (a sleep in the
// body shows, one in the warm-up or between iterations does not), samples are per operation, and a time
// budget (--max-time) stops every rank after the same iteration.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <iostream>
#include <thread>
#include <vector>

#include "bench/harness/harness.h"

namespace {

using namespace strata;
using std::chrono::milliseconds;

// The host clock, counting its calls and checking they pair up around the body.
class CountingTimer final : public Timer {
 public:
  void start() override {
    EXPECT_FALSE(running_) << "start() twice without stop()";
    running_ = true;
    ++starts;
    inner_.start();
  }
  double stop() override {
    EXPECT_TRUE(running_) << "stop() without start()";
    running_ = false;
    ++stops;
    return inner_.stop();
  }
  const char* description() const override { return "counting host timer"; }
  bool running() const { return running_; }
  int starts = 0, stops = 0;

 private:
  HostTimer inner_;
  bool running_ = false;
};

void sleep_ms(int ms) { std::this_thread::sleep_for(milliseconds(ms)); }

TEST(TimingLoop, WarmupAndItersAreHonoured) {
  for (int warmup : {0, 1, 3})
    for (int iters : {1, 4}) {
      CountingTimer timer;
      int calls = 0, timed_calls = 0;
      std::vector<double> samples = measure(MPI_COMM_WORLD, MeasureSpec{warmup, iters, 0, 1}, timer, [&] {
        ++calls;
        timed_calls += timer.running() ? 1 : 0;
      });
      EXPECT_EQ(samples.size(), static_cast<size_t>(iters)) << warmup << " " << iters;
      EXPECT_EQ(calls, warmup + iters) << warmup << " " << iters;
      // The timer runs around every call, warm-up included (device timers wait for the work at stop()).
      EXPECT_EQ(timed_calls, warmup + iters);
      EXPECT_EQ(timer.starts, warmup + iters);
      EXPECT_EQ(timer.stops, warmup + iters);
    }
}

// What the body does is in the sample; what happens in warm-up calls is not.
TEST(TimingLoop, ASleepInTheBodyShowsAndOneInTheWarmupDoesNot) {
  CountingTimer timer;
  int call = 0;
  const int warmup = 2;
  std::vector<double> samples = measure(MPI_COMM_WORLD, MeasureSpec{warmup, 3, 0, 1}, timer, [&] {
    sleep_ms(call++ < warmup ? 200 : 20);
  });
  ASSERT_EQ(samples.size(), 3u);
  for (double s : samples) {
    EXPECT_GE(s, 0.020);
    EXPECT_LT(s, 0.150);  // far below the warm-up's 200 ms even on a loaded machine
  }
}

// Time spent before the loop, or by another rank before it reaches an iteration's barrier, is outside the
// samples: every iteration starts after a barrier, so no sample waits for a late rank.
TEST(TimingLoop, ALateRankDoesNotShowInTheSamples) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Rank 0's body is slow, so the other ranks reach each next iteration's barrier early and wait there.
  CountingTimer counting;
  std::vector<double> late = measure(MPI_COMM_WORLD, MeasureSpec{0, 3, 0, 1}, counting, [&] {
    if (rank == 0 && size > 1) {
      // The sleep runs inside rank 0's timed body, so only rank 0's samples may show it.
      sleep_ms(100);
    }
  });
  ASSERT_EQ(late.size(), 3u);
  for (double s : late) {
    if (rank == 0 && size > 1) EXPECT_GE(s, 0.100);
    else EXPECT_LT(s, 0.050) << "a rank's sample includes another rank's lateness";
  }
}

// Pipelined samples are per operation: the body runs ops_per_sample operations and the sample is a share.
TEST(TimingLoop, SamplesArePerOperation) {
  HostTimer timer;
  std::vector<double> samples = measure(MPI_COMM_WORLD, MeasureSpec{0, 2, 0, 4}, timer, [] { sleep_ms(40); });
  ASSERT_EQ(samples.size(), 2u);
  for (double s : samples) {
    EXPECT_GE(s, 0.010);
    EXPECT_LT(s, 0.030);
  }
}

// --max-time: the loop stops once the slowest rank has spent the budget, after the same iteration on every
// rank, and never before the first sample.
TEST(TimingLoop, TimeBudgetStopsEveryRankTogether) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  HostTimer timer;
  // Only rank 0 is slow: the others must stop with it, not run all 1000 iterations.
  std::vector<double> samples = measure(MPI_COMM_WORLD, MeasureSpec{1, 1000, 0.1, 1}, timer, [&] {
    if (rank == 0) sleep_ms(20);
  });
  EXPECT_GE(samples.size(), 4u);
  EXPECT_LE(samples.size(), 12u);
  long mine = static_cast<long>(samples.size()), fewest = 0, most = 0;
  MPI_Allreduce(&mine, &fewest, 1, MPI_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &most, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(fewest, most);
  // A budget shorter than one iteration still gives one sample; no budget runs every iteration.
  EXPECT_EQ(measure(MPI_COMM_WORLD, MeasureSpec{0, 5, 1e-9, 1}, timer, [] { sleep_ms(1); }).size(), 1u);
  EXPECT_EQ(measure(MPI_COMM_WORLD, MeasureSpec{0, 5, 0, 1}, timer, [] {}).size(), 5u);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) delete listeners.Release(listeners.default_result_printer());
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed) std::cout << "[  FAILED  ] on rank " << rank << "\n";
  MPI_Finalize();
  return any;
}
