// The GPT model on the CPU: parameter layout and counts of the presets, every parameter tensor's gradient
// against central finite differences of the loss, and a learnable task on which the loss really falls.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "kernels/layers.h"
#include "train/gpt.h"
#include "train/step_formulas.h"

namespace strata::train {
namespace {

uint64_t test_seed() {
  const char* text = std::getenv("STRATA_TEST_SEED");
  const uint64_t seed = text ? std::strtoull(text, nullptr, 10) : 20251123;
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::printf("[ seed     ] %llu (set STRATA_TEST_SEED to change)\n", static_cast<unsigned long long>(seed));
  return seed;
}

TEST(ModelConfig, PresetParameterCountsMatchThePublishedModels) {
  EXPECT_EQ(preset("gpt2-124m").parameters(), 124'439'808);  // llm.c's count for GPT-2 small
  EXPECT_EQ(preset("gpt2-small").parameters(), 124'439'808);
  EXPECT_NEAR(static_cast<double>(preset("gpt2-1.5b").parameters()), 1.558e9, 0.01e9);
  EXPECT_NEAR(static_cast<double>(preset("gpt3-175b").parameters()), 174.6e9, 1e9);
  EXPECT_NEAR(static_cast<double>(preset("megatron-1t").parameters()), 1.008e12, 0.01e12);
  EXPECT_THROW(preset("gpt9"), std::invalid_argument);
  ModelConfig gqa = preset("tiny");
  gqa.kv_heads = 3;
  EXPECT_NE(gqa.validate().find("kv heads"), std::string::npos);
}

TEST(ModelConfig, LayerGemmsSplitAsMegatronDoes) {
  auto gemms = layer_gemms(preset("gpt3-1.3b"), 4096, 2);
  ASSERT_EQ(gemms.size(), 4u);
  EXPECT_EQ(gemms[0].n, 3 * 2048 / 2);  // QKV column-parallel
  EXPECT_EQ(gemms[1].k, 2048 / 2);      // attention output row-parallel
  EXPECT_EQ(gemms[2].n, 4 * 2048 / 2);
  EXPECT_EQ(gemms[3].k, 4 * 2048 / 2);
  EXPECT_THROW(layer_gemms(preset("gpt2-124m"), 1024, 7), std::invalid_argument);
  // 6N + 6 L h s per token.
  const ModelConfig m = preset("gpt2-124m");
  EXPECT_DOUBLE_EQ(model_flops_per_token(m, 1024), 6.0 * 124'439'808 + 6.0 * 12 * 768 * 1024);
}

TEST(ParameterLayout, UnitsTileTheBufferInForwardOrder) {
  ModelConfig m = preset("tiny");
  m.kv_heads = 2;
  ParameterLayout layout(m);
  EXPECT_EQ(layout.total(), static_cast<std::size_t>(m.parameters()));
  std::size_t at = 0;
  for (const Slice& unit : layout.units()) {
    EXPECT_EQ(unit.offset, at);
    at = unit.end();
  }
  EXPECT_EQ(at, layout.total());
  EXPECT_EQ(layout.tensor(1, LayerTensor::fc_proj_b).end(), layout.layer(1).end());
  EXPECT_EQ(layout.tensor(0, LayerTensor::qkv_w).size, static_cast<std::size_t>((4 + 2 * 2) * 16 * 64));
}

ModelConfig small_model() {
  ModelConfig m;
  m.name = "check", m.layers = 2, m.hidden = 16, m.heads = 4, m.kv_heads = 2, m.vocab = 23, m.max_seq = 8;
  return m;
}

TEST(GptCpu, GradientsMatchFiniteDifferences) {
  const uint64_t seed = test_seed();
  const ModelConfig m = small_model();
  const int B = 2, T = 7;
  GptCpu model(m, B, T, {});
  const ParameterLayout& layout = model.layout();
  std::vector<float> params(layout.total()), grads(layout.total(), 0.0f);
  // A larger initial spread than GPT-2's, so gradients stand well above the float rounding of the loss.
  init_parameters(m, layout, params.data(), seed, 0.3f);
  std::mt19937_64 random(seed);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (auto& t : tokens) t = static_cast<int32_t>(random() % m.vocab);
  for (auto& t : targets) t = static_cast<int32_t>(random() % m.vocab);
  targets[3] = -1;  // a row that does not count
  const float normaliser = static_cast<float>(layers::counted_targets(targets.data(), targets.size()));
  model.forward(params.data(), tokens.data(), targets.data());
  model.backward(params.data(), grads.data(), normaliser);

  auto loss = [&] { return model.forward(params.data(), tokens.data(), targets.data()) / normaliser; };
  auto check = [&](Slice s, const char* what) {
    // The element of the tensor with the largest gradient, and two others.
    std::size_t largest = s.offset;
    for (std::size_t i = s.offset; i < s.end(); ++i)
      if (std::fabs(grads[i]) > std::fabs(grads[largest])) largest = i;
    for (std::size_t i : {largest, s.offset, s.offset + s.size / 2}) {
      const float saved = params[i], h = 1e-2f;
      params[i] = saved + h;
      const double up = loss();
      params[i] = saved - h;
      const double down = loss();
      params[i] = saved;
      const double numeric = (up - down) / (2.0 * h);
      EXPECT_NEAR(grads[i], numeric, 2e-3 + 0.03 * std::fabs(numeric)) << what << " element " << i - s.offset;
    }
  };
  check(layout.wte(), "wte");
  check(layout.wpe(), "wpe");
  const char* names[kLayerTensors] = {"ln1_w", "ln1_b", "qkv_w", "qkv_b", "attn_proj_w", "attn_proj_b",
                                      "ln2_w", "ln2_b", "fc_w",  "fc_b",  "fc_proj_w",  "fc_proj_b"};
  for (int l = 0; l < m.layers; ++l)
    for (int t = 0; t < kLayerTensors; ++t) check(layout.tensor(l, static_cast<LayerTensor>(t)), names[t]);
  check(layout.lnf_w(), "lnf_w");
  check(layout.lnf_b(), "lnf_b");
}

// Recomputation keeps less and computes the rest again in backward. Without dropout the recomputed activations
// equal the kept ones bit for bit, so the loss and every gradient are equal to those of keeping everything, and
// each mode holds exactly what its formula (train/step_formulas.h) says.
TEST(GptCpu, RecomputationTrainsTheSameAndHoldsWhatItsFormulaSays) {
  const uint64_t seed = test_seed();
  const ModelConfig m = small_model();
  const int B = 2, T = 7;
  const ParameterLayout layout(m);
  std::vector<float> params(layout.total());
  init_parameters(m, layout, params.data(), seed, 0.3f);
  std::mt19937_64 random(seed);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (auto& t : tokens) t = static_cast<int32_t>(random() % m.vocab);
  for (auto& t : targets) t = static_cast<int32_t>(random() % m.vocab);
  double kept_loss = 0;
  std::vector<float> kept_grads;
  std::vector<double> bytes;
  for (Recompute mode : {Recompute::none, Recompute::full, Recompute::selective}) {
    GptCpu model(m, B, T, {}, mode);
    std::vector<float> grads(layout.total(), 0.0f);
    int recomputed = 0;
    LayerHooks hooks;
    hooks.after_recompute = [&](int) { ++recomputed; };
    const double loss = model.forward(params.data(), tokens.data(), targets.data(), hooks);
    // After forward the shared space holds the last layer's activations: layer 0's backward gets its own only
    // by recomputing them.
    model.backward(params.data(), grads.data(), static_cast<float>(B * T), hooks);
    EXPECT_EQ(recomputed, mode == Recompute::none ? 0 : m.layers) << name(mode);
    EXPECT_EQ(static_cast<double>(model.activation_floats()) * 4, activation_bytes(m, B, T, mode)) << name(mode);
    bytes.push_back(activation_bytes(m, B, T, mode));
    if (mode == Recompute::none) {
      kept_loss = loss, kept_grads = grads;
      continue;
    }
    EXPECT_EQ(loss, kept_loss) << name(mode);
    int different = 0;
    for (std::size_t i = 0; i < grads.size(); ++i) different += grads[i] != kept_grads[i];
    EXPECT_EQ(different, 0) << name(mode) << ": gradients differ from keeping every activation";
  }
  EXPECT_LT(bytes[1], bytes[2]);  // full keeps the least, selective less than none
  EXPECT_LT(bytes[2], bytes[0]);
  for (const char* text : {"none", "full", "selective"}) EXPECT_STREQ(name(*parse_recompute(text)), text);
  EXPECT_FALSE(parse_recompute("overlapped").has_value());
}

// Partial training: only the last layer and the final norm train. Their gradients equal those of the full
// backward pass; the frozen units have no gradient buffers at all.
TEST(GptCpu, FrozenUnitsGetNoGradientsAndChangeNothingElse) {
  const ModelConfig m = small_model();
  GptCpu model(m, 2, 6, {});
  const ParameterLayout& layout = model.layout();
  std::vector<float> params(layout.total()), full(layout.total(), 0.0f), partial(layout.total(), 0.0f);
  init_parameters(m, layout, params.data(), 3, 0.3f);
  std::vector<int32_t> tokens(12), targets(12);
  for (int i = 0; i < 12; ++i) tokens[static_cast<std::size_t>(i)] = i % m.vocab, targets[static_cast<std::size_t>(i)] = (3 * i + 1) % m.vocab;
  model.forward(params.data(), tokens.data(), targets.data());
  model.backward(params.data(), full.data(), 12.0f);
  UnitPointers units = UnitPointers::flat(layout, params.data(), partial.data());
  for (std::size_t u = 0; u + 2 < units.grads.size(); ++u) units.grads[u] = nullptr;  // embeddings, layer 0 frozen
  model.forward(units, tokens.data(), targets.data());
  model.backward(units, 12.0f);
  const Slice trained{layout.layer(m.layers - 1).offset, layout.total() - layout.layer(m.layers - 1).offset};
  for (std::size_t i = 0; i < layout.total(); ++i) {
    if (i >= trained.offset) ASSERT_FLOAT_EQ(partial[i], full[i]) << i;
    else ASSERT_EQ(partial[i], 0.0f) << i;
  }
}

TEST(GptCpu, HooksSeeEveryUnitInOrder) {
  const ModelConfig m = small_model();
  GptCpu model(m, 1, 4, {});
  std::vector<float> params(model.layout().total()), grads(params.size(), 0.0f);
  init_parameters(m, model.layout(), params.data(), 1);
  std::vector<int32_t> tokens = {1, 2, 3, 4}, targets = {2, 3, 4, 5};
  std::vector<int> seen;
  LayerHooks hooks;
  hooks.before_forward = [&](int l) { seen.push_back(100 + l); };
  hooks.before_backward = [&](int l) { seen.push_back(200 + l); };
  hooks.after_backward = [&](int l) { seen.push_back(300 + l); };
  model.forward(params.data(), tokens.data(), targets.data(), hooks);
  model.backward(params.data(), grads.data(), 4.0f, hooks);
  const std::vector<int> expected = {99, 100, 101, 102, 202, 302, 201, 301, 200, 300, 199, 299};
  EXPECT_EQ(seen, expected);
}

// A task a model can learn: every sequence is one of four fixed random sequences, so after its first tokens
// the rest is determined.
TEST(GptCpu, LossFallsOnALearnableTask) {
  const uint64_t seed = test_seed();
  ModelConfig m = preset("tiny");
  m.vocab = 64;
  const int B = 4, T = 32, steps = 40;
  GptCpu model(m, B, T, {});
  std::vector<float> params(model.layout().total()), grads(params.size()), mom(params.size(), 0.0f), var(params.size(), 0.0f);
  init_parameters(m, model.layout(), params.data(), seed);
  std::mt19937_64 random(seed);
  std::vector<std::vector<int32_t>> patterns(4, std::vector<int32_t>(T + 1));
  for (auto& p : patterns)
    for (auto& t : p) t = static_cast<int32_t>(random() % m.vocab);
  layers::AdamWConfig adamw;
  adamw.learning_rate = 3e-3f;
  double first = 0, last = 0;
  for (int step = 1; step <= steps; ++step) {
    std::vector<int32_t> tokens, targets;
    for (int b = 0; b < B; ++b) {
      const auto& p = patterns[random() % patterns.size()];
      tokens.insert(tokens.end(), p.begin(), p.end() - 1);
      targets.insert(targets.end(), p.begin() + 1, p.end());
    }
    std::fill(grads.begin(), grads.end(), 0.0f);
    const double loss = model.forward(params.data(), tokens.data(), targets.data()) / (B * T);
    model.backward(params.data(), grads.data(), static_cast<float>(B * T));
    layers::adamw_update(params.data(), grads.data(), mom.data(), var.data(), params.size(), adamw, step, 1.0f, {});
    if (step == 1) first = loss;
    last = loss;
  }
  EXPECT_NEAR(first, std::log(static_cast<double>(m.vocab)), 0.3);  // a fresh model guesses uniformly
  EXPECT_LT(last, first / 3) << "loss " << first << " -> " << last << " in " << steps << " steps";
}

}  // namespace
}  // namespace strata::train
