// Implementation of the GPU attention backends (see attention_cuda.h).
//
// Unfused baseline. The query heads of a GQA group are consecutive in Q (B, Hq, Sq, D), so for one
// (batch, kv head) they form a single (group*Sq, D) matrix against that kv head's (Skv, D) keys and values.
// Every product is therefore one strided-batched cuBLASLt call over B*Hkv entries with uniform strides, and
// the products that reduce over query rows (dV = P^T dO, dK = dS^T Q) sum over the group by construction.
// The scores of all entries are materialised in fp32, as (B, Hq, Sq, Skv); that is what the baseline measures.
//
// Flash kernels. mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulate) fed by ldmatrix from padded shared memory
// (row stride D+8 halves: the eight 16-byte rows of each ldmatrix phase land in distinct bank groups).
//   forward:  one 128-thread block per (64 query rows, batch, query head); each warp owns 16 query rows,
//             keeps Q fragments and the O accumulator in registers, and walks 64-key tiles of K and V,
//             double-buffered with cp.async, with the online softmax in registers (log2 domain).
//   backward: one 128-thread block per (64 keys, batch, kv head); each warp owns 16 keys and accumulates their
//             dK and dV in registers over every query head of the group and every query tile (so GQA needs
//             no atomics on dK/dV), recomputing P^T from lse. dS^T goes through shared memory so the block
//             can form dQ = dS K for the query tile, which is added with fp32 atomics into a (B, Hq, Sq, D)
//             float buffer and converted (times the softmax scale) by a last small kernel.
// The fragment and ldmatrix index maps, tile sizes and shared-memory footprints are in flash_layout.h, where
// the host tests check them; names, parsing and validation are in attention_cuda_host.cpp.
#include "kernels/attention_cuda.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <stdexcept>
#include <vector>

#include "kernels/error.h"
#include "kernels/flash_layout.h"
#include "kernels/cuda_handles.h"
#include "kernels/gemm_check.h"

namespace strata::attention::gpu {

namespace {

using cuda::DeviceBuffer;
using cuda::LayoutDeleter;
using cuda::LayoutPtr;
using cuda::LtHandleDeleter;
using cuda::MatmulDescDeleter;
using cuda::PreferenceDeleter;
using cuda::device_alloc;

// ---------------------------------------------------------------------------------------------------------
// Device helpers.

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Two floats rounded to the dtype in one 32-bit register, `lo` in the low half: the element order of
// mma fragments and of row-major memory alike.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &h, sizeof r);
  return r;
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &h, sizeof r);
  return r;
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The "memory" clobbers keep the compiler from moving shared-memory traffic across these statements, which
// it cannot see through; __syncthreads() orders them between threads.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p))
               : "memory");
}

// D (16x8 fp32) += A (16x16) B (16x8).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared without a register round trip; when !valid nothing is read and the 16 bytes are
// zeroed, so tile rows past the end of a sequence are zeros (finite scores, no NaN from 0 * garbage).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const unsigned long long global = static_cast<unsigned long long>(__cvta_generic_to_global(gmem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(smem)), "l"(global),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// `rows` rows of D elements from global (row stride D) into shared (row stride LD); rows >= valid_rows are
// zero-filled. Consecutive threads take consecutive 16-byte chunks of a row, so the reads coalesce.
template <typename T, int D, int LD>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, int rows, int valid_rows) {
  constexpr int kChunks = D / 8;
  for (int c = static_cast<int>(threadIdx.x); c < rows * kChunks; c += static_cast<int>(blockDim.x)) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = r < valid_rows;
    cp_async_16(smem + r * LD + col, valid ? gmem + static_cast<size_t>(r) * D + col : gmem, valid);
  }
}

