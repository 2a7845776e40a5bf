// The GPT model of gpt.h on one GPU, written as GptCpu is: the same layers in the same order, the same
// ParameterLayout, per-unit pointers and LayerHooks, so a data-parallel GPU step can gather a unit's parameters
// before it runs and reduce its gradients as soon as they are final.
//
// Precision: parameters are read as a bf16 copy of fp32 master weights the caller owns (cast unit by unit, or
// refreshed by AdamW's pass); activations and their gradients are bf16; layer-norm statistics, log-sum-exps
// and losses fp32; parameter gradients fp32, accumulated (+=) across micro-batches. Matrix products run on
// cuBLASLt with fp32 accumulation, attention on Strata's flash kernels (the unfused cuBLASLt baseline where
// flash does not take the head dimension, as the tiny preset's 16).
//
// Every call enqueues on the caller's stream and returns; only loss_sum() waits. Device memory is counted in
// memory.h's device figures (parameters and gradients by GpuTrainer, activations and workspace here; the
// cuBLASLt plan cache's own 32 MiB workspace is not counted).
//
// Dimensions as in gpt.h: B batch, T sequence, C hidden, V vocabulary, N = B * T rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/attention_cuda.h"
#include "kernels/layers.h"
#include "kernels/linear_cuda.h"
#include "train/gpt.h"
#include "train/gpt_cuda_layout.h"
#include "train/memory_cuda.h"

struct CUstream_st;

namespace strata::train {

using Stream = CUstream_st*;

class GptCuda {
 public:
  // Allocates on the current device. Throws std::invalid_argument when validate_gpu() refuses the shape (or the
  // device cannot run the attention), KernelError when CUDA or cuBLASLt fails.
  GptCuda(const ModelConfig& model, int batch, int seq, Stream stream, attention::gpu::Impl attention);
  GptCuda(const ModelConfig& model, int batch, int seq, Stream stream)
      : GptCuda(model, batch, seq, stream, default_gpu_attention(model, batch, seq)) {}
  ~GptCuda();
  GptCuda(const GptCuda&) = delete;
  GptCuda& operator=(const GptCuda&) = delete;

  const ModelConfig& model() const { return model_; }
  const ParameterLayout& layout() const { return layout_; }
  int batch() const { return batch_; }
  int seq() const { return seq_; }
  Stream stream() const { return stream_; }
  attention::gpu::Impl attention_impl() const { return impl_; }
  std::size_t activation_bytes() const { return activations_.bytes(); }  // kept for the backward pass
  std::size_t workspace_bytes() const { return scratch_.bytes(); }       // gradients of activations, scratch

  // tokens, targets (B, T) on the host: checked (tokens in [0, V), targets below V, a negative target a row that
  // does not count; std::invalid_argument otherwise) and copied to the device. Enqueues the forward pass; the
  // summed loss of the counted rows stays on the device until loss_sum() reads it.
  void forward(const DeviceUnitPointers& units, const int32_t* tokens, const int32_t* targets, const LayerHooks& hooks = {});
  // Waits for the stream, then returns the summed loss of the last forward (the caller divides by the tokens of
  // the whole global batch, the normaliser it passes to backward).
  double loss_sum();
  // grads += d(sum of losses / normaliser) / d(params) for every unit with a gradient buffer, for the batch of
  // the last forward.
  void backward(const DeviceUnitPointers& units, float normaliser, const LayerHooks& hooks = {});

 private:
  unsigned char* layer_base(int l) { return activations_.data() + static_cast<std::size_t>(l) * layer_.list.size(); }
  unsigned char* head_base() { return layer_base(model_.layers); }
  const layers::BFloat16* param(const DeviceUnitPointers& u, int l, LayerTensor t) const;
  float* grad(const DeviceUnitPointers& u, int l, LayerTensor t) const;
  layers::BFloat16* layer_input(int l);  // (N, C); layer `layers` is the head
  // The passes, block by block, as GptCpu's.
  void embedding_forward(const DeviceUnitPointers& u);
  void layer_forward(int l, const DeviceUnitPointers& u);
  void attention_forward(int l, const DeviceUnitPointers& u);
  void head_forward(const DeviceUnitPointers& u);
  void head_backward(const DeviceUnitPointers& u, float normaliser);
  void layer_backward(int l, const DeviceUnitPointers& u);
  void mlp_backward(int l, const DeviceUnitPointers& u);
  void attention_backward(int l, const DeviceUnitPointers& u, layers::BFloat16* d_residual);
  void embedding_backward(const DeviceUnitPointers& u);

  ModelConfig model_;
  ParameterLayout layout_;
  int batch_, seq_;
  Stream stream_;
  attention::gpu::Impl impl_;
  GpuLayerActs layer_;
  GpuHeadActs head_;
  GpuScratch scratch_layout_;
  std::unique_ptr<linear::gpu::PlanCache> linear_;
  std::unique_ptr<attention::gpu::Plan> attention_;
  DeviceBuffer<unsigned char> activations_;  // per layer, then the head's
  DeviceBuffer<unsigned char> scratch_;      // GpuScratch, reused by every layer
  DeviceBuffer<int32_t> tokens_, targets_;   // (B, T) of the last forward
};

// The single-GPU step on a GptCuda: fp32 master weights, their bf16 compute copy, fp32 gradients and AdamW's
// moments on the device; each step zeroes the gradients, runs forward and backward over its micro-batches,
// takes the global gradient norm, clips, and applies AdamW, which writes the refreshed bf16 copy in the same pass.
struct GpuStepConfig {
  layers::AdamWConfig adamw;
  float max_grad_norm = 1.0f;  // 0: no clipping
};

struct GpuStepStats {
  double loss = 0;       // mean over the counted targets of the step's micro-batches
  double grad_norm = 0;  // before clipping
};

class GpuTrainer {
 public:
  // params: the initial fp32 parameters on the host, layout().total() of them. Throws std::invalid_argument for
  // an AdamW configuration layers::validate() refuses.
  GpuTrainer(GptCuda& model, const float* params, const GpuStepConfig& config);
  ~GpuTrainer();
  GpuTrainer(const GpuTrainer&) = delete;
  GpuTrainer& operator=(const GpuTrainer&) = delete;

  // One optimizer step (step >= 1) on micro-batches of (B, T) tokens and targets given back to back on the host:
  // both spans hold k B T values, k >= 1. Throws std::invalid_argument for other lengths or when no target counts.
  GpuStepStats step(long step, std::span<const int32_t> tokens, std::span<const int32_t> targets);

  DeviceUnitPointers units();           // the bf16 compute copy and the gradients, unit by unit
  std::vector<float> parameters() const;  // the master weights (waits for the stream)
  std::vector<float> gradients() const;   // the last step's, before clipping (waits for the stream)

 private:
  GptCuda& model_;
  GpuStepConfig config_;
  DeviceBuffer<float> master_;             // fp32 parameters
  DeviceBuffer<layers::BFloat16> compute_; // their bf16 copy
  DeviceBuffer<float> grads_;
  DeviceBuffer<float> adam_m_, adam_v_;
  DeviceBuffer<double> norm_;              // the squared norm, then the reduction's per-block partials
};

}  // namespace strata::train
