// The system description a prediction runs on: what one device computes, how fast its memory is, how fast each
// network tier moves bytes, and how much compute slows down while communication runs beside it. It is written
// by hand from spec sheets (project/systems/) or fitted from Strata's own result files (project/calibrate.h,
// `strata-project calibrate`); its file form is bench/project/system_json.h, every field documented in project/SYSTEM.md.
// Units are SI throughout: FLOP/s, B/s, s.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/operation.h"

namespace strata::project {

// Version 2 adds measured GEMM and attention points, attention efficiency curves, fitted collective models per
// algorithm and group kind, the contention of concurrent groups, the communication slowdown and the library's ring
// latency; version 1 files are read as version 2 descriptions without them.
inline constexpr int kSystemFormatVersion = 2;

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
  // What the points' first coordinate counts: "flops" of the call, or (attention curves only) "seq_kv", the keys'
  // sequence length, on which flash attention's efficiency depends at a given head dimension rather than on the
  // call's FLOPs (published flash-attention sweeps hold the tokens fixed and vary the sequence).
  std::string over = "flops";

  double at(double x) const;
};

// One measured GEMM, C (m, n) = A (m, k) W (n, k)^T: the median time of one call and its relative spread.
struct GemmPoint {
  std::int64_t m = 0, n = 0, k = 0;
  Quantity seconds;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

// One attention call's shape, flash-attention FLOP convention (docs/metrics.md).
struct AttentionShape {
  std::int64_t batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  bool causal = false;
  bool backward = false;  // the backward pass alone (2.5x the forward's FLOPs)
  double flops() const;   // forward 4 b h s_q s_kv d, half when causal; backward 2.5x
};

struct AttentionPoint {
  AttentionShape shape;
  Quantity seconds;
};

// One dtype's tensor or vector throughput and what was measured of it.
//
// A GEMM's time (Device::gemm_seconds): a measured point of exactly that shape gives its time; otherwise the
// efficiencies (flops / (peak * seconds)) of the points of similar aspect (m/k and n/k each within a factor 2 of
// the call's) are interpolated linearly in log10 FLOPs, when the call's FLOPs lie between theirs; outside them
// the roofline: max(flops / (peak * efficiency(flops)), bytes / (memory bandwidth * memory efficiency)), bytes
// = (mk + nk + mn) elements of the dtype. Attention (Device::attention_seconds) likewise: an exact point, else
// the points of the same pass, causality and head dimension interpolated in log FLOPs, else the pass's
// attention efficiency curve (the GEMM curve where the description has none).
struct ComputePeak {
  Quantity peak_flops;  // FLOP/s, dense
  EfficiencyCurve efficiency;
  std::map<std::string, EfficiencyCurve> attention_efficiency;  // by pass: "fwd", "bwd"; optional
  std::vector<GemmPoint> gemm_points;
  std::vector<AttentionPoint> attention_points;
};

// Bytes of one element of a dtype as GEMM inputs and outputs hold it (fp8: 1, fp16/bf16: 2, fp32/tf32: 4,
// fp64: 8); nothing for an unknown name.
std::optional<double> dtype_bytes(const std::string& dtype);

struct AttentionKernel {
  Quantity forward, backward;  // speed relative to the described kernel, by pass
};

struct Device {
  std::string name;
  std::string source;  // where the device's figures and its node size come from
  int devices_per_node = 0;
  std::map<std::string, ComputePeak> compute;  // by dtype: "fp64", "fp32", "tf32", "bf16", "fp16", "fp8"
  Quantity memory_bandwidth;                   // B/s, peak
  Quantity memory_efficiency;                  // achieved fraction of it in elementwise kernels
  std::optional<Quantity> memory_capacity;     // B of device memory (spec sheet); absent: not described
  // B/s the training step's elementwise kernels reach, by kernel (elementwise_kernel_of), and over every measured
  // kernel together (their bytes over their seconds); optional, measured by strata-elementwise at the step's shapes.
  std::map<std::string, Quantity, std::less<>> elementwise_kernels;
  std::optional<Quantity> elementwise_bandwidth;
  // Elementwise kernels the GEMM library applies in its epilogue (cuBLASLt's bias and bias-gradient epilogues, as
  // Megatron-LM and Transformer Engine call them): those traced ops cost nothing. One of kFusableIntoGemm.
  std::set<std::string, std::less<>> fused_into_gemm;
  // Seconds between two kernels queued back to back (the launch gap), added to each GEMM, attention and traced
  // elementwise kernel; absent: none.
  std::optional<Quantity> kernel_overhead;
  // Other fused attention kernels than the one the attention curves and points describe, by name (a framework's
  // choice, e.g. "flash-triton": llm-foundry's Triton FlashAttention): each pass's speed relative to that kernel
  // (0.5: twice its time; above 1: faster).
  std::map<std::string, AttentionKernel, std::less<>> attention_kernels;