// 16 rows x D of a warp's staged output (shared, row stride LD) to global (row stride D, `gmem` at the warp's
// first row), 16 bytes per store, skipping rows >= valid_rows.
template <typename T, int D, int LD>
__device__ __forceinline__ void store_warp_rows(T* gmem, const T* smem, int valid_rows, int lane) {
  constexpr int kChunks = D / 8;
  for (int c = lane; c < 16 * kChunks; c += 32) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    if (r < valid_rows)
      *reinterpret_cast<uint4*>(gmem + static_cast<size_t>(r) * D + col) =
          *reinterpret_cast<const uint4*>(smem + r * LD + col);
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The A fragment of one 16-wide k slice from the accumulators of its two 8-wide halves (see flash_layout.h).
template <typename T>
__device__ __forceinline__ void a_from_accumulators(uint32_t (&a)[4], const float (&even)[4], const float (&odd)[4]) {
#pragma unroll
  for (int reg = 0; reg < 4; ++reg) {
    const float(&c)[4] = layout::c_from_a_tile(reg) == 0 ? even : odd;
    a[reg] = pack2<T>(c[layout::c_from_a_index(reg, 0)], c[layout::c_from_a_index(reg, 1)]);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Flash kernels.

struct FlashParams {
  const void* q;      // (B, Hq, Sq, D)
  const void* k;      // (B, Hkv, Skv, D)
  const void* v;      // (B, Hkv, Skv, D)
  const void* d_o;    // (B, Hq, Sq, D)
  void* o;            // (B, Hq, Sq, D), written by the forward
  float* lse;         // (B, Hq, Sq)
  const float* delta; // (B, Hq, Sq) rowsum(dO * O)
  float* dq_accum;    // (B, Hq, Sq, D) fp32, zeroed before the backward
  void* dk;           // (B, Hkv, Skv, D)
  void* dv;           // (B, Hkv, Skv, D)
  int batch, heads_q, heads_kv, group, seq_q, seq_kv;
  int causal;
  int causal_offset;  // Skv - Sq: query i sees keys j <= i + causal_offset
  float scale;        // 1/sqrt(D)
  float scale_log2;   // scale * log2(e): exp(scale*s) == exp2(scale_log2*s)
};

using layout::kBwdKeys;
using layout::kFwdKeys;
using layout::kFwdRows;
using layout::kThreads;

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(FlashParams p) {
  constexpr int Br = kFwdRows, Bc = kFwdKeys, LD = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // (Br, LD)
  T* sK = sQ + Br * LD;                      // [2] (Bc, LD)
  T* sV = sK + 2 * Bc * LD;                  // [2] (Bc, LD)

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  // Sub-matrix of an ldmatrix.x4 that this lane addresses, and its row inside it.
  const layout::Element down = layout::x4_down_first(lane), across = layout::x4_across_first(lane);

  // The last query tiles come first in the grid: under a causal mask they see the most keys, and starting
  // the longest blocks first evens out the tail.
  const int heads_total = p.batch * p.heads_q;
  const int n_tiles = (p.seq_q + Br - 1) / Br;
  const int tile = n_tiles - 1 - static_cast<int>(blockIdx.x) / heads_total;
  const int bh = static_cast<int>(blockIdx.x) % heads_total;  // b * Hq + h
  const int b = bh / p.heads_q, h = bh % p.heads_q, h_kv = h / p.group;
  const int q0 = tile * Br;

  const T* q = static_cast<const T*>(p.q) + (static_cast<size_t>(bh) * p.seq_q + q0) * D;
  const size_t kv_offset = static_cast<size_t>(b * p.heads_kv + h_kv) * p.seq_kv * D;
  const T* k = static_cast<const T*>(p.k) + kv_offset;
  const T* v = static_cast<const T*>(p.v) + kv_offset;

  // Keys beyond the last row's causal limit are masked for the whole tile: skip their tiles.
  int kv_end = p.seq_kv;
  if (p.causal) kv_end = max(0, min(p.seq_kv, q0 + Br + p.causal_offset));
  const int n_blocks = (kv_end + Bc - 1) / Bc;

  load_tile_async<T, D, LD>(sQ, q, Br, p.seq_q - q0);
  if (n_blocks > 0) {
    load_tile_async<T, D, LD>(sK, k, Bc, p.seq_kv);
    load_tile_async<T, D, LD>(sV, v, Bc, p.seq_kv);
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  uint32_t qf[D / 16][4];  // this warp's 16 query rows as A fragments, one per 16-wide slice of D
#pragma unroll
  for (int kt = 0; kt < D / 16; ++kt)
    ldmatrix_x4(qf[kt], sQ + (warp * 16 + down.row) * LD + kt * 16 + down.col);

  float acc[D / 8][4];  // O rows g and g+8 of this warp, unnormalised
#pragma unroll
  for (int i = 0; i < D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};  // running max of the log2-domain scores, rows g and g+8
  float row_sum[2] = {0.0f, 0.0f};            // this thread's share of the running sum of exp2(s - max)
  const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};

  for (int j = 0; j < n_blocks; ++j) {
    const int buf = j & 1;
    const T* cK = sK + buf * Bc * LD;
    const T* cV = sV + buf * Bc * LD;
    if (j + 1 < n_blocks) {  // the other buffer was released by the __syncthreads() ending iteration j-1
      const int next = (j + 1) * Bc;
      load_tile_async<T, D, LD>(sK + (buf ^ 1) * Bc * LD, k + static_cast<size_t>(next) * D, Bc, p.seq_kv - next);
      load_tile_async<T, D, LD>(sV + (buf ^ 1) * Bc * LD, v + static_cast<size_t>(next) * D, Bc, p.seq_kv - next);
      cp_async_commit();
    }

    // S (16 x Bc per warp) = Q K^T; K rows are B's columns, so plain ldmatrix of K gives B fragments.
    float s[Bc / 8][4];
#pragma unroll
    for (int i = 0; i < Bc / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < D / 16; ++kt) {
#pragma unroll
      for (int nt2 = 0; nt2 < Bc / 16; ++nt2) {
        uint32_t kb[4];  // b0, b1 of key tile 2*nt2, then of 2*nt2+1
        ldmatrix_x4(kb, cK + (nt2 * 16 + across.row) * LD + kt * 16 + across.col);
        mma_16816<T>(s[2 * nt2], qf[kt], kb[0], kb[1]);
        mma_16816<T>(s[2 * nt2 + 1], qf[kt], kb[2], kb[3]);
      }
    }

    // Mask (sequence end, causal) and move to the log2 domain; masked scores become -inf so exp2 gives 0.
    const int kv0 = j * Bc;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kv0 + nt * 8 + 2 * t + (e & 1);
        const bool visible = key < p.seq_kv && (!p.causal || key <= row[e >> 1] + p.causal_offset);
        s[nt][e] = visible ? s[nt][e] * p.scale_log2 : -INFINITY;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[nt][e]);
      }
    }
    float rescale[2], shift[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float new_max = fmaxf(row_max[r], quad_max(tile_max[r]));  // the 4 lanes of a quad share a row
      // A row that has seen no key yet keeps max -inf; shifting by 0 then avoids (-inf) - (-inf).
      shift[r] = new_max == -INFINITY ? 0.0f : new_max;
      rescale[r] = exp2f(row_max[r] - shift[r]);
      row_max[r] = new_max;
    }
    float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - shift[e >> 1]);
        tile_sum[e >> 1] += s[nt][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * rescale[r] + tile_sum[r];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      acc[i][0] *= rescale[0];
      acc[i][1] *= rescale[0];
      acc[i][2] *= rescale[1];
      acc[i][3] *= rescale[1];
    }

    // O += P V. The C layout of two adjacent 8-key tiles of P is the A layout of one 16-key slice, so P
    // stays in registers; V's rows are the reduction dimension, hence ldmatrix.trans.
#pragma unroll
    for (int kt = 0; kt < Bc / 16; ++kt) {
      uint32_t pa[4];
      a_from_accumulators<T>(pa, s[2 * kt], s[2 * kt + 1]);
#pragma unroll
      for (int dt2 = 0; dt2 < D / 16; ++dt2) {
        uint32_t vb[4];  // b0, b1 of D tile 2*dt2, then of 2*dt2+1
        ldmatrix_x4_trans(vb, cV + (kt * 16 + down.row) * LD + dt2 * 16 + down.col);
        mma_16816<T>(acc[2 * dt2], pa, vb[0], vb[1]);
        mma_16816<T>(acc[2 * dt2 + 1], pa, vb[2], vb[3]);
      }
    }

    if (j + 1 < n_blocks) cp_async_wait_all();
    __syncthreads();  // next tile landed for everyone; this tile's buffer may be overwritten
  }

  // Normalise; a row that saw no key has sum 0 and outputs zeros with lse = -inf.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] = quad_sum(row_sum[r]);
    inv[r] = row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f;
  }
  // Stage through this warp's own rows of sQ (only this warp ever read them) for 16-byte global stores.
  T* sO = sQ + warp * 16 * LD;
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    *reinterpret_cast<uint32_t*>(sO + g * LD + i * 8 + 2 * t) = pack2<T>(acc[i][0] * inv[0], acc[i][1] * inv[0]);
    *reinterpret_cast<uint32_t*>(sO + (g + 8) * LD + i * 8 + 2 * t) =
        pack2<T>(acc[i][2] * inv[1], acc[i][3] * inv[1]);
  }
  __syncwarp();
  const int warp_row0 = q0 + warp * 16;
  store_warp_rows<T, D, LD>(static_cast<T*>(p.o) + (static_cast<size_t>(bh) * p.seq_q + warp_row0) * D, sO,
                            p.seq_q - warp_row0, lane);
  if (t == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (row[r] < p.seq_q)
        p.lse[static_cast<size_t>(bh) * p.seq_q + row[r]] =
            row_sum[r] > 0.0f ? (row_max[r] + log2f(row_sum[r])) * kLn2 : -INFINITY;
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_backward_kernel(FlashParams p) {
  constexpr int Bc = kBwdKeys, Br = layout::bwd_rows(D), LD = D + 8, LDS = Br + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);  // (Bc, LD)
  T* sV = sK + Bc * LD;                      // (Bc, LD)
  T* sQ = sV + Bc * LD;                      // [2] (Br, LD)
  T* sdO = sQ + 2 * Br * LD;                 // [2] (Br, LD)
  T* sdS = sdO + 2 * Br * LD;                // (Bc, LDS): dS^T of the current tile, keys x queries
  float* sLse = reinterpret_cast<float*>(sdS + Bc * LDS);  // [2] (Br) lse * log2(e); +inf masks the row
  float* sDelta = sLse + 2 * Br;                           // [2] (Br)

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const layout::Element down = layout::x4_down_first(lane), across = layout::x4_across_first(lane);

  // The first key tiles come first in the grid: under a causal mask they are seen by the most queries.
  const int kv_heads_total = p.batch * p.heads_kv;
  const int kv_tile = static_cast<int>(blockIdx.x) / kv_heads_total;
  const int bkv = static_cast<int>(blockIdx.x) % kv_heads_total;  // b * Hkv + h_kv
  const int b = bkv / p.heads_kv, h_kv = bkv % p.heads_kv;
  const int k0 = kv_tile * Bc;
  const size_t kv_offset = (static_cast<size_t>(bkv) * p.seq_kv + k0) * D;

  load_tile_async<T, D, LD>(sK, static_cast<const T*>(p.k) + kv_offset, Bc, p.seq_kv - k0);
  load_tile_async<T, D, LD>(sV, static_cast<const T*>(p.v) + kv_offset, Bc, p.seq_kv - k0);

  // Query rows before first_q see none of this block's keys.
  const int first_q = p.causal ? max(0, min(p.seq_q, k0 - p.causal_offset)) : 0;
  const int q_tile_begin = first_q / Br;
  const int q_tiles = first_q >= p.seq_q ? 0 : (p.seq_q + Br - 1) / Br - q_tile_begin;
  const int steps = p.group * q_tiles;  // (query head of the group, query tile) pairs

  // Stage step `it` (Q, dO, lse, delta of one query tile of one head) into buffer `buf`.
  auto stage = [&](int it, int buf) {
    const int bh = b * p.heads_q + h_kv * p.group + it / q_tiles;
    const int r0 = (q_tile_begin + it % q_tiles) * Br;
    const size_t offset = (static_cast<size_t>(bh) * p.seq_q + r0) * D;
    load_tile_async<T, D, LD>(sQ + buf * Br * LD, static_cast<const T*>(p.q) + offset, Br, p.seq_q - r0);
    load_tile_async<T, D, LD>(sdO + buf * Br * LD, static_cast<const T*>(p.d_o) + offset, Br, p.seq_q - r0);
    for (int r = static_cast<int>(threadIdx.x); r < Br; r += kThreads) {
      const int row = r0 + r;
      float lse2 = INFINITY, delta = 0.0f;
      if (row < p.seq_q) {
        const float lse = p.lse[static_cast<size_t>(bh) * p.seq_q + row];
        lse2 = lse == -INFINITY ? INFINITY : lse * kLog2e;  // empty row: exp2(s - inf) = 0
        delta = p.delta[static_cast<size_t>(bh) * p.seq_q + row];
      }
      sLse[buf * Br + r] = lse2;
      sDelta[buf * Br + r] = delta;
    }
  };

  if (steps > 0) stage(0, 0);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  float dk[D / 8][4], dv[D / 8][4];  // rows g and g+8 of this warp's 16 keys
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
    dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
  }
  const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};

  for (int it = 0; it < steps; ++it) {
    const int buf = it & 1;
    if (it + 1 < steps) {  // the other buffer was released by the __syncthreads() ending iteration it-1
      stage(it + 1, buf ^ 1);
      cp_async_commit();
    }
    const int bh = b * p.heads_q + h_kv * p.group + it / q_tiles;
    const int r0 = (q_tile_begin + it % q_tiles) * Br;
    const T* cQ = sQ + buf * Br * LD;
    const T* cdO = sdO + buf * Br * LD;
    const float* cLse = sLse + buf * Br;
    const float* cDelta = sDelta + buf * Br;

    // S^T = K Q^T and dP^T = V dO^T (16 keys x Br queries per warp): K and V rows are A, and the Q / dO rows
    // are B's columns.
    float st[Br / 8][4], dpt[Br / 8][4];
#pragma unroll
    for (int i = 0; i < Br / 8; ++i) {
      st[i][0] = st[i][1] = st[i][2] = st[i][3] = 0.0f;
      dpt[i][0] = dpt[i][1] = dpt[i][2] = dpt[i][3] = 0.0f;
    }
#pragma unroll
    for (int kt = 0; kt < D / 16; ++kt) {
      uint32_t ka[4], va[4];
      ldmatrix_x4(ka, sK + (warp * 16 + down.row) * LD + kt * 16 + down.col);
      ldmatrix_x4(va, sV + (warp * 16 + down.row) * LD + kt * 16 + down.col);
#pragma unroll
      for (int nt2 = 0; nt2 < Br / 16; ++nt2) {
        uint32_t qb[4], ob[4];
        ldmatrix_x4(qb, cQ + (nt2 * 16 + across.row) * LD + kt * 16 + across.col);
        ldmatrix_x4(ob, cdO + (nt2 * 16 + across.row) * LD + kt * 16 + across.col);
        mma_16816<T>(st[2 * nt2], ka, qb[0], qb[1]);
        mma_16816<T>(st[2 * nt2 + 1], ka, qb[2], qb[3]);
        mma_16816<T>(dpt[2 * nt2], va, ob[0], ob[1]);
        mma_16816<T>(dpt[2 * nt2 + 1], va, ob[2], ob[3]);
      }
    }

    // P^T = exp(scale S^T - lse) recomputed from the forward's lse; dS^T = P^T (dP^T - delta). Masked pairs
    // (sequence ends, causal) are 0 in both, so they add nothing to dV, dK or dQ.
#pragma unroll
    for (int nt = 0; nt < Br / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * t + (e & 1);  // query within the tile
        const int query = r0 + col, kv = key[e >> 1];
        const bool visible =
            kv < p.seq_kv && query < p.seq_q && (!p.causal || kv <= query + p.causal_offset);
        const float prob = visible ? exp2f(st[nt][e] * p.scale_log2 - cLse[col]) : 0.0f;
        st[nt][e] = prob;
        dpt[nt][e] = prob * (dpt[nt][e] - cDelta[col]);
      }
    }

    // dV += P^T dO and dK += dS^T Q: P^T and dS^T become A fragments in registers (as P in the forward),
    // the query rows of dO and Q are the reduction dimension, hence ldmatrix.trans.
