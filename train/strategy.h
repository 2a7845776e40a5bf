// A data-parallel partitioning strategy as a value (PaRO, docs/strategies.md): for each of parameters (P), gradients
// (G) and optimizer states (OS), kept whole (N), sharded inside a group of m ranks (I: a node, or an emulated
// one) or sharded across all n data-parallel ranks (G). The step asks this value which group holds a state
// sharded; it never branches on a strategy's name. ZeRO-0/1/2/3 are NNN, NNG, NGG, GGG; hybrid sharding
// inside nodes (FSDP HYBRID_SHARD, MiCS) is III.
#pragma once

#include <string>
#include <vector>

namespace strata::train {

enum class Sharding { none, intra, global };  // N, I, G: coarse to fine

struct Strategy {
  Sharding params = Sharding::none;
  Sharding grads = Sharding::none;
  Sharding optimizer = Sharding::none;
  std::string name() const;  // "NNG"
  bool operator==(const Strategy&) const = default;
};

// "NNG" (case-insensitive) or "zero1"; std::invalid_argument naming the bad letter otherwise.
Strategy parse_strategy(const std::string& text);
Strategy zero_stage(int stage);  // 0..3; std::invalid_argument otherwise

// "" when the strategy runs, else why not. The rule (docs/strategies.md, derived): optimizer states at least as
// finely sharded as both parameters and gradients, because the optimizer updates what it holds from gradients
// and into parameters that must cover it; a coarser optimizer would gather states for nothing. 14 of the 27
// combinations run: NNN, NNI, NII, INI, III, NNG, NIG, NGG, ING, IIG, IGG, GNG, GIG, GGG.
std::string refusal_reason(const Strategy& strategy);
std::vector<Strategy> runnable_strategies();

// Ranks a state is split over: N 1, I the group size m, G the data-parallel degree n.
int shard_degree(Sharding sharding, int group_size, int dp_size);

// Bytes of one element of each state: fp32 training (the CPU path) 4, 4, 8 (Adam m and v); mixed precision
// (bf16 parameters and gradients, fp32 master weights and both moments) 2, 2, 12.
struct StateBytes {
  double params = 4, grads = 4, optimizer = 8;
};
inline constexpr StateBytes kFp32States{4, 4, 8};
inline constexpr StateBytes kMixedPrecisionStates{2, 2, 12};

// Model-state memory per rank (docs/strategies.md): bytes_P Ψ / d_P + bytes_G Ψ' / d_G + bytes_OS Ψ' / d_OS, where Ψ'
// counts the trainable parameters (frozen ones have no gradients and no optimizer states).
struct ModelStateMemory {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};
ModelStateMemory model_state_memory(const Strategy& strategy, double parameters, double trainable, int group_size,
                                    int dp_size, const StateBytes& bytes = kFp32States);

}  // namespace strata::train
