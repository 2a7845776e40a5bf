// Process groups and their non-blocking operations under a real mpirun (2-5 ranks): every algorithm against
// the exact result on integer-valued data (so any order of reduction is exact), in and out of place, counts
// that do not divide, several operations in flight at once completing out of order, point-to-point
// exchanges, the grid's groups, and the bytes each algorithm sends per tier.
// Every rank runs every collective whatever it found, so one rank's failure cannot stall the others.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <numeric>

#include "collectives/check.h"
#include "collectives/mpi_error.h"
#include "collectives/process_group.h"

namespace strata::coll {
namespace {

int world_rank_now() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
int world_size_now() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Element i of group rank r's input: small integers, so sums over five ranks are exact in every dtype.
double input_value(int r, std::size_t i) { return static_cast<double>(static_cast<int>((r * 7 + i * 3) % 13) - 6); }

double reduce_expected(RedOp op, int ranks, std::size_t i) {
  double acc = input_value(0, i);
  for (int r = 1; r < ranks; ++r) {
    const double v = input_value(r, i);
    acc = op == RedOp::max ? std::max(acc, v) : op == RedOp::min ? std::min(acc, v) : acc + v;
  }
  return op == RedOp::avg ? acc / ranks : acc;
}

std::vector<std::byte> filled(int r, std::size_t count, DataType dtype, std::size_t first = 0) {
  std::vector<std::byte> buf(std::max<std::size_t>(count, 1) * size_of(dtype));
  for (std::size_t i = 0; i < count; ++i) store_value(buf.data(), i, dtype, input_value(r, first + i));
  return buf;
}

// Layouts each world size can be cut into: one node, one rank per node, two and three ranks per node (at np 6:
// three nodes of two and two nodes of three).
std::vector<int> layouts() {
  std::vector<int> rpn = {0, 1};
  if (world_size_now() % 2 == 0 && world_size_now() > 2) rpn.push_back(2);
  if (world_size_now() % 3 == 0 && world_size_now() > 3) rpn.push_back(3);
  return rpn;
}

const std::vector<std::size_t> kCounts = {0, 1, 7, 13, 1000};

// The algorithms under test; the two-level ones both with their intra-node phases through shared memory
// (where the node's ranks share it, as every layout here does) and through MPI messages.
struct Variant {
  Algo algo;
  bool intra_shm;
};
const std::vector<Variant> kVariants = {{Algo::library, true},      {Algo::ring, true},
                                        {Algo::hierarchical, true}, {Algo::horing, true},
                                        {Algo::hierarchical, false}, {Algo::horing, false}};
std::string describe(const Variant& v) {
  return std::string(name(v.algo)) + (v.algo == Algo::hierarchical || v.algo == Algo::horing
                                          ? (v.intra_shm ? " (intra shm)" : " (intra messages)")
                                          : "");
}
const std::vector<DataType> kTypes = {DataType::float32, DataType::int32, DataType::bfloat16, DataType::float64};

TEST(ProcessGroups, AllreduceEveryAlgorithmInAndOutOfPlace) {
  for (int rpn : layouts()) {
    ProcessGroups groups({1, 1, world_size_now()}, rpn);
    Group& g = groups.world();
    g.horing_chunk_bytes = 8;  // several chunks in flight even for small counts
    for (const Variant& v : kVariants)
      for (DataType dtype : kTypes)
        for (RedOp op : {RedOp::sum, RedOp::max, RedOp::avg})
          for (std::size_t count : kCounts)
            for (bool in_place : {false, true}) {
              if (op == RedOp::avg && dtype == DataType::int32) continue;  // integer average truncates
              std::vector<std::byte> in = filled(g.rank(), count, dtype), out(in.size());
              void* recv = in_place ? in.data() : out.data();
              g.intra_shm = v.intra_shm;
              g.allreduce(v.algo, in.data(), recv, count, dtype, op).wait();
              for (std::size_t i = 0; i < count; ++i)
                EXPECT_NEAR(load_value(recv, i, dtype), reduce_expected(op, g.size(), i),
                            dtype == DataType::bfloat16 ? 0.02 : 1e-6)
                    << describe(v) << " " << name(dtype) << " " << name(op) << " count " << count << " in_place "
                    << in_place << " rpn " << rpn << " at " << i;
            }
  }
}

TEST(ProcessGroups, ReduceScatterEveryAlgorithmInAndOutOfPlace) {
  for (int rpn : layouts()) {
    ProcessGroups groups({1, 1, world_size_now()}, rpn);
    Group& g = groups.world();
    g.horing_chunk_bytes = 8;
    const std::size_t n = static_cast<std::size_t>(g.size());
    for (const Variant& v : kVariants)
      for (DataType dtype : kTypes)
        for (RedOp op : {RedOp::sum, RedOp::min})
          for (std::size_t recvcount : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{300}})
            for (bool in_place : {false, true}) {
              std::vector<std::byte> in = filled(g.rank(), recvcount * n, dtype), out(std::max<std::size_t>(recvcount, 1) * size_of(dtype));
              std::byte* recv = in_place ? in.data() + static_cast<std::size_t>(g.rank()) * recvcount * size_of(dtype) : out.data();
              g.intra_shm = v.intra_shm;
              g.reduce_scatter(v.algo, in.data(), recv, recvcount, dtype, op).wait();
              for (std::size_t i = 0; i < recvcount; ++i)
                EXPECT_EQ(load_value(recv, i, dtype),
                          reduce_expected(op, g.size(), static_cast<std::size_t>(g.rank()) * recvcount + i))
                    << describe(v) << " " << name(dtype) << " " << name(op) << " recvcount " << recvcount << " in_place "
                    << in_place << " rpn " << rpn << " at " << i;
            }
  }
}

TEST(ProcessGroups, AllgatherEveryAlgorithmInAndOutOfPlace) {
  for (int rpn : layouts()) {
    ProcessGroups groups({1, 1, world_size_now()}, rpn);
    Group& g = groups.world();
    g.horing_chunk_bytes = 8;
    const std::size_t n = static_cast<std::size_t>(g.size());
    for (const Variant& v : kVariants)
      for (DataType dtype : {DataType::float32, DataType::int8, DataType::float64})
        for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{9}, std::size_t{500}})
          for (bool in_place : {false, true}) {
            std::vector<std::byte> out(std::max<std::size_t>(count * n, 1) * size_of(dtype));
            std::vector<std::byte> mine = filled(g.rank(), count, dtype, 0);
            std::byte* send = mine.data();
            if (in_place) {
              send = out.data() + static_cast<std::size_t>(g.rank()) * count * size_of(dtype);
              std::memcpy(send, mine.data(), count * size_of(dtype));
            }
            g.intra_shm = v.intra_shm;
            g.allgather(v.algo, send, out.data(), count, dtype).wait();
            for (std::size_t r = 0; r < n; ++r)
              for (std::size_t i = 0; i < count; ++i)
                EXPECT_EQ(load_value(out.data(), r * count + i, dtype), input_value(static_cast<int>(r), i))
                    << describe(v) << " " << name(dtype) << " count " << count << " rpn " << rpn << " from rank " << r;
          }
  }
}

