// Implementation of the training step (see trainer.h).
#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
#include <numeric>
#include <stdexcept>

#include "collectives/mpi_error.h"
#include "train/clock.h"
#include "train/memory.h"
#include "train/shard_plan.h"
#include "train/stage_transfers.h"
#include "train/step_comm.h"

namespace strata::train {

using coll::DataType;
using coll::RedOp;

Trainable parse_trainable(const std::string& text) {
  Trainable t;
  if (text == "all") return t;
  if (text.rfind("last:", 0) == 0) {
    t.kind = Trainable::Kind::last_layers;
    try {
      std::size_t used = 0;
      t.last_layers = std::stoi(text.substr(5), &used);
      if (used == text.size() - 5 && t.last_layers >= 1) return t;
    } catch (const std::exception&) {
    }
    throw std::invalid_argument("--trainable " + text + ": expected last:K with K >= 1 layers");
  }
  try {
    std::size_t used = 0;
    t.fraction = std::stod(text, &used);
    if (used == text.size() && t.fraction > 0 && t.fraction <= 1) {
      t.kind = Trainable::Kind::fraction;
      return t;
    }
  } catch (const std::exception&) {
  }
  throw std::invalid_argument("--trainable " + text + ": expected all, last:K or a fraction in (0, 1]");
}

std::vector<bool> trainable_units(const ModelConfig& model, const Trainable& t) {
  const int L = model.layers;
  std::vector<bool> trains(static_cast<std::size_t>(L) + 2, t.kind == Trainable::Kind::all);
  if (t.kind == Trainable::Kind::all) return trains;
  int k = t.kind == Trainable::Kind::last_layers ? t.last_layers
                                                  : std::max(1, static_cast<int>(std::lround(t.fraction * L)));
  if (k > L) throw std::invalid_argument("--trainable asks for " + std::to_string(k) + " of " + std::to_string(L) + " layers");
  for (int l = L - k; l < L; ++l) trains[static_cast<std::size_t>(l) + 1] = true;
  trains.back() = true;  // the final norm trains with the last layers
  return trains;
}

float learning_rate(const LrSchedule& s, int64_t step) {
  if (s.warmup > 0 && step <= s.warmup) return s.max_lr * static_cast<float>(step) / static_cast<float>(s.warmup);
  if (s.total <= s.warmup) return s.max_lr;
  const double progress = std::min(1.0, static_cast<double>(step - s.warmup) / static_cast<double>(s.total - s.warmup));
  return s.min_lr + static_cast<float>(0.5 * (1 + std::cos(std::numbers::pi * progress))) * (s.max_lr - s.min_lr);
}

std::vector<int> stage_partition(const ModelConfig& model, int stages, const std::vector<int>& stage_layers) {
  const int L = model.layers;
  if (stage_layers.empty()) {
    if (stages == 1) return {L};
    if (L % stages != 0)
      throw std::invalid_argument(std::to_string(L) + " layers do not divide into " + std::to_string(stages) +
                                  " pipeline stages evenly: give each stage's layers (--stage-layers)");
    return std::vector<int>(static_cast<std::size_t>(stages), L / stages);
  }
  if (stage_layers.size() != static_cast<std::size_t>(stages))
    throw std::invalid_argument("--stage-layers gives " + std::to_string(stage_layers.size()) + " stages, the pipeline has " +
                                std::to_string(stages));
  for (int layers : stage_layers)
    if (layers < 1) throw std::invalid_argument("--stage-layers: every stage needs at least one layer");
  if (std::accumulate(stage_layers.begin(), stage_layers.end(), 0) != L)
    throw std::invalid_argument("--stage-layers adds up to " + std::to_string(std::accumulate(stage_layers.begin(), stage_layers.end(), 0)) +
                                " layers, the model has " + std::to_string(L));
  return stage_layers;
}

std::vector<StagePlan> rank_stages(const TrainConfig& c, int pp, int pp_rank) {
  const PipelineShape shape{pp, c.accumulation, c.virtual_stages};
  const int stages = pp * c.virtual_stages;
  const std::vector<int> partition = stage_partition(c.model, stages, c.stage_layers);
  const std::vector<int> held = in_flight(pipeline_actions(c.schedule, shape, pp_rank), c.virtual_stages);
  if (c.recompute == Recompute::overlap && c.kept_ops.size() != static_cast<std::size_t>(stages))
    throw std::invalid_argument("recompute overlap needs the kept ops of each of the " + std::to_string(stages) + " stages");
  std::vector<StagePlan> plans;
  for (int chunk = 0; chunk < c.virtual_stages; ++chunk) {
    const int stage = stage_of(shape, pp_rank, chunk);
    StagePlan plan{std::accumulate(partition.begin(), partition.begin() + stage, 0), partition[static_cast<std::size_t>(stage)],
                   stage == 0, stage == stages - 1, std::max(1, held[static_cast<std::size_t>(chunk)]), {}};
    if (c.recompute == Recompute::overlap) plan.kept = c.kept_ops[static_cast<std::size_t>(stage)];
    plans.push_back(std::move(plan));
  }
  return plans;
}

std::vector<bool> units_held(const ModelConfig& model, const std::vector<StagePlan>& stages) {
  std::vector<bool> held(static_cast<std::size_t>(model.layers) + 2, false);
  for (const StagePlan& plan : stages) {
    for (int l = plan.first_layer; l < plan.first_layer + plan.layers; ++l) held[static_cast<std::size_t>(l) + 1] = true;
    if (plan.embedding || plan.head) held[0] = true;
    if (plan.head) held.back() = true;
  }
  return held;
}

const char* name(CommTier tier) {
  switch (tier) {
    case CommTier::intra: return "intra";
    case CommTier::inter: return "inter";
    case CommTier::global: return "global";
  }
  return "?";
}

namespace {

// Transient buffers of the step (gathered units, per-micro-batch gradients, reduction targets) come from here:
// page-aligned, allocated the first time more buffers of a size are in use at once than before, and reused
// after, so steps allocate only while the most in flight at once still grows (the first step, usually). What
// the pool holds is that most.
class BufferPool {
 public:
  Backing backing = Backing::memory;  // a traced step's buffers are addresses only
  TrackedBuffer<float> take(std::size_t floats) {
    for (std::size_t i = 0; i < free_.size(); ++i)
      if (free_[i].size() == floats) {
        TrackedBuffer<float> buffer = std::move(free_[i]);
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        if (backing == Backing::memory) buffer.fill(0.0f);
        return buffer;
      }
    held_bytes_ += 4.0 * static_cast<double>(floats);
    return TrackedBuffer<float>(MemoryCategory::comm_buffers, floats, backing);
  }
  void give(TrackedBuffer<float>& buffer) {
    if (!buffer.empty()) free_.push_back(std::move(buffer));
  }
  double held_bytes() const { return held_bytes_; }

