// A traced step (train/trace.h) as the simulator's workload (simulate.h): GEMMs and attention calls in the
// system's compute dtype, elementwise kernels by the bytes they move, each group's collectives on its own
// stream, a rank's sends and its receives on two streams of their own (a send never waits behind a receive), the
// traced ranks weighted by the ranks they stand for.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "project/simulate.h"
#include "train/trace.h"

namespace strata::project {

struct WorkloadOptions {
  std::string dtype = "fp32";  // of GEMMs and attention: the system's device must have it
  // Bytes of an activation or gradient element in elementwise kernels and in collectives and transfers of the
  // step's floats (the trace counts 4: fp32 on the CPU); 2 predicts a bf16 step. Scalar fp64 reductions keep 8.
  int element_bytes = 4;
  // How attention runs: "flash" (the fused kernel the description's attention figures describe,
  // Device::attention_seconds), "unfused" (the scores materialised, unfused_attention_seconds, as frameworks ran it
  // before flash attention), or another fused kernel by the name the description gives it (Device::attention_kernels).
  std::string attention = "flash";
  // The algorithm name the data-parallel groups' allgathers and reduce-scatters (ZeRO/FSDP sharding's parameter
  // gathers and gradient reductions) are costed under, so a framework that issues them its own way is described by
  // the system's collectives of that name (the shipped A100 description's "zero3-2021"); empty: as traced.
  std::string sharding_algorithm{};
  // Bytes of a gradient element in the data-parallel groups' reductions (reduce-scatters and allreduces of the
  // gradients, the tied embedding's too) where the framework reduces in another precision than it computes: 4 for
  // PyTorch FSDP's reduce_dtype float32 (Composer's mixed precision DEFAULT) or Megatron-Core's grad_reduce_in_fp32;
  // 0: element_bytes. Scalar fp64 reductions keep 8.
  int gradient_reduction_bytes = 0;
  // How the loss runs over the logits: "fused" (the step's own cross-entropy kernels at element_bytes, as
  // Transformer Engine's and flash-attn's in-place kernels run it), "fp32" (the logits cast to fp32 and the cross
  // entropy's passes run one after another, as Megatron-LM's and Megatron-Core's vocab-parallel cross entropy does
  // without --fp16-lm-cross-entropy or loss fusion) or "fp32-fused" (the same passes compiled into three, as
  // Megatron-Core's native --cross-entropy-loss-fusion runs them); loss_bytes_per_element.
  std::string loss = "fused";
  // Whether the model trains with dropout (GPT-3's and Korthikanti et al.'s models do; MPT and Llama do not): its
  // 1-byte masks are kept activations (train::GpuLayout::dropout). Memory only: the trace runs no dropout kernels.
  bool dropout = true;
  // How the framework holds its sharded parameters' gathers and gradients' reductions in flight
  // (train::ShardingBuffers: "strata", "fsdp", "deepspeed"). Memory only.
  std::string sharding_buffers = "strata";
};

Workload workload_of(const train::StepTrace& trace, const WorkloadOptions& options = {});
// One traced op as workload_of makes it (its dependencies as traced).
Op workload_op(const train::StepTrace& trace, const train::TraceOp& op, const WorkloadOptions& options);

// The algorithm a traced collective is costed under: options.sharding_algorithm for a data-parallel group's allgather
// or reduce-scatter where it is set, else the traced one.
std::string_view costed_algorithm(const train::StepTrace& trace, const train::TraceOp& op,
                                    const WorkloadOptions& options);
// GEMM, attention and elementwise ops run on the compute stream; the rest communicate.
bool is_compute(train::TraceOpKind kind);
// A traced element's bytes in the predicted step: the step's floats at `element_bytes`, others (fp64 scalars) as
// traced.
int element_bytes_of(const train::TraceOp& op, int element_bytes);

// The element size a traced collective moves in the predicted step: WorkloadOptions::gradient_reduction_bytes for a
// data-parallel or embedding group's reduce-scatter or allreduce of the step's floats where it is set, else
// element_bytes_of's.
int collective_element_bytes(const train::StepTrace& trace, const train::TraceOp& op, const WorkloadOptions& options);

// Bytes per traced element of the step's cross-entropy ops under a loss on fp32 logits ("fp32", "fp32-fused"),
// nothing for other ops or the "fused" loss. Per logit, Megatron's vocab-parallel cross entropy moves 38 bytes
// forward (the cast to fp32 6, max 4, subtract 8, exp 8, sum 4, normalise 8) and 14 backward (scale the saved softmax
// 8, cast the gradient back 6); with Megatron-Core's loss fusion its three compiled functions move 22 forward (the
// cast with the max 6, subtract, exp and sum in place 8, normalise 8) and 10 backward (the scaled softmax written
// back in place 8, the bf16 gradient 2). The trace's forward ops split them (one op per logit without tensor
// parallelism; the max, and the sum with the normalisation, with it) and its backward op counts two elements per
// logit.
std::optional<double> loss_bytes_per_element(std::string_view loss, std::string_view op_name);
// Whether the loss keeps its logits in fp32 for the backward (the saved softmax of "fp32" and "fp32-fused").
bool fp32_logits(std::string_view loss);
// The loss modes of WorkloadOptions::loss: "fused", "fp32", "fp32-fused".
const std::vector<std::string>& loss_modes();
// std::invalid_argument naming `loss` and the modes unless it is one of them.
void check_loss(const std::string& loss);
// The bytes a traced elementwise op moves in the predicted step: its elements at element_bytes, the cross entropy's
// at loss_bytes_per_element under a loss on fp32 logits (with 4-byte elements that counts the casts an fp32 step does
// not run).
double elementwise_bytes(const train::TraceOp& op, const WorkloadOptions& options);
// The name a traced elementwise op is priced under (Device::elementwise_seconds): its own, or under a loss on fp32
// logits the cross entropy's with " (fp32 passes)" or " (fp32-fused passes)" appended, so a measured rate of the
// step's fused loss kernel is not taken for the framework's passes.
std::string elementwise_name(const train::TraceOp& op, const WorkloadOptions& options);

// The device's attention kernel a workload's attention runs on: empty for "flash" and "unfused", else its name.
std::string_view attention_kernel(const WorkloadOptions& options);

// S of docs/metrics.md for a traced collective: one rank's buffer for allreduce and broadcast, the whole gathered
// buffer for allgather, the whole input for reduce_scatter.
double collective_bytes(const train::TraceOp& op, int group_size, int element_bytes);

}  // namespace strata::project
