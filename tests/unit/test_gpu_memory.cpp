// A 16-bit GPU step's memory (train/gpu_memory.h) against Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models", arXiv 2205.05198): Table 2's activations per layer and Section 4.3's
// first pipeline stage at Table 3's four configurations (22B, 175B, 530B, 1T on A100s; the figures Figure 7 sets
// against the tensor-parallel baseline), each model fitting 80 GB with sequence parallelism and selective or full
// recomputation, and the baseline of the two largest not fitting (the paper's reason for the techniques).
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "train/gpu_memory.h"
#include "train/step_formulas.h"

namespace strata::train {
namespace {

// Table 3: the paper's configurations (sequence 2048, vocabulary 51200, tensor parallelism 8), micro-batch and
// global batch of Table 5's runs; 175B and 530B interleaved with 3 chunks per rank.
struct PaperModel {
  std::string name;
  int heads, hidden, layers, pp, chunks, micro_batch, global_batch;
};
const std::vector<PaperModel>& paper_models() {
  static const std::vector<PaperModel> models = {{"22B", 64, 6144, 48, 1, 1, 4, 4},
                                                 {"175B", 96, 12288, 96, 8, 3, 1, 64},
                                                 {"530B", 128, 20480, 105, 35, 3, 1, 280},
                                                 {"1T", 160, 25600, 128, 64, 1, 1, 512}};
  return models;
}
constexpr int kSeq = 2048, kTp = 8;

ModelConfig model_of(const PaperModel& p) {
  ModelConfig m;
  m.name = p.name, m.layers = p.layers, m.hidden = p.hidden, m.heads = p.heads, m.kv_heads = p.heads;
  m.vocab = 51200, m.max_seq = kSeq;
  return m;
}

TrainConfig config_of(const PaperModel& p, Recompute recompute, bool sp) {
  TrainConfig c;
  c.model = model_of(p);
  c.seq = kSeq, c.micro_batch = p.micro_batch, c.accumulation = p.global_batch / p.micro_batch;
  c.schedule = p.chunks > 1 ? Schedule::interleaved : Schedule::one_f_one_b, c.virtual_stages = p.chunks;
  c.recompute = recompute, c.sequence_parallel = sp;
  return c;
}

// The paper's layout: materialised scores (its models predate fused attention), dropout masks, 2-byte elements.
const GpuLayout kPaper{2, false, true};

// The tiny model sharded over four ranks of one node, two micro-batches of two sequences.
TrainConfig tiny_config(const std::string& strategy) {
  TrainConfig c;
  c.model = preset("tiny");
  c.seq = 32, c.micro_batch = 2, c.accumulation = 2;
  c.strategy = parse_strategy(strategy);
  return c;
}
DataParallelShape four_ranks() {
  DataParallelShape shape;
  shape.n = 4, shape.m = 4, shape.g = 1;
  return shape;
}

TEST(GpuMemory, OneLayerIsTable2) {
  for (const PaperModel& p : paper_models()) {
    const double s = kSeq, b = p.micro_batch, h = p.hidden, a = p.heads, t = kTp, sbh = s * b * h;
    const ModelConfig m = model_of(p);
    // No parallelism: sbh (34 + 5 as/h).
    EXPECT_DOUBLE_EQ(gpu_activation_bytes(m, p.micro_batch, kSeq, 1, false, kPaper).layer(), sbh * (34 + 5 * a * s / h)) << p.name;
    // Tensor parallelism: sbh (10 + 24/t + 5 as/(ht)).
    const GpuActivationBytes tp = gpu_activation_bytes(m, p.micro_batch, kSeq, kTp, false, kPaper);
    EXPECT_DOUBLE_EQ(tp.layer(), sbh * (10 + 24 / t + 5 * a * s / (h * t))) << p.name;
    // ... with sequence parallelism: sbh/t (34 + 5 as/h).
    const GpuActivationBytes sp = gpu_activation_bytes(m, p.micro_batch, kSeq, kTp, true, kPaper);
    EXPECT_DOUBLE_EQ(sp.layer(), sbh / t * (34 + 5 * a * s / h)) << p.name;
    // Selective recomputation: sbh (10 + 24/t); with sequence parallelism sbh 34/t.
    EXPECT_DOUBLE_EQ(gpu_layer_kept_bytes(tp, Recompute::selective), sbh * (10 + 24 / t)) << p.name;
    EXPECT_DOUBLE_EQ(gpu_layer_kept_bytes(sp, Recompute::selective), sbh * 34 / t) << p.name;
    // Full recomputation: the layer's input, 2 sbh.
    EXPECT_DOUBLE_EQ(gpu_layer_kept_bytes(tp, Recompute::full), 2 * sbh) << p.name;
    EXPECT_DOUBLE_EQ(gpu_layer_kept_bytes(tp, Recompute::none), tp.layer()) << p.name;
  }
  // The figures themselves, as fractions of the tensor-parallel baseline (Figure 7: each technique about halves it,
  // both together are a 5x reduction, full recomputation about a tenth): 22B, 175B, 530B, 1T.
  const double both[] = {0.161, 0.185, 0.202, 0.202}, sp_only[] = {0.668, 0.620, 0.583, 0.583},
               selective_only[] = {0.494, 0.565, 0.619, 0.619}, full[] = {0.076, 0.087, 0.095, 0.095};
  for (std::size_t i = 0; i < paper_models().size(); ++i) {
    const PaperModel& p = paper_models()[i];
    const ModelConfig m = model_of(p);
    const GpuActivationBytes tp = gpu_activation_bytes(m, p.micro_batch, kSeq, kTp, false, kPaper);
    const GpuActivationBytes sp = gpu_activation_bytes(m, p.micro_batch, kSeq, kTp, true, kPaper);
    const double baseline = tp.layer();
    EXPECT_NEAR(gpu_layer_kept_bytes(sp, Recompute::selective) / baseline, both[i], 0.0005) << p.name;
    EXPECT_NEAR(sp.layer() / baseline, sp_only[i], 0.0005) << p.name;
    EXPECT_NEAR(gpu_layer_kept_bytes(tp, Recompute::selective) / baseline, selective_only[i], 0.0005) << p.name;
    EXPECT_NEAR(gpu_layer_kept_bytes(tp, Recompute::full) / baseline, full[i], 0.0005) << p.name;
  }
  // 175B with sequence parallelism and selective recomputation: 2048 x 12288 x 34 / 8 B = 106.95 MB per layer.
  EXPECT_DOUBLE_EQ(gpu_layer_kept_bytes(gpu_activation_bytes(model_of(paper_models()[1]), 1, kSeq, kTp, true, kPaper),
                                        Recompute::selective),
                   106954752.0);
}

// Flash attention keeps the softmax's fp32 log-sum-exp (4 a s b / t) where the paper keeps 5 a s^2 b / t; the rest of
// the layer is the same, and selective recomputation drops either.
TEST(GpuMemory, FlashAttentionKeepsNoScores) {
  const PaperModel& p = paper_models()[1];
  const ModelConfig m = model_of(p);
  const GpuActivationBytes flash = gpu_activation_bytes(m, 1, kSeq, kTp, true, {2, true, true});
  const GpuActivationBytes unfused = gpu_activation_bytes(m, 1, kSeq, kTp, true, kPaper);
  EXPECT_DOUBLE_EQ(flash.op[static_cast<std::size_t>(LayerOp::core)], 4.0 * p.heads * kSeq / kTp);
  EXPECT_DOUBLE_EQ(unfused.op[static_cast<std::size_t>(LayerOp::core)], 5.0 * p.heads * kSeq * kSeq / kTp);
  EXPECT_DOUBLE_EQ(gpu_layer_kept_bytes(flash, Recompute::selective), gpu_layer_kept_bytes(unfused, Recompute::selective));
  // Without dropout the two masks of the layer go: 2 sbh / t less.
  const GpuActivationBytes no_dropout = gpu_activation_bytes(m, 1, kSeq, kTp, true, {2, true, false});
  EXPECT_DOUBLE_EQ(flash.layer() - no_dropout.layer(), 2.0 * kSeq * p.hidden / kTp);
}

// The output layer's logits: the paper's fp32 (4 sbV/t, Megatron's cross entropy saves its softmax in the fp32 cast),
// or a fused loss's, kept at the element size; nothing else of the layer or the head moves.
TEST(GpuMemory, AFusedLossKeepsItsLogitsAtTheElementSize) {
  const PaperModel& p = paper_models()[1];
  const ModelConfig m = model_of(p);
  GpuLayout fused = kPaper;
  fused.logit_bytes = 2;
  const GpuActivationBytes fp32_logits = gpu_activation_bytes(m, p.micro_batch, kSeq, kTp, true, kPaper);
  const GpuActivationBytes fused_logits = gpu_activation_bytes(m, p.micro_batch, kSeq, kTp, true, fused);
  const double logits = double(kSeq) * p.micro_batch * (51200 / kTp);
  EXPECT_DOUBLE_EQ(fp32_logits.head - fused_logits.head, 2 * logits);
  EXPECT_DOUBLE_EQ(fused_logits.head, 2.0 * 2 * kSeq * p.micro_batch * p.hidden / kTp + 2 * logits);
  EXPECT_DOUBLE_EQ(fp32_logits.layer(), fused_logits.layer());
  EXPECT_DOUBLE_EQ(fp32_logits.embedding, fused_logits.embedding);
}

// FP8 training (Transformer Engine) keeps the linear layers' inputs as the FP8 copies its GEMMs read: the QKV
// projection's input sbh, the attention projection's sbA/t, the MLP's input sbh and the second MLP GEMM's input sbF/t
// (sequence parallelism dividing the hidden-wide ones) at 1 byte; the norms' and GELU's inputs, the core's, the masks,
// the embedding and the head keep their size.
TEST(GpuMemory, Fp8KeepsTheLinearLayersInputsInOneByte) {
  const PaperModel& p = paper_models()[1];
  const ModelConfig m = model_of(p);
  for (const bool sp : {true, false}) {
    const GpuLayout bf16{2, true, false, 0, 2};
    GpuLayout fp8 = bf16;
    fp8.gemm_input_bytes = 1;
    const GpuActivationBytes wide = gpu_activation_bytes(m, p.micro_batch, kSeq, kTp, sp, bf16);
    const GpuActivationBytes narrow = gpu_activation_bytes(m, p.micro_batch, kSeq, kTp, sp, fp8);
    const double sb = double(kSeq) * p.micro_batch, whole = sp ? kTp : 1;
    const auto op = [](const GpuActivationBytes& a, LayerOp o) { return a.op[static_cast<std::size_t>(o)]; };
    EXPECT_DOUBLE_EQ(op(wide, LayerOp::pre) - op(narrow, LayerOp::pre), sb * p.hidden / whole);
    EXPECT_DOUBLE_EQ(op(wide, LayerOp::post) - op(narrow, LayerOp::post),
                     sb * m.heads * m.head_dim() / kTp + sb * p.hidden / whole + sb * m.mlp() / kTp);
    EXPECT_DOUBLE_EQ(op(wide, LayerOp::core), op(narrow, LayerOp::core));
    EXPECT_DOUBLE_EQ(wide.input, narrow.input);
    EXPECT_DOUBLE_EQ(wide.head, narrow.head);
    EXPECT_DOUBLE_EQ(wide.embedding, narrow.embedding);
  }
}

// Section 4.3: the first pipeline stage holds p micro-batches in 1F1B, so L layers of one micro-batch whatever p is;
// interleaved with v chunks (1 + (p - 1)/(p v)) times that; and the embeddings' dropout mask of the p micro-batches,
// sbhp/t (sbhp without sequence parallelism), and with one stage the output layer, 4 sbh/t (1 + v/h). Per GPU (GB),
// SP + selective: 10.509, 13.288, 24.961, 28.941; full recomputation (Table 2's 2 sbh, no SP): 5.293, 6.442, 13.128,
// 16.777. The estimate adds the recomputation's space, one layer's recomputed terms (the core for selective, all but its input for
// full), and holds the embeddings' mask of the micro-batches the interleaved schedule has in flight
// on chunk 0, which the paper rounds to p (15 against 8 for 175B).
TEST(GpuMemory, FirstStageHoldsSection43sTotal) {
  const double selective_gb[] = {10.509, 13.288, 24.961, 28.941}, full_gb[] = {5.293, 6.442, 13.128, 16.777};
  for (std::size_t i = 0; i < paper_models().size(); ++i) {
    const PaperModel& p = paper_models()[i];
    const double sbh = double(kSeq) * p.micro_batch * p.hidden;
    const double layers = p.layers * (p.chunks > 1 ? 1 + (p.pp - 1.0) / (p.pp * p.chunks) : 1.0);
    auto output = [&](double whole) { return p.pp == 1 ? 4 * sbh / whole + 4.0 * kSeq * p.micro_batch * 51200 / kTp : 0; };
    const double paper_selective = sbh * 34 / kTp * layers + p.pp * sbh / kTp + output(kTp);
    const double paper_full = 2 * sbh * layers + p.pp * sbh + output(1);
    EXPECT_NEAR(paper_selective / 1e9, selective_gb[i], 0.0005) << p.name;
    EXPECT_NEAR(paper_full / 1e9, full_gb[i], 0.0005) << p.name;

    const GpuActivationBytes sp = gpu_activation_bytes(model_of(p), p.micro_batch, kSeq, kTp, true, kPaper);
    const GpuActivationBytes tp = gpu_activation_bytes(model_of(p), p.micro_batch, kSeq, kTp, false, kPaper);
    const double selective = gpu_activation_peak(config_of(p, Recompute::selective, true), p.pp, 0, kTp, true, kPaper) -
                             sp.op[static_cast<std::size_t>(LayerOp::core)];
    const double full = gpu_activation_peak(config_of(p, Recompute::full, false), p.pp, 0, kTp, false, kPaper) -
                        (tp.layer() - tp.input);  // the recomputed layer beside the inputs kept
    // The layers' share exactly, and the embeddings' and output layer's terms as the schedule holds them.
    EXPECT_GE(selective, sbh * 34 / kTp * layers) << p.name;
    // The interleaved schedule has more than p micro-batches in flight on chunk 0 (up to 2p: 15 for 175B, 70 for
    // 530B), so the embeddings' masks add at most another p of them to the paper's total.
    EXPECT_GE(selective, paper_selective * (1 - 1e-12)) << p.name;
    EXPECT_LE(selective, paper_selective + p.pp * sbh / kTp) << p.name;
    EXPECT_GE(full, 2 * sbh * layers) << p.name;
    EXPECT_GE(full, paper_full * (1 - 1e-12)) << p.name;
    EXPECT_LE(full, paper_full + p.pp * sbh) << p.name;
    if (p.chunks == 1) {  // 1F1B holds exactly p: the paper's totals
      EXPECT_NEAR(selective, paper_selective, 1e-9 * paper_selective) << p.name;
      EXPECT_NEAR(full, paper_full, 1e-9 * paper_full) << p.name;
    }
  }
}

// The whole rank (model states in mixed precision, activations, workspace, buffers): every configuration of Table 5
// fits an 80 GB A100 with sequence parallelism and selective recomputation, and with full recomputation; without
// recomputation and sequence parallelism the 530B and 1T models do not.
TEST(GpuMemory, TheTable5ConfigurationsFit80GB) {
  for (const PaperModel& p : paper_models()) {
    DataParallelShape shape;
    shape.tp = kTp, shape.pp = p.pp, shape.pp_rank = 0;
    auto total = [&](Recompute recompute, bool sp) {
      double most = 0;
      for (int r : {0, p.pp - 1}) {
        shape.pp_rank = r;
        const MemoryUse m = gpu_memory_estimate(config_of(p, recompute, sp), shape, kPaper);
        most = std::max(most, m.params + m.grads + m.optimizer + m.activations + m.workspace + m.comm_buffers);
      }
      return most;
    };
    EXPECT_LT(total(Recompute::selective, true), 80e9) << p.name;
    EXPECT_LT(total(Recompute::full, false), 80e9) << p.name;
    if (p.name == "530B" || p.name == "1T") {
      EXPECT_GT(total(Recompute::none, false), 80e9) << p.name;
    }
  }
}

// The schedule decides the micro-batches in flight: GPipe holds all m, 1F1B's rank r min(p - r, m).
TEST(GpuMemory, MicroBatchesInFlightFollowTheSchedule) {
  PaperModel p{"small", 8, 512, 8, 4, 1, 1, 16};
  const GpuActivationBytes bytes = gpu_activation_bytes(model_of(p), 1, kSeq, 1, false);
  const double stage = 2 * bytes.layer();  // 8 layers over 4 stages
  TrainConfig c = config_of(p, Recompute::none, false);
  for (int r = 1; r < 3; ++r) {  // neither the embeddings' stage nor the head's
    EXPECT_DOUBLE_EQ(gpu_activation_peak(c, 4, r, 1, false), (4 - r) * stage) << "1f1b rank " << r;
    c.schedule = Schedule::gpipe;
    EXPECT_DOUBLE_EQ(gpu_activation_peak(c, 4, r, 1, false), 16 * stage) << "gpipe rank " << r;
    c.schedule = Schedule::one_f_one_b;
  }
}

// The CPU step keeps its own fp32 formula: the GPU estimate's model states are the fp32 ones at 2/2/12 bytes, and its
// data-parallel buffers memory_estimate's at half.
TEST(GpuMemory, ModelStatesAreTheMixedPrecisionCount) {
  const TrainConfig c = tiny_config("NGG");
  const DataParallelShape shape = four_ranks();
  const MemoryUse fp32 = memory_estimate(c, shape), gpu = gpu_memory_estimate(c, shape);
  EXPECT_DOUBLE_EQ(gpu.params, fp32.params / 2);
  EXPECT_DOUBLE_EQ(gpu.grads, fp32.grads / 2);
  EXPECT_DOUBLE_EQ(gpu.optimizer, fp32.optimizer * 1.5);
  EXPECT_DOUBLE_EQ(gpu.comm_buffers, data_parallel_buffer_bytes(c, shape) / 2);
  EXPECT_DOUBLE_EQ(gpu.workspace, fp32.workspace / 2);
  EXPECT_DOUBLE_EQ(gpu.activations, gpu_activation_peak(c, 1, 0, 1, false));
}

// Gradients reduced in fp32 under a bf16 step (GpuLayout::gradient_reduction_bytes): the reductions' buffers at 4
// bytes an element, the parameter gathers' still at 2; the CPU formula's split adds up to its total.
TEST(GpuMemory, GradientReductionBuffersTakeTheirOwnElementSize) {
  TrainConfig c = tiny_config("NNN");
  const DataParallelShape shape = four_ranks();
  for (const char* strategy : {"GGG", "NGG"}) {
    c.strategy = parse_strategy(strategy);
    const DataParallelBuffers buffers = data_parallel_buffers(c, shape);
    EXPECT_GT(buffers.reductions, 0) << strategy;
    EXPECT_EQ(buffers.gathers > 0, std::string(strategy) == "GGG") << strategy;
    EXPECT_DOUBLE_EQ(buffers.total(), data_parallel_buffer_bytes(c, shape));
    GpuLayout fp32_reductions;
    fp32_reductions.gradient_reduction_bytes = 4;
    const double bf16 = gpu_memory_estimate(c, shape).comm_buffers;
    const double fp32 = gpu_memory_estimate(c, shape, fp32_reductions).comm_buffers;
    EXPECT_DOUBLE_EQ(bf16, buffers.total() / 2) << strategy;
    EXPECT_DOUBLE_EQ(fp32, buffers.gathers / 2 + buffers.reductions) << strategy;
  }
  // Whole gradients are reduced in place in their store, sharded optimizer states or not (no copy of Ψ'/m).
  for (const char* strategy : {"NNN", "NNI", "NNG"}) {
    c.strategy = parse_strategy(strategy);
    EXPECT_EQ(data_parallel_buffer_bytes(c, shape), 0) << strategy;
    EXPECT_EQ(gpu_memory_estimate(c, shape).comm_buffers, 0) << strategy;
  }
}

// How frameworks hold sharded states in flight (ShardingBuffers): the step's own pools four units each way; FSDP two
// layers beside its root unit (the embeddings and the final norm) and two units' gradients; DeepSpeed by its
// defaults, module by module, never more than the rank's model (all of a tiny one) nor its trainable part.
TEST(GpuMemory, ShardingBuffersFollowTheFramework) {
  TrainConfig c = tiny_config("GGG");
  const DataParallelShape shape = four_ranks();
  const HeldSizes held = held_sizes(c, shape);
  const DataParallelBuffers own = sharding_buffer_elements(c, shape, ShardingBuffers::strata);
  const DataParallelBuffers fsdp = sharding_buffer_elements(c, shape, ShardingBuffers::fsdp);
  const DataParallelBuffers deepspeed = sharding_buffer_elements(c, shape, ShardingBuffers::deepspeed);
  EXPECT_DOUBLE_EQ(own.gathers, data_parallel_buffers(c, shape).gathers / 4);
  EXPECT_DOUBLE_EQ(own.gathers, 4 * held.largest_unit);
  EXPECT_DOUBLE_EQ(own.reductions, 4 * held.largest_unit);
  EXPECT_DOUBLE_EQ(fsdp.gathers, held.outer_units + 2 * held.largest_layer);
  EXPECT_DOUBLE_EQ(fsdp.reductions, 2 * held.largest_unit);
  EXPECT_GT(held.outer_units, 0);
  EXPECT_GT(held.largest_layer, 0);
  EXPECT_LE(held.largest_layer, held.largest_unit);
  EXPECT_DOUBLE_EQ(deepspeed.gathers, held.parameters);
  EXPECT_DOUBLE_EQ(deepspeed.reductions, held.parameters);
  // Only the last layer trains: DeepSpeed's gradient bucket never outgrows it.
  c.trainable = parse_trainable("last:1");
  EXPECT_DOUBLE_EQ(sharding_buffer_elements(c, shape, ShardingBuffers::deepspeed).reductions, held_sizes(c, shape).trainable);
  EXPECT_LT(held_sizes(c, shape).trainable, held.parameters);
  c.trainable = {};
  // The layout's choice reaches the estimate, at the element sizes of gathers and reductions.
  GpuLayout layout;
  layout.sharding_buffers = ShardingBuffers::fsdp, layout.gradient_reduction_bytes = 4;
  EXPECT_DOUBLE_EQ(gpu_memory_estimate(c, shape, layout).comm_buffers, 2 * fsdp.gathers + 4 * fsdp.reductions);
  // Whole parameters are not gathered, whole gradients not reduced through buffers, under any framework.
  for (ShardingBuffers framework : {ShardingBuffers::strata, ShardingBuffers::fsdp, ShardingBuffers::deepspeed}) {
    c.strategy = parse_strategy("NGG");
    const DataParallelBuffers grads_only = sharding_buffer_elements(c, shape, framework);
    EXPECT_EQ(grads_only.gathers, 0) << name(framework);
    EXPECT_GT(grads_only.reductions, 0) << name(framework);
    c.strategy = parse_strategy("NNG");
    EXPECT_EQ(sharding_buffer_elements(c, shape, framework).total(), 0) << name(framework);
  }
  EXPECT_EQ(parse_sharding_buffers("deepspeed"), ShardingBuffers::deepspeed);
  EXPECT_THROW(parse_sharding_buffers("fairscale"), std::invalid_argument);
}

// Narayanan et al. 2021, Table 2: GPT 530B under ZeRO-3 "using the DeepSpeed Python library", micro-batch 4, ran on
// 640 A100s of 80 GB and did not fit on 560, whose states per GPU are 14 % (1.9 GB) more: at 640 the run stood within
// a few GB of its card. Module by module, DeepSpeed holds its largest weight (the MLP's 4h x h) and its buckets, and
// the estimate comes to the card; the step's own pools, eight whole 5-billion-parameter layers, would need half as
// much again.
TEST(GpuMemory, Zero3Of530BComesToItsCardUnderDeepSpeedsBuffers) {
  const PaperModel& p = paper_models()[2];
  TrainConfig c = config_of(p, Recompute::full, false);
  c.micro_batch = 4, c.accumulation = 1, c.schedule = Schedule::one_f_one_b, c.virtual_stages = 1;
  c.strategy = parse_strategy("GGG");
  DataParallelShape shape;
  shape.n = 640, shape.m = 8, shape.g = 80;
  const double mlp_weight = 4.0 * p.hidden * p.hidden;
  EXPECT_DOUBLE_EQ(held_sizes(c, shape).largest_tensor, mlp_weight);
  GpuLayout deepspeed = kPaper;
  deepspeed.sharding_buffers = ShardingBuffers::deepspeed;
  constexpr double kCard = 80e9;
  const MemoryUse ds = gpu_memory_estimate(c, shape, deepspeed);
  EXPECT_DOUBLE_EQ(ds.comm_buffers, 2 * (mlp_weight + 5e7) + 2 * (5e8 + mlp_weight));
  EXPECT_NEAR(ds.total() / kCard, 1.0, 0.05);
  EXPECT_GT(gpu_memory_estimate(c, shape, kPaper).total(), 1.5 * kCard);
}

}  // namespace
}  // namespace strata::train
