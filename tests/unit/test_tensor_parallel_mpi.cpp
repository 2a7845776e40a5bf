// Tensor parallelism in the CPU model against the whole model on one rank, under mpirun with 2 and 4 ranks as
// one tensor-parallel group: the same loss, every rank's shard of the gradients equal to that shard of the whole
// model's gradients, the initialisation of a shard equal to the shard of the whole initialisation, with and
// without sequence parallelism, and each recomputation mode giving what keeping every activation gives. The vocabulary (23) divides by neither 2 nor
// 4, so the last slice is short and holds padding rows.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
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
    std::vector<float> params(whole.layout().total()), grads(params.size(), 0.0f);
    init_parameters(m, whole.layout(), params.data(), seed, 0.3f);
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
      take_shard(m, sh, params.data(), expected.data());
      init_parameters(m, shard.layout(), local.data(), seed, 0.3f);
      EXPECT_EQ(local, expected) << "a shard's initialisation is the shard of the whole model's";
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

