// The search over training configurations and PaRO's rule beside it (see search.h).
#include "project/search.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "project/step_prediction.h"
#include "train/gpt.h"
#include "train/schedule.h"

namespace strata::project {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Alone-times of compute operations by shape: a step repeats a few shapes many times, and a calibrated system looks
// each one up among its measured points.
class ComputeTimes {
 public:
  ComputeTimes(const System& system, const WorkloadOptions& options) : system_(system), options_(options) {}

  // As the simulator prices the op (compute_seconds of workload_op): the options' attention kernel and loss included.
  // Elementwise ops are many and not cached: priced directly, the same way, without building their Op.
  double operator()(const train::StepTrace& trace, const train::TraceOp& t) {
    if (t.kind == train::TraceOpKind::elementwise)
      return system_.device.elementwise_seconds(elementwise_name(t, options_), elementwise_bytes(t, options_));
    const bool gemm = t.kind == train::TraceOpKind::gemm;
    const Key key = gemm ? Key{0, t.m, t.n, t.k, 0, 0, 0, 0, 0}
                         : Key{1 + (t.causal ? 1 : 0) + (t.backward ? 2 : 0), t.batch, t.heads, t.seq_q, t.seq_kv,
                               t.head_dim, 0, 0, 0};
    const auto found = cache_.find(key);
    if (found != cache_.end()) return found->second;
    const double seconds = compute_seconds(system_, workload_op(trace, t, options_));
    cache_.emplace(key, seconds);
    return seconds;
  }

 private:
  using Key = std::array<std::int64_t, 9>;
  struct Hash {
    std::size_t operator()(const Key& k) const {
      std::size_t h = 1469598103934665603ull;
      for (std::int64_t v : k) h = (h ^ static_cast<std::size_t>(v)) * 1099511628211ull;
      return h;
    }
  };
  const System& system_;
  WorkloadOptions options_;
  std::unordered_map<Key, double, Hash> cache_;
};

int element_bytes_for(const std::string& dtype) {
  if (mixed_precision(dtype)) return 2;
  const std::optional<double> bytes = dtype_bytes(dtype);
  return bytes ? static_cast<int>(*bytes) : 4;
}

WorkloadOptions workload_options(const SearchSpace& space) {
  WorkloadOptions options{space.dtype, element_bytes_for(space.dtype)};
  options.gradient_reduction_bytes = space.gradient_reduction_bytes;
  options.attention = space.attention, options.loss = space.loss, options.dropout = space.dropout;
  options.sharding_buffers = space.sharding_buffers;
  return options;
}

// Whether GPipe and 1F1B list the same passes in the same order on every pipeline rank (one micro-batch).
bool same_order(int stages, int micro_batches) {
  for (int r = 0; r < stages; ++r)
    if (train::pipeline_actions(train::Schedule::gpipe, {stages, micro_batches, 1}, r) !=
        train::pipeline_actions(train::Schedule::one_f_one_b, {stages, micro_batches, 1}, r))
      return false;
  return true;
}

bool trains_everything(const train::Trainable& t) {
  return t.kind == train::Trainable::Kind::all || (t.kind == train::Trainable::Kind::fraction && t.fraction >= 1);
}

}  // namespace

train::Strategy equivalent_strategy(const train::Strategy& strategy, int ranks_per_group, int groups) {
  train::Strategy same = strategy;
  if (ranks_per_group == 1 && same.params == train::Sharding::intra) same.params = train::Sharding::none;
  if (groups == 1 && same.optimizer == train::Sharding::intra) same.optimizer = train::Sharding::global;
  return same;
}

std::string Candidate::label() const {
  std::string text = "tp" + std::to_string(tp) + " pp" + std::to_string(pp) + " dp" + std::to_string(dp) + " " +
                     strategy.name() + " mb" + std::to_string(micro_batch) + " m" + std::to_string(micro_batches) + " " +
                     train::name(schedule);
  if (virtual_stages > 1) text += "(v" + std::to_string(virtual_stages) + ")";
  text += std::string(" ") + train::name(recompute);
  if (sequence_parallel) text += " sp";
  return text;
}

bool mixed_precision(const std::string& dtype) { return dtype == "bf16" || dtype == "fp16" || dtype == "fp8"; }

