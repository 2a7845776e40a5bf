// Implementation of the cuBLASLt GEMM backend (see gemm_cuda.h). The mapping of row-major C = A W^T onto
// cuBLASLt's column-major product is lt_layout() (gemm_layout.h), tested in the CPU build.
#include "kernels/gemm_cuda.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/error.h"
#include "kernels/cuda_handles.h"
#include "kernels/cuda_info.h"
#include "kernels/gemm_layout.h"

namespace strata::gemm {

namespace {

using cuda::DeviceBuffer;
using cuda::LayoutDeleter;
using cuda::LayoutPtr;
using cuda::LtHandleDeleter;
using cuda::MatmulDescDeleter;
using cuda::PreferenceDeleter;
using cuda::device_alloc;

constexpr size_t kWorkspaceBytes = size_t{32} << 20;



cudaDataType_t input_type(DType d) {
  switch (d) {
    case DType::fp32: case DType::tf32: return CUDA_R_32F;
    case DType::fp16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::fp8_e4m3: return CUDA_R_8F_E4M3;
    default: throw std::invalid_argument("dtype " + name(d) + " is not available on the cuda backend");
  }
}

cudaDataType_t output_type(DType d) { return d == DType::fp8_e4m3 ? CUDA_R_16BF : input_type(d); }

// Converts float values to the dtype's storage, in place of `bytes`, and rounds `values` to what was stored,
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
  Shape shape;
  DType dtype;
  int device = 0;
  cudaStream_t stream = nullptr;
  std::unique_ptr<cublasLtContext, LtHandleDeleter> handle;
  std::unique_ptr<cublasLtMatmulDescOpaque_t, MatmulDescDeleter> op;
  std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter> w_layout, a_layout, c_layout;
  cublasLtMatmulAlgo_t algo{};
  std::string algo_text;
  DeviceBuffer a, w, c, workspace, scale;
  std::vector<float> host_a, host_w;  // inputs as stored on the device, widened to float
  float alpha = 1.0f, beta = 0.0f;

  ~Impl() {
    if (stream) cudaStreamDestroy(stream);
  }
};

CudaGemm::CudaGemm(Shape shape, DType dtype, uint64_t seed, int device) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.shape = shape;
  s.dtype = dtype;
  s.device = device;
  cudaDataType_t in_type = input_type(dtype), out_type = output_type(dtype);
  if (dtype == DType::fp8_e4m3 && cuda::compute_capability(device) < 89)
    throw std::invalid_argument("dtype fp8 needs a GPU of compute capability 8.9 or newer; " + cuda::device_name(device) +
                     " has " + std::to_string(cuda::compute_capability(device)));
  cuda::set_device(device);
  STRATA_KERNEL_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));

  const size_t m = static_cast<size_t>(shape.m), n = static_cast<size_t>(shape.n), k = static_cast<size_t>(shape.k);
  s.host_a.resize(m * k);
  s.host_w.resize(n * k);
  fill_uniform(s.host_a.data(), s.host_a.size(), seed);
  fill_uniform(s.host_w.data(), s.host_w.size(), seed + 1);
  std::vector<unsigned char> a_bytes = to_storage(dtype, s.host_a), w_bytes = to_storage(dtype, s.host_w);
  s.a = device_alloc(a_bytes.size());
  s.w = device_alloc(w_bytes.size());
  s.c = device_alloc(m * n * static_cast<size_t>(output_bytes(dtype)));
  s.workspace = device_alloc(kWorkspaceBytes);
  // On the work stream, waited for: cuBLASLt runs on a non-blocking stream that does not order itself after
  // the legacy stream, and the host bytes are freed when the constructor returns.
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(s.a.get(), a_bytes.data(), a_bytes.size(), cudaMemcpyHostToDevice, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(s.w.get(), w_bytes.data(), w_bytes.size(), cudaMemcpyHostToDevice, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));

  cublasLtHandle_t handle = nullptr;
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtCreate(&handle));
  s.handle.reset(handle);
  cublasComputeType_t compute = dtype == DType::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t op = nullptr;
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F));
  s.op.reset(op);
  const LtLayout lt = lt_layout(shape);
  cublasOperation_t op_a = lt.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = lt.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  if (dtype == DType::fp8_e4m3) {
    // FP8 takes per-tensor scales as device pointers; ours are 1 (inputs already in range).
    s.scale = device_alloc(sizeof(float));
    float one = 1.0f;
    STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(s.scale.get(), &one, sizeof one, cudaMemcpyHostToDevice, s.stream));
    STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
    void* scale = s.scale.get();
    STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale, sizeof scale));
    STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale, sizeof scale));
  }
  cublasLtMatrixLayout_t layout = nullptr;
  auto create = [&layout](cudaDataType_t type, const ColumnMajor& c) {
    STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(c.rows),
                                                          static_cast<uint64_t>(c.cols), c.ld));
    return LayoutPtr(layout);
  };
  s.w_layout = create(in_type, lt.a);
  s.a_layout = create(in_type, lt.b);
  s.c_layout = create(out_type, lt.d);

  cublasLtMatmulPreference_t preference = nullptr;
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter> preference_owner(preference);
  size_t workspace = kWorkspaceBytes;
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace, sizeof workspace));
  cublasLtMatmulHeuristicResult_t results[8] = {};
  int returned = 0;
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, op, s.w_layout.get(), s.a_layout.get(),
                                                     s.c_layout.get(), s.c_layout.get(), preference, 8, results,
                                                     &returned));
  if (returned == 0)
    throw std::invalid_argument("cuBLASLt has no algorithm for " + name(dtype) + " " + shape.text() + " on this GPU");
  s.algo = results[0].algo;
  int algo_id = 0, tile = 0, stages = 0;
  size_t written = 0;
  STRATA_KERNEL_CUBLAS_CHECK(
      cublasLtMatmulAlgoConfigGetAttribute(&s.algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id, sizeof algo_id, &written));
  STRATA_KERNEL_CUBLAS_CHECK(
      cublasLtMatmulAlgoConfigGetAttribute(&s.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &written));
  STRATA_KERNEL_CUBLAS_CHECK(
      cublasLtMatmulAlgoConfigGetAttribute(&s.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &written));
  s.algo_text = "cuBLASLt heuristic 1 of " + std::to_string(returned) + ": algo " + std::to_string(algo_id) +
                ", tile " + std::to_string(tile) + ", stages " + std::to_string(stages);
  poison_output();
}