#pragma unroll
    for (int kt = 0; kt < Br / 16; ++kt) {
      uint32_t pa[4];
      a_from_accumulators<T>(pa, st[2 * kt], st[2 * kt + 1]);
      uint32_t da[4];
      a_from_accumulators<T>(da, dpt[2 * kt], dpt[2 * kt + 1]);
#pragma unroll
      for (int dt2 = 0; dt2 < D / 16; ++dt2) {
        uint32_t ob[4], qb[4];
        ldmatrix_x4_trans(ob, cdO + (kt * 16 + down.row) * LD + dt2 * 16 + down.col);
        ldmatrix_x4_trans(qb, cQ + (kt * 16 + down.row) * LD + dt2 * 16 + down.col);
        mma_16816<T>(dv[2 * dt2], pa, ob[0], ob[1]);
        mma_16816<T>(dv[2 * dt2 + 1], pa, ob[2], ob[3]);
        mma_16816<T>(dk[2 * dt2], da, qb[0], qb[1]);
        mma_16816<T>(dk[2 * dt2 + 1], da, qb[2], qb[3]);
      }
    }

    // dQ needs whole rows of dS across the four warps' keys: share dS^T (keys x queries) through shared
    // memory, rounded exactly as the dK product saw it.
#pragma unroll
    for (int nt = 0; nt < Br / 8; ++nt) {
      *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g) * LDS + nt * 8 + 2 * t) = pack2<T>(dpt[nt][0], dpt[nt][1]);
      *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g + 8) * LDS + nt * 8 + 2 * t) =
          pack2<T>(dpt[nt][2], dpt[nt][3]);
    }
    __syncthreads();

    // dQ (Br x D) += dS (Br x Bc) K (Bc x D), split over the warps as 16-row tiles x column ranges. dS is
    // stored transposed, so its A fragments come from ldmatrix.trans; K's rows are the reduction dimension.
    constexpr int kRowTiles = Br / 16;
    constexpr int kCols = layout::bwd_dq_cols(D);  // columns of dQ per warp: 64 in both configurations
    const int mt = warp % kRowTiles, c0 = (warp / kRowTiles) * kCols;
    float dq[kCols / 8][4];