// The two-level algorithms on every element type and reduction, with inputs in {-1, 0, 1, 2} so every result
// (a product of five is at most 32) is exact in every type, and on segments of two 64-byte slots, so every
// operation runs through many more chunks than the segment holds.
double small_value(int r, std::size_t i) { return static_cast<double>((r + 3 * i) % 4) - 1; }

TEST(ProcessGroups, TwoLevelEveryTypeAndReductionBeyondTheSegment) {
  for (int rpn : layouts()) {
    ProcessGroups groups({1, 1, world_size_now()}, rpn);
    Group& g = groups.world();
    g.horing_chunk_bytes = 64;
    g.shm_options.slot_bytes = 64;
    g.shm_options.slots = 2;
    const std::size_t n = static_cast<std::size_t>(g.size());
    for (Algo algo : {Algo::hierarchical, Algo::horing})
      for (bool intra_shm : {true, false})
        for (DataType dtype : kAllDataTypes)
          for (RedOp op : kAllRedOps) {
            const bool integer = dtype == DataType::int8 || dtype == DataType::int32;
            if (op == RedOp::avg && integer) continue;  // integer average truncates
            const std::size_t count = 61 * n;           // whole shards for the allreduce's shm phases, odd chunks
            std::vector<std::byte> in(count * size_of(dtype)), out(count * size_of(dtype));
            auto expected = [&](std::size_t i) {
              double acc = small_value(0, i);
              for (int r = 1; r < g.size(); ++r) {
                const double v = small_value(r, i);
                acc = op == RedOp::sum || op == RedOp::avg ? acc + v
                      : op == RedOp::prod                  ? acc * v
                      : op == RedOp::min                   ? std::min(acc, v)
                                                           : std::max(acc, v);
              }
              return op == RedOp::avg ? acc / g.size() : acc;
            };
            // The average rounds (sum / n in the type: 16-bit types by up to 2 / n x 2^-8); everything else is exact.
            const double tolerance = op != RedOp::avg ? 0 : size_of(dtype) == 2 ? 0.01 : 1e-6;
            g.intra_shm = intra_shm;
            const std::string what = std::string(name(algo)) + (intra_shm ? " (intra shm) " : " (intra messages) ") +
                                     std::string(name(dtype)) + " " + std::string(name(op)) + " rpn " + std::to_string(rpn);
            for (std::size_t i = 0; i < count; ++i) store_value(in.data(), i, dtype, small_value(g.rank(), i));
            g.allreduce(algo, in.data(), out.data(), count, dtype, op).wait();
            int wrong = 0;
            for (std::size_t i = 0; i < count; ++i) wrong += std::abs(load_value(out.data(), i, dtype) - expected(i)) > tolerance;
            EXPECT_EQ(wrong, 0) << "allreduce " << what;
            const std::size_t recvcount = count / n;
            g.reduce_scatter(algo, in.data(), out.data(), recvcount, dtype, op).wait();
            wrong = 0;
            for (std::size_t i = 0; i < recvcount; ++i)
              wrong += std::abs(load_value(out.data(), i, dtype) - expected(static_cast<std::size_t>(g.rank()) * recvcount + i)) > tolerance;
            EXPECT_EQ(wrong, 0) << "reduce_scatter " << what;
          }
  }
}