const char* name(RefusalKind kind) {
  switch (kind) {
    case RefusalKind::divisibility: return "divisibility";
    case RefusalKind::schedule: return "schedule";
    case RefusalKind::strategy: return "strategy";
    case RefusalKind::memory: return "memory";
    case RefusalKind::size: return "size";
  }
  return "?";
}

train::TrainConfig train_config(const SearchSpace& space, const Candidate& k) {
  train::TrainConfig c;
  c.model = space.model;
  c.micro_batch = k.micro_batch;
  c.seq = space.seq;
  c.accumulation = k.micro_batches;
  c.strategy = k.strategy;
  c.trainable = space.trainable;
  c.overlap = true;
  c.recompute = k.recompute;
  c.sequence_parallel = k.sequence_parallel;
  c.schedule = k.schedule;
  c.virtual_stages = k.virtual_stages;
  return c;
}

train::DataParallelShape data_parallel_layout(const Candidate& k, int devices_per_node, int devices, int pp_rank) {
  const int per_node = std::max(1, std::min(devices_per_node, devices));
  const train::DataParallelShape s = train::stage_data_parallel_shape({k.tp, k.pp, k.dp}, per_node, "tp,pp,dp", pp_rank);
  if (!s.even)
    throw std::invalid_argument("the " + std::to_string(k.dp) + " data-parallel ranks spread unevenly over the nodes of " +
                                std::to_string(per_node) + " devices (tp x pp = " + std::to_string(k.tp * k.pp) + ")");
  return s;
}

namespace {

// Every pipeline rank's data-parallel layout even (data_parallel_layout throws otherwise).
void require_even_layout(const Candidate& k, int devices_per_node, int devices) {
  for (int r = 0; r < k.pp; ++r) (void)data_parallel_layout(k, devices_per_node, devices, r);
}

// Of the pipeline ranks' memory, the rank whose total is largest.
RankMemory largest_total(const std::vector<train::MemoryUse>& ranks) {
  RankMemory best;
  double most = -1;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].total() > most) most = ranks[r].total(), best = {ranks[r], static_cast<int>(r)};
  return best;
}

}  // namespace

StepCase step_case(const SearchSpace& space, const Candidate& k, int devices_per_node) {
  StepCase step;
  step.config = train_config(space, k);
  step.grid = {k.tp, k.pp, k.dp};
  step.trace = {devices_per_node, "tp,pp,dp", {}};
  step.workload = workload_options(space);
  return step;
}

RankMemory memory_per_rank(const SearchSpace& space, const Candidate& k, int devices_per_node) {
  require_even_layout(k, devices_per_node, space.devices);
  return largest_total(pipeline_rank_memory(step_case(space, k, devices_per_node)));
}

Evaluation evaluate(const System& system, const SearchSpace& space, const Candidate& k) {
  Evaluation e;
  e.candidate = k;
  require_even_layout(k, system.device.devices_per_node, space.devices);
  StepCase step = step_case(space, k, system.device.devices_per_node);
  // The step and its breakdown's means only: no interval, runs across phases.
  step.predict.intervals = false, step.predict.interval = false, step.predict.phases = false;
  const PredictedStep p = predict_step(step, system);
  e.step_s = p.prediction.step_s;
  e.compute_s = p.prediction.timeline.mean.compute_s;
  e.idle_s = p.prediction.timeline.mean.idle_s;
  for (const auto& [group, seconds] : p.prediction.timeline.mean.exposed_communication_s) {
    const bool traced = group >= 0 && group < static_cast<int>(p.group_roles.size());
    e.exposed_s[group == kPointToPoint ? "pp" : traced ? p.group_roles[static_cast<std::size_t>(group)] : "?"] += seconds;
  }
  e.memory = largest_total(p.rank_memory);
  e.tokens_per_s = p.tokens_per_s, e.mfu = p.mfu;
  e.operations = p.traced_operations, e.simulated_operations = p.prediction.simulated_operations;
  return e;
}

