// Implementation of the cuBLASLt GEMM plans (see gemm_cuda.h). The mapping of row-major C = A W^T onto
// cuBLASLt's column-major product is lt_layout() (gemm_layout.h), tested in the CPU build.
#include "kernels/gemm_cuda.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdexcept>

#include "kernels/cuda_handles.h"
#include "kernels/cuda_info.h"
#include "kernels/error.h"
#include "kernels/gemm_layout.h"

namespace strata::gemm {

namespace gpu {

namespace {

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

}  // namespace

struct Plan::Impl {
  Shape shape;
  DType dtype = DType::fp32;
  std::size_t workspace_bytes = 0;
  cuda::LtHandle handle;
  cuda::MatmulDesc op;
  cuda::LayoutPtr w_layout, a_layout, c_layout;
  cublasLtMatmulAlgo_t algo{};
  std::string algo_text;
  cuda::DeviceBuffer scale;  // fp8 only: the per-tensor scale of A and W, 1
};

Plan::Plan(Shape shape, DType dtype, std::size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.shape = shape;
  s.dtype = dtype;
  s.workspace_bytes = workspace_bytes;
  const cudaDataType_t in_type = input_type(dtype), out_type = output_type(dtype);
  int device = 0;
  STRATA_KERNEL_CUDA_CHECK(cudaGetDevice(&device));
  if (dtype == DType::fp8_e4m3 && cuda::compute_capability(device) < 89)
    throw std::invalid_argument("dtype fp8 needs a GPU of compute capability 8.9 or newer; " + cuda::device_name(device) +
                                " has " + std::to_string(cuda::compute_capability(device)));

  cublasLtHandle_t handle = nullptr;
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtCreate(&handle));
  s.handle.reset(handle);
  const cublasComputeType_t compute = dtype == DType::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t op = nullptr;
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F));
  s.op.reset(op);
  const LtLayout lt = lt_layout(shape);
  cublasOperation_t op_a = lt.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = lt.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  if (dtype == DType::fp8_e4m3) {
    // FP8 takes per-tensor scales as device pointers; ours are 1 (inputs already in range). A synchronous copy
    // of pageable memory may return before its DMA lands, and run() may use a stream that does not order
    // itself after the legacy one: wait for the device.
    s.scale = cuda::device_alloc(sizeof(float));
    const float one = 1.0f;
    STRATA_KERNEL_CUDA_CHECK(cudaMemcpy(s.scale.get(), &one, sizeof one, cudaMemcpyHostToDevice));
    STRATA_KERNEL_CUDA_CHECK(cudaDeviceSynchronize());
    void* scale = s.scale.get();
    STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale, sizeof scale));
    STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale, sizeof scale));
  }
  auto create = [](cudaDataType_t type, const ColumnMajor& c) {
    cublasLtMatrixLayout_t layout = nullptr;
    STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(c.rows),
                                                          static_cast<uint64_t>(c.cols), c.ld));
    return cuda::LayoutPtr(layout);
  };
  s.w_layout = create(in_type, lt.a);
  s.a_layout = create(in_type, lt.b);
  s.c_layout = create(out_type, lt.d);

  cublasLtMatmulPreference_t preference = nullptr;
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  cuda::PreferencePtr preference_owner(preference);
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                  &workspace_bytes, sizeof workspace_bytes));
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
}

Plan::~Plan() = default;

void Plan::run(const void* a, const void* w, void* c, void* workspace, std::size_t workspace_bytes,
               Stream stream) const {
  const Impl& s = *impl_;
  if (workspace_bytes < s.workspace_bytes)
    throw std::invalid_argument("GEMM workspace of " + std::to_string(workspace_bytes) + " bytes; the plan needs " +
                                std::to_string(s.workspace_bytes));
  const float alpha = 1.0f, beta = 0.0f;
  // cuBLASLt's first operand is W: row-major C = A W^T is column-major C^T = W A^T (gemm_layout.h).
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmul(s.handle.get(), s.op.get(), &alpha, w, s.w_layout.get(), a,
                                            s.a_layout.get(), &beta, c, s.c_layout.get(), c, s.c_layout.get(), &s.algo,
                                            workspace, s.workspace_bytes, stream));
}

const Shape& Plan::shape() const { return impl_->shape; }
DType Plan::dtype() const { return impl_->dtype; }
std::size_t Plan::workspace_bytes() const { return impl_->workspace_bytes; }
std::string Plan::algorithm() const { return impl_->algo_text; }

}  // namespace gpu

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
