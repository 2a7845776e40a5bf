// The GPU attention benchmark's problem (see attention_cases.h): seeded device tensors, a workspace and a stream
// around a Plan of kernels/attention_cuda.h.
#include <cuda_runtime.h>

#include <stdexcept>
#include <vector>

#include "bench/cases/attention_cases.h"
#include "kernels/cuda_handles.h"
#include "kernels/error.h"
#include "kernels/gemm_check.h"

namespace strata::attention::gpu {

struct Attention::State {
  std::unique_ptr<Plan> plan;
  cudaStream_t stream = nullptr;
  size_t q_count = 0, kv_count = 0, lse_count = 0;
  std::vector<float> host_q, host_k, host_v, host_do;  // inputs as stored, widened
  cuda::DeviceBuffer q, k, v, d_o, o, lse, dq, dk, dv, workspace;

  ~State() {
    if (stream) {
      cudaStreamSynchronize(stream);  // no throwing from a destructor; a failure here resurfaces elsewhere
      cudaStreamDestroy(stream);
    }
  }
  Workspace work() const { return {workspace.get(), plan->workspace_bytes()}; }
};

Attention::Attention(const Shape& shape, DType dtype, Impl impl, uint64_t seed) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.plan = std::make_unique<Plan>(shape, dtype, impl);
  STRATA_KERNEL_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  s.q_count = q_elements(shape);
  s.kv_count = kv_elements(shape);
  s.lse_count = lse_elements(shape);

  s.host_q.resize(s.q_count);
  s.host_k.resize(s.kv_count);
  s.host_v.resize(s.kv_count);
  s.host_do.resize(s.q_count);
  gemm::fill_uniform(s.host_q.data(), s.host_q.size(), seed);
  gemm::fill_uniform(s.host_k.data(), s.host_k.size(), seed + 1);
  gemm::fill_uniform(s.host_v.data(), s.host_v.size(), seed + 2);
  gemm::fill_uniform(s.host_do.data(), s.host_do.size(), seed + 3);
  auto upload = [&](std::vector<float>& values) {
    const std::vector<uint16_t> bits = to_storage(dtype, values);
    cuda::DeviceBuffer buffer = cuda::device_alloc(bits.size() * sizeof(uint16_t));
    // On the work stream, waited for: the kernels run on a non-blocking stream that does not order itself
    // after the legacy stream, and `bits` is freed when this returns.
    STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(buffer.get(), bits.data(), bits.size() * sizeof(uint16_t),
                                             cudaMemcpyHostToDevice, s.stream));
    STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
    return buffer;
  };
  s.q = upload(s.host_q);
  s.k = upload(s.host_k);
  s.v = upload(s.host_v);
  s.d_o = upload(s.host_do);
  s.o = cuda::device_alloc(s.q_count * 2);
  s.dq = cuda::device_alloc(s.q_count * 2);
  s.dk = cuda::device_alloc(s.kv_count * 2);
  s.dv = cuda::device_alloc(s.kv_count * 2);
  s.lse = cuda::device_alloc(s.lse_count * sizeof(float));
  s.workspace = cuda::device_alloc(s.plan->workspace_bytes());
  poison_outputs();
}

Attention::~Attention() = default;

void Attention::forward() {
  State& s = *state_;
  s.plan->forward({s.q.get(), s.k.get(), s.v.get(), s.o.get(), static_cast<float*>(s.lse.get())}, s.work(), s.stream);
}

void Attention::backward() {
  State& s = *state_;
  s.plan->backward({s.q.get(), s.k.get(), s.v.get(), s.o.get(), s.d_o.get(), static_cast<const float*>(s.lse.get()),
                    s.dq.get(), s.dk.get(), s.dv.get()},
                   s.work(), s.stream);
}

void* Attention::stream() const { return state_->stream; }

const std::vector<float>& Attention::q() const { return state_->host_q; }
const std::vector<float>& Attention::k() const { return state_->host_k; }
const std::vector<float>& Attention::v() const { return state_->host_v; }
const std::vector<float>& Attention::d_o() const { return state_->host_do; }
const Shape& Attention::shape() const { return state_->plan->shape(); }
DType Attention::dtype() const { return state_->plan->dtype(); }
Impl Attention::impl() const { return state_->plan->impl(); }
std::string Attention::description() const { return state_->plan->description(); }

void Attention::read_forward(std::vector<float>& o, std::vector<float>& lse) const {
  const State& s = *state_;
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  std::vector<uint16_t> bits(s.q_count);
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpy(bits.data(), s.o.get(), bits.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  o = widen(dtype(), bits);
  lse.resize(s.lse_count);
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpy(lse.data(), s.lse.get(), lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
}

void Attention::read_backward(std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv) const {
  const State& s = *state_;
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  auto read = [&](const cuda::DeviceBuffer& buffer, size_t count) {
    std::vector<uint16_t> bits(count);
    STRATA_KERNEL_CUDA_CHECK(cudaMemcpy(bits.data(), buffer.get(), count * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    return widen(dtype(), bits);
  };
  dq = read(s.dq, s.q_count);
  dk = read(s.dk, s.kv_count);
  dv = read(s.dv, s.kv_count);
}

void Attention::poison_outputs() {
  State& s = *state_;
  // 0xFF bytes are NaN in fp32, fp16 and bf16.
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(s.o.get(), 0xFF, s.q_count * 2, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(s.lse.get(), 0xFF, s.lse_count * sizeof(float), s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(s.dq.get(), 0xFF, s.q_count * 2, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(s.dk.get(), 0xFF, s.kv_count * 2, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(s.dv.get(), 0xFF, s.kv_count * 2, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

void Attention::corrupt_output(size_t element) {
  State& s = *state_;
  if (element >= s.q_count) throw std::out_of_range("corrupt_output: element beyond O");
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(static_cast<unsigned char*>(s.o.get()) + element * 2, 0x7F, 2, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

CheckReport check(const Attention& attention, bool backward, int batch, int kv_head) {
  std::vector<float> o, lse, dq, dk, dv;
  attention.read_forward(o, lse);
  if (backward) attention.read_backward(dq, dk, dv);
  HostTensors t{attention.q().data(), attention.k().data(), attention.v().data(), attention.d_o().data(), o.data(),
                lse.data()};
  if (backward) t.dq = dq.data(), t.dk = dk.data(), t.dv = dv.data();
  return gpu::check(attention.shape(), attention.dtype(), t, backward, batch, kv_head);
}

}  // namespace strata::attention::gpu
