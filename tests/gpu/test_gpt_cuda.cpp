// The GPT model on one GPU (train/gpt_cuda.h) against GptCpu in fp32 on the same parameters and tokens: the
// loss and every parameter tensor's gradient over two accumulated micro-batches, three AdamW steps, frozen units
// and the hooks, and the device memory it counts. Two models: the tiny preset (head dimension 16, so the unfused
// cuBLASLt attention) and a small custom one with grouped-query heads of dimension 64 (Strata's flash kernels).
//
// Tolerance. bf16 keeps 8 significant bits, so each rounding to bf16 is off by at most u = 2^-8 relative. The
// forward path stores k = 3 + 10 L bf16 tensors one after another (the embedding output; per layer ln1, qkv, the
// attention output, its projection, x_mid, ln2, fc, gelu, fc_proj and the layer output; the final norm and the
// logits), and the backward as many gradients of them. Independent roundings add up as a random walk:
// sqrt(k) u relative on the logits. At the initial scales used here the loss moves far less than its logits
// (GptCpu with every operand perturbed by e relative moves the loss by under 0.1 e), so the loss is held to
// sqrt(k) u relative. The same experiment moves every parameter gradient by at most 4.3 e (relative L2 of the
// tensor), so each gradient tensor is held to 8 sqrt(k) u relative L2: the measured response with a factor 2 of
// margin. For L = 2 (k = 23) that is 1.9% on the loss and 15% on gradients: a wrong index, mask, transpose or
// a missed accumulation moves them by order one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/layers.h"
#include "train/gpt.h"
#include "train/gpt_cuda.h"
#include "train/memory.h"
#include "tests/gpu/gpu_test.h"

namespace strata::train {
namespace {

using gpu_test::DeviceArray;
using gpu_test::TestStream;
using layers::BFloat16;

constexpr double kBf16Unit = 0x1.0p-8;
int forward_roundings(const ModelConfig& m) { return 3 + 10 * m.layers; }
double loss_tolerance(const ModelConfig& m) { return std::sqrt(forward_roundings(m)) * kBf16Unit; }
double gradient_tolerance(const ModelConfig& m) { return 8.0 * std::sqrt(forward_roundings(m)) * kBf16Unit; }

struct Case {
  ModelConfig model;
  int batch, seq;
  attention::gpu::Impl attention;
};

Case tiny_case() { return {preset("tiny"), 2, 32, attention::gpu::Impl::unfused}; }
Case flash_case() {
  ModelConfig m;
  m.name = "gqa64", m.layers = 2, m.hidden = 128, m.heads = 2, m.kv_heads = 1, m.vocab = 200, m.max_seq = 64;
  return {m, 2, 40, attention::gpu::Impl::flash};  // 40: not a multiple of the flash tiles
}

// Initial parameters rounded to bf16, so both models compute from exactly the same values.
std::vector<float> bf16_parameters(const ModelConfig& m, const ParameterLayout& layout, uint64_t seed, float std) {
  std::vector<float> params(layout.total());
  init_parameters(m, layout, params.data(), seed, std);
  for (float& p : params) p = layers::to_float(layers::to_bf16(p));
  return params;
}

std::vector<BFloat16> to_bf16(const std::vector<float>& values) {
  std::vector<BFloat16> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = layers::to_bf16(values[i]);
  return out;
}

// `micro` micro-batches of (B, T) tokens and targets back to back; one target of the first does not count.
void draw_tokens(const Case& c, int micro, std::mt19937_64& rng, std::vector<int32_t>& tokens, std::vector<int32_t>& targets) {
  const std::size_t n = static_cast<std::size_t>(micro) * c.batch * c.seq;
  tokens.resize(n), targets.resize(n);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.model.vocab));
  for (auto& t : targets) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(c.model.vocab));
  targets[5] = -1;
}

