// A GPT-style decoder's shape, the presets users know it by, and what follows from the shape: parameter
// count, the GEMMs of one layer, and the model FLOPs a step is held to (MFU).
//
// Symbols as in docs/metrics.md: L layers, h hidden (C), a heads, V vocabulary, s sequence; MLP hidden 4h unless
// set. Grouped-query attention: kv_heads divides heads, and the QKV projection is (heads + 2 kv_heads) * d.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::train {

struct ModelConfig {
  std::string name = "custom";
  int layers = 12;
  int hidden = 768;
  int heads = 12;
  int kv_heads = 12;
  int vocab = 50257;
  int max_seq = 1024;  // rows of the learned position table: the longest sequence the model takes
  int mlp_hidden = 0;  // 0: 4 * hidden

  int head_dim() const { return hidden / heads; }
  int mlp() const { return mlp_hidden > 0 ? mlp_hidden : 4 * hidden; }
  int qkv_channels() const { return (heads + 2 * kv_heads) * head_dim(); }
  int64_t parameters_per_layer() const;
  int64_t embedding_parameters() const;  // token table V x h (tied to the LM head) and position table
  int64_t parameters() const;            // every parameter, the tied head counted once
  // "" when usable, otherwise the first problem (sizes positive, heads divides hidden, kv_heads divides heads).
  std::string validate() const;
};

// GPT-2 (Radford et al. 2019; 124M is llm.c's reference), GPT-3 (Brown et al. 2020, heads chosen for a head
// dimension of 128 as Megatron-LM's configurations do where the paper's table is inconsistent) and the
// Megatron-LM shapes of Korthikanti et al. 2022, plus "tiny" for tests. Older names (gpt2-small, ...) are
// accepted too.
std::vector<std::string> preset_names();
// Throws std::invalid_argument naming the known presets.
ModelConfig preset(const std::string& name);

// The four linear GEMMs of one transformer layer for `tokens` tokens, with tensor parallelism `tp` splitting
// them as Megatron-LM does (column-parallel QKV and MLP up, row-parallel attention output and MLP down):
// C (M, N) = A (M, K) W (N, K)^T with M = tokens. Throws std::invalid_argument when tp does not divide them.
struct LayerGemm {
  std::string name;  // "qkv", "attn_out", "mlp_up", "mlp_down"
  int64_t m = 0, n = 0, k = 0;
};
std::vector<LayerGemm> layer_gemms(const ModelConfig& model, int64_t tokens, int tp);

// One tensor-parallel rank's share of the model, as Megatron-LM cuts it: heads, kv heads and the MLP width
// divided by tp (column-parallel QKV and MLP up, row-parallel attention output and MLP down), the token table
// (and the tied LM head) cut into tp vocabulary slices of ceil(V / tp) rows, the last holding what is left;
// norms, biases of the row-parallel layers and the position table whole on every rank.
struct TensorShard {
  int tp = 1, rank = 0;
  int heads = 0, kv_heads = 0, mlp = 0;
  int vocab_rows = 0;   // rows of the token table held here: ceil(V / tp)
  int vocab_begin = 0;  // global index of the first
  int vocab_width = 0;  // rows of them inside the vocabulary (the last slice's may be fewer)
  int attention_channels(const ModelConfig& m) const { return heads * m.head_dim(); }
  int kv_channels(const ModelConfig& m) const { return kv_heads * m.head_dim(); }
  int qkv_channels(const ModelConfig& m) const { return (heads + 2 * kv_heads) * m.head_dim(); }
};
// Throws std::invalid_argument naming what tp does not divide (heads, kv heads, MLP width) or a vocabulary
// too small to give every rank a slice.
TensorShard tensor_shard(const ModelConfig& model, int tp, int rank);

// Model FLOPs per token of a training step without recomputation: 6 N + 6 L h s (llm.c's count; causal
// attention counted as half of 12 L h s). The MFU numerator.
double model_flops_per_token(const ModelConfig& model, int seq);

}  // namespace strata::train
