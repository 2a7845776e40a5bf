// The search over ways to train a model on N devices of a described system: every grid (tensor x pipeline x data
// parallel), data-parallel strategy (PaRO/ZeRO), micro-batch size, pipeline schedule and recomputation mode that
// runs and fits in memory, ranked by the step time the simulator predicts for it (the step executor's own trace,
// train::trace_step, as the simulator's workload). Pure logic: the program (bench/project/project_search.cpp) parses, prints
// and writes.
//
// What is enumerated, for N devices, the model and a global batch of B sequences of s tokens:
//   tp   divides the devices of a node (a tensor-parallel group stays inside a node), N, and the model's heads, kv
//        heads and MLP width (train::tensor_shard); sequence parallelism with it (SearchSpace::sequence_parallel)
//   pp   divides N / tp; the layers must divide into its p v stages (uniform stages, as the executor takes them
//        without --stage-layers)
//   dp   N / (tp pp); its ranks must sit evenly on the nodes they use (the executor's rule)
//   mb   each micro-batch size of the list whose m = B / (dp mb) micro-batches per step is a whole number
//   schedule gpipe, 1f1b, interleaved (v = SearchSpace::interleave_chunks), as train::schedule_refusal allows
//   recompute none, full, selective. Overlapped recomputation needs a measured placement (train/overlap.h) and is
//        not searched.
//   strategy each runnable one (train::runnable_strategies; a named one train::refusal_reason refuses is refused)
// Memory: of the pipeline ranks, the one whose total is largest, each counted as strata-project predict counts it
// (project::pipeline_rank_memory): for a 16-bit dtype (bf16, fp16, fp8) a GPU step in mixed precision
// (train::gpu_memory_estimate: model states at train::kMixedPrecisionStates, 2, 2 and 12 bytes per parameter;
// Korthikanti et al.'s activations, with the scores where SearchSpace::attention is "unfused" and the linear layers'
// inputs at 1 byte under fp8 (train::GpuLayout::gemm_input_bytes), dropout masks where SearchSpace::dropout, the
// logits at the element size under the fused loss and at 4 bytes under the fp32 ones, the sharded states' buffers in
// flight as SearchSpace::sharding_buffers says a framework holds them), for fp32 the CPU executor's
// accounting (train::memory_estimate).
// Each configuration that fits is predicted as strata-project predict predicts a step (project::predict_step: traced,
// compacted, simulated), without the interval and with runs of compute ops across phases (PredictOptions: the same
// step, compute, idle and exposed communication from fewer operations).
//
// Pruning (exact): configurations are taken in order of a lower bound on their step time, and one is traced only
// while its bound is below the k-th best step found so far; once the next bound reaches it, no configuration left
// can enter the top k and the search stops. Two bounds, each at or below the simulated step (the unit tests hold
// them there):
//   first, strategy-independent, from a probe trace of one and two micro-batches on the same tp x pp grid with one
//     data-parallel rank: per pipeline rank r and micro-batch, Δ_r, the alone-time of its GEMMs and attention calls
//     plus the tensor-parallel collectives that sit between two compute operations that depend on them (nothing
//     computes on the rank while they run). A step of m micro-batches takes at least
//       max over r of (Σ_{s<r} Δ_s + m Δ_r)
//     (rank r cannot start before micro-batch 0 passed stages 0..r-1, does m micro-batches' work, and the last
//     micro-batch's backward passes stages r-1..0 after it); interleaved with v chunks, the first micro-batch
//     passes chunk 0 of the ranks before, a v-th of their layers: Σ_{s<r} Δ_s / v + m Δ_r;
//   then, for a configuration that reaches the front with m > 3, the strategy's own: a probe of the configuration
//     at 2 and 3 micro-batches (1F1B) gives, per traced rank, the alone-time of every compute operation plus those
//     blocking tensor-parallel collectives, and per group the durations of its collectives (one stream each, so
//     they run one after another), each extrapolated to m (the middle micro-batches repeat the same operations);
//     the step takes at least the largest.
// Interleaved schedules take the one-chunk probes: a rank of v chunks runs the same layers, units and collectives
// and more stage boundaries. With partial training that holds no longer, and interleaved configurations get no
// bound. Both bounds are computed once per probe key and cached.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "project/paro_rule.h"
#include "project/simulate.h"
#include "project/step_prediction.h"
#include "project/trace_workload.h"
#include "train/gpu_memory.h"
#include "train/step_formulas.h"
#include "train/trainer.h"

