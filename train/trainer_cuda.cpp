// The data-parallel training step on GPUs (see trainer_cuda.h).
#include "train/trainer_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

#include "kernels/error.h"
#include "kernels/layers_cuda.h"
#include "train/clock.h"
#include "train/gpt_cuda.h"
#include "train/memory_cuda.h"
#include "train/shard_plan.h"

namespace strata::train {

using coll::DataType;
using coll::RedOp;
using layers::BFloat16;
namespace kgpu = layers::gpu;

std::string gpu_step_refusal(const TrainConfig& c, const coll::GridShape& grid) {
  if (grid.tp != 1 || grid.pp != 1)
    return "tensor and pipeline parallelism on GPUs are not built: the GPU step runs the data-parallel family (the CPU "
           "step runs the whole grid)";
  if (c.recompute != Recompute::none) return "recomputation on GPUs is not built (the CPU step has every mode)";
  if (c.trainable.kind != Trainable::Kind::all) return "partial training on GPUs is not built (the CPU step has it)";
  return refusal_reason(c.strategy);
}

namespace {

// The step's own compute stream.
class ComputeStream {
 public:
  ComputeStream() { STRATA_KERNEL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~ComputeStream() {
    if (stream_) cudaStreamDestroy(stream_);
  }
  ComputeStream(const ComputeStream&) = delete;
  ComputeStream& operator=(const ComputeStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Device buffers of the step's collectives, reused by size: a buffer given back is taken again only by work
// enqueued after its last use in stream order (the groups' operations wait for the compute stream at the call).
template <typename T>
class DevicePool {
 public:
  explicit DevicePool(MemoryCategory category) : category_(category) {}
  DeviceBuffer<T> take(std::size_t count) {
    for (std::size_t i = 0; i < free_.size(); ++i)
      if (free_[i].size() == count) {
        DeviceBuffer<T> buffer = std::move(free_[i]);
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        return buffer;
      }
    held_bytes_ += static_cast<double>(count * sizeof(T));
    return DeviceBuffer<T>(category_, count);
  }
  void give(DeviceBuffer<T>& buffer) {
    if (buffer.size() > 0) free_.push_back(std::move(buffer));
  }
  double held_bytes() const { return held_bytes_; }

 private:
  MemoryCategory category_;
  std::vector<DeviceBuffer<T>> free_;
  double held_bytes_ = 0;
};

}  // namespace

struct GpuDataParallelTrainer::Impl {
  struct Unit : UnitShape {
    bool trains = false;
    std::size_t param_at = 0, grad_at = 0, opt_at = 0;
  };
  // A reduction of a unit's gradient enqueued during the backward pass, and what follows it at the micro-batch's
  // end: the sum into the kept shard (after the first backward) and the buffers' return.
  struct Reduction {
    std::size_t unit = 0;
    coll::NcclWork work;
    bool sum_into_store = false;
  };

  TrainConfig c;
  coll::ProcessGroups& groups;
  coll::NcclProcessGroups& nccl;
  const TokenSource& data;
  int n = 1, m = 1, g = 1, local = 0, node = 0;
  std::optional<ShardPlan> plan;
  std::unique_ptr<coll::Group> pieces_mpi;   // the data-parallel ranks by global piece
  std::unique_ptr<coll::NcclGroup> pieces;   // its NCCL communicator
  ComputeStream stream;
  std::unique_ptr<GptCuda> model;
  std::vector<Unit> units;
  std::vector<Slice> slices;
  DeviceBuffer<BFloat16> params;        // the compute copy, P's shard of each unit
  DeviceBuffer<float> grads;            // G's shard of each trainable unit
  DeviceBuffer<float> master, adam_m, adam_v;  // O's shard of each trainable unit
  DeviceBuffer<double> norm;
  DevicePool<BFloat16> param_pool{MemoryCategory::comm_buffers};
  DevicePool<float> grad_pool{MemoryCategory::comm_buffers};
  std::vector<DeviceBuffer<BFloat16>> gathered;         // per unit, while gathered
  std::vector<DeviceBuffer<float>> unit_grads, reduced;  // per unit: this micro-batch's gradient; its reduction after the first
  std::vector<Reduction> reductions;  // of the micro-batch's backward, or the step's last ones
  std::vector<int32_t> tokens, targets;
  coll::Traffic traffic;

  Impl(const TrainConfig& config, coll::ProcessGroups& process_groups, coll::NcclProcessGroups& nccl_groups,
       const TokenSource& source)
      : c(config), groups(process_groups), nccl(nccl_groups), data(source) {
    if (const std::string why = gpu_step_refusal(c, groups.grid()); !why.empty())
      throw std::invalid_argument("the GPU step does not run this: " + why);
    if (c.accumulation < 1) throw std::invalid_argument("accumulation must be at least 1 micro-batch");
    const attention::gpu::Impl attention = default_gpu_attention(c.model, c.micro_batch, c.seq);
    if (const std::string problem = validate_gpu(c.model, c.micro_batch, c.seq, attention); !problem.empty())
      throw std::invalid_argument(problem);
    coll::Group& dp = groups.dp();
    n = dp.size(), m = groups.dp_intra().size(), g = groups.dp_inter().size();
    local = groups.dp_intra().rank(), node = groups.dp_inter().rank();
    if (!dp.even_nodes() || m * g != n)
      throw std::invalid_argument("data-parallel ranks are spread unevenly over the nodes: every node needs the same number");
    plan.emplace(c.strategy, n, m, g, local, node);
    // The ranks in piece order (l g + k), as the CPU trainer orders them, and its NCCL communicator.
    std::vector<int> piece_of(static_cast<std::size_t>(n));
    {
      std::vector<int> node_place;  // the nodes in the order they first hold a rank, as the inter group numbers them
      for (int r = 0; r < n; ++r) {
        const int at = dp.node_of_rank()[static_cast<std::size_t>(r)];
        auto found = std::find(node_place.begin(), node_place.end(), at);
        if (found == node_place.end()) found = node_place.insert(node_place.end(), at);
        const int k = static_cast<int>(found - node_place.begin());
        int l = 0;
        for (int q = 0; q < r; ++q) l += dp.node_of_rank()[static_cast<std::size_t>(q)] == at;
        piece_of[static_cast<std::size_t>(r)] = l * g + k;
      }
    }
    pieces_mpi = dp.reordered("dp_by_piece", piece_of);
    pieces = nccl.split(*pieces_mpi);

    model = std::make_unique<GptCuda>(c.model, c.micro_batch, c.seq, stream.get(), attention);
    const ParameterLayout& layout = model->layout();
    slices = layout.units();
    const std::vector<bool> trains = trainable_units(c.model, c.trainable);
    std::size_t param_total = 0, grad_total = 0, opt_total = 0;
    for (std::size_t u = 0; u < slices.size(); ++u) {
      Unit unit;
      static_cast<UnitShape&>(unit) = plan->shape(slices[u].size);
      unit.trains = trains[u];
      unit.param_at = std::exchange(param_total, param_total + plan->held(unit, c.strategy.params));
      unit.grad_at = std::exchange(grad_total, grad_total + plan->held(unit, c.strategy.grads));
      unit.opt_at = std::exchange(opt_total, opt_total + plan->held(unit, c.strategy.optimizer));
      units.push_back(unit);
    }
    params = DeviceBuffer<BFloat16>(MemoryCategory::parameters, param_total);
    grads = DeviceBuffer<float>(MemoryCategory::gradients, grad_total);
    master = DeviceBuffer<float>(MemoryCategory::optimizer, opt_total);
    adam_m = DeviceBuffer<float>(MemoryCategory::optimizer, opt_total);
    adam_v = DeviceBuffer<float>(MemoryCategory::optimizer, opt_total);
    norm = DeviceBuffer<double>(MemoryCategory::workspace, 1 + layers::launch::squared_norm_workspace_doubles(opt_total));
    gathered.resize(units.size());
    unit_grads.resize(units.size());
    reduced.resize(units.size());
    tokens.resize(static_cast<std::size_t>(c.micro_batch) * c.seq);
    targets.resize(tokens.size());

    // Every rank initialises the whole model from the seed (as the CPU step does) and keeps its shards: the bf16
    // copy of P's, the fp32 master of O's.
    std::vector<float> full(layout.total());
    init_parameters(c.model, layout, full.data(), c.seed, c.init_std);
    DeviceBuffer<float> staging(MemoryCategory::workspace, plan->shape(largest_unit()).padded);
    for (std::size_t u = 0; u < units.size(); ++u) {
      const Unit& unit = units[u];
      std::vector<float> padded(unit.padded, 0.0f);
      std::copy(full.begin() + static_cast<std::ptrdiff_t>(slices[u].offset),
                full.begin() + static_cast<std::ptrdiff_t>(slices[u].end()), padded.begin());
      const std::size_t p_from = plan->piece_offset(unit, c.strategy.params), p_count = plan->held(unit, c.strategy.params);
      STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(staging.data(), padded.data() + p_from, p_count * sizeof(float),
                                               cudaMemcpyHostToDevice, stream.get()));
      kgpu::cast_to_bf16(params.data() + unit.param_at, staging.data(), p_count, stream.get());
      const std::size_t o_from = plan->piece_offset(unit, c.strategy.optimizer), o_count = plan->held(unit, c.strategy.optimizer);
      STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(master.data() + unit.opt_at, padded.data() + o_from, o_count * sizeof(float),
                                               cudaMemcpyHostToDevice, stream.get()));
      STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(stream.get()));  // `padded` and the staging buffer are reused
    }
  }