namespace {

// A probe's trace: the candidate at `micro_batches` under 1F1B with one chunk per rank, on `dp` data-parallel ranks
// (1: the strategy-independent probe, which runs NNN).
train::StepTrace probe_trace(const System& system, const SearchSpace& space, const Candidate& k, int dp, int micro_batches) {
  Candidate probe = k;
  probe.dp = dp, probe.micro_batches = micro_batches;
  if (dp == 1) probe.strategy = {};
  probe.schedule = train::Schedule::one_f_one_b, probe.virtual_stages = 1;
  return train::trace_step(train_config(space, probe), {k.tp, k.pp, dp}, {system.device.devices_per_node, "tp,pp,dp", {}});
}

// Where each traced group sits on the nodes, worked out once per trace: the simulator's group kind, size and
// fewest members on a node.
struct GroupPlacement {
  GroupKind kind = GroupKind::intra_node;
  int size = 0;
  int per_node = 1;
};

std::vector<GroupPlacement> group_placements(const System& system, const train::StepTrace& trace) {
  std::vector<GroupPlacement> placements;
  placements.reserve(trace.groups.size());
  std::vector<int> nodes;
  for (const train::TraceGroup& group : trace.groups) {
    nodes.clear();
    for (int member : group.ranks) nodes.push_back(member / system.device.devices_per_node);
    placements.push_back({group_kind_of(nodes), static_cast<int>(group.ranks.size()), members_per_node(nodes)});
  }
  return placements;
}

// The duration of a traced collective as the simulator gives it.
double collective_duration(const System& system, const train::StepTrace& trace, const train::TraceOp& t,
                           const WorkloadOptions& options, const std::vector<GroupPlacement>& placements) {
  const GroupPlacement& g = placements.at(static_cast<std::size_t>(t.group));
  return system.collective_seconds(t.collective, costed_algorithm(trace, t, options), g.kind,
                                   collective_bytes(t, g.size, collective_element_bytes(trace, t, options)), g.size, g.per_node,
                                   t.blocking);
}

// Per traced rank: the alone-time of its compute operations (all, or only GEMMs and attention) plus its blocking
// tensor-parallel collectives: those that depend on the compute operation before them and that the next compute
// operation depends on, so nothing computes on the rank while they run.
std::vector<double> rank_work(const System& system, const train::StepTrace& trace, const WorkloadOptions& options,
                              ComputeTimes& times, bool every_compute) {
  const std::vector<GroupPlacement> placements = group_placements(system, trace);
  std::vector<double> per_rank;
  for (const train::TraceRank& rank : trace.ranks) {
    const std::vector<train::TraceOp>& ops = rank.ops;
    double total = 0;
    int previous = -1;  // the last compute operation before op i
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const train::TraceOp& t = ops[i];
      if (t.kind == train::TraceOpKind::gemm || t.kind == train::TraceOpKind::attention ||
          (every_compute && t.kind == train::TraceOpKind::elementwise))
        total += times(trace, t);
      if (t.kind == train::TraceOpKind::collective && previous >= 0 &&
          trace.groups.at(static_cast<std::size_t>(t.group)).role == "tp") {
        std::size_t next = i + 1;
        while (next < ops.size() && !is_compute(ops[next].kind)) ++next;
        const auto depends = [](const train::TraceOp& op, int on) {
          return std::find(op.depends_on.begin(), op.depends_on.end(), on) != op.depends_on.end();
        };
        if (next < ops.size() && depends(t, previous) && depends(ops[next], static_cast<int>(i)))
          total += collective_duration(system, trace, t, options, placements);
      }
      if (is_compute(t.kind)) previous = static_cast<int>(i);
    }
    per_rank.push_back(total);
  }
  return per_rank;
}

// Per traced rank and group, the summed durations of its collectives (each group's run on a stream of their own).
std::vector<double> stream_sums(const System& system, const train::StepTrace& trace, const WorkloadOptions& options) {
  const std::vector<GroupPlacement> placements = group_placements(system, trace);
  std::vector<double> sums;
  for (const train::TraceRank& rank : trace.ranks) {
    std::vector<double> by_group(trace.groups.size(), 0.0);
    for (const train::TraceOp& t : rank.ops)
      if (t.kind == train::TraceOpKind::collective)
        by_group.at(static_cast<std::size_t>(t.group)) += collective_duration(system, trace, t, options, placements);
    sums.insert(sums.end(), by_group.begin(), by_group.end());
  }
  return sums;
}