 private:
  std::vector<TrackedBuffer<float>> free_;
  double held_bytes_ = 0;
};

}  // namespace

struct Trainer::Impl {
  using Op = StepComm::Op;
  struct Unit : UnitShape {
    bool present = false;  // one of this rank's stages holds it (the head's copy of the token table included)
    bool trains = false;
    std::size_t param_at = 0, grad_at = 0, opt_at = 0;  // offsets in the persistent stores
  };
  TrainConfig c;
  coll::Group& dp;
  coll::Group& intra;
  coll::Group& inter;
  coll::Group& tp;  // the tensor-parallel group (size 1 without tensor parallelism)
  coll::Group& pp;  // the pipeline group (size 1 without pipeline parallelism)
  std::unique_ptr<coll::Group> pieces;  // the data-parallel ranks ordered by global piece
  // The first and the last stage's ranks of my pipeline (p > 1): they sum the tied token table's gradient.
  std::unique_ptr<coll::Group> embedding;
  const TokenSource* data;  // null when traced
  Tracer* tracer;           // traced: the recorder; null when the step runs
  PipelineShape shape;
  std::vector<PipelineAction> actions;    // this rank's schedule
  std::vector<std::unique_ptr<GptCpu>> chunks;  // one model per stage this rank runs (chunk c: stage c p + rank)
  std::vector<bool> chunk_backward;       // whether the chunk's stage has a backward pass (something at or below trains)
  std::vector<bool> chunk_input_grad;     // whether the chunk's stage sends its input's gradient back
  std::vector<TrackedBuffer<float>> output_grads;  // per chunk: the received gradient of its output (R, C)
  int n = 1, m = 1, g = 1, local = 0, node = 0, my_piece = 0;
  std::optional<ShardPlan> plan;
  std::vector<Unit> units;
  std::vector<Slice> unit_slices;  // each unit in the model's layout
  std::vector<Slice> replicated;   // under tensor parallelism: tensors every rank of the group holds whole
  TrackedBuffer<float> params, grads, adam_m, adam_v;
  std::vector<TrackedBuffer<float>> gathered, unit_grads, reduced;  // transient, per unit, from the pool
  BufferPool pool;
  StepComm comms;  // the data-parallel collectives in flight, and what the step waited for
  StageTransfers transfers;  // the pipeline's sends and receives
  std::size_t lowest_trainable = 0;  // the backward pass stops at this unit
  std::vector<int32_t> tokens, targets;

  Impl(const TrainConfig& config, coll::ProcessGroups& groups, const TokenSource* source, Tracer* tracer_of_step)
      : c(config), dp(groups.dp()), intra(groups.dp_intra()), inter(groups.dp_inter()), tp(groups.tp()), pp(groups.pp()),
        data(source), tracer(tracer_of_step), comms(groups.dp_intra(), groups.dp_inter(), c.overlap, tracer_of_step),
        transfers(groups.pp(), comms, tracer_of_step, [this](TrackedBuffer<float>& b) { release(b); }) {
    if (tracer) c.runtime.tracer = tracer, pool.backing = Backing::address_space;
    const Backing backing = tracer ? Backing::address_space : Backing::memory;
    if (const std::string why = refusal_reason(c.strategy); !why.empty())
      throw std::invalid_argument("strategy " + c.strategy.name() + " is not run: " + why);
    if (c.accumulation < 1) throw std::invalid_argument("accumulation must be at least 1 micro-batch");
    shape = {pp.size(), c.accumulation, c.virtual_stages};
    if (const std::string why = schedule_refusal(c.schedule, shape); !why.empty())
      throw std::invalid_argument(std::string("schedule ") + name(c.schedule) + " on " + std::to_string(shape.stages) +
                                  " pipeline stages: " + why);
    actions = pipeline_actions(c.schedule, shape, pp.rank());
    const std::vector<bool> trains = trainable_units(c.model, c.trainable);
    std::size_t lowest_trains = trains.size();  // the lowest unit that trains (0: the embeddings)
    for (std::size_t u = trains.size(); u-- > 0;)
      if (trains[u]) lowest_trains = u;
    const std::vector<StagePlan> plans = rank_stages(c, shape.stages, pp.rank());
    for (int chunk = 0; chunk < shape.chunks; ++chunk) {
      const StagePlan& plan = plans[static_cast<std::size_t>(chunk)];
      const int stage = stage_of(shape, pp.rank(), chunk);
      chunks.push_back(std::make_unique<GptCpu>(c.model, c.micro_batch, c.seq, c.runtime, c.recompute, &groups.tp(),
                                                c.sequence_parallel, plan));
      // A stage has a backward pass when anything at or below it trains (the head's copy of the token table trains
      // with the embeddings), and sends its input's gradient back when something below it trains.
      const std::size_t first_unit = stage == 0 ? 0 : static_cast<std::size_t>(plan.first_layer) + 1;
      const std::size_t last_unit = plan.head ? trains.size() - 1 : static_cast<std::size_t>(plan.first_layer + plan.layers);
      chunk_backward.push_back(lowest_trains <= last_unit);
      chunk_input_grad.push_back(stage > 0 && lowest_trains < first_unit);
      output_grads.emplace_back(MemoryCategory::comm_buffers,
                                plan.head ? 0 : chunks.back()->rows_here() * static_cast<std::size_t>(c.model.hidden), backing);
    }
    n = dp.size(), m = intra.size(), g = inter.size(), local = intra.rank(), node = inter.rank();
    if (!dp.even_nodes() || m * g != n)
      throw std::invalid_argument("data-parallel ranks are spread unevenly over the groups (" + std::to_string(n) + " over " +
                                  std::to_string(dp.node_count()) + " nodes): every group needs the same size");
    plan.emplace(c.strategy, n, m, g, local, node);
    my_piece = plan->my_piece();
    // Every data-parallel rank's piece: l g + k, l its place among its node's ranks, k its node's place (the order
    // in which the nodes first hold a rank, as the inter group numbers them).
    std::vector<int> piece_of(static_cast<std::size_t>(n));
    {
      std::map<int, int> node_place, held;
      for (int r = 0; r < n; ++r) {
        const int at = dp.node_of_rank()[static_cast<std::size_t>(r)];
        node_place.try_emplace(at, static_cast<int>(node_place.size()));
        piece_of[static_cast<std::size_t>(r)] = held[at]++ * g + node_place[at];
      }
    }
    pieces = dp.reordered("dp_by_piece", piece_of);
    if (shape.stages > 1) {
      // The two copies of the token table must be cut into the same pieces: the same place in the data-parallel
      // groups on both stages.
      embedding = pp.subgroup("embedding", {0, shape.stages - 1});
      if (embedding && !tracer) {
        int pieces_here[2] = {my_piece, -my_piece};
        STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, pieces_here, 2, MPI_INT, MPI_MAX, embedding->comm()));
        if (pieces_here[0] != -pieces_here[1])
          throw std::invalid_argument("the first and the last pipeline stage place their data-parallel ranks differently "
                                      "over the groups: the tied token table's shards would not match");
      }
    }

