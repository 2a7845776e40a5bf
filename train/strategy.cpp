// Implementation of data-parallel strategies (see strategy.h).
#include "train/strategy.h"

#include <cctype>
#include <stdexcept>

namespace strata::train {

namespace {

char letter(Sharding s) { return s == Sharding::none ? 'N' : s == Sharding::intra ? 'I' : 'G'; }
const char* state_name(int i) { return i == 0 ? "parameters" : i == 1 ? "gradients" : "optimizer states"; }

}  // namespace

std::string Strategy::name() const { return {letter(params), letter(grads), letter(optimizer)}; }

Strategy zero_stage(int stage) {
  switch (stage) {
    case 0: return parse_strategy("NNN");
    case 1: return parse_strategy("NNG");
    case 2: return parse_strategy("NGG");
    case 3: return parse_strategy("GGG");
    default: throw std::invalid_argument("ZeRO stage " + std::to_string(stage) + " does not exist (0, 1, 2, 3)");
  }
}

Strategy parse_strategy(const std::string& text) {
  std::string lower;
  for (char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.rfind("zero", 0) == 0 && lower.size() == 5 && std::isdigit(static_cast<unsigned char>(lower[4])))
    return zero_stage(lower[4] - '0');
  if (text.size() != 3)
    throw std::invalid_argument("strategy '" + text + "': expected three letters of N, I, G (parameters, gradients, "
                                "optimizer states), e.g. NNG, or zero0..zero3");
  Sharding parts[3];
  for (int i = 0; i < 3; ++i) {
    const char c = static_cast<char>(std::toupper(static_cast<unsigned char>(text[static_cast<std::size_t>(i)])));
    if (c == 'N') parts[i] = Sharding::none;
    else if (c == 'I') parts[i] = Sharding::intra;
    else if (c == 'G') parts[i] = Sharding::global;
    else
      throw std::invalid_argument("strategy '" + text + "': '" + std::string(1, text[static_cast<std::size_t>(i)]) + "' for the " +
                                  state_name(i) + " is not N (replicated), I (sharded in a group) or G (sharded globally)");
  }
  return {parts[0], parts[1], parts[2]};
}

std::string refusal_reason(const Strategy& s) {
  for (auto [state, sharding] : {std::pair{"parameters", s.params}, std::pair{"gradients", s.grads}})
    if (static_cast<int>(s.optimizer) < static_cast<int>(sharding))
      return "optimizer states (" + std::string(1, letter(s.optimizer)) + ") sharded more coarsely than the " + state +
             " (" + std::string(1, letter(sharding)) +
             "): the optimizer would update state whose gradients or parameters this rank does not hold, gathering them for "
             "nothing; runnable strategies shard optimizer states at least as finely as both";
  return "";
}

std::vector<Strategy> runnable_strategies() {
  std::vector<Strategy> all;
  for (Sharding os : {Sharding::none, Sharding::intra, Sharding::global})
    for (Sharding p : {Sharding::none, Sharding::intra, Sharding::global})
      for (Sharding g : {Sharding::none, Sharding::intra, Sharding::global})
        if (Strategy s{p, g, os}; refusal_reason(s).empty()) all.push_back(s);
  return all;
}

int shard_degree(Sharding sharding, int group_size, int dp_size) {
  return sharding == Sharding::none ? 1 : sharding == Sharding::intra ? group_size : dp_size;
}

ModelStateMemory model_state_memory(const Strategy& s, double parameters, double trainable, int group_size, int dp_size,
                                    const StateBytes& bytes) {
  return {bytes.params * parameters / shard_degree(s.params, group_size, dp_size),
          bytes.grads * trainable / shard_degree(s.grads, group_size, dp_size),
          bytes.optimizer * trainable / shard_degree(s.optimizer, group_size, dp_size)};
}

}  // namespace strata::train