  std::size_t largest_unit() const {
    std::size_t largest = 0;
    for (const Slice& s : slices) largest = std::max(largest, s.size);
    return largest;
  }

  // The data-parallel group a collective of the shard plan runs over.
  coll::NcclGroup& group_of(ShardPlan::Over over) {
    switch (over) {
      case ShardPlan::Over::intra: return nccl.dp_intra();
      case ShardPlan::Over::inter: return nccl.dp_inter();
      case ShardPlan::Over::pieces: return *pieces;
      case ShardPlan::Over::all: return nccl.dp();
      case ShardPlan::Over::none: break;
    }
    throw std::logic_error("a collective of the shard plan over no group");
  }
  void count(const coll::NcclWork& work) { traffic += work.traffic(); }

  // ---- parameters: gathered before use when sharded ----------------------------------------------------------
  const BFloat16* unit_params(std::size_t u) {
    const Unit& unit = units[u];
    if (c.strategy.params == Sharding::none) return params.data() + unit.param_at;
    if (gathered[u].size() == 0) {
      gathered[u] = param_pool.take(unit.padded);
      const ShardPlan::UnitCollective gather = plan->parameter_gather(unit);
      coll::NcclWork work = group_of(gather.over)
                                .allgather(params.data() + unit.param_at, gathered[u].data(), gather.count, DataType::bfloat16,
                                           stream.get());
      count(work);
      work.wait_on(stream.get());  // the unit's compute waits for its parameters, the host does not
    }
    return gathered[u].data();
  }
  void drop_params(std::size_t u) {
    if (c.strategy.params != Sharding::none) param_pool.give(gathered[u]);
  }

