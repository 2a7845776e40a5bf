// Implementation of the step's collectives in flight (see step_comm.h).
#include "train/step_comm.h"

namespace strata::train {

void StepComm::begin_step(std::vector<TimelineEvent>* step_timeline) {
  exposed = 0;
  traffic_ = {};
  comm_ = {};
  timeline = step_timeline;
}

StepComm::Op StepComm::track(const coll::Group& group, std::string what, std::size_t floats, coll::Work work) {
  Op op{std::move(work), &group == intra_ ? CommTier::intra : &group == inter_ ? CommTier::inter : CommTier::global,
        std::move(what), 4.0 * static_cast<double>(floats), host_seconds(), true, tracer_ ? tracer_->last_operation() : -1};
  const auto t = static_cast<std::size_t>(op.tier);
  if (tier_in_flight_[t]++ == 0) tier_busy_since_[t] = op.start;
  ++comm_[t].operations;
  if (tracer_) tracer_->rename(op.trace_op, op.what);
  return op;
}

void StepComm::finished(Op& op) {
  if (!op.tracked) return;
  const double end = host_seconds();
  const auto t = static_cast<std::size_t>(op.tier);
  if (--tier_in_flight_[t] == 0) comm_[t].busy_seconds += end - tier_busy_since_[t];
  traffic_ += op.work.traffic();
  if (timeline) timeline->push_back({op.what, "comm", name(op.tier), op.start, end, op.bytes});
}

void StepComm::launch(Op op, std::function<void()> then) {
  in_flight_.push_back({std::move(op), std::move(then)});
  if (!*overlap_) wait_all();
}

void StepComm::launch_chain(Op first, std::function<void()> then, std::function<Op()> second) {
  chains_.push_back({std::move(first), std::move(then), std::move(second), hooks_seen_ + kSecondPhaseDelay, false});
  if (!*overlap_) wait_all();
}

void StepComm::progress() {
  for (std::size_t i = 0; i < in_flight_.size();) {
    if (!in_flight_[i].op.work.test()) {
      ++i;
      continue;
    }
    InFlight done = std::move(in_flight_[i]);
    in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
    finished(done.op);
    if (done.then) done.then();
  }
  for (Chain& chain : chains_)
    if (!chain.first_done && chain.first.work.test()) finish_first(chain);
}

void StepComm::finish_first(Chain& chain) {
  chain.first_done = true;
  finished(chain.first);
  if (chain.then) chain.then();
}

void StepComm::start_second_phases(bool all) {
  std::size_t started = 0;
  for (Chain& chain : chains_) {
    if (!all && chain.start_second_at > hooks_seen_) break;  // created in order, so due in order
    // progress() finishes the first phase (its bookkeeping runs once, there).
    wait_until([&] { return chain.first_done; }, {chain.first.trace_op});
    if (chain.second) {
      Op next = chain.second();
      if (next.work.done())
        finished(next);
      else
        in_flight_.push_back({std::move(next), {}});
    }
    ++started;
  }
  chains_.erase(chains_.begin(), chains_.begin() + static_cast<std::ptrdiff_t>(started));
}

void StepComm::at_hook() {
  ++hooks_seen_;
  start_second_phases(false);
  progress();
}

void StepComm::wait_all() {
  start_second_phases(true);
  std::vector<int> everything;
  for (const InFlight& op : in_flight_) everything.push_back(op.op.trace_op);
  wait_until([&] { return in_flight_.empty(); }, everything);
}

void StepComm::wait_round(double& last) {
  std::array<bool, kCommTiers> waiting_on{};
  int tiers = 0;
  for (std::size_t t = 0; t < waiting_on.size(); ++t)
    if ((waiting_on[t] = tier_in_flight_[t] > 0)) ++tiers;
  progress();
  const double t_now = host_seconds(), waited = t_now - last;
  last = t_now;
  exposed += waited;
  for (std::size_t t = 0; t < waiting_on.size(); ++t)
    if (waiting_on[t]) comm_[t].exposed_seconds += waited / tiers;
}

}  // namespace strata::train
