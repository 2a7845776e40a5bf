// The step's expected traffic and memory (see step_formulas.h).
#include "train/step_formulas.h"

#include <algorithm>
#include <array>
#include <map>
#include <stdexcept>
#include <vector>

#include "train/gpt.h"

namespace strata::train {

DataParallelShape data_parallel_shape(coll::ProcessGroups& groups) {
  DataParallelShape s;
  coll::Group& dp = groups.dp();
  s.n = dp.size(), s.m = groups.dp_intra().size(), s.g = groups.dp_inter().size();
  s.tp = groups.tp().size();
  s.pp = groups.pp().size(), s.pp_rank = groups.pp_index();
  const std::vector<int>& nodes = dp.node_of_rank();
  if (!nodes.empty() && s.n > 1)
    s.dp_hop_crosses_nodes = nodes[static_cast<std::size_t>(dp.rank())] != nodes[static_cast<std::size_t>((dp.rank() + 1) % s.n)];
  std::map<int, int> on_node;
  for (int node : nodes) ++on_node[node];
  s.even = std::all_of(on_node.begin(), on_node.end(), [&](const auto& entry) { return entry.second == s.m; });
  return s;
}

DataParallelShape stage_data_parallel_shape(const coll::GridShape& grid, int ranks_per_node, const std::string& order,
                                            int stage) {
  if (ranks_per_node < 1) throw std::invalid_argument("ranks per node must be at least 1");
  if (grid.tp < 1 || grid.pp < 1 || grid.dp < 1)
    throw std::invalid_argument("grid " + coll::format_grid(grid) + ": every degree must be at least 1");
  if (stage < 0 || stage >= grid.pp)
    throw std::invalid_argument("pipeline rank " + std::to_string(stage) + " of " + std::to_string(grid.pp));
  const std::array<int, 3> stride = coll::grid_strides(grid, coll::parse_grid_order(order));
  // Data-parallel rank d of this stage's first tensor-parallel rank.
  auto node_of = [&](int d) { return (stage * stride[1] + d * stride[2]) / ranks_per_node; };
  DataParallelShape s;
  s.n = grid.dp, s.tp = grid.tp, s.pp = grid.pp, s.pp_rank = stage;
  // The group's ranks run through the nodes in order: count them node by node.
  std::vector<int> per_node;
  for (int d = 0, last = -1; d < grid.dp; ++d) {
    const int node = node_of(d);
    if (node != last) per_node.push_back(0), last = node;
    ++per_node.back();
  }
  s.m = per_node.front(), s.g = static_cast<int>(per_node.size());
  s.even = std::all_of(per_node.begin(), per_node.end(), [&](int count) { return count == s.m; });
  s.dp_hop_crosses_nodes = grid.dp > 1 && node_of(0) != node_of(1);
  return s;
}

namespace {

// Bytes one rank sends in a ring collective over k ranks of a buffer of `bytes`.
double ring_bytes(int k, double bytes, bool allreduce) {
  return (allreduce ? 2.0 : 1.0) * (k - 1) / k * bytes;
}

std::size_t padded(std::size_t size, int n) {
  return (size + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
}

}  // namespace

namespace {

// The rank's stages, the units they hold, and per held unit whether a backward pass gathers it again.
struct RankUnits {
  std::vector<StagePlan> stages;
  std::vector<bool> held, backward_reaches;
};

RankUnits rank_units(const TrainConfig& c, const DataParallelShape& shape) {
  RankUnits r;
  r.stages = rank_stages(c, shape.pp, shape.pp_rank);
  r.held = units_held(c.model, r.stages);
  const std::vector<bool> trains = trainable_units(c.model, c.trainable);
  std::size_t lowest = trains.size();  // the lowest unit that trains anywhere
  for (std::size_t u = trains.size(); u-- > 0;)
    if (trains[u]) lowest = u;
  r.backward_reaches.assign(r.held.size(), false);
  for (const StagePlan& plan : r.stages) {
    const std::size_t first_unit = static_cast<std::size_t>(plan.first_layer) + 1, end_unit = first_unit + static_cast<std::size_t>(plan.layers);
    // The stage's backward goes down to its first layer when something below it trains; else to the lowest
    // of its own units that trains.
    const std::size_t reached = !plan.embedding && lowest < first_unit ? first_unit : std::max(lowest, first_unit);
    for (std::size_t u = reached; u < end_unit; ++u) r.backward_reaches[u] = true;
  }
  return r;
}

}  // namespace

coll::Traffic expected_traffic(const TrainConfig& config, const DataParallelShape& shape) {
  const Strategy& s = config.strategy;
  const int n = shape.n, m = shape.m, g = shape.g, accumulation = config.accumulation;
  coll::Traffic t;
  // One collective on a group: intra, inter, or global (ordered by piece: every hop crosses nodes when g > 1),
  // or the data-parallel ring in rank order.
  enum class On { intra, inter, global, dp };
  auto add = [&](On on, double bytes, bool allreduce, double times = 1) {
    const int k = on == On::intra ? m : on == On::inter ? g : n;
    const bool crosses = on == On::inter || (on == On::global && g > 1) || (on == On::dp && shape.dp_hop_crosses_nodes);
    (crosses ? t.inter_bytes : t.intra_bytes) += times * ring_bytes(k, bytes, allreduce);
  };
  auto on = [](Sharding sharding) { return sharding == Sharding::intra ? On::intra : On::global; };

  const std::vector<Slice> units = ParameterLayout(config.model, tensor_shard(config.model, shape.tp, 0)).units();
  const std::vector<bool> trains = trainable_units(config.model, config.trainable);
  const RankUnits here = rank_units(config, shape);
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (!here.held[u]) continue;
    const double unit = 4.0 * static_cast<double>(padded(units[u].size, n)), piece_i = unit / m;
    if (s.params != Sharding::none) add(on(s.params), unit, false, accumulation * (here.backward_reaches[u] ? 2 : 1));
    if (!trains[u]) continue;
    if (s.grads != Sharding::none) add(on(s.grads), unit, false, accumulation);
    if (s.grads == Sharding::none && s.optimizer == Sharding::none) {
      add(On::dp, unit, true);
    } else if (s.grads != Sharding::global) {
      if (s.grads == Sharding::none) add(On::intra, unit, false);
      add(On::inter, piece_i, s.optimizer == Sharding::intra);
    }
    if (s.params != s.optimizer) {
      if (s.params == Sharding::intra) add(On::inter, piece_i, false);
      else add(on(s.optimizer), unit, false);
    }
  }
  return t;
}

double pipeline_sent_bytes(const TrainConfig& c, const DataParallelShape& shape) {
  const std::vector<bool> trains = trainable_units(c.model, c.trainable);
  std::size_t lowest = trains.size();
  for (std::size_t u = trains.size(); u-- > 0;)
    if (trains[u]) lowest = u;
  const double rows = static_cast<double>(c.micro_batch) * c.seq / (c.sequence_parallel && shape.tp > 1 ? shape.tp : 1);
  const double message = 4.0 * rows * c.model.hidden;
  double bytes = 0;
  for (const StagePlan& plan : rank_stages(c, shape.pp, shape.pp_rank)) {
    if (!plan.head) bytes += c.accumulation * message;
    if (!plan.embedding && lowest < static_cast<std::size_t>(plan.first_layer) + 1) bytes += c.accumulation * message;
  }
  return bytes;
}

LayerActivationFloats layer_activation_floats(const ModelConfig& model, int micro_batch, int seq, int tp, bool sp) {
  const TensorShard sh = tensor_shard(model, tp, 0);
  const double N = static_cast<double>(micro_batch) * seq, R = sp ? N / tp : N, C = model.hidden,
               A = sh.attention_channels(model), Q = sh.qkv_channels(model), KV = sh.kv_channels(model), F = sh.mlp,
               a = sh.heads, V = sh.vocab_rows;
  LayerActivationFloats f;
  f.input = R * C;
  f.op[static_cast<std::size_t>(LayerOp::pre)] = N * C + 2 * R + N * Q;              // ln1, its statistics, qkv
  f.op[static_cast<std::size_t>(LayerOp::core)] = 2 * N * A + 2 * N * KV + N * a;     // q, k, v, output, lse
  f.op[static_cast<std::size_t>(LayerOp::post)] = N * A + 3 * N * C + R * C + 2 * R + 2 * N * F;  // merged, proj,
  // x_mid, ln2 and its statistics, the MLP's pre- and post-GELU and its output
  f.head = R * (C + 2) + N * (C + V + 4);
  f.stage_output = R * C;
  return f;
}

double activation_bytes(const ModelConfig& model, int micro_batch, int seq, Recompute recompute, int tp, bool sp,
                        const StagePlan& stage) {
  const LayerActivationFloats f = layer_activation_floats(model, micro_batch, seq, tp, sp);
  const int layers = stage.layers < 0 ? model.layers - stage.first_layer : stage.layers;
  double per_set = stage.head ? f.head : f.stage_output, shared = 0, recompute_space = 0;
  for (int l = 0; l < layers; ++l) {
    double kept = f.input, elsewhere = 0;
    for (int op = 0; op < kLayerOps; ++op) {
      const bool keep = recompute == Recompute::overlap ? stage.kept.at(static_cast<std::size_t>(l))[static_cast<std::size_t>(op)]
                                                        : keeps(recompute, static_cast<LayerOp>(op));
      (keep ? kept : elsewhere) += f.op[static_cast<std::size_t>(op)];
    }
    per_set += kept;
    if (recompute == Recompute::overlap) recompute_space += elsewhere;
    else shared = std::max(shared, elsewhere);
  }
  return 4 * (stage.activation_sets * per_set + shared + recompute_space);
}

std::array<double, kLayerOps> op_flops_per_token(const ModelConfig& model, int seq) {
  const double C = model.hidden, Q = model.qkv_channels(), F = model.mlp();
  return {2 * (2 * C + Q * C + Q),                              // ln1, QKV with its bias
          2 * C * seq,                                          // attention forward, causal: 2 h s
          2 * (C * C + C + 2 * C + F * C + F + C * F + C)};     // projection, ln2, MLP up and down
}

double recompute_flops_per_token(const ModelConfig& model, int seq, Recompute recompute,
                                 const std::vector<std::vector<KeptOps>>& kept_ops) {
  const std::array<double, kLayerOps> per_op = op_flops_per_token(model, seq);
  double flops = 0;
  if (recompute == Recompute::overlap) {
    for (const auto& stage : kept_ops)
      for (const KeptOps& layer : stage)
        for (int o = 0; o < kLayerOps; ++o)
          if (!layer[static_cast<std::size_t>(o)]) flops += per_op[static_cast<std::size_t>(o)];
    return flops;
  }
  for (int o = 0; o < kLayerOps; ++o)
    if (!keeps(recompute, static_cast<LayerOp>(o))) flops += model.layers * per_op[static_cast<std::size_t>(o)];
  return flops;
}

double workspace_bytes(const ModelConfig& model, int micro_batch, int seq, int tp, bool sp) {
  const TensorShard sh = tensor_shard(model, tp, 0);
  const double N = static_cast<double>(micro_batch) * seq, R = sp ? N / tp : N, C = model.hidden,
               A = sh.attention_channels(model), Q = sh.qkv_channels(model), KV = sh.kv_channels(model), F = sh.mlp;
  const double gathered = sp ? N * C + 2 * C : 0;
  return 4 * (2 * R * C + N * C + N * (3 * A + Q + 2 * KV + 2 * F) + gathered) + 8 * C;
}

HeldSizes held_sizes(const TrainConfig& c, const DataParallelShape& shape) {
  const ParameterLayout layout(c.model, tensor_shard(c.model, shape.tp, 0));
  const std::vector<Slice> units = layout.units();
  const std::vector<bool> trains = trainable_units(c.model, c.trainable);
  const RankUnits here = rank_units(c, shape);
  // units(): the embeddings, each layer, the final norm.
  std::size_t layer_tensor = 0;
  for (int t = 0; t < kLayerTensors; ++t)
    layer_tensor = std::max(layer_tensor, layout.tensor(0, static_cast<LayerTensor>(t)).size);
  const std::size_t embedding_tensor = std::max(layout.wte().size, layout.wpe().size);
  const std::size_t norm_tensor = std::max(layout.lnf_w().size, layout.lnf_b().size);
  HeldSizes h;
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (!here.held[u]) continue;
    h.parameters += static_cast<double>(units[u].size);
    if (trains[u]) h.trainable += static_cast<double>(units[u].size);
    const double gathered = static_cast<double>(padded(units[u].size, shape.n));
    h.largest_unit = std::max(h.largest_unit, gathered);
    const bool outer = u == 0 || u + 1 == units.size();
    if (outer) h.outer_units += gathered;
    else h.largest_layer = std::max(h.largest_layer, gathered);
    const std::size_t tensor = u == 0 ? embedding_tensor : u + 1 == units.size() ? norm_tensor : layer_tensor;
    h.largest_tensor = std::max(h.largest_tensor, static_cast<double>(tensor));
  }
  return h;
}

