// The GPU model's buffer layouts and shape checks (see gpt_cuda_layout.h).
#include "train/gpt_cuda_layout.h"

#include "kernels/layers_launch.h"

namespace strata::train {

namespace {
constexpr std::size_t kBf16 = 2, kFloat = 4;
}  // namespace

std::size_t RegionList::take(std::size_t bytes) {
  const std::size_t offset = end_;
  regions_.push_back({offset, bytes});
  end_ = (offset + bytes + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
  return offset;
}

GpuLayerActs::GpuLayerActs(const ModelConfig& m, std::size_t N) {
  const std::size_t C = static_cast<std::size_t>(m.hidden), Q = static_cast<std::size_t>(m.qkv_channels()),
                    KV = static_cast<std::size_t>(m.kv_heads) * static_cast<std::size_t>(m.head_dim()),
                    F = static_cast<std::size_t>(m.mlp()), NH = static_cast<std::size_t>(m.heads);
  RegionList& r = list;
  x_in = r.take(N * C * kBf16), ln1 = r.take(N * C * kBf16), ln1_mean = r.take(N * kFloat);
  ln1_rstd = r.take(N * kFloat), qkv = r.take(N * Q * kBf16);
  q = r.take(N * C * kBf16), k = r.take(N * KV * kBf16), v = r.take(N * KV * kBf16), atty = r.take(N * C * kBf16);
  lse = r.take(N * NH * kFloat);
  att_merged = r.take(N * C * kBf16), attproj = r.take(N * C * kBf16), x_mid = r.take(N * C * kBf16);
  ln2 = r.take(N * C * kBf16), ln2_mean = r.take(N * kFloat), ln2_rstd = r.take(N * kFloat);
  fch = r.take(N * F * kBf16), fch_gelu = r.take(N * F * kBf16), fcproj = r.take(N * C * kBf16);
}

GpuHeadActs::GpuHeadActs(const ModelConfig& m, std::size_t N) {
  const std::size_t C = static_cast<std::size_t>(m.hidden), V = static_cast<std::size_t>(m.vocab);
  RegionList& r = list;
  x_final = r.take(N * C * kBf16), lnf = r.take(N * C * kBf16), lnf_mean = r.take(N * kFloat);
  lnf_rstd = r.take(N * kFloat), logits = r.take(N * V * kBf16), losses = r.take(N * kFloat);
  row_stats = r.take(3 * N * kFloat);
}

GpuScratch::GpuScratch(const ModelConfig& m, int batch, int seq, attention::gpu::Impl impl) {
  const std::size_t N = static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq);
  const std::size_t C = static_cast<std::size_t>(m.hidden), Q = static_cast<std::size_t>(m.qkv_channels()),
                    KV = static_cast<std::size_t>(m.kv_heads) * static_cast<std::size_t>(m.head_dim()),
                    F = static_cast<std::size_t>(m.mlp()), NH = static_cast<std::size_t>(m.heads);
  attention_bytes = attention::gpu::workspace_bytes(attention_shape(m, batch, seq), attention::gpu::DType::bf16, impl);
  RegionList& r = list;
  d_x = r.take(N * C * kBf16), d_mid = r.take(N * C * kBf16), d_ln = r.take(N * C * kBf16);
  d_fch_gelu = r.take(N * F * kBf16), d_fch = r.take(N * F * kBf16);
  d_att_merged = r.take(N * C * kBf16), d_atty = r.take(N * C * kBf16);
  dq = r.take(N * C * kBf16), dk = r.take(N * KV * kBf16), dv = r.take(N * KV * kBf16), d_qkv = r.take(N * Q * kBf16);
  ln_partials = r.take(layers::launch::layernorm_backward_workspace_floats(N, C) * kFloat);
  discard = r.take(2 * C * kFloat);
  attention = r.take(attention_bytes);
  const bool recomputes = impl == attention::gpu::Impl::unfused;
  o_again = r.take(recomputes ? N * C * kBf16 : 0);
  lse_again = r.take(recomputes ? N * NH * kFloat : 0);
  loss_sum = r.take(sizeof(double));
}

DeviceUnitPointers DeviceUnitPointers::flat(const ParameterLayout& layout, const layers::BFloat16* params, float* grads) {
  DeviceUnitPointers u;
  for (const Slice& unit : layout.units()) {
    u.params.push_back(params + unit.offset);
    u.grads.push_back(grads ? grads + unit.offset : nullptr);
  }
  return u;
}

attention::Shape attention_shape(const ModelConfig& m, int batch, int seq) {
  return {batch, m.heads, m.kv_heads, seq, seq, m.head_dim(), true};
}

attention::gpu::Impl default_gpu_attention(const ModelConfig& m, int batch, int seq) {
  using attention::gpu::Impl;
  const bool flash = attention::gpu::validate(attention_shape(m, batch, seq), attention::gpu::DType::bf16, Impl::flash).empty();
  return flash ? Impl::flash : Impl::unfused;
}

std::string validate_gpu(const ModelConfig& m, int batch, int seq, attention::gpu::Impl impl) {
  if (std::string problem = m.validate(); !problem.empty()) return problem;
  if (batch <= 0 || seq <= 0) return "batch and sequence must be positive";
  if (seq > m.max_seq)
    return "sequence " + std::to_string(seq) + " exceeds the model's position table (" + std::to_string(m.max_seq) + ")";
  if (std::string problem = attention::gpu::validate(attention_shape(m, batch, seq), attention::gpu::DType::bf16, impl);
      !problem.empty())
    return problem;
  const ParameterLayout layout(m);
  auto misaligned = [](const Slice& s) { return s.offset % 8 != 0; };
  bool bad = misaligned(layout.wpe()) || misaligned(layout.lnf_w()) || misaligned(layout.lnf_b());
  for (int l = 0; l < m.layers && !bad; ++l)
    for (int t = 0; t < kLayerTensors; ++t) bad = bad || misaligned(layout.tensor(l, static_cast<LayerTensor>(t)));
  if (bad)
    return "the GPU model needs hidden (" + std::to_string(m.hidden) + "), qkv channels (" +
           std::to_string(m.qkv_channels()) + ") and MLP hidden (" + std::to_string(m.mlp()) +
           ") to be multiples of 8, so every bf16 parameter tensor starts on 16 bytes";
  return "";
}

}  // namespace strata::train
