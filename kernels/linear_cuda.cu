// Implementation of the linear layer on cuBLASLt (see linear_cuda.h).
#include "kernels/linear_cuda.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "kernels/cuda_handles.h"
#include "kernels/error.h"

namespace strata::linear::gpu {

namespace {

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) throw_kernel_error("cuBLAS", call, file, line, cublasLtGetStatusString(status));
}
#define LINEAR_CUBLAS_CHECK(call) check_cublas((call), #call, __FILE__, __LINE__)

enum class Gemm { forward, backward_input, backward_weight };

// cuBLASLt is column-major: a row-major (R, C) matrix is a column-major (C, R) one. Each row-major product
// below is written as the column-major product of the transposes:
//   forward          y^T  (OC, N) = W (OC, C) [Wc^T]   x^T (C, N)      m = OC, n = N,  k = C
//   input gradient   dx^T (C, N)  = Wc (C, OC)         dy^T (OC, N)    m = C,  n = N,  k = OC
//   weight gradient  dW^T (C, OC) = x^T (C, N)         dy (N, OC)      m = C,  n = OC, k = N
struct Problem {
  Gemm gemm;
  int64_t m, n, k;
  bool transa, transb;
  int64_t lda, ldb, ldc;
};

Problem problem(Gemm gemm, const Dims& d) {
  const int64_t n = d.rows, c = d.in_channels, oc = d.out_channels;
  switch (gemm) {
    case Gemm::forward: return {gemm, oc, n, c, true, false, c, c, oc};
    case Gemm::backward_input: return {gemm, c, n, oc, false, false, c, oc, c};
    case Gemm::backward_weight: return {gemm, c, oc, n, false, true, c, oc, c};
  }
  throw std::invalid_argument("unknown linear GEMM");
}

struct Plan {
  cuda::MatmulDesc desc;
  cuda::LayoutPtr a, b, c;
  cublasLtMatmulAlgo_t algo{};
};

using Key = std::tuple<int, int64_t, int64_t, int64_t, int, bool, bool>;  // gemm, m, n, k, dtype, accumulate, bias

// Column sums of dy (N, OC) into db (OC), in fp32, one thread per output channel reading rows in order.
template <class T>
__global__ void bias_gradient(float* db, const T* dy, int64_t rows, int64_t channels, bool accumulate) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= channels) return;
  float sum = accumulate ? db[o] : 0.0f;
  for (int64_t i = 0; i < rows; ++i) sum += static_cast<float>(dy[i * channels + o]);
  db[o] = sum;
}

}  // namespace

struct PlanCache::Impl {
  cuda::LtHandle handle;
  cuda::DeviceBuffer workspace;
  std::size_t workspace_bytes = 0;
  std::map<Key, Plan> plans;

  const Plan& plan(Gemm gemm, const Dims& d, DType dtype, bool accumulate, bool bias) {
    const Key key{static_cast<int>(gemm), d.rows, d.in_channels, d.out_channels, static_cast<int>(dtype), accumulate, bias};
    if (auto found = plans.find(key); found != plans.end()) return found->second;
    const Problem p = problem(gemm, d);
    const cudaDataType_t in = dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    // Weight gradients are kept in fp32 whatever the activations are.
    const cudaDataType_t out = gemm == Gemm::backward_weight ? CUDA_R_32F : in;
    Plan plan;
    cublasLtMatmulDesc_t desc = nullptr;
    LINEAR_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    plan.desc.reset(desc);
    const cublasOperation_t ta = p.transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LINEAR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LINEAR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bias_type = in;
      LINEAR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
      LINEAR_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
    }
    auto layout = [](cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
      cublasLtMatrixLayout_t l = nullptr;
      LINEAR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
      return cuda::LayoutPtr(l);
    };
    plan.a = p.transa ? layout(in, p.k, p.m, p.lda) : layout(in, p.m, p.k, p.lda);
    plan.b = p.transb ? layout(in, p.n, p.k, p.ldb) : layout(in, p.k, p.n, p.ldb);
    plan.c = layout(out, p.m, p.n, p.ldc);
    cublasLtMatmulPreference_t preference = nullptr;
    LINEAR_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    cuda::PreferencePtr preference_owner(preference);
    LINEAR_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace_bytes, sizeof workspace_bytes));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    LINEAR_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle.get(), desc, plan.a.get(), plan.b.get(), plan.c.get(),
                                                       plan.c.get(), preference, 1, &result, &found));
    if (found == 0)
      throw KernelError("cuBLASLt has no algorithm for the linear layer's GEMM " + std::to_string(p.m) + "x" +
                        std::to_string(p.n) + "x" + std::to_string(p.k));
    plan.algo = result.algo;
    return plans.emplace(key, std::move(plan)).first->second;
  }

  void run(Gemm gemm, const Dims& d, DType dtype, void* c, const void* a, const void* b, const void* bias,
           bool accumulate, Stream stream) {
    const Plan& p = plan(gemm, d, dtype, accumulate, bias != nullptr);
    if (bias)
      LINEAR_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    LINEAR_CUBLAS_CHECK(cublasLtMatmul(handle.get(), p.desc.get(), &alpha, a, p.a.get(), b, p.b.get(), &beta, c,
                                       p.c.get(), c, p.c.get(), &p.algo, workspace.get(), workspace_bytes, stream));
  }
};

PlanCache::PlanCache(std::size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  cublasLtHandle_t handle = nullptr;
  LINEAR_CUBLAS_CHECK(cublasLtCreate(&handle));
  impl_->handle.reset(handle);
  impl_->workspace = cuda::device_alloc(workspace_bytes);
  impl_->workspace_bytes = workspace_bytes;
}

PlanCache::~PlanCache() = default;

std::size_t PlanCache::plans() const { return impl_->plans.size(); }

void PlanCache::forward(const Dims& d, DType dtype, void* y, const void* x, const void* weight, const void* bias,
                        Stream stream) {
  impl_->run(Gemm::forward, d, dtype, y, weight, x, bias, false, stream);
}

void PlanCache::backward_input(const Dims& d, DType dtype, void* dx, const void* dy, const void* weight,
                               bool accumulate, Stream stream) {
  impl_->run(Gemm::backward_input, d, dtype, dx, weight, dy, nullptr, accumulate, stream);
}

void PlanCache::backward_weight(const Dims& d, DType dtype, float* dweight, float* dbias, const void* dy,
                                const void* x, bool accumulate, Stream stream) {
  impl_->run(Gemm::backward_weight, d, dtype, dweight, x, dy, nullptr, accumulate, stream);
  if (!dbias) return;
  const int threads = 256;
  const auto blocks = static_cast<unsigned>((d.out_channels + threads - 1) / threads);
  if (dtype == DType::bf16)
    bias_gradient<<<blocks, threads, 0, stream>>>(dbias, static_cast<const __nv_bfloat16*>(dy), d.rows, d.out_channels,
                                                  accumulate);
  else
    bias_gradient<<<blocks, threads, 0, stream>>>(dbias, static_cast<const float*>(dy), d.rows, d.out_channels, accumulate);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::linear::gpu
