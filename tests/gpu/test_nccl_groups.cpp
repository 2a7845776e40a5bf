// The NCCL process groups (collectives/nccl_groups.h) at one rank per GPU, alone or under mpirun: every
// operation on every group, in and out of place, against the result computed on the host, with the bytes the
// group's ranks send together; the events between the compute stream and a group's stream in both directions
// (a delayed producer before an operation, a delayed group stream before a consumer); the refusals; building
// and tearing down twice; and, where a node holds more ranks than GPUs, the refusal on every rank.
// With one GPU a 1-rank world still runs every group and every collective; send and recv need two ranks.
// Every rank decides to skip together, so none waits in a collective the others never start.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/mpi.h"
#include "collectives/nccl_groups.h"
#include "tests/gpu/gpu_per_rank.h"
#include "tests/gpu/gpu_test.h"
#include "tests/gpu/nccl_groups_kernels.h"

namespace strata::coll {
namespace {

using gpu_test::DeviceArray;
using gpu_test::TestStream;
using Bytes = std::vector<unsigned char>;

int world_size_now() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// A grid that gives tp and dp more than one rank where the world size allows.
GridShape grid_for(int n) { return n % 2 == 0 ? GridShape{2, 1, n / 2} : GridShape{1, 1, n}; }

// The groups of the job, built once by the first test that needs them and torn down before MPI_Finalize.
struct Job {
  ProcessGroups mpi{grid_for(world_size_now())};
  NcclProcessGroups nccl{mpi};
};
std::unique_ptr<Job> job;
Job& the_job() {
  if (!job) job = std::make_unique<Job>();
  return *job;
}

struct Pair {
  Group* mpi;
  NcclGroup* nccl;
};
std::vector<Pair> every_group(Job& j) {
  return {{&j.mpi.world(), &j.nccl.world()}, {&j.mpi.tp(), &j.nccl.tp()},   {&j.mpi.pp(), &j.nccl.pp()},
          {&j.mpi.dp(), &j.nccl.dp()},       {&j.mpi.dp_intra(), &j.nccl.dp_intra()}, {&j.mpi.dp_inter(), &j.nccl.dp_inter()}};
}

// Element i of group rank r's input: small integers, exact in every dtype and under any order of reduction.
double input_value(int r, std::size_t i) { return static_cast<double>(static_cast<int>((r * 7 + i * 3) % 13) - 6); }

Bytes filled(int r, std::size_t count, DataType dtype, std::size_t first = 0) {
  Bytes buf(std::max<std::size_t>(count, 1) * size_of(dtype));
  for (std::size_t i = 0; i < count; ++i) store_value(buf.data(), i, dtype, input_value(r, first + i));
  return buf;
}

double reduced(RedOp op, int ranks, std::size_t i) {
  double acc = input_value(0, i);
  for (int r = 1; r < ranks; ++r) {
    const double v = input_value(r, i);
    acc = op == RedOp::max ? std::max(acc, v) : op == RedOp::min ? std::min(acc, v) : acc + v;
  }
  return op == RedOp::avg ? acc / ranks : acc;
}

// Wrong elements of `got` (count elements from `first`) against want(i).
template <typename Want>
int count_wrong(const Bytes& got, std::size_t first, std::size_t count, DataType dtype, RedOp op, Want want) {
  int wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const double g = load_value(got.data(), first + i, dtype), w = want(i);
    wrong += op == RedOp::avg ? std::abs(g - w) > 1e-6 * (std::abs(w) + 1) : g != w;
  }
  return wrong;
}

// The group's total of one kind of sent bytes, over its ranks.
unsigned long long group_total(const Group& g, const NcclWork& work) {
  unsigned long long mine = work.traffic().total(), all = 0;
  STRATA_MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, g.comm()));
  return all;
}

struct Case {
  DataType dtype;
  RedOp op;
};
const std::vector<Case> kCases = {{DataType::float32, RedOp::sum}, {DataType::int32, RedOp::max},
                                  {DataType::bfloat16, RedOp::sum}, {DataType::float64, RedOp::avg}};

