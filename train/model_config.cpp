// Implementation of the model configuration (see model_config.h).
#include "train/model_config.h"

#include <algorithm>
#include <stdexcept>

namespace strata::train {

namespace {

struct Preset {
  const char* name;
  const char* alias;  // the name strata-gemm used before, or ""
  int layers, hidden, heads, vocab, max_seq;
};

// Vocabularies: GPT-2's 50257; Megatron-LM pads it to 51200. Sequences: GPT-2 1024, GPT-3 and Megatron 2048.
constexpr Preset kPresets[] = {
    {"tiny", "", 2, 64, 4, 256, 64},
    {"gpt2-124m", "gpt2-small", 12, 768, 12, 50257, 1024},
    {"gpt2-350m", "gpt2-medium", 24, 1024, 16, 50257, 1024},
    {"gpt2-774m", "gpt2-large", 36, 1280, 20, 50257, 1024},
    {"gpt2-1.5b", "gpt2-xl", 48, 1600, 25, 50257, 1024},
    {"gpt3-1.3b", "", 24, 2048, 16, 50257, 2048},
    {"gpt3-2.7b", "", 32, 2560, 32, 50257, 2048},
    {"gpt3-6.7b", "", 32, 4096, 32, 50257, 2048},
    {"gpt3-13b", "", 40, 5120, 40, 50257, 2048},
    {"gpt3-175b", "", 96, 12288, 96, 50257, 2048},
    {"megatron-22b", "", 48, 6144, 64, 51200, 2048},
    {"megatron-175b", "", 96, 12288, 96, 51200, 2048},
    {"megatron-530b", "", 105, 20480, 128, 51200, 2048},
    {"megatron-1t", "", 128, 25600, 160, 51200, 2048},
};

}  // namespace

int64_t ModelConfig::parameters_per_layer() const {
  const int64_t h = hidden, q = qkv_channels(), f = mlp();
  // Two layer norms (weight, bias), QKV and attention output, MLP up and down, each with a bias.
  return 2 * 2 * h + (q * h + q) + (h * h + h) + (f * h + f) + (h * f + h);
}

int64_t ModelConfig::embedding_parameters() const {
  return static_cast<int64_t>(vocab) * hidden + static_cast<int64_t>(max_seq) * hidden;
}

int64_t ModelConfig::parameters() const {
  return embedding_parameters() + layers * parameters_per_layer() + 2 * static_cast<int64_t>(hidden);
}

std::string ModelConfig::validate() const {
  if (layers <= 0 || hidden <= 0 || heads <= 0 || kv_heads <= 0 || vocab <= 0 || max_seq <= 0 || mlp_hidden < 0)
    return "model sizes must be positive (layers " + std::to_string(layers) + ", hidden " + std::to_string(hidden) +
           ", heads " + std::to_string(heads) + ", kv heads " + std::to_string(kv_heads) + ", vocabulary " +
           std::to_string(vocab) + ", sequence " + std::to_string(max_seq) + ")";
  if (hidden % heads != 0)
    return "heads (" + std::to_string(heads) + ") must divide the hidden size (" + std::to_string(hidden) + ")";
  if (heads % kv_heads != 0)
    return "kv heads (" + std::to_string(kv_heads) + ") must divide the heads (" + std::to_string(heads) + ")";
  return "";
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

ModelConfig preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name || (*p.alias && name == p.alias)) {
      ModelConfig m;
      m.name = p.name;
      m.layers = p.layers, m.hidden = p.hidden, m.heads = p.heads, m.kv_heads = p.heads;
      m.vocab = p.vocab, m.max_seq = p.max_seq;
      return m;
    }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown preset '" + name + "' (known: " + known + ")");
}

std::vector<LayerGemm> layer_gemms(const ModelConfig& m, int64_t tokens, int tp) {
  if (tokens <= 0) throw std::invalid_argument("tokens must be positive");
  if (tp <= 0) throw std::invalid_argument("the tensor-parallel degree must be positive");
  const int64_t h = m.hidden, q = m.qkv_channels(), f = m.mlp();
  if (m.heads % tp || m.kv_heads % tp || f % tp)
    throw std::invalid_argument("tensor-parallel degree " + std::to_string(tp) + " does not divide the layers of " +
                                m.name + " (" + std::to_string(m.heads) + " heads, " + std::to_string(m.kv_heads) +
                                " kv heads, MLP " + std::to_string(f) + ")");
  return {{"qkv", tokens, q / tp, h}, {"attn_out", tokens, h, h / tp}, {"mlp_up", tokens, f / tp, h}, {"mlp_down", tokens, h, f / tp}};
}

TensorShard tensor_shard(const ModelConfig& m, int tp, int rank) {
  if (tp <= 0 || rank < 0 || rank >= tp)
    throw std::invalid_argument("tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(tp));
  if (m.heads % tp || m.kv_heads % tp || m.mlp() % tp)
    throw std::invalid_argument("tensor-parallel degree " + std::to_string(tp) + " does not divide the layers of " +
                                m.name + " (" + std::to_string(m.heads) + " heads, " + std::to_string(m.kv_heads) +
                                " kv heads, MLP " + std::to_string(m.mlp()) + ")");
  TensorShard s;
  s.tp = tp, s.rank = rank;
  s.heads = m.heads / tp, s.kv_heads = m.kv_heads / tp, s.mlp = m.mlp() / tp;
  s.vocab_rows = (m.vocab + tp - 1) / tp;
  s.vocab_begin = rank * s.vocab_rows;
  s.vocab_width = std::min(s.vocab_rows, m.vocab - s.vocab_begin);
  if ((tp - 1) * s.vocab_rows >= m.vocab)
    throw std::invalid_argument("a vocabulary of " + std::to_string(m.vocab) + " leaves a tensor-parallel rank of " +
                                std::to_string(tp) + " without tokens");
  return s;
}

double model_flops_per_token(const ModelConfig& m, int seq) {
  return 6.0 * static_cast<double>(m.parameters()) + 6.0 * m.layers * static_cast<double>(m.hidden) * seq;
}

}  // namespace strata::train