#pragma unroll
    for (int i = 0; i < kCols / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < Bc / 16; ++kt) {
      uint32_t sa[4];
      ldmatrix_x4_trans(sa, sdS + (kt * 16 + across.row) * LDS + mt * 16 + across.col);
#pragma unroll
      for (int dt2 = 0; dt2 < kCols / 16; ++dt2) {
        uint32_t kb[4];
        ldmatrix_x4_trans(kb, sK + (kt * 16 + down.row) * LD + c0 + dt2 * 16 + down.col);
        mma_16816<T>(dq[2 * dt2], sa, kb[0], kb[1]);
        mma_16816<T>(dq[2 * dt2 + 1], sa, kb[2], kb[3]);
      }
    }
    // Other key blocks (and, across launches, nothing else) add to the same dQ rows: fp32 atomics.
    const int dq_row = r0 + mt * 16 + g;
    float* dqa = p.dq_accum + (static_cast<size_t>(bh) * p.seq_q + dq_row) * D + c0 + 2 * t;
#pragma unroll
    for (int i = 0; i < kCols / 8; ++i) {
      if (dq_row < p.seq_q) {
        atomicAdd(dqa + i * 8, dq[i][0]);
        atomicAdd(dqa + i * 8 + 1, dq[i][1]);
      }
      if (dq_row + 8 < p.seq_q) {
        atomicAdd(dqa + 8 * D + i * 8, dq[i][2]);
        atomicAdd(dqa + 8 * D + i * 8 + 1, dq[i][3]);
      }
    }

    if (it + 1 < steps) cp_async_wait_all();
    __syncthreads();  // next step landed for everyone; sdS and this step's buffers may be overwritten
  }

  // dK carries the softmax scale (dK = scale dS^T Q). Stage each warp's 16 rows through its own rows of sK and
  // sV (every warp has passed the last __syncthreads, so no one reads them any more) for 16-byte stores.
  T* sdK = sK + warp * 16 * LD;
  T* sdV = sV + warp * 16 * LD;
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    *reinterpret_cast<uint32_t*>(sdK + g * LD + i * 8 + 2 * t) = pack2<T>(dk[i][0] * p.scale, dk[i][1] * p.scale);
    *reinterpret_cast<uint32_t*>(sdK + (g + 8) * LD + i * 8 + 2 * t) =
        pack2<T>(dk[i][2] * p.scale, dk[i][3] * p.scale);
    *reinterpret_cast<uint32_t*>(sdV + g * LD + i * 8 + 2 * t) = pack2<T>(dv[i][0], dv[i][1]);
    *reinterpret_cast<uint32_t*>(sdV + (g + 8) * LD + i * 8 + 2 * t) = pack2<T>(dv[i][2], dv[i][3]);
  }
  __syncwarp();
  const int warp_key0 = k0 + warp * 16;
  const size_t out_offset = (static_cast<size_t>(bkv) * p.seq_kv + warp_key0) * D;
  store_warp_rows<T, D, LD>(static_cast<T*>(p.dk) + out_offset, sdK, p.seq_kv - warp_key0, lane);
  store_warp_rows<T, D, LD>(static_cast<T*>(p.dv) + out_offset, sdV, p.seq_kv - warp_key0, lane);
}

// ---------------------------------------------------------------------------------------------------------
// Small kernels shared by both implementations, and the unfused baseline's softmax.

constexpr int kRowThreads = 256;

// delta (rows) = rowsum(dO * O): the softmax backward's sum_j P_ij dP_ij, one warp per row.
template <typename T>
__global__ void __launch_bounds__(kRowThreads) row_dot_kernel(const T* d_o, const T* o, float* delta, long long rows,
                                                               int dim) {
  const long long row = static_cast<long long>(blockIdx.x) * (kRowThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const T* a = d_o + row * dim;
  const T* b = o + row * dim;
  float sum = 0.0f;
  for (int c = lane; c < dim; c += 32) sum += to_float(a[c]) * to_float(b[c]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) delta[row] = sum;
}

// out = scale * in, rounded to the dtype.
template <typename T>
__global__ void __launch_bounds__(kRowThreads) scale_convert_kernel(const float* in, T* out, size_t n, float scale) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(in[i] * scale);
}

// Merges two (max, sum of exp(x - max)) summaries of parts of a row.
__device__ __forceinline__ void merge_softmax(float& m, float& l, float m2, float l2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both parts empty
  l = l * expf(m - mx) + l2 * expf(m2 - mx);
  m = mx;
}

// One block per row of the (already scaled) scores (B, Hq, Sq, Skv): lse, and P in the dtype with masked
// entries 0. One pass keeps a running (max, sum) per thread, a second writes P.
template <typename T>
__global__ void __launch_bounds__(kRowThreads) softmax_rows_kernel(const float* scores, T* probs, float* lse,
                                                                    int seq_q, int seq_kv, int causal,
                                                                    int causal_offset) {
  __shared__ float part_max[kRowThreads / 32], part_sum[kRowThreads / 32];
  __shared__ float row_lse;
  const size_t row = blockIdx.x;
  const long long i = static_cast<long long>(row % static_cast<size_t>(seq_q));
  const int visible =
      causal ? static_cast<int>(max(0LL, min(static_cast<long long>(seq_kv), i + causal_offset + 1))) : seq_kv;
  const float* s = scores + row * seq_kv;
  T* out = probs + row * seq_kv;

  float m = -INFINITY, l = 0.0f;
  for (int j = static_cast<int>(threadIdx.x); j < visible; j += kRowThreads) {
    const float x = s[j];
    if (x > m) {
      l = l * expf(m - x) + 1.0f;
      m = x;
    } else {
      l += expf(x - m);
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    merge_softmax(m, l, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, l, offset));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) {
    part_max[warp] = m;
    part_sum[warp] = l;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < kRowThreads / 32 ? part_max[lane] : -INFINITY;
    l = lane < kRowThreads / 32 ? part_sum[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      merge_softmax(m, l, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, l, offset));
    if (lane == 0) {
      row_lse = visible > 0 ? m + logf(l) : -INFINITY;
      lse[row] = row_lse;
    }
  }
  __syncthreads();
  const float row_l = row_lse;
  for (int j = static_cast<int>(threadIdx.x); j < seq_kv; j += kRowThreads)
    out[j] = from_float<T>(j < visible ? expf(s[j] - row_l) : 0.0f);
}

// dS = P * (dP - delta) for one row per block; masked entries have P = 0 and stay 0.
template <typename T>
__global__ void __launch_bounds__(kRowThreads) softmax_grad_kernel(const T* probs, const float* dprobs,
                                                                    const float* delta, T* dscores, int seq_kv) {
  const size_t row = blockIdx.x;
  const float d = delta[row];
  const T* pr = probs + row * seq_kv;
  const float* dp = dprobs + row * seq_kv;
  T* ds = dscores + row * seq_kv;
  for (int j = static_cast<int>(threadIdx.x); j < seq_kv; j += kRowThreads)
    ds[j] = from_float<T>(to_float(pr[j]) * (dp[j] - d));
}

// ---------------------------------------------------------------------------------------------------------
// Host side.




constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

// A strided-batched product written row-major, as the attention formulas read:
//   C (m, n) = alpha op(A) op(B),  op(A) (m, k), op(B) (k, n), each matrix row-major with its leading dimension.
// trans_a means A is stored (k, m); trans_b means B is stored (n, k).
struct RowMajorProduct {
  const char* label;
  bool trans_a, trans_b;
  int64_t m, n, k;
  const void* a;
  int64_t lda, stride_a;
  const void* b;
  int64_t ldb, stride_b;
  void* c;
  int64_t ldc, stride_c;
  cudaDataType_t c_type;
  float alpha;
};