namespace strata::project {

struct SearchSpace {
  train::ModelConfig model;
  int devices = 0;       // N
  int global_batch = 0;  // B: sequences per step
  int seq = 0;           // s
  train::Trainable trainable;
  std::vector<int> micro_batch_sizes = {1, 2, 4, 8};
  std::vector<train::Schedule> schedules = {train::Schedule::gpipe, train::Schedule::one_f_one_b,
                                            train::Schedule::interleaved};
  int interleave_chunks = 2;  // v of the interleaved schedule
  std::vector<train::Recompute> recompute = {train::Recompute::none, train::Recompute::full,
                                             train::Recompute::selective};
  std::vector<train::Strategy> strategies;  // empty: train::runnable_strategies()
  std::vector<int> tp, pp;                  // empty: every degree that divides
  bool sequence_parallel = true;            // with tp > 1
  std::string dtype = "bf16";               // of GEMMs and attention; 16-bit: mixed-precision memory (above)
  int gradient_reduction_bytes = 0;         // WorkloadOptions::gradient_reduction_bytes (0: the step's element size)
  std::string attention = "flash";          // WorkloadOptions::attention
  std::string loss = "fused";               // WorkloadOptions::loss
  bool dropout = true;                      // WorkloadOptions::dropout (memory only)
  std::string sharding_buffers = "strata";  // WorkloadOptions::sharding_buffers (memory only)
  double memory_limit = 0;                  // B per device
  int top = 10;
  bool prune = true;  // the lower bounds above; false: every configuration that fits is simulated
  int threads = 1;    // configurations traced and simulated at once
};

struct Candidate {
  int tp = 1, pp = 1, dp = 1;
  train::Strategy strategy;
  int micro_batch = 1;    // sequences per micro-batch per data-parallel rank
  int micro_batches = 1;  // m per step
  train::Schedule schedule = train::Schedule::one_f_one_b;
  int virtual_stages = 1;
  train::Recompute recompute = train::Recompute::none;
  bool sequence_parallel = false;
  std::string label() const;  // "tp8 pp8 dp16 NNG mb1 m96 1f1b selective sp"
};

// The training configuration a candidate runs (the executor's TrainConfig).
train::TrainConfig train_config(const SearchSpace& space, const Candidate& candidate);

// Where the data-parallel group of pipeline rank `pp_rank` sits: n ranks in g groups (nodes) of m, as the executor
// lays them out (grid order tp, pp, dp; min(devices per node, N) ranks per node; train::stage_data_parallel_shape).
// std::invalid_argument when its ranks spread unevenly over the nodes they use.
train::DataParallelShape data_parallel_layout(const Candidate& candidate, int devices_per_node, int devices, int pp_rank);

// The memory of the pipeline rank that needs the most, under the search's convention (above), and its total.
struct RankMemory {
  train::MemoryUse use;
  int pp_rank = 0;
  double total() const {
    return use.total();
  }
};
bool mixed_precision(const std::string& dtype);
// The candidate as a step to predict (step_prediction.h): its configuration, grid (order tp, pp, dp) and workload.
StepCase step_case(const SearchSpace& space, const Candidate& candidate, int devices_per_node);
// Of pipeline_rank_memory's ranks, the one with the largest total; std::invalid_argument on an uneven layout.
RankMemory memory_per_rank(const SearchSpace& space, const Candidate& candidate, int devices_per_node);

struct Evaluation {
  Candidate candidate;
  double step_s = 0;
  // Mean over ranks (each traced rank weighted by the ranks it stands for): compute, exposed communication by group
  // role ("tp", "pp" for pipeline transfers and the pipeline group's collectives, "dp", "dp_intra", "dp_inter",
  // "embedding", ...), idle (waiting: the pipeline's bubble, a group's last member, the step's last rank).
  double compute_s = 0, idle_s = 0;
  std::map<std::string, double> exposed_s;
  RankMemory memory;
  // As a predicted step's (step_prediction.h, throughput): model FLOPs (docs/metrics.md: 6 N + 6 L h s per token,
  // whatever trains) over the step time and the peak of every device in the search's dtype.
  double tokens_per_s = 0, mfu = 0;
  double lower_bound_s = 0;
  std::size_t operations = 0, simulated_operations = 0;  // traced, and after compaction
};

// One candidate's predicted step (project::predict_step, as above; its memory computed too, not checked).
// std::invalid_argument when the executor refuses it or its data-parallel ranks spread unevenly over the nodes.
Evaluation evaluate(const System& system, const SearchSpace& space, const Candidate& candidate);

// The strategy that runs the same step on a data-parallel layout of g groups of m ranks, with no more memory:
// with one rank per group (m = 1) parameters sharded inside the group are whole (I = N for P); with one group
// (g = 1) optimizer states sharded inside it are sharded over all (I = G for OS). (Optimizer states I = N at m = 1
// is not one: the step differs by a few parts per million with a pipeline.) The search takes the other only
// (tests hold the predicted steps equal). Otherwise the strategy itself.
train::Strategy equivalent_strategy(const train::Strategy& strategy, int ranks_per_group, int groups);

enum class RefusalKind { divisibility, schedule, strategy, memory, size };
const char* name(RefusalKind kind);

struct SearchResult {
  std::vector<Evaluation> top;  // by predicted step time, fastest first
  std::int64_t enumerated = 0;  // configurations considered (each combination of the space)
  std::map<RefusalKind, std::int64_t> refused;
  std::map<std::string, std::int64_t> refusal_reasons;  // "kind: why" -> configurations
  // Left out: the same step as another configuration of the space (equivalent_strategy; GPipe where it lists the
  // passes in 1F1B's order).
  std::int64_t equivalent = 0;
  std::map<std::string, std::int64_t> equivalent_to;  // "ING = NNG" -> configurations
  std::int64_t fitting = 0;     // runnable configurations that fit in memory
  std::int64_t pruned = 0;      // of those, left out by the lower bound
  // The least bound of those left out: at or above the k-th best step, so none of them could enter the top k.
  double least_pruned_bound_s = std::numeric_limits<double>::infinity();
  std::int64_t simulated = 0;   // traced and simulated
  std::int64_t probes = 0;      // probe traces for the bounds
  double seconds = 0;           // wall time of the whole search
  double simulate_seconds = 0;  // of it, tracing and simulating the configurations
  double bound_seconds = 0;     // of it, the bounds
  std::size_t simulated_operations = 0, traced_operations = 0;
  double rate() const { return seconds > 0 ? static_cast<double>(enumerated) / seconds : 0; }
};

// std::invalid_argument for a space that cannot be searched (no devices, a batch or sequence of 0, a memory limit
// of 0, a dtype the system lacks, an attention kernel it does not name, a loss mode not in loss_modes(), a model the
// executor refuses).
SearchResult search(const System& system, const SearchSpace& space);

// The bounds of the header for one candidate (0 where none applies), probes cached across calls by `cache`: the
// first, and the larger of it and the second (which for m <= 3 is the first). A cache serves one space: its keys
// hold the candidate's shape, not the space's dtype, element sizes, attention or loss.
struct BoundCache {
  std::map<std::vector<int>, std::vector<double>> per_micro;  // first probe key -> Δ per pipeline rank
  struct Sums {
    std::vector<std::array<double, 2>> compute;  // per traced rank, at 2 and 3 micro-batches
    std::vector<std::array<double, 2>> streams;  // per (traced rank, group) with collectives, at 2 and 3
  };
  std::map<std::vector<int>, Sums> sums;  // second probe key -> sums
  std::int64_t probes = 0;
};
double lower_bound_s(const System& system, const SearchSpace& space, const Candidate& candidate, BoundCache& cache);
double refined_lower_bound_s(const System& system, const SearchSpace& space, const Candidate& candidate,
                             BoundCache& cache);

// ---- PaRO's rule beside the search ----
// One scenario of the comparison: a model, what trains, nodes of the system's devices, micro-batches per step, and
// the system's inter-node bandwidth set to intra / ratio (ratio 0: the system's own).
struct ParoComparisonScenario {
  std::string model_name;
  train::ModelConfig model;
  std::string trainable_name = "all";
  train::Trainable trainable;
  int nodes = 2;
  int micro_batches = 1;
  double bandwidth_ratio = 0;  // B' / B; 0: the system's
};

struct ParoComparisonRow {
  ParoComparisonScenario scenario;
  double bandwidth_ratio = 0;  // as used
  std::string rule_choice, search_choice;  // "" when nothing fits
  bool agree = false;      // the same strategy
  bool same_step = false;  // the rule's choice simulates to the search's best step (a tie, or the same strategy)
  bool rule_fits = false;    // the rule's choice fits the search's memory estimate too
  double rule_step_s = 0;    // the simulated step of the rule's choice (simulated even where it does not fit)
  double search_step_s = 0;  // of the search's (the best simulated)
  double rule_total_s = 0;   // the rule's T of its choice
  int fitting = 0;           // strategies that fit (the search's memory estimate)
  std::map<std::string, double> simulated_s;  // every fitting strategy's simulated step
};

// The scenario's search restricted to the data-parallel family on one grid (tp 1, pp 1, dp N), micro-batch
// `micro_batch` of `seq` tokens, 1F1B (one stage: forward and backward alternate), recomputation `recompute`,
// every runnable strategy that fits simulated; beside it the rule's choice on the same memory limit, with the
// memory every strategy holds alike (activations, workspace) from the search's estimate.
ParoComparisonRow compare_paro(const System& system, const ParoComparisonScenario& scenario, int micro_batch, int seq,
                               train::Recompute recompute, const std::string& dtype, double memory_limit);

// The rule's inputs for a scenario (exposed for tests): Ψ, Ψ', Ψ_b from the model's units, n = nodes x devices per
// node, m = devices per node, the tiers' bandwidths, t_compute from the model FLOPs of a micro-batch (docs/metrics.md's
// 6 N + 6 L h s per token, scaled to a forward over Ψ, a backward of twice that over Ψ_b and, with full
// recomputation, another forward over Ψ_b) at the GEMM efficiency of that many FLOPs, t_optimizer from 28 bytes
// moved per element (fp32 master weights and both moments read and written, a 16-bit gradient read and parameter
// written) at the elementwise bandwidth.
ParoScenario paro_scenario(const System& system, const ParoComparisonScenario& scenario, int micro_batch, int seq,
                           train::Recompute recompute, const std::string& dtype, double other_memory_bytes,
                           double memory_limit);

}  // namespace strata::project