    const ParameterLayout& layout = chunks.front()->layout();  // this rank's tensor-parallel shard
    const std::vector<Slice> slices = layout.units();
    unit_slices = slices;
    if (tp.size() > 1) replicated = layout.replicated();
    const std::vector<bool> present = units_held(c.model, plans);
    std::size_t param_total = 0, grad_total = 0, opt_total = 0;
    for (std::size_t u = 0; u < slices.size(); ++u) {
      Unit unit;
      static_cast<UnitShape&>(unit) = plan->shape(slices[u].size);
      unit.present = present[u];
      unit.trains = present[u] && trains[u];
      if (unit.present) unit.param_at = std::exchange(param_total, param_total + held(unit, c.strategy.params));
      if (unit.trains) {
        unit.grad_at = std::exchange(grad_total, grad_total + held(unit, c.strategy.grads));
        unit.opt_at = std::exchange(opt_total, opt_total + held(unit, c.strategy.optimizer));
      }
      units.push_back(unit);
    }
    params = TrackedBuffer<float>(MemoryCategory::parameters, param_total, backing);
    grads = TrackedBuffer<float>(MemoryCategory::gradients, grad_total, backing);
    adam_m = TrackedBuffer<float>(MemoryCategory::optimizer, opt_total, backing);
    adam_v = TrackedBuffer<float>(MemoryCategory::optimizer, opt_total, backing);
    lowest_trainable = units.size();
    for (std::size_t u = units.size(); u-- > 0;)
      if (units[u].trains) lowest_trainable = u;
    gathered.resize(units.size());
    gather_state.assign(units.size(), Gathered::absent);
    gather_op.assign(units.size(), -1);
    reducing_op.assign(units.size(), -1);
    reducing.assign(units.size(), false);
    unit_grads.resize(units.size());
    reduced.resize(units.size());