TEST(NcclGroups, EveryCollectiveOnEveryGroupInAndOutOfPlace) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  TestStream compute;
  for (auto [mpi, g] : every_group(the_job()))
    for (const Case& c : kCases)
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1003}})
        for (bool in_place : {false, true}) {
          const int n = g->size(), r = g->rank();
          const std::size_t es = size_of(c.dtype), un = static_cast<std::size_t>(n), ur = static_cast<std::size_t>(r);
          const std::string what = g->name() + " " + std::string(name(c.dtype)) + " " + std::string(name(c.op)) +
                                   " count " + std::to_string(count) + (in_place ? " in place" : "");
          const unsigned long long block = count * es;
          {  // allreduce
            DeviceArray<unsigned char> a(filled(r, count, c.dtype)), b(count * es);
            unsigned char* out = in_place ? a.get() : b.get();
            NcclWork work = g->allreduce(a.get(), out, count, c.dtype, c.op, compute.get());
            work.wait();
            const Bytes got = in_place ? a.download() : b.download();
            EXPECT_EQ(count_wrong(got, 0, count, c.dtype, c.op, [&](std::size_t i) { return reduced(c.op, n, i); }), 0)
                << "allreduce " << what;
            EXPECT_EQ(group_total(*mpi, work), 2ull * (un - 1) * block) << "allreduce " << what;
          }
          {  // reduce_scatter: recvcount = count
            DeviceArray<unsigned char> a(filled(r, count * un, c.dtype)), b(count * es);
            unsigned char* out = in_place ? a.get() + ur * block : b.get();
            NcclWork work = g->reduce_scatter(a.get(), out, count, c.dtype, c.op, compute.get());
            work.wait();
            const Bytes got = in_place ? a.download() : b.download();
            EXPECT_EQ(count_wrong(got, in_place ? ur * count : 0, count, c.dtype, c.op,
                                  [&](std::size_t i) { return reduced(c.op, n, ur * count + i); }),
                      0)
                << "reduce_scatter " << what;
            EXPECT_EQ(group_total(*mpi, work), un * (un - 1) * block) << "reduce_scatter " << what;
          }
          {  // allgather: in place, my block already sits at its place in the output
            Bytes image(std::max<std::size_t>(count * un, 1) * es);
            const Bytes mine = filled(r, count, c.dtype);
            std::copy(mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(block), image.begin() + static_cast<std::ptrdiff_t>(ur * block));
            DeviceArray<unsigned char> a(mine), b(in_place ? image : Bytes(image.size()));
            const unsigned char* send = in_place ? b.get() + ur * block : a.get();
            NcclWork work = g->allgather(send, b.get(), count, c.dtype, compute.get());
            work.wait();
            const Bytes got = b.download();
            for (int from = 0; from < n; ++from)
              EXPECT_EQ(count_wrong(got, static_cast<std::size_t>(from) * count, count, c.dtype, RedOp::sum,
                                    [&](std::size_t i) { return input_value(from, i); }),
                        0)
                  << "allgather from " << from << " " << what;
            EXPECT_EQ(group_total(*mpi, work), un * (un - 1) * block) << "allgather " << what;
          }
          if (in_place) continue;  // broadcast and sendrecv have one way each
          for (int root = 0; root < n; ++root) {
            DeviceArray<unsigned char> a(r == root ? filled(root, count, c.dtype) : Bytes(std::max<std::size_t>(count, 1) * es));
            NcclWork work = g->broadcast(a.get(), count, c.dtype, root, compute.get());
            work.wait();
            EXPECT_EQ(count_wrong(a.download(), 0, count, c.dtype, RedOp::sum, [&](std::size_t i) { return input_value(root, i); }), 0)
                << "broadcast root " << root << " " << what;
            EXPECT_EQ(group_total(*mpi, work), (un - 1) * block) << "broadcast root " << root << " " << what;
          }
          {  // sendrecv around the ring: a 1-rank group exchanges with itself
            const int right = (r + 1) % n, left = (r + n - 1) % n;
            DeviceArray<unsigned char> a(filled(r, count, c.dtype)), b(count * es);
            NcclWork work = g->sendrecv(a.get(), right, b.get(), left, count, c.dtype, compute.get());
            work.wait();
            EXPECT_EQ(count_wrong(b.download(), 0, count, c.dtype, RedOp::sum, [&](std::size_t i) { return input_value(left, i); }), 0)
                << "sendrecv " << what;
            EXPECT_EQ(work.traffic().total(), n > 1 ? block : 0ull) << "sendrecv " << what;
          }
        }
}