double relative_l2(const std::vector<float>& got, const std::vector<float>& want, Slice s) {
  double diff = 0, norm = 0;
  for (std::size_t i = s.offset; i < s.end(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d, norm += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(diff / norm);
}

void expect_gradients_close(const ModelConfig& m, const ParameterLayout& layout, const std::vector<float>& got,
                            const std::vector<float>& want, const std::string& what) {
  const double tol = gradient_tolerance(m);
  auto check = [&](Slice s, const std::string& name) {
    const double error = relative_l2(got, want, s);
    EXPECT_LE(error, tol) << what << ": gradient of " << name << " off by " << error << " relative L2";
  };
  check(layout.wte(), "wte");
  check(layout.wpe(), "wpe");
  const char* names[kLayerTensors] = {"ln1_w", "ln1_b", "qkv_w", "qkv_b", "attn_proj_w", "attn_proj_b",
                                      "ln2_w", "ln2_b", "fc_w",  "fc_b",  "fc_proj_w",  "fc_proj_b"};
  for (int l = 0; l < m.layers; ++l)
    for (int t = 0; t < kLayerTensors; ++t)
      check(layout.tensor(l, static_cast<LayerTensor>(t)), "layer " + std::to_string(l) + " " + names[t]);
  check(layout.lnf_w(), "lnf_w");
  check(layout.lnf_b(), "lnf_b");
}

// Two accumulated micro-batches on both models; the GPU's loss and gradients against the CPU's.
void expect_matches_cpu(const Case& c) {
  auto rng = gpu_test::seeded_rng();
  const ModelConfig& m = c.model;
  TestStream stream;
  GptCuda gpu(m, c.batch, c.seq, stream.get(), c.attention);
  ASSERT_EQ(gpu.attention_impl(), c.attention);
  GptCpu cpu(m, c.batch, c.seq, {});
  const ParameterLayout& layout = cpu.layout();
  // std 0.1: logits and attention scores of order one, so the comparison sees every part of the model work.
  const std::vector<float> params = bf16_parameters(m, layout, rng(), 0.1f);
  std::vector<int32_t> tokens, targets;
  draw_tokens(c, 2, rng, tokens, targets);
  const float normaliser = static_cast<float>(layers::counted_targets(targets.data(), targets.size()));
  const std::size_t rows = static_cast<std::size_t>(c.batch) * c.seq;

  std::vector<float> cpu_grads(layout.total(), 0.0f);
  double cpu_losses[2], gpu_losses[2];
  for (int micro = 0; micro < 2; ++micro) {
    cpu_losses[micro] = cpu.forward(params.data(), tokens.data() + micro * rows, targets.data() + micro * rows);
    cpu.backward(params.data(), cpu_grads.data(), normaliser);
  }
  DeviceArray<BFloat16> d_params(to_bf16(params));
  DeviceArray<float> d_grads(std::vector<float>(layout.total(), 0.0f));
  const DeviceUnitPointers units = DeviceUnitPointers::flat(layout, d_params.get(), d_grads.get());
  for (int micro = 0; micro < 2; ++micro) {
    gpu.forward(units, tokens.data() + micro * rows, targets.data() + micro * rows);
    gpu.backward(units, normaliser);
    gpu_losses[micro] = gpu.loss_sum();
  }
  for (int micro = 0; micro < 2; ++micro)
    EXPECT_NEAR(gpu_losses[micro], cpu_losses[micro], loss_tolerance(m) * cpu_losses[micro])
        << m.name << " micro-batch " << micro << " summed loss";
  expect_gradients_close(m, layout, d_grads.download(), cpu_grads, m.name);
}

TEST(GptCuda, TinyPresetMatchesTheCpuModel) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_matches_cpu(tiny_case());
}

TEST(GptCuda, GroupedQueryFlashModelMatchesTheCpuModel) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_matches_cpu(flash_case());
}

