// The data layout of the flash attention kernels (kernels/attention_cuda.cu) as plain constexpr functions, so
// the host build can test what the device code relies on: tile sizes and shared-memory footprints, and the
// index maps of mma.sync m16n8k16 and ldmatrix.x4 that move a tile from shared memory into the tensor cores.
// The kernels compute every fragment address through these functions; tests/unit/test_flash_layout.cpp
// composes them and checks that they reproduce C += A B for each tile product the kernels issue.
// Shared with nvcc, which compiles C++17: keep this header C++17 and free of CUDA includes.
#pragma once

#include <cstddef>

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata::attention::gpu::layout {

constexpr int kFwdRows = 64;   // Br: query rows per forward block, 16 per warp
constexpr int kFwdKeys = 64;   // Bc: keys per forward tile
constexpr int kBwdKeys = 64;   // Bc: keys per backward block, 16 per warp
constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / 32;

// The backward's query tile: 32 rows at D=128 keep dK, dV (128 fp32 per thread together), S^T and dP^T within
// the register file; D=64 affords 64.
STRATA_HOST_DEVICE constexpr int bwd_rows(int head_dim) { return head_dim == 128 ? 32 : 64; }
// Columns of dQ per warp in the backward's dQ = dS K step: the warps split Br/16 row tiles x column ranges.
STRATA_HOST_DEVICE constexpr int bwd_dq_cols(int head_dim) { return head_dim / (kWarps / (bwd_rows(head_dim) / 16)); }
// Shared-memory rows are padded by 8 halves (16 bytes): the eight 16-byte rows of each ldmatrix phase then
// land in distinct bank groups.
STRATA_HOST_DEVICE constexpr int padded(int columns) { return columns + 8; }

constexpr std::size_t fwd_smem_bytes(int head_dim) {
  return static_cast<std::size_t>(kFwdRows + 4 * kFwdKeys) * static_cast<std::size_t>(padded(head_dim)) * 2;  // Q, K[2], V[2]
}
constexpr std::size_t bwd_smem_bytes(int head_dim) {
  const int br = bwd_rows(head_dim);
  return static_cast<std::size_t>(2 * kBwdKeys + 4 * br) * static_cast<std::size_t>(padded(head_dim)) * 2  // K, V, Q[2], dO[2]
         + static_cast<std::size_t>(kBwdKeys) * static_cast<std::size_t>(padded(br)) * 2                   // dS^T
         + static_cast<std::size_t>(4 * br) * sizeof(float);                                              // lse[2], delta[2]
}

// A (row, column) position inside a tile.
struct Element {
  int row;
  int col;
};

// mma.sync.m16n8k16.row.col fragments (PTX ISA, "Matrix fragments for mma.m16n8k16"), g = lane/4, t = lane%4.
// Register `reg` of a lane holds two 16-bit elements; `half` 0 is the low one.
// A (16x16, m x k): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..).
STRATA_HOST_DEVICE constexpr Element a_element(int lane, int reg, int half) {
  return {lane / 4 + 8 * (reg & 1), 2 * (lane % 4) + half + 8 * (reg >> 1)};
}
// B (16x8, k x n): b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g).
STRATA_HOST_DEVICE constexpr Element b_element(int lane, int reg, int half) {
  return {2 * (lane % 4) + half + 8 * reg, lane / 4};
}
// C and D (16x8, fp32, one element per index): c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1).
STRATA_HOST_DEVICE constexpr Element c_element(int lane, int index) {
  return {lane / 4 + 8 * (index >> 1), 2 * (lane % 4) + (index & 1)};
}

// ldmatrix.x4 reads four 8x8 matrices; lanes 8i..8i+7 supply the addresses of rows 0..7 of matrix i, and
// register i of every lane receives matrix i as (row g, columns 2t..2t+1), or with .trans as (rows 2t..2t+1,
// column g). The kernels read 16x16 tiles, with the four matrices as its quadrants in one of two orders.
STRATA_HOST_DEVICE constexpr Element ldmatrix_element(int lane, int half, bool trans) {
  return trans ? Element{2 * (lane % 4) + half, lane / 4} : Element{lane / 4, 2 * (lane % 4) + half};
}
// Quadrants down first: matrix i is rows 8(i&1).., columns 8(i>>1)... Gives an A fragment from a row-major
// (m, k) tile, and with .trans the B fragments of two 8-wide n tiles from a row-major (k, n) tile.
STRATA_HOST_DEVICE constexpr Element x4_down_first(int lane) {
  return {((lane / 8) & 1) * 8 + lane % 8, ((lane / 8) >> 1) * 8};
}
// Quadrants across first: matrix i is rows 8(i>>1).., columns 8(i&1)... Gives the B fragments of two 8-wide n
// tiles from a row-major (n, k) tile, and with .trans an A fragment from a row-major (k, m) tile.
STRATA_HOST_DEVICE constexpr Element x4_across_first(int lane) {
  return {((lane / 8) >> 1) * 8 + lane % 8, ((lane / 8) & 1) * 8};
}

// The accumulators of two adjacent 8-wide n tiles (C layout) are the A fragment of one 16-wide k slice, so a
// product can feed the next mma without leaving registers: A register `reg` packs elements
// c_from_a_index(reg, 0) (low) and (reg, 1) of accumulator tile c_from_a_tile(reg) (0: the even tile).
STRATA_HOST_DEVICE constexpr int c_from_a_tile(int reg) { return reg >> 1; }
STRATA_HOST_DEVICE constexpr int c_from_a_index(int reg, int half) { return 2 * (reg & 1) + half; }

}  // namespace strata::attention::gpu::layout
