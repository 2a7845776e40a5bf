// strata-bench-shm: the shared-memory collectives (collectives/shm.h) against this machine's copy bound and
// against the MPI library, measured side by side in one run (np 2 expected), printed against the target:
//   1. 64 MiB allreduce, allgather and broadcast busbw against the memcpy bandwidth of one rank while every
//      rank copies at once, in place (target >= 0.8) and out of place (reported: at np 2 an allgather out of
//      place reads S/2 and writes S per rank where a memcpy of S reads and writes S, so where memory
//      bandwidth is the bound it cannot pass 0.5 / 0.75 = 0.67 of memcpy);
//   2. shm against the library at 1 KiB-64 MiB for the same three, out of place: busbw per size, the size
//      from which shm wins at every larger size, and the ratio at 64 MiB (reported, not judged).
// Buffers are page-aligned, allocated (and touched) once. Rounds alternate between
// the contenders so machine noise hits all alike; figures are medians of samples that are each the max over
// ranks of a pipelined loop of back-to-back calls. Exits 3 when a figure misses its target; --smoke (the test
// suite) runs 1/1024 of the sizes and judges nothing.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "bench/targets.h"
#include "collectives/algorithms.h"
#include "collectives/shm.h"
#include "collectives/types.h"

namespace {

using namespace strata;
using coll::Operation;

int run_targets(int argc, char** argv) {
  int rounds = 5, iters = 10;
  Cli cli("strata-bench-shm", "Shared-memory collectives against memcpy and the MPI library (run with mpirun -np 2).");
  cli.option("rounds", 0, "alternating rounds per contender", rounds, 1);
  cli.option("iters", 'n', "timed samples per round", iters, 1);
  bool smoke = false;
  cli.flag("smoke", 0, "tiny run for the test suite: sizes / 1024, 1 round of 2; targets are not judged", smoke);
  bool stream_slots = false;
  cli.flag("stream-slots", 0, "fill the slots with non-temporal stores (ShmOptions::stream_slots)", stream_slots);
  if (!cli.parse(argc, argv)) return 0;
  if (smoke) rounds = 1, iters = 2;
  const size_t scale = smoke ? 1024 : 1;
  const size_t largest = (size_t{64} << 20) / scale;
  int missed = 0;
  auto verdict = [&](bool pass) {
    missed += pass ? 0 : 1;
    return smoke ? "smoke, not judged" : pass ? "PASS" : "MISS";
  };
  const int rank = world_rank(), size = world_size();
  auto say = [&](const char* format, auto... args) {
    if (rank == 0) std::printf(format, args...);
  };
  coll::MpiTypes types;
  coll::Context ctx;
  ctx.comm = MPI_COMM_WORLD;
  ctx.types = &types;
  ctx.rank = rank;
  ctx.size = size;
  coll::ShmOptions shm_options;
  shm_options.stream_slots = stream_slots;
  coll::ShmNode shm(MPI_COMM_WORLD, shm_options);
  HostTimer timer;

  const size_t max_count = largest / sizeof(float);
  auto in = page_aligned_floats(max_count), out = page_aligned_floats(max_count);
  const std::vector<Operation> operations{Operation::allreduce, Operation::allgather, Operation::broadcast};

  // One call of `operation` moving S = `bytes` (nccl-tests' S), by the library or through the segment, in
  // place (the input already in `out`, where algorithms.h puts it) or from `in`.
  // The operation's count and, in place, where its input sits in `out`, from the operations table.
  auto counts = [&](Operation operation, size_t bytes) { return coll::counts_for(operation, bytes, sizeof(float), size); };
  auto in_place_input = [&](Operation operation, size_t bytes) {
    return out.get() + coll::in_place_offsets(operation, counts(operation, bytes), sizeof(float), rank).send / sizeof(float);
  };
  auto call = [&](Operation operation, bool use_shm, size_t bytes, bool in_place = false) {
    const size_t count = counts(operation, bytes).count;
    const float* send = in_place ? in_place_input(operation, bytes) : in.get();
    if (use_shm) {
      shm.run(operation, send, out.get(), count, coll::DataType::float32, coll::RedOp::sum, 0);
      return;
    }
    coll::info(operation).run(coll::Algo::library, {send, out.get(), count, coll::DataType::float32}, ctx);
  };
  // Samples of one contender: each the max over ranks of a loop of back-to-back calls (at least ~4 MiB).
  auto timed = [&](int warmup, const std::function<void()>& once, size_t bytes) {
    const int ops = static_cast<int>(std::clamp<size_t>((size_t{4} << 20) / std::max<size_t>(bytes, 1), 1, 1024));
    auto samples = measure(MPI_COMM_WORLD, MeasureSpec{warmup, iters, 0, ops}, timer, [&] {
      for (int k = 0; k < ops; ++k) once();
    });
    for (double& s : samples) s = allreduce_max(MPI_COMM_WORLD, s);
    return samples;
  };
  // Inputs are small integers: every sum is exact, so a wrong element is a wrong result.
  auto fill_inputs = [&](size_t count) {
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(static_cast<int>((i * 13 + rank * 7) % 9) - 4);
  };
  auto check = [&](Operation operation, size_t bytes, bool in_place = false) {
    const coll::Counts c = counts(operation, bytes);
    const size_t count = c.count;
    fill_inputs(max_count);
    if (in_place) std::memcpy(in_place_input(operation, bytes), in.get(), c.send_elems * sizeof(float));
    call(operation, true, bytes, in_place);
    const size_t total = c.recv_elems;
    size_t wrong = 0;
    for (size_t i = 0; i < total; ++i) {
      float want = 0;
      auto input = [&](int r, size_t j) { return static_cast<float>(static_cast<int>((j * 13 + r * 7) % 9) - 4); };
      if (operation == Operation::allreduce)
        for (int r = 0; r < size; ++r) want += input(r, i);
      else if (operation == Operation::allgather)
        want = input(static_cast<int>(i / count), i % count);
      else
        want = input(0, i);
      wrong += out[i] != want;
    }
    if (wrong) throw RuntimeError("shm " + std::string(coll::name(operation)) + (in_place ? " in place" : "") +
                                  " of " + human_bytes(bytes) + ": " + std::to_string(wrong) + " wrong elements");
  };
  fill_inputs(max_count);
  say("# strata-bench-shm: %d ranks, %d rounds x %d samples per contender, medians of the max over ranks%s\n", size,
      rounds, iters, stream_slots ? "; slots filled with non-temporal stores" : "");
  say("# float sum; busbw = S/t x factor in GB/s (1e9 B/s), nccl-tests' S and factors; the sweep out of place\n");

  // 1: 64 MiB against memcpy (bytes copied per second by one rank while every rank copies at once).
  std::vector<double> copies;
  std::vector<std::vector<double>> large(2 * operations.size());  // [2 o + in_place]
  for (int round = 0; round < rounds; ++round) {
    auto c = measure(MPI_COMM_WORLD, MeasureSpec{round == 0 ? 2 : 0, iters, 0, 1}, timer, [&] {
      std::memcpy(out.get(), in.get(), largest);
    });
    copies.insert(copies.end(), c.begin(), c.end());
    for (size_t o = 0; o < operations.size(); ++o)
      for (bool in_place : {false, true}) {
        auto s = timed(round == 0 ? 2 : 0, [&] { call(operations[o], true, largest, in_place); }, largest);
        large[2 * o + in_place].insert(large[2 * o + in_place].end(), s.begin(), s.end());
      }
  }
  const double copy_bw = largest / median_of(copies);
  say("\n# memcpy of %s by every rank at once: %.3f GB/s copied per rank (median)\n", human_bytes(largest).c_str(),
      copy_bw / 1e9);
  say("%-10s %10s %14s %8s %14s %8s\n", "shm", "size", "out-of-place", "/memcpy", "in-place", "/memcpy");
  for (size_t o = 0; o < operations.size(); ++o) {
    double bw[2];
    for (bool in_place : {false, true}) {
      check(operations[o], largest, in_place);
      bw[in_place] = largest / median_of(large[2 * o + in_place]) * coll::bus_factor(operations[o], size);
    }
    say("%-10s %10s %14.3f %8.3f %14.3f %8.3f  (target in place >= 0.8: %s)\n",
        std::string(coll::name(operations[o])).c_str(), human_bytes(largest).c_str(), bw[0] / 1e9, bw[0] / copy_bw,
        bw[1] / 1e9, bw[1] / copy_bw, verdict(bw[1] / copy_bw >= 0.8));
  }
  say("# busbw in GB/s; out of place an allgather writes twice what it reads, bounding it near 0.67 at np 2\n");

  // 2: shm against the library, 1 KiB to 64 MiB.
  for (Operation operation : operations) {
    say("\n# %s: library against shm\n", std::string(coll::name(operation)).c_str());
    say("%10s %14s %14s %10s\n", "size", "library busbw", "shm busbw", "shm/lib");
    std::vector<size_t> sizes;
    std::vector<double> ratios;
    for (size_t bytes = (size_t{1} << 10) / std::min<size_t>(scale, 256); bytes <= largest; bytes *= 4) {
      std::vector<double> library, through_shm;
      for (int round = 0; round < rounds; ++round)
        for (bool use_shm : {false, true}) {
          auto s = timed(round == 0 ? 2 : 0, [&] { call(operation, use_shm, bytes); }, bytes);
          (use_shm ? through_shm : library).insert((use_shm ? through_shm : library).end(), s.begin(), s.end());
        }
      check(operation, bytes);
      const double factor = coll::bus_factor(operation, size);  // nccl-tests' factor
      const double lib_bw = bytes / median_of(library) * factor, shm_bw = bytes / median_of(through_shm) * factor;
      sizes.push_back(bytes);
      ratios.push_back(shm_bw / lib_bw);
      say("%10s %14.3f %14.3f %10.3f\n", human_bytes(bytes).c_str(), lib_bw / 1e9, shm_bw / 1e9, shm_bw / lib_bw);
    }
    // The smallest size from which shm is faster at every size measured.
    size_t from = sizes.size();
    while (from > 0 && ratios[from - 1] > 1.0) --from;
    if (from < sizes.size())
      say("%s: shm wins from %s up; shm/library at %s: %.3f\n", std::string(coll::name(operation)).c_str(),
          human_bytes(sizes[from]).c_str(), human_bytes(largest).c_str(), ratios.back());
    else
      say("%s: shm does not win at %s; shm/library there: %.3f\n", std::string(coll::name(operation)).c_str(),
          human_bytes(largest).c_str(), ratios.back());
  }

  STRATA_MPI_CHECK(MPI_Bcast(&missed, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (smoke) say("shm against memcpy and the library: smoke, not judged\n");
  if (missed && !smoke) say("%d figure(s) missed their target\n", missed);
  return missed && !smoke ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-bench-shm", [&] { return run_targets(argc, argv); });
}