// cuBLASLt is column-major, and a row-major (r, c) matrix is its column-major (c, r) transpose. So the row-major
// C = op(A) op(B) is issued as the column-major C^T (n, m) = op(B)^T op(A)^T: B's storage is cuBLASLt's first
// operand and A's its second, each transposed exactly when the row-major product transposes it.
struct ColumnMajorCall {
  cublasOperation_t op_first, op_second;
  int64_t first_rows, first_cols;    // B's storage seen column-major, before op_first
  int64_t second_rows, second_cols;  // A's storage seen column-major, before op_second
  int64_t out_rows, out_cols;        // C^T: (n, m)
};

ColumnMajorCall column_major(const RowMajorProduct& p) {
  ColumnMajorCall c{};
  c.op_first = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  c.op_second = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  c.first_rows = p.trans_b ? p.k : p.n;  // B stored (n, k) row-major is (k, n) column-major; (k, n) is (n, k)
  c.first_cols = p.trans_b ? p.n : p.k;
  c.second_rows = p.trans_a ? p.m : p.k;  // A stored (k, m) row-major is (m, k) column-major; (m, k) is (k, m)
  c.second_cols = p.trans_a ? p.k : p.m;
  c.out_rows = p.n;
  c.out_cols = p.m;
  return c;
}

// The unfused products. One batch entry per (batch, kv head): the group's query heads are consecutive in Q,
// O, dO, dQ and in the (B, Hq, Sq, Skv) score buffers, so they stack into gq = group*Sq rows with uniform
// strides, against that kv head's K, V, dK, dV.
struct UnfusedBuffers {
  const void *q, *k, *v, *d_o;
  void *o, *dq, *dk, *dv;
  void* scores;   // fp32: S in the forward, dP in the backward
  void* probs;    // P in the dtype
  void* dscores;  // dS in the dtype
};
struct UnfusedProducts {
  int batch;  // B * Hkv
  RowMajorProduct s, o, dv, dp, dq, dk;
};

UnfusedProducts unfused_products(const Shape& shape, cudaDataType_t dtype, float scale, const UnfusedBuffers& x) {
  const int64_t group = shape.heads_q / shape.heads_kv;
  const int64_t gq = group * shape.seq_q, skv = shape.seq_kv, d = shape.head_dim;
  const int64_t q_stride = gq * d, kv_stride = skv * d, s_stride = gq * skv;
  UnfusedProducts u{};
  u.batch = shape.batch * shape.heads_kv;
  // S (gq, Skv) = scale Q K^T, fp32.
  u.s = {"S = scale Q K^T", false, true, gq, skv, d, x.q, d, q_stride, x.k, d, kv_stride, x.scores, skv, s_stride,
         CUDA_R_32F, scale};
  // O (gq, D) = P V.
  u.o = {"O = P V", false, false, gq, d, skv, x.probs, skv, s_stride, x.v, d, kv_stride, x.o, d, q_stride, dtype,
         1.0f};
  // dV (Skv, D) = P^T dO: the reduction over the gq rows sums the group's query heads.
  u.dv = {"dV = P^T dO", true, false, skv, d, gq, x.probs, skv, s_stride, x.d_o, d, q_stride, x.dv, d, kv_stride,
          dtype, 1.0f};
  // dP (gq, Skv) = dO V^T, fp32, into the score buffer (S is not needed any more: P holds the forward).
  u.dp = {"dP = dO V^T", false, true, gq, skv, d, x.d_o, d, q_stride, x.v, d, kv_stride, x.scores, skv, s_stride,
          CUDA_R_32F, 1.0f};
  // dQ (gq, D) = scale dS K.
  u.dq = {"dQ = scale dS K", false, false, gq, d, skv, x.dscores, skv, s_stride, x.k, d, kv_stride, x.dq, d,
          q_stride, dtype, scale};
  // dK (Skv, D) = scale dS^T Q, summed over the group like dV.
  u.dk = {"dK = scale dS^T Q", true, false, skv, d, gq, x.dscores, skv, s_stride, x.q, d, q_stride, x.dk, d,
          kv_stride, dtype, scale};
  return u;
}

LayoutPtr make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int batch, int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  STRATA_KERNEL_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  LayoutPtr owner(layout);
  STRATA_KERNEL_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                       sizeof stride));
  return owner;
}

// One RowMajorProduct as a cuBLASLt matmul with its algorithm chosen once, by the heuristic.
class LtProduct {
 public:
  LtProduct(cublasLtHandle_t handle, const RowMajorProduct& p, cudaDataType_t in_type, int batch) : spec_(p) {
    const ColumnMajorCall call = column_major(p);
    cublasLtMatmulDesc_t op = nullptr;
    STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    op_.reset(op);
    STRATA_KERNEL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &call.op_first, sizeof call.op_first));
    STRATA_KERNEL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &call.op_second, sizeof call.op_second));
    first_ = make_layout(in_type, call.first_rows, call.first_cols, p.ldb, batch, p.stride_b);
    second_ = make_layout(in_type, call.second_rows, call.second_cols, p.lda, batch, p.stride_a);
    out_ = make_layout(p.c_type, call.out_rows, call.out_cols, p.ldc, batch, p.stride_c);

    cublasLtMatmulPreference_t preference = nullptr;
    STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter> preference_owner(preference);
    size_t workspace = kLtWorkspaceBytes;
    STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace, sizeof workspace));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, op, first_.get(), second_.get(), out_.get(),
                                                       out_.get(), preference, 1, &result, &returned));
    if (returned == 0)
      throw std::invalid_argument(std::string("cuBLASLt has no algorithm for the unfused attention product ") + p.label +
                       " (" + std::to_string(p.m) + "x" + std::to_string(p.n) + "x" + std::to_string(p.k) +
                       ", batch " + std::to_string(batch) + ") on this GPU");
    algo_ = result.algo;
  }

  void run(cublasLtHandle_t handle, void* workspace, cudaStream_t stream) const {
    const float beta = 0.0f;
    STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmul(handle, op_.get(), &spec_.alpha, spec_.b, first_.get(), spec_.a,
                                       second_.get(), &beta, spec_.c, out_.get(), spec_.c, out_.get(), &algo_,
                                       workspace, kLtWorkspaceBytes, stream));
  }

 private:
  RowMajorProduct spec_;
  std::unique_ptr<cublasLtMatmulDescOpaque_t, MatmulDescDeleter> op_;
  LayoutPtr first_, second_, out_;
  cublasLtMatmulAlgo_t algo_{};
};

// Rounds `values` to the dtype in place and returns the stored bits, so the host copy is what the GPU reads.
template <typename T>
std::vector<uint16_t> to_storage(std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if constexpr (std::is_same_v<T, __half>) {
      const __half x = __float2half_rn(values[i]);
      values[i] = __half2float(x);
      bits[i] = static_cast<__half_raw>(x).x;
    } else {
      const __nv_bfloat16 x = __float2bfloat16_rn(values[i]);
      values[i] = __bfloat162float(x);
      bits[i] = static_cast<__nv_bfloat16_raw>(x).x;
    }
  }
  return bits;
}

std::vector<float> widen(DType dtype, const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    if (dtype == DType::fp16) {
      __half_raw raw;
      raw.x = bits[i];
      out[i] = __half2float(__half(raw));
    } else {
      __nv_bfloat16_raw raw;
      raw.x = bits[i];
      out[i] = __bfloat162float(__nv_bfloat16(raw));
    }
  }
  return out;
}

