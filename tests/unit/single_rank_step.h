// The reference the training step is held to: one GPT model on one rank over the whole global batch of every
// step (every data-parallel rank's rows of a micro-batch at once), the global gradient norm, AdamW on every
// trainable parameter; written apart from the trainer, from the model and kernels alone.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/layers.h"
#include "train/trainer.h"

namespace strata::train {

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The small model and optimizer the step's tests train: the gradient clipped (the norms start above 0.5), weight
// decay, and Adam's eps at 1e-6, which bounds how far a gradient's fp32 summation order can move a parameter
// (test_data_parallel_mpi.cpp derives the tolerance from it).
inline TrainConfig check_config(std::string name, int layers, int accumulation, uint64_t seed) {
  TrainConfig c;
  c.model.name = std::move(name);
  c.model.layers = layers, c.model.hidden = 32, c.model.heads = 4, c.model.kv_heads = 2, c.model.vocab = 64;
  c.model.max_seq = 16;
  c.micro_batch = 2, c.seq = 16, c.accumulation = accumulation;
  c.lr.max_lr = 1e-3f, c.lr.min_lr = 1e-3f;
  c.max_grad_norm = 0.5f;
  c.adamw.weight_decay = 0.1f;
  c.adamw.eps = 1e-6f;
  c.seed = seed;
  return c;
}

struct Reference {
  std::vector<double> losses, norms;
  std::vector<float> params;
};

// The single-rank step of the same global batch: dp data-parallel ranks' micro-batches at once.
inline Reference single_rank(const TrainConfig& c, int dp, int steps, const TokenSource& data) {
  const int rows = dp * c.micro_batch;  // one micro-batch of every rank at once
  GptCpu model(c.model, rows, c.seq, c.runtime);
  const ParameterLayout& layout = model.layout();
  Reference ref;
  ref.params.assign(layout.total(), 0.0f);
  init_parameters(c.model, layout, ref.params.data(), c.seed, c.init_std);
  std::vector<float> grads(layout.total()), m(layout.total(), 0.0f), v(layout.total(), 0.0f);
  const std::vector<bool> trains = trainable_units(c.model, c.trainable);
  const std::vector<Slice> units = layout.units();
  std::vector<int32_t> tokens(static_cast<std::size_t>(rows) * c.seq), targets(tokens.size());
  const float normaliser = static_cast<float>(rows) * c.accumulation * c.seq;
  for (int step = 1; step <= steps; ++step) {
    std::fill(grads.begin(), grads.end(), 0.0f);
    UnitPointers u = UnitPointers::flat(layout, ref.params.data(), grads.data());
    for (std::size_t i = 0; i < units.size(); ++i)
      if (!trains[i]) u.grads[i] = nullptr;
    double loss = 0;
    for (int micro = 0; micro < c.accumulation; ++micro) {
      data.rows(step, static_cast<int64_t>(micro) * rows, rows, c.seq, tokens.data(), targets.data());
      loss += model.forward(u, tokens.data(), targets.data());
      model.backward(u, normaliser);
    }
    double squares = 0;
    for (std::size_t i = 0; i < units.size(); ++i)
      if (trains[i]) squares += layers::squared_norm(grads.data() + units[i].offset, units[i].size, {});
    const double norm = std::sqrt(squares);
    layers::AdamWConfig adamw = c.adamw;
    adamw.learning_rate = learning_rate(c.lr, step);
    for (std::size_t i = 0; i < units.size(); ++i)
      if (trains[i])
        layers::adamw_update(ref.params.data() + units[i].offset, grads.data() + units[i].offset, m.data() + units[i].offset,
                             v.data() + units[i].offset, units[i].size, adamw, step, layers::clip_scale(norm, c.max_grad_norm), {});
    ref.losses.push_back(loss / normaliser);
    ref.norms.push_back(norm);
  }
  return ref;
}

// A trainer's parameters (tensor-parallel rank tp_index of tp, every unit it holds) against the reference's
// shard of them: the largest difference within tolerance, or where it is not.
inline testing::AssertionResult parameters_match(const ModelConfig& model, int tp, int tp_index, const Reference& ref,
                                                 const std::vector<float>& params, double tolerance) {
  const TensorShard shard = tensor_shard(model, tp, tp_index);
  std::vector<float> expected(ParameterLayout(model, shard).total());
  take_shard(model, shard, ref.params.data(), expected.data());
  if (params.size() != expected.size())
    return testing::AssertionFailure() << params.size() << " parameters, the reference's shard " << expected.size();
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < params.size(); ++i)
    if (std::fabs(params[i] - expected[i]) > worst) worst = std::fabs(params[i] - expected[i]), at = i;
  if (worst < tolerance) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "parameter " << at << " is " << params[at] << ", the single-rank step's "
                                     << expected[at];
}

}  // namespace strata::train
