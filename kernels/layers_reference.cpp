// float64 references of the training-step layers (see layers_reference.h).
#include "kernels/layers_reference.h"

#include <cmath>
#include <numbers>

namespace strata::layers::reference {

void layernorm_forward(double* out, double* mean, double* rstd, const double* inp, const double* weight,
                       const double* bias, std::size_t rows, std::size_t channels, double eps) {
  const auto n = static_cast<double>(channels);
  for (std::size_t r = 0; r < rows; ++r) {
    const double* x = inp + r * channels;
    double m = 0.0;
    for (std::size_t c = 0; c < channels; ++c) m += x[c];
    m /= n;
    double var = 0.0;
    for (std::size_t c = 0; c < channels; ++c) var += (x[c] - m) * (x[c] - m);
    var /= n;
    const double s = 1.0 / std::sqrt(var + eps);
    for (std::size_t c = 0; c < channels; ++c) out[r * channels + c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_backward(double* dinp, double* dweight, double* dbias, const double* dout, const double* inp,
                        const double* weight, std::size_t rows, std::size_t channels, double eps) {
  const auto n = static_cast<double>(channels);
  for (std::size_t c = 0; c < channels; ++c) dweight[c] = dbias[c] = 0.0;
  for (std::size_t r = 0; r < rows; ++r) {
    const double* x = inp + r * channels;
    const double* dy = dout + r * channels;
    double m = 0.0;
    for (std::size_t c = 0; c < channels; ++c) m += x[c];
    m /= n;
    double var = 0.0;
    for (std::size_t c = 0; c < channels; ++c) var += (x[c] - m) * (x[c] - m);
    var /= n;
    const double s = 1.0 / std::sqrt(var + eps);
    // d/dx of xhat_j = (x_j - m) s is s (delta_jk - 1/n - xhat_j xhat_k / n); contract with g = w * dy.
    double g_sum = 0.0, g_xhat_sum = 0.0;
    for (std::size_t c = 0; c < channels; ++c) {
      const double xhat = (x[c] - m) * s;
      g_sum += weight[c] * dy[c];
      g_xhat_sum += weight[c] * dy[c] * xhat;
      dweight[c] += xhat * dy[c];
      dbias[c] += dy[c];
    }
    for (std::size_t c = 0; c < channels; ++c) {
      const double xhat = (x[c] - m) * s;
      dinp[r * channels + c] = s * (weight[c] * dy[c] - g_sum / n - xhat * g_xhat_sum / n);
    }
  }
}

// 0.5 x (1 + tanh u) with u = sqrt(2/pi) (x + 0.044715 x^3). Evaluated as 1 + tanh u = 2 / (1 + e^(-2u)) and
// 1 - tanh^2 u = 1 / cosh^2 u, because 1 + tanh u and 1 - tanh^2 u cancel to zero even in double for x < -8.
double gelu(double x) {
  const double u = std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x);
  return x / (1.0 + std::exp(-2.0 * u));
}

double gelu_derivative(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  const double u = k * (x + 0.044715 * x * x * x);
  const double cosh_u = std::cosh(u);
  return 1.0 / (1.0 + std::exp(-2.0 * u)) + 0.5 * x / (cosh_u * cosh_u) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

double cross_entropy(double* losses, double* dlogits, const double* logits, const std::int32_t* targets,
                     std::size_t rows, std::size_t vocab, double normaliser) {
  double total = 0.0;
  for (std::size_t r = 0; r < rows; ++r) {
    const double* x = logits + r * vocab;
    if (targets[r] < 0) {
      losses[r] = 0.0;
      if (dlogits != nullptr)
        for (std::size_t c = 0; c < vocab; ++c) dlogits[r * vocab + c] = 0.0;
      continue;
    }
    double m = x[0];
    for (std::size_t c = 1; c < vocab; ++c) m = std::fmax(m, x[c]);
    double sum = 0.0;
    for (std::size_t c = 0; c < vocab; ++c) sum += std::exp(x[c] - m);
    const auto target = static_cast<std::size_t>(targets[r]);
    losses[r] = std::log(sum) + m - x[target];
    total += losses[r];
    if (dlogits != nullptr) {
      for (std::size_t c = 0; c < vocab; ++c)
        dlogits[r * vocab + c] = (std::exp(x[c] - m) / sum - (c == target ? 1.0 : 0.0)) / normaliser;
    }
  }
  return total / normaliser;
}

void embedding_forward(double* out, const std::int32_t* tokens, const double* wte, const double* wpe,
                       std::size_t batch, std::size_t seq, std::size_t channels) {
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t t = 0; t < seq; ++t) {
      const std::size_t row = b * seq + t;
      const auto token = static_cast<std::size_t>(tokens[row]);
      for (std::size_t c = 0; c < channels; ++c)
        out[row * channels + c] = wte[token * channels + c] + wpe[t * channels + c];
    }
}

void embedding_backward(double* dwte, double* dwpe, const double* dout, const std::int32_t* tokens,
                        std::size_t vocab, std::size_t batch, std::size_t seq, std::size_t channels) {
  for (std::size_t i = 0; i < vocab * channels; ++i) dwte[i] = 0.0;
  for (std::size_t i = 0; i < seq * channels; ++i) dwpe[i] = 0.0;
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t t = 0; t < seq; ++t) {
      const std::size_t row = b * seq + t;
      const auto token = static_cast<std::size_t>(tokens[row]);
      for (std::size_t c = 0; c < channels; ++c) {
        dwte[token * channels + c] += dout[row * channels + c];
        dwpe[t * channels + c] += dout[row * channels + c];
      }
    }
}

void adamw_update(double* params, const double* grads, double* m, double* v, std::size_t n, double learning_rate,
                  double beta1, double beta2, double eps, double weight_decay, long step, double grad_scale) {
  const double correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  for (std::size_t i = 0; i < n; ++i) {
    const double g = grads[i] * grad_scale;
    m[i] = beta1 * m[i] + (1.0 - beta1) * g;
    v[i] = beta2 * v[i] + (1.0 - beta2) * g * g;
    const double update = (m[i] / correction1) / (std::sqrt(v[i] / correction2) + eps);
    params[i] -= learning_rate * (update + weight_decay * params[i]);
  }
}

}  // namespace strata::layers::reference