TEST(ProcessGroups, BroadcastFromEveryRoot) {
  ProcessGroups groups({1, 1, world_size_now()}, 0);
  Group& g = groups.world();
  for (Algo algo : {Algo::library, Algo::ring})
    for (int root = 0; root < g.size(); ++root)
      // 400000 floats: seven 256 KiB segments, so the ring's list of sends outgrows its in-place slots.
      for (std::size_t count : {std::size_t{0}, std::size_t{3}, std::size_t{400000}}) {
        std::vector<std::byte> buf = g.rank() == root ? filled(root, count, DataType::float32)
                                                      : std::vector<std::byte>(std::max<std::size_t>(count, 1) * 4);
        g.broadcast(algo, buf.data(), count, DataType::float32, root).wait();
        int wrong = 0;
        for (std::size_t i = 0; i < count; ++i) wrong += load_value(buf.data(), i, DataType::float32) != input_value(root, i);
        EXPECT_EQ(wrong, 0) << name(algo) << " root " << root << " count " << count;
      }
}

// Wrong elements among the results of four operations on float inputs `filled` by each rank: a sum
// allreduce (a), a max allreduce (b), a sum reduce-scatter (c_out) and an allgather (d_out) of `count`.
int wrong_in_four(Group& g, std::size_t count, const std::vector<std::byte>& a, const std::vector<std::byte>& b,
                  const std::vector<std::byte>& c_out, const std::vector<std::byte>& d_out) {
  const std::size_t n = static_cast<std::size_t>(g.size());
  int wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    wrong += load_value(a.data(), i, DataType::float32) != reduce_expected(RedOp::sum, g.size(), i);
    wrong += load_value(b.data(), i, DataType::float32) != reduce_expected(RedOp::max, g.size(), i);
    wrong += load_value(c_out.data(), i, DataType::float32) !=
             reduce_expected(RedOp::sum, g.size(), static_cast<std::size_t>(g.rank()) * count + i);
    for (std::size_t r = 0; r < n; ++r)
      wrong += load_value(d_out.data(), r * count + i, DataType::float32) != input_value(static_cast<int>(r), i);
  }
  return wrong;
}

