// Memory bandwidth beyond the last-level cache, as STREAM measures it: copy (c[i] = a[i], through memcpy) and triad
// (a[i] = b[i] + s * c[i]) over arrays of doubles, on one core and on every core at once (each thread owns a
// slice it touched first). Bytes are counted as STREAM counts them: 16 per element for copy, 24 for triad
// (the write-allocate read of the destination is not counted). The median of the trials is reported.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/topology.h"

namespace strata {

struct BandwidthFigure {
  double one_core = 0;   // B/s
  double all_cores = 0;  // B/s
};

struct MemoryBandwidth {
  BandwidthFigure copy;
  BandwidthFigure triad;
  int64_t array_bytes = 0;  // each of the three arrays
  int cores = 0;
};

struct BandwidthOptions {
  int64_t array_bytes = 64 << 20;
  int trials = 3;
  std::vector<int> cpus;  // one CPU per core for the all-core figures; empty: none
};

// Arrays of twice the last-level cache (so no trial runs from cache), at least 32 MiB and at most 256 MiB
// each: a virtual machine often reports its host's whole cache, of which it holds only a share.
int64_t bandwidth_array_bytes(const CpuTopology& topology);

MemoryBandwidth measure_memory_bandwidth(const BandwidthOptions& options);

}  // namespace strata