  // From the efficiency curve alone; throws std::invalid_argument: no such dtype.
  double gemm_seconds(const std::string& dtype, double flops) const;
  // The measured points first (see ComputePeak), then the roofline; with the kernel overhead.
  double gemm_seconds(const std::string& dtype, std::int64_t m, std::int64_t n, std::int64_t k) const;
  // With the kernel overhead; `kernel`: one of attention_kernels (empty: the described one). Throws
  // std::invalid_argument: no such dtype or kernel.
  double attention_seconds(const std::string& dtype, const AttentionShape& shape, std::string_view kernel = {}) const;
  // Bytes at memory_bandwidth x memory_efficiency.
  double elementwise_seconds(double bytes) const;
  // A traced elementwise op: nothing when its kernel is fused into the GEMM; else its kernel's measured rate; a
  // kernel not measured, the measured kernels' rate together; a description without them, elementwise_seconds(bytes);
  // with the kernel overhead.
  double elementwise_seconds(std::string_view op_name, double bytes) const;
  // The kernel overhead's seconds (0 when the description has none).
  double launch_gap() const { return kernel_overhead ? kernel_overhead->value : 0; }
  // One kernel's own time, without the launch gap.
  double gemm_kernel_seconds(const ComputePeak& peak, const std::string& dtype, std::int64_t m, std::int64_t n,
                             std::int64_t k) const;
  double attention_kernel_seconds(const ComputePeak& peak, const AttentionShape& shape) const;
};

// The kernel of kernels/layers.h a traced elementwise op of the training step runs ("ln1", "ln2" and "lnf":
// "layernorm_forward"; "norm backward": "layernorm_backward"; "split heads" and "merge qkv": "permute_qkv"; "merge
// heads" and "split head grads": "permute_heads"; "bias": "add_bias"; "bias fill": "fill_bias"; "bias grad":
// "bias_gradient"; "accumulate grads": "accumulate"; "gelu",
// "gelu backward", "residual", "copy", "adamw"), as strata-elementwise names it; "" for the step's other elementwise
// ops (embedding, positions, cross-entropy, zeroing, the gradient norm).
std::string_view elementwise_kernel_of(std::string_view op_name);
// The elementwise kernels a GEMM library can apply in its epilogue (Device::fused_into_gemm).
inline constexpr std::string_view kFusableIntoGemm[] = {"fill_bias", "bias_gradient"};

// The collectives a description models: the operations of collectives/operation.h's vocabulary but sendrecv (a
// description's point-to-point is its tiers' latency and bandwidth), by their names there. Their bytes through each
// rank's link per byte of S are coll::bus_factor's, nccl-tests' (docs/metrics.md: S is one rank's buffer for
// allreduce, the whole gathered buffer for allgather and reduce_scatter).
std::vector<coll::Operation> all_collectives();
std::optional<coll::Operation> collective_from_name(const std::string& name);

// alpha + S * coll::bus_factor(n) / beta: a ring's latency-bandwidth model.
struct LatencyBandwidth {
  Quantity latency;    // alpha, s
  Quantity bandwidth;  // beta, B/s per rank's link
};

// One tier of the network: NVLink-class inside a node, the NIC between nodes. Collectives without a model of
// their own use the tier's latency and bandwidth; point-to-point transfers take latency + bytes / bandwidth.
struct NetworkTier {
  Quantity bandwidth;  // B/s per device, one direction
  Quantity latency;    // s
  std::map<coll::Operation, LatencyBandwidth> collectives;
  std::string source;  // how the tier was described: spec sheet, measured, emulated on one machine, not measured

