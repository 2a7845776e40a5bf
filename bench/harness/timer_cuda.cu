// Implementation of the CUDA event timer and of CudaEventSpans (see timer_cuda.h).
#include "bench/harness/timer_cuda.h"

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "bench/harness/check.h"

namespace strata {

namespace {
class CudaEventTimer final : public Timer {
 public:
  explicit CudaEventTimer(cudaStream_t stream) : stream_(stream) {
    STRATA_CUDA_CHECK(cudaEventCreate(&begin_));
    STRATA_CUDA_CHECK(cudaEventCreate(&end_));
  }
  ~CudaEventTimer() override {
    cudaEventDestroy(begin_);
    cudaEventDestroy(end_);
  }
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;

  void start() override { STRATA_CUDA_CHECK(cudaEventRecord(begin_, stream_)); }
  double stop() override {
    STRATA_CUDA_CHECK(cudaEventRecord(end_, stream_));
    STRATA_CUDA_CHECK(cudaEventSynchronize(end_));
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, begin_, end_));
    return static_cast<double>(ms) * 1e-3;
  }
  const char* description() const override { return "CUDA events on the work's stream"; }

 private:
  cudaStream_t stream_;
  cudaEvent_t begin_ = nullptr, end_ = nullptr;
};
}  // namespace

std::unique_ptr<Timer> make_cuda_event_timer(void* stream) {
  return std::make_unique<CudaEventTimer>(static_cast<cudaStream_t>(stream));
}

// ---- CudaEventSpans ---------------------------------------------------------------------------------

struct CudaEventSpans::Span {
  std::string operation, group;
  int64_t bytes = 0;
  cudaEvent_t start = nullptr, end = nullptr;
};

// Events are created once and reused: creating them inside a timed iteration would cost more than the
// work of a small kernel. `owned` holds every event ever created and alone destroys them.
struct CudaEventSpans::Events {
  cudaEvent_t anchor = nullptr;
  std::vector<cudaEvent_t> owned;
  std::vector<Span> spans;  // recorded since the last collect(), in order
  std::vector<cudaEvent_t> free;
  bool open = false;

  Events() = default;
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  ~Events() {
    for (cudaEvent_t event : owned) cudaEventDestroy(event);
  }
  cudaEvent_t create() {
    owned.reserve(owned.size() + 1);  // so the push below cannot throw and lose the event
    cudaEvent_t event = nullptr;
    STRATA_CUDA_CHECK(cudaEventCreate(&event));
    owned.push_back(event);
    return event;
  }
  cudaEvent_t take() {
    if (free.empty()) return create();
    cudaEvent_t event = free.back();
    free.pop_back();
    return event;
  }
};

CudaEventSpans::CudaEventSpans(void* stream, std::string stream_name)
    : stream_(stream), stream_name_(std::move(stream_name)), events_(std::make_unique<Events>()) {
  events_->anchor = events_->create();
}

CudaEventSpans::~CudaEventSpans() = default;

void CudaEventSpans::anchor() {
  // Spans are converted against the anchor current at collect(): a new one must not come in between.
  if (!events_->spans.empty()) throw RuntimeError("CudaEventSpans::anchor with spans not yet collected");
  auto stream = static_cast<cudaStream_t>(stream_);
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  // The stream is idle, so the anchor completes as soon as it is recorded: its host time lies between the
  // two host readings.
  double before = host_now();
  STRATA_CUDA_CHECK(cudaEventRecord(events_->anchor, stream));
  STRATA_CUDA_CHECK(cudaEventSynchronize(events_->anchor));
  double after = host_now();
  anchor_host_ = (before + after) / 2;
  anchor_uncertainty_ = (after - before) / 2;
  anchored_ = true;
}

void CudaEventSpans::begin(std::string operation, int64_t bytes, std::string group) {
  if (!anchored_) throw RuntimeError("CudaEventSpans::begin before anchor()");
  if (events_->open) throw RuntimeError("CudaEventSpans: spans may not nest (" + operation + ")");
  Span span{std::move(operation), std::move(group), bytes, events_->take(), events_->take()};
  STRATA_CUDA_CHECK(cudaEventRecord(span.start, static_cast<cudaStream_t>(stream_)));
  events_->spans.push_back(std::move(span));
  events_->open = true;
}

void CudaEventSpans::end() {
  if (!events_->open) throw RuntimeError("CudaEventSpans::end without begin");
  STRATA_CUDA_CHECK(cudaEventRecord(events_->spans.back().end, static_cast<cudaStream_t>(stream_)));
  events_->open = false;
}

std::vector<CudaEventSpans::HostSpan> CudaEventSpans::collect() {
  if (events_->open) throw RuntimeError("CudaEventSpans::collect with a span still open");
  STRATA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  std::vector<HostSpan> out;
  out.reserve(events_->spans.size());
  for (Span& span : events_->spans) {
    float start_ms = 0, end_ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&start_ms, events_->anchor, span.start));
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&end_ms, events_->anchor, span.end));
    out.push_back({span.operation, stream_name_, span.group, anchor_host_ + start_ms * 1e-3,
                   anchor_host_ + end_ms * 1e-3, span.bytes});
    events_->free.push_back(span.start);
    events_->free.push_back(span.end);
  }
  events_->spans.clear();
  return out;
}

}  // namespace strata
