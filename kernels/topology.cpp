// Implementation of the topology query (see topology.h), through hwloc.
#include "kernels/topology.h"

#include <hwloc.h>

#include <memory>
#include <stdexcept>

namespace strata {

int64_t CpuTopology::last_level_cache_bytes() const {
  if (l3_bytes > 0) return l3_bytes * (l3_instances > 0 ? l3_instances : 1);
  if (l2_bytes > 0) return l2_bytes * (cores > 0 ? cores : 1);
  return l1d_bytes * (cores > 0 ? cores : 1);
}

namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology* topology) const { hwloc_topology_destroy(topology); }
};
using TopologyHandle = std::unique_ptr<hwloc_topology, TopologyDeleter>;

int64_t cache_size(hwloc_topology_t topology, hwloc_obj_type_t type, int* instances = nullptr) {
  int count = hwloc_get_nbobjs_by_type(topology, type);
  if (instances) *instances = count > 0 ? count : 0;
  if (count <= 0) return 0;
  return static_cast<int64_t>(hwloc_get_obj_by_type(topology, type, 0)->attr->cache.size);
}

}  // namespace

CpuTopology detect_topology() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) throw std::runtime_error("hwloc_topology_init failed");
  TopologyHandle topology(raw);
  if (hwloc_topology_load(raw) != 0) throw std::runtime_error("hwloc_topology_load failed");

  CpuTopology t;
  t.packages = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_PACKAGE);
  t.numa_nodes = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_NUMANODE);
  t.l1d_bytes = cache_size(raw, HWLOC_OBJ_L1CACHE);
  t.l2_bytes = cache_size(raw, HWLOC_OBJ_L2CACHE);
  t.l3_bytes = cache_size(raw, HWLOC_OBJ_L3CACHE, &t.l3_instances);

  // The CPUs the job may use (a Slurm cgroup restricts them; mpirun's per-rank binding does not), so a
  // measurement "on all cores" from one rank covers the node as the job sees it.
  hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(raw);
  int cores = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_CORE);
  for (int i = 0; i < cores; ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(raw, HWLOC_OBJ_CORE, static_cast<unsigned>(i));
    int first = -1, threads = 0;
    for (int cpu = hwloc_bitmap_first(core->cpuset); cpu >= 0; cpu = hwloc_bitmap_next(core->cpuset, cpu))
      if (hwloc_bitmap_isset(allowed, static_cast<unsigned>(cpu))) {
        if (first < 0) first = cpu;
        ++threads;
      }
    if (first < 0) continue;
    t.one_cpu_per_core.push_back(first);
    t.hardware_threads += threads;
  }
  t.cores = static_cast<int>(t.one_cpu_per_core.size());
  unsigned api = hwloc_get_api_version();
  t.source = "hwloc " + std::to_string(api >> 16) + "." + std::to_string((api >> 8) & 0xff) + "." +
             std::to_string(api & 0xff);
  return t;
}

}  // namespace strata
