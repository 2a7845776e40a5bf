// strata-bench-shm: the shared-memory collectives (collectives/shm.h) against this machine's copy bound and
// against the MPI library, measured side by side in one run (np 2 expected), printed against the target. shm
// runs on two sets of buffers: registered (ShmNode::allocate, the direct path: one pass over the data, as
// NCCL's registered user buffers) and the caller's own (staged through the slots).
//   1. 64 MiB allreduce, allgather and broadcast busbw against the memcpy bandwidth of one rank while every
//      rank copies at once, in place (target >= 0.8, judged on registered buffers; the staged figure is
//      reported) and out of place (reported: at np 2 an allgather out of place reads S/2 and writes S per
//      rank where a memcpy of S reads and writes S, so where memory bandwidth is the bound it cannot pass
//      0.5 / 0.75 = 0.67 of memcpy);
//   2. shm on both sets against the library at 1 KiB-64 MiB for the same three, out of place: busbw per size,
//      the size from which shm wins at every larger size, and the ratio at 64 MiB (reported, not judged).
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

#include "bench/harness/harness.h"
#include "bench/harness/buffers.h"
#include "collectives/algorithms.h"
#include "collectives/shm.h"
#include "collectives/types.h"

namespace {

using namespace strata;
using coll::Operation;

// Who runs a call, and on which buffers: the library and the slots on the caller's own, the direct path on registered
// ones.
enum Contender { library, staged, registered };

// Inputs are small integers: every sum is exact, so a wrong element is a wrong result.
float input(int rank, size_t i) { return static_cast<float>(static_cast<int>((i * 13 + rank * 7) % 9) - 4); }

class ShmBench {
 public:
  ShmBench(int rounds, int iters, bool smoke, bool stream_slots)
      : rounds_(rounds), iters_(iters), smoke_(smoke), scale_(smoke ? 1024 : 1), largest_((size_t{64} << 20) / scale_),
        rank_(world_rank()), size_(world_size()), shm_(MPI_COMM_WORLD, shm_options(stream_slots)),
        own_in_(page_aligned_floats(largest_ / sizeof(float))), own_out_(page_aligned_floats(largest_ / sizeof(float))),
        registered_in_(shm_.allocate(largest_)), registered_out_(shm_.allocate(largest_)) {
    ctx_.comm = MPI_COMM_WORLD;
    ctx_.types = &types_;
    ctx_.rank = rank_;
    ctx_.size = size_;
    fill_inputs(own_in_.get());
    fill_inputs(registered_in_.as<float>());
    std::memset(registered_out_.data(), 0, largest_);  // its pages in place before anything is timed
  }

  // 1: 64 MiB against memcpy (bytes copied per second by one rank while every rank copies at once); the registered
  // buffers' in-place busbw judged against 0.8 of it.
  void against_memcpy() {
    std::vector<double> copies;
    std::vector<std::vector<double>> large(4 * kOperations.size());  // [4 o + 2 (who == registered) + in_place]
    for (int round = 0; round < rounds_; ++round) {
      auto c = measure(MPI_COMM_WORLD, MeasureSpec{round == 0 ? 2 : 0, iters_, 0, 1}, timer_, [&] {
        std::memcpy(own_out_.get(), own_in_.get(), largest_);
      });
      copies.insert(copies.end(), c.begin(), c.end());
      for (size_t o = 0; o < kOperations.size(); ++o)
        for (Contender who : {registered, staged})
          for (bool in_place : {false, true}) {
            auto s = timed(round == 0 ? 2 : 0, [&] { call(kOperations[o], who, largest_, in_place); }, largest_);
            auto& into = large[4 * o + 2 * (who == registered) + in_place];
            into.insert(into.end(), s.begin(), s.end());
          }
    }
    const double copy_bw = largest_ / median_of(copies);
    print_on_root("\n# memcpy of %s by every rank at once: %.3f GB/s copied per rank (median)\n", human_bytes(largest_).c_str(),
        copy_bw / 1e9);
    for (Contender who : {registered, staged}) {
      print_on_root(who == registered ? "# shm, registered buffers (one pass, as NCCL's registered user buffers): judged\n"
                            : "# shm, staged through the slots (the caller's own buffers): reported, not judged\n");
      print_on_root("%-10s %10s %14s %8s %14s %8s\n", "shm", "size", "out-of-place", "/memcpy", "in-place", "/memcpy");
      for (size_t o = 0; o < kOperations.size(); ++o) {
        double bw[2];
        for (bool in_place : {false, true}) {
          check(kOperations[o], who, largest_, in_place);
          bw[in_place] = largest_ / median_of(large[4 * o + 2 * (who == registered) + in_place]) *
                         coll::bus_factor(kOperations[o], size_);
        }
        print_on_root("%-10s %10s %14.3f %8.3f %14.3f %8.3f", std::string(coll::name(kOperations[o])).c_str(),
            human_bytes(largest_).c_str(), bw[0] / 1e9, bw[0] / copy_bw, bw[1] / 1e9, bw[1] / copy_bw);
        if (who == registered)
          print_on_root("  (target in place >= 0.8, registered buffers: %s)\n", verdict(bw[1] / copy_bw >= 0.8));
        else
          print_on_root("  (staged: not judged)\n");
      }
    }
    print_on_root("# busbw in GB/s; out of place an allgather writes twice what it reads, bounding it near 0.67 at np 2\n");
  }