  // ---- gradients ------------------------------------------------------------------------------------------------
  float* unit_grad_buffer(std::size_t u) {
    const Unit& unit = units[u];
    if (c.strategy.grads == Sharding::none) return grads.data() + unit.grad_at;
    if (unit_grads[u].size() == 0) {
      unit_grads[u] = grad_pool.take(unit.padded);
      STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(unit_grads[u].data(), 0, unit.padded * sizeof(float), stream.get()));
    }
    return unit_grads[u].data();
  }
  // This micro-batch's gradient of unit u is enqueued: reduced into the kept shard (G sharded), directly at the
  // first backward, into a buffer summed in at the micro-batch's end after that.
  void gradients_ready(std::size_t u, bool first) {
    const Unit& unit = units[u];
    if (!unit.trains || c.strategy.grads == Sharding::none) return;
    const ShardPlan::UnitCollective reduction = plan->micro_batch_reduction(unit);
    float* out = grads.data() + unit.grad_at;
    if (!first) {
      reduced[u] = grad_pool.take(reduction.count);
      out = reduced[u].data();
    }
    coll::NcclWork work = group_of(reduction.over)
                              .reduce_scatter(unit_grads[u].data(), out, reduction.count, DataType::float32, RedOp::sum,
                                              stream.get());
    count(work);
    reductions.push_back({u, std::move(work), !first});
  }
  // The micro-batch's end: the compute stream waits for its reductions, sums the later ones into the kept shards
  // and gives their buffers back.
  void finish_reductions() {
    for (Reduction& r : reductions) {
      r.work.wait_on(stream.get());
      const Unit& unit = units[r.unit];
      if (r.sum_into_store) {
        kgpu::accumulate(grads.data() + unit.grad_at, reduced[r.unit].data(), plan->held(unit, c.strategy.grads), stream.get());
        grad_pool.give(reduced[r.unit]);
      }
      grad_pool.give(unit_grads[r.unit]);
    }
    reductions.clear();
  }
  // At the last micro-batch: the kept gradient reduced into the optimizer's shard (docs/strategies.md's table).
  // ShardPlan::final_reductions, one after another on the stream.
  void reduce_for_optimizer(std::size_t u) {
    const Unit& unit = units[u];
    if (!unit.trains) return;
    float* store = grads.data() + unit.grad_at;
    for (const ShardPlan::Reduction& r : plan->final_reductions(unit)) {
      float* in = store + r.in_offset;
      float* out = store + r.out_offset;
      coll::NcclGroup& group = group_of(r.over);
      coll::NcclWork work = r.allreduce ? group.allreduce(in, out, r.count, DataType::float32, RedOp::sum, stream.get())
                                        : group.reduce_scatter(in, out, r.count, DataType::float32, RedOp::sum, stream.get());
      count(work);
      work.wait_on(stream.get());  // the next collective of the chain starts after this one (and compute waits)
    }
  }
  float* optimizer_grads(std::size_t u) {
    return grads.data() + units[u].grad_at + plan->optimizer_grads_offset(units[u]);
  }

