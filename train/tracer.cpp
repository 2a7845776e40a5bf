// Recording a traced step (see tracer.h).
#include "train/tracer.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

namespace strata::train {

int TraceGroups::id(const coll::Group& group) {
  // Every collective asks: the group asked last first (a layer's collectives share theirs), then the index, no copies.
  if (last_ >= 0) {
    const TraceGroup& last = groups_[static_cast<std::size_t>(last_)];
    if (last.role == group.name() && last.ranks == group.world_ranks()) return last_;
  }
  const auto found = index_.find(std::tie(group.name(), group.world_ranks()));
  if (found != index_.end()) return last_ = found->second;
  const int id = last_ = static_cast<int>(groups_.size());
  groups_.push_back({group.name(), group.world_ranks()});
  index_.emplace(std::make_tuple(group.name(), group.world_ranks()), id);
  return id;
}

int Tracer::add(TraceOp op) {
  const bool compute = op.kind == TraceOpKind::gemm || op.kind == TraceOpKind::attention || op.kind == TraceOpKind::elementwise;
  if (compute) {
    op.depends_on = std::move(waited_);
    waited_.clear();
  } else if (last_compute_ >= 0) {
    op.depends_on = {last_compute_};
  }
  op.phase = phase_;
  op.unit = unit_;
  const int index = static_cast<int>(ops_.size());
  ops_.push_back(std::move(op));
  done_.push_back(compute);
  (compute ? last_compute_ : last_operation_) = index;
  return index;
}

void Tracer::gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k) {
  TraceOp op;
  op.kind = TraceOpKind::gemm, op.name = name, op.m = m, op.n = n, op.k = k;
  add(std::move(op));
}

void Tracer::attention(const char* name, std::int64_t batch, std::int64_t heads, std::int64_t seq_q, std::int64_t seq_kv,
                       std::int64_t head_dim, bool causal, bool backward) {
  TraceOp op;
  op.kind = TraceOpKind::attention, op.name = name;
  op.batch = batch, op.heads = heads, op.seq_q = seq_q, op.seq_kv = seq_kv, op.head_dim = head_dim;
  op.causal = causal, op.backward = backward;
  add(std::move(op));
}

void Tracer::elementwise(const char* name, double elements) {
  TraceOp op;
  op.kind = TraceOpKind::elementwise, op.name = name, op.elements = elements;
  add(std::move(op));
}

namespace {

// A traced operation: it completes once its flag is set. The flag is the coroutine's parameter, so its frame holds
// it (a lambda's captures would die with the lambda); the wait is a named variable, as GCC 12 destroys some
// temporaries of a co_await expression twice.
coll::Step until_set(const bool* done) {
  coll::Until set{[done] { return *done; }};
  co_await set;
}

coll::Work pending(const bool* done) {
  return coll::Work::start([done](coll::Traffic*) { return until_set(done); });
}

}  // namespace

coll::Work Tracer::collective(const coll::Group& group, coll::Operation operation, coll::Algo algo, std::size_t count,
                              coll::DataType dtype) {
  TraceOp op;
  op.kind = TraceOpKind::collective, op.group = groups_.id(group), op.count = static_cast<double>(count);
  op.element_bytes = static_cast<int>(coll::size_of(dtype)), op.algorithm = coll::name(algo);
  switch (operation) {
    case coll::Operation::allreduce:
    case coll::Operation::allgather:
    case coll::Operation::reduce_scatter:
    case coll::Operation::broadcast: op.collective = operation; break;
    default: throw std::invalid_argument("a traced step runs no " + std::string(coll::name(operation)));
  }
  op.name = groups_.keep(next_name_.empty() ? group.name() + " " + std::string(coll::name(operation)) : std::exchange(next_name_, {}));
  const int index = add(std::move(op));
  return pending(&done_[static_cast<std::size_t>(index)]);
}