DataParallelBuffers data_parallel_buffers(const TrainConfig& c, const DataParallelShape& shape) {
  const double largest_unit_bytes = 4.0 * held_sizes(c, shape).largest_unit;  // fp32
  DataParallelBuffers b;
  if (c.strategy.params != Sharding::none) b.gathers += 4 * largest_unit_bytes;
  if (c.strategy.grads != Sharding::none) b.reductions += 4 * largest_unit_bytes;
  return b;
}

MemoryUse memory_estimate(const TrainConfig& c, const DataParallelShape& shape) {
  const HeldSizes h = held_sizes(c, shape);
  const RankUnits here = rank_units(c, shape);
  const ModelStateMemory states = model_state_memory(c.strategy, h.parameters, h.trainable, shape.m, shape.n,
                                                     kFp32States);
  MemoryUse use;
  use.params = states.params, use.grads = states.grads, use.optimizer = states.optimizer;
  const bool sp = c.sequence_parallel && shape.tp > 1;
  const double message = 4.0 * static_cast<double>(c.micro_batch) * c.seq / (sp ? shape.tp : 1) * c.model.hidden;
  for (const StagePlan& plan : here.stages) {
    use.activations += activation_bytes(c.model, c.micro_batch, c.seq, c.recompute, shape.tp, sp, plan);
    use.workspace += workspace_bytes(c.model, c.micro_batch, c.seq, shape.tp, sp);
    if (!plan.head) use.comm_buffers += message;                          // the received gradient of the output
    // Copies of the input's gradient wait for the stage below to receive them: at most one per micro-batch in
    // flight there, which in 1F1B is one more than here.
    if (!plan.embedding) use.comm_buffers += (plan.activation_sets + 1) * message;
  }
  use.comm_buffers += data_parallel_buffer_bytes(c, shape);
  return use;
}

}  // namespace strata::train
