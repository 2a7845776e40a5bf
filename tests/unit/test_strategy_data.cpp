// Data-parallel strategies as values (parsing, the 14 that run, the memory formula) and the token sources
// (split-invariant rows, shifted targets, llm.c token files).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <unistd.h>

#include "bench/harness/check.h"
#include "bench/harness/token_file.h"
#include "train/data.h"
#include "train/shard_plan.h"
#include "train/strategy.h"

namespace strata::train {
namespace {

TEST(Strategy, ParsesLettersAndZeroStages) {
  EXPECT_EQ(parse_strategy("nng").name(), "NNG");
  EXPECT_EQ(parse_strategy("ING").params, Sharding::intra);
  EXPECT_EQ(parse_strategy("zero0").name(), "NNN");
  EXPECT_EQ(parse_strategy("ZeRO3").name(), "GGG");
  EXPECT_EQ(zero_stage(1).name(), "NNG");
  EXPECT_EQ(zero_stage(2).name(), "NGG");
  try {
    parse_strategy("NXG");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'X' for the gradients"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_strategy("NN"), std::invalid_argument);
  EXPECT_THROW(zero_stage(4), std::invalid_argument);
}

TEST(Strategy, FourteenRunAndTheOthersSayWhy) {
  std::vector<std::string> names;
  for (const Strategy& s : runnable_strategies()) names.push_back(s.name());
  std::sort(names.begin(), names.end());
  std::vector<std::string> expected = {"GGG", "GIG", "GNG", "IGG", "IIG", "III", "INI", "ING",
                                       "NGG", "NIG", "NII", "NNG", "NNI", "NNN"};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(names, expected);
  for (const char* refused : {"GNN", "NGI", "IIN", "GGI"})
    EXPECT_NE(refusal_reason(parse_strategy(refused)).find("optimizer states"), std::string::npos) << refused;
}

TEST(Strategy, MemoryFollowsTheZeroAndPaRoFormulas) {
  const double psi = 1e9;
  const int n = 8, m = 4;
  auto bytes = [&](const char* s, double trainable = 1e9) {
    return model_state_memory(parse_strategy(s), psi, trainable, m, n, kMixedPrecisionStates).total() / psi;
  };
  EXPECT_DOUBLE_EQ(bytes("NNN"), 16);
  EXPECT_DOUBLE_EQ(bytes("NNG"), 4 + 12.0 / n);  // ZeRO-1
  EXPECT_DOUBLE_EQ(bytes("NGG"), 2 + 14.0 / n);  // ZeRO-2
  EXPECT_DOUBLE_EQ(bytes("GGG"), 16.0 / n);      // ZeRO-3
  EXPECT_DOUBLE_EQ(bytes("III"), 16.0 / m);      // hybrid sharding in a node
  // Partial training (Ψ' = Ψ / 16): ING shards the large frozen parameters and keeps the small gradients whole.
  EXPECT_DOUBLE_EQ(bytes("ING", psi / 16), 2.0 / m + 2.0 / 16 + 12.0 / 16 / n);
  EXPECT_DOUBLE_EQ(model_state_memory(parse_strategy("NNN"), psi, psi, m, n).total() / psi, 16);  // fp32: 4 + 4 + 8
}

TEST(ShardPlan, FinalReductionsFollowTheStrategyTable) {
  // 8 ranks as 2 nodes of 4; this rank: local index 1 on node 1. A unit of 100 elements pads to 104: 13 per global
  // piece, 26 per intra piece.
  using Over = ShardPlan::Over;
  auto steps = [](const char* strategy) {
    const ShardPlan plan(parse_strategy(strategy), 8, 4, 2, 1, 1);
    return plan.final_reductions(plan.shape(100));
  };
  auto expect = [](const ShardPlan::Reduction& r, Over over, bool allreduce, std::size_t in_offset, std::size_t out_offset,
                   std::size_t count) {
    EXPECT_EQ(r.over, over);
    EXPECT_EQ(r.allreduce, allreduce);
    EXPECT_EQ(r.in_offset, in_offset);
    EXPECT_EQ(r.out_offset, out_offset);
    EXPECT_EQ(r.count, count);
  };
  auto nnn = steps("NNN");  // DP: the whole unit over everyone
  ASSERT_EQ(nnn.size(), 1u);
  expect(nnn[0], Over::all, true, 0, 0, 104);
  // Whole gradients, sharded states: in place in the store, inside the node to my intra piece (local index 1:
  // elements 26-51, NCCL's in-place layout), then across nodes on it.
  auto nni = steps("NNI");
  ASSERT_EQ(nni.size(), 2u);
  expect(nni[0], Over::intra, false, 0, 26, 26);
  expect(nni[1], Over::inter, true, 26, 26, 26);
  auto nng = steps("NNG");  // ZeRO-1: the same, my global piece (node 1: 13 elements into the intra piece) last
  ASSERT_EQ(nng.size(), 2u);
  expect(nng[0], Over::intra, false, 0, 26, 26);
  expect(nng[1], Over::inter, false, 26, 39, 13);
  auto iig = steps("IIG");  // intra gradients: the store holds the intra piece; the step across nodes alone
  ASSERT_EQ(iig.size(), 1u);
  expect(iig[0], Over::inter, false, 0, 13, 13);
  auto nii = steps("NII");  // the same, all of the intra piece
  ASSERT_EQ(nii.size(), 1u);
  expect(nii[0], Over::inter, true, 0, 0, 26);
  EXPECT_TRUE(steps("NGG").empty());  // global gradients are final after every micro-batch
  // The optimizer reads its shard where the last reduction left it: my global piece 3 (l g + k) of the unit, my
  // intra piece, my global piece inside the intra piece the store holds, the store's own shard.
  auto optimizer_grads = [](const char* strategy) {
    const ShardPlan plan(parse_strategy(strategy), 8, 4, 2, 1, 1);
    return plan.optimizer_grads_offset(plan.shape(100));
  };
  EXPECT_EQ(optimizer_grads("NNG"), 39u);
  EXPECT_EQ(optimizer_grads("NNI"), 26u);
  EXPECT_EQ(optimizer_grads("IIG"), 13u);
  EXPECT_EQ(optimizer_grads("NII"), 0u);
  EXPECT_EQ(optimizer_grads("NGG"), 0u);
  EXPECT_EQ(optimizer_grads("NNN"), 0u);
}

TEST(ShardPlan, GathersAndPerMicroBatchReductionsFollowTheSharding) {
  // 8 ranks as 2 nodes of 4, as above: 13 elements per global piece, 26 per intra piece of the padded 104.
  using Over = ShardPlan::Over;
  auto expect = [](ShardPlan::UnitCollective call, Over over, std::size_t count) {
    EXPECT_EQ(call.over, over);
    EXPECT_EQ(call.count, count);  // with no collective: what the rank holds, the whole padded unit
  };
  auto plan = [](const char* strategy) { return ShardPlan(parse_strategy(strategy), 8, 4, 2, 1, 1); };
  const UnitShape unit = plan("NNN").shape(100);
  expect(plan("NNN").parameter_gather(unit), Over::none, 104);       // whole parameters: nothing gathered
  expect(plan("NNN").micro_batch_reduction(unit), Over::none, 104);  // whole gradients: reduced at the last alone
  expect(plan("NGG").parameter_gather(unit), Over::none, 104);
  expect(plan("NGG").micro_batch_reduction(unit), Over::pieces, 13);  // ZeRO-2: into my global piece every micro-batch
  expect(plan("GGG").parameter_gather(unit), Over::pieces, 13);       // ZeRO-3: every global piece gathered
  expect(plan("IIG").parameter_gather(unit), Over::intra, 26);        // the node's pieces: inside the node
  expect(plan("IIG").micro_batch_reduction(unit), Over::intra, 26);
  expect(plan("IIG").master_gather(unit), Over::pieces, 13);
  expect(plan("NNI").master_gather(unit), Over::intra, 26);
  expect(plan("NNN").master_gather(unit), Over::none, 104);
}

TEST(TokenSources, RowsDoNotDependOnHowTheBatchIsSplit) {
  for (auto& source : {synthetic_tokens(97, 5), repeated_sequences(97, 3, 16, 5)}) {
    const int seq = 16;
    std::vector<int32_t> whole_tokens(4 * seq), whole_targets(4 * seq), part_tokens(2 * seq), part_targets(2 * seq);
    source->rows(7, 0, 4, seq, whole_tokens.data(), whole_targets.data());
    source->rows(7, 2, 2, seq, part_tokens.data(), part_targets.data());
    EXPECT_TRUE(std::equal(part_tokens.begin(), part_tokens.end(), whole_tokens.begin() + 2 * seq));
    EXPECT_TRUE(std::equal(part_targets.begin(), part_targets.end(), whole_targets.begin() + 2 * seq));
    for (int r = 0; r < 4; ++r)
      for (int t = 0; t + 1 < seq; ++t) EXPECT_EQ(whole_tokens[r * seq + t + 1], whole_targets[r * seq + t]);
    for (int32_t token : whole_tokens) EXPECT_TRUE(token >= 0 && token < 97);
    std::vector<int32_t> next_step(4 * seq), unused(4 * seq);
    source->rows(8, 0, 4, seq, next_step.data(), unused.data());
    EXPECT_NE(next_step, whole_tokens);
  }
}

TEST(TokenSources, StreamReadsConsecutiveRowsAndChecksTheVocabulary) {
  std::vector<uint16_t> tokens(100);
  for (int i = 0; i < 100; ++i) tokens[static_cast<std::size_t>(i)] = static_cast<uint16_t>(i % 50);
  auto stream = token_stream(tokens, 50, 2, 8);
  std::vector<int32_t> t(16), y(16);
  stream->rows(1, 0, 2, 8, t.data(), y.data());  // step 1 of a 2-row batch: rows 2 and 3 of the stream
  EXPECT_EQ(t[0], 16);
  EXPECT_EQ(y[7], 24);
  EXPECT_EQ(t[8], 24);
  tokens[42] = 60;
  try {
    token_stream(tokens, 50, 2, 8);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("position 42"), std::string::npos) << e.what();
  }
  EXPECT_THROW(token_stream(std::vector<uint16_t>(5, 1), 50, 1, 8), std::invalid_argument);
}

TEST(TokenFile, ReadsLlmcFilesAndRefusesBadOnes) {
  // Named per process: two runs of the suite at once must not share it.
  const std::string path = ::testing::TempDir() + "/tokens-" + std::to_string(::getpid()) + ".bin";
  auto write = [&](int32_t magic, int32_t version, int32_t count, int actual) {
    std::ofstream out(path, std::ios::binary);
    int32_t header[256] = {magic, version, count};
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    for (int i = 0; i < actual; ++i) {
      const uint16_t token = static_cast<uint16_t>(i * 7);
      out.write(reinterpret_cast<const char*>(&token), sizeof token);
    }
  };
  write(20240520, 1, 10, 10);
  const std::vector<uint16_t> tokens = read_token_file(path);
  ASSERT_EQ(tokens.size(), 10u);
  EXPECT_EQ(tokens[9], 63);
  write(12345, 1, 10, 10);
  EXPECT_THROW(read_token_file(path), std::invalid_argument);
  write(20240520, 1, 10, 4);
  try {
    read_token_file(path);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("declares 10 tokens but holds 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_token_file(path + ".missing"), std::invalid_argument);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace strata::train
