// One training step of the GPT model on the CPU, on the process groups' grid: tensor parallelism inside the model
// (gpt.h), pipeline parallelism over stages run by a schedule (schedule.h), and in the data-parallel dimension a
// partitioning strategy (strategy.h): micro-batches of forward and backward, the strategy's collectives
// (docs/strategies.md's table: which state is gathered or reduced, over which group, when), the global gradient norm
// and clipping, AdamW on the optimizer's shard, and the parameter synchronisation after it.
//
// Pipeline. Each pipeline rank runs its stages (one, or v model chunks interleaved) in the schedule's order: a
// forward receives its input from the previous stage (the same tensor- and data-parallel coordinates) and sends
// its output on; a backward receives its output's gradient from the next stage and sends its input's gradient
// back, all as non-blocking point-to-point operations of the pp group, progressed with the data-parallel
// collectives. The first stage holds the embeddings, the last the final norm, the head and its copy of the tied
// token table, whose gradient the two sum (an allreduce between the first and the last stage, as Megatron-LM's
// embedding group does) before the optimizer, so both copies take the same step. Data-parallel strategies shard
// and reduce the units each rank holds; the gradient norm sums over the pipeline stages too.
//
// Sharding. Every unit of the model (embeddings, each layer, the final norm) is padded to a multiple of the
// data-parallel degree n and cut into n global pieces. The n ranks form g groups (nodes) of m ranks; the rank
// with local index l on node k holds global piece l g + k, so the intra piece of local index l (what an I-sharded
// state holds) is the g consecutive global pieces l g .. l g + g - 1. Then:
//   intra allgather of intra pieces     -> the whole unit          (P = I, before use)
//   inter allgather of global pieces    -> my intra piece          (P = I after an update by O = G)
//   intra reduce-scatter of a unit      -> my intra piece summed within the node
//   inter reduce-scatter of intra piece -> my global piece summed over all ranks
// and a collective over all n ranks (P or G = G) stages the unit's pieces in rank order first.
//
// Overlap: with overlap on, each unit's gradient reduction starts as soon as its backward is done and the
// next unit's parameter gather starts while the current unit computes; progress is made by testing the
// operations in flight between units (collectives/work.h), and the step waits for what is left at the end.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/process_group.h"
#include "kernels/layers.h"
#include "train/data.h"
#include "train/gpt.h"
#include "train/schedule.h"
#include "train/trace.h"
#include "train/strategy.h"