std::vector<int> bound_key(const Candidate& k, bool with_strategy) {
  std::vector<int> key = {k.tp, k.pp, k.micro_batch, static_cast<int>(k.recompute), k.sequence_parallel ? 1 : 0};
  if (with_strategy) {
    key.push_back(k.dp);
    key.push_back(static_cast<int>(k.strategy.params));
    key.push_back(static_cast<int>(k.strategy.grads));
    key.push_back(static_cast<int>(k.strategy.optimizer));
  }
  return key;
}

// Slightly below: a bound from sums and extrapolations must not exceed the simulated step by its rounding.
constexpr double kBoundMargin = 1 - 1e-9;

}  // namespace

double lower_bound_s(const System& system, const SearchSpace& space, const Candidate& k, BoundCache& cache) {
  const bool interleaved = k.virtual_stages > 1;
  if (interleaved && !trains_everything(space.trainable)) return 0;
  const std::vector<int> key = bound_key(k, false);
  auto found = cache.per_micro.find(key);
  if (found == cache.per_micro.end()) {
    const WorkloadOptions options = workload_options(space);
    ComputeTimes times(system, options);
    const std::vector<double> one = rank_work(system, probe_trace(system, space, k, 1, 1), options, times, false);
    const std::vector<double> two = rank_work(system, probe_trace(system, space, k, 1, 2), options, times, false);
    std::vector<double> delta(one.size());
    for (std::size_t r = 0; r < one.size(); ++r) delta[r] = std::max(0.0, two[r] - one[r]);
    found = cache.per_micro.emplace(key, std::move(delta)).first;
    cache.probes += 2;
  }
  // Interleaved, the first micro-batch passes chunk 0 of the ranks before: one v-th of their layers (and rank 0's
  // embeddings), at least Δ_s / v.
  double bound = 0, before = 0;
  for (double d : found->second) {
    bound = std::max(bound, before + k.micro_batches * d);
    before += d / k.virtual_stages;
  }
  return bound * kBoundMargin;
}

double refined_lower_bound_s(const System& system, const SearchSpace& space, const Candidate& k, BoundCache& cache) {
  const double first = lower_bound_s(system, space, k, cache);
  if (k.micro_batches <= 3 || (k.virtual_stages > 1 && !trains_everything(space.trainable))) return first;
  const std::vector<int> key = bound_key(k, true);
  auto found = cache.sums.find(key);
  if (found == cache.sums.end()) {
    const WorkloadOptions options = workload_options(space);
    ComputeTimes times(system, options);
    BoundCache::Sums sums;
    for (int at : {2, 3}) {
      const train::StepTrace trace = probe_trace(system, space, k, k.dp, at);
      const std::vector<double> work = rank_work(system, trace, options, times, true);
      const std::vector<double> streams = stream_sums(system, trace, options);
      sums.compute.resize(work.size());
      sums.streams.resize(streams.size());
      for (std::size_t i = 0; i < work.size(); ++i) sums.compute[i][static_cast<std::size_t>(at - 2)] = work[i];
      for (std::size_t i = 0; i < streams.size(); ++i) sums.streams[i][static_cast<std::size_t>(at - 2)] = streams[i];
    }
    found = cache.sums.emplace(key, std::move(sums)).first;
    cache.probes += 2;
  }
  // The middle micro-batches repeat: v(m) = v(2) + (m - 2) (v(3) - v(2)).
  double bound = 0;
  const double more = k.micro_batches - 2;
  for (const auto& v : found->second.compute) bound = std::max(bound, v[0] + more * (v[1] - v[0]));
  for (const auto& v : found->second.streams) bound = std::max(bound, v[0] + more * (v[1] - v[0]));
  return std::max(first, bound * kBoundMargin);
}

