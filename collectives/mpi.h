// MPI handles with owners: the library session (init/finalize) and communicators that free themselves,
// plus the few gathers the harness needs (strings and doubles to rank 0).
#pragma once

#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "collectives/mpi_error.h"

namespace strata {

// Initialises MPI (funnelled threads: only the main thread calls MPI) and finalises it on destruction.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  ~MpiSession();
};

// Owns a communicator created by split or dup and frees it on destruction.
class Comm {
 public:
  Comm() = default;
  explicit Comm(MPI_Comm comm) : comm_(comm) {}
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  Comm(Comm&& other) noexcept : comm_(std::exchange(other.comm_, MPI_COMM_NULL)) {}
  Comm& operator=(Comm&& other) noexcept {
    if (this != &other) {
      release();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    }
    return *this;
  }
  ~Comm() { release(); }
  MPI_Comm get() const { return comm_; }
  int rank() const;
  int size() const;

 private:
  void release() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF)
      MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
};

int world_rank();
int world_size();
Comm split(MPI_Comm comm, int color, int key);
Comm split_shared_memory(MPI_Comm comm);  // the ranks of this node
// Each world rank's node: ranks sharing memory (MPI_Comm_split_type) form a node, and nodes are numbered in
// the order of their lowest world rank, so every rank derives the same numbering. Collective over the world.
std::vector<int> shared_memory_node_of_rank();
// World ranks of a communicator's members, in its rank order.
std::vector<int> world_ranks_of(MPI_Comm comm);

// Rank `root` receives every rank's string (in rank order); others receive an empty vector.
std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& mine, int root = 0);
// Rank `root` receives the concatenation of every rank's values; all ranks must pass the same count.
std::vector<double> gather_doubles(MPI_Comm comm, const std::vector<double>& mine, int root = 0);
std::string broadcast_string(MPI_Comm comm, const std::string& value, int root = 0);
double allreduce_max(MPI_Comm comm, double value);
// Whether the MPI library takes device pointers: "yes", "no", or "unknown" (no way to ask this library).
std::string mpi_cuda_awareness();

}  // namespace strata
