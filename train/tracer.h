// Records one rank's step as the operation graph of trace.h: the model's kernels (GptCpu asks it instead of
// running them), the process groups' operations (as their coll::GroupTrace) and the executor's waits.
//
// Dependencies follow what the executor does: a collective, send or receive starts after the compute op before it
// (its data came from there, or it was posted then); a compute op starts after the operations the executor waited
// for since the previous compute op. Traced operations complete only when the executor waits for them (complete()):
// a traced step makes no progress on its own, so every wait names what it waits for.
#pragma once

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "collectives/process_group.h"
#include "train/trace.h"

namespace strata::train {

// The groups of several traced ranks, each once (by role and members), so collectives match across ranks.
class TraceGroups {
 public:
  int id(const coll::Group& group);
  const std::vector<TraceGroup>& all() const { return groups_; }
  // The most ops one tracer of these groups took: the next reserves as many (a step's ranks trace alike).
  std::size_t ops_hint = 0;
  // A name kept for as long as the trace that takes `names` lives (TraceOp::name views it).
  std::string_view keep(std::string name) { return *names->insert(std::move(name)).first; }
  std::shared_ptr<std::unordered_set<std::string>> names = std::make_shared<std::unordered_set<std::string>>();

 private:
  std::map<std::tuple<std::string, std::vector<int>>, int, std::less<>> index_;  // (role, members) -> id
  std::vector<TraceGroup> groups_;
  int last_ = -1;
};

class Tracer : public coll::GroupTrace {
 public:
  explicit Tracer(TraceGroups& groups) : groups_(groups) { ops_.reserve(groups.ops_hint); }

  // Compute ops, named by string literals only: the op keeps a view of the name, which must outlive the trace.
  void gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k);
  void attention(const char* name, std::int64_t batch, std::int64_t heads, std::int64_t seq_q, std::int64_t seq_kv,
                 std::int64_t head_dim, bool causal, bool backward);
  void elementwise(const char* name, double elements);

  coll::Work collective(const coll::Group& group, coll::Operation operation, coll::Algo algo, std::size_t count,
                        coll::DataType dtype) override;
  coll::Work point_to_point(const coll::Group& group, bool send, int peer, std::size_t count, coll::DataType dtype) override;

  // The most recent operation recorded (collective, send or receive): the one a group call just made.
  int last_operation() const { return last_operation_; }
  // The executor waits for operation `op`: it completes (its Work tests done), and the next compute op depends on it;
  // a collective waited for by itself (`alone`: not one of several in the same wait) before any other op was
  // recorded is marked blocking.
  void complete(int op, bool alone = true);
  // Names the next operation of a group (before the call), or an operation already recorded.
  void name_next(std::string name) { next_name_ = std::move(name); }
  void rename(int op, std::string name) { ops_.at(static_cast<std::size_t>(op)).name = groups_.keep(std::move(name)); }
  // The phase every op recorded from now on is issued in (TraceOp::phase): a literal, which outlives the trace.
  void set_phase(const char* phase) { phase_ = phase; }
  std::string_view phase() const { return phase_; }
  // The parameter unit every op recorded from now on belongs to (TraceOp::unit); -1: none.
  void set_unit(int unit) { unit_ = unit; }

  std::vector<TraceOp> take() {
    groups_.ops_hint = std::max(groups_.ops_hint, ops_.size());
    return std::move(ops_);
  }

 private:
  int add(TraceOp op);
  TraceGroups& groups_;
  std::vector<TraceOp> ops_;
  // Per op: set when the executor waits for it. A deque keeps each flag where it is as ops are added, so an
  // operation's Work reads its own flag for as long as the tracer lives.
  std::deque<bool> done_;
  int last_compute_ = -1, last_operation_ = -1;
  std::vector<int> waited_;  // completed since the last compute op
  std::string next_name_;
  std::string_view phase_;
  int unit_ = -1;
};

// What production frameworks overlap that this executor runs one after another, as the traced graph's dependencies
// (the simulator runs a group's collectives on their own stream, so a dependency removed is an overlap gained).
//
// Tensor-parallel communication beside the GEMMs (Megatron-Core's --tp-comm-overlap, Transformer Engine's
// userbuffers; sequence parallelism only, as there): a tensor-parallel all-gather whose first reader is a GEMM (or the
// bias fill before one) runs beside that GEMM, and the compute op after the GEMM waits for it instead; a
// tensor-parallel reduce-scatter of a GEMM's output starts with that GEMM rather than after it. Framework kernels
// pipeline the GEMM over chunks of the collective; the trace runs the two side by side, so a pair takes the longer of
// the two (plus the system's overlap slowdown on the GEMM), not their sum. Returns the collectives it moved.
int overlap_tensor_parallel_communication(StepTrace& trace);

// The optimizer's parameter all-gathers (the post-update gathers of a strategy whose parameters are held whole
// and whose optimizer states are sharded: Megatron's distributed optimizer, ZeRO-1 and 2) overlapped with the next
// step's forward (Megatron-Core's --overlap-param-gather): a step's gathers are the previous update's, so each rank
// starts them first, in their order, waiting for nothing, and each unit's first forward op waits for its own (the
// token table's copy on a stage without the embeddings: for the head's first op, which reads it). Nothing waits for
// them at the end of the step any more. Returns the gathers it moved.
int overlap_parameter_gathers(StepTrace& trace);

}  // namespace strata::train
