// Pipeline schedules as data: the order in which one pipeline rank runs the forward and backward passes of its
// model chunks over a step's micro-batches. Megatron-LM writes each schedule as a function that runs it; here
// each is a function that lists it, so the step executor runs the list and a trace or a simulator reads the
// same list.
//
// p stages (pipeline ranks), m micro-batches, v model chunks per rank (interleaved only): rank r holds stages
// r, r + p, ..., r + (v - 1) p, chunk c being stage c p + r. Stage s's forward of micro-batch i needs stage
// s - 1's forward of i; its backward needs stage s + 1's backward of i and its own forward of i.
//   gpipe        every forward (micro-batch order), then every backward (reverse order);
//   1f1b         p - 1 - r forwards (warm-up), then one forward and one backward alternately (steady), then the
//                last backwards (cool-down): at most p - r micro-batches in flight instead of m;
//   interleaved  Megatron-LM's interleaved 1F1B over m v virtual micro-batches: forwards in groups of p
//                micro-batches per chunk (chunk 0 of micro-batches 0..p-1, chunk 1 of the same, ...), backwards
//                likewise with the chunks in reverse; (p - r - 1) 2 + (v - 1) p warm-up forwards, or all of them
//                when m = p. Needs m a multiple of p.
// With uniform stages and free transfers, the idle fraction of the ideal time is (p - 1) / m for gpipe and 1f1b
// and (p - 1) / (v m) interleaved (docs/metrics.md).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::train {

enum class Schedule { gpipe, one_f_one_b, interleaved };
inline constexpr Schedule kAllSchedules[] = {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved};
const char* name(Schedule schedule);  // "gpipe", "1f1b", "interleaved"
std::optional<Schedule> parse_schedule(std::string_view text);

struct PipelineAction {
  enum class Pass { forward, backward };
  Pass pass = Pass::forward;
  int micro = 0;  // micro-batch
  int chunk = 0;  // model chunk on this rank: stage chunk * p + rank
  bool operator==(const PipelineAction&) const = default;
};

struct PipelineShape {
  int stages = 1;         // p: pipeline ranks
  int micro_batches = 1;  // m
  int chunks = 1;         // v: model chunks per rank (interleaved)
};

// "" when the schedule runs on this shape, else why not (p, m, v below 1; v > 1 without interleaving;
// interleaving on one stage, with one chunk, or with m not a multiple of p).
std::string schedule_refusal(Schedule schedule, const PipelineShape& shape);

// The actions of pipeline rank `rank`, in the order it runs them. std::invalid_argument when refused.
std::vector<PipelineAction> pipeline_actions(Schedule schedule, const PipelineShape& shape, int rank);

// Per chunk, the most micro-batches whose forward has run and backward has not, at any point of the list: the
// activations the chunk holds at once. Each chunk runs its forwards in micro-batch order and its backwards in one
// order too, so the micro-batches in flight are always consecutive in that order.
std::vector<int> in_flight(const std::vector<PipelineAction>& actions, int chunks);

// The stage a chunk of a rank runs, and the pipeline rank and chunk of a stage.
inline int stage_of(const PipelineShape& shape, int rank, int chunk) { return chunk * shape.stages + rank; }

}  // namespace strata::train
