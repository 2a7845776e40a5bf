// Tensor parallelism in the CPU model against the whole model on one rank, under mpirun with 2 and 4 ranks as
// one tensor-parallel group: the same loss, every rank's shard of the gradients equal to that shard of the whole
// model's gradients, the initialisation of a shard equal to the shard of the whole initialisation, with and
// without sequence parallelism, and each recomputation mode giving what keeping every activation gives. The
// comparison starts from biases and norms away from their initial 0 and 1, as after training steps. The vocabulary
// (23) divides by neither 2 nor 4, so the last slice is short and holds padding rows.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <iostream>
#include <random>
#include <vector>

#include "collectives/process_group.h"
#include "train/gpt.h"

namespace strata::train {
namespace {

int world_size_now() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

uint64_t test_seed() {
  const char* text = std::getenv("STRATA_TEST_SEED");
  const uint64_t seed = text ? std::strtoull(text, nullptr, 10) : 20261124;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::printf("[ seed     ] %llu (set STRATA_TEST_SEED to change)\n", static_cast<unsigned long long>(seed));
  return seed;
}

ModelConfig model_for(int tp, int kv_heads) {
  ModelConfig m;
  m.name = "tp-check", m.layers = 2, m.hidden = 32, m.heads = 4, m.kv_heads = kv_heads, m.vocab = 23, m.max_seq = 8;
  m.mlp_hidden = 16 * tp;  // divides by the degree
  return m;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(const ModelConfig& m, int rows, uint64_t seed) {
  std::mt19937_64 random(seed);
  Batch b;
  for (int i = 0; i < rows; ++i) {
    b.tokens.push_back(static_cast<int32_t>(random() % static_cast<uint64_t>(m.vocab)));
    b.targets.push_back(static_cast<int32_t>(random() % static_cast<uint64_t>(m.vocab)));
  }
  b.targets[1] = -1;  // a row that does not count
  return b;
}

// The whole model's parameters with every bias and norm moved off its initial value (biases 0, norm weights 1), as
// training moves them: a bias added by every tensor-parallel rank instead of once shows only where it is not 0.
std::vector<float> with_trained_biases(const ModelConfig& m, const ParameterLayout& layout, std::vector<float> params,
                                       uint64_t seed) {
  std::mt19937_64 random(seed + 1);
  std::uniform_real_distribution<float> offset(0.1f, 0.5f);
  auto perturb = [&](Slice s) {
    for (std::size_t i = s.offset; i < s.end(); ++i) params[i] += (random() % 2 ? 1.0f : -1.0f) * offset(random);
  };
  using LT = LayerTensor;
  for (int l = 0; l < m.layers; ++l)
    for (LT t : {LT::ln1_w, LT::ln1_b, LT::qkv_b, LT::attn_proj_b, LT::ln2_w, LT::ln2_b, LT::fc_b, LT::fc_proj_b})
      perturb(layout.tensor(l, t));
  perturb(layout.lnf_w());
  perturb(layout.lnf_b());
  return params;
}

TEST(TensorParallel, ShardsTrainAsTheWholeModel) {
  const uint64_t seed = test_seed();
  const int n = world_size_now();
  coll::ProcessGroups groups({n, 1, 1});
  coll::Group& tp = groups.tp();
  for (int kv_heads : {4, 2}) {
    if (kv_heads % n != 0) continue;  // grouped-query attention where the degree divides the kv heads
    const ModelConfig m = model_for(n, kv_heads);
    const int B = 2, T = 6;
    const Batch batch = random_batch(m, B * T, seed);
    const float normaliser = static_cast<float>(B * T - 1);

    GptCpu whole(m, B, T, {});
    std::vector<float> initial(whole.layout().total()), grads(initial.size(), 0.0f);
    init_parameters(m, whole.layout(), initial.data(), seed, 0.3f);
    const std::vector<float> params = with_trained_biases(m, whole.layout(), initial, seed);
    for (int l = 0; l < m.layers; ++l)
      for (LayerTensor t : {LayerTensor::attn_proj_b, LayerTensor::fc_proj_b}) {
        const Slice bias = whole.layout().tensor(l, t);
        EXPECT_EQ(std::count(params.begin() + static_cast<std::ptrdiff_t>(bias.offset),
                             params.begin() + static_cast<std::ptrdiff_t>(bias.end()), 0.0f), 0)
            << "a row-parallel bias of layer " << l << " is zero, so adding it more than once would not show";
      }
    const double whole_loss = whole.forward(params.data(), batch.tokens.data(), batch.targets.data());
    whole.backward(params.data(), grads.data(), normaliser);

    for (bool sequence_parallel : {false, true})
    for (Recompute mode : {Recompute::none, Recompute::full, Recompute::selective}) {
      GptCpu shard(m, B, T, {}, mode, &tp, sequence_parallel);
      const std::string what = "kv heads " + std::to_string(kv_heads) + " " + name(mode) +
                               (sequence_parallel ? " sequence-parallel" : "");
      const TensorShard& sh = shard.shard();
      ASSERT_EQ(sh.tp, n);
      std::vector<float> local(shard.layout().total()), expected(local.size()), local_grads(local.size(), 0.0f);
      take_shard(m, sh, initial.data(), expected.data());
      init_parameters(m, shard.layout(), local.data(), seed, 0.3f);
      EXPECT_EQ(local, expected) << "a shard's initialisation is the shard of the whole model's";
      take_shard(m, sh, params.data(), local.data());
      const double loss = shard.forward(local.data(), batch.tokens.data(), batch.targets.data());
      EXPECT_NEAR(loss, whole_loss, 1e-5 * std::fabs(whole_loss)) << what;
      shard.backward(local.data(), local_grads.data(), normaliser);
      take_shard(m, sh, grads.data(), expected.data());
      int wrong = 0;
      double worst = 0;
      for (std::size_t i = 0; i < local_grads.size(); ++i) {
        const double error = std::fabs(local_grads[i] - expected[i]);
        worst = std::max(worst, error);
        wrong += error > 1e-5 + 1e-4 * std::fabs(expected[i]);
      }
      EXPECT_EQ(wrong, 0) << what << ": worst gradient error " << worst;
    }
  }
}

TEST(TensorParallel, ADegreeThatDoesNotDivideTheModelIsRefused) {
  const int n = world_size_now();
  coll::ProcessGroups groups({n, 1, 1});
  ModelConfig m = model_for(n, 4);
  m.heads = 3 * n + 1, m.kv_heads = m.heads, m.hidden = m.heads * 4;
  EXPECT_THROW(GptCpu(m, 1, 4, {}, Recompute::none, &groups.tp()), std::invalid_argument);
  if (n > 1) {  // 1 x 3 rows do not divide among the ranks' sequence parts
    EXPECT_THROW(GptCpu(model_for(n, 4), 1, 2 * n + 1 <= 8 ? 2 * n + 1 : 7, {}, Recompute::none, &groups.tp(), true),
                 std::invalid_argument);
  }
  EXPECT_THROW(tensor_shard(model_for(n, 4), n, n), std::invalid_argument);
  ModelConfig small_vocab = model_for(n, 4);
  small_vocab.vocab = n - 1;
  if (n > 1) {
    EXPECT_THROW(tensor_shard(small_vocab, n, 0), std::invalid_argument);
  }
}

}  // namespace
}  // namespace strata::train