coll::Work Tracer::point_to_point(const coll::Group& group, bool send, int peer, std::size_t count, coll::DataType dtype) {
  TraceOp op;
  op.kind = send ? TraceOpKind::send : TraceOpKind::recv, op.group = groups_.id(group);
  op.peer = group.world_ranks().at(static_cast<std::size_t>(peer));
  op.count = static_cast<double>(count), op.element_bytes = static_cast<int>(coll::size_of(dtype));
  op.name = next_name_.empty() ? std::string_view(send ? "send" : "recv") : groups_.keep(std::exchange(next_name_, {}));
  const int index = add(std::move(op));
  return pending(&done_[static_cast<std::size_t>(index)]);
}

void Tracer::complete(int op, bool alone) {
  if (op < 0 || op >= static_cast<int>(ops_.size())) throw std::logic_error("tracer: no operation " + std::to_string(op));
  if (done_[static_cast<std::size_t>(op)]) return;
  done_[static_cast<std::size_t>(op)] = true;
  waited_.push_back(op);
  // Waited for by itself before anything else was recorded since it started: the rank waits for it alone (a blocking
  // collective). One of several waited for at once shares their wait.
  TraceOp& waited = ops_[static_cast<std::size_t>(op)];
  if (alone && waited.kind == TraceOpKind::collective && op == static_cast<int>(ops_.size()) - 1) waited.blocking = true;
}

namespace {

bool is_compute(TraceOpKind kind) {
  return kind == TraceOpKind::gemm || kind == TraceOpKind::attention || kind == TraceOpKind::elementwise;
}

void add_dependency(TraceOp& op, int on) {
  if (std::find(op.depends_on.begin(), op.depends_on.end(), on) == op.depends_on.end()) op.depends_on.push_back(on);
}

}  // namespace

int overlap_tensor_parallel_communication(StepTrace& trace) {
  int moved = 0;
  for (TraceRank& rank : trace.ranks) {
    std::vector<TraceOp>& ops = rank.ops;
    const int n = static_cast<int>(ops.size());
    std::vector<int> previous_compute(static_cast<std::size_t>(n), -1), next_compute(static_cast<std::size_t>(n), -1);
    for (int i = 0, last = -1; i < n; ++i) {
      previous_compute[static_cast<std::size_t>(i)] = last;
      if (is_compute(ops[static_cast<std::size_t>(i)].kind)) last = i;
    }
    for (int i = n - 1, next = -1; i >= 0; --i) {
      next_compute[static_cast<std::size_t>(i)] = next;
      if (is_compute(ops[static_cast<std::size_t>(i)].kind)) next = i;
    }
    for (int i = 0; i < n; ++i) {
      TraceOp& op = ops[static_cast<std::size_t>(i)];
      if (op.kind != TraceOpKind::collective || op.group < 0 || trace.groups.at(static_cast<std::size_t>(op.group)).role != "tp")
        continue;
      if (op.collective == coll::Operation::allgather) {
        // The first compute op that waits for the gather: a GEMM runs beside it, the op after the GEMM waits.
        int reader = next_compute[static_cast<std::size_t>(i)];
        while (reader >= 0 && std::find(ops[static_cast<std::size_t>(reader)].depends_on.begin(),
                                        ops[static_cast<std::size_t>(reader)].depends_on.end(),
                                        i) == ops[static_cast<std::size_t>(reader)].depends_on.end())
          reader = next_compute[static_cast<std::size_t>(reader)];
        // A linear layer's bias fill comes before its GEMM and reads nothing gathered: the GEMM is the reader.
        int waiting = reader;
        if (reader >= 0 && ops[static_cast<std::size_t>(reader)].kind == TraceOpKind::elementwise &&
            ops[static_cast<std::size_t>(reader)].name == "bias fill")
          reader = next_compute[static_cast<std::size_t>(reader)];
        if (reader < 0 || ops[static_cast<std::size_t>(reader)].kind != TraceOpKind::gemm) continue;
        const int after = next_compute[static_cast<std::size_t>(reader)];
        if (after < 0) continue;
        std::vector<int>& waits = ops[static_cast<std::size_t>(waiting)].depends_on;
        waits.erase(std::remove(waits.begin(), waits.end(), i), waits.end());
        add_dependency(ops[static_cast<std::size_t>(after)], i);
        op.blocking = false;
        ++moved;
      } else if (op.collective == coll::Operation::reduce_scatter) {
        // The GEMM whose output it reduces: the collective starts when the GEMM could.
        const int producer = previous_compute[static_cast<std::size_t>(i)];
        if (producer < 0 || ops[static_cast<std::size_t>(producer)].kind != TraceOpKind::gemm ||
            std::find(op.depends_on.begin(), op.depends_on.end(), producer) == op.depends_on.end())
          continue;
        std::vector<int> waits = ops[static_cast<std::size_t>(producer)].depends_on;
        if (const int before = previous_compute[static_cast<std::size_t>(producer)]; before >= 0) waits.push_back(before);
        for (int d : op.depends_on)
          if (d != producer) waits.push_back(d);
        std::sort(waits.begin(), waits.end());
        waits.erase(std::unique(waits.begin(), waits.end()), waits.end());
        op.depends_on = std::move(waits);
        op.blocking = false;
        ++moved;
      }
    }
  }
  return moved;
}

