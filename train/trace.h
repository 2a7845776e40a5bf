// A training step as an operation graph, without running it: what the step executor of trainer.h would run on
// each rank (every GEMM and attention call with its shape, elementwise kernels with the elements they move, every
// collective with its group and size, every send and receive, and what waits for what), for a grid of any size.
// The executor itself emits it in trace mode (Trainer's traced constructor): the same code decides what a measured
// step runs and what a traced one contains. The projection (project/) turns it into the simulator's workload.
//
// Plain data, no MPI: the projection reads it (the operations by their one vocabulary, collectives/operation.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "collectives/operation.h"

namespace strata::train {

enum class TraceOpKind { gemm, attention, elementwise, collective, send, recv };

struct TraceOp {
  TraceOpKind kind = TraceOpKind::elementwise;
  // A literal (a compute op's, as the model names it) or one of the trace's kept names (StepTrace::names): a
  // step's millions of ops share a few thousand names.
  std::string_view name;
  // The step's phase the op was issued in, as strata-step times its phases: "forward", "backward", "recompute" (on
  // demand, inside a backward), "recompute_window" (overlap: in a wait for another stage), "optimizer" (from the
  // gradient norm to the zeroed gradients), or "" (outside them: transfers' copies, the tied table's and the loss's
  // reductions, the waits at the end of the passes). A name with static storage: millions of ops share a handful.
  std::string_view phase;
  std::vector<int> depends_on;  // earlier ops of the same rank that must end before this one starts
  // The parameter unit (embeddings 0, layers 1..L, final norm L + 1) whose forward or backward pass issued the op,
  // or whose update or post-update gather it is; -1 outside them.
  int unit = -1;
  // gemm: C (m, n) = A (m, k) B (k, n)
  std::int64_t m = 0, n = 0, k = 0;
  // attention: batch, heads, query and key lengths, head dimension, causal, forward or backward
  std::int64_t batch = 0, heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  bool causal = false, backward = false;
  double elements = 0;  // elementwise: elements read and written
  // collective, send, recv: the group (an index into StepTrace::groups), the operation's count argument (allgather:
  // each rank's block; reduce_scatter: each rank's result) and element size, the algorithm's name; for send and
  // recv the peer's world rank.
  int group = -1;
  coll::Operation collective = coll::Operation::allreduce;  // allreduce, allgather, reduce_scatter or broadcast
  double count = 0;
  int element_bytes = 4;
  std::string_view algorithm;  // coll::name's
  int peer = -1;
  // collective: the rank waited for it by itself right after starting it, with no op of its own between
  // (Tracer::complete).
  bool blocking = false;
};

struct TraceGroup {
  std::string role;       // "tp", "pp", "dp", "dp_intra", "dp_inter", "dp_by_piece", "embedding"
  std::vector<int> ranks;  // world ranks, in group order
};

struct TraceRank {
  int rank = 0;    // world rank
  int weight = 1;  // the ranks whose graph this one stands for (itself included)
  std::vector<TraceOp> ops;
};

struct StepTrace {
  std::vector<TraceGroup> groups;
  std::vector<TraceRank> ranks;
  int ranks_per_node = 1;
  std::string dtype = "fp32";  // of the GEMMs and attention calls
  int element_bytes = 4;       // of activations in elementwise kernels
  // The names the ops' views hold that are not literals (a collective's or transfer's, with its micro-batch), each
  // once; shared by copies of the trace.
  std::shared_ptr<const std::unordered_set<std::string>> names;
};

}  // namespace strata::train
