// float64 references of the layers.h kernels: plain loops, single-threaded, written from the formulas and
// sharing no code with the fp32 kernels, so a bug in one does not hide in the other. Unlike the kernels,
// every reference overwrites its outputs (gradients included). For checks only (CPU and GPU tests).
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::layers::reference {

// inp, out (N, C); weight, bias (C); mean, rstd (N).
void layernorm_forward(double* out, double* mean, double* rstd, const double* inp, const double* weight,
                       const double* bias, std::size_t rows, std::size_t channels, double eps);
// dinp (N, C), dweight, dbias (C) = gradients of sum(out * dout); the statistics are recomputed.
void layernorm_backward(double* dinp, double* dweight, double* dbias, const double* dout, const double* inp,
                        const double* weight, std::size_t rows, std::size_t channels, double eps);

double gelu(double x);
double gelu_derivative(double x);

// losses (N); dlogits (N, V) = d(sum(losses) / normaliser) / dlogits (may be null). Rows with a negative
// target do not count. Returns sum(losses) / normaliser.
double cross_entropy(double* losses, double* dlogits, const double* logits, const std::int32_t* targets,
                     std::size_t rows, std::size_t vocab, double normaliser);

// out (B, T, C) = wte[tokens] + wpe[t]; dwte (V, C), dwpe (T, C) = gradients of sum(out * dout).
void embedding_forward(double* out, const std::int32_t* tokens, const double* wte, const double* wpe,
                       std::size_t batch, std::size_t seq, std::size_t channels);
void embedding_backward(double* dwte, double* dwpe, const double* dout, const std::int32_t* tokens,
                        std::size_t vocab, std::size_t batch, std::size_t seq, std::size_t channels);

// One AdamW step on n parameters, as layers.h states it, in double.
void adamw_update(double* params, const double* grads, double* m, double* v, std::size_t n, double learning_rate,
                  double beta1, double beta2, double eps, double weight_decay, long step, double grad_scale);

}  // namespace strata::layers::reference
