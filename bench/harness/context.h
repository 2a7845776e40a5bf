// The context recorded with every run, so a result can be explained later: where each rank ran (host,
// node, local rank, CPU affinity, device), whether the node was oversubscribed and already loaded, which
// libraries and build produced the numbers, how the job was launched, and the Slurm variables if any.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "bench/harness/check.h"
#include "bench/harness/machine.h"
#include "collectives/mpi.h"

namespace strata {

struct RankPlacement {
  int rank = 0;
  std::string host;
  int node_index = 0;     // nodes numbered by their lowest world rank
  int local_rank = 0;     // rank within the node (MPI_Comm_split_type, shared memory)
  int ranks_on_node = 1;
  std::string affinity;   // CPU list this rank may run on, e.g. "0-1"
  std::string device;     // "cpu" or the GPU it drives
};

struct RunContext {
  std::vector<RankPlacement> ranks;        // complete on rank 0; others hold their own entry only
  RankPlacement self;
  int n_nodes = 1;
  int n_ranks = 1;
  std::string ranks_per_node;              // "2" or, for uneven nodes, "2,1"
  bool oversubscribed = false;             // some node runs more ranks than it has CPUs
  std::map<std::string, std::string> run_attrs;  // launcher, slurm ids, counts, command line
  std::map<std::string, std::string> env;        // library versions, build, machine state
  NodeMachine machine;                           // this rank's node, measured (or read from the job's cache)
  BlasCoreChoice blas_core;                      // which OpenBLAS kernels run, and why
};

std::string command_line(int argc, const char* const* argv);
std::string cpu_list(const std::vector<int>& cpus);  // {0,1,2,5} -> "0-2,5"
// Collective over MPI_COMM_WORLD. `device` names what this rank drives.
RunContext collect_context(int argc, const char* const* argv, const std::string& device);

}  // namespace strata