// Three operations in flight on one group at once, finished in the reverse of their start order, with
// test() calls interleaved: their messages must not mix.
TEST(ProcessGroups, OperationsInFlightTogetherDoNotMix) {
  for (int rpn : layouts()) {
    ProcessGroups groups({1, 1, world_size_now()}, rpn);
    Group& g = groups.world();
    const std::size_t n = static_cast<std::size_t>(g.size()), count = 4099;
    std::vector<std::byte> a = filled(g.rank(), count, DataType::float32);
    std::vector<std::byte> b = filled(g.rank(), count, DataType::float32);
    std::vector<std::byte> c_in = filled(g.rank(), count * n, DataType::float32), c_out(count * 4);
    std::vector<std::byte> d_out(count * n * 4), d_in = filled(g.rank(), count, DataType::float32);
    Work first = g.allreduce(Algo::ring, a.data(), a.data(), count, DataType::float32, RedOp::sum);
    Work second = g.allreduce(Algo::hierarchical, b.data(), b.data(), count, DataType::float32, RedOp::max);
    Work third = g.reduce_scatter(Algo::ring, c_in.data(), c_out.data(), count, DataType::float32, RedOp::sum);
    Work fourth = g.allgather(Algo::library, d_in.data(), d_out.data(), count, DataType::float32);
    for (int i = 0; i < 3; ++i) first.test(), third.test();
    fourth.wait();
    third.wait();
    second.wait();
    first.wait();
    EXPECT_EQ(wrong_in_four(g, count, a, b, c_out, d_out), 0) << "rpn " << rpn;
  }
}

// Two-level operations in flight together on one group with their intra-node phases through shared memory:
// each one's last intra phase is ready only after its inter-node phase, at moments that differ from rank to
// rank, yet every node's ranks must run those phases in one order. Tested interleaved, waited in start order.
TEST(ProcessGroups, TwoLevelOperationsInFlightTogetherThroughSharedMemory) {
  for (int rpn : layouts()) {
    ProcessGroups groups({1, 1, world_size_now()}, rpn);
    Group& g = groups.world();
    g.horing_chunk_bytes = 256;
    const std::size_t n = static_cast<std::size_t>(g.size()), count = 840 * n;  // divides among any node's ranks
    for (int round = 0; round < 3; ++round) {
      std::vector<std::byte> a = filled(g.rank(), count, DataType::float32);
      std::vector<std::byte> b = filled(g.rank(), count, DataType::float32);
      std::vector<std::byte> c_in = filled(g.rank(), count * n, DataType::float32), c_out(count * 4);
      std::vector<std::byte> d_in = filled(g.rank(), count, DataType::float32), d_out(count * n * 4);
      std::vector<Work> works;
      works.push_back(g.allreduce(Algo::hierarchical, a.data(), a.data(), count, DataType::float32, RedOp::sum));
      works.push_back(g.allreduce(Algo::horing, b.data(), b.data(), count, DataType::float32, RedOp::max));
      works.push_back(g.reduce_scatter(Algo::horing, c_in.data(), c_out.data(), count, DataType::float32, RedOp::sum));
      works.push_back(g.allgather(Algo::hierarchical, d_in.data(), d_out.data(), count, DataType::float32));
      for (int i = 0; i < 5 + g.rank() * 7; ++i)  // ranks progress unevenly
        for (std::size_t w = works.size(); w-- > 0;) works[w].test();
      for (Work& w : works) w.wait();
      EXPECT_EQ(wrong_in_four(g, count, a, b, c_out, d_out), 0) << "rpn " << rpn << " round " << round;
    }
  }
}

