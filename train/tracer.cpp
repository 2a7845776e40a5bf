// Recording a traced step (see tracer.h).
#include "train/tracer.h"

#include <stdexcept>

namespace strata::train {

int TraceGroups::id(const coll::Group& group) {
  auto key = std::make_pair(group.name(), group.world_ranks());
  const auto found = index_.find(key);
  if (found != index_.end()) return found->second;
  const int id = static_cast<int>(groups_.size());
  groups_.push_back({group.name(), group.world_ranks()});
  index_.emplace(std::move(key), id);
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
  const int index = static_cast<int>(ops_.size());
  ops_.push_back(std::move(op));
  done_.push_back(std::make_shared<bool>(compute));
  (compute ? last_compute_ : last_operation_) = index;
  return index;
}

void Tracer::gemm(std::string name, std::int64_t m, std::int64_t n, std::int64_t k) {
  TraceOp op;
  op.kind = TraceOpKind::gemm, op.name = std::move(name), op.m = m, op.n = n, op.k = k;
  add(std::move(op));
}

void Tracer::attention(std::string name, std::int64_t batch, std::int64_t heads, std::int64_t seq_q, std::int64_t seq_kv,
                       std::int64_t head_dim, bool causal, bool backward) {
  TraceOp op;
  op.kind = TraceOpKind::attention, op.name = std::move(name);
  op.batch = batch, op.heads = heads, op.seq_q = seq_q, op.seq_kv = seq_kv, op.head_dim = head_dim;
  op.causal = causal, op.backward = backward;
  add(std::move(op));
}

void Tracer::elementwise(std::string name, double elements) {
  TraceOp op;
  op.kind = TraceOpKind::elementwise, op.name = std::move(name), op.elements = elements;
  add(std::move(op));
}

namespace {

// A traced operation: it completes once its flag is set. The flag is the coroutine's parameter, so its frame holds
// it (a lambda's captures would die with the lambda); the wait is a named variable, as GCC 12 destroys some
// temporaries of a co_await expression twice.
coll::Step until_set(std::shared_ptr<bool> done) {
  coll::Until set{[done] { return *done; }};
  co_await set;
}

coll::Work pending(const std::shared_ptr<bool>& done) {
  return coll::Work::start([&done](coll::Traffic*) { return until_set(done); });
}

}  // namespace

coll::Work Tracer::collective(const coll::Group& group, coll::Operation operation, coll::Algo algo, std::size_t count,
                              coll::DataType dtype) {
  TraceOp op;
  op.kind = TraceOpKind::collective, op.group = groups_.id(group), op.count = static_cast<double>(count);
  op.element_bytes = static_cast<int>(coll::size_of(dtype)), op.algorithm = coll::name(algo);
  switch (operation) {
    case coll::Operation::allreduce: op.collective = TraceCollective::allreduce; break;
    case coll::Operation::allgather: op.collective = TraceCollective::allgather; break;
    case coll::Operation::reduce_scatter: op.collective = TraceCollective::reduce_scatter; break;
    case coll::Operation::broadcast: op.collective = TraceCollective::broadcast; break;
    default: throw std::invalid_argument("a traced step runs no " + std::string(coll::info(operation).name));
  }
  op.name = next_name_.empty() ? group.name() + " " + std::string(coll::info(operation).name) : std::exchange(next_name_, {});
  const int index = add(std::move(op));
  return pending(done_[static_cast<std::size_t>(index)]);
}

coll::Work Tracer::point_to_point(const coll::Group& group, bool send, int peer, std::size_t count, coll::DataType dtype) {
  TraceOp op;
  op.kind = send ? TraceOpKind::send : TraceOpKind::recv, op.group = groups_.id(group);
  op.peer = group.world_ranks().at(static_cast<std::size_t>(peer));
  op.count = static_cast<double>(count), op.element_bytes = static_cast<int>(coll::size_of(dtype));
  op.name = next_name_.empty() ? std::string(send ? "send" : "recv") : std::exchange(next_name_, {});
  const int index = add(std::move(op));
  return pending(done_[static_cast<std::size_t>(index)]);
}

void Tracer::complete(int op) {
  if (op < 0 || op >= static_cast<int>(ops_.size())) throw std::logic_error("tracer: no operation " + std::to_string(op));
  if (*done_[static_cast<std::size_t>(op)]) return;
  *done_[static_cast<std::size_t>(op)] = true;
  waited_.push_back(op);
}

}  // namespace strata::train
