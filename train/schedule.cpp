// Pipeline schedules (see schedule.h).
#include "train/schedule.h"

#include <algorithm>
#include <stdexcept>

namespace strata::train {

const char* name(Schedule schedule) {
  switch (schedule) {
    case Schedule::gpipe: return "gpipe";
    case Schedule::one_f_one_b: return "1f1b";
    case Schedule::interleaved: return "interleaved";
  }
  return "?";
}

std::optional<Schedule> parse_schedule(std::string_view text) {
  for (Schedule s : kAllSchedules)
    if (text == name(s)) return s;
  return std::nullopt;
}

std::string schedule_refusal(Schedule schedule, const PipelineShape& s) {
  if (s.stages < 1 || s.micro_batches < 1 || s.chunks < 1)
    return "stages, micro-batches and chunks must be at least 1";
  if (schedule != Schedule::interleaved) {
    if (s.chunks > 1) return std::string(name(schedule)) + " runs one model chunk per rank (virtual stages are interleaved's)";
    return "";
  }
  if (s.stages < 2) return "interleaving needs at least 2 pipeline stages";
  if (s.chunks < 2) return "interleaving needs at least 2 model chunks (virtual stages) per rank";
  if (s.micro_batches % s.stages != 0)
    return "interleaving runs micro-batches in groups of the " + std::to_string(s.stages) + " stages: " +
           std::to_string(s.micro_batches) + " micro-batches are not a multiple";
  return "";
}

namespace {

using Pass = PipelineAction::Pass;

std::vector<PipelineAction> gpipe(const PipelineShape& s) {
  std::vector<PipelineAction> actions;
  for (int i = 0; i < s.micro_batches; ++i) actions.push_back({Pass::forward, i, 0});
  for (int i = s.micro_batches - 1; i >= 0; --i) actions.push_back({Pass::backward, i, 0});
  return actions;
}

std::vector<PipelineAction> one_f_one_b(const PipelineShape& s, int rank) {
  const int m = s.micro_batches, warmup = std::min(m, s.stages - rank - 1);
  std::vector<PipelineAction> actions;
  for (int i = 0; i < warmup; ++i) actions.push_back({Pass::forward, i, 0});
  for (int i = 0; i < m - warmup; ++i) {
    actions.push_back({Pass::forward, warmup + i, 0});
    actions.push_back({Pass::backward, i, 0});
  }
  for (int i = m - warmup; i < m; ++i) actions.push_back({Pass::backward, i, 0});
  return actions;
}

// Megatron-LM's forward_backward_pipelining_with_interleaving: virtual micro-batch k runs chunk
// (k mod p v) / p (reversed for backward) on micro-batch (k / (p v)) p + k mod p.
std::vector<PipelineAction> interleaved(const PipelineShape& s, int rank) {
  const int p = s.stages, v = s.chunks, total = s.micro_batches * v;
  auto action = [&](Pass pass, int k) {
    int chunk = (k % (p * v)) / p;
    if (pass == Pass::backward) chunk = v - 1 - chunk;
    return PipelineAction{pass, (k / (p * v)) * p + k % p, chunk};
  };
  const int warmup = s.micro_batches == p ? total : std::min(total, (p - rank - 1) * 2 + (v - 1) * p);
  std::vector<PipelineAction> actions;
  for (int k = 0; k < warmup; ++k) actions.push_back(action(Pass::forward, k));
  for (int k = 0; k < total - warmup; ++k) {
    actions.push_back(action(Pass::forward, warmup + k));
    actions.push_back(action(Pass::backward, k));
  }
  for (int k = total - warmup; k < total; ++k) actions.push_back(action(Pass::backward, k));
  return actions;
}

}  // namespace

std::vector<PipelineAction> pipeline_actions(Schedule schedule, const PipelineShape& shape, int rank) {
  if (const std::string why = schedule_refusal(schedule, shape); !why.empty())
    throw std::invalid_argument(std::string("schedule ") + name(schedule) + ": " + why);
  if (rank < 0 || rank >= shape.stages)
    throw std::invalid_argument("pipeline rank " + std::to_string(rank) + " of " + std::to_string(shape.stages));
  switch (schedule) {
    case Schedule::gpipe: return gpipe(shape);
    case Schedule::one_f_one_b: return one_f_one_b(shape, rank);
    case Schedule::interleaved: return interleaved(shape, rank);
  }
  return {};
}

std::vector<int> in_flight(const std::vector<PipelineAction>& actions, int chunks) {
  std::vector<int> now(static_cast<std::size_t>(chunks), 0), most(static_cast<std::size_t>(chunks), 0);
  for (const PipelineAction& a : actions) {
    int& held = now.at(static_cast<std::size_t>(a.chunk));
    held += a.pass == Pass::forward ? 1 : -1;
    most[static_cast<std::size_t>(a.chunk)] = std::max(most[static_cast<std::size_t>(a.chunk)], held);
  }
  return most;
}

}  // namespace strata::train
