// The pipeline's transfers between stages: non-blocking sends and receives of the pp group, started where the
// schedule reaches them, progressed with the data-parallel collectives, completed where an action needs them; and
// the pipeline's figures (waits, busy time, bytes sent).
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "collectives/process_group.h"
#include "train/memory.h"
#include "train/step_comm.h"
#include "train/tracer.h"
#include "train/trainer.h"

namespace strata::train {

class StageTransfers {
 public:
  // A send or receive of the pp group, and what the records need.
  struct Transfer {
    coll::Work work;
    std::string what;
    double bytes = 0, start = 0;
    TrackedBuffer<float> buffer;  // a send's copy, handed back when done (traced: at once, as nothing reads it)
    int trace_op = -1;            // traced: the operation in the trace
  };
  // pp: the pipeline group (stage s runs on its rank s % size). comms: progressed while waiting, and the waits added
  // to its exposed time. give_back: takes a finished send's copy.
  StageTransfers(coll::Group& pp, StepComm& comms, Tracer* tracer, std::function<void(TrackedBuffer<float>&)> give_back)
      : pp_(pp), comms_(comms), tracer_(tracer), give_back_(std::move(give_back)) {}

  void begin_step() { stats = {}; }
  // (floats) of stage `from_stage`'s rank into `into`.
  Transfer receive(float* into, std::size_t floats, int from_stage, std::string what);
  // (floats) from `data` to stage `to_stage`'s rank; the caller completes it.
  Transfer send(const float* data, std::size_t floats, int to_stage, std::string what);
  // The same from a copy the transfers keep until it is done (then handed back), completed by progress or drain.
  void send_copy(TrackedBuffer<float> copy, std::size_t floats, int to_stage, std::string what);
  // Waits for a transfer, progressing everything in flight (the time is the pipeline's wait, exposed), and records it.
  void complete(Transfer& t);
  // Tests the kept sends; those done hand their copies back. Traced: nothing (a traced send ends when waited for).
  void progress();
  // Every kept send done.
  void drain();

  PipelineStats stats;

 private:
  Transfer started(coll::Work work, std::string what, std::size_t floats, TrackedBuffer<float> copy);
  void finished(Transfer& t);

  coll::Group& pp_;
  StepComm& comms_;
  Tracer* tracer_;
  std::function<void(TrackedBuffer<float>&)> give_back_;
  std::deque<Transfer> sends_;  // kept, in flight
  int in_flight_ = 0;
  double busy_since_ = 0;
};

}  // namespace strata::train
