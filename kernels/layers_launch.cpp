// Launch shapes and argument checks of the GPU layers (see layers_launch.h).
#include "kernels/layers_launch.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

namespace strata::layers::launch {
namespace {

unsigned blocks_for(std::size_t n, std::size_t cap) {
  return static_cast<unsigned>(std::min<std::size_t>((n + kThreads - 1) / kThreads, cap));
}

}  // namespace

Grid elementwise(std::size_t n) { return Grid{blocks_for(n, kMaxElementwiseBlocks), kThreads}; }

Grid per_row(std::size_t rows, const char* kernel) {
  if (rows > kMaxGridBlocks) {
    throw std::invalid_argument(std::string(kernel) + ": " + std::to_string(rows) + " rows exceed the " +
                                std::to_string(kMaxGridBlocks) + " blocks of a grid");
  }
  return Grid{static_cast<unsigned>(rows), kThreads};
}

Grid layernorm_backward(std::size_t rows) {
  return Grid{static_cast<unsigned>(std::min<std::size_t>(rows, kReductionBlocks)), kThreads};
}

std::size_t layernorm_backward_workspace_floats(std::size_t rows, std::size_t channels) {
  return static_cast<std::size_t>(layernorm_backward(rows).blocks) * 2 * channels;
}

Grid squared_norm(std::size_t n) { return Grid{blocks_for(n, kReductionBlocks), kThreads}; }

std::size_t squared_norm_workspace_doubles(std::size_t n) { return std::max<unsigned>(squared_norm(n).blocks, 1); }

void require_rows_and_channels(std::size_t rows, std::size_t channels, const char* kernel) {
  if (channels < 1) throw std::invalid_argument(std::string(kernel) + ": channels must be >= 1");
  // Device code indexes a row's columns with int.
  if (channels > static_cast<std::size_t>(INT_MAX)) {
    throw std::invalid_argument(std::string(kernel) + ": " + std::to_string(channels) + " channels exceed INT_MAX");
  }
  per_row(rows, kernel);
}

void require_slice(const VocabSlice& s) {
  if (std::string problem = validate(s); !problem.empty()) throw std::invalid_argument(problem);
  if (s.vocab > static_cast<std::size_t>(INT_MAX)) {
    throw std::invalid_argument("vocabulary slice: a vocabulary beyond INT_MAX cannot be indexed by int32 targets");
  }
  require_rows_and_channels(s.rows, s.width, "cross-entropy");
}

void require_normaliser(float normaliser) {
  if (!(std::isfinite(normaliser) && normaliser > 0.0f)) {
    throw std::invalid_argument("cross-entropy: normaliser must be finite and > 0");
  }
}

}  // namespace strata::layers::launch