cudaDataType_t cuda_type(DType dtype) { return dtype == DType::fp16 ? CUDA_R_16F : CUDA_R_16BF; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

using FlashKernel = void (*)(FlashParams);

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Attention.

namespace {

// Everything one Attention owns. Lives outside the class so the launch helpers below can take it.
struct Problem {
  Shape shape;
  DType dtype = DType::fp16;
  Impl impl = Impl::flash;
  int device = 0;
  cudaStream_t stream = nullptr;
  size_t q_count = 0, kv_count = 0, lse_count = 0, score_count = 0;
  std::vector<float> host_q, host_k, host_v, host_do;  // inputs as stored, widened
  DeviceBuffer q, k, v, d_o, o, lse, dq, dk, dv, delta;
  // flash
  DeviceBuffer dq_accum;
  FlashParams params{};
  FlashKernel forward_kernel = nullptr, backward_kernel = nullptr;
  size_t forward_smem = 0, backward_smem = 0;
  int backward_rows = 0;
  // unfused
  DeviceBuffer scores, probs, dscores, lt_workspace;
  std::unique_ptr<cublasLtContext, LtHandleDeleter> lt;
  std::vector<LtProduct> forward_products, backward_products;

  ~Problem() {
    if (stream) {
      cudaStreamSynchronize(stream);  // no throwing from a destructor; a failure here resurfaces elsewhere
      cudaStreamDestroy(stream);
    }
  }
};

template <typename T, int D>
void select_flash(Problem& s) {
  s.forward_kernel = flash_forward_kernel<T, D>;
  s.backward_kernel = flash_backward_kernel<T, D>;
  s.forward_smem = layout::fwd_smem_bytes(D);
  s.backward_smem = layout::bwd_smem_bytes(D);
  s.backward_rows = layout::bwd_rows(D);
}

template <typename T>
void launch_row_dot(const Problem& s) {
  const long long rows = static_cast<long long>(s.lse_count);
  const unsigned blocks = static_cast<unsigned>(ceil_div(rows, kRowThreads / 32));
  row_dot_kernel<T><<<blocks, kRowThreads, 0, s.stream>>>(static_cast<const T*>(s.d_o.get()),
                                                          static_cast<const T*>(s.o.get()),
                                                          static_cast<float*>(s.delta.get()), rows,
                                                          s.shape.head_dim);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_scale_convert(const Problem& s) {
  const int64_t wanted = ceil_div(static_cast<int64_t>(s.q_count), kRowThreads);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(wanted, 65536));  // grid-stride beyond
  scale_convert_kernel<T><<<blocks, kRowThreads, 0, s.stream>>>(static_cast<const float*>(s.dq_accum.get()),
                                                                static_cast<T*>(s.dq.get()), s.q_count,
                                                                s.params.scale);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_softmax(const Problem& s) {
  const Shape& sh = s.shape;
  softmax_rows_kernel<T><<<static_cast<unsigned>(s.lse_count), kRowThreads, 0, s.stream>>>(
      static_cast<const float*>(s.scores.get()), static_cast<T*>(s.probs.get()), static_cast<float*>(s.lse.get()),
      sh.seq_q, sh.seq_kv, sh.causal ? 1 : 0, sh.seq_kv - sh.seq_q);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_softmax_grad(const Problem& s) {
  softmax_grad_kernel<T><<<static_cast<unsigned>(s.lse_count), kRowThreads, 0, s.stream>>>(
      static_cast<const T*>(s.probs.get()), static_cast<const float*>(s.scores.get()),
      static_cast<const float*>(s.delta.get()), static_cast<T*>(s.dscores.get()), s.shape.seq_kv);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

struct Attention::State : Problem {};

Attention::Attention(const Shape& shape, DType dtype, Impl impl, uint64_t seed) : state_(std::make_unique<State>()) {
  if (std::string problem = validate(shape, dtype, impl); !problem.empty()) throw std::invalid_argument(problem);
  State& s = *state_;
  s.shape = shape;
  s.dtype = dtype;
  s.impl = impl;
  STRATA_KERNEL_CUDA_CHECK(cudaGetDevice(&s.device));
  int major = 0;
  STRATA_KERNEL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, s.device));
  if (major < 8)  // mma.sync with bf16, ldmatrix and cp.async, and the sm_80/sm_90 build itself
    throw std::invalid_argument("gpu attention needs compute capability 8.0 or newer (device " + std::to_string(s.device) +
                     " has " + std::to_string(major) + ".x)");
  STRATA_KERNEL_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));

  s.q_count = q_elements(shape);
  s.kv_count = kv_elements(shape);
  s.lse_count = lse_elements(shape);
  s.score_count = s.lse_count * static_cast<size_t>(shape.seq_kv);

  s.host_q.resize(s.q_count);
  s.host_k.resize(s.kv_count);
  s.host_v.resize(s.kv_count);
  s.host_do.resize(s.q_count);
  gemm::fill_uniform(s.host_q.data(), s.host_q.size(), seed);
  gemm::fill_uniform(s.host_k.data(), s.host_k.size(), seed + 1);
  gemm::fill_uniform(s.host_v.data(), s.host_v.size(), seed + 2);
  gemm::fill_uniform(s.host_do.data(), s.host_do.size(), seed + 3);
  auto upload = [&](std::vector<float>& values) {
    const std::vector<uint16_t> bits =
        dtype == DType::fp16 ? to_storage<__half>(values) : to_storage<__nv_bfloat16>(values);
    DeviceBuffer buffer = device_alloc(bits.size() * sizeof(uint16_t));
    // On the work stream, waited for: the kernels run on a non-blocking stream that does not order itself
    // after the legacy stream, and `bits` is freed when this returns.
    STRATA_KERNEL_CUDA_CHECK(cudaMemcpyAsync(buffer.get(), bits.data(), bits.size() * sizeof(uint16_t),
                                             cudaMemcpyHostToDevice, s.stream));
    STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
    return buffer;
  };
  s.q = upload(s.host_q);
  s.k = upload(s.host_k);
  s.v = upload(s.host_v);
  s.d_o = upload(s.host_do);
  s.o = device_alloc(s.q_count * 2);
  s.dq = device_alloc(s.q_count * 2);
  s.dk = device_alloc(s.kv_count * 2);
  s.dv = device_alloc(s.kv_count * 2);
  s.lse = device_alloc(s.lse_count * sizeof(float));
  s.delta = device_alloc(s.lse_count * sizeof(float));

  const int group = shape.heads_q / shape.heads_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  if (impl == Impl::flash) {
    s.dq_accum = device_alloc(s.q_count * sizeof(float));
    if (dtype == DType::fp16)
      shape.head_dim == 64 ? select_flash<__half, 64>(s) : select_flash<__half, 128>(s);
    else
      shape.head_dim == 64 ? select_flash<__nv_bfloat16, 64>(s) : select_flash<__nv_bfloat16, 128>(s);
    int optin = 0;
    STRATA_KERNEL_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, s.device));
    const size_t needed = std::max(s.forward_smem, s.backward_smem);
    if (static_cast<size_t>(optin) < needed)
      throw std::invalid_argument("flash attention needs " + std::to_string(needed) +
                       " bytes of shared memory per block; device " + std::to_string(s.device) + " allows " +
                       std::to_string(optin));
    STRATA_KERNEL_CUDA_CHECK(cudaFuncSetAttribute(s.forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(s.forward_smem)));
    STRATA_KERNEL_CUDA_CHECK(cudaFuncSetAttribute(s.backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(s.backward_smem)));
    FlashParams& p = s.params;
    p.q = s.q.get();
    p.k = s.k.get();
    p.v = s.v.get();
    p.d_o = s.d_o.get();
    p.o = s.o.get();
    p.lse = static_cast<float*>(s.lse.get());
    p.delta = static_cast<const float*>(s.delta.get());
    p.dq_accum = static_cast<float*>(s.dq_accum.get());
    p.dk = s.dk.get();
    p.dv = s.dv.get();
    p.batch = shape.batch;
    p.heads_q = shape.heads_q;
    p.heads_kv = shape.heads_kv;
    p.group = group;
    p.seq_q = shape.seq_q;
    p.seq_kv = shape.seq_kv;
    p.causal = shape.causal ? 1 : 0;
    p.causal_offset = shape.seq_kv - shape.seq_q;
    p.scale = scale;
    p.scale_log2 = scale * kLog2e;
  } else {
    s.scores = device_alloc(s.score_count * sizeof(float));
    s.probs = device_alloc(s.score_count * 2);
    s.dscores = device_alloc(s.score_count * 2);
    s.lt_workspace = device_alloc(kLtWorkspaceBytes);
    cublasLtHandle_t handle = nullptr;
    STRATA_KERNEL_CUBLAS_CHECK(cublasLtCreate(&handle));
    s.lt.reset(handle);

    const UnfusedProducts u =
        unfused_products(shape, cuda_type(dtype), scale,
                         {s.q.get(), s.k.get(), s.v.get(), s.d_o.get(), s.o.get(), s.dq.get(), s.dk.get(),
                          s.dv.get(), s.scores.get(), s.probs.get(), s.dscores.get()});
    for (const RowMajorProduct* p : {&u.s, &u.o})
      s.forward_products.emplace_back(handle, *p, cuda_type(dtype), u.batch);
    for (const RowMajorProduct* p : {&u.dv, &u.dp, &u.dq, &u.dk})
      s.backward_products.emplace_back(handle, *p, cuda_type(dtype), u.batch);
  }
  poison_outputs();
}

