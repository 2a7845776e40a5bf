// The data-parallel collectives a CPU training step has in flight: started where the step reaches them,
// progressed at the model's hooks, waited for only where their result is read; and what the step spent waiting.
//
// Every rank starts the collectives of a communicator in the same order, so nothing here starts one at a
// completion (ranks see completions at different times): a completion runs local bookkeeping only, and the
// second phase of a two-phase reduction starts at a hook count, the same point on every rank.
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "collectives/process_group.h"
#include "train/clock.h"
#include "train/tracer.h"
#include "train/trainer.h"

namespace strata::train {

class StepComm {
 public:
  // A collective of the step with what the records need: its tier, a name for the timeline, when it started.
  struct Op {
    coll::Work work;
    CommTier tier = CommTier::global;
    std::string what;
    double bytes = 0, start = 0;
    bool tracked = false;  // false: nothing was launched (a completed Work)
    int trace_op = -1;     // traced: the operation in the trace
  };

  // intra, inter: the data-parallel groups whose collectives count as those tiers (the rest: global).
  // overlap: the trainer's setting, read at every launch (it may switch between steps); off, every launch is waited
  // for at once. tracer: a traced step's recorder, or null.
  StepComm(const coll::Group& intra, const coll::Group& inter, const bool& overlap, Tracer* tracer)
      : intra_(&intra), inter_(&inter), overlap_(&overlap), tracer_(tracer) {}

  // The counters zeroed for a new step; `timeline`: where the step's intervals go, or null.
  void begin_step(std::vector<TimelineEvent>* timeline);

  // Starts the bookkeeping of a collective just launched on `group`.
  Op track(const coll::Group& group, std::string what, std::size_t floats, coll::Work work);
  // In flight until done, then `then` (local bookkeeping).
  void launch(Op op, std::function<void()> then = {});
  // A reduction in two phases: `second` starts kSecondPhaseDelay hooks after this one (waiting for `first`
  // there if it is not done), or at the end of the step.
  void launch_chain(Op first, std::function<void()> then, std::function<Op()> second);
  // Tests every operation in flight once and runs the bookkeeping of those that completed.
  void progress();
  // Every hook of the model is a point all ranks pass in the same order.
  void at_hook();
  // Everything in flight, second phases included, done.
  void wait_all();
  // Progresses the operations in flight until `done` holds; the time is communication the step waited for.
  // `traced`: the operations it waits for, which a traced step completes here (nothing else completes them).
  template <typename Done>
  void wait_until(Done done, const std::vector<int>& traced = {});

  // What the step waited for (these collectives, the pipeline's transfers, the tensor-parallel collectives), and
  // the step's timeline.
  double exposed = 0;
  std::vector<TimelineEvent>* timeline = nullptr;
  const coll::Traffic& traffic() const { return traffic_; }
  const std::array<TierComm, kCommTiers>& tiers() const { return comm_; }

 private:
  struct InFlight {
    Op op;
    std::function<void()> then;
  };
  struct Chain {
    Op first;
    std::function<void()> then;  // local bookkeeping once the first phase is done
    std::function<Op()> second;  // the next collective; may return a completed one
    long start_second_at = 0;    // hook count
    bool first_done = false;
  };
  static constexpr long kSecondPhaseDelay = 2;  // hooks: long enough to overlap, short enough to bound memory

  void finished(Op& op);  // its completion, seen by a test (or at once when it was done at launch)
  void finish_first(Chain& chain);
  // Starts, in creation order, the second phases due by now (`all`: every one), waiting for first phases.
  void start_second_phases(bool all);
  // One round of progress while waiting; the time since `last` is exposed, shared by the tiers in flight.
  void wait_round(double& last);

  const coll::Group* intra_;
  const coll::Group* inter_;
  const bool* overlap_;
  Tracer* tracer_;
  std::vector<InFlight> in_flight_;
  std::vector<Chain> chains_;  // in creation order
  long hooks_seen_ = 0;
  coll::Traffic traffic_;
  std::array<TierComm, kCommTiers> comm_{};
  std::array<int, kCommTiers> tier_in_flight_{};
  std::array<double, kCommTiers> tier_busy_since_{};
};

template <typename Done>
void StepComm::wait_until(Done done, const std::vector<int>& traced) {
  if (tracer_) {
    const bool alone = std::count_if(traced.begin(), traced.end(), [](int op) { return op >= 0; }) == 1;
    for (int op : traced)
      if (op >= 0) tracer_->complete(op, alone);
    progress();
    if (!done()) throw std::logic_error("a traced step waits for an operation its wait does not name");
    return;
  }
  double last = host_seconds();
  while (!done()) wait_round(last);
}

}  // namespace strata::train
