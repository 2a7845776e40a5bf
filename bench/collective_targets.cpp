// strata-bench-collectives: the collective benchmarks' three figures, each measured side by side in one run
// (np 2 expected), printed against its target:
//   1. Strata's ring allreduce against the MPI library's at 1-64 MiB: busbw ratio (target >= 1.0);
//   2. large-message allreduce busbw against this machine's memcpy bandwidth (target >= 0.8);
//   3. blocking-mode latency through the harness against a bare loop of the same MPI call, 8 B-1 MiB
//      (the harness must add < 5%).
// Rounds alternate between the contenders so machine noise hits both; figures are medians. Exits 3 when a
// figure misses its target; --smoke (the test suite) runs 1/1024 of the sizes and judges no target.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench/harness.h"
#include "bench/targets.h"
#include "collectives/algorithms.h"
#include "collectives/layout.h"
#include "collectives/operations.h"
#include "collectives/process_group.h"
#include "collectives/types.h"

namespace {

using namespace strata;
using coll::Algo;

int run_targets(int argc, char** argv) {
  int rounds = 5, iters = 10;
  Cli cli("strata-bench-collectives", "Collective benchmark figures against their targets (run with mpirun -np 2).");
  cli.option("rounds", 0, "alternating rounds per contender", rounds, 1);
  cli.option("iters", 'n', "timed samples per round", iters, 1);
  bool smoke = false;
  cli.flag("smoke", 0, "tiny run for the test suite: sizes / 1024, 1 round of 2; targets are not judged", smoke);
  if (!cli.parse(argc, argv)) return 0;
  if (smoke) rounds = 1, iters = 2;
  // The sizes of the figures; --smoke divides them by 1024 (64 KiB instead of 64 MiB).
  const size_t scale = smoke ? 1024 : 1;
  int missed = 0;
  auto verdict = [&](bool pass) {
    missed += pass ? 0 : 1;
    return smoke ? "smoke, not judged" : pass ? "PASS" : "MISS";
  };
  const int rank = world_rank(), size = world_size();
  coll::Layout layout;
  coll::MpiTypes types;
  coll::Context ctx = coll::world_context(layout, types);
  HostTimer timer;
  const double factor = coll::bus_factor(coll::Operation::allreduce, size);
  auto say = [&](const char* format, auto... args) {
    if (rank == 0) std::printf(format, args...);
  };
  say("# strata-bench-collectives: %d ranks, %d rounds x %d samples per contender, medians\n", size, rounds, iters);

  // 1 and 2: pipelined allreduce (4 back-to-back operations per sample), library against ring.
  say("\n# allreduce float sum, pipelined; busbw = S/t x 2(n-1)/n in GB/s (1e9 B/s); time = max over ranks\n");
  say("%10s %14s %14s %10s\n", "size(B)", "library busbw", "ring busbw", "ring/lib");
  double best_large_busbw = 0;
  double worst_ratio = 1e9;
  for (size_t bytes = (size_t{1} << 20) / scale; bytes <= (size_t{64} << 20) / scale; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(static_cast<int>((i * 13 + rank * 7) % 9) - 4);
    std::vector<double> library, ring;
    for (int round = 0; round < rounds; ++round)
      for (Algo algo : {Algo::library, Algo::ring}) {
        MeasureSpec spec{round == 0 ? 2 : 0, iters, 0, 4};
        auto samples = measure(MPI_COMM_WORLD, spec, timer, [&] {
          for (int k = 0; k < 4; ++k)
            coll::allreduce(algo, in.data(), out.data(), count, coll::DataType::float32, coll::RedOp::sum, ctx);
        });
        // The straggler view: each sample's max over ranks.
        for (double& s : samples) s = allreduce_max(MPI_COMM_WORLD, s);
        (algo == Algo::library ? library : ring).insert((algo == Algo::library ? library : ring).end(),
                                                        samples.begin(), samples.end());
      }
    // The ring's result (the last run) must be the exact sum: small integers add exactly in float.
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < size; ++r) want += static_cast<float>(static_cast<int>((i * 13 + r * 7) % 9) - 4);
      if (out[i] != want) throw RuntimeError("ring allreduce gave a wrong sum at element " + std::to_string(i));
    }
    double lib_bw = bytes / median_of(library) * factor, ring_bw = bytes / median_of(ring) * factor;
    worst_ratio = std::min(worst_ratio, ring_bw / lib_bw);
    if (bytes == (size_t{64} << 20) / scale) best_large_busbw = std::max(lib_bw, ring_bw);
    say("%10zu %14.3f %14.3f %10.3f\n", bytes, lib_bw / 1e9, ring_bw / 1e9, ring_bw / lib_bw);
  }
  say("ring/library busbw, worst over sizes: %.3f (target >= 1.0: %s)\n", worst_ratio, verdict(worst_ratio >= 1.0));

  // 2: memcpy bandwidth of one rank (bytes copied per second, 64 MiB buffers, out of cache), all ranks at once,
  // against the 64 MiB busbw of allreduce (above) and of the copy-only operations, allgather and broadcast.
  {
    const size_t bytes = (size_t{64} << 20) / scale;
    std::vector<char> a(bytes, 1), b(bytes, 2);
    MeasureSpec spec{2, rounds * iters, 0, 1};
    auto copies = measure(MPI_COMM_WORLD, spec, timer, [&] { std::memcpy(b.data(), a.data(), bytes); a[rank] = b[bytes - 1]; });
    double copy_bw = bytes / median_of(copies);
    say("\n# memcpy, 64 MiB, every rank at once: %.3f GB/s copied per rank\n", copy_bw / 1e9);
    say("%-28s %12s %10s\n", "64 MiB operation (best algo)", "busbw(GB/s)", "/memcpy");
    const size_t count = bytes / sizeof(float);
    std::vector<float> in(count, 1.0f), out(count * static_cast<size_t>(size));
    auto best_busbw = [&](auto run_once, double factor_of_op) {
      double best = 0;
      for (Algo algo : {Algo::library, Algo::ring}) {
        MeasureSpec s{1, iters, 0, 1};
        auto samples = measure(MPI_COMM_WORLD, s, timer, [&] { run_once(algo); });
        for (double& t : samples) t = allreduce_max(MPI_COMM_WORLD, t);
        best = std::max(best, bytes / median_of(samples) * factor_of_op);
      }
      return best;
    };
    double allgather_bw = best_busbw([&](Algo algo) {
      coll::allgather(algo, in.data(), out.data(), count / size, coll::DataType::float32, ctx);
    }, coll::bus_factor(coll::Operation::allgather, size));
    double broadcast_bw = best_busbw([&](Algo algo) {
      coll::broadcast(algo, in.data(), out.data(), count, coll::DataType::float32, 0, ctx);
    }, coll::bus_factor(coll::Operation::broadcast, size));
    for (auto [label, bw] : {std::pair{"allreduce", best_large_busbw}, std::pair{"allgather", allgather_bw},
                             std::pair{"broadcast", broadcast_bw}})
      say("%-28s %12.3f %10.3f  (target >= 0.8: %s)\n", label, bw / 1e9, bw / copy_bw, verdict(bw / copy_bw >= 0.8));
    say("# an allreduce touches about 3.5x its size in memory per rank (receive, reduce, gather) where a copy\n"
        "# touches 2x, so its busbw is bounded near 0.57 of memcpy on one node\n");
  }

  // 3: blocking latency: the harness's timed loop (measure(): barrier, timer, bookkeeping) around the same
  // MPI call, and around strata-collective's library path (the operations table's call on a process group,
  // waited for at once: a Work around MPI_Allreduce), against a bare barrier + call loop. One sample of each in turn, the order rotating, so drifts in the
  // machine's speed, which at sub-microsecond latencies exceed the difference sought, hit all alike.
  say("\n# blocking allreduce latency (one call per sample, barrier before each), medians over ranks' samples\n");
  say("%10s %10s %12s %12s %10s %12s\n", "size(B)", "bare(us)", "harness(us)", "overhead", "+dispatch", "overhead");
  double worst_overhead = -1e9;
  coll::ProcessGroups groups(coll::GridShape{1, 1, size});
  const coll::OperationInfo& allreduce = coll::info(coll::Operation::allreduce);
  for (size_t bytes : {size_t{8}, size_t{64}, size_t{512}, size_t{4} << 10, size_t{32} << 10, size_t{256} << 10,
                       size_t{1} << 20}) {
    if (bytes > (size_t{1} << 20) / scale) break;
    const size_t count = bytes / sizeof(float);
    const int n = static_cast<int>(count);
    std::vector<float> in(count, 1.0f), out(count);
    std::vector<double> bare, harnessed, dispatched;
    const MeasureSpec one{0, 1, 0, 1};
    auto contender = [&](int which) {
      if (which == 0) {
        MPI_Barrier(MPI_COMM_WORLD);
        auto start = std::chrono::steady_clock::now();
        MPI_Allreduce(in.data(), out.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        bare.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      } else if (which == 1) {
        harnessed.push_back(measure(MPI_COMM_WORLD, one, timer, [&] {
          MPI_Allreduce(in.data(), out.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }).front());
      } else {
        dispatched.push_back(measure(MPI_COMM_WORLD, one, timer, [&] {
          allreduce.start(groups.world(), Algo::library, {in.data(), out.data(), count, coll::DataType::float32},
                          coll::Waiting::at_once).wait();
        }).front());
      }
    };
    for (int i = 0; i < 10; ++i) MPI_Allreduce(in.data(), out.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int turn = 0; turn < rounds * iters * 4; ++turn)
      for (int k = 0; k < 3; ++k) contender((turn + k) % 3);
    double b = median_of(bare), h = median_of(harnessed), d = median_of(dispatched);
    worst_overhead = std::max(worst_overhead, h / b - 1);
    say("%10zu %10.3f %12.3f %11.1f%% %10.3f %11.1f%%\n", bytes, b * 1e6, h * 1e6, (h / b - 1) * 100, d * 1e6,
        (d / b - 1) * 100);
  }
  say("harness overhead, worst over sizes: %.1f%% (target < 5%%: %s); +dispatch: Strata's library path on top\n",
      worst_overhead * 100, verdict(worst_overhead < 0.05));
  // Rank 0's verdicts are the printed ones; every rank exits with them.
  STRATA_MPI_CHECK(MPI_Bcast(&missed, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (missed && !smoke) say("%d figure(s) missed their target\n", missed);
  return missed && !smoke ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-bench-collectives", [&] { return run_targets(argc, argv); });
}
