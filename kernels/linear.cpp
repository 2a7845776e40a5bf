// Implementation of the linear layer's GEMMs (see linear.h).
#include "kernels/linear.h"

#include <stdexcept>
#include <string>

#include "kernels/layers.h"

namespace strata::linear {

namespace {

void check(const Dims& d) {
  if (d.rows <= 0 || d.in_channels <= 0 || d.out_channels <= 0)
    throw std::invalid_argument("linear layer dims must be positive: rows " + std::to_string(d.rows) + ", in " +
                                std::to_string(d.in_channels) + ", out " + std::to_string(d.out_channels));
}

}  // namespace

void forward(const cpu_gemm::Math& math, const Dims& d, float* y, const float* x, const float* weight, const float* bias) {
  check(d);
  const int64_t n = d.rows, c = d.in_channels, oc = d.out_channels;
  // y starts as the bias of each row, and the GEMM adds x W^T to it (beta = 1).
  if (bias) layers::fill_bias(y, bias, static_cast<std::size_t>(n), static_cast<std::size_t>(oc));
  cpu_gemm::gemm(math, false, true, n, oc, c, 1.0f, x, c, weight, c, bias ? 1.0f : 0.0f, y, oc);
}

void backward_input(const cpu_gemm::Math& math, const Dims& d, float* dx, const float* dy, const float* weight,
                    bool accumulate) {
  check(d);
  const int64_t n = d.rows, c = d.in_channels, oc = d.out_channels;
  cpu_gemm::gemm(math, false, false, n, c, oc, 1.0f, dy, oc, weight, c, accumulate ? 1.0f : 0.0f, dx, c);
}

void backward_weight(const cpu_gemm::Math& math, const Dims& d, float* dweight, float* dbias, const float* dy,
                     const float* x, bool accumulate) {
  check(d);
  const int64_t n = d.rows, c = d.in_channels, oc = d.out_channels;
  cpu_gemm::gemm(math, true, false, oc, c, n, 1.0f, dy, oc, x, c, accumulate ? 1.0f : 0.0f, dweight, c);
  if (dbias) layers::bias_gradient(dbias, dy, static_cast<std::size_t>(n), static_cast<std::size_t>(oc), accumulate);
}

}  // namespace strata::linear