int overlap_parameter_gathers(StepTrace& trace) {
  int moved = 0;
  for (TraceRank& rank : trace.ranks) {
    std::vector<TraceOp>& ops = rank.ops;
    const std::size_t n = ops.size();
    std::vector<char> gather(n, 0);
    std::vector<std::size_t> order;  // the gathers first, then every other op, each in its order
    for (std::size_t i = 0; i < n; ++i) {
      const TraceOp& op = ops[i];
      gather[i] = op.kind == TraceOpKind::collective && op.collective == coll::Operation::allgather &&
                  op.phase == "optimizer" && op.unit >= 0;
      if (gather[i]) order.push_back(i);
    }
    if (order.empty()) continue;
    const std::size_t gathers = order.size();
    for (std::size_t i = 0; i < n; ++i)
      if (!gather[i]) order.push_back(i);
    std::vector<int> position(n);
    for (std::size_t p = 0; p < n; ++p) position[order[p]] = static_cast<int>(p);
    // Each unit's first compute op of the forward pass, at its new position.
    std::map<int, int> first_forward;
    for (std::size_t i = 0; i < n; ++i)
      if (ops[i].phase == "forward" && ops[i].unit >= 0 && is_compute(ops[i].kind)) first_forward.emplace(ops[i].unit, position[i]);
    std::vector<TraceOp> moved_ops;
    moved_ops.reserve(n);
    for (std::size_t p = 0; p < n; ++p) {
      TraceOp op = std::move(ops[order[p]]);
      std::vector<int> waits;
      if (p >= gathers)
        for (int d : op.depends_on)
          if (!gather[static_cast<std::size_t>(d)]) waits.push_back(position[static_cast<std::size_t>(d)]);
      op.depends_on = std::move(waits);
      moved_ops.push_back(std::move(op));
    }
    for (std::size_t g = 0; g < gathers; ++g) {
      const int unit = moved_ops[g].unit;
      auto reader = first_forward.find(unit);
      // A unit no forward op here belongs to (the token table's copy beside the head): the head's, the last unit.
      if (reader == first_forward.end() && !first_forward.empty()) reader = std::prev(first_forward.end());
      if (reader == first_forward.end()) continue;
      std::vector<int>& waits = moved_ops[static_cast<std::size_t>(reader->second)].depends_on;
      waits.push_back(static_cast<int>(g));
      std::sort(waits.begin(), waits.end());
      moved_ops[g].blocking = false;  // it runs beside the forward ops before its reader now
      ++moved;
    }
    ops = std::move(moved_ops);
  }
  return moved;
}

}  // namespace strata::train