Attention::~Attention() = default;

void Attention::forward() {
  State& s = *state_;
  const Shape& sh = s.shape;
  if (s.impl == Impl::flash) {
    const unsigned blocks = static_cast<unsigned>(ceil_div(sh.seq_q, kFwdRows) * sh.batch * sh.heads_q);
    s.forward_kernel<<<blocks, kThreads, s.forward_smem, s.stream>>>(s.params);
    STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
    return;
  }
  void* workspace = s.lt_workspace.get();
  s.forward_products[0].run(s.lt.get(), workspace, s.stream);
  s.dtype == DType::fp16 ? launch_softmax<__half>(s) : launch_softmax<__nv_bfloat16>(s);
  s.forward_products[1].run(s.lt.get(), workspace, s.stream);
}

void Attention::backward() {
  State& s = *state_;
  const Shape& sh = s.shape;
  s.dtype == DType::fp16 ? launch_row_dot<__half>(s) : launch_row_dot<__nv_bfloat16>(s);
  if (s.impl == Impl::flash) {
    STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(s.dq_accum.get(), 0, s.q_count * sizeof(float), s.stream));
    const unsigned blocks = static_cast<unsigned>(ceil_div(sh.seq_kv, kBwdKeys) * sh.batch * sh.heads_kv);
    s.backward_kernel<<<blocks, kThreads, s.backward_smem, s.stream>>>(s.params);
    STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
    s.dtype == DType::fp16 ? launch_scale_convert<__half>(s) : launch_scale_convert<__nv_bfloat16>(s);
    return;
  }
  void* workspace = s.lt_workspace.get();
  s.backward_products[0].run(s.lt.get(), workspace, s.stream);  // dV
  s.backward_products[1].run(s.lt.get(), workspace, s.stream);  // dP
  s.dtype == DType::fp16 ? launch_softmax_grad<__half>(s) : launch_softmax_grad<__nv_bfloat16>(s);
  s.backward_products[2].run(s.lt.get(), workspace, s.stream);  // dQ
  s.backward_products[3].run(s.lt.get(), workspace, s.stream);  // dK
}

void* Attention::stream() const { return state_->stream; }

const std::vector<float>& Attention::q() const { return state_->host_q; }
const std::vector<float>& Attention::k() const { return state_->host_k; }
const std::vector<float>& Attention::v() const { return state_->host_v; }
const std::vector<float>& Attention::d_o() const { return state_->host_do; }
const Shape& Attention::shape() const { return state_->shape; }
DType Attention::dtype() const { return state_->dtype; }
Impl Attention::impl() const { return state_->impl; }

