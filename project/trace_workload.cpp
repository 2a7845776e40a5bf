// A traced step as the simulator's workload (see trace_workload.h).
#include "project/trace_workload.h"

#include <algorithm>
#include <map>
#include <stdexcept>

namespace strata::project {

std::string_view costed_algorithm(const train::StepTrace& trace, const train::TraceOp& op,
                                    const WorkloadOptions& options) {
  if (options.sharding_algorithm.empty() || op.kind != train::TraceOpKind::collective) return op.algorithm;
  if (op.collective != coll::Operation::allgather && op.collective != coll::Operation::reduce_scatter)
    return op.algorithm;
  const std::string& role = trace.groups.at(static_cast<std::size_t>(op.group)).role;
  return role.rfind("dp", 0) == 0 ? options.sharding_algorithm : op.algorithm;  // dp, dp_intra, dp_inter, dp_by_piece
}

bool is_compute(train::TraceOpKind kind) {
  return kind == train::TraceOpKind::gemm || kind == train::TraceOpKind::attention ||
         kind == train::TraceOpKind::elementwise;
}

int element_bytes_of(const train::TraceOp& op, int element_bytes) {
  return op.element_bytes == 4 ? element_bytes : op.element_bytes;
}

int collective_element_bytes(const train::StepTrace& trace, const train::TraceOp& op, const WorkloadOptions& options) {
  const bool reduces = op.collective == coll::Operation::reduce_scatter || op.collective == coll::Operation::allreduce;
  if (options.gradient_reduction_bytes == 0 || op.kind != train::TraceOpKind::collective || !reduces)
    return element_bytes_of(op, options.element_bytes);
  const std::string& role = trace.groups.at(static_cast<std::size_t>(op.group)).role;
  const bool gradients = role.rfind("dp", 0) == 0 || role == "embedding";  // dp, dp_intra, dp_inter, dp_by_piece
  return element_bytes_of(op, gradients ? options.gradient_reduction_bytes : options.element_bytes);
}

std::optional<double> loss_bytes_per_element(std::string_view loss, std::string_view op_name) {
  static const std::map<std::string_view, double> passes = {
      {"cross-entropy", 38}, {"logit max", 10}, {"sum of exponentials", 28}, {"cross-entropy backward", 7}};
  static const std::map<std::string_view, double> fused = {
      {"cross-entropy", 22}, {"logit max", 6}, {"sum of exponentials", 16}, {"cross-entropy backward", 5}};
  const std::map<std::string_view, double>* bytes = loss == "fp32" ? &passes : loss == "fp32-fused" ? &fused : nullptr;
  if (bytes == nullptr) return std::nullopt;
  const auto found = bytes->find(op_name);
  return found == bytes->end() ? std::nullopt : std::optional<double>(found->second);
}

bool fp32_logits(std::string_view loss) { return loss == "fp32" || loss == "fp32-fused"; }

const std::vector<std::string>& loss_modes() {
  static const std::vector<std::string> modes = {"fused", "fp32", "fp32-fused"};
  return modes;
}

void check_loss(const std::string& loss) {
  const std::vector<std::string>& modes = loss_modes();
  if (std::find(modes.begin(), modes.end(), loss) != modes.end()) return;
  std::string names;
  for (const std::string& mode : modes) names += (names.empty() ? "" : ", ") + mode;
  throw std::invalid_argument("loss '" + loss + "': not one of " + names);
}

double elementwise_bytes(const train::TraceOp& op, const WorkloadOptions& options) {
  if (const std::optional<double> per_element = loss_bytes_per_element(options.loss, op.name))
    return op.elements * *per_element;
  return op.elements * options.element_bytes;
}

std::string elementwise_name(const train::TraceOp& op, const WorkloadOptions& options) {
  const bool framework_loss = loss_bytes_per_element(options.loss, op.name).has_value();
  return framework_loss ? std::string(op.name) + " (" + options.loss + " passes)" : std::string(op.name);
}

std::string_view attention_kernel(const WorkloadOptions& options) {
  return options.attention == "flash" || options.attention == "unfused" ? std::string_view{} : options.attention;
}

double collective_bytes(const train::TraceOp& op, int group_size, int element_bytes) {
  const double block = op.count * element_bytes_of(op, element_bytes);
  const bool whole = op.collective == coll::Operation::allgather || op.collective == coll::Operation::reduce_scatter;
  return whole ? block * group_size : block;
}

Op workload_op(const train::StepTrace& trace, const train::TraceOp& t, const WorkloadOptions& options) {
  const int groups = static_cast<int>(trace.groups.size());
  Op op;
  switch (t.kind) {
    case train::TraceOpKind::gemm: op = gemm_op(std::string(t.name), t.m, t.n, t.k, options.dtype); break;
    case train::TraceOpKind::attention:
      op = attention_op(std::string(t.name), t.batch, t.heads, t.seq_q, t.seq_kv, t.head_dim, t.causal, t.backward, options.dtype);
      op.unfused = options.attention == "unfused";
      op.attention_kernel = attention_kernel(options);
      break;
    case train::TraceOpKind::elementwise:
      op = elementwise_op(elementwise_name(t, options), elementwise_bytes(t, options));
      break;
    case train::TraceOpKind::collective: {
      const int size = static_cast<int>(trace.groups.at(static_cast<std::size_t>(t.group)).ranks.size());
      op = collective_op(std::string(t.name), t.collective, t.group,
                         collective_bytes(t, size, collective_element_bytes(trace, t, options)));
      op.algorithm = costed_algorithm(trace, t, options);
      op.blocking = t.blocking;
      break;
    }
    case train::TraceOpKind::send:
      op = send_op(std::string(t.name), t.peer, t.count * element_bytes_of(t, options.element_bytes), communication_stream(t.group));
      break;
    case train::TraceOpKind::recv:
      // A rank's receives run on a stream of their own beside its sends' (both are the pp group's transfers).
      op = recv_op(std::string(t.name), t.peer, t.count * element_bytes_of(t, options.element_bytes),
                   communication_stream(groups + t.group));
      break;
  }
  op.depends_on = t.depends_on;
  return op;
}

Workload workload_of(const train::StepTrace& trace, const WorkloadOptions& options) {
  Workload w;
  const int groups = static_cast<int>(trace.groups.size());
  for (int g = 0; g < groups; ++g) w.groups.push_back({g, trace.groups[static_cast<std::size_t>(g)].ranks});
  for (const train::TraceRank& rank : trace.ranks) {
    RankGraph graph{rank.rank, rank.weight, {}};
    graph.ops.reserve(rank.ops.size());
    for (const train::TraceOp& t : rank.ops) graph.ops.push_back(workload_op(trace, t, options));
    w.ranks.push_back(std::move(graph));
  }
  return w;
}

}  // namespace strata::project
