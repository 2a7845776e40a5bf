// The host side of the GPU model, on the CPU build: the device buffers' regions (aligned, disjoint, of the sizes
// the kernels read), the per-unit device pointers, the shapes the GPU path takes and the device memory figures.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/attention_cuda.h"
#include "kernels/layers_launch.h"
#include "train/gpt.h"
#include "train/gpt_cuda_layout.h"
#include "train/memory.h"

namespace strata::train {
namespace {

using attention::gpu::Impl;

// Every region on the device alignment, in order, none overlapping the next, all inside the buffer.
void expect_tiled(const RegionList& list, const std::string& what) {
  const std::vector<Region>& r = list.regions();
  ASSERT_FALSE(r.empty()) << what;
  for (std::size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i].offset % kDeviceAlignment, 0u) << what << " region " << i;
    if (i + 1 < r.size()) {
      EXPECT_LE(r[i].offset + r[i].bytes, r[i + 1].offset) << what << " region " << i;
    }
  }
  EXPECT_LE(r.back().offset + r.back().bytes, list.size()) << what;
  EXPECT_EQ(list.size() % kDeviceAlignment, 0u) << what;  // so layer after layer stays aligned
}

// The bytes of the region at `offset` (the last one there: empty regions share the next one's offset).
std::size_t bytes_at(const RegionList& list, std::size_t offset) {
  const auto& r = list.regions();
  const auto found = std::find_if(r.rbegin(), r.rend(), [offset](const Region& x) { return x.offset == offset; });
  if (found == r.rend()) ADD_FAILURE() << "no region at " << offset;
  return found == r.rend() ? 0 : found->bytes;
}

TEST(RegionList, AlignsEachRegionAndKeepsEmptyOnes) {
  RegionList list;
  EXPECT_EQ(list.take(10), 0u);
  EXPECT_EQ(list.take(0), 256u);
  EXPECT_EQ(list.take(256), 256u);  // an empty region takes no room
  EXPECT_EQ(list.take(1), 512u);
  EXPECT_EQ(list.size(), 768u);
  ASSERT_EQ(list.regions().size(), 4u);
  EXPECT_EQ(list.regions()[0].bytes, 10u);
}

TEST(GpuLayout, ActivationsAndScratchHoldWhatTheKernelsRead) {
  for (const std::string name : {"tiny", "gpt2-124m"}) {
    ModelConfig m = preset(name);
    if (name == "tiny") m.kv_heads = 2;  // grouped-query: k and v smaller than q
    const int B = 3, T = 40;
    const std::size_t N = static_cast<std::size_t>(B) * T, C = static_cast<std::size_t>(m.hidden);
    const std::size_t KV = static_cast<std::size_t>(m.kv_heads * m.head_dim());
    const GpuLayerActs a(m, N);
    expect_tiled(a.list, name + " layer");
    EXPECT_EQ(a.list.regions().size(), 19u);
    EXPECT_EQ(bytes_at(a.list, a.qkv), N * static_cast<std::size_t>(m.qkv_channels()) * 2);
    EXPECT_EQ(bytes_at(a.list, a.k), N * KV * 2);
    EXPECT_EQ(bytes_at(a.list, a.lse), N * static_cast<std::size_t>(m.heads) * 4);
    EXPECT_EQ(bytes_at(a.list, a.fch_gelu), N * static_cast<std::size_t>(m.mlp()) * 2);
    EXPECT_EQ(bytes_at(a.list, a.ln2_rstd), N * 4);
    EXPECT_EQ(bytes_at(a.list, a.fcproj), N * C * 2);

    const GpuHeadActs h(m, N);
    expect_tiled(h.list, name + " head");
    EXPECT_EQ(bytes_at(h.list, h.logits), N * static_cast<std::size_t>(m.vocab) * 2);
    EXPECT_EQ(bytes_at(h.list, h.row_stats), 3 * N * 4);

    for (Impl impl : {Impl::flash, Impl::unfused}) {
      const GpuScratch s(m, B, T, impl);
      expect_tiled(s.list, name + " scratch " + attention::gpu::name(impl));
      const std::size_t attention_bytes =
          attention::gpu::workspace_bytes(attention_shape(m, B, T), attention::gpu::DType::bf16, impl);
      EXPECT_EQ(s.attention_bytes, attention_bytes);
      EXPECT_EQ(bytes_at(s.list, s.attention), attention_bytes);
      EXPECT_EQ(bytes_at(s.list, s.ln_partials), layers::launch::layernorm_backward_workspace_floats(N, C) * 4);
      EXPECT_EQ(bytes_at(s.list, s.discard), 2 * C * 4);
      EXPECT_EQ(bytes_at(s.list, s.dv), N * KV * 2);
      EXPECT_EQ(bytes_at(s.list, s.loss_sum), sizeof(double));
      // Only the unfused attention recomputes its forward in the backward pass; flash's regions take no room.
      if (impl == Impl::unfused) {
        EXPECT_EQ(bytes_at(s.list, s.o_again), N * C * 2);
        EXPECT_EQ(bytes_at(s.list, s.lse_again), N * static_cast<std::size_t>(m.heads) * 4);
      } else {
        EXPECT_EQ(s.o_again, s.loss_sum);
        EXPECT_EQ(s.lse_again, s.loss_sum);
      }
    }
  }
}