  // 2: shm, staged and registered, against the library, 1 KiB to 64 MiB; where shm starts to win.
  void against_library(Operation operation) {
    print_on_root("\n# %s: library against shm staged and shm on registered buffers\n", std::string(coll::name(operation)).c_str());
    print_on_root("%10s %14s %14s %10s %14s %10s\n", "size", "library busbw", "staged busbw", "staged/lib", "registered",
        "reg/lib");
    std::vector<size_t> sizes;
    std::vector<double> ratios[2];  // staged, registered
    for (size_t bytes = (size_t{1} << 10) / std::min<size_t>(scale_, 256); bytes <= largest_; bytes *= 4) {
      std::vector<double> samples[3];  // by Contender
      for (int round = 0; round < rounds_; ++round)
        for (Contender who : {library, staged, registered}) {
          auto s = timed(round == 0 ? 2 : 0, [&] { call(operation, who, bytes); }, bytes);
          samples[who].insert(samples[who].end(), s.begin(), s.end());
        }
      check(operation, staged, bytes);
      check(operation, registered, bytes);
      const double factor = coll::bus_factor(operation, size_);  // nccl-tests' factor
      double bw[3];
      for (Contender who : {library, staged, registered}) bw[who] = bytes / median_of(samples[who]) * factor;
      sizes.push_back(bytes);
      ratios[0].push_back(bw[staged] / bw[library]);
      ratios[1].push_back(bw[registered] / bw[library]);
      print_on_root("%10s %14.3f %14.3f %10.3f %14.3f %10.3f\n", human_bytes(bytes).c_str(), bw[library] / 1e9,
          bw[staged] / 1e9, bw[staged] / bw[library], bw[registered] / 1e9, bw[registered] / bw[library]);
    }
    // The smallest size from which shm is faster at every size measured.
    for (int set = 0; set < 2; ++set) {
      const char* label = set == 0 ? "shm staged" : "shm registered";
      size_t from = sizes.size();
      while (from > 0 && ratios[set][from - 1] > 1.0) --from;
      if (from < sizes.size())
        print_on_root("%s: %s wins from %s up; %s/library at %s: %.3f\n", std::string(coll::name(operation)).c_str(), label,
            human_bytes(sizes[from]).c_str(), label, human_bytes(largest_).c_str(), ratios[set].back());
      else
        print_on_root("%s: %s does not win at %s; %s/library there: %.3f\n", std::string(coll::name(operation)).c_str(), label,
            human_bytes(largest_).c_str(), label, ratios[set].back());
    }
  }

  // Rank 0's verdicts, on every rank.
  int missed() {
    STRATA_MPI_CHECK(MPI_Bcast(&missed_, 1, MPI_INT, 0, MPI_COMM_WORLD));
    return missed_;
  }

  static inline const std::vector<Operation> kOperations{Operation::allreduce, Operation::allgather, Operation::broadcast};

 private:
  struct Buffers {
    float* in;
    float* out;
  };