CudaGemm::~CudaGemm() = default;

void CudaGemm::run() {
  Impl& s = *impl_;
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmul(s.handle.get(), s.op.get(), &s.alpha, s.w.get(), s.w_layout.get(), s.a.get(),
                                     s.a_layout.get(), &s.beta, s.c.get(), s.c_layout.get(), s.c.get(),
                                     s.c_layout.get(), &s.algo, s.workspace.get(), kWorkspaceBytes, s.stream));
}

void CudaGemm::poison_output() {
  Impl& s = *impl_;
  // 0xFF bytes are NaN in fp32, fp16 and bf16.
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(s.c.get(), 0xFF,
                                    static_cast<size_t>(s.shape.m * s.shape.n) * output_bytes(s.dtype), s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

void CudaGemm::corrupt_output() {
  Impl& s = *impl_;
  // 0x7F bytes: about 3.4e38 in fp32 and bf16, NaN in fp16; wrong for every output dtype.
  const size_t elem = static_cast<size_t>(output_bytes(s.dtype));
  auto* last = static_cast<unsigned char*>(static_cast<void*>(s.c.get())) + static_cast<size_t>(s.shape.m * s.shape.n - 1) * elem;
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(last, 0x7F, elem, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

CheckResult CudaGemm::check(int samples, uint64_t seed) const {
  const Impl& s = *impl_;
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  std::vector<unsigned char> c(static_cast<size_t>(s.shape.m * s.shape.n) * output_bytes(s.dtype));
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpy(c.data(), s.c.get(), c.size(), cudaMemcpyDeviceToHost));
  const int64_t k = s.shape.k, n = s.shape.n;
  GemmView view{s.shape,
                [&](int64_t i, int64_t kk) { return static_cast<double>(s.host_a[static_cast<size_t>(i * k + kk)]); },
                [&](int64_t j, int64_t kk) { return static_cast<double>(s.host_w[static_cast<size_t>(j * k + kk)]); },
                [&](int64_t i, int64_t j) { return output_value(s.dtype, c, static_cast<size_t>(i * n + j)); }};
  return check_sampled(view, s.dtype, samples, seed);
}

void* CudaGemm::stream() const { return impl_->stream; }
std::string CudaGemm::algorithm() const { return impl_->algo_text; }

GpuPeak gpu_peak(int device, DType dtype) {
  // Dense FLOP per clock per SM of the tensor cores (fp32: the CUDA cores), from NVIDIA's architecture
  // whitepapers for A100 (sm_80) and H100 (sm_90).
  int cc = cuda::compute_capability(device);
  double per_sm = 0;
  if (cc == 80) {
    per_sm = dtype == DType::fp32 ? 128 : dtype == DType::tf32 ? 1024 : (dtype == DType::fp16 || dtype == DType::bf16) ? 2048 : 0;
  } else if (cc == 90) {
    per_sm = dtype == DType::fp32 ? 256 : dtype == DType::tf32 ? 2048
           : (dtype == DType::fp16 || dtype == DType::bf16) ? 4096 : dtype == DType::fp8_e4m3 ? 8192 : 0;
  }
  GpuPeak peak;
  if (per_sm == 0) {
    peak.source = "unknown: no FLOP/clock table for compute capability " + std::to_string(cc) + " and " + name(dtype);
    return peak;
  }
  int sms = 0, clock_khz = 0;
  STRATA_KERNEL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  STRATA_KERNEL_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  peak.flops = sms * (clock_khz * 1e3) * per_sm;
  peak.source = std::to_string(sms) + " SMs x " + std::to_string(clock_khz / 1000) + " MHz (max SM clock) x " +
                std::to_string(static_cast<int>(per_sm)) + " " + name(dtype) + " FLOP/clock/SM (sm_" +
                std::to_string(cc) + " dense)";
  return peak;
}

}  // namespace strata::gemm