  double allreduce_sum(coll::Group& group, double value) {
    group.allreduce(coll::Algo::library, &value, &value, 1, DataType::float64, RedOp::sum, coll::Waiting::at_once).wait();
    return value;
  }

  // ---- the step -------------------------------------------------------------------------------------------------
  StepStats step(int64_t step_index) {
    StepStats stats;
    const double start = host_seconds();
    traffic = {};
    const int L = c.model.layers;
    const std::size_t U = units.size();
    const float normaliser = static_cast<float>(static_cast<double>(n) * c.accumulation * c.micro_batch * c.seq);
    STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(grads.data(), 0, grads.bytes(), stream.get()));
    double loss_sum = 0;
    for (int micro = 0; micro < c.accumulation; ++micro) {
      const bool first = micro == 0, last = micro + 1 == c.accumulation;
      const int64_t first_row = (static_cast<int64_t>(micro) * n + groups.dp().rank()) * c.micro_batch;
      data.rows(step_index, first_row, c.micro_batch, c.seq, tokens.data(), targets.data());
      DeviceUnitPointers pointers;
      pointers.params.assign(U, nullptr);
      pointers.grads.assign(U, nullptr);
      LayerHooks hooks;
      hooks.before_forward = [&](int layer) {
        const std::size_t u = static_cast<std::size_t>(layer + 1);
        pointers.params[u] = unit_params(u);
        if (u == static_cast<std::size_t>(L) + 1) pointers.params[0] = unit_params(0);  // the tied head
        if (u >= 2 && u <= static_cast<std::size_t>(L)) drop_params(u - 1);            // gathered again for backward
        if (u == static_cast<std::size_t>(L) + 1 && L >= 1) drop_params(static_cast<std::size_t>(L));
      };
      hooks.before_backward = [&](int layer) {
        const std::size_t u = static_cast<std::size_t>(layer + 1);
        if (u >= 1 && u <= static_cast<std::size_t>(L)) pointers.params[u] = unit_params(u);
        if (units[u].trains) pointers.grads[u] = unit_grad_buffer(u);
        if (u == static_cast<std::size_t>(L) + 1 && units[0].trains) pointers.grads[0] = unit_grad_buffer(0);
      };
      hooks.after_backward = [&](int layer) {
        const std::size_t u = static_cast<std::size_t>(layer + 1);
        drop_params(u);
        if (u == static_cast<std::size_t>(L) + 1) drop_params(0);  // the head was the last reader of the token table
        gradients_ready(u, first);
      };
      model->forward(pointers, tokens.data(), targets.data(), hooks);
      for (std::size_t u = 0; u < U; ++u)
        pointers.grads[u] = !units[u].trains ? nullptr
                            : c.strategy.grads == Sharding::none ? grads.data() + units[u].grad_at
                                                                 : UnitPointers::pending();
      model->backward(pointers, normaliser, hooks);
      finish_reductions();
      if (last) {
        for (std::size_t u = 0; u < U; ++u) reduce_for_optimizer(u);
      }
      loss_sum += model->loss_sum();  // waits for the stream: the micro-batch's work is enqueued
    }

