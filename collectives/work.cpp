// Implementation of operations in flight (see work.h).
#include "collectives/work.h"

#include <string>

#include "collectives/mpi_error.h"

namespace strata::coll {

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw MpiError(std::string("MPI call failed: ") + call + " at " + file + ":" + std::to_string(line) + ": " +
                 std::string(text, static_cast<std::size_t>(length)));
}

Traffic& Traffic::operator+=(const Traffic& other) {
  intra_bytes += other.intra_bytes;
  inter_bytes += other.inter_bytes;
  return *this;
}

MPI_Request* Requests::add() {
  if (spilled_.empty() && count_ < static_cast<int>(in_place_.size())) return &in_place_[static_cast<std::size_t>(count_++)];
  if (spilled_.empty()) spilled_.assign(in_place_.begin(), in_place_.end());
  ++count_;
  return &spilled_.emplace_back();
}

void Requests::clear() {
  count_ = 0;
  spilled_.clear();
}

bool Requests::await_ready() {
  if (count_ == 0) return true;
  int complete = 0;
  STRATA_MPI_CHECK(MPI_Testall(count_, data(), &complete, MPI_STATUSES_IGNORE));
  return complete != 0;
}

void Work::launch() {
  auto handle = state_->step.handle();
  handle.promise().scheduler = &state_->scheduler;
  handle.resume();  // runs until the first wait on messages, or to the end
  rethrow_if_failed();
}

void Work::rethrow_if_failed() const {
  if (state_ && state_->step.handle() && state_->step.handle().promise().error)
    std::rethrow_exception(state_->step.handle().promise().error);
}

bool Work::test() {
  if (done()) return true;
  Scheduler& s = state_->scheduler;
  int complete = 1;
  if (s.waiting && s.waiting->size() > 0)
    STRATA_MPI_CHECK(MPI_Testall(s.waiting->size(), s.waiting->data(), &complete, MPI_STATUSES_IGNORE));
  if (complete && s.condition) complete = (*s.condition)();
  if (!complete) return false;
  s.waiting = nullptr;
  s.condition = nullptr;
  auto next = std::exchange(s.resume_point, {});
  next.resume();  // on to the next wait, or to the end (errors surface at the outermost step)
  rethrow_if_failed();
  return done();
}

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    Work finished(std::move(*this));  // waits, if still in flight, as it goes
    state_ = std::move(other.state_);
  }
  return *this;
}

void Work::finish_in_destructor() noexcept {
  try {
    wait();
  } catch (...) {
    // A destructor cannot report it; the requests are complete or the job is ending on an MPI error.
  }
}

}  // namespace strata::coll