// Three steps of GpuTrainer against the same step on the CPU (fp32 throughout): AdamW with weight decay, the
// gradient clipped (the norms are above 1), two micro-batches per step, the same batch every step so the loss
// falls fast. The GPU computes each step with the bf16 copy of weights the CPU keeps in fp32, so the losses
// after the first step carry that rounding too; an emulation on the CPU (GptCpu on the bf16-rounded weights,
// each gradient perturbed by 5% of itself and 3% of the gradient RMS) stays within 0.1% of the fp32 losses,
// nine times inside the loss tolerance.
void expect_steps_match_cpu(const Case& c) {
  auto rng = gpu_test::seeded_rng();
  const ModelConfig& m = c.model;
  TestStream stream;
  GptCuda gpu(m, c.batch, c.seq, stream.get(), c.attention);
  GptCpu cpu(m, c.batch, c.seq, {});
  const ParameterLayout& layout = cpu.layout();
  std::vector<float> params = bf16_parameters(m, layout, rng(), 0.1f);
  const std::vector<float> initial = params;
  std::vector<int32_t> tokens, targets;
  draw_tokens(c, 2, rng, tokens, targets);
  GpuStepConfig config;
  config.adamw.learning_rate = 1e-2f;
  config.adamw.weight_decay = 0.1f;
  config.max_grad_norm = 1.0f;
  GpuTrainer trainer(gpu, params.data(), config);

  const std::size_t n = layout.total(), rows = static_cast<std::size_t>(c.batch) * c.seq;
  const float normaliser = static_cast<float>(layers::counted_targets(targets.data(), targets.size()));
  std::vector<float> grads(n), mom(n, 0.0f), var(n, 0.0f);
  std::vector<double> cpu_losses, gpu_losses;
  for (long step = 1; step <= 3; ++step) {
    std::fill(grads.begin(), grads.end(), 0.0f);
    double loss = 0;
    for (std::size_t at = 0; at < tokens.size(); at += rows) {
      loss += cpu.forward(params.data(), tokens.data() + at, targets.data() + at);
      cpu.backward(params.data(), grads.data(), normaliser);
    }
    const double norm = std::sqrt(layers::squared_norm(grads.data(), n, {}));
    layers::AdamWConfig adamw = config.adamw;
    layers::adamw_update(params.data(), grads.data(), mom.data(), var.data(), n, adamw, step,
                         layers::clip_scale(norm, config.max_grad_norm), {});
    const GpuStepStats stats = trainer.step(step, tokens, targets);
    cpu_losses.push_back(loss / normaliser);
    gpu_losses.push_back(stats.loss);
    EXPECT_NEAR(stats.loss, loss / normaliser, loss_tolerance(m) * loss / normaliser) << m.name << " step " << step;
    EXPECT_NEAR(stats.grad_norm, norm, gradient_tolerance(m) * norm) << m.name << " step " << step;
    EXPECT_GT(norm, config.max_grad_norm) << "the test means to clip";
  }
  EXPECT_LT(gpu_losses[2], gpu_losses[0] - 0.5) << "the GPU step does not learn a batch it sees three times";
  EXPECT_LT(cpu_losses[2], cpu_losses[0] - 0.5);
  // The master weights moved as the CPU's did. Where a gradient is within its bf16 noise of zero, AdamW's
  // normalised step may take the other sign; that emulation moves the three updates by 20% relative L2. A wrong
  // learning rate, bias correction or decay moves them by order one.
  const std::vector<float> gpu_params = trainer.parameters();
  double diff = 0, moved = 0;
  for (std::size_t i = 0; i < n; ++i) {
    diff += std::pow(static_cast<double>(gpu_params[i]) - params[i], 2);
    moved += std::pow(static_cast<double>(params[i]) - initial[i], 2);
  }
  EXPECT_LE(std::sqrt(diff / moved), 0.5) << m.name << ": the GPU's three updates against the CPU's, relative L2";
}

TEST(GptCuda, ThreeAdamWStepsFollowTheCpuTiny) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_steps_match_cpu(tiny_case());
}

TEST(GptCuda, ThreeAdamWStepsFollowTheCpuFlash) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  expect_steps_match_cpu(flash_case());
}