    tokens.resize(static_cast<std::size_t>(c.micro_batch) * c.seq);
    targets.resize(tokens.size());
    if (tracer) return;  // a traced step holds no parameters
    // Every rank initialises the whole model from the seed and keeps what its strategy holds.
    std::vector<float> full(layout.total());
    init_parameters(c.model, layout, full.data(), c.seed, c.init_std);
    for (std::size_t u = 0; u < units.size(); ++u) {
      const Unit& unit = units[u];
      if (!unit.present) continue;
      const std::size_t begin = piece_offset(unit, c.strategy.params);
      for (std::size_t i = 0; i < held(unit, c.strategy.params); ++i) {
        const std::size_t at = begin + i;  // position in the padded unit
        params[unit.param_at + i] = at < unit.size ? full[slices[u].offset + at] : 0.0f;
      }
    }
  }

  // Elements of a unit a state sharded this way holds on this rank, and where they start in the padded unit.
  std::size_t held(const Unit& u, Sharding s) const { return plan->held(u, s); }
  std::size_t piece_offset(const Unit& u, Sharding s) const { return plan->piece_offset(u, s); }

  // The data-parallel group a collective of the shard plan runs over.
  coll::Group& group_of(ShardPlan::Over over) {
    switch (over) {
      case ShardPlan::Over::intra: return intra;
      case ShardPlan::Over::inter: return inter;
      case ShardPlan::Over::pieces: return *pieces;
      case ShardPlan::Over::all: return dp;
      case ShardPlan::Over::none: break;
    }
    throw std::logic_error("a collective of the shard plan over no group");
  }

  // ---- transient buffers --------------------------------------------------------------------------------
  void allocate(TrackedBuffer<float>& buffer, std::size_t floats) {
    if (buffer.empty()) buffer = pool.take(floats);
  }
  void release(TrackedBuffer<float>& buffer) { pool.give(buffer); }

  // ---- parameters: gathered before use when sharded ------------------------------------------------------
  // A sharded unit's gathered copy: absent, arriving, or ready to read.
  enum class Gathered { absent, arriving, ready };
  std::vector<Gathered> gather_state;
  std::vector<int> gather_op, reducing_op;  // traced: the operation a unit's gather, or its reduction, is

  void start_gather(std::size_t u) {
    if (c.strategy.params == Sharding::none || u >= units.size() || gather_state[u] != Gathered::absent) return;
    const Unit& unit = units[u];
    allocate(gathered[u], unit.padded);
    const float* mine = params.data() + unit.param_at;
    const ShardPlan::UnitCollective gather = plan->parameter_gather(unit);
    coll::Group& group = group_of(gather.over);
    gather_state[u] = Gathered::arriving;
    Op op = comms.track(group, "allgather params " + std::to_string(u), unit.padded,
                        group.allgather(c.comm_algo, mine, gathered[u].data(), gather.count, DataType::float32));
    gather_op[u] = op.trace_op;
    comms.launch(std::move(op), [this, u] { gather_state[u] = Gathered::ready; });
  }

  void need_params(std::size_t u) {
    if (c.strategy.params == Sharding::none) return;
    start_gather(u);
    comms.wait_until([&] { return gather_state[u] == Gathered::ready; }, {gather_op[u]});
  }
  void drop_params(std::size_t u) {
    if (c.strategy.params == Sharding::none || gather_state[u] != Gathered::ready) return;
    release(gathered[u]);
    gather_state[u] = Gathered::absent;
  }

  const float* unit_params(std::size_t u) const {
    return c.strategy.params == Sharding::none ? params.data() + units[u].param_at : gathered[u].data();
  }

  // ---- gradients: reduced into the form the strategy keeps, per micro-batch and at the last ------------------
  // A fresh, zeroed buffer for unit u's gradient of this micro-batch, once the previous micro-batch's has been
  // reduced out of it.
  std::vector<bool> reducing;
  float* unit_grad_buffer(std::size_t u) {
    if (!units[u].trains) return nullptr;
    if (c.strategy.grads == Sharding::none) return grads.data() + units[u].grad_at;
    comms.wait_until([&] { return !reducing[u]; }, {reducing_op[u]});
    allocate(unit_grads[u], units[u].padded);
    return unit_grads[u].data();
  }

  // The reductions that turn what the grads store holds into the optimizer's shard, at the last micro-batch
  // (ShardPlan::final_reductions), the second started when the first is done.
  Op reduce_for_optimizer(std::size_t u) {
    const std::vector<ShardPlan::Reduction> steps = plan->final_reductions(units[u]);
    if (steps.empty()) return Op{};
    if (steps.size() == 1) return start_reduction(u, steps[0]);
    comms.launch_chain(start_reduction(u, steps[0]), {}, [this, u, second = steps[1]] { return start_reduction(u, second); });
    return Op{};
  }
  Op start_reduction(std::size_t u, const ShardPlan::Reduction& r) {
    float* store = grads.data() + units[u].grad_at;
    float* in = store + r.in_offset;
    float* out = store + r.out_offset;
    coll::Group& group = group_of(r.over);
    const std::string what = std::string(r.allreduce ? "allreduce" : "reduce_scatter") + " grads " + std::to_string(u);
    if (r.allreduce)
      return comms.track(group, what, r.count, group.allreduce(c.comm_algo, in, out, r.count, DataType::float32, RedOp::sum));
    return comms.track(group, what, r.count * static_cast<std::size_t>(group.size()),
                 group.reduce_scatter(c.comm_algo, in, out, r.count, DataType::float32, RedOp::sum));
  }

  // first, last: this is the first or the last backward of the unit's stage in the step.
  void gradients_ready(std::size_t u, bool first, bool last) {
    const Unit& unit = units[u];
    if (!unit.trains) return;
    const Sharding gs = c.strategy.grads;
    if (gs == Sharding::none) {
      if (last) comms.launch(reduce_for_optimizer(u));
      return;
    }
    // Reduce this micro-batch's unit gradient into the kept shard: straight into it at the first backward,
    // through a buffer and a sum after that.
    const ShardPlan::UnitCollective reduction = plan->micro_batch_reduction(unit);
    coll::Group& group = group_of(reduction.over);
    const std::size_t count = reduction.count;
    float* store = grads.data() + unit.grad_at;
    float* out = store;
    if (!first) {
      allocate(reduced[u], count);
      out = reduced[u].data();
    }
    Op work = comms.track(group, "reduce_scatter grads " + std::to_string(u), unit.padded,
                    group.reduce_scatter(c.comm_algo, unit_grads[u].data(), out, count, DataType::float32, RedOp::sum));
    reducing[u] = true;
    reducing_op[u] = work.trace_op;
    auto then = [this, u, first, count, store, out] {
      reducing[u] = false;
      release(unit_grads[u]);
      if (!first) {
        compute("accumulate grads", 3.0 * static_cast<double>(count), [&] { layers::accumulate(store, out, count, {}); });
        release(reduced[u]);
      }
    };
    if (last && gs == Sharding::intra)
      comms.launch_chain(std::move(work), then, [this, u] { return reduce_for_optimizer(u); });
    else
      comms.launch(std::move(work), then);
  }

  // Where the optimizer's shard of unit u lives in the gradient store after the last reduction.
  float* optimizer_grads(std::size_t u) {
    return grads.data() + units[u].grad_at + plan->optimizer_grads_offset(units[u]);
  }
  // Where the parameters the optimizer updates live in the parameter store.
  float* optimizer_params(std::size_t u) { return params.data() + units[u].param_at + plan->optimizer_params_offset(units[u]); }
  // After the update: the parameter holders get the new values.
  void synchronise_parameters(std::size_t u) {
    const Unit& unit = units[u];
    const ShardPlan::Synchronise sync = plan->synchronise(unit);
    if (sync.over == ShardPlan::Over::none) return;
    float* held_params = params.data() + unit.param_at;
    coll::Group& group = group_of(sync.over);
    comms.launch(comms.track(group, "allgather params " + std::to_string(u), sync.count * static_cast<std::size_t>(group.size()),
                 group.allgather(c.comm_algo, held_params + sync.from, held_params, sync.count, DataType::float32)));
  }

  // A scalar summed over a group (the gradient norm's squares, the loss); not on the timeline.
  double allreduce_sum(coll::Group& group, double value, const char* what) {
    if (tracer) tracer->name_next(what);
    coll::Work work = group.allreduce(coll::Algo::library, &value, &value, 1, DataType::float64, RedOp::sum, coll::Waiting::at_once);
    finish(work);
    return value;
  }
  // Waits for an operation just started (a traced one completes when told).
  void finish(coll::Work& work) {
    if (tracer) tracer->complete(tracer->last_operation());
    work.wait();
  }
  // A computation of the step outside the model: it runs, or a traced step records the elements it moves.
  template <typename Run>
  void compute(const char* what, double elements, const Run& run) {
    if (tracer) tracer->elementwise(what, elements);
    else run();
  }

  // ---- the pipeline: transfers between stages -------------------------------------------------------------
  using Transfer = StageTransfers::Transfer;
  std::vector<std::optional<Transfer>> sets_sending;  // per chunk and set: the send of that set's output
  std::optional<Transfer> receiving;                  // the receive the next action waits for

  // A traced step's ops carry the phase strata-step times them in (TraceOp::phase).
  void trace_phase(const char* phase) {
    if (tracer) tracer->set_phase(phase);
  }

  // ---- recomputation in windows (Recompute::overlap) -------------------------------------------------------
  // Before waiting for action k's receive, the recomputations placed there run, in order (producers first); the
  // time until the receive is seen done is hidden behind the wait, the rest is on the critical path. Each layer
  // is gathered first where parameters are sharded; it stays for the backward that follows.
  template <typename Point>
  void run_window(std::size_t k, StepStats& stats, UnitPointers& pointers, const Point& point, const LayerHooks& hooks) {
    const double start = host_seconds(), exposed_before = comms.exposed;
    double hidden_until = 0;  // when the receive was first seen done
    bool any = false;
    for (const TrainConfig::WindowRecompute& w : c.window_recomputes) {
      if (w.action != static_cast<int>(k)) continue;
      any = true;
      trace_phase("recompute_window");
      const std::size_t u = static_cast<std::size_t>(w.layer) + 1;
      need_params(u);
      point(u);
      GptCpu& model = *chunks[static_cast<std::size_t>(w.chunk)];
      const double op_start = host_seconds();
      model.recompute(w.micro % model.stage().activation_sets, w.layer, w.op, pointers, hooks);
      if (comms.timeline)
        comms.timeline->push_back({"recompute mb " + std::to_string(w.micro) + " L" + std::to_string(w.layer) + " " + name(w.op),
                             "compute", "", op_start, host_seconds(), 0});
      if (hidden_until == 0 && (!receiving || receiving->work.test())) hidden_until = host_seconds();
    }
    if (!any) return;
    trace_phase("");
    const double end = host_seconds(), waited = comms.exposed - exposed_before;
    stats.recompute_window_seconds += end - start - waited;
    stats.recompute_hidden_seconds += std::max(0.0, (hidden_until > 0 ? hidden_until : end) - start - waited);
  }
  // ---- the step -----------------------------------------------------------------------------------------
  // What a step's actions share: the pointers the model reads, the loss, where each chunk's gradients start and
  // finish accumulating, each chunk's first entry in sets_sending, the unit whose backward runs, the hooks of the
  // recomputations in windows.
  struct StepState {
    explicit StepState(StepStats& s) : stats(s) {}
    StepStats& stats;
    int64_t step_index = 0;
    float normaliser = 1;  // tokens of the global batch
    UnitPointers pointers;
    double loss_sum = 0;
    std::vector<int> first_backward, last_backward;  // per chunk: action indices
    std::vector<std::size_t> set_base;               // per chunk: its first entry in sets_sending
    double unit_backward_start = 0, unit_exposed_start = 0, unit_recompute = 0;
    double recompute_start = 0, recompute_exposed_start = 0;
    LayerHooks window_hooks;  // recomputations in windows report their tensor-parallel collectives too
  };

  StepStats step(int64_t step_index, bool record_timeline) {
    StepStats stats;
    const double step_start = host_seconds();
    StepState s(stats);
    s.step_index = step_index;
    begin_step(s, record_timeline);
    for (std::size_t k = 0; k < actions.size(); ++k) run_action(s, k);
    drain_transfers();
    reduce_embedding_gradients();
    optimizer_step(s);
    finish_step(s, step_start);
    return stats;
  }

  // Time of a compute phase without the waits inside it, and its interval on the timeline.
  template <typename Body>
  void compute_phase(const char* phase, const std::string& what, double& seconds, const Body& body) {
    const double exposed_before = comms.exposed, start = host_seconds();
    trace_phase(phase);
    body();
    trace_phase("");
    if (tracer) tracer->set_unit(-1);
    const double end = host_seconds();
    seconds += end - start - (comms.exposed - exposed_before);
    if (comms.timeline) comms.timeline->push_back({what, "compute", "", start, end, 0});
  }

  // Tensor-parallel collectives block inside the passes: all of their time is exposed communication.
  void tensor_parallel_comm(StepStats& stats, const char* what, double start, double end, std::size_t bytes) {
    comms.exposed += end - start;
    stats.tp_comm_seconds += end - start;
    stats.tp_comm_bytes += static_cast<double>(bytes);
    if (comms.timeline) comms.timeline->push_back({what, "comm", "tp", start, end, static_cast<double>(bytes)});
  }

  // The counters and per-chunk figures zeroed, each chunk's first and last backward found, the first receive posted.
  void begin_step(StepState& s, bool record_timeline) {
    StepStats& stats = s.stats;
    comms.begin_step(record_timeline ? &stats.timeline : nullptr);
    transfers.begin_step();
    s.normaliser = static_cast<float>(static_cast<double>(n) * c.accumulation * c.micro_batch * c.seq);
    s.first_backward.assign(chunks.size(), -1), s.last_backward.assign(chunks.size(), -1);
    for (std::size_t k = 0; k < actions.size(); ++k)
      if (actions[k].pass == PipelineAction::Pass::backward) {
        const auto ch = static_cast<std::size_t>(actions[k].chunk);
        if (s.first_backward[ch] < 0) s.first_backward[ch] = static_cast<int>(k);
        s.last_backward[ch] = static_cast<int>(k);
      }
    sets_sending.resize(0);
    for (const auto& chunk : chunks) sets_sending.resize(sets_sending.size() + static_cast<std::size_t>(chunk->stage().activation_sets));
    s.set_base.assign(chunks.size(), 0);
    for (std::size_t ch = 1; ch < chunks.size(); ++ch)
      s.set_base[ch] = s.set_base[ch - 1] + static_cast<std::size_t>(chunks[ch - 1]->stage().activation_sets);

    stats.receive_waits.assign(actions.size(), 0.0);
    stats.forward_op_seconds.clear();
    stats.layer_backward_seconds.clear();
    stats.layer_recompute_seconds.clear();
    stats.stage_extra_seconds.assign(chunks.size(), 0.0);
    for (const auto& chunk : chunks) {
      const std::size_t layers = static_cast<std::size_t>(chunk->stage().layers);
      stats.forward_op_seconds.emplace_back(layers, std::array<double, kLayerOps>{});
      stats.layer_backward_seconds.emplace_back(layers, 0.0);
      stats.layer_recompute_seconds.emplace_back(layers, 0.0);
    }
    s.pointers.params.assign(units.size(), nullptr);
    s.pointers.grads.assign(units.size(), nullptr);
    if (!tracer)  // a traced step runs nothing to time: no clock read per layer op or tensor-parallel collective
      s.window_hooks.tensor_parallel_comm = [this, &stats](const char* what, double start, double end, std::size_t bytes) {
        tensor_parallel_comm(stats, what, start, end, bytes);
      };
    if (!actions.empty()) receiving = receive_for(0);
  }

  // What action k receives before it runs: a stage's input (forward) or its output's gradient (backward).
  std::optional<Transfer> receive_for(std::size_t k) {
    const PipelineAction& a = actions[k];
    const auto ch = static_cast<std::size_t>(a.chunk);
    GptCpu& model = *chunks[ch];
    const int last_stage = shape.stages * shape.chunks - 1;
    const int stage = stage_of(shape, pp.rank(), a.chunk), set = a.micro % model.stage().activation_sets;
    const std::size_t floats = model.rows_here() * static_cast<std::size_t>(c.model.hidden);
    const std::string label = " mb " + std::to_string(a.micro) + " stage " + std::to_string(stage);
    if (a.pass == PipelineAction::Pass::forward && stage > 0)
      return transfers.receive(model.stage_input(set), floats, stage - 1, "recv activations" + label);
    if (a.pass == PipelineAction::Pass::backward && stage < last_stage && chunk_backward[ch])
      return transfers.receive(output_grads[ch].data(), floats, stage + 1, "recv gradients" + label);
    return std::nullopt;
  }

  void point(UnitPointers& pointers, std::size_t u) { pointers.params[u] = unit_params(u); }

  // The hooks of one pass of chunk `ch`: parameters gathered ahead and dropped behind, gradient buffers handed out,
  // gradients reduced as each unit's backward ends (`first` and `last`: the chunk's first and last backward of the
  // step), and the times of layers, ops and recomputations. The backward reaches down to unit `lowest_reached`.
  LayerHooks unit_hooks(StepState& s, std::size_t ch, bool first, bool last, std::size_t lowest_reached) {
    const StagePlan& plan = chunks[ch]->stage();
    const int L = c.model.layers;
    const int first_unit = plan.first_layer + 1, end_unit = plan.first_layer + plan.layers + 1;  // the layers' units
    LayerHooks hooks;
    hooks.before_forward = [this, &s, &plan, L, first_unit, end_unit](int layer) {
      const std::size_t u = static_cast<std::size_t>(layer + 1);
      if (tracer) tracer->set_unit(static_cast<int>(u));
      comms.at_hook();
      need_params(u);
      point(s.pointers, u);
      const bool next_here = static_cast<int>(u) + 1 < end_unit || (plan.head && static_cast<int>(u) + 1 == end_unit);
      if (c.overlap && next_here) start_gather(u + 1);  // the next unit arrives while this one computes
      if (u == static_cast<std::size_t>(L) + 1) need_params(0), point(s.pointers, 0);  // the tied head reads the token table
      if (static_cast<int>(u) > first_unit && static_cast<int>(u) < end_unit) drop_params(u - 1);  // gathered again for backward
      if (static_cast<int>(u) == first_unit && !plan.head) drop_params(0);  // the first stage's lookup is done
      if (u == static_cast<std::size_t>(L) + 1 && L >= 1) drop_params(static_cast<std::size_t>(L));
    };
    hooks.before_backward = [this, &s, L, first_unit, lowest_reached](int layer) {
      const std::size_t u = static_cast<std::size_t>(layer + 1);
      if (tracer) tracer->set_unit(static_cast<int>(u));
      comms.at_hook();
      s.unit_backward_start = host_seconds(), s.unit_exposed_start = comms.exposed, s.unit_recompute = 0;
      if (u >= 1) {
        need_params(u);
        point(s.pointers, u);
      }
      if (u == static_cast<std::size_t>(L) + 1) need_params(0), point(s.pointers, 0);  // the head's backward reads the token table
      if (c.overlap && static_cast<int>(u) - 1 >= first_unit && u - 1 >= lowest_reached && u >= 2) start_gather(u - 1);
      if (units[u].trains) s.pointers.grads[u] = unit_grad_buffer(u);
      // The token table's gradient buffer: the head's (its copy, or the one table when the stage has both).
      if (u == static_cast<std::size_t>(L) + 1 && units[0].trains) s.pointers.grads[0] = unit_grad_buffer(0);
    };
    hooks.after_backward = [this, &s, &plan, ch, L, first, last](int layer) {
      const std::size_t u = static_cast<std::size_t>(layer + 1);
      const double spent = host_seconds() - s.unit_backward_start - (comms.exposed - s.unit_exposed_start) - s.unit_recompute;
      if (layer >= plan.first_layer && layer < plan.first_layer + plan.layers) {
        s.stats.layer_backward_seconds[ch][static_cast<std::size_t>(layer - plan.first_layer)] += spent;
        s.stats.layer_recompute_seconds[ch][static_cast<std::size_t>(layer - plan.first_layer)] += s.unit_recompute;
      } else {
        s.stats.stage_extra_seconds[ch] += spent;  // the head's or the embeddings' backward
      }
      if (u == static_cast<std::size_t>(L) + 1) {
        gradients_ready(u, first, last);
        drop_params(u);
        if (!plan.embedding) gradients_ready(0, first, last);  // the head's copy is complete
        drop_params(0);  // the head was the last reader of the token table
      } else {
        if (u >= 1) drop_params(u);
        gradients_ready(u, first, last);
      }
      comms.at_hook();
    };
    hooks.tensor_parallel_comm = s.window_hooks.tensor_parallel_comm;
    if (!tracer)
      hooks.forward_op = [&s, &plan, ch](int layer, LayerOp op, double seconds) {
        s.stats.forward_op_seconds[ch][static_cast<std::size_t>(layer - plan.first_layer)][static_cast<std::size_t>(op)] += seconds;
      };
    // As every compute phase, without the waits inside it (the tensor-parallel collectives of the layer's forward).
    hooks.before_recompute = [this, &s](int) {
      s.recompute_start = host_seconds(), s.recompute_exposed_start = comms.exposed;
      trace_phase("recompute");
    };
    hooks.after_recompute = [this, &s](int layer) {
      trace_phase("backward");
      const double end = host_seconds(), spent = end - s.recompute_start - (comms.exposed - s.recompute_exposed_start);
      s.stats.recompute_seconds += spent;
      s.unit_recompute += spent;
      if (comms.timeline) comms.timeline->push_back({"recompute " + std::to_string(layer), "compute", "", s.recompute_start, end, 0});
    };
    return hooks;
  }

  // Action k of the schedule: the recomputations placed in its window, its receive waited for, its micro-batch's
  // rows read, its pass run, its output or input gradient sent on; the next action's receive posted.
  void run_action(StepState& s, std::size_t k) {
    const PipelineAction& a = actions[k];
    const auto ch = static_cast<std::size_t>(a.chunk);
    const StagePlan& plan = chunks[ch]->stage();
    const int stage = stage_of(shape, pp.rank(), a.chunk), set = a.micro % plan.activation_sets;
    const bool forward = a.pass == PipelineAction::Pass::forward;
    const std::string label = " mb " + std::to_string(a.micro) + (shape.stages > 1 ? " stage " + std::to_string(stage) : "");
    run_window(k, s.stats, s.pointers, [&](std::size_t u) { point(s.pointers, u); }, s.window_hooks);
    if (receiving) {
      const double waited_before = transfers.stats.wait_seconds;
      transfers.complete(*receiving);
      s.stats.receive_waits[k] = transfers.stats.wait_seconds - waited_before;
      receiving.reset();
    }
    // The micro-batch's rows: tokens for the first stage, targets for the last.
    if (forward && (plan.embedding || plan.head)) {
      const int64_t first_row = (static_cast<int64_t>(a.micro) * n + dp.rank()) * c.micro_batch;
      tokens.resize(static_cast<std::size_t>(c.micro_batch) * c.seq);
      targets.resize(tokens.size());
      if (data) data->rows(s.step_index, first_row, c.micro_batch, c.seq, tokens.data(), targets.data());
    }
    const bool first = static_cast<int>(k) == s.first_backward[ch], last = static_cast<int>(k) == s.last_backward[ch];
    const int first_unit = plan.first_layer + 1;
    // The lowest unit this backward reaches (the pass stops at the lowest trainable one unless the stage sends its
    // input's gradient back).
    const std::size_t lowest_reached = plan.embedding && units[0].trains ? 0
                                       : chunk_input_grad[ch]           ? static_cast<std::size_t>(first_unit)
                                                                        : std::max(lowest_trainable, static_cast<std::size_t>(first_unit));
    const LayerHooks hooks = unit_hooks(s, ch, first, last, lowest_reached);
    for (std::size_t u = 0; u < units.size(); ++u) s.pointers.params[u] = nullptr, s.pointers.grads[u] = nullptr;
    if (forward) forward_action(s, ch, stage, set, label, hooks);
    else if (chunk_backward[ch]) backward_action(s, ch, stage, set, label, hooks);
    if (k + 1 < actions.size()) receiving = receive_for(k + 1);
    transfers.progress();
  }

  void forward_action(StepState& s, std::size_t ch, int stage, int set, const std::string& label, const LayerHooks& hooks) {
    GptCpu& model = *chunks[ch];
    const StagePlan& plan = model.stage();
    StepStats& stats = s.stats;
    // The set's previous output must have left before this forward writes it again.
    std::optional<Transfer>& previous = sets_sending[s.set_base[ch] + static_cast<std::size_t>(set)];
    if (previous) {
      transfers.complete(*previous);
      previous.reset();
    }
    const double forward_before = stats.forward_seconds;
    double layer_ops_before = 0;
    for (const auto& layer : stats.forward_op_seconds[ch]) layer_ops_before += layer[0] + layer[1] + layer[2];
    compute_phase("forward", "forward" + label, stats.forward_seconds, [&] {
      s.loss_sum += model.forward(set, s.pointers, tokens.data(), targets.data(), hooks);
    });
    double layer_ops = -layer_ops_before;
    for (const auto& layer : stats.forward_op_seconds[ch]) layer_ops += layer[0] + layer[1] + layer[2];
    stats.stage_extra_seconds[ch] += std::max(0.0, stats.forward_seconds - forward_before - layer_ops);
    const int end_unit = plan.first_layer + plan.layers + 1;
    if (!plan.head) drop_params(static_cast<std::size_t>(end_unit) - 1);  // gathered again for its backward
    if (stage < shape.stages * shape.chunks - 1) {
      const std::size_t floats = model.rows_here() * static_cast<std::size_t>(c.model.hidden);
      previous = transfers.send(model.stage_output(set), floats, stage + 1, "send activations" + label);
    }
  }

  void backward_action(StepState& s, std::size_t ch, int stage, int set, const std::string& label, const LayerHooks& hooks) {
    GptCpu& model = *chunks[ch];
    const StagePlan& plan = model.stage();
    // Frozen units have no gradient buffer, so the model computes none for them; sharded gradients get a buffer per
    // unit from the hooks, as the unit's backward starts.
    for (std::size_t u = 0; u < units.size(); ++u)
      s.pointers.grads[u] = !units[u].trains                     ? nullptr
                            : c.strategy.grads == Sharding::none ? grads.data() + units[u].grad_at
                                                                 : UnitPointers::pending();
    compute_phase("backward", "backward" + label, s.stats.backward_seconds, [&] {
      model.backward(set, s.pointers, s.normaliser, plan.head ? nullptr : output_grads[ch].data(), chunk_input_grad[ch], hooks);
    });
    if (chunk_input_grad[ch]) {
      const std::size_t floats = model.rows_here() * static_cast<std::size_t>(c.model.hidden);
      TrackedBuffer<float> copy = pool.take(floats);  // the next backward overwrites input_grad()
      float* to = copy.data();
      compute("copy", 2.0 * static_cast<double>(floats), [&] { std::copy(model.input_grad(), model.input_grad() + floats, to); });
      transfers.send_copy(std::move(copy), floats, stage - 1, "send gradients" + label);
    }
  }

  // Every collective, every stage's output and every gradient sent, done.
  void drain_transfers() {
    comms.wait_all();
    for (auto& pending : sets_sending)
      if (pending) {
        transfers.complete(*pending);
        pending.reset();
      }
    transfers.drain();
  }

  // The two copies of the token table take the same step: the first and the last stage sum their gradients.
  void reduce_embedding_gradients() {
    if (!embedding || !units[0].trains) return;
    const std::size_t count = held(units[0], c.strategy.optimizer);
    if (tracer) tracer->name_next("allreduce embedding grads");
    coll::Work work = embedding->allreduce(coll::Algo::library, optimizer_grads(0), optimizer_grads(0), count,
                                           DataType::float32, RedOp::sum, coll::Waiting::at_once);
    finish(work);
  }

  // The global gradient norm over the optimizer's shards (distinct within the group that partitions them), every
  // stage's, the token table once; the clipped AdamW update of each unit this rank's optimizer holds, its parameters
  // gathered back where they are sharded; the gradients zeroed.
  void optimizer_step(StepState& s) {
    StepStats& stats = s.stats;
    const std::size_t U = units.size();
    const double optimizer_start = host_seconds(), exposed_before_optimizer = comms.exposed;
    trace_phase("optimizer");
    double squares = 0;
    for (std::size_t u = 0; u < U; ++u)
      if (units[u].trains && !(u == 0 && embedding && pp.rank() != 0)) squares += gradient_squares(u);
    if (c.strategy.optimizer == Sharding::intra) squares = allreduce_sum(intra, squares, "allreduce norm");
    if (c.strategy.optimizer == Sharding::global) squares = allreduce_sum(dp, squares, "allreduce norm");
    if (tp.size() > 1) squares = allreduce_sum(tp, squares, "allreduce norm");
    if (pp.size() > 1) squares = allreduce_sum(pp, squares, "allreduce norm");
    stats.grad_norm = std::sqrt(squares);
    const float scale = layers::clip_scale(stats.grad_norm, c.max_grad_norm);
    layers::AdamWConfig adamw = c.adamw;
    adamw.learning_rate = stats.lr = learning_rate(c.lr, s.step_index);
    for (std::size_t u = 0; u < U; ++u) {
      if (!units[u].trains) continue;
      if (tracer) tracer->set_unit(static_cast<int>(u));
      const std::size_t count = held(units[u], c.strategy.optimizer);
      // Parameters, both moments read and written, the gradient read.
      compute("adamw", 7.0 * static_cast<double>(count), [&] {
        layers::adamw_update(optimizer_params(u), optimizer_grads(u), adam_m.data() + units[u].opt_at,
                             adam_v.data() + units[u].opt_at, count, adamw, s.step_index, scale, {});
      });
      synchronise_parameters(u);
    }
    if (tracer) tracer->set_unit(-1);
    comms.wait_all();
    for (std::size_t u = 0; u < U; ++u) drop_params(u);  // units gathered ahead and never read (frozen layers below the backward's end)
    compute("zero grads", static_cast<double>(grads.size()), [&] { grads.fill(0.0f); });
    trace_phase("");
    const double optimizer_end = host_seconds();
    stats.optimizer_seconds = optimizer_end - optimizer_start - (comms.exposed - exposed_before_optimizer);
    if (comms.timeline) comms.timeline->push_back({"optimizer", "compute", "", optimizer_start, optimizer_end, 0});
  }

  // The loss (the last stage's: summed over its data-parallel ranks, then handed to every stage) and the step's
  // communication, pipeline and idle figures.
  void finish_step(StepState& s, double step_start) {
    StepStats& stats = s.stats;
    stats.loss = allreduce_sum(dp, s.loss_sum, "allreduce loss");
    if (pp.size() > 1) stats.loss = allreduce_sum(pp, chunks.back()->stage().head ? stats.loss : 0.0, "allreduce loss");
    stats.loss /= s.normaliser;
    stats.exposed_comm_seconds = comms.exposed;
    stats.comm = comms.tiers();
    stats.traffic = comms.traffic();
    stats.pipeline = transfers.stats;
    stats.seconds = host_seconds() - step_start;
    stats.idle_seconds = std::max(0.0, stats.seconds - stats.forward_seconds - stats.backward_seconds -
                                           stats.recompute_window_seconds - stats.optimizer_seconds - stats.exposed_comm_seconds);
    comms.timeline = nullptr;
  }

  // The squares of the gradient elements of unit u this rank's optimizer holds. Under tensor parallelism the
  // tensors every rank of the group holds whole count 1/T each, so the sum over the group counts them once.
  double gradient_squares(std::size_t u) {
    const float* g = optimizer_grads(u);
    const std::size_t count = held(units[u], c.strategy.optimizer);
    double squares = 0;
    compute("squared norm", static_cast<double>(count), [&] { squares = layers::squared_norm(g, count, {}); });
    if (tracer) return 0;
    const std::size_t first = unit_slices[u].offset + piece_offset(units[u], c.strategy.optimizer);  // in the layout
    for (const Slice& whole : replicated) {
      const std::size_t lo = std::max(whole.offset, first);
      const std::size_t hi = std::min({whole.end(), first + count, unit_slices[u].end()});  // not the padding
      if (lo < hi) squares -= (1.0 - 1.0 / tp.size()) * layers::squared_norm(g + (lo - first), hi - lo, {});
    }
    return squares;
  }

  std::vector<float> full_parameters() {
    const ParameterLayout& layout = chunks.front()->layout();
    const std::vector<Slice> slices = layout.units();
    std::vector<float> full(layout.total(), 0.0f);
    for (std::size_t u = 0; u < units.size(); ++u) {
      // Each unit from the stage that holds it; the token table from the first stage's copy.
      if (!units[u].present || (u == 0 && pp.rank() != 0)) continue;
      std::vector<float> whole(units[u].padded);
      const float* held_params = params.data() + units[u].param_at;
      const ShardPlan::UnitCollective gather = plan->parameter_gather(units[u]);
      if (gather.over == ShardPlan::Over::none)
        std::copy(held_params, held_params + units[u].padded, whole.begin());
      else
        group_of(gather.over).allgather(coll::Algo::library, held_params, whole.data(), gather.count, DataType::float32).wait();
      std::copy(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(units[u].size), full.begin() + static_cast<std::ptrdiff_t>(slices[u].offset));
    }
    if (pp.size() > 1) pp.allreduce(coll::Algo::library, full.data(), full.data(), full.size(), DataType::float32, RedOp::sum).wait();
    return full;
  }
};