namespace strata::train {

// Which parameters train: all; the last K layers (and the final norm); or a fraction of the layers, counted
// from the last (and the final norm). Frozen units have no gradients and no optimizer states.
struct Trainable {
  enum class Kind { all, last_layers, fraction } kind = Kind::all;
  int last_layers = 0;
  double fraction = 1.0;
};
// "all", "last:K" or a fraction in (0, 1]; std::invalid_argument otherwise.
Trainable parse_trainable(const std::string& text);
std::vector<bool> trainable_units(const ModelConfig& model, const Trainable& trainable);

// Linear warm-up from 0 to max_lr over `warmup` steps, then cosine decay to min_lr at `total` steps (constant
// after warm-up when total is 0). Steps count from 1.
struct LrSchedule {
  float max_lr = 3e-4f;
  float min_lr = 3e-5f;
  int64_t warmup = 0;
  int64_t total = 0;
};
float learning_rate(const LrSchedule& schedule, int64_t step);

struct TrainConfig {
  ModelConfig model;
  int micro_batch = 1;   // rows per rank per micro-batch
  int seq = 64;
  int accumulation = 1;  // micro-batches per optimizer step
  Strategy strategy;
  Trainable trainable;
  coll::Algo comm_algo = coll::Algo::library;
  bool overlap = true;
  layers::AdamWConfig adamw;  // learning_rate is taken from the schedule
  LrSchedule lr;
  float max_grad_norm = 1.0f;  // 0: no clipping
  CpuRuntime runtime;
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;  // with tensor parallelism (the process groups' tp dimension)
  // Pipeline parallelism (the process groups' pp dimension, p ranks): accumulation is the step's micro-batches m.
  Schedule schedule = Schedule::one_f_one_b;
  int virtual_stages = 1;        // v: model chunks per pipeline rank (interleaved)
  std::vector<int> stage_layers;  // layers of each of the p v stages; empty: L / (p v) each (must divide)
  // Recompute::overlap: per stage (p v of them), per layer of the stage, which ops are kept (the rest are
  // recomputed); and which recomputations run while this rank waits for a pipeline receive, before the action
  // (index in this rank's schedule) that needs it, instead of on demand. From a placement (overlap.h).
  std::vector<std::vector<KeptOps>> kept_ops;
  struct WindowRecompute {
    int action = 0;  // the receive this rank waits for before running action `action` of its schedule
    int micro = 0, chunk = 0, layer = 0;
    LayerOp op = LayerOp::pre;
  };
  std::vector<WindowRecompute> window_recomputes;
  uint64_t seed = 1;
  float init_std = 0.02f;
  bool record_timeline = false;
};

// One step of `config` on a grid of any size, as an operation graph (trace.h), traced by the step executor itself on
// one rank per pipeline stage (tensor- and data-parallel coordinate 0), each standing for the tp x dp ranks of its
// stage, whose graphs differ only in their groups' members. ranks_per_node: the nodes of the traced job. Each op
// carries the phase it was issued in (TraceOp::phase).
struct TraceOptions {
  int ranks_per_node = 8;
  std::string grid_order = "tp,pp,dp";
  // One configuration per pipeline rank where they differ (overlap's placement: each rank's kept ops and
  // recomputations in windows, apply_placement in overlap.h); empty: `config` on every rank.
  std::vector<TrainConfig> pipeline_rank_configs;
  // What production frameworks overlap that the executor runs one after another (tracer.h): tensor-parallel
  // all-gathers and reduce-scatters beside their GEMMs (Megatron-Core's --tp-comm-overlap), and the optimizer's
  // parameter all-gathers beside the next forward (--overlap-param-gather). The gradients' reductions during backward
  // are the executor's own (TrainConfig::overlap).
  bool tp_comm_overlap = false;
  bool overlap_param_gather = false;
};
// What a trace covers, so that it takes seconds and a few GB on one core (the trace holds every op of every
// micro-batch: about 15-40 kB a layer pass): ranks, and layers x micro-batches (1T over 512 micro-batches is
// 65,536 layer passes). Beyond them trace_step throws std::invalid_argument.
inline constexpr long long kMaxTracedRanks = 1 << 20;
inline constexpr long long kMaxTracedLayerPasses = 1 << 18;
StepTrace trace_step(const TrainConfig& config, const coll::GridShape& grid, const TraceOptions& options = {});

// The layers of each of the p v pipeline stages: `stage_layers` when given (p v entries, each >= 1, summing to L),
// else L / (p v) each. std::invalid_argument saying why otherwise.
std::vector<int> stage_partition(const ModelConfig& model, int stages, const std::vector<int>& stage_layers);

// The stages pipeline rank `pp_rank` of `pp` runs under the configuration, one per model chunk (chunk c: stage
// c pp + pp_rank): layers, embeddings, head, micro-batches in flight under the schedule, kept ops. Throws
// std::invalid_argument as the trainer does (schedule refused, layers that do not divide).
std::vector<StagePlan> rank_stages(const TrainConfig& config, int pp, int pp_rank);

// Which units (embeddings 0, layers 1..L, final norm L + 1) the stages hold: a stage its layers, the first the
// embeddings, the last the final norm and its copy of the token table.
std::vector<bool> units_held(const ModelConfig& model, const std::vector<StagePlan>& stages);

// Bytes each category holds on this rank, as allocated: the model states, the model's activations and
// workspace, and the pool of communication buffers (gathered units, per-micro-batch gradients, reduction
// targets), which holds the most that were in use at once.
struct MemoryUse {
  double params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0, comm_buffers = 0;
  double total() const { return params + grads + optimizer + activations + workspace + comm_buffers; }
};

// Where a collective of the step runs: inside a group (a node), across groups (same local index), or over all
// data-parallel ranks.
enum class CommTier { intra, inter, global };
inline constexpr int kCommTiers = 3;
const char* name(CommTier tier);  // "intra", "inter", "global"

// Communication of one tier in a step. busy: time with at least one of its collectives in flight, from the
// start to the first test that saw it done (so rounded up to the next point where progress is made); exposed:
// the step's waits for collectives, each moment split evenly over the tiers that had one in flight; hidden =
// busy - exposed, never below zero.
struct TierComm {
  double busy_seconds = 0, exposed_seconds = 0;
  int operations = 0;
  double hidden_seconds() const { return busy_seconds > exposed_seconds ? busy_seconds - exposed_seconds : 0; }
};

// One interval of the step on this rank, on the host steady clock (seconds since its epoch).
struct TimelineEvent {
  std::string operation;  // "forward", "backward", "optimizer", "allgather params 3", ...
  std::string stream;     // "compute" or "comm"
  std::string group;      // "intra", "inter", "global", "tp"; "" for compute
  double start = 0, end = 0;
  double bytes = 0;  // the collective's buffer: what each rank contributes or receives whole
};

// Pipeline figures of one step on this rank: the waits for a stage's input or output gradient (the bubble,
// with transfers), and the activations and gradients sent to other stages.
struct PipelineStats {
  double wait_seconds = 0;   // waiting for receives from other stages, no compute to do (exposed)
  double busy_seconds = 0;   // with a send or receive in flight, from its start to the point that saw it done
  double sent_bytes = 0;
  int sends = 0;
  double hidden_seconds() const { return busy_seconds > wait_seconds ? busy_seconds - wait_seconds : 0; }
};

struct StepStats {
  double loss = 0;       // mean over the global batch's tokens
  double grad_norm = 0;  // global, before clipping
  float lr = 0;
  double seconds = 0;
  // Compute phases exclude the waits for communication inside them; idle is what the phases do not cover
  // (reading data, the loss and norm reductions of a few bytes).
  double forward_seconds = 0, backward_seconds = 0, optimizer_seconds = 0;
  double recompute_seconds = 0;     // inside backward: the forward work it does again first (Recompute)
  // Recompute::overlap: recomputation run in windows, before a backward, while this rank waits for the gradient
  // from the next stage (a compute phase of its own); and the part of it done before that gradient arrived, so
  // hidden behind the wait. The rest of it, and recompute_seconds, are on the critical path.
  double recompute_window_seconds = 0, recompute_hidden_seconds = 0;
  double exposed_comm_seconds = 0;  // waiting for collectives and pipeline receives that were not done
  // Tensor-parallel collectives (blocking, inside forward and backward, counted in exposed_comm_seconds): their
  // time, and the bytes of their buffers.
  double tp_comm_seconds = 0, tp_comm_bytes = 0;
  double idle_seconds = 0;  // the step less forward, backward, recompute in windows, optimizer, exposed comm
  std::array<TierComm, kCommTiers> comm;
  coll::Traffic traffic;  // bytes this rank sent in the step (Strata's own algorithms count them; library: 0)
  PipelineStats pipeline;
  // For placing recomputation: per action of this rank's schedule, the time it waited for its receive (0: it
  // has none); per model chunk, per layer of its stage and op, the forward time summed over the step's
  // micro-batches.
  std::vector<double> receive_waits;
  std::vector<std::vector<std::array<double, kLayerOps>>> forward_op_seconds;
  // For partitioning stages: per model chunk, per layer of its stage, the backward time (on-demand recomputation
  // and waits left out) and the on-demand recomputation; per chunk, the rest of its forward and backward passes
  // (its embeddings, or its final norm, head and loss), all summed over the step's micro-batches.
  std::vector<std::vector<double>> layer_backward_seconds, layer_recompute_seconds;
  std::vector<double> stage_extra_seconds;
  std::vector<TimelineEvent> timeline;  // when TrainConfig::record_timeline
};

class Trainer {
 public:
  // Collective over the world. Throws std::invalid_argument when the strategy is refused, the groups are uneven
  // for an I strategy, the schedule is refused on the grid, or the layers do not divide into the stages.
  Trainer(const TrainConfig& config, coll::ProcessGroups& groups, const TokenSource& data);
  // The step of one rank of traced groups (coll::ProcessGroups' traced constructor), recorded by `tracer` rather
  // than run (trace.h): nothing is allocated but addresses, nothing computed, no data read. step() records one.
  Trainer(const TrainConfig& config, coll::ProcessGroups& traced_groups, Tracer& tracer);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step (step >= 1). Collective over the data-parallel group. The timeline is recorded when
  // asked here or by the configuration.
  StepStats step(int64_t step, bool record_timeline = false);
  // This rank's schedule.
  const std::vector<PipelineAction>& actions() const;
  // Overlap on or off from the next step on (TrainConfig::overlap changes only when collectives are
  // waited for, not what is allocated), so a benchmark can interleave both on one trainer's state.
  void set_overlap(bool overlap);
  // Every parameter of this rank's tensor-parallel shard (the whole model without tensor parallelism), every
  // stage's, on every rank (collective over the data-parallel and pipeline groups): for checks against the
  // single-rank step.
  std::vector<float> full_parameters();
  MemoryUse memory() const;
  int64_t global_rows() const;  // rows of the global batch: dp ranks x accumulation x micro_batch
  // The stages this rank runs (one per model chunk), as the model runs them.
  std::vector<StagePlan> stages() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::train
