// The timeline of one training step on a system (Echo's event-driven composer, docs/strategies.md#projection-echo): each
// traced rank's operation graph, its compute and communication streams, collectives that wait for their
// group, point-to-point transfers, and compute slowed where communication runs beside it.
//
// Semantics, all of them:
// - Ops on one stream run in the order of the rank's list; an op is reached when the op before it on its stream
//   has ended and every op it depends on (earlier ops of the same rank, any stream) has ended.
// - Compute ops (timed, gemm, attention, elementwise) start when reached. A GEMM of dtype d takes its measured
//   time where the system has points for it, else 2mnk / (peak_d * efficiency_d(2mnk)) or its memory traffic's
//   time, whichever is longer (Device::gemm_seconds, system.h); attention counts flash-attention FLOPs
//   (docs/metrics.md) the same way (Device::attention_seconds); an elementwise kernel its measured rate, else bytes /
//   (memory bandwidth * memory efficiency), nothing when fused into the GEMM (Device::elementwise_seconds).
// - A collective is matched across its group by (group id, sequence number of the collective on that group in
//   each member's list). It starts when the last traced member reaches it and ends at the same time on every
//   member: the system's model of that operation and algorithm (its blocking-mode model first for an op the rank
//   waits for alone, Op::blocking) for the group's kind (all n members on one node
//   (rank / devices_per_node): intra_node; one per node: inter_node; else hierarchical), else alpha + S *
//   coll::bus_factor(n) / beta on the intra-node tier when all share a node, else on the inter-node tier
//   (System::collective_seconds). Members that are not traced are stood for by a traced rank
//   with the same graph (symmetry), so they reach it no later than the traced ones.
// - The k-th send from rank a to rank b matches the k-th recv on b from a. A send takes latency + bytes /
//   bandwidth of the tier between them and does not wait for the recv (eager). A recv ends at
//   max(reached, send start + transfer time); it is running (counts as communication) from
//   max(reached, send start) to its end.
// - Overlap: while any communication op of a rank is running (a collective between its start and end, a send,
//   a recv as above), that rank's running compute ops progress at rate 1 / (1 + s), s the system's overlap
//   slowdown. A compute op whose alone-time work is done for a fraction r while communication runs therefore
//   takes t_alone ((1 - r) + r (1 + s)), Echo's form, also when the overlap starts or ends midway: r is the
//   fraction of the op's work (in alone-seconds) done in the overlapped wall time. Waiting for the group's last
//   member does not count as running.
// - Communication slowed by compute: with the system's communication slowdown c (absent: 0), a running collective
//   does its alone-time work at rate 1 / (1 + c) while any traced member of its group has a compute op running, at
//   rate 1 otherwise; its end moves on every member when that changes. Sends and recvs are not slowed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "project/system.h"

namespace strata::project {

inline constexpr int kComputeStream = 0;
inline constexpr int kPointToPoint = -1;  // the breakdown's key for sends and recvs

// The stream of a group's collectives unless an op names another: one communication stream per group.
inline int communication_stream(int group) { return 1 + group; }

enum class OpKind { timed, gemm, attention, elementwise, collective, send, recv };

const char* op_kind_name(OpKind kind);
bool is_compute(OpKind kind);


struct Op {
  std::string name;
  OpKind kind = OpKind::timed;
  int stream = kComputeStream;
  std::vector<int> depends_on;  // indices of earlier ops in the same rank's list