namespace {

// The space and the description as the search needs them; std::invalid_argument naming what is wrong.
void check_space(const System& system, const SearchSpace& space) {
  if (auto problem = find_problem(system)) throw std::invalid_argument("system description: " + *problem);
  if (space.devices < 1) throw std::invalid_argument("the search needs at least one device");
  if (space.global_batch < 1) throw std::invalid_argument("the global batch must be at least one sequence");
  if (space.seq < 1) throw std::invalid_argument("the sequence length must be at least 1");
  if (space.seq > space.model.max_seq)
    throw std::invalid_argument("sequence length " + std::to_string(space.seq) + " exceeds the model's position table (" +
                                std::to_string(space.model.max_seq) + ")");
  if (!(space.memory_limit > 0)) throw std::invalid_argument("the memory limit must be positive");
  if (space.top < 1) throw std::invalid_argument("top must be at least 1");
  if (!system.device.compute.count(space.dtype))
    throw std::invalid_argument("the system's device has no " + space.dtype + " compute");
  if (const std::string problem = space.model.validate(); !problem.empty()) throw std::invalid_argument("model: " + problem);
  check_loss(space.loss);
  const WorkloadOptions options = workload_options(space);
  const std::string_view kernel = attention_kernel(options);  // empty: flash or unfused
  if (!kernel.empty() && !system.device.attention_kernels.count(kernel))
    throw std::invalid_argument("attention '" + space.attention + "': not flash, unfused or a kernel of the system's "
                                "device.attention_kernels");
  if (space.micro_batch_sizes.empty() || space.schedules.empty() || space.recompute.empty())
    throw std::invalid_argument("the search needs at least one micro-batch size, schedule and recomputation mode");
  for (int mb : space.micro_batch_sizes)
    if (mb < 1) throw std::invalid_argument("micro-batch sizes must be at least 1");
  for (train::Recompute r : space.recompute)
    if (r == train::Recompute::overlap)
      throw std::invalid_argument("recompute overlap needs a measured placement (train/overlap.h): not searched");
  train::trainable_units(space.model, space.trainable);  // throws for more layers than the model has

}

// Every configuration of the space that the executor runs and that fits in memory, in the order the grids, micro-batch
// sizes, schedules, modes and strategies are listed; the rest counted in `result` by why (refused or equivalent to one
// kept).
std::vector<Candidate> fitting_candidates(const System& system, const SearchSpace& space, SearchResult& result) {
  const int N = space.devices, per_node = std::max(1, std::min(system.device.devices_per_node, N));
  const int L = space.model.layers;
  const std::vector<train::Strategy> strategies = space.strategies.empty() ? train::runnable_strategies() : space.strategies;
  std::vector<int> tps = space.tp, pps_given = space.pp;
  if (tps.empty())
    for (int t = 1; t <= per_node; ++t)
      if (per_node % t == 0 && N % t == 0) tps.push_back(t);

  auto refuse = [&](RefusalKind kind, const std::string& why, std::int64_t count = 1) {
    result.refused[kind] += count;
    result.refusal_reasons[std::string(name(kind)) + ": " + why] += count;
    result.enumerated += count;
  };
  const std::int64_t inner = static_cast<std::int64_t>(space.recompute.size() * strategies.size());
  std::vector<Candidate> fitting;
  const std::int64_t per_grid = static_cast<std::int64_t>(space.micro_batch_sizes.size() * space.schedules.size()) * inner;
  for (int t : tps) {
    if (t < 1 || N % t != 0) {
      refuse(RefusalKind::divisibility, "tp does not divide the devices", per_grid * std::max<std::int64_t>(1, static_cast<std::int64_t>(pps_given.size())));
      continue;
    }
    std::vector<int> pps = pps_given;
    if (pps.empty())
      for (int p = 1; p <= std::min(N / t, L); ++p)  // a stage holds at least one layer
        if ((N / t) % p == 0) pps.push_back(p);
    for (int p : pps) {
      const std::int64_t below = per_grid;
      if (t < 1 || p < 1 || N % (t * p) != 0) {
        refuse(RefusalKind::divisibility, "tp x pp does not divide the devices", below);
        continue;
      }
      if (per_node % t != 0) {
        refuse(RefusalKind::divisibility, "tp does not divide a node's devices (a tensor-parallel group stays in a node)", below);
        continue;
      }
      try {
        train::tensor_shard(space.model, t, 0);
      } catch (const std::invalid_argument& e) {
        refuse(RefusalKind::divisibility, "tp " + std::to_string(t) + ": " + e.what(), below);
        continue;
      }
      Candidate grid;
      grid.tp = t, grid.pp = p, grid.dp = N / (t * p);
      train::DataParallelShape layout;
      try {
        layout = data_parallel_layout(grid, system.device.devices_per_node, N, 0);
      } catch (const std::invalid_argument&) {
        refuse(RefusalKind::divisibility, "data-parallel ranks spread unevenly over nodes", below);
        continue;
      }
      for (int mb : space.micro_batch_sizes) {
        const std::int64_t per_mb = static_cast<std::int64_t>(space.schedules.size()) * inner;
        if (space.global_batch % (grid.dp * mb) != 0) {
          refuse(RefusalKind::divisibility, "the global batch does not divide into dp x micro-batch", per_mb);
          continue;
        }
        const bool sp = space.sequence_parallel && t > 1;
        if (sp && (static_cast<std::int64_t>(mb) * space.seq) % t != 0) {
          refuse(RefusalKind::divisibility, "sequence parallelism: micro-batch x sequence does not divide by tp", per_mb);
          continue;
        }
        for (train::Schedule schedule : space.schedules) {
          Candidate c = grid;
          c.micro_batch = mb, c.micro_batches = space.global_batch / (grid.dp * mb), c.schedule = schedule;
          c.virtual_stages = schedule == train::Schedule::interleaved ? space.interleave_chunks : 1;
          c.sequence_parallel = sp;
          if (const std::string why = train::schedule_refusal(schedule, {p, c.micro_batches, c.virtual_stages}); !why.empty()) {
            // Counted by kind: the executor's sentence names the sizes.
            const std::string kind = schedule != train::Schedule::interleaved ? why
                                     : p == 1 ? "interleaved needs two pipeline stages or more"
                                              : "interleaved needs the micro-batches per step a multiple of the pipeline stages";
            refuse(RefusalKind::schedule, kind, inner);
            continue;
          }
          if (L % (p * c.virtual_stages) != 0) {
            refuse(RefusalKind::divisibility, "the layers do not divide into pp x v stages", inner);
            continue;
          }
          if (static_cast<std::int64_t>(L) * c.micro_batches > train::kMaxTracedLayerPasses) {
            refuse(RefusalKind::size,
                   "layers x micro-batches above the " + std::to_string(train::kMaxTracedLayerPasses) +
                       " layer passes a trace covers",
                   inner);
            continue;
          }
          if (schedule == train::Schedule::gpipe &&
              std::find(space.schedules.begin(), space.schedules.end(), train::Schedule::one_f_one_b) != space.schedules.end() &&
              same_order(p, c.micro_batches)) {
            result.enumerated += inner, result.equivalent += inner;
            result.equivalent_to["gpipe = 1f1b (the same order of passes)"] += inner;
            continue;
          }
          for (train::Recompute recompute : space.recompute) {
            c.recompute = recompute;
            for (const train::Strategy& strategy : strategies) {
              c.strategy = strategy;
              if (const std::string why = train::refusal_reason(strategy); !why.empty()) {
                refuse(RefusalKind::strategy, strategy.name() + ": " + why);
                continue;
              }
              if (const train::Strategy same = equivalent_strategy(strategy, layout.m, layout.g);
                  !(same == strategy) && std::find(strategies.begin(), strategies.end(), same) != strategies.end()) {
                ++result.enumerated, ++result.equivalent;
                result.equivalent_to[strategy.name() + " = " + same.name()] += 1;
                continue;
              }
              const RankMemory memory = memory_per_rank(space, c, system.device.devices_per_node);
              if (memory.total() > space.memory_limit) {
                refuse(RefusalKind::memory, "more memory per device than the limit");
                continue;
              }
              ++result.enumerated;
              fitting.push_back(c);
            }
          }
        }
      }
    }
  }
  return fitting;
}

// The fitting configurations in order of their lower bound, simulated (space.threads at a time) until the next bound
// cannot enter the top k; the top k, the counts and times into `result`.
void rank_candidates(const System& system, const SearchSpace& space, const std::vector<Candidate>& fitting,
                     SearchResult& result) {
  // Bounds, then the configurations in order of their bound until the next cannot enter the top k.
  auto bound_start = Clock::now();
  BoundCache cache;
  struct Pending {
    double bound;
    std::size_t index;
    bool refined;
    bool operator>(const Pending& o) const { return bound != o.bound ? bound > o.bound : index > o.index; }
  };
  std::priority_queue<Pending, std::vector<Pending>, std::greater<>> queue;
  for (std::size_t i = 0; i < fitting.size(); ++i)
    queue.push({space.prune ? lower_bound_s(system, space, fitting[i], cache) : 0.0, i, !space.prune});
  result.bound_seconds = seconds_since(bound_start);

  const std::size_t k = static_cast<std::size_t>(space.top);
  const std::size_t threads = static_cast<std::size_t>(std::max(1, space.threads));
  auto threshold = [&] { return result.top.size() == k ? result.top.back().step_s : std::numeric_limits<double>::infinity(); };
  while (!queue.empty()) {
    // The next batch: configurations whose bound is below the k-th best step, each refined first.
    std::vector<Pending> batch;
    bound_start = Clock::now();
    while (batch.size() < threads && !queue.empty()) {
      Pending next = queue.top();
      if (space.prune && next.bound >= threshold()) break;
      queue.pop();
      if (!next.refined) {
        next.bound = std::max(next.bound, refined_lower_bound_s(system, space, fitting[next.index], cache));
        next.refined = true;
        queue.push(next);
        continue;
      }
      batch.push_back(next);
    }
    result.bound_seconds += seconds_since(bound_start);
    if (batch.empty()) break;  // what is left cannot enter the top k
    const auto simulate_start = Clock::now();
    std::vector<Evaluation> done(batch.size());
    std::vector<std::string> refused(batch.size());
    std::vector<std::exception_ptr> failed(batch.size());  // anything else (out of memory): the caller's, after the join
    auto run = [&](std::size_t b) {
      try {
        done[b] = evaluate(system, space, fitting[batch[b].index]);
      } catch (const std::invalid_argument& error) {
        refused[b] = error.what();
      } catch (...) {
        failed[b] = std::current_exception();
      }
    };
    if (batch.size() == 1) {
      run(0);
    } else {
      std::vector<std::thread> workers;
      for (std::size_t b = 1; b < batch.size(); ++b) workers.emplace_back(run, b);
      run(0);
      for (std::thread& w : workers) w.join();
    }
    for (const std::exception_ptr& failure : failed)
      if (failure) std::rethrow_exception(failure);
    result.simulate_seconds += seconds_since(simulate_start);
    for (std::size_t b = 0; b < batch.size(); ++b) {
      if (!refused[b].empty()) {
        // The executor refuses what the checks above did not foresee: counted with its reason.
        --result.fitting;
        result.refused[RefusalKind::divisibility] += 1;
        result.refusal_reasons["divisibility: " + refused[b]] += 1;
        continue;
      }
      Evaluation& e = done[b];
      ++result.simulated;
      result.traced_operations += e.operations;
      result.simulated_operations += e.simulated_operations;
      e.lower_bound_s = batch[b].bound;
      const auto at = std::upper_bound(result.top.begin(), result.top.end(), e.step_s,
                                       [](double step, const Evaluation& x) { return step < x.step_s; });
      if (static_cast<std::size_t>(at - result.top.begin()) < k) {
        result.top.insert(at, std::move(e));
        if (result.top.size() > k) result.top.pop_back();
      }
    }
  }
  result.pruned = static_cast<std::int64_t>(queue.size());
  if (!queue.empty()) result.least_pruned_bound_s = queue.top().bound;
  result.probes = cache.probes;
}

}  // namespace