  // Of `op` on this tier: its own model's where it has one, else the tier's (references: a prediction asks often).
  const Quantity& latency_of(coll::Operation op) const;
  const Quantity& bandwidth_of(coll::Operation op) const;
  double collective_seconds(coll::Operation op, double bytes, int ranks) const;
  double transfer_seconds(double bytes) const;
};

// Which ranks a collective's group spans: all on one node, one per node, or several nodes with several ranks
// each (two-level algorithms run both tiers).
enum class GroupKind { intra_node, inter_node, hierarchical };

const char* group_kind_name(GroupKind kind);
std::optional<GroupKind> group_kind_from_name(const std::string& name);
// The kind of a group whose members sit on these nodes (one entry per member).
GroupKind group_kind_of(const std::vector<int>& node_of_member);
// The fewest members the group has on any of its nodes (1 for a group of one member per node).
int members_per_node(const std::vector<int>& node_of_member);

// alpha + S * coll::bus_factor(n) / beta for the sizes S up to `up_to_bytes` (above the previous range's).
struct SizeRange {
  double up_to_bytes = std::numeric_limits<double>::infinity();  // S, B; infinite for the last range
  LatencyBandwidth model;
  double residual = 0;  // RMS of (fit - measured) / measured over the range's sizes
  int sizes = 0;        // measured sizes the range was fitted on (0: written by hand)
};

// Echo's chunked form on one tier (docs/strategies.md#projection-echo): the bus bytes x = S * coll::bus_factor(n) move in
// ceil(x / chunk_bytes) chunks; t = latency + chunks * per_chunk + x / bandwidth.
struct ChunkedModel {
  Quantity latency;        // s
  double chunk_bytes = 0;  // B of bus traffic per chunk
  Quantity per_chunk;      // s per chunk
  Quantity bandwidth;      // B/s, the per-byte term (Echo's reduction throughput and transfer together)
  double residual = 0;     // RMS of (fit - measured) / measured over every size
  int sizes = 0;
};

// One measured size of a collective: the median time of one call over the runs that timed it, and their spread.
struct CollectivePoint {
  double bytes = 0;  // S (nccl-tests)
  Quantity seconds;
};

enum class CollectiveForm { latency_bandwidth, chunked };
const char* collective_form_name(CollectiveForm form);

// One collective's time on one algorithm and group kind, fitted from measured sizes (or written by hand).
struct CollectiveModel {
  coll::Operation op = coll::Operation::allreduce;
  std::string algorithm;  // as strata-collective names it: library, ring, hierarchical, horing, shm, ...
  GroupKind group = GroupKind::intra_node;
  int ranks = 0;          // the group size it was measured at; other sizes scale through the bus factor
  // How its sizes were timed (strata-collective --mode): false, pipelined (back-to-back calls, nccl-tests: what
  // overlapped and queued collectives see); true, blocking (one call between barriers, OSU: what a rank that waits
  // for a collective alone between its compute ops sees).
  bool blocking = false;
  CollectiveForm form = CollectiveForm::latency_bandwidth;
  std::vector<SizeRange> ranges;  // latency_bandwidth: by increasing up_to_bytes, the last unbounded
  ChunkedModel chunked;           // chunked
  std::map<std::string, double> compared;  // each form's relative residual on the same sizes, the kept one included
  // The measured sizes, by increasing bytes. A call of the measured group size between the first and the last takes
  // their time, interpolated in log time over log bytes between two sizes, as GEMMs take their measured shapes' (a
  // fit over a range of sizes misses single sizes by its residual); other calls take the fitted form.
  std::vector<CollectivePoint> points;
  std::string source;