// Ranks 0 and 1 of each group of two or more exchange: 0 sends then receives, 1 receives then sends.
TEST(NcclGroups, SendAndRecvBetweenTwoRanks) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  if (world_size_now() < 2) GTEST_SKIP() << "send and recv need two ranks (mpirun -np 2 on two GPUs)";
  TestStream compute;
  const std::size_t count = 4099;
  for (auto [mpi, g] : every_group(the_job())) {
    if (g->size() < 2 || g->rank() > 1) continue;
    const int peer = 1 - g->rank();
    DeviceArray<unsigned char> mine(filled(g->rank(), count, DataType::float32)), theirs(count * 4);
    NcclWork sent, received;
    if (g->rank() == 0) {
      sent = g->send(mine.get(), count, DataType::float32, peer, compute.get());
      received = g->recv(theirs.get(), count, DataType::float32, peer, compute.get());
    } else {
      received = g->recv(theirs.get(), count, DataType::float32, peer, compute.get());
      sent = g->send(mine.get(), count, DataType::float32, peer, compute.get());
    }
    received.wait(), sent.wait();
    EXPECT_EQ(count_wrong(theirs.download(), 0, count, DataType::float32, RedOp::sum, [&](std::size_t i) { return input_value(peer, i); }), 0)
        << g->name();
    EXPECT_EQ(sent.traffic().total(), count * 4) << g->name();
    EXPECT_EQ(received.traffic().total(), 0u) << g->name();
  }
}

// A producer on the compute stream that writes late: the operation must read what it wrote.
TEST(NcclGroups, AnOperationWaitsForItsInputsOnTheComputeStream) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  TestStream compute;
  for (auto [mpi, g] : every_group(the_job())) {
    const std::size_t count = 1 << 16;
    DeviceArray<float> in(std::vector<float>(count, 0.0f)), out(count);
    g->allreduce(in.get(), out.get(), count, DataType::float32, RedOp::sum, compute.get()).wait();  // connect first
    gpu_test::launch_fill_after_delay(in.get(), count, static_cast<float>(g->rank() + 1), 200'000'000, compute.get());
    NcclWork work = g->allreduce(in.get(), out.get(), count, DataType::float32, RedOp::sum, compute.get());
    work.wait();
    const float want = static_cast<float>(g->size() * (g->size() + 1) / 2);
    const std::vector<float> got = out.download();
    EXPECT_EQ(std::count(got.begin(), got.end(), want), static_cast<long>(count)) << g->name() << ": got " << got[0];
  }
}

// A group stream held back: a consumer on the compute stream after wait_on must see the result, while the host
// is not blocked (test() is still false after wait_on returns).
TEST(NcclGroups, WaitOnOrdersTheComputeStreamWithoutBlockingTheHost) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  TestStream compute;
  for (auto [mpi, g] : every_group(the_job())) {
    const std::size_t count = 1 << 16;
    DeviceArray<float> in(std::vector<float>(count, static_cast<float>(g->rank() + 1)));
    DeviceArray<float> out(std::vector<float>(count, -1.0f)), consumed(std::vector<float>(count, 0.0f));
    DeviceArray<float> warm(count);
    g->allreduce(in.get(), warm.get(), count, DataType::float32, RedOp::sum, compute.get()).wait();  // connect first
    gpu_test::launch_delay(200'000'000, g->stream());
    NcclWork work = g->allreduce(in.get(), out.get(), count, DataType::float32, RedOp::sum, compute.get());
    work.wait_on(compute.get());
    gpu_test::launch_twice_plus_one(out.get(), consumed.get(), count, compute.get());
    EXPECT_FALSE(work.test()) << g->name() << ": the group stream is held for 200 ms, so the host should not have waited";
    compute.synchronize();
    EXPECT_TRUE(work.test()) << g->name();
    const float want = 2.0f * static_cast<float>(g->size() * (g->size() + 1) / 2) + 1.0f;
    const std::vector<float> got = consumed.download();
    EXPECT_EQ(std::count(got.begin(), got.end(), want), static_cast<long>(count)) << g->name() << ": got " << got[0];
  }
}

