// Cores and caches of this machine as hwloc sees them (restricted to the CPUs this process may use), and
// one CPU per core to pin the all-core measurements to.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

struct CpuTopology {
  int packages = 0;
  int numa_nodes = 0;
  int cores = 0;                  // physical cores this process may run on
  int hardware_threads = 0;       // processing units (SMT threads) this process may run on
  int64_t l1d_bytes = 0;          // per instance (0 when unknown)
  int64_t l2_bytes = 0;
  int64_t l3_bytes = 0;
  int l3_instances = 0;
  std::vector<int> one_cpu_per_core;  // OS CPU numbers, the first allowed hardware thread of each core
  std::string source;                 // "hwloc 2.9.0"

  int64_t last_level_cache_bytes() const;  // all instances of the largest cache level present
};

// Throws std::runtime_error when hwloc cannot load the topology.
CpuTopology detect_topology();

}  // namespace strata