  double seconds(double bytes, int ranks) const;
};

// One protocol of a communication library's ring, as the library's own tuning model costs it (NCCL:
// src/graph/tuning.cc; docs/gpu-descriptions.md): a ring of `steps` steps, `inter_steps` of them from one node to the
// next, waits base + (steps - inter_steps) x intra_step + inter_steps x inter_step, and moves its bus bytes at
// bandwidth_factor x the tiers' bandwidth.
struct RingProtocol {
  Quantity base;                // s
  Quantity intra_step;          // s per step inside a node
  Quantity inter_step;          // s per step between nodes
  double bandwidth_factor = 1;  // in (0, 1]
  // With one rank per node every rank sends and receives through its NIC itself (NCCL: LL128 at 0.7, not 0.92).
  double bandwidth_factor_one_per_node = 1;  // in (0, 1]
};

// Why a ring all-gather or reduce-scatter slows with its size although its bytes per link do not: every rank's
// block passes n - 1 links one after the other. The library picks the fastest of its protocols per call.
struct RingLatency {
  std::map<std::string, RingProtocol> protocols;  // by the library's name: simple, ll128, ...
  std::string source;

  // The fastest protocol's time for `bus_bytes` (S x bus factor) on a ring of `ranks` ranks over `nodes` nodes
  // (n - 1 steps, nodes - 1 of them between nodes) whose slowest link moves `bandwidth` B/s.
  double seconds(double bus_bytes, double bandwidth, int ranks, int nodes) const;
};

// The algorithms a description's ring latency models: the library's own (NCCL's rings) and Strata's ring. Strata's
// hierarchical and HO-Ring algorithms take other paths, and a fitted model has its latency in its fit.
bool runs_as_library_ring(std::string_view algorithm);

struct System {
  int version = kSystemFormatVersion;
  std::string name;
  std::string comment;
  Device device;
  NetworkTier intra_node;
  NetworkTier inter_node;
  // Absent: a collective's latency is its tier's, whatever the group's size. Present: a ring all-gather or
  // reduce-scatter across nodes without a fitted model takes at least the ring's time (RingLatency).
  std::optional<RingLatency> ring_latency;
  // Fitted per collective, algorithm and group kind; a collective without one takes its tier's model.
  std::vector<CollectiveModel> collectives;
  // A collective running while another group's collective runs on the same ranks takes (1 + c) times as long
  // (strata-collective --mixed). Absent: not measured (not yet used by the simulator).
  std::optional<Quantity> collective_contention;
  // Echo's s: a compute kernel overlapped with communication for a fraction r of its work takes
  // t_alone ((1 - r) + r (1 + s)).
  Quantity overlap_slowdown;
  // The other direction: a collective overlapped with compute takes (1 + value) times as long (strata-interference);
  // the simulator runs a collective at 1 / (1 + value) while a traced member of its group computes. Absent: not
  // slowed.
  std::optional<Quantity> communication_slowdown;

  // The time of collective `op` of S = `bytes` on `ranks` ranks of a group of `kind`: the fitted model of that
  // operation, algorithm and kind (of the nearest measured group size), else the tier's model. A hierarchical group
  // with `per_node` members on each node crosses nodes on all their NICs at once, as NCCL's rings and trees do on
  // rail-optimised nodes: latency of the inter-node tier + S x bus_factor / min(intra-node bandwidth, per_node x
  // inter-node bandwidth) (with one member per node, the inter-node tier's own model). An all-gather or
  // reduce-scatter across nodes on a ring (runs_as_library_ring) takes at least `ring_latency`'s time at that
  // bandwidth, on ceil(ranks / per_node) nodes (the node count of an even group; per_node is the fewest members).
  // `blocking`: the caller waits for it alone (simulate.h's Op::blocking). A call takes a model measured at its group
  // size, of its own mode (blocking, or pipelined) before the other's; else the nearest size of its own mode, then of
  // the other; then the tier's.
  double collective_seconds(coll::Operation op, std::string_view algorithm, GroupKind kind, double bytes, int ranks,
                            int per_node = 1, bool blocking = false) const;
  const CollectiveModel* find_collective(coll::Operation op, std::string_view algorithm, GroupKind kind, int ranks,
                                         bool blocking = false) const;
};

// The first problem with a description (missing, negative, non-finite or out-of-range values), named by its
// field as the JSON form spells it; nothing when the description is usable.
std::optional<std::string> find_problem(const System& system);

}  // namespace strata::project
