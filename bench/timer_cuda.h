// A harness timer for GPU work: CUDA events recorded on the stream the work runs on; stop() waits for
// the end event, so the sample covers exactly the device time of the enqueued work.
#pragma once

#include <memory>

#include "bench/timer.h"

namespace strata {

std::unique_ptr<Timer> make_cuda_event_timer(void* stream);  // stream: a cudaStream_t

}  // namespace strata
