// The CUDA GEMM benchmark problem (see gemm_cases.h): seeded buffers on the device around a cuBLASLt plan of
// kernels/gemm_cuda.h, on a stream of its own.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "bench/cases/gemm_cases.h"
#include "kernels/cuda_handles.h"
#include "kernels/cuda_info.h"
#include "kernels/error.h"
#include "kernels/gemm_cuda.h"

namespace strata::gemm {

namespace {

// Converts float values to the dtype's storage, returned as bytes, and rounds `values` to what was stored,
// so the reference check uses exactly the GEMM's inputs.
std::vector<unsigned char> to_storage(DType d, std::vector<float>& values) {
  std::vector<unsigned char> bytes(values.size() * static_cast<size_t>(input_bytes(d)));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (d) {
      case DType::fp16: {
        __half h = __float2half_rn(values[i]);
        std::memcpy(&bytes[i * 2], &h, 2);
        values[i] = __half2float(h);
        break;
      }
      case DType::bf16: {
        __nv_bfloat16 b = __float2bfloat16_rn(values[i]);
        std::memcpy(&bytes[i * 2], &b, 2);
        values[i] = __bfloat162float(b);
        break;
      }
      case DType::fp8_e4m3: {
        __nv_fp8_e4m3 f(values[i]);
        std::memcpy(&bytes[i], &f, 1);
        values[i] = static_cast<float>(f);
        break;
      }
      default: std::memcpy(&bytes[i * 4], &values[i], 4);
    }
  }
  return bytes;
}

double output_value(DType d, const std::vector<unsigned char>& c, size_t index) {
  if (d == DType::fp16) {
    __half h;
    std::memcpy(&h, &c[index * 2], 2);
    return __half2float(h);
  }
  if (d == DType::bf16 || d == DType::fp8_e4m3) {
    __nv_bfloat16 b;
    std::memcpy(&b, &c[index * 2], 2);
    return __bfloat162float(b);
  }
  float f;
  std::memcpy(&f, &c[index * 4], 4);
  return f;
}

}  // namespace

struct CudaGemm::Impl {
  std::unique_ptr<gpu::Plan> plan;
  cudaStream_t stream = nullptr;
  cuda::DeviceBuffer a, w, c, workspace;
  std::vector<float> host_a, host_w;  // inputs as stored on the device, widened to float

  ~Impl() {
    if (stream) {
      cudaStreamSynchronize(stream);  // no throwing from a destructor; the buffers outlive the work
      cudaStreamDestroy(stream);
    }
  }
  size_t c_bytes() const {
    return static_cast<size_t>(plan->shape().m * plan->shape().n) * static_cast<size_t>(output_bytes(plan->dtype()));
  }
};

CudaGemm::CudaGemm(Shape shape, DType dtype, uint64_t seed, int device) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  cuda::set_device(device);
  s.plan = std::make_unique<gpu::Plan>(shape, dtype);
  STRATA_KERNEL_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));

  const size_t m = static_cast<size_t>(shape.m), n = static_cast<size_t>(shape.n), k = static_cast<size_t>(shape.k);
  s.host_a.resize(m * k);
  s.host_w.resize(n * k);
  fill_uniform(s.host_a.data(), s.host_a.size(), seed);
  fill_uniform(s.host_w.data(), s.host_w.size(), seed + 1);
  std::vector<unsigned char> a_bytes = to_storage(dtype, s.host_a), w_bytes = to_storage(dtype, s.host_w);
  s.a = cuda::device_alloc(a_bytes.size());
  s.w = cuda::device_alloc(w_bytes.size());
  s.c = cuda::device_alloc(s.c_bytes());
  s.workspace = cuda::device_alloc(s.plan->workspace_bytes());
  // On the work stream, waited for: the GEMM runs on a non-blocking stream that does not order itself after
  // the legacy stream, and the host bytes are freed when the constructor returns.
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(s.a.get(), a_bytes.data(), a_bytes.size(), cudaMemcpyHostToDevice, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(s.w.get(), w_bytes.data(), w_bytes.size(), cudaMemcpyHostToDevice, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  poison_output();
}

CudaGemm::~CudaGemm() = default;

void CudaGemm::run() {
  Impl& s = *impl_;
  s.plan->run(s.a.get(), s.w.get(), s.c.get(), s.workspace.get(), s.plan->workspace_bytes(), s.stream);
}

void CudaGemm::poison_output() {
  Impl& s = *impl_;
  // 0xFF bytes are NaN in fp32, fp16 and bf16.
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(s.c.get(), 0xFF, s.c_bytes(), s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

void CudaGemm::corrupt_output() {
  Impl& s = *impl_;
  // 0x7F bytes: about 3.4e38 in fp32 and bf16, NaN in fp16; wrong for every output dtype.
  const size_t elem = static_cast<size_t>(output_bytes(s.plan->dtype()));
  auto* last = static_cast<unsigned char*>(s.c.get()) + s.c_bytes() - elem;
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(last, 0x7F, elem, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

CheckResult CudaGemm::check(int samples, uint64_t seed) const {
  const Impl& s = *impl_;
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  std::vector<unsigned char> c(s.c_bytes());
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpy(c.data(), s.c.get(), c.size(), cudaMemcpyDeviceToHost));
  const Shape& shape = s.plan->shape();
  const DType dtype = s.plan->dtype();
  const int64_t k = shape.k, n = shape.n;
  GemmView view{shape,
                [&](int64_t i, int64_t kk) { return static_cast<double>(s.host_a[static_cast<size_t>(i * k + kk)]); },
                [&](int64_t j, int64_t kk) { return static_cast<double>(s.host_w[static_cast<size_t>(j * k + kk)]); },
                [&](int64_t i, int64_t j) { return output_value(dtype, c, static_cast<size_t>(i * n + j)); }};
  return check_sampled(view, dtype, samples, seed);
}

void* CudaGemm::stream() const { return impl_->stream; }
std::string CudaGemm::algorithm() const { return impl_->plan->algorithm(); }

}  // namespace strata::gemm
