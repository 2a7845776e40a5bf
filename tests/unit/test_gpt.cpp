// The GPT model on the CPU: parameter layout and counts of the presets, every parameter tensor's gradient
// against central finite differences of the loss, and a learnable task on which the loss really falls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <cstdlib>
#include <random>

#include "kernels/cpu_features.h"
#include "kernels/cpu_gemm.h"
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

// Parameters of `m` with a larger spread than GPT-2's (gradients stand well above the loss's rounding) and `rows`
// random tokens and targets, all from `seed`.
struct Problem {
  std::vector<float> params;
  std::vector<int32_t> tokens, targets;
};
Problem random_problem(const ModelConfig& m, int rows, uint64_t seed) {
  Problem p;
  p.params.resize(ParameterLayout(m).total());
  init_parameters(m, ParameterLayout(m), p.params.data(), seed, 0.3f);
  std::mt19937_64 random(seed);
  p.tokens.resize(static_cast<std::size_t>(rows)), p.targets.resize(static_cast<std::size_t>(rows));
  for (auto& t : p.tokens) t = static_cast<int32_t>(random() % m.vocab);
  for (auto& t : p.targets) t = static_cast<int32_t>(random() % m.vocab);
  return p;
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
  const auto [params, tokens, targets] = random_problem(m, B * T, seed);
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

// The linear layers' GEMMs in bf16 (operands rounded to bf16, sums in fp32) against the fp32 model on the same
// parameters and tokens. Tolerance, derived as test_gpt_cuda.cpp derives the GPU step's: each rounding to bf16 is
// off by at most u = 2^-8 relative (8 significant bits); the forward path rounds k = 8 L + 2 tensors (per layer
// the four GEMMs' inputs and weights, then the final norm's output and the token table) and backward as many
// gradients; independent roundings add up as a random walk, sqrt(k) u. The loss moves far less than its logits
// (under 0.1 of an operand perturbation) and each parameter gradient at most about 4.3 times it (relative L2 of
// the tensor), so the loss is held to sqrt(k) u and each gradient tensor to 8 sqrt(k) u: for L = 2 (k = 18),
// 1.7 % and 13 %. A wrong transpose, leading dimension or beta moves them by order one. Both the reference
// rounding (any CPU) and oneDNN's bf16 kernels (where the CPU has them) are held to it.
TEST(GptCpu, Bf16GemmsStayWithinTheirRoundingOfTheFp32Model) {
  const uint64_t seed = test_seed();
  const ModelConfig m = small_model();
  const int B = 2, T = 7;
  const ParameterLayout layout(m);
  const auto [params, tokens, targets] = random_problem(m, B * T, seed);
  auto run = [&](cpu_gemm::Math math, std::vector<float>& grads) {
    GptCpu model(m, B, T, {math.library, 1, nullptr, math.precision});
    grads.assign(layout.total(), 0.0f);
    const double loss = model.forward(params.data(), tokens.data(), targets.data());
    model.backward(params.data(), grads.data(), static_cast<float>(B * T));
    return loss;
  };
  std::vector<float> want;
  const double want_loss = run({cpu_gemm::Backend::openblas}, want);
  const double u = 0x1.0p-8, k = 8 * m.layers + 2;
  std::vector<cpu_gemm::Math> maths = {{cpu_gemm::Backend::openblas, cpu_gemm::Precision::bf16_rounded}};
  if (cpu_gemm::bf16_refusal(detect_cpu_features()).empty()) maths.push_back({cpu_gemm::Backend::onednn, cpu_gemm::Precision::bf16});
  else std::printf("[ skipped  ] oneDNN bf16: %s\n", cpu_gemm::bf16_refusal(detect_cpu_features()).c_str());
  for (const cpu_gemm::Math& math : maths) {
    const std::string what = cpu_gemm::name(math.precision);
    std::vector<float> got;
    const double loss = run(math, got);
    EXPECT_NE(loss, want_loss) << what << ": the GEMMs were not rounded to bf16";
    EXPECT_NEAR(loss, want_loss, std::sqrt(k) * u * want_loss) << what;
    std::vector<Slice> tensors = {layout.wte(), layout.wpe(), layout.lnf_w(), layout.lnf_b()};
    for (int l = 0; l < m.layers; ++l)
      for (int t = 0; t < kLayerTensors; ++t) tensors.push_back(layout.tensor(l, static_cast<LayerTensor>(t)));
    double worst = 0;
    for (const Slice& tensor : tensors) {
      double diff = 0, norm = 0;
      for (std::size_t i = tensor.offset; i < tensor.end(); ++i) {
        diff += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
        norm += static_cast<double>(want[i]) * want[i];
      }
      ASSERT_GT(norm, 0) << what << " tensor at " << tensor.offset;
      worst = std::max(worst, std::sqrt(diff / norm));
      EXPECT_LE(std::sqrt(diff / norm), 8 * std::sqrt(k) * u) << what << " gradient tensor at " << tensor.offset;
    }
    std::printf("[ bf16     ] %s: loss %.3g relative to fp32 (bound %.3g), worst gradient tensor %.3g (bound %.3g)\n",
                what.c_str(), std::abs(loss - want_loss) / want_loss, std::sqrt(k) * u, worst, 8 * std::sqrt(k) * u);
  }
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

// Pipeline stages chained by hand: the model cut into stages (embeddings on the first, the head with its own copy
// of the token table on the last), two micro-batches in flight (both forwards, then both backwards, as GPipe
// runs them), activations and gradients handed from stage to stage. Every loss equals the whole model's bit for
// bit (the same kernels on the same rows); every gradient too, but the token table's, which the stages sum in
// another order (the head's and the lookup's parts apart, then added). In every recomputation mode, and under
// overlap with every op recomputed ahead of its backward, on demand, or kept.
TEST(GptCpu, StagesChainedAreTheWholeModel) {
  const uint64_t seed = test_seed();
  ModelConfig m = small_model();
  m.layers = 4;
  const int B = 2, T = 7, micro = 2;
  const ParameterLayout layout(m);
  std::vector<float> params(layout.total());
  init_parameters(m, layout, params.data(), seed, 0.3f);
  std::mt19937_64 random(seed);
  std::vector<std::vector<int32_t>> tokens(micro, std::vector<int32_t>(B * T)), targets = tokens;
  for (int i = 0; i < micro; ++i) {
    for (auto& t : tokens[static_cast<std::size_t>(i)]) t = static_cast<int32_t>(random() % m.vocab);
    for (auto& t : targets[static_cast<std::size_t>(i)]) t = static_cast<int32_t>(random() % m.vocab);
  }
  const float normaliser = static_cast<float>(micro * B * T);
  GptCpu whole(m, B, T, {});
  std::vector<float> want(layout.total(), 0.0f);
  std::vector<double> want_loss;
  for (int i = 0; i < micro; ++i) {
    want_loss.push_back(whole.forward(params.data(), tokens[static_cast<std::size_t>(i)].data(), targets[static_cast<std::size_t>(i)].data()));
    whole.backward(params.data(), want.data(), normaliser);
  }
  const std::size_t R = static_cast<std::size_t>(B * T), C = static_cast<std::size_t>(m.hidden);
  // Overlap's decisions: layer l keeps op o when (l + o) % 3 == 0, so every pattern of producers shows up.
  auto overlap_kept = [](int first, int layers) {
    std::vector<KeptOps> kept;
    for (int l = first; l < first + layers; ++l) kept.push_back({(l + 0) % 3 == 0, (l + 1) % 3 == 0, (l + 2) % 3 == 0});
    return kept;
  };
  const std::vector<std::pair<int, int>> cuts = {{0, 1}, {1, 2}, {3, 1}};  // (first layer, layers) per stage
  for (Recompute mode : {Recompute::none, Recompute::full, Recompute::selective, Recompute::overlap})
    for (bool ahead : {false, true}) {
      if (ahead && mode != Recompute::overlap) continue;
      std::vector<std::unique_ptr<GptCpu>> stages;
      for (std::size_t k = 0; k < cuts.size(); ++k) {
        StagePlan plan{cuts[k].first, cuts[k].second, k == 0, k + 1 == cuts.size(), micro, {}};
        if (mode == Recompute::overlap) plan.kept = overlap_kept(cuts[k].first, cuts[k].second);
        stages.push_back(std::make_unique<GptCpu>(m, B, T, CpuRuntime{}, mode, nullptr, false, plan));
      }
      // Every stage has its own gradients; the last one's token table is the head's copy.
      std::vector<std::vector<float>> grads(stages.size(), std::vector<float>(layout.total(), 0.0f));
      std::vector<UnitPointers> units;
      for (auto& g : grads) units.push_back(UnitPointers::flat(layout, params.data(), g.data()));
      const std::string what = std::string(name(mode)) + (ahead ? " recomputed ahead" : "");
      for (int i = 0; i < micro; ++i) {
        const std::size_t mb = static_cast<std::size_t>(i);
        double loss = 0;
        for (std::size_t k = 0; k < stages.size(); ++k) {
          if (k > 0) std::copy(stages[k - 1]->stage_output(i), stages[k - 1]->stage_output(i) + R * C, stages[k]->stage_input(i));
          loss = stages[k]->forward(i, units[k], tokens[mb].data(), targets[mb].data());
        }
        EXPECT_EQ(loss, want_loss[mb]) << what << " micro-batch " << i;
      }
      for (int i = 0; i < micro; ++i) {
        std::vector<float> d_out;
        for (std::size_t k = stages.size(); k-- > 0;) {
          GptCpu& stage = *stages[k];
          if (ahead)  // every op not kept, recomputed before the backward that needs it, producers first
            for (int l = stage.first_layer(); l < stage.end_layer(); ++l)
              for (LayerOp op : {LayerOp::pre, LayerOp::core, LayerOp::post})
                if (!stage.kept(l, op)) stage.recompute(i, l, op, units[k]);
          stage.backward(i, units[k], normaliser, k + 1 < stages.size() ? d_out.data() : nullptr, k > 0);
          if (k > 0) d_out.assign(stage.input_grad(), stage.input_grad() + R * C);
        }
      }
      std::vector<float> got(layout.total(), 0.0f);
      for (auto& g : grads)
        for (std::size_t j = 0; j < got.size(); ++j) got[j] += g[j];
      for (std::size_t j = 0; j < got.size(); ++j) {
        if (j < layout.wte().end()) ASSERT_NEAR(got[j], want[j], 1e-6f + 1e-5f * std::fabs(want[j])) << what << " wte " << j;
        else ASSERT_EQ(got[j], want[j]) << what << " parameter " << j;
      }
      for (std::size_t k = 0; k < stages.size(); ++k) {
        StagePlan plan{cuts[k].first, cuts[k].second, k == 0, k + 1 == cuts.size(), micro, {}};
        if (mode == Recompute::overlap) plan.kept = overlap_kept(cuts[k].first, cuts[k].second);
        EXPECT_EQ(4.0 * static_cast<double>(stages[k]->activation_floats()), activation_bytes(m, B, T, mode, 1, false, plan))
            << what << " stage " << k;
      }
    }
  // A producer not yet recomputed, a kept op, and a stage outside the model are refused.
  StagePlan plan{1, 2, false, false, 1, overlap_kept(1, 2)};
  GptCpu stage(m, B, T, {}, Recompute::overlap, nullptr, false, plan);
  const UnitPointers u = UnitPointers::flat(layout, params.data(), nullptr);
  EXPECT_THROW(stage.recompute(0, 1, LayerOp::core, u), std::logic_error);  // layer 1 recomputes pre, not yet
  EXPECT_THROW(stage.recompute(0, 2, LayerOp::core, u), std::logic_error);  // (2 + 1) % 3: layer 2 keeps core
  EXPECT_THROW(GptCpu(m, B, T, {}, Recompute::none, nullptr, false, StagePlan{3, 2, false, true, 1, {}}), std::invalid_argument);
  EXPECT_THROW(GptCpu(m, B, T, {}, Recompute::overlap, nullptr, false, StagePlan{0, 2, true, false, 1, {}}), std::invalid_argument);
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
