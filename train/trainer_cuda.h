// The data-parallel training step on GPUs, one rank per GPU: the GPU model (gpt_cuda.h) under a data-parallel
// strategy, cut as the CPU trainer cuts it (shard_plan.h), its collectives on the NCCL process groups
// (collectives/nccl_groups.h), in the order docs/strategies.md's table gives (as trainer.h's CPU step runs them).
//
// Mixed precision. Parameters are held as the bf16 compute copy, sharded as P says; the optimizer's states as fp32
// master weights and Adam's two moments, sharded as O says; gradients in fp32, sharded as G says, accumulated in
// fp32 across micro-batches. AdamW runs on the optimizer's shard and writes the bf16 copy of it in the same pass;
// where P is coarser than O the parameter holders then gather the new bf16 values. So a rank holds 2 bytes per
// parameter (over d_P), 4 per gradient (over d_G) and 12 per optimizer element (over d_O): docs/strategies.md's
// mixed-precision formula with fp32 gradients.
//
// Order of work. Everything of the model is enqueued on one compute stream. A sharded unit's parameters are
// gathered on its group's stream before the unit runs, and the compute stream waits for that (an event, not the
// host); a unit's gradient is reduced on its group's stream once its backward is enqueued, and whatever reuses
// the buffer, or sums the result, waits for the reduction first. Only the loss and the gradient norm come back
// to the host, once per micro-batch and step.
//
// The data-parallel family only: tensor and pipeline parallelism, recomputation and partial training on GPUs are
// not built (the CPU trainer has them); the constructor refuses them with the reason.
#pragma once

#include <memory>
#include <vector>

#include "collectives/nccl_groups.h"
#include "collectives/process_group.h"
#include "train/data.h"
#include "train/trainer.h"

namespace strata::train {

class GpuDataParallelTrainer {
 public:
  // Collective over the world. groups: the MPI process groups of the job (tp = pp = 1); nccl: their NCCL
  // communicators (built from them). std::invalid_argument for what the GPU step does not run, a strategy that
  // is refused, uneven groups, or a shape the GPU model refuses (validate_gpu).
  GpuDataParallelTrainer(const TrainConfig& config, coll::ProcessGroups& groups, coll::NcclProcessGroups& nccl,
                         const TokenSource& data);
  ~GpuDataParallelTrainer();
  GpuDataParallelTrainer(const GpuDataParallelTrainer&) = delete;
  GpuDataParallelTrainer& operator=(const GpuDataParallelTrainer&) = delete;

  // One optimizer step (step >= 1); loss, gradient norm, learning rate, the step's time (the host waits for the
  // stream at its end) and the bytes each rank sent per tier (NCCL's ring, modelled). Collective.
  StepStats step(int64_t step);
  // The fp32 master weights of the whole model, on every rank (collective): for checks.
  std::vector<float> full_parameters();
  // Device bytes per category: the states as held, the model's activations and workspace, the buffers of the
  // step's collectives at their most.
  MemoryUse memory() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "" when the GPU step runs this configuration, else why not.
std::string gpu_step_refusal(const TrainConfig& config, const coll::GridShape& grid);

}  // namespace strata::train