void Attention::read_forward(std::vector<float>& o, std::vector<float>& lse) const {
  const State& s = *state_;
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  std::vector<uint16_t> bits(s.q_count);
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpy(bits.data(), s.o.get(), bits.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  o = widen(s.dtype, bits);
  lse.resize(s.lse_count);
  STRATA_KERNEL_CUDA_CHECK(cudaMemcpy(lse.data(), s.lse.get(), lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
}

void Attention::read_backward(std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv) const {
  const State& s = *state_;
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  auto read = [&](const DeviceBuffer& buffer, size_t count) {
    std::vector<uint16_t> bits(count);
    STRATA_KERNEL_CUDA_CHECK(cudaMemcpy(bits.data(), buffer.get(), count * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    return widen(s.dtype, bits);
  };
  dq = read(s.dq, s.q_count);
  dk = read(s.dk, s.kv_count);
  dv = read(s.dv, s.kv_count);
}

void Attention::poison_outputs() {
  State& s = *state_;
  // 0xFF bytes are NaN in fp32, fp16 and bf16.
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(s.o.get(), 0xFF, s.q_count * 2, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(s.lse.get(), 0xFF, s.lse_count * sizeof(float), s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(s.dq.get(), 0xFF, s.q_count * 2, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(s.dk.get(), 0xFF, s.kv_count * 2, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(s.dv.get(), 0xFF, s.kv_count * 2, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

void Attention::corrupt_output(size_t element) {
  State& s = *state_;
  if (element >= s.q_count) throw std::out_of_range("corrupt_output: element beyond O");
  STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(static_cast<unsigned char*>(static_cast<void*>(s.o.get())) + element * 2, 0x7F, 2, s.stream));
  STRATA_KERNEL_CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

std::string Attention::description() const {
  const State& s = *state_;
  if (s.impl == Impl::flash) {
    return "flash fwd/bwd, tensor cores mma.sync m16n8k16 " + name(s.dtype) +
           " (fp32 accumulation), fwd Br=" + std::to_string(kFwdRows) + " Bc=" + std::to_string(kFwdKeys) +
           ", bwd Bc=" + std::to_string(kBwdKeys) + " Br=" + std::to_string(s.backward_rows) +
           " with dQ by fp32 atomics, 4 warps";
  }
  char workspace[32];
  std::snprintf(workspace, sizeof workspace, "%.1f MiB",
                static_cast<double>(unfused_workspace_bytes(s.shape)) / (1 << 20));
  return "unfused, cuBLASLt strided-batched GEMMs (batch b*hkv, group heads stacked) around fp32 scores, softmax "
         "kernel, P and dS in " + name(s.dtype) + ", " + workspace + " score workspace";
}

// ---------------------------------------------------------------------------------------------------------
// Check against the float64 reference.

namespace {

// compare()'s element test with a floor per element (a difference within bound[i] always passes), and the plain
// relative L2 error, so the summary still shows how far the result is from the reference.
ErrorReport compare_bounded(const float* got, const double* ref, const std::vector<double>& bound, double tol) {
  const size_t n = bound.size();
  double ref_squares = 0.0;
  size_t finite = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isfinite(ref[i])) {
      ref_squares += ref[i] * ref[i];
      ++finite;
    }
  }
  const double ref_rms = finite == 0 ? 0.0 : std::sqrt(ref_squares / static_cast<double>(finite));
  ErrorReport report;
  double diff_squares = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double have = got[i];
    if (!std::isfinite(ref[i]) || !std::isfinite(have)) {
      if (!(ref[i] == have)) ++report.bad;
      continue;
    }
    const double diff = std::abs(have - ref[i]);
    report.max_abs = std::max(report.max_abs, diff);
    diff_squares += diff * diff;
    if (diff > std::max(tol * (std::abs(ref[i]) + ref_rms), bound[i])) ++report.bad;
  }
  report.rel_l2 = ref_squares > 0.0 ? std::sqrt(diff_squares / ref_squares) : std::sqrt(diff_squares);
  return report;
}

// Bounds on the rounding in dQ and dK of one slice (the query heads of one kv head: Q, O, dO (group, Sq, D),
// K, V (Skv, D)). Both GPU paths store dS in the dtype (the unfused one P before it too) and form delta from
// O in the dtype, so the terms of dQ_i = scale sum_j dS_ij K_j each carry a relative error of about the
// dtype's unit roundoff u. Those terms cancel by construction (sum_j dS_ij = 0: a row that sees two keys has
// dS_i0 = -dS_i1), which leaves dQ of rows with few keys far below its terms and below the tensor's RMS, where
// compare()'s element test alone would flag plain rounding. The bound is 2 u scale sum_j (|dS_ij| +
// P_ij sum_d |dO_id O_id|) |K_jc|, and the same with Q for dK; any indexing or masking error exceeds it.
void gradient_bounds(const Shape& slice, const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, const std::vector<double>& o, const std::vector<double>& d_o,
                     const std::vector<double>& lse, double unit_roundoff, std::vector<double>& dq_bound,
                     std::vector<double>& dk_bound) {
  const int d = slice.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const long offset = static_cast<long>(slice.seq_kv) - slice.seq_q;
  auto dot = [d](const double* a, const double* b) {
    double sum = 0.0;
    for (int c = 0; c < d; ++c) sum += a[c] * b[c];
    return sum;
  };
  for (long row = 0; row < static_cast<long>(slice.heads_q) * slice.seq_q; ++row) {
    const long i = row % slice.seq_q;
    const long visible = slice.causal ? std::clamp(i + offset + 1, 0L, static_cast<long>(slice.seq_kv))
                                      : static_cast<long>(slice.seq_kv);
    const double* qi = &q[static_cast<size_t>(row) * d];
    const double* doi = &d_o[static_cast<size_t>(row) * d];
    const double* oi = &o[static_cast<size_t>(row) * d];
    const double delta = dot(doi, oi);
    double spread = 0.0;
    for (int c = 0; c < d; ++c) spread += std::abs(doi[c] * oi[c]);
    for (long j = 0; j < visible; ++j) {
      const double* kj = &k[static_cast<size_t>(j) * d];
      const double p = std::exp(scale * dot(qi, kj) - lse[static_cast<size_t>(row)]);
      const double ds = p * (dot(doi, &v[static_cast<size_t>(j) * d]) - delta);
      const double weight = std::abs(ds) + p * spread;
      for (int c = 0; c < d; ++c) {
        dq_bound[static_cast<size_t>(row) * d + c] += weight * std::abs(kj[c]);
        dk_bound[static_cast<size_t>(j) * d + c] += weight * std::abs(qi[c]);
      }
    }
  }
  for (double& b : dq_bound) b *= 2.0 * unit_roundoff * scale;
  for (double& b : dk_bound) b *= 2.0 * unit_roundoff * scale;
}

}  // namespace

CheckReport check(const Attention& attention, bool backward, int batch, int kv_head) {
  const Shape& s = attention.shape();
  if (batch < 0 || batch >= s.batch)
    throw std::invalid_argument("check: batch " + std::to_string(batch) + " out of range [0, " + std::to_string(s.batch) + ")");
  if (kv_head < 0 || kv_head >= s.heads_kv)
    throw std::invalid_argument("check: kv_head " + std::to_string(kv_head) + " out of range [0, " +
                     std::to_string(s.heads_kv) + ")");
  const int group = s.heads_q / s.heads_kv;
  const Shape slice{1, group, 1, s.seq_q, s.seq_kv, s.head_dim, s.causal};
  // The group's query heads are consecutive, so their rows of Q, O, dO, dQ and lse are contiguous.
  const size_t first_head = static_cast<size_t>(batch) * s.heads_q + static_cast<size_t>(kv_head) * group;
  const size_t q_offset = first_head * s.seq_q * s.head_dim;
  const size_t q_count = static_cast<size_t>(group) * s.seq_q * s.head_dim;
  const size_t kv_offset = (static_cast<size_t>(batch) * s.heads_kv + kv_head) * s.seq_kv * s.head_dim;
  const size_t kv_count = static_cast<size_t>(s.seq_kv) * s.head_dim;
  const size_t lse_offset = first_head * s.seq_q, lse_count = static_cast<size_t>(group) * s.seq_q;
  auto slice_of = [](const std::vector<float>& x, size_t offset, size_t count) {
    return std::vector<double>(x.begin() + static_cast<std::ptrdiff_t>(offset),
                               x.begin() + static_cast<std::ptrdiff_t>(offset + count));
  };

  CheckReport report;
  report.backward = backward;
  report.tolerance = tolerance(attention.dtype() == DType::fp16 ? Precision::fp16 : Precision::bf16);
  const double tol = report.tolerance;

  std::vector<float> o, lse;
  attention.read_forward(o, lse);
  const std::vector<double> q = slice_of(attention.q(), q_offset, q_count);
  const std::vector<double> k = slice_of(attention.k(), kv_offset, kv_count);
  const std::vector<double> v = slice_of(attention.v(), kv_offset, kv_count);
  std::vector<double> o_ref(q_count), lse_ref(lse_count);
  reference_forward(slice, q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data());
  report.o = compare(o.data() + q_offset, o_ref.data(), q_count, tol);
  report.lse = compare(lse.data() + lse_offset, lse_ref.data(), lse_count, tol);
  report.passed = within(report.o, tol) && within(report.lse, tol);

  if (backward) {
    std::vector<float> dq, dk, dv;
    attention.read_backward(dq, dk, dv);
    const std::vector<double> d_o = slice_of(attention.d_o(), q_offset, q_count);
    std::vector<double> dq_ref(q_count), dk_ref(kv_count), dv_ref(kv_count);
    reference_backward(slice, q.data(), k.data(), v.data(), o_ref.data(), d_o.data(), lse_ref.data(), dq_ref.data(),
                       dk_ref.data(), dv_ref.data());
    std::vector<double> dq_bound(q_count), dk_bound(kv_count);
    const double unit_roundoff = attention.dtype() == DType::fp16 ? 0x1.0p-11 : 0x1.0p-8;
    gradient_bounds(slice, q, k, v, o_ref, d_o, lse_ref, unit_roundoff, dq_bound, dk_bound);
    report.dq = compare_bounded(dq.data() + q_offset, dq_ref.data(), dq_bound, tol);
    report.dk = compare_bounded(dk.data() + kv_offset, dk_ref.data(), dk_bound, tol);
    report.dv = compare(dv.data() + kv_offset, dv_ref.data(), kv_count, tol);
    report.passed = report.passed && within(report.dq, tol) && within(report.dk, tol) && within(report.dv, tol);
  }

  auto part = [](const char* label, const ErrorReport& r) {
    char text[96];
    std::snprintf(text, sizeof text, "%s rel_l2 %.2e bad %zu", label, r.rel_l2, r.bad);
    return std::string(text);
  };
  report.summary = part("o", report.o) + ", " + part("lse", report.lse);
  if (backward)
    report.summary += ", " + part("dq", report.dq) + ", " + part("dk", report.dk) + ", " + part("dv", report.dv);
  char tail[64];
  std::snprintf(tail, sizeof tail, " (tolerance %.0e): %s", tol, report.passed ? "pass" : "FAIL");
  report.summary += tail;
  return report;
}

}  // namespace strata::attention::gpu
