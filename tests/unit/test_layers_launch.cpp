// Host-side logic of the GPU layers (kernels/layers_launch.h), tested without a GPU: the launch shapes are
// run through the same index arithmetic the kernels use, so a shape that leaves an element or a row
// unvisited, or visits one twice, fails here rather than on a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/layers_launch.h"

namespace strata::layers::launch {
namespace {

// Visits of each index by a grid-stride loop: for (i = block * threads + thread; i < n; i += blocks * threads).
std::vector<std::uint8_t> grid_stride_visits(const Grid& grid, std::size_t n) {
  std::vector<std::uint8_t> visits(n, 0);
  const std::size_t stride = static_cast<std::size_t>(grid.blocks) * grid.threads;
  for (std::size_t start = 0; start < stride; ++start)
    for (std::size_t i = start; i < n; i += stride) ++visits[i];
  return visits;
}

TEST(LayersLaunch, ElementwiseGridVisitsEveryElementOnce) {
  EXPECT_EQ(elementwise(0).blocks, 0u);  // nothing to launch
  for (const std::size_t n : {std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{257},
                              (std::size_t{1} << 20) + 3, std::size_t{5} << 20}) {
    const Grid grid = elementwise(n);
    ASSERT_GE(grid.blocks, 1u) << n;
    ASSERT_LE(grid.blocks, kMaxElementwiseBlocks) << n;
    const auto visits = grid_stride_visits(grid, n);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(visits[i], 1) << "element " << i << " of " << n;
  }
  // Beyond the cap the grid stays capped and the stride loop covers the rest.
  EXPECT_EQ(elementwise(std::size_t{1} << 40).blocks, kMaxElementwiseBlocks);
}

TEST(LayersLaunch, PerRowGridHasOneBlockPerRow) {
  EXPECT_EQ(per_row(0, "test").blocks, 0u);
  EXPECT_EQ(per_row(12345, "test").blocks, 12345u);
  EXPECT_EQ(per_row(kMaxGridBlocks, "test").blocks, kMaxGridBlocks);
  EXPECT_THROW(per_row(kMaxGridBlocks + 1, "test"), std::invalid_argument);
}

TEST(LayersLaunch, LayerNormBackwardBlocksOwnEveryRowOnceAndFitTheWorkspace) {
  EXPECT_EQ(layernorm_backward(0).blocks, 0u);
  EXPECT_EQ(layernorm_backward_workspace_floats(0, 768), 0u);
  for (const std::size_t rows : {std::size_t{1}, std::size_t{511}, std::size_t{512}, std::size_t{513},
                                 std::size_t{5000}}) {
    const Grid grid = layernorm_backward(rows);
    ASSERT_GE(grid.blocks, 1u);
    ASSERT_LE(grid.blocks, kReductionBlocks);
    // Block b walks rows b, b + blocks, ... (the kernel's loop).
    std::vector<int> owner_count(rows, 0);
    for (unsigned b = 0; b < grid.blocks; ++b)
      for (std::size_t r = b; r < rows; r += grid.blocks) ++owner_count[r];
    for (std::size_t r = 0; r < rows; ++r) ASSERT_EQ(owner_count[r], 1) << "row " << r << " of " << rows;
    // Each block's partials: dweight and dbias, C floats each.
    EXPECT_EQ(layernorm_backward_workspace_floats(rows, 33), std::size_t{grid.blocks} * 2 * 33);
  }
}

TEST(LayersLaunch, SquaredNormPartialsFitTheWorkspace) {
  EXPECT_EQ(squared_norm(0).blocks, 0u);
  EXPECT_GE(squared_norm_workspace_doubles(0), 1u);  // never a zero-sized allocation
  for (const std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 30}) {
    const Grid grid = squared_norm(n);
    ASSERT_GE(grid.blocks, 1u);
    ASSERT_LE(grid.blocks, kReductionBlocks);
    EXPECT_EQ(squared_norm_workspace_doubles(n), grid.blocks);
  }
  const auto visits = grid_stride_visits(squared_norm(3'000'001), 3'000'001);
  for (std::size_t i = 0; i < visits.size(); ++i) ASSERT_EQ(visits[i], 1) << i;
}

TEST(LayersLaunch, ArgumentChecks) {
  EXPECT_NO_THROW(require_rows_and_channels(7, 768, "test"));
  EXPECT_THROW(require_rows_and_channels(7, 0, "test"), std::invalid_argument);
  EXPECT_THROW(require_rows_and_channels(7, std::size_t{1} << 31, "test"), std::invalid_argument);
  EXPECT_NO_THROW(require_slice(VocabSlice{4, 100, 128, 50, 150}));
  EXPECT_THROW(require_slice(VocabSlice{4, 0, 128, 0, 150}), std::invalid_argument);
  EXPECT_THROW(require_slice(VocabSlice{4, 100, 99, 0, 150}), std::invalid_argument);
  EXPECT_THROW(require_slice(VocabSlice{4, 100, 128, 51, 150}), std::invalid_argument);
  EXPECT_NO_THROW(require_normaliser(3.0f));
  EXPECT_THROW(require_normaliser(0.0f), std::invalid_argument);
  EXPECT_THROW(require_normaliser(INFINITY), std::invalid_argument);
}

}  // namespace
}  // namespace strata::layers::launch