Trainer::Trainer(const TrainConfig& config, coll::ProcessGroups& groups, const TokenSource& data)
    : impl_(std::make_unique<Impl>(config, groups, &data, nullptr)) {}

Trainer::Trainer(const TrainConfig& config, coll::ProcessGroups& traced_groups, Tracer& tracer)
    : impl_(std::make_unique<Impl>(config, traced_groups, nullptr, &tracer)) {
  if (!traced_groups.world().traced()) throw std::invalid_argument("a traced step needs traced process groups");
}

Trainer::~Trainer() = default;

StepStats Trainer::step(int64_t step, bool record_timeline) {
  if (step < 1) throw std::invalid_argument("steps count from 1");
  return impl_->step(step, record_timeline || impl_->c.record_timeline);
}

void Trainer::set_overlap(bool overlap) { impl_->c.overlap = overlap; }

std::vector<float> Trainer::full_parameters() { return impl_->full_parameters(); }

MemoryUse Trainer::memory() const {
  MemoryUse use;
  use.params = 4.0 * static_cast<double>(impl_->params.size());
  use.grads = 4.0 * static_cast<double>(impl_->grads.size());
  use.optimizer = 4.0 * static_cast<double>(impl_->adam_m.size() + impl_->adam_v.size());
  for (const auto& chunk : impl_->chunks) {
    use.activations += 4.0 * static_cast<double>(chunk->activation_floats());
    use.workspace += 4.0 * static_cast<double>(chunk->workspace_floats());
  }
  use.comm_buffers = impl_->pool.held_bytes();
  for (const auto& received : impl_->output_grads) use.comm_buffers += 4.0 * static_cast<double>(received.size());
  return use;
}