// A handle dropped while its operation still runs (the group stream held 100 ms behind it) waits for it, so
// the caller may free or reuse the buffers as soon as the handle is gone.
TEST(NcclGroups, DestroyingAWorkInFlightWaitsForIt) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  for (auto [mpi, g] : every_group(the_job())) {
    const std::size_t count = 1 << 16;
    DeviceArray<float> in(std::vector<float>(count, 1.0f)), out(count);
    g->allreduce(in.get(), out.get(), count, DataType::float32, RedOp::sum, nullptr).wait();  // connect first
    gpu_test::launch_delay(100'000'000, g->stream());
    {
      NcclWork work = g->allreduce(in.get(), out.get(), count, DataType::float32, RedOp::sum, nullptr);
      EXPECT_FALSE(work.test()) << g->name();
    }
    EXPECT_EQ(cudaStreamQuery(g->stream()), cudaSuccess) << g->name() << ": the handle went before its operation ended";
  }
}

TEST(NcclGroups, BadArgumentsAreRefusedBeforeNcclIsCalled) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  NcclGroup& world = the_job().nccl.world();
  DeviceArray<float> buf(4);
  EXPECT_THROW(world.broadcast(buf.get(), 4, DataType::float32, world.size(), nullptr), std::invalid_argument);
  EXPECT_THROW(world.send(buf.get(), 4, DataType::float32, world.rank(), nullptr), std::invalid_argument);
  EXPECT_THROW(world.recv(buf.get(), 4, DataType::float32, -1, nullptr), std::invalid_argument);
  EXPECT_THROW(world.sendrecv(buf.get(), 0, buf.get(), 0, 4, DataType::float32, nullptr), std::invalid_argument);
  EXPECT_THROW(world.sendrecv(buf.get(), world.size(), buf.get() + 2, 0, 2, DataType::float32, nullptr), std::invalid_argument);
  NcclWork done;
  EXPECT_TRUE(done.test());
  EXPECT_EQ(done.event(), nullptr);
  done.wait();
}

// The ordered teardown, twice over, with work still queued when the groups go.
TEST(NcclGroups, BuildAndTearDownTwice) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  for (int round = 0; round < 2; ++round) {
    DeviceArray<float> buf(std::vector<float>(1000, 1.0f));  // outlives the groups, which wait for their streams
    ProcessGroups mpi(grid_for(world_size_now()), 0, "dp,pp,tp");
    NcclProcessGroups nccl(mpi);
    EXPECT_EQ(nccl.world().size(), world_size_now());
    EXPECT_EQ(nccl.dp().rank(), mpi.dp().rank());
    gpu_test::launch_delay(20'000'000, nccl.dp_inter().stream());
    NcclWork work = nccl.dp_inter().allreduce(buf.get(), buf.get(), 1000, DataType::float32, RedOp::sum, nullptr);
    (void)work;  // left queued: the destructors must wait for it
  }
}

// Where a node holds more ranks than GPUs (mpirun -np 2 on one GPU), every rank is refused.
TEST(NcclGroups, MoreRanksThanGpusIsRefusedOnEveryRank) {
  const std::string short_of_gpus = gpu_test::gpu_per_rank_unavailable_reason();
  const std::string no_device = gpu_test::cuda_unavailable_reason();
  int mine = !no_device.empty(), any = 0;
  STRATA_MPI_CHECK(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (any) GTEST_SKIP() << (mine ? no_device : "no CUDA device: on another rank");
  if (short_of_gpus.empty()) GTEST_SKIP() << "every rank has a GPU of its own here";
  ProcessGroups mpi(grid_for(world_size_now()));
  EXPECT_THROW(NcclProcessGroups nccl(mpi), std::invalid_argument);
}

}  // namespace
}  // namespace strata::coll

// Rank 0 prints; a rank whose test throws outside a test body aborts the job with its message.
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(catch_exceptions, false);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (strata::world_rank() != 0) delete listeners.Release(listeners.default_result_printer());
  int failed = 0;
  try {
    failed = RUN_ALL_TESTS() != 0;
    strata::coll::job.reset();
  } catch (const std::exception& e) {
    std::cerr << "rank " << strata::world_rank() << ": " << e.what() << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && strata::world_rank() == 0) std::cout << "[  FAILED  ] on some rank (see above)\n";
  MPI_Finalize();
  return any;
}
