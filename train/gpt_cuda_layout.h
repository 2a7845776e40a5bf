// The host side of the GPU model (gpt_cuda.h), plain C++ so the CPU build tests it: where each saved
// activation and each piece of scratch lies in the model's device buffers, the per-unit device pointers, and
// which shapes the GPU path takes.
//
// Dimensions as in gpt.h: B batch, T sequence, C hidden, NH heads, KVH kv heads, D = C / NH, Q = (NH + 2 KVH) D,
// KV = KVH D, F MLP hidden, V vocabulary, N = B * T rows. Activations and their gradients are bf16 (2 bytes),
// layer-norm statistics, log-sum-exps, losses and parameter gradients fp32.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_cuda.h"
#include "kernels/layers.h"
#include "train/gpt.h"
#include "train/model_config.h"

namespace strata::train {

// Every region starts on cudaMalloc's alignment: cuBLASLt's heuristic and the unfused attention assume it, the
// flash kernels need 16 bytes.
inline constexpr std::size_t kDeviceAlignment = 256;

struct Region {
  std::size_t offset = 0;  // bytes from the buffer's start
  std::size_t bytes = 0;
};

// Hands out aligned regions one after another and keeps the list (the layout tests check it).
class RegionList {
 public:
  std::size_t take(std::size_t bytes);  // the new region's offset
  std::size_t size() const { return end_; }  // bytes of the whole buffer
  const std::vector<Region>& regions() const { return regions_; }

 private:
  std::size_t end_ = 0;
  std::vector<Region> regions_;
};

// One layer's saved activations, byte offsets from the layer's base.
struct GpuLayerActs {
  std::size_t x_in, ln1, ln1_mean, ln1_rstd, qkv;  // (N, C) (N, C) (N) (N) (N, Q)
  std::size_t q, k, v, atty, lse;                  // (B, NH, T, D) (B, KVH, T, D) x2 (B, NH, T, D) (B, NH, T)
  std::size_t att_merged, attproj, x_mid;          // (N, C) each
  std::size_t ln2, ln2_mean, ln2_rstd;             // (N, C) (N) (N)
  std::size_t fch, fch_gelu, fcproj;               // (N, F) (N, F) (N, C)
  RegionList list;
  GpuLayerActs(const ModelConfig& model, std::size_t rows);
};

// The head's: the last layer's output, the final norm, logits, losses, row statistics (max, sum, target logit).
struct GpuHeadActs {
  std::size_t x_final, lnf, lnf_mean, lnf_rstd, logits, losses, row_stats;  // (N, C) (N, C) (N) (N) (N, V) (N) (3N)
  RegionList list;
  GpuHeadActs(const ModelConfig& model, std::size_t rows);
};

// Gradients of activations shared by every layer, and the scratch of the kernels: layer norm's per-block
// partial sums, 2C floats of discarded layer-norm gradients (frozen units), the attention workspace, the
// unfused attention's recomputed output and lse (its backward needs the probabilities of a forward on the same
// inputs in the workspace, so the backward runs that forward again rather than keep every layer's scores), and
// the summed loss (one double).
struct GpuScratch {
  std::size_t d_x, d_mid, d_ln, d_fch_gelu, d_fch, d_att_merged, d_atty;  // (N, C) x3, (N, F) x2, (N, C) x2
  std::size_t dq, dk, dv, d_qkv;                                          // (N, C) (N, KV) (N, KV) (N, Q)
  std::size_t ln_partials, discard, attention, o_again, lse_again, loss_sum;
  std::size_t attention_bytes = 0;
  RegionList list;
  GpuScratch(const ModelConfig& model, int batch, int seq, attention::gpu::Impl impl);
};

// Where each unit's bf16 compute parameters and fp32 gradients are on the device, as UnitPointers says for the
// CPU model: unit u of ParameterLayout::units() starts at params[u] / grads[u]; a null gradient unit is frozen;
// UnitPointers::pending() marks one whose buffer the before_backward hook provides.
struct DeviceUnitPointers {
  std::vector<const layers::BFloat16*> params;
  std::vector<float*> grads;
  static DeviceUnitPointers flat(const ParameterLayout& layout, const layers::BFloat16* params, float* grads);
};

// The attention shape of the model at (batch, seq): causal, grouped-query.
attention::Shape attention_shape(const ModelConfig& model, int batch, int seq);
// Strata's flash attention where it takes the head dimension (64, 128), else the unfused cuBLASLt baseline.
attention::gpu::Impl default_gpu_attention(const ModelConfig& model, int batch, int seq);

// "" when the GPU model can run this shape, otherwise the first problem: the CPU model's checks, the attention
// implementation's, and every parameter tensor's element offset a multiple of 8, so each bf16 tensor starts on
// 16 bytes (cuBLASLt's heuristic assumes 16-byte aligned operands and bias; C, Q and F multiples of 8 give it).
std::string validate_gpu(const ModelConfig& model, int batch, int seq, attention::gpu::Impl impl);

}  // namespace strata::train
