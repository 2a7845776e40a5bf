// A job of shared-memory allreduces for tests/integration/test_shm.py. Every rank prints the shared-memory
// files it maps ("rank R maps PATH", from /proc/self/maps) once the segment exists, so the test can look for
// them after the job; then the ranks run allreduces of 16 MiB and check them. With STRATA_SHM_KILL_RANK=R, rank R
// starts one and kills itself with SIGKILL in the middle of it, while the others wait on its chunks; with
// STRATA_SHM_THROW_RANK=R, rank R throws before the second while the others start it. With
// STRATA_SHM_REGISTERED=1 the allreduces run on registered buffers (ShmNode::allocate, the direct path), whose
// segments are mapped, and printed, too.
#include <mpi.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <set>
#include <string>
#include <vector>

#include "collectives/mpi.h"
#include "collectives/shm.h"

namespace {

using namespace strata;

// Files of a tmpfs (/dev/shm) or of a backing directory the test names in STRATA_SHM_DIR.
std::set<std::string> shared_files_mapped() {
  const char* dir = std::getenv("STRATA_SHM_DIR");
  const std::string prefix = dir ? dir : "/dev/shm/";
  std::set<std::string> paths;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const auto at = line.find(prefix);
    if (at != std::string::npos) paths.insert(line.substr(at));
  }
  return paths;
}

int run() {
  const int rank = world_rank();
  coll::ShmNode node(MPI_COMM_WORLD);
  const std::size_t count = (std::size_t{16} << 20) / sizeof(float);
  const bool registered = std::getenv("STRATA_SHM_REGISTERED") && std::atoi(std::getenv("STRATA_SHM_REGISTERED"));
  coll::ShmBuffer registered_in, registered_out;
  std::vector<float> own_in, own_out;
  float *in = nullptr, *out = nullptr;
  if (registered) {
    registered_in = node.allocate(count * sizeof(float));
    registered_out = node.allocate(count * sizeof(float));
    in = registered_in.as<float>(), out = registered_out.as<float>();
  } else {
    own_in.resize(count), own_out.resize(count);
    in = own_in.data(), out = own_out.data();
  }
  std::fill(in, in + count, static_cast<float>(rank + 1));
  for (const std::string& path : shared_files_mapped()) std::printf("rank %d maps %s\n", rank, path.c_str());
  std::fflush(stdout);
  STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));

  const char* victim = std::getenv("STRATA_SHM_KILL_RANK");
  const float want = static_cast<float>(world_size() * (world_size() + 1) / 2);
  const char* thrower = std::getenv("STRATA_SHM_THROW_RANK");
  for (int call = 0; call < 3; ++call) {
    // An error on one rank between calls, while the others start the next: the node's destructor must not
    // wait for them (in the collective free), or the job hangs instead of aborting.
    if (thrower && std::atoi(thrower) == rank && call == 1) throw std::runtime_error("injected failure between calls");
    const std::uint64_t direct_before = node.direct_operations();
    coll::Work work = node.iallreduce(in, out, count, coll::DataType::float32, coll::RedOp::sum);
    if (node.direct_operations() != direct_before + (registered ? 1 : 0))
      throw std::runtime_error("the allreduce did not take the path its buffers call for");
    if (victim && std::atoi(victim) == rank && call == 1) {
      // A few chunks in, the others waiting for this rank's next one; on the direct path the others wait for
      // it to arrive or to finish its share.
      for (int i = 0; i < 100; ++i) work.test();
      std::printf("rank %d: killing itself in the middle of an allreduce\n", rank);
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    work.wait();
    for (std::size_t i = 0; i < count; i += 4099)
      if (out[i] != want) throw std::runtime_error("wrong sum at element " + std::to_string(i));
  }
  STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  if (rank == 0) std::printf("shm job complete\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession session(&argc, &argv);  // outside the try: finalising waits for the other ranks
  try {
    return run();
  } catch (const std::exception& e) {
    // One write: MPI_Abort's own message must not land inside this line (std::cerr writes each piece apart).
    std::fprintf(stderr, "strata-test-shm-job: rank %d: %s; aborting\n", world_rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
