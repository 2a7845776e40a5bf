// Implementation of the pipeline's transfers (see stage_transfers.h).
#include "train/stage_transfers.h"

namespace strata::train {

using coll::DataType;

StageTransfers::Transfer StageTransfers::started(coll::Work work, std::string what, std::size_t floats,
                                                 TrackedBuffer<float> copy) {
  const int op = tracer_ ? tracer_->last_operation() : -1;
  if (tracer_) tracer_->rename(op, what);
  const double start = host_seconds();
  if (in_flight_++ == 0) busy_since_ = start;
  return {std::move(work), std::move(what), 4.0 * static_cast<double>(floats), start, std::move(copy), op};
}

StageTransfers::Transfer StageTransfers::receive(float* into, std::size_t floats, int from_stage, std::string what) {
  return started(pp_.recv(into, floats, DataType::float32, from_stage % pp_.size()), std::move(what), floats, {});
}

StageTransfers::Transfer StageTransfers::send(const float* data, std::size_t floats, int to_stage, std::string what) {
  Transfer t = started(pp_.send(data, floats, DataType::float32, to_stage % pp_.size()), std::move(what), floats, {});
  stats.sent_bytes += t.bytes;
  ++stats.sends;
  return t;
}

void StageTransfers::send_copy(TrackedBuffer<float> copy, std::size_t floats, int to_stage, std::string what) {
  const float* data = copy.data();
  Transfer t = started(pp_.send(data, floats, DataType::float32, to_stage % pp_.size()), std::move(what), floats, std::move(copy));
  stats.sent_bytes += t.bytes;
  ++stats.sends;
  // A traced send reads nothing: its copy (addresses only) goes back at once, so a traced step reserves one.
  if (tracer_) give_back_(t.buffer);
  sends_.push_back(std::move(t));
}

void StageTransfers::finished(Transfer& t) {
  const double end = host_seconds();
  if (--in_flight_ == 0) stats.busy_seconds += end - busy_since_;
  if (comms_.timeline) comms_.timeline->push_back({t.what, "comm", "pp", t.start, end, t.bytes});
}

void StageTransfers::complete(Transfer& t) {
  if (tracer_) tracer_->complete(t.trace_op);
  double last = host_seconds();
  while (!t.work.test()) {
    comms_.progress();
    progress();
    const double t_now = host_seconds();
    stats.wait_seconds += t_now - last;
    comms_.exposed += t_now - last;
    last = t_now;
  }
  finished(t);
}

void StageTransfers::progress() {
  if (tracer_) return;  // a traced send completes only when waited for (Tracer::complete): none to find done
  for (std::size_t i = 0; i < sends_.size();) {
    if (!sends_[i].work.test()) {
      ++i;
      continue;
    }
    finished(sends_[i]);
    give_back_(sends_[i].buffer);
    sends_.erase(sends_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

void StageTransfers::drain() {
  while (!sends_.empty()) {  // taken out first: waiting tests the others, and drops those that are done
    Transfer t = std::move(sends_.front());
    sends_.pop_front();
    complete(t);
    give_back_(t.buffer);
  }
}

}  // namespace strata::train