    // Global gradient norm over the optimizer's shards (distinct within the group that partitions them).
    bool any = false;
    for (std::size_t u = 0; u < U; ++u) {
      if (!units[u].trains) continue;
      kgpu::squared_norm(norm.data(), optimizer_grads(u), plan->held(units[u], c.strategy.optimizer), any, norm.data() + 1,
                         stream.get());
      any = true;
    }
    double squares = 0;
    STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(&squares, norm.data(), sizeof squares, cudaMemcpyDeviceToHost, stream.get()));
    STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    if (!any) squares = 0;
    if (c.strategy.optimizer == Sharding::intra) squares = allreduce_sum(groups.dp_intra(), squares);
    if (c.strategy.optimizer == Sharding::global) squares = allreduce_sum(groups.dp(), squares);
    stats.grad_norm = std::sqrt(squares);
    const float scale = layers::clip_scale(stats.grad_norm, c.max_grad_norm);
    layers::AdamWConfig adamw = c.adamw;
    adamw.learning_rate = stats.lr = learning_rate(c.lr, step_index);
    std::vector<coll::NcclWork> syncs;
    for (std::size_t u = 0; u < U; ++u) {
      const Unit& unit = units[u];
      if (!unit.trains) continue;
      // The optimizer's shard of the master weights, and in the same pass its bf16 copy where P holds it.
      kgpu::adamw_update(master.data() + unit.opt_at, params.data() + unit.param_at + plan->optimizer_params_offset(unit),
                         optimizer_grads(u), adam_m.data() + unit.opt_at, adam_v.data() + unit.opt_at,
                         plan->held(unit, c.strategy.optimizer), adamw, static_cast<long>(step_index), scale, stream.get());
      const ShardPlan::Synchronise sync = plan->synchronise(unit);
      if (sync.over == ShardPlan::Over::none) continue;
      coll::NcclGroup& group = group_of(sync.over);
      BFloat16* held_params = params.data() + unit.param_at;
      syncs.push_back(group.allgather(held_params + sync.from, held_params, sync.count, DataType::bfloat16, stream.get()));
      count(syncs.back());
    }
    for (coll::NcclWork& work : syncs) work.wait_on(stream.get());
    STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    stats.loss = allreduce_sum(groups.dp(), loss_sum) / normaliser;
    stats.traffic = traffic;
    stats.seconds = host_seconds() - start;
    return stats;
  }

  std::vector<float> full_parameters() {
    std::vector<float> full(model->layout().total());
    for (std::size_t u = 0; u < units.size(); ++u) {
      const Unit& unit = units[u];
      DeviceBuffer<float> whole(MemoryCategory::workspace, unit.padded);
      const float* mine = master.data() + unit.opt_at;
      const ShardPlan::UnitCollective gather = plan->master_gather(unit);
      if (gather.over == ShardPlan::Over::none)
        STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(whole.data(), mine, unit.padded * sizeof(float), cudaMemcpyDeviceToDevice,
                                                 stream.get()));
      else
        group_of(gather.over).allgather(mine, whole.data(), gather.count, DataType::float32, stream.get()).wait_on(stream.get());
      STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(full.data() + slices[u].offset, whole.data(), unit.size * sizeof(float),
                                               cudaMemcpyDeviceToHost, stream.get()));
      STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    }
    return full;
  }
};

GpuDataParallelTrainer::GpuDataParallelTrainer(const TrainConfig& config, coll::ProcessGroups& groups,
                                               coll::NcclProcessGroups& nccl, const TokenSource& data)
    : impl_(std::make_unique<Impl>(config, groups, nccl, data)) {}

GpuDataParallelTrainer::~GpuDataParallelTrainer() = default;

StepStats GpuDataParallelTrainer::step(int64_t step) {
  if (step < 1) throw std::invalid_argument("steps count from 1");
  return impl_->step(step);
}

std::vector<float> GpuDataParallelTrainer::full_parameters() { return impl_->full_parameters(); }

MemoryUse GpuDataParallelTrainer::memory() const {
  MemoryUse use;
  use.params = static_cast<double>(impl_->params.bytes());
  use.grads = static_cast<double>(impl_->grads.bytes());
  use.optimizer = static_cast<double>(impl_->master.bytes() + impl_->adam_m.bytes() + impl_->adam_v.bytes());
  use.activations = static_cast<double>(impl_->model->activation_bytes());
  use.workspace = static_cast<double>(impl_->model->workspace_bytes());
  use.comm_buffers = impl_->param_pool.held_bytes() + impl_->grad_pool.held_bytes();
  return use;
}

}  // namespace strata::train