// Through shared memory a rank writes into its slots the parts of its input that other ranks read: a
// reduce-scatter (L-1)/L of it, an allgather its block. On one node of L = n ranks a hierarchical allreduce of
// S bytes then puts (L-1)/L S + S/L = S per rank on the node's tier, where ring phases send 2 (L-1)/L S.
TEST(ProcessGroups, SharedMemoryIntraPhasesCountTheBytesTheyWrite) {
  const int n = world_size_now();
  if (n < 3) GTEST_SKIP() << "at 2 ranks the two counts coincide; needs 3 or more";
  ProcessGroups groups({1, 1, n}, 0);
  Group& g = groups.world();
  const std::size_t count = 1200 * static_cast<std::size_t>(n), bytes = count * 4;
  std::vector<std::byte> buf = filled(g.rank(), count, DataType::float32);
  auto intra_total = [&](bool intra_shm) {
    g.intra_shm = intra_shm;
    Work work = g.allreduce(Algo::hierarchical, buf.data(), buf.data(), count, DataType::float32, RedOp::sum);
    work.wait();
    unsigned long long mine[2] = {work.traffic().intra_bytes, work.traffic().inter_bytes}, all[2] = {0, 0};
    MPI_Allreduce(mine, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(all[1], 0ull) << "one node";
    return all[0];
  };
  EXPECT_EQ(intra_total(true), static_cast<unsigned long long>(n) * bytes);
  EXPECT_EQ(intra_total(false), 2ull * (n - 1) * bytes);
}

// Pipeline-style exchange: two messages to the right neighbour in flight at once, received in order.
// A traced job's groups (no MPI, any rank) are the running job's: the same members in the same order, the same
// nodes, the same place of this rank, for every grid, order and node size this world allows. Its operations go to
// the trace.
TEST(ProcessGroups, TracedGroupsAreTheRunningOnes) {
  struct Recorder : GroupTrace {
    int collectives = 0, messages = 0;
    Work collective(const Group&, Operation, Algo, std::size_t, DataType) override { return ++collectives, Work(); }
    Work point_to_point(const Group&, bool, int, std::size_t, DataType) override { return ++messages, Work(); }
  };
  const int n = world_size_now();
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  for (const char* order : {"tp,pp,dp", "dp,tp,pp", "pp,dp,tp"})
    for (int tp = 1; tp <= n; ++tp)
      for (int pp = 1; tp * pp <= n; ++pp) {
        if (n % (tp * pp) != 0) continue;
        for (int rpn : {1, 2, n}) {
          if (n % rpn != 0) continue;
          const GridShape grid{tp, pp, n / (tp * pp)};
          ProcessGroups running(grid, rpn, order);
          Recorder recorder;
          ProcessGroups traced(grid, rpn, order, me, recorder);
          const std::string what = format_grid(grid) + " " + order + " rpn " + std::to_string(rpn);
          for (auto [a, b] : {std::pair{&running.tp(), &traced.tp()}, {&running.pp(), &traced.pp()}, {&running.dp(), &traced.dp()},
                              {&running.dp_intra(), &traced.dp_intra()}, {&running.dp_inter(), &traced.dp_inter()},
                              {&running.world(), &traced.world()}}) {
            std::vector<int> members(static_cast<std::size_t>(a->size()));
            MPI_Allgather(&me, 1, MPI_INT, members.data(), 1, MPI_INT, a->comm());
            EXPECT_EQ(b->world_ranks(), members) << what << " " << a->name();
            EXPECT_EQ(b->rank(), a->rank()) << what << " " << a->name();
            EXPECT_EQ(b->node_of_rank(), a->node_of_rank()) << what << " " << a->name();
          }
          EXPECT_EQ(traced.tp_index(), running.tp_index()) << what;
          EXPECT_EQ(traced.pp_index(), running.pp_index()) << what;
          EXPECT_EQ(traced.dp_index(), running.dp_index()) << what;
          float x = 1;
          EXPECT_TRUE(traced.dp().allreduce(Algo::ring, &x, &x, 1, DataType::float32, RedOp::sum).done());
          if (traced.pp().size() > 1) traced.pp().send(&x, 1, DataType::float32, (traced.pp().rank() + 1) % traced.pp().size());
          EXPECT_EQ(recorder.collectives, 1) << what;
          EXPECT_EQ(recorder.messages, traced.pp().size() > 1 ? 1 : 0) << what;
          // Reordered and sub-groups alike.
          std::vector<int> reverse(static_cast<std::size_t>(running.dp().size()));
          for (int r = 0; r < running.dp().size(); ++r) reverse[static_cast<std::size_t>(r)] = running.dp().size() - 1 - r;
          const auto a = running.dp().reordered("reversed", reverse), b = traced.dp().reordered("reversed", reverse);
          std::vector<int> members(static_cast<std::size_t>(a->size()));
          MPI_Allgather(&me, 1, MPI_INT, members.data(), 1, MPI_INT, a->comm());
          EXPECT_EQ(b->world_ranks(), members) << what;
          if (running.dp().size() > 1) {
            const auto ends_a = running.dp().subgroup("ends", {0, running.dp().size() - 1});
            const auto ends_b = traced.dp().subgroup("ends", {0, running.dp().size() - 1});
            ASSERT_EQ(ends_a == nullptr, ends_b == nullptr) << what;
            if (ends_a) {
              std::vector<int> ends(2);
              MPI_Allgather(&me, 1, MPI_INT, ends.data(), 1, MPI_INT, ends_a->comm());
              EXPECT_EQ(ends_b->world_ranks(), ends) << what;
            }
          }
        }
      }
}

TEST(ProcessGroups, PointToPointMessagesArriveInOrder) {
  ProcessGroups groups({1, world_size_now(), 1}, 0);
  Group& g = groups.pp();
  const int right = (g.rank() + 1) % g.size(), left = (g.rank() + g.size() - 1) % g.size();
  std::vector<std::byte> first = filled(g.rank(), 1000, DataType::float32), second = filled(g.rank() + 1, 1000, DataType::float32);
  std::vector<std::byte> got_first(4000), got_second(4000);
  Work r1 = g.recv(got_first.data(), 1000, DataType::float32, left);
  Work r2 = g.recv(got_second.data(), 1000, DataType::float32, left);
  Work s1 = g.send(first.data(), 1000, DataType::float32, right);
  Work s2 = g.send(second.data(), 1000, DataType::float32, right);
  r2.wait(), r1.wait(), s1.wait(), s2.wait();
  EXPECT_EQ(s1.traffic().total(), 4000u);
  int wrong = 0;
  for (std::size_t i = 0; i < 1000; ++i) {
    wrong += load_value(got_first.data(), i, DataType::float32) != input_value(left, i);
    wrong += load_value(got_second.data(), i, DataType::float32) != input_value(left + 1, i);
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_THROW(g.send(first.data(), 1, DataType::float32, g.rank()), std::invalid_argument);
  EXPECT_THROW(g.recv(first.data(), 1, DataType::float32, g.size()), std::invalid_argument);
}

// A ring allreduce sends each of n blocks n-1 times in each of its two passes: 2 (n-1) S bytes over all
// ranks; hierarchical puts only the shards on inter-node links: 2 (N-1) S over all ranks, N nodes.
TEST(ProcessGroups, TrafficPerTierMatchesTheAlgorithm) {
  const int n = world_size_now();
  if (n % 2 != 0 || n < 4) GTEST_SKIP() << "needs an even number of ranks, at least 4 (2 per emulated node)";
  ProcessGroups groups({1, 1, n}, 2);
  Group& g = groups.world();
  const std::size_t count = 1200 * static_cast<std::size_t>(n), bytes = count * 4;
  std::vector<std::byte> buf = filled(g.rank(), count, DataType::float32);
  auto totals = [&](Work work) {
    work.wait();
    unsigned long long mine[2] = {work.traffic().intra_bytes, work.traffic().inter_bytes}, all[2] = {0, 0};
    MPI_Allreduce(mine, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    return std::pair{all[0], all[1]};
  };
  g.intra_shm = false;  // the ring formulas; shared memory's count is tested below
  auto [ring_intra, ring_inter] = totals(g.allreduce(Algo::ring, buf.data(), buf.data(), count, DataType::float32, RedOp::sum));
  EXPECT_EQ(ring_intra + ring_inter, 2ull * (n - 1) * bytes);
  auto [h_intra, h_inter] = totals(g.allreduce(Algo::hierarchical, buf.data(), buf.data(), count, DataType::float32, RedOp::sum));
  const int nodes = n / 2;
  EXPECT_EQ(h_inter, 2ull * (nodes - 1) * bytes);                // each node's S split over its 2 ranks
  EXPECT_EQ(h_intra, 2ull * nodes * (2 - 1) * bytes);            // a reduce-scatter and an allgather in each node
  g.horing_chunk_bytes = 1024;  // HO-Ring cuts the same work into chunks: the same bytes on each tier
  auto [o_intra, o_inter] = totals(g.allreduce(Algo::horing, buf.data(), buf.data(), count, DataType::float32, RedOp::sum));
  EXPECT_EQ(o_intra, h_intra);
  EXPECT_EQ(o_inter, h_inter);
  auto [l_intra, l_inter] = totals(g.allreduce(Algo::library, buf.data(), buf.data(), count, DataType::float32, RedOp::sum));
  EXPECT_EQ(l_intra + l_inter, 0ull);  // MPI does not say
}

TEST(ProcessGroups, GridGroupsHoldTheRightRanks) {
  const int n = world_size_now(), me = world_rank_now();
  for (const char* order : {"tp,pp,dp", "dp,tp,pp"}) {
    const GridShape shape = n % 2 == 0 ? GridShape{2, 1, n / 2} : GridShape{1, 1, n};
    ProcessGroups groups(shape, n % 2 == 0 ? 2 : 0, order);
    EXPECT_EQ(groups.tp().size(), shape.tp);
    EXPECT_EQ(groups.dp().size(), shape.dp);
    EXPECT_EQ(groups.world_rank_of(groups.tp_index(), groups.pp_index(), groups.dp_index()), me) << order;
    // The TP group's members differ from me in the tp coordinate only.
    std::vector<int> members(static_cast<std::size_t>(groups.tp().size()));
    MPI_Allgather(&me, 1, MPI_INT, members.data(), 1, MPI_INT, groups.tp().comm());
    for (int k = 0; k < groups.tp().size(); ++k)
      EXPECT_EQ(members[static_cast<std::size_t>(k)], groups.world_rank_of(k, groups.pp_index(), groups.dp_index())) << order;
    // Where every node holds the same number of the data-parallel group's ranks (not so at np 6 with dp
    // fastest: three consecutive ranks on nodes of two), the intra and inter groups tile it.
    int intra = groups.dp_intra().size(), fewest = 0, most = 0;
    MPI_Allreduce(&intra, &fewest, 1, MPI_INT, MPI_MIN, groups.dp().comm());
    MPI_Allreduce(&intra, &most, 1, MPI_INT, MPI_MAX, groups.dp().comm());
    if (fewest == most) {
      EXPECT_EQ(groups.dp_intra().size() * groups.dp_inter().size(), groups.dp().size()) << order;
    }
  }
  EXPECT_THROW(ProcessGroups({n + 1, 1, 1}), std::invalid_argument);
  EXPECT_THROW(parse_grid_order("tp,tp,dp"), std::invalid_argument);
}

// One operation of the table on g through the table's call, as strata-collective makes it, on the check's
// inputs laid out in or out of place: the wrong elements of its output (root: the last rank).
int wrong_elements(Group& g, Operation op, Algo algo, DataType dtype, RedOp redop, std::size_t bytes, bool in_place,
                   Waiting waiting) {
  const std::size_t elem = size_of(dtype);
  const Counts counts = counts_for(op, bytes / elem * elem, elem, g.size());
  const CheckSpec spec{op, dtype, redop};
  const std::size_t send_bytes = counts.send_elems * elem, recv_bytes = counts.recv_elems * elem;
  std::vector<unsigned char> a(std::max<std::size_t>(std::max(send_bytes, recv_bytes), 1));
  std::vector<unsigned char> b(std::max<std::size_t>(recv_bytes, 1));
  const InPlaceOffsets at = in_place ? in_place_offsets(op, counts, elem, g.rank()) : InPlaceOffsets{};
  unsigned char* send = a.data() + at.send;
  unsigned char* recv = in_place ? a.data() + at.recv : b.data();
  const std::vector<unsigned char> input = check_inputs(spec, counts, g.rank());
  if (send_bytes) std::memcpy(send, input.data(), send_bytes);
  const int root = g.size() - 1;
  info(op).start(g, algo, {send, recv, counts.count, dtype, redop, root}, waiting).wait();
  const std::vector<unsigned char> out(recv, recv + recv_bytes);
  return count_wrong(spec, counts, out, g.rank(), g.size(), root);
}

// Every operation of the table that the process groups have, through the table's call as strata-collective
// makes it: each group algorithm, waited for later (MPI's non-blocking collectives for library) and at once
// (its blocking ones), in and out of place as the table lays them out, against the exact results of the check.
TEST(ProcessGroups, EveryTableOperationBothWaysMatchesTheCheck) {
  for (int rpn : layouts()) {
    ProcessGroups groups({1, 1, world_size_now()}, rpn);
    Group& g = groups.world();
    for (Operation op : kAllOperations)
      for (Algo algo : kAllAlgos) {
        if (!info(op).group_algos.has(algo)) continue;
        for (Waiting waiting : {Waiting::later, Waiting::at_once})
          for (DataType dtype : {DataType::float32, DataType::int8, DataType::bfloat16})
            for (RedOp redop : info(op).reduction ? std::vector<RedOp>{RedOp::sum, RedOp::max, RedOp::avg}
                                                  : std::vector<RedOp>{RedOp::sum})
              for (std::size_t bytes : {std::size_t{0}, std::size_t{10}, std::size_t{4000}})
                for (bool in_place : {false, true})
                  EXPECT_EQ(wrong_elements(g, op, algo, dtype, redop, bytes, in_place, waiting), 0)
                      << name(op) << " " << name(algo) << " " << name(dtype) << " " << name(redop) << " " << bytes
                      << " B in_place " << in_place << " at_once " << (waiting == Waiting::at_once) << " rpn " << rpn;
      }
  }
}

// The rings' segmented reduction and the splitting of messages, which the default 1 MiB segments and 1 GiB
// messages never reach at test sizes: segments of 8 bytes and of 3 (less than an element: one element each),
// messages cut every 3 bytes, for every operation on the ring, the hierarchical algorithm and HO-Ring with
// their intra-node phases as rings of messages, in and out of place, against the exact results of the check.
TEST(ProcessGroups, TinySegmentsAndSplitMessagesMatchTheCheck) {
  for (int rpn : layouts()) {
    ProcessGroups groups({1, 1, world_size_now()}, rpn);
    Group& g = groups.world();
    g.intra_shm = false;
    g.horing_chunk_bytes = 8;
    g.max_message_bytes = 3;
    for (std::size_t segment : {std::size_t{8}, std::size_t{3}}) {
      g.ring_segment_bytes = segment;
      for (Operation op : kAllOperations)
        for (Algo algo : {Algo::ring, Algo::hierarchical, Algo::horing}) {
          if (!info(op).group_algos.has(algo)) continue;
          for (DataType dtype : {DataType::float32, DataType::int8, DataType::float64})
            for (std::size_t bytes : {std::size_t{0}, std::size_t{10}, std::size_t{4000}})
              for (bool in_place : {false, true})
                EXPECT_EQ(wrong_elements(g, op, algo, dtype, RedOp::sum, bytes, in_place, Waiting::later), 0)
                    << name(op) << " " << name(algo) << " " << name(dtype) << " " << bytes << " B in_place "
                    << in_place << " segment " << segment << " rpn " << rpn;
        }
    }
  }
}

TEST(ProcessGroups, UnsupportedRequestsAreRefused) {
  ProcessGroups groups({1, 1, world_size_now()}, 0);
  float x = 0;
  EXPECT_THROW(groups.world().allreduce(Algo::recursive_doubling, &x, &x, 1, DataType::float32, RedOp::sum),
               std::invalid_argument);
  EXPECT_THROW(groups.world().broadcast(Algo::hierarchical, &x, 1, DataType::float32, 0), std::invalid_argument);
  // shm within the machine: every rank of these tests shares it, so the segment is made and used.
  float y = static_cast<float>(groups.world().rank());
  groups.world().allreduce(Algo::shm, &y, &y, 1, DataType::float32, RedOp::sum).wait();
  EXPECT_EQ(y, static_cast<float>(groups.world().size() * (groups.world().size() - 1) / 2));
  EXPECT_THROW(groups.world().broadcast(Algo::library, &x, 1, DataType::float32, world_size_now()), std::invalid_argument);
}

}  // namespace
}  // namespace strata::coll

// Rank 0 prints; a rank whose test throws outside a test body aborts the job with its message.
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  ::testing::InitGoogleTest(&argc, argv);
  // An exception (an MPI error) leaves the test on one rank only: let it reach the handler below, which ends
  // the job with its message, instead of the other ranks waiting in the next collective until the timeout.
  GTEST_FLAG_SET(catch_exceptions, false);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (strata::coll::world_rank_now() != 0) delete listeners.Release(listeners.default_result_printer());
  int failed = 0;
  try {
    failed = RUN_ALL_TESTS() != 0;
  } catch (const std::exception& e) {
    std::cerr << "rank " << strata::coll::world_rank_now() << ": " << e.what() << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && strata::coll::world_rank_now() == 0) std::cout << "[  FAILED  ] on some rank (see above)\n";
  MPI_Finalize();
  return any;
}
