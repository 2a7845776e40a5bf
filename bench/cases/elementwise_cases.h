// The elementwise benchmark's problems: the CPU training step's non-GEMM kernels (kernels/layers.h) at the shapes a
// model's step calls them, on buffers each problem owns, filled from a seed, each checked against the float64
// references (kernels/layers_reference.h). Bytes are counted as the step's trace counts the same call (train/gpt.cpp,
// train/trainer.cpp: the elements read and written, 4 bytes each), so a fitted rate times a traced op directly.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/harness/buffers.h"
#include "kernels/layers.h"

namespace strata::elementwise {

// The kernels, by the names system descriptions key them with (project::elementwise_kernel_of maps a traced op's
// name to one of these).
const std::vector<std::string>& kernel_names();

// The shapes of one transformer layer's step on one rank: tokens (rows), the hidden width, the MLP width on this
// rank, the parameters of one layer on this rank (what one AdamW call updates, one gradient accumulation and one
// squared norm), the attention heads on this rank with their width, and the vocabulary columns of the logits on this
// rank (the loss's kernels).
struct LayerShape {
  std::int64_t rows = 0;
  std::int64_t channels = 0;
  std::int64_t mlp = 0;
  std::int64_t layer_parameters = 0;
  std::int64_t heads = 1, kv_heads = 1, head_dim = 1;
  std::int64_t vocab = 1;
};

// The elements the step's trace counts for one call of `kernel` at `shape`; throws std::invalid_argument for an
// unknown kernel.
double traced_elements(const std::string& kernel, const LayerShape& shape);

// Whether the step meets `kernel`'s operands outside this core's private caches: AdamW's moments are touched by
// nothing else in a step, and the gradients' norm runs after the whole backward has written other data since.
bool operands_leave_core_caches(const std::string& kernel);

struct CheckResult {
  std::int64_t checked = 0;
  std::int64_t wrong = 0;
  double worst_ratio = 0;  // max of |got - ref| / tolerance over the checked elements (<= 1 passes)
};

class Problem {
 public:
  // Throws std::invalid_argument for an unknown kernel.
  Problem(std::string kernel, const LayerShape& shape, std::uint64_t seed, int threads);
  void run();
  // Fresh outputs for one checked run: NaN where the kernel overwrites, zero where it accumulates, AdamW's state
  // as it started, the logits where the loss's gradient overwrites them.
  void prepare_check();
  // Every output element of the run since prepare_check() against the float64 reference.
  CheckResult check() const;
  // Testing the check: makes one output element wrong after a run.
  void corrupt_output();
  double bytes() const { return 4.0 * traced_elements(kernel_, shape_); }

 private:
  std::size_t qkv_channels() const {
    return static_cast<std::size_t>((shape_.heads + 2 * shape_.kv_heads) * shape_.head_dim);
  }
  std::string kernel_;
  LayerShape shape_;
  layers::CpuOptions options_;
  layers::VocabSlice vocab_slice() const;
  // Inputs a, b, c (as the kernel needs them) and outputs x, y, z; page-aligned, allocated once.
  PageAlignedFloats a_, b_, c_, x_, y_, z_;
  std::vector<std::int32_t> targets_;  // the loss's kernels: one per row, every fifth row not counted (-1)
  float normaliser_ = 1;                // the loss's kernels: the rows that count, worked out once as the step does
  std::vector<float> x0_, y0_, z0_;  // AdamW's starting parameters and moments, restored before a check
  long step_ = 1;
};

}  // namespace strata::elementwise