  double seconds = 0;  // timed: a measured duration
  // gemm: (m, k) x (k, n); attention: batch, heads, seq_q, seq_kv, head_dim, kv_heads (0: as heads)
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t batch = 0, heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0, kv_heads = 0;
  bool causal = false, backward = false;
  // attention without a fused kernel (no flash attention): the (s_q, s_kv) scores are materialised, so the call is
  // batched GEMMs and elementwise passes over the scores (unfused_attention_seconds).
  bool unfused = false;
  std::string attention_kernel;  // a fused kernel the device names in attention_kernels; empty: the described one
  std::string dtype;
  double bytes = 0;  // elementwise: bytes read and written; collective: S of docs/metrics.md; send/recv: payload
  coll::Operation collective = coll::Operation::allreduce;
  std::string algorithm = "ring";  // as strata-collective names it; the system's model of it, else its tier's ring
  int group = -1;  // collective
  // collective: the rank waits for it alone, right after starting it; timed by the system's blocking-mode model of
  // the operation where it has one (System::collective_seconds).
  bool blocking = false;
  int peer = -1;   // send: destination rank; recv: source rank
};

Op timed_op(std::string name, double seconds, int stream = kComputeStream);
Op gemm_op(std::string name, std::int64_t m, std::int64_t n, std::int64_t k, std::string dtype);
Op attention_op(std::string name, std::int64_t batch, std::int64_t heads, std::int64_t seq_q, std::int64_t seq_kv,
                std::int64_t head_dim, bool causal, bool backward, std::string dtype);
Op elementwise_op(std::string name, double bytes);
Op collective_op(std::string name, coll::Operation op, int group, double bytes);  // on communication_stream(group)
Op send_op(std::string name, int peer, double bytes, int stream = kComputeStream);
Op recv_op(std::string name, int peer, double bytes, int stream = kComputeStream);

// Forward 4 b h s_q s_kv d, half of it when causal, backward 2.5 x forward (docs/metrics.md).
double attention_flops(const Op& op);

// The alone-time of a compute op on the system's device.
double compute_seconds(const System& system, const Op& op);

// Attention as frameworks ran it before fused kernels (Megatron-LM's until 2023): the (b h, s_q, s_kv) scores of
// 2-byte elements are materialised, the mask is applied to them rather than skipped (a causal call costs a
// non-causal one), and attention dropout keeps a 1-byte mask. Forward: Q K^T, scale-mask-softmax (read and write
// the scores), dropout (read, write, and the mask), P V. Backward: dO V^T, dropout's backward (read the gradient and
// the mask, write), softmax's backward (read the gradient and P, write), and dS K, dS^T Q, P^T dO. Each GEMM as one
// of equal shape over the b h batches (m = b h s), each pass as an elementwise kernel of its bytes.
double unfused_attention_seconds(const Device& device, const Op& op);

struct RankGraph {
  int rank = 0;
  int weight = 1;  // how many ranks with this same graph it stands for (itself included)
  std::vector<Op> ops;
};

struct Group {
  int id = 0;
  std::vector<int> ranks;  // every member, traced or not: n of the cost model and the tier
};

struct Workload {
  std::vector<Group> groups;
  std::vector<RankGraph> ranks;
};

struct OpTiming {
  double reached = 0;  // its stream was free and its dependencies done
  double start = 0;    // it began: a collective when its last member reached it, a recv when data began to flow
  double end = 0;
};

// Where each rank's wall time over [0, step] went. An instant with compute running is compute; otherwise, with
// communication running, exposed communication of the op that started first (ties: lowest group id; sends and
// recvs under kPointToPoint); otherwise idle (waiting for data, for a group's last member, or for the step's
// last rank). The three add up to the step time.
struct Breakdown {
  double compute_s = 0;
  std::map<int, double> exposed_communication_s;
  double idle_s = 0;
};

// One op on one rank's stream, ready for a Chrome trace (pid = rank, tid = stream).
struct Interval {
  int rank = 0;
  int stream = 0;
  std::string name;
  OpKind kind = OpKind::timed;
  double start = 0, end = 0;
};

struct Timeline {
  double step_s = 0;                     // the last op's end over all ranks
  std::vector<std::vector<OpTiming>> ops;  // [traced rank][op], in the workload's order
  std::vector<Breakdown> breakdown;      // per traced rank
  Breakdown mean;                        // over all ranks: traced ranks weighted by the ranks they stand for
  std::vector<Interval> intervals;
};

// How the simulator finds the next instant something ends. Both give the same timeline up to rounding (relative
// 1e-12 per op; the tests hold them together).
// - scan: at every event, every running op's end is looked at and every compute op's work left is brought up to
//   date; O(running ops) per event. The reference.
// - event_queue: a running compute op's work left changes rate only when communication starts or stops on its
//   rank, so each op keeps one pending end in a priority queue, moved when its rank's rate changes; O(log n) per
//   event.
enum class SimulateMethod { event_queue, scan };

struct SimulateOptions {
  SimulateMethod method = SimulateMethod::event_queue;
  bool intervals = true;  // fill Timeline::intervals (for a Chrome trace)
  bool breakdown = true;  // fill Timeline::breakdown and Timeline::mean
};

// Throws std::invalid_argument for a workload that cannot run: a dependency on a later op, an unknown group or
// peer, collectives that do not match across a group, unmatched sends, a deadlock (naming the ops waiting).
Timeline simulate(const System& system, const Workload& workload, const SimulateOptions& options = {});

namespace simulator_detail {
class Simulator;
}

// One workload indexed once (its ops, streams, dependencies, collectives and transfers matched and checked, as
// simulate() does) and simulated as often as asked: each run reads the compute ops' alone-times and the transfers'
// times afresh, from the workload as it is then (its ops' durations may change, not its structure) on the description
// given, which must have the nodes of the one it was indexed on. The interval's corners are three runs of one.
class Simulation {
 public:
  Simulation(const System& system, const Workload& workload);  // std::invalid_argument as simulate()
  ~Simulation();
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;
  Timeline run(const System& system, const SimulateOptions& options = {});

 private:
  std::unique_ptr<simulator_detail::Simulator> simulator_;
};

}  // namespace strata::project
