// Launch shapes, workspace sizes and argument checks of the GPU layers (layers_cuda.h), as plain C++ so the CPU
// build tests them; the .cu file only launches what these say. No CUDA headers here.
#pragma once

#include <cstddef>
#include <string>

#include "kernels/layers.h"

namespace strata::layers::launch {

// 256 threads: eight warps, enough to hide latency in the row kernels and the memory-bound elementwise ones.
constexpr unsigned kThreads = 256;
// Elementwise kernels loop with a grid stride beyond this many blocks: a few waves on any current GPU, and
// far below the 2^31 - 1 grid limit however large the tensor.
constexpr unsigned kMaxElementwiseBlocks = 4096;
// Blocks of the reductions whose partial sums go to a workspace (layer norm's parameter gradients, the
// squared norm): enough to fill an H100's 132 SMs a few times over, few enough for the workspace to be small
// and for one thread to sum the partials in a fixed order.
constexpr unsigned kReductionBlocks = 512;
// The largest grid.x a launch accepts.
constexpr std::size_t kMaxGridBlocks = 2147483647;

struct Grid {
  unsigned blocks = 0;  // 0: nothing to do, no launch
  unsigned threads = kThreads;
};

// Grid-stride elementwise kernel over n elements.
Grid elementwise(std::size_t n);
// One block per row. Throws std::invalid_argument beyond the grid limit.
Grid per_row(std::size_t rows, const char* kernel);
// Layer norm backward: each block walks rows blockIdx.x, blockIdx.x + blocks, ... and keeps its own partial
// dweight and dbias (2C floats) in the workspace; a second kernel sums the partials in block order, so the
// result is deterministic.
Grid layernorm_backward(std::size_t rows);
std::size_t layernorm_backward_workspace_floats(std::size_t rows, std::size_t channels);
// Squared norm: one double partial per block, summed in block order by a second kernel.
Grid squared_norm(std::size_t n);
std::size_t squared_norm_workspace_doubles(std::size_t n);

// Argument checks shared by the GPU wrappers; each throws std::invalid_argument naming the problem.
void require_rows_and_channels(std::size_t rows, std::size_t channels, const char* kernel);
// validate(slice), and the limits of the device code: rows within a grid, columns and vocabulary within int.
void require_slice(const VocabSlice& slice);
void require_normaliser(float normaliser);

}  // namespace strata::layers::launch