SearchResult search(const System& system, const SearchSpace& space) {
  const auto start = Clock::now();
  check_space(system, space);
  SearchResult result;
  const std::vector<Candidate> fitting = fitting_candidates(system, space, result);
  result.fitting = static_cast<std::int64_t>(fitting.size());
  rank_candidates(system, space, fitting, result);
  result.seconds = seconds_since(start);
  return result;
}

// ---- PaRO's rule beside the search ----

ParoScenario paro_scenario(const System& system, const ParoComparisonScenario& s, int micro_batch, int seq,
                           train::Recompute recompute, const std::string& dtype, double other_memory_bytes,
                           double memory_limit) {
  const std::vector<train::Slice> units = train::ParameterLayout(s.model, train::tensor_shard(s.model, 1, 0)).units();
  const std::vector<bool> trains = train::trainable_units(s.model, s.trainable);
  std::size_t lowest = trains.size();
  for (std::size_t u = trains.size(); u-- > 0;)
    if (trains[u]) lowest = u;
  ParoScenario x;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const double size = static_cast<double>(units[u].size);
    x.parameters += size;
    if (trains[u]) x.trainable += size;
    // The backward pass gathers again the layers it reaches (the embeddings and final norm stay from forward).
    if (u >= std::max<std::size_t>(lowest, 1) && u <= static_cast<std::size_t>(s.model.layers)) x.backward_parameters += size;
  }
  x.ranks_per_group = system.device.devices_per_node;
  x.ranks = s.nodes * system.device.devices_per_node;
  x.micro_batches = s.micro_batches;
  x.intra_bandwidth = system.intra_node.bandwidth.value;
  x.inter_bandwidth = s.bandwidth_ratio > 0 ? x.intra_bandwidth / s.bandwidth_ratio : system.inter_node.bandwidth.value;
  const bool mixed = mixed_precision(dtype);
  x.state_bytes = mixed ? train::kMixedPrecisionStates : train::kFp32States;
  x.param_element_bytes = x.grad_element_bytes = element_bytes_for(dtype);
  // Forward over every parameter, backward (twice the forward) over the layers it reaches, and full recomputation
  // another forward of those: the model FLOPs (6 N + 6 L h s per token) in those proportions.
  const double share = (x.parameters + 2 * x.backward_parameters + (recompute == train::Recompute::full ? x.backward_parameters : 0)) /
                       (3 * x.parameters);
  const double flops = train::model_flops_per_token(s.model, seq) * share * micro_batch * seq;
  x.compute_s = system.device.gemm_seconds(dtype, flops);
  x.optimizer_s_per_element = system.device.elementwise_seconds(28);
  x.other_memory_bytes = other_memory_bytes;
  x.memory_limit = memory_limit;
  return x;
}