// As GptCpu: frozen units get no gradients and change nothing of the others (the same kernels on the same
// values; the unfused attention, unlike flash's dQ atomics, sums in a fixed order), and the hooks see every
// unit in the CPU model's order, gradient buffers provided late through the head's before_backward hook.
TEST(GptCuda, FrozenUnitsAndHooksAsOnTheCpu) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  const Case c = tiny_case();
  const ModelConfig& m = c.model;
  TestStream stream;
  GptCuda gpu(m, c.batch, c.seq, stream.get(), c.attention);
  GptCpu cpu(m, c.batch, c.seq, {});
  const ParameterLayout& layout = gpu.layout();
  std::mt19937_64 rng(5);
  const std::vector<float> params = bf16_parameters(m, layout, 11, 0.1f);
  std::vector<int32_t> tokens, targets;
  draw_tokens(c, 1, rng, tokens, targets);
  const float normaliser = static_cast<float>(layers::counted_targets(targets.data(), targets.size()));
  DeviceArray<BFloat16> d_params(to_bf16(params));
  const std::vector<float> zeros(layout.total(), 0.0f);
  DeviceArray<float> full(zeros), partial(zeros);
  gpu.forward(DeviceUnitPointers::flat(layout, d_params.get(), full.get()), tokens.data(), targets.data());
  gpu.backward(DeviceUnitPointers::flat(layout, d_params.get(), full.get()), normaliser);

  std::vector<int> gpu_seen, cpu_seen;
  auto recorder = [](std::vector<int>& seen, std::vector<float*>* grads, std::vector<float*> late) {
    LayerHooks hooks;
    hooks.before_forward = [&seen](int l) { seen.push_back(100 + l); };
    hooks.before_backward = [&seen, grads, late](int l) {
      seen.push_back(200 + l);
      if (l == static_cast<int>(late.size()) - 2) *grads = late;  // the head's hook
    };
    hooks.after_backward = [&seen](int l) { seen.push_back(300 + l); };
    return hooks;
  };
  DeviceUnitPointers units = DeviceUnitPointers::flat(layout, d_params.get(), partial.get());
  std::vector<float*> late = units.grads;
  for (std::size_t u = 0; u + 2 < units.grads.size(); ++u) late[u] = nullptr;  // embeddings, layer 0 frozen
  units.grads = late;
  units.grads.back() = UnitPointers::pending();  // the final norm's buffer comes with the head's hook
  const LayerHooks gpu_hooks = recorder(gpu_seen, &units.grads, late);
  gpu.forward(units, tokens.data(), targets.data(), gpu_hooks);
  gpu.backward(units, normaliser, gpu_hooks);

  std::vector<float> cpu_grads(layout.total(), 0.0f);
  UnitPointers cpu_units = UnitPointers::flat(layout, params.data(), cpu_grads.data());
  std::vector<float*> cpu_late = cpu_units.grads;
  for (std::size_t u = 0; u + 2 < cpu_late.size(); ++u) cpu_late[u] = nullptr;
  cpu_units.grads = cpu_late;
  cpu_units.grads.back() = UnitPointers::pending();
  const LayerHooks cpu_hooks = recorder(cpu_seen, &cpu_units.grads, cpu_late);
  cpu.forward(cpu_units, tokens.data(), targets.data(), cpu_hooks);
  cpu.backward(cpu_units, normaliser, cpu_hooks);
  EXPECT_EQ(gpu_seen, cpu_seen);

  const std::vector<float> got = partial.download(), want = full.download();
  const std::size_t trained = layout.layer(m.layers - 1).offset;
  for (std::size_t i = 0; i < layout.total(); ++i) {
    if (i >= trained) ASSERT_FLOAT_EQ(got[i], want[i]) << i;
    else ASSERT_EQ(got[i], 0.0f) << i;
  }
}

TEST(GptCuda, CountsItsDeviceMemoryAndChecksTokens) {
  STRATA_SKIP_WITHOUT_CUDA_DEVICE();
  const Case c = tiny_case();
  TestStream stream;
  const MemoryFigures before = device_memory_current();
  {
    GptCuda gpu(c.model, c.batch, c.seq, stream.get(), c.attention);
    const MemoryFigures during = device_memory_current();
    const std::size_t rows = static_cast<std::size_t>(c.batch) * c.seq;
    EXPECT_EQ(during[MemoryCategory::activations] - before[MemoryCategory::activations],
              static_cast<double>(gpu.activation_bytes() + 2 * rows * sizeof(int32_t)));
    EXPECT_EQ(during[MemoryCategory::workspace] - before[MemoryCategory::workspace],
              static_cast<double>(gpu.workspace_bytes()));
    std::vector<int32_t> tokens(rows, 1), targets(rows, 2);
    DeviceArray<BFloat16> params(gpu.layout().total());
    const DeviceUnitPointers units = DeviceUnitPointers::flat(gpu.layout(), params.get(), nullptr);
    tokens[3] = c.model.vocab;
    EXPECT_THROW(gpu.forward(units, tokens.data(), targets.data()), std::invalid_argument);
    tokens[3] = 0, targets[4] = c.model.vocab;
    EXPECT_THROW(gpu.forward(units, tokens.data(), targets.data()), std::invalid_argument);
  }
  EXPECT_EQ(device_memory_current().total(), before.total());
}

}  // namespace
}  // namespace strata::train
