// The system description a prediction runs on: what one device computes, how fast its memory is, how fast each
// network tier moves bytes, and how much compute slows down while communication runs beside it. It is written
// by hand from spec sheets (project/systems/) or, later, fitted from Strata's own result files; its file form
// is bench/system_json.h. Units are SI throughout: FLOP/s, B/s, s.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace strata::project {

inline constexpr int kSystemFormatVersion = 1;

// A figure with its relative spread (0.1: the true value is believed within +-10%) and where it came from.
struct Quantity {
  double value = 0;
  double relative_spread = 0;
  std::string source;
};

// Achieved fraction of peak as a function of the FLOPs of one call: piecewise-linear in log10(FLOPs) between
// the points, constant beyond the first and last. Small calls reach a small fraction of peak; large ones most.
struct EfficiencyPoint {
  double flops = 0;
  double efficiency = 0;
};

struct EfficiencyCurve {
  std::vector<EfficiencyPoint> points;  // FLOPs strictly increasing
  double relative_spread = 0;
  std::string source;

  double at(double flops) const;
};

// One dtype's tensor or vector throughput: GEMM and attention of that dtype take
// flops / (peak_flops * efficiency(flops)).
struct ComputePeak {
  Quantity peak_flops;  // FLOP/s, dense
  EfficiencyCurve efficiency;
};

struct Device {
  std::string name;
  std::string source;  // where the device's figures and its node size come from
  int devices_per_node = 0;
  std::map<std::string, ComputePeak> compute;  // by dtype: "fp64", "fp32", "tf32", "bf16", "fp16", "fp8"
  Quantity memory_bandwidth;                   // B/s, peak
  Quantity memory_efficiency;                  // achieved fraction of it in elementwise kernels

  double gemm_seconds(const std::string& dtype, double flops) const;  // throws std::invalid_argument: no such dtype
  double elementwise_seconds(double bytes) const;
};

// The collectives the cost model knows, with the nccl-tests bus factors of metrics.md.
enum class CollectiveOp { allreduce, allgather, reduce_scatter, alltoall, broadcast, reduce };

const char* collective_name(CollectiveOp op);
std::optional<CollectiveOp> collective_from_name(const std::string& name);
std::vector<CollectiveOp> all_collectives();

// Bytes through each rank's link per byte of S (metrics.md: S is one rank's buffer for allreduce, the whole
// gathered buffer for allgather and reduce_scatter): 2(n-1)/n for allreduce, (n-1)/n for allgather,
// reduce_scatter and alltoall, 1 for broadcast and reduce.
double bus_factor(CollectiveOp op, int ranks);

// alpha + S * bus_factor(n) / beta: a ring's latency-bandwidth model.
struct LatencyBandwidth {
  Quantity latency;    // alpha, s
  Quantity bandwidth;  // beta, B/s per rank's link
};

// One tier of the network: NVLink-class inside a node, the NIC between nodes. Collectives without a model of
// their own use the tier's latency and bandwidth; point-to-point transfers take latency + bytes / bandwidth.
struct NetworkTier {
  Quantity bandwidth;  // B/s per device, one direction
  Quantity latency;    // s
  std::map<CollectiveOp, LatencyBandwidth> collectives;

  LatencyBandwidth model(CollectiveOp op) const;
  double collective_seconds(CollectiveOp op, double bytes, int ranks) const;
  double transfer_seconds(double bytes) const;
};

struct System {
  int version = kSystemFormatVersion;
  std::string name;
  std::string comment;
  Device device;
  NetworkTier intra_node;
  NetworkTier inter_node;
  // Echo's s: a compute kernel overlapped with communication for a fraction r of its work takes
  // t_alone ((1 - r) + r (1 + s)).
  Quantity overlap_slowdown;
};

// The first problem with a description (missing, negative, non-finite or out-of-range values), named by its
// field as the JSON form spells it; nothing when the description is usable.
std::optional<std::string> find_problem(const System& system);

}  // namespace strata::project
