// A harness timer for GPU work: CUDA events recorded on the stream the work runs on; stop() waits for
// the end event, so the sample covers exactly the device time of the enqueued work. CudaEventSpans puts GPU
// work on the step records' timeline (bench/harness/records.h) in host time:
//   for (const auto& s : spans.collect()) recorder.add_event(s.operation, s.stream, s.start, s.end, s.bytes, s.group);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/harness/timer.h"

namespace strata {

std::unique_ptr<Timer> make_cuda_event_timer(void* stream);  // stream: a cudaStream_t

// Spans of GPU work on one stream, as timeline events in host time. A CUDA event has no host time, only
// times relative to other events; anchor() synchronises the stream, records an anchor event and reads
// host_now() around its completion, and a span's host time is then the anchor's host time plus
// cudaEventElapsedTime(anchor, event). Anchor at a sync point of each iteration so clock drift between
// device and host stays small; the anchor's error is half the host interval around it.
class CudaEventSpans {
 public:
  CudaEventSpans(void* stream, std::string stream_name);  // stream: a cudaStream_t
  ~CudaEventSpans();
  CudaEventSpans(const CudaEventSpans&) = delete;
  CudaEventSpans& operator=(const CudaEventSpans&) = delete;

  void anchor();  // before the first span and after each collect(), never with spans pending
  // Enqueue the start and end of one span on the stream; spans may not nest.
  void begin(std::string operation, int64_t bytes = 0, std::string group = "");
  void end();
  // One span in host time (host_now() of this rank): what StepRecorder::add_event takes.
  struct HostSpan {
    std::string operation, stream, group;
    double start = 0, end = 0;  // s
    int64_t bytes = 0;
  };
  // Waits for the stream and returns every span since the last collect(), in order; their events are reused.
  std::vector<HostSpan> collect();
  double anchor_uncertainty() const { return anchor_uncertainty_; }  // s

 private:
  struct Span;
  struct Events;
  void* stream_;
  std::string stream_name_;
  std::unique_ptr<Events> events_;
  double anchor_host_ = 0, anchor_uncertainty_ = 0;
  bool anchored_ = false;
};

}  // namespace strata