ParoComparisonRow compare_paro(const System& base, const ParoComparisonScenario& scenario, int micro_batch, int seq,
                               train::Recompute recompute, const std::string& dtype, double memory_limit) {
  System system = base;
  if (scenario.bandwidth_ratio > 0) system.inter_node.bandwidth.value = system.intra_node.bandwidth.value / scenario.bandwidth_ratio;
  ParoComparisonRow row;
  row.scenario = scenario;
  row.bandwidth_ratio = system.intra_node.bandwidth.value / system.inter_node.bandwidth.value;

  SearchSpace space;
  space.model = scenario.model;
  space.trainable = scenario.trainable;
  space.devices = scenario.nodes * system.device.devices_per_node;
  space.global_batch = space.devices * micro_batch * scenario.micro_batches;
  space.seq = seq;
  space.micro_batch_sizes = {micro_batch};
  space.schedules = {train::Schedule::one_f_one_b};
  space.recompute = {recompute};
  space.tp = {1}, space.pp = {1};
  space.dtype = dtype;
  space.memory_limit = memory_limit;
  space.top = static_cast<int>(train::runnable_strategies().size());
  space.prune = false;
  const SearchResult found = search(system, space);
  row.fitting = static_cast<int>(found.top.size());
  for (const Evaluation& e : found.top) row.simulated_s[e.candidate.strategy.name()] = e.step_s;
  if (!found.top.empty()) row.search_choice = found.top.front().candidate.strategy.name(), row.search_step_s = found.top.front().step_s;

  Candidate replicated;
  replicated.dp = space.devices, replicated.micro_batch = micro_batch, replicated.micro_batches = scenario.micro_batches;
  replicated.recompute = recompute;
  const RankMemory held = memory_per_rank(space, replicated, system.device.devices_per_node);
  const ParoScenario x =
      paro_scenario(system, scenario, micro_batch, seq, recompute, dtype, held.use.activations + held.use.workspace,
                    memory_limit);
  if (const std::optional<ParoChoice> choice = paro_choose(x)) {
    row.rule_choice = choice->strategy.name();
    row.rule_total_s = choice->terms.total_s();
    const auto simulated = row.simulated_s.find(row.rule_choice);
    row.rule_fits = simulated != row.simulated_s.end();
    if (row.rule_fits) {
      row.rule_step_s = simulated->second;
    } else {  // the rule's memory model let it in where the search's did not: simulate it anyway
      Candidate c = replicated;
      c.strategy = choice->strategy;
      row.rule_step_s = evaluate(system, space, c).step_s;
    }
  }
  row.agree = !row.rule_choice.empty() && row.rule_choice == row.search_choice;
  row.same_step = !row.rule_choice.empty() && !row.search_choice.empty() && row.rule_step_s <= row.search_step_s * (1 + 1e-9);
  return row;
}

}  // namespace strata::project
