// The training step's elementwise kernels as strata-elementwise measures them and a system description times them
// (bench/cases/elementwise_cases.h, project/system.h): every kernel checks against float64 and its check catches a wrong
// element; the bytes a case counts are the elements the step's trace counts for the same op, so a fitted rate times a
// traced op; the description's per-kernel rate, the kernels' rate together, and the memory figures, in that order;
// the calibration's rates and the JSON round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "bench/cases/elementwise_cases.h"
#include "bench/project/system_json.h"
#include "project/calibrate.h"
#include "project/system.h"
#include "train/trainer.h"

namespace strata {
namespace {

elementwise::LayerShape small_shape() { return {10, 16, 32, 3000, 4, 2, 4, 37}; }

TEST(ElementwiseKernels, EachChecksAgainstFloat64AndACorruptOutputFails) {
  // Every output element is checked: the statistics and parameter gradients beside the main output, the three
  // tensors of a QKV split, AdamW's parameters and both moments, the loss's row statistics beside the losses, the
  // losses beside the logits' gradient.
  const elementwise::LayerShape s = small_shape();
  const std::int64_t R = s.rows, C = s.channels, F = s.mlp, P = s.layer_parameters, D = s.head_dim, V = s.vocab;
  const std::map<std::string, std::int64_t> outputs = {
      {"layernorm_forward", R * C + 2 * R}, {"layernorm_backward", R * C + 2 * C}, {"gelu_forward", R * F},
      {"gelu_backward", R * F}, {"residual_forward", R * C}, {"copy", R * C},
      {"permute_qkv", R * (s.heads + 2 * s.kv_heads) * D}, {"permute_heads", R * s.heads * D}, {"add_bias", R * C},
      {"fill_bias", R * C}, {"bias_gradient", C}, {"accumulate", P}, {"adamw", 3 * P}, {"squared_norm", 1}, {"cross_entropy_forward", 4 * R},
      {"cross_entropy_row_max", R}, {"cross_entropy_row_sum_exp", R}, {"cross_entropy_backward", R * V + R}};
  ASSERT_EQ(outputs.size(), elementwise::kernel_names().size());
  for (const std::string& kernel : elementwise::kernel_names()) {
    elementwise::Problem problem(kernel, s, 7, 1);
    problem.prepare_check();
    problem.run();
    const elementwise::CheckResult good = problem.check();
    EXPECT_EQ(good.checked, outputs.at(kernel)) << kernel;
    EXPECT_EQ(good.wrong, 0) << kernel << " worst ratio " << good.worst_ratio;
    // The timed loop runs the kernel again on what it left; a later checked run starts afresh.
    problem.run();
    problem.prepare_check();
    problem.run();
    EXPECT_EQ(problem.check().wrong, 0) << kernel;
    problem.prepare_check();
    problem.run();
    problem.corrupt_output();
    EXPECT_GT(problem.check().wrong, 0) << kernel;
  }
  EXPECT_THROW(elementwise::Problem("softmax", small_shape(), 1, 1), std::invalid_argument);
}

// The tiny model's step traced at tp 1 and 2: every op the description maps to a kernel counts the elements the
// benchmark counts for that kernel at the step's shape, and every mapped name is an op of the step.
TEST(ElementwiseKernels, BytesAreTheElementsTheStepsTraceCounts) {
  for (int tp : {1, 2}) {
    train::TrainConfig c;
    c.model = train::preset("tiny");
    c.seq = 64, c.micro_batch = 4, c.accumulation = 2;
    const train::StepTrace trace = train::trace_step(c, {tp, 1, 1}, {tp, "tp,pp,dp", {}});
    const train::TensorShard shard = train::tensor_shard(c.model, tp, 0);
    const std::int64_t h = c.model.hidden, q = shard.qkv_channels(c.model), a = shard.attention_channels(c.model);
    const std::int64_t f = shard.mlp;
    const elementwise::LayerShape shape{c.micro_batch * c.seq, h, f, 4 * h + (q * h + q) + (a * h + h) + (f * h + f) + (h * f + h),
                                        shard.heads, shard.kv_heads, c.model.head_dim(), shard.vocab_rows};
    std::set<std::string> seen;
    std::map<std::string, bool> one_layer_seen = {{"adamw", false}, {"squared_norm", false}};
    for (const train::TraceOp& op : trace.ranks.at(0).ops) {
      if (op.kind != train::TraceOpKind::elementwise) continue;
      const std::string kernel(project::elementwise_kernel_of(op.name));
      if (kernel.empty()) continue;
      seen.insert(std::string(op.name));
      if (kernel == "fill_bias" || kernel == "bias_gradient") {
        // A linear layer's bias at its output width: the QKV projection's, the MLP's up or down (the benchmark's
        // rate at the layer's width serves them all).
        bool at_a_width = false;
        for (const std::int64_t width : {q, h, f}) {
          elementwise::LayerShape layer = shape;
          layer.channels = width;
          at_a_width = at_a_width || op.elements == elementwise::traced_elements(kernel, layer);
        }
        EXPECT_TRUE(at_a_width) << "tp " << tp << " " << op.name << " " << op.elements;
        continue;
      }
      const double want = elementwise::traced_elements(kernel, shape);
      // One update per unit: the layers' and the tables'.
      if (one_layer_seen.count(kernel)) one_layer_seen[kernel] = one_layer_seen[kernel] || op.elements == want;
      else EXPECT_DOUBLE_EQ(op.elements, want) << "tp " << tp << " " << op.name;
    }
    for (const auto& [kernel, seen_once] : one_layer_seen)
      EXPECT_TRUE(seen_once) << "tp " << tp << ": no " << kernel << " over one layer's parameters";
    for (const char* name : {"ln1", "ln2", "lnf", "norm backward", "gelu", "gelu backward", "residual", "copy", "split heads",
                             "merge qkv", "merge heads", "split head grads", "adamw", "squared norm", "cross-entropy backward",
                             "bias fill", "bias grad"})
      EXPECT_TRUE(seen.count(name)) << "tp " << tp << ": the step traces no op named '" << name << "'";
    // The loss: fused over the whole vocabulary on one rank, in pieces combined over the group under tensor parallelism.
    for (const char* name : tp == 1 ? std::vector<const char*>{"cross-entropy"}
                                    : std::vector<const char*>{"logit max", "sum of exponentials"})
      EXPECT_TRUE(seen.count(name)) << "tp " << tp << ": the step traces no op named '" << name << "'";
    // A row-parallel layer's bias is added after the sum of its partial outputs.
    if (tp > 1) {
      EXPECT_TRUE(seen.count("bias")) << "tp " << tp << ": the step traces no op named 'bias'";
    }
  }
  // Sharded gradients (ZeRO-2) add each later micro-batch's reduced shard to the first's: 3 elements per gradient.
  train::TrainConfig c;
  c.model = train::preset("tiny");
  c.seq = 64, c.micro_batch = 4, c.accumulation = 2, c.strategy = train::zero_stage(2);
  int accumulations = 0;
  const train::StepTrace sharded = train::trace_step(c, {1, 1, 2}, {2, "tp,pp,dp", {}});
  for (const train::TraceOp& op : sharded.ranks.at(0).ops)
    if (op.kind == train::TraceOpKind::elementwise && op.name == "accumulate grads") {
      EXPECT_EQ(project::elementwise_kernel_of(op.name), "accumulate");
      EXPECT_GT(op.elements, 0);
      EXPECT_EQ(std::fmod(op.elements, 3.0), 0.0);
      ++accumulations;
    }
  EXPECT_GT(accumulations, 0);
}

project::System memory_only() {
  project::System s;
  s.device.memory_bandwidth = {1e11, 0, ""};
  s.device.memory_efficiency = {0.5, 0, ""};
  return s;
}

TEST(ElementwiseKernels, TheKernelsRateThenTheKernelsTogetherThenMemory) {
  project::System s = memory_only();
  EXPECT_DOUBLE_EQ(s.device.elementwise_seconds("gelu", 1e6), 1e6 / 5e10);
  s.device.elementwise_bandwidth = project::Quantity{2e10, 0, ""};
  EXPECT_DOUBLE_EQ(s.device.elementwise_seconds("gelu", 1e6), 1e6 / 2e10);
  s.device.elementwise_kernels["gelu_forward"] = {4e10, 0, ""};
  EXPECT_DOUBLE_EQ(s.device.elementwise_seconds("gelu", 1e6), 1e6 / 4e10);
  EXPECT_DOUBLE_EQ(s.device.elementwise_seconds("gelu backward", 1e6), 1e6 / 2e10);  // another kernel
  EXPECT_DOUBLE_EQ(s.device.elementwise_seconds("positions", 1e6), 1e6 / 2e10);     // no kernel of them
  EXPECT_DOUBLE_EQ(s.device.elementwise_seconds(1e6), 1e6 / 5e10);                  // the roofline's memory term
}

TEST(ElementwiseKernels, CalibrationGivesEachKernelsBytesOverSecondsAndAllTogether) {
  project::CalibrationInput input;
  // Two shapes of GELU at 10 and 15 GB/s: their bytes over their seconds, not the mean of the two rates.
  // The loss's kernel has its own rate but stays out of the rate together (an exponential per logit bounds it).
  input.elementwise = {{"gelu_forward", 1e6, 1e-4, 0.02}, {"gelu_forward", 3e6, 2e-4, 0.05},
                       {"copy", 2e6, 1e-5, 0.01}, {"cross_entropy_forward", 1e6, 1e-3, 0.3}};
  const project::Calibration c = project::calibrate(input, nullptr, "");
  const auto& kernels = c.system.device.elementwise_kernels;
  ASSERT_EQ(kernels.size(), 3u);
  EXPECT_NEAR(kernels.at("cross_entropy_forward").value, 1e9, 1e9 * 1e-4);
  // Five significant digits, as every fitted figure.
  EXPECT_NEAR(kernels.at("gelu_forward").value, 4e6 / 3e-4, 4e6 / 3e-4 * 1e-4);
  EXPECT_DOUBLE_EQ(kernels.at("gelu_forward").relative_spread, 0.05);
  EXPECT_NEAR(kernels.at("copy").value, 2e11, 2e11 * 1e-5);
  ASSERT_TRUE(c.system.device.elementwise_bandwidth.has_value());
  EXPECT_NEAR(c.system.device.elementwise_bandwidth->value, 6e6 / 3.1e-4, 6e6 / 3.1e-4 * 1e-4);
}

TEST(ElementwiseKernels, TheDescriptionsJsonKeepsThemAndNamesABadRate) {
  project::System s = memory_only();
  s.name = "e", s.device.name = "cpu", s.device.devices_per_node = 1;
  s.device.compute["fp32"].peak_flops = {1e11, 0, ""};
  s.device.compute["fp32"].efficiency = {{{1, 0.5}}, 0, ""};
  s.intra_node.bandwidth = {1e10, 0, ""}, s.intra_node.latency = {1e-6, 0, ""};
  s.inter_node = s.intra_node;
  s.device.elementwise_kernels["gelu_forward"] = {3e10, 0.04, "measured: strata-elementwise"};
  s.device.elementwise_bandwidth = project::Quantity{2e10, 0.05, "measured"};
  ASSERT_FALSE(project::find_problem(s).has_value()) << *project::find_problem(s);
  const std::string text = system_to_json(s).dump(2);
  const project::System back = system_from_json(nlohmann::json::parse(text), "<test>");
  EXPECT_EQ(system_to_json(back).dump(2), text);
  EXPECT_DOUBLE_EQ(back.device.elementwise_kernels.at("gelu_forward").value, 3e10);
  s.device.elementwise_kernels["gelu_forward"].value = -1;
  ASSERT_TRUE(project::find_problem(s).has_value());
  EXPECT_NE(project::find_problem(s)->find("device.elementwise.kernels.gelu_forward"), std::string::npos)
      << *project::find_problem(s);
}

}  // namespace
}  // namespace strata
