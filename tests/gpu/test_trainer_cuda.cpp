// The data-parallel step on GPUs (train/trainer_cuda.h), under mpirun with one rank per GPU, against the
// single-GPU step (GpuTrainer) of the same global batch: every runnable strategy, three steps with gradient
// accumulation and clipping, the same losses and gradient norms and the same master weights after them.
//
// Tolerance. Both run in the same mixed precision (bf16 compute on the same bf16 copies of the same fp32 master
// weights); they differ in the order of fp32 sums (the reduction over ranks against one GEMM over all rows) and in
// the GEMMs' shapes (a rank's rows against all of them), which cuBLASLt may split differently, so each bf16 result
// may round differently. test_gpt_cuda.cpp derives the bounds for such roundings against the CPU: sqrt(k) u on
// the loss, 8 sqrt(k) u on gradients (u = 2^-8, k bf16 tensors on the path); the same bounds hold here, and the
// master weights after three AdamW steps are held to 0.5 relative L2 of their moves, as there (a gradient within
// its noise of zero may flip its step's sign). A missing rank, a doubled shard or a stale parameter moves the loss
// and the weights by order one.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include "collectives/nccl_groups.h"
#include "tests/gpu/gpu_per_rank.h"
#include "tests/unit/single_rank_step.h"
#include "train/gpt_cuda.h"
#include "train/trainer_cuda.h"

namespace strata::train {
namespace {

constexpr double kBf16Unit = 0x1.0p-8;

TrainConfig base_config() {
  TrainConfig c;
  c.model.name = "gpu-dp-check";
  // Head dimension 64 and every tensor a multiple of 8 elements (validate_gpu), grouped-query heads.
  c.model.layers = 2, c.model.hidden = 128, c.model.heads = 2, c.model.kv_heads = 1, c.model.vocab = 256;
  c.model.max_seq = 64;
  c.micro_batch = 2, c.seq = 64, c.accumulation = 2;
  c.lr.max_lr = 1e-2f, c.lr.min_lr = 1e-2f;
  c.adamw.weight_decay = 0.1f;
  c.max_grad_norm = 1.0f;
  c.seed = 17;
  return c;
}

TEST(GpuDataParallel, EveryStrategyMatchesTheSingleGpuStep) {
  SKIP_WITHOUT_A_GPU_PER_RANK();
  const int n = world_size(), steps = 3;
  const TrainConfig base = base_config();
  const auto data = synthetic_tokens(base.model.vocab, 9);
  const double k = 3 + 10 * base.model.layers;  // bf16 tensors on the forward path
  const double loss_tolerance = std::sqrt(k) * kBf16Unit, norm_tolerance = 8 * std::sqrt(k) * kBf16Unit;

  // The single-GPU step on every rank's rows of each micro-batch at once.
  cudaStream_t stream = nullptr;
  STRATA_KERNEL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<double> want_loss, want_norm;
  std::vector<float> want_params, initial;
  {
    GptCuda model(base.model, n * base.micro_batch, base.seq, stream);
    std::vector<float> params(model.layout().total());
    init_parameters(base.model, model.layout(), params.data(), base.seed, base.init_std);
    initial = params;
    GpuStepConfig config{base.adamw, base.max_grad_norm};
    config.adamw.learning_rate = base.lr.max_lr;
    GpuTrainer single(model, params.data(), config);
    const int rows = n * base.micro_batch;
    std::vector<int32_t> tokens(static_cast<std::size_t>(rows * base.seq * base.accumulation)), targets(tokens.size());
    for (int step = 1; step <= steps; ++step) {
      for (int micro = 0; micro < base.accumulation; ++micro) {
        const std::size_t at = static_cast<std::size_t>(micro) * rows * base.seq;
        data->rows(step, static_cast<int64_t>(micro) * rows, rows, base.seq, tokens.data() + at, targets.data() + at);
      }
      const GpuStepStats stats = single.step(step, tokens, targets);
      want_loss.push_back(stats.loss), want_norm.push_back(stats.grad_norm);
    }
    want_params = single.parameters();
  }
  STRATA_KERNEL_CUDA_CHECK(cudaStreamDestroy(stream));

  for (int rpn : n >= 2 ? std::vector<int>{0, 1} : std::vector<int>{0}) {
    coll::ProcessGroups groups({1, 1, n}, rpn);
    coll::NcclProcessGroups nccl(groups);
    for (const Strategy& strategy : runnable_strategies()) {
      TrainConfig c = base;
      c.strategy = strategy;
      const std::string what = strategy.name() + " rpn " + std::to_string(rpn);
      GpuDataParallelTrainer trainer(c, groups, nccl, *data);
      for (int step = 1; step <= steps; ++step) {
        const StepStats stats = trainer.step(step);
        const std::size_t i = static_cast<std::size_t>(step) - 1;
        EXPECT_NEAR(stats.loss, want_loss[i], loss_tolerance * want_loss[i]) << what << " step " << step;
        EXPECT_NEAR(stats.grad_norm, want_norm[i], norm_tolerance * want_norm[i]) << what << " step " << step;
      }
      const std::vector<float> params = trainer.full_parameters();
      ASSERT_EQ(params.size(), want_params.size()) << what;
      double diff = 0, moved = 0;
      for (std::size_t i = 0; i < params.size(); ++i) {
        diff += std::pow(static_cast<double>(params[i]) - want_params[i], 2);
        moved += std::pow(static_cast<double>(want_params[i]) - initial[i], 2);
      }
      EXPECT_LE(std::sqrt(diff / moved), 0.5) << what << ": three updates against the single GPU's, relative L2";
      // Model states as held: 2 bytes per parameter over d_P, 4 per gradient over d_G, 12 per optimizer element
      // over d_O, each unit padded to a multiple of n.
      const MemoryUse used = trainer.memory();
      const double psi = static_cast<double>(c.model.parameters()), slack = 16.0 * (c.model.layers + 2) * n;
      const int m = groups.dp_intra().size();
      const ModelStateMemory formula = model_state_memory(strategy, psi, psi, m, n, StateBytes{2, 4, 12});
      EXPECT_NEAR(used.params, formula.params, slack) << what;
      EXPECT_NEAR(used.grads, formula.grads, slack) << what;
      EXPECT_NEAR(used.optimizer, formula.optimizer, 3 * slack) << what;
    }
  }
}

TEST(GpuDataParallel, RefusesWhatItDoesNotRun) {
  TrainConfig c = base_config();
  EXPECT_NE(gpu_step_refusal(c, {2, 1, 1}).find("tensor and pipeline"), std::string::npos);
  c.recompute = Recompute::full;
  EXPECT_NE(gpu_step_refusal(c, {1, 1, 1}).find("recomputation"), std::string::npos);
  c.recompute = Recompute::none;
  c.trainable = parse_trainable("last:1");
  EXPECT_NE(gpu_step_refusal(c, {1, 1, 1}).find("partial training"), std::string::npos);
  c.trainable = {};
  EXPECT_EQ(gpu_step_refusal(c, {1, 1, 1}), "");
}

}  // namespace
}  // namespace strata::train