TEST(GpuLayout, UnitPointersStartWhereTheLayoutsUnitsDo) {
  const ModelConfig m = preset("tiny");
  const ParameterLayout layout(m);
  std::vector<layers::BFloat16> params(layout.total());
  std::vector<float> grads(layout.total());
  const DeviceUnitPointers u = DeviceUnitPointers::flat(layout, params.data(), grads.data());
  const std::vector<Slice> units = layout.units();
  ASSERT_EQ(u.params.size(), units.size());
  ASSERT_EQ(u.grads.size(), units.size());
  for (std::size_t i = 0; i < units.size(); ++i) {
    EXPECT_EQ(u.params[i], params.data() + units[i].offset) << i;
    EXPECT_EQ(u.grads[i], grads.data() + units[i].offset) << i;
  }
  const DeviceUnitPointers frozen = DeviceUnitPointers::flat(layout, params.data(), nullptr);
  EXPECT_TRUE(std::all_of(frozen.grads.begin(), frozen.grads.end(), [](float* g) { return g == nullptr; }));
}

TEST(GpuLayout, TheGpuPathTakesShapesItCanRun) {
  const ModelConfig tiny = preset("tiny");  // head dimension 16: flash does not take it
  EXPECT_EQ(default_gpu_attention(tiny, 2, 32), Impl::unfused);
  EXPECT_EQ(default_gpu_attention(preset("gpt2-124m"), 4, 1024), Impl::flash);
  EXPECT_EQ(validate_gpu(tiny, 2, 32, Impl::unfused), "");
  EXPECT_NE(validate_gpu(tiny, 2, 32, Impl::flash).find("head_dim"), std::string::npos);
  EXPECT_NE(validate_gpu(tiny, 2, tiny.max_seq + 1, Impl::unfused).find("position table"), std::string::npos);
  EXPECT_NE(validate_gpu(tiny, 0, 32, Impl::unfused).find("positive"), std::string::npos);
  ModelConfig odd = tiny;
  odd.hidden = 60, odd.heads = 4, odd.kv_heads = 4;  // 60 channels: a bf16 tensor off 16 bytes
  EXPECT_NE(validate_gpu(odd, 2, 32, Impl::unfused).find("multiples of 8"), std::string::npos);
  ModelConfig mlp = tiny;
  mlp.mlp_hidden = 100;
  EXPECT_NE(validate_gpu(mlp, 2, 32, Impl::unfused).find("multiples of 8"), std::string::npos);
  ModelConfig bad = tiny;
  bad.kv_heads = 3;
  EXPECT_FALSE(validate_gpu(bad, 2, 32, Impl::unfused).empty());
}

TEST(DeviceMemory, CountedApartFromHostMemory) {
  const MemoryFigures host = memory_current();
  const MemoryFigures before = device_memory_current();
  detail::count_device_allocation(MemoryCategory::activations, 1000);
  detail::count_device_allocation(MemoryCategory::activations, 500);
  EXPECT_EQ(device_memory_current()[MemoryCategory::activations] - before[MemoryCategory::activations], 1500.0);
  EXPECT_GE(device_memory_peak()[MemoryCategory::activations], device_memory_current()[MemoryCategory::activations]);
  detail::count_device_free(MemoryCategory::activations, 1000);
  EXPECT_EQ(device_memory_current()[MemoryCategory::activations] - before[MemoryCategory::activations], 500.0);
  EXPECT_GE(device_memory_peak()[MemoryCategory::activations] - before[MemoryCategory::activations], 1500.0);
  reset_device_memory_peaks();
  EXPECT_EQ(device_memory_peak()[MemoryCategory::activations], device_memory_current()[MemoryCategory::activations]);
  detail::count_device_free(MemoryCategory::activations, 500);
  EXPECT_EQ(device_memory_current().total(), before.total());
  EXPECT_EQ(memory_current().total(), host.total());  // the host figures never saw any of it
}

}  // namespace
}  // namespace strata::train