const std::vector<PipelineAction>& Trainer::actions() const { return impl_->actions; }

StepTrace trace_step(const TrainConfig& config, const coll::GridShape& grid, const TraceOptions& options) {
  if (grid.size() > kMaxTracedRanks)
    throw std::invalid_argument("trace: " + std::to_string(grid.size()) + " ranks, more than the " +
                                std::to_string(kMaxTracedRanks) + " a trace covers");
  const long long passes = static_cast<long long>(config.model.layers) * config.accumulation;
  if (passes > kMaxTracedLayerPasses)
    throw std::invalid_argument("trace: " + std::to_string(config.model.layers) + " layers x " +
                                std::to_string(config.accumulation) + " micro-batches = " + std::to_string(passes) +
                                " layer passes a step, more than the " + std::to_string(kMaxTracedLayerPasses) +
                                " a trace covers");
  TraceGroups groups;
  StepTrace trace;
  // A job smaller than a node is one node.
  trace.ranks_per_node = static_cast<int>(std::min<long long>(options.ranks_per_node, grid.size()));
  // The stage's first rank's coordinates: the world rank of (tp 0, pp j, dp 0) under the grid's order.
  Tracer probe(groups);
  const coll::ProcessGroups places(grid, trace.ranks_per_node, options.grid_order, 0, probe);
  const bool per_rank = !options.pipeline_rank_configs.empty();
  if (per_rank && static_cast<int>(options.pipeline_rank_configs.size()) != grid.pp)
    throw std::invalid_argument("trace: " + std::to_string(options.pipeline_rank_configs.size()) +
                                " pipeline rank configurations for " + std::to_string(grid.pp) + " pipeline ranks");
  for (int stage = 0; stage < grid.pp; ++stage) {
    const int rank = places.world_rank_of(0, stage, 0);
    Tracer tracer(groups);
    coll::ProcessGroups traced(grid, trace.ranks_per_node, options.grid_order, rank, tracer);
    Trainer trainer(per_rank ? options.pipeline_rank_configs[static_cast<std::size_t>(stage)] : config, traced, tracer);
    trainer.step(1);
    trace.ranks.push_back({rank, grid.tp * grid.dp, tracer.take()});
  }
  trace.groups = groups.all();
  trace.names = groups.names;
  if (options.tp_comm_overlap) overlap_tensor_parallel_communication(trace);
  if (options.overlap_param_gather) overlap_parameter_gathers(trace);
  return trace;
}

std::vector<StagePlan> Trainer::stages() const {
  std::vector<StagePlan> plans;
  for (const auto& chunk : impl_->chunks) plans.push_back(chunk->stage());
  return plans;
}

int64_t Trainer::global_rows() const {
  return static_cast<int64_t>(impl_->n) * impl_->c.accumulation * impl_->c.micro_batch;
}

}  // namespace strata::train