  static coll::ShmOptions shm_options(bool stream_slots) {
    coll::ShmOptions o;
    o.stream_slots = stream_slots;
    return o;
  }
  const char* verdict(bool pass) {
    missed_ += pass ? 0 : 1;
    return smoke_ ? "smoke, not judged" : pass ? "PASS" : "MISS";
  }
  Buffers buffers(Contender who) {
    return who == registered ? Buffers{registered_in_.as<float>(), registered_out_.as<float>()}
                             : Buffers{own_in_.get(), own_out_.get()};
  }
  void fill_inputs(float* in) const {
    for (size_t i = 0; i < largest_ / sizeof(float); ++i) in[i] = input(rank_, i);
  }
  // The operation's count and, in place, where its input sits in `out`, from the operations table.
  coll::Counts counts(Operation operation, size_t bytes) const { return coll::counts_for(operation, bytes, sizeof(float), size_); }
  float* in_place_input(Operation operation, size_t bytes, float* out) const {
    return out + coll::in_place_offsets(operation, counts(operation, bytes), sizeof(float), rank_).send / sizeof(float);
  }
  // One call of `operation` moving S = `bytes` (nccl-tests' S), in place (the input already in `out`, where
  // algorithms.h puts it) or from `in`.
  void call(Operation operation, Contender who, size_t bytes, bool in_place = false) {
    const size_t count = counts(operation, bytes).count;
    const Buffers b = buffers(who);
    const float* send = in_place ? in_place_input(operation, bytes, b.out) : b.in;
    if (who == library) {
      coll::info(operation).run(coll::Algo::library, {send, b.out, count, coll::DataType::float32}, ctx_);
      return;
    }
    shm_.run(operation, send, b.out, count, coll::DataType::float32, coll::RedOp::sum, 0);
  }
  // Samples of one contender: each the max over ranks of a loop of back-to-back calls (at least ~4 MiB).
  std::vector<double> timed(int warmup, const std::function<void()>& once, size_t bytes) {
    const int ops = static_cast<int>(std::clamp<size_t>((size_t{4} << 20) / std::max<size_t>(bytes, 1), 1, 1024));
    auto samples = measure(MPI_COMM_WORLD, MeasureSpec{warmup, iters_, 0, ops}, timer_, [&] {
      for (int k = 0; k < ops; ++k) once();
    });
    for (double& s : samples) s = allreduce_max(MPI_COMM_WORLD, s);
    return samples;
  }
  void check(Operation operation, Contender who, size_t bytes, bool in_place = false) {
    const coll::Counts c = counts(operation, bytes);
    const size_t count = c.count;
    const Buffers b = buffers(who);
    fill_inputs(b.in);
    if (in_place) std::memcpy(in_place_input(operation, bytes, b.out), b.in, c.send_elems * sizeof(float));
    call(operation, who, bytes, in_place);
    size_t wrong = 0;
    for (size_t i = 0; i < c.recv_elems; ++i) {
      float want = 0;
      if (operation == Operation::allreduce)
        for (int r = 0; r < size_; ++r) want += input(r, i);
      else if (operation == Operation::allgather)
        want = input(static_cast<int>(i / count), i % count);
      else
        want = input(0, i);
      wrong += b.out[i] != want;
    }
    if (wrong) throw RuntimeError("shm " + std::string(coll::name(operation)) + (in_place ? " in place" : "") +
                                  (who == registered ? " on registered buffers" : "") + " of " + human_bytes(bytes) +
                                  ": " + std::to_string(wrong) + " wrong elements");
  }

  const int rounds_, iters_;
  const bool smoke_;
  const size_t scale_, largest_;
  const int rank_, size_;
  coll::MpiTypes types_;
  coll::Context ctx_;
  coll::ShmNode shm_;
  HostTimer timer_;
  PageAlignedFloats own_in_, own_out_;
  coll::ShmBuffer registered_in_, registered_out_;
  int missed_ = 0;
};

int run_targets(int argc, char** argv) {
  int rounds = 5, iters = 10;
  bool smoke = false, stream_slots = false;
  Cli cli("strata-bench-shm", "Shared-memory collectives against memcpy and the MPI library (run with mpirun -np 2).");
  cli.option("rounds", 0, "alternating rounds per contender", rounds, 1);
  cli.option("iters", 'n', "timed samples per round", iters, 1);
  cli.flag("smoke", 0, "tiny run for the test suite: sizes / 1024, 1 round of 2; targets are not judged", smoke);
  cli.flag("stream-slots", 0, "fill the slots with non-temporal stores (ShmOptions::stream_slots)", stream_slots);
  if (!cli.parse(argc, argv)) return 0;
  if (smoke) rounds = 1, iters = 2;
  ShmBench bench(rounds, iters, smoke, stream_slots);
  print_on_root("# strata-bench-shm: %d ranks, %d rounds x %d samples per contender, medians of the max over ranks%s\n",
      world_size(), rounds, iters, stream_slots ? "; slots filled with non-temporal stores" : "");
  print_on_root("# float sum; busbw = S/t x factor in GB/s (1e9 B/s), nccl-tests' S and factors; the sweep out of place\n");
  bench.against_memcpy();
  for (Operation operation : ShmBench::kOperations) bench.against_library(operation);
  const int missed = bench.missed();
  if (smoke) print_on_root("shm against memcpy and the library: smoke, not judged\n");
  if (missed && !smoke) print_on_root("%d figure(s) missed their target\n", missed);
  return missed && !smoke ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-bench-shm", [&] { return run_targets(argc, argv); });
}
