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
// the host tests check them; names, parsing, validation, the workspace layout and the check against float64 are
// in attention_cuda_host.cpp.
#include "kernels/attention_cuda.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda_handles.h"
#include "kernels/error.h"
#include "kernels/flash_layout.h"

namespace strata::attention::gpu {

namespace {

using cuda::LayoutPtr;
using cuda::MatmulDescDeleter;
using cuda::PreferenceDeleter;

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

template <int N>
__device__ __forceinline__ void zero_fragments(float (&f)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) f[i][0] = f[i][1] = f[i][2] = f[i][3] = 0.0f;
}

// Rows g and g+8 of a warp's 16 x D fp32 accumulators, times a per-row factor, to its 16 rows of shared memory
// (row stride LD), so they can leave as 16-byte stores.
template <typename T, int D, int LD>
__device__ __forceinline__ void stage_warp_rows(T* smem, const float (&acc)[D / 8][4], float scale_g, float scale_g8,
                                                int g, int t) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    *reinterpret_cast<uint32_t*>(smem + g * LD + i * 8 + 2 * t) = pack2<T>(acc[i][0] * scale_g, acc[i][1] * scale_g);
    *reinterpret_cast<uint32_t*>(smem + (g + 8) * LD + i * 8 + 2 * t) =
        pack2<T>(acc[i][2] * scale_g8, acc[i][3] * scale_g8);
  }
}

// --- forward: one warp's 16 query rows against one tile of Bc keys ---

// S (16 x Bc) = Q K^T; K rows are B's columns, so plain ldmatrix of K gives B fragments.
template <typename T, int D, int Bc, int LD>
__device__ __forceinline__ void forward_scores(float (&s)[Bc / 8][4], const uint32_t (&qf)[D / 16][4], const T* cK,
                                               layout::Element across) {
  zero_fragments(s);
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
}

// The online softmax's step for one tile: mask (sequence end, causal), move to the log2 domain, raise the
// running max, turn S into P = exp2(s - max) in place, and rescale the running sum and the O accumulator.
template <int D, int Bc>
__device__ __forceinline__ void online_softmax(float (&s)[Bc / 8][4], float (&acc)[D / 8][4], float (&row_max)[2],
                                               float (&row_sum)[2], const FlashParams& p, int kv0,
                                               const int (&row)[2], int t) {
  // Masked scores become -inf so exp2 gives 0.
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
}

// O += P V. The C layout of two adjacent 8-key tiles of P is the A layout of one 16-key slice, so P stays in
// registers; V's rows are the reduction dimension, hence ldmatrix.trans.
template <typename T, int D, int Bc, int LD>
__device__ __forceinline__ void accumulate_pv(float (&acc)[D / 8][4], const float (&s)[Bc / 8][4], const T* cV,
                                              layout::Element down) {
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
}

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
  zero_fragments(acc);
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
    float s[Bc / 8][4];  // this warp's 16 x Bc scores, then probabilities
    forward_scores<T, D, Bc, LD>(s, qf, cK, across);
    online_softmax<D, Bc>(s, acc, row_max, row_sum, p, j * Bc, row, t);
    accumulate_pv<T, D, Bc, LD>(acc, s, cV, down);
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
  stage_warp_rows<T, D, LD>(sO, acc, inv[0], inv[1], g, t);
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

// --- backward: one warp's 16 keys against one staged query tile of Br rows ---

// S^T = K Q^T and dP^T = V dO^T (16 keys x Br queries): K and V rows are A, and the Q / dO rows are B's columns.
template <typename T, int D, int Br, int LD>
__device__ __forceinline__ void backward_scores(float (&st)[Br / 8][4], float (&dpt)[Br / 8][4], const T* sK,
                                                const T* sV, const T* cQ, const T* cdO, int warp,
                                                layout::Element down, layout::Element across) {
  zero_fragments(st);
  zero_fragments(dpt);
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
}

// P^T = exp(scale S^T - lse) recomputed from the forward's lse, in place of S^T; dS^T = P^T (dP^T - delta) in
// place of dP^T. Masked pairs (sequence ends, causal) are 0 in both, so they add nothing to dV, dK or dQ.
template <int Br>
__device__ __forceinline__ void backward_softmax(float (&st)[Br / 8][4], float (&dpt)[Br / 8][4], const float* cLse,
                                                 const float* cDelta, const FlashParams& p, int r0,
                                                 const int (&key)[2], int t) {
#pragma unroll
  for (int nt = 0; nt < Br / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = nt * 8 + 2 * t + (e & 1);  // query within the tile
      const int query = r0 + col, kv = key[e >> 1];
      const bool visible = kv < p.seq_kv && query < p.seq_q && (!p.causal || kv <= query + p.causal_offset);
      const float prob = visible ? exp2f(st[nt][e] * p.scale_log2 - cLse[col]) : 0.0f;
      st[nt][e] = prob;
      dpt[nt][e] = prob * (dpt[nt][e] - cDelta[col]);
    }
  }
}

// dV += P^T dO and dK += dS^T Q: P^T and dS^T become A fragments in registers (as P in the forward), the query
// rows of dO and Q are the reduction dimension, hence ldmatrix.trans.
template <typename T, int D, int Br, int LD>
__device__ __forceinline__ void accumulate_dv_dk(float (&dv)[D / 8][4], float (&dk)[D / 8][4],
                                                 const float (&pt)[Br / 8][4], const float (&dst)[Br / 8][4],
                                                 const T* cQ, const T* cdO, layout::Element down) {
#pragma unroll
  for (int kt = 0; kt < Br / 16; ++kt) {
    uint32_t pa[4];
    a_from_accumulators<T>(pa, pt[2 * kt], pt[2 * kt + 1]);
    uint32_t da[4];
    a_from_accumulators<T>(da, dst[2 * kt], dst[2 * kt + 1]);
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
}

// dQ (Br x D) += dS (Br x Bc) K (Bc x D) for the query tile at row r0 of head bh. dQ needs whole rows of dS
// across the four warps' keys: each warp shares its dS^T rows (keys x queries) through sdS, rounded exactly as
// the dK product saw them; then the warps split Br/16 row tiles x column ranges. dS is stored transposed, so
// its A fragments come from ldmatrix.trans; K's rows are the reduction dimension. Other key blocks add to the
// same dQ rows: fp32 atomics.
template <typename T, int D, int Br, int Bc, int LD, int LDS>
__device__ __forceinline__ void accumulate_dq(T* sdS, const float (&dst)[Br / 8][4], const T* sK,
                                              const FlashParams& p, int bh, int r0, int warp, int g, int t,
                                              layout::Element down, layout::Element across) {
#pragma unroll
  for (int nt = 0; nt < Br / 8; ++nt) {
    *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g) * LDS + nt * 8 + 2 * t) = pack2<T>(dst[nt][0], dst[nt][1]);
    *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g + 8) * LDS + nt * 8 + 2 * t) =
        pack2<T>(dst[nt][2], dst[nt][3]);
  }
  __syncthreads();

  constexpr int kRowTiles = Br / 16;
  constexpr int kCols = layout::bwd_dq_cols(D);  // columns of dQ per warp: 64 in both configurations
  const int mt = warp % kRowTiles, c0 = (warp / kRowTiles) * kCols;
  float dq[kCols / 8][4];
  zero_fragments(dq);
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
  zero_fragments(dk);
  zero_fragments(dv);
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

    float st[Br / 8][4], dpt[Br / 8][4];  // S^T then P^T; dP^T then dS^T
    backward_scores<T, D, Br, LD>(st, dpt, sK, sV, cQ, cdO, warp, down, across);
    backward_softmax<Br>(st, dpt, sLse + buf * Br, sDelta + buf * Br, p, r0, key, t);
    accumulate_dv_dk<T, D, Br, LD>(dv, dk, st, dpt, cQ, cdO, down);
    accumulate_dq<T, D, Br, Bc, LD, LDS>(sdS, dpt, sK, p, bh, r0, warp, g, t, down, across);

    if (it + 1 < steps) cp_async_wait_all();
    __syncthreads();  // next step landed for everyone; sdS and this step's buffers may be overwritten
  }

  // dK carries the softmax scale (dK = scale dS^T Q). Stage each warp's 16 rows through its own rows of sK and
  // sV (every warp has passed the last __syncthreads, so no one reads them any more) for 16-byte stores.
  T* sdK = sK + warp * 16 * LD;
  T* sdV = sV + warp * 16 * LD;
  stage_warp_rows<T, D, LD>(sdK, dk, p.scale, p.scale, g, t);
  stage_warp_rows<T, D, LD>(sdV, dv, 1.0f, 1.0f, g, t);
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
  LtProduct(cublasLtHandle_t handle, const RowMajorProduct& p, cudaDataType_t in_type, int batch) : alpha_(p.alpha) {
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
    size_t workspace = kUnfusedCublasLtBytes;
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

  // `call` is the planned product with the pointers of this call.
  void run(cublasLtHandle_t handle, const RowMajorProduct& call, void* workspace, cudaStream_t stream) const {
    const float beta = 0.0f;
    STRATA_KERNEL_CUBLAS_CHECK(cublasLtMatmul(handle, op_.get(), &alpha_, call.b, first_.get(), call.a, second_.get(),
                                              &beta, call.c, out_.get(), call.c, out_.get(), &algo_, workspace,
                                              kUnfusedCublasLtBytes, stream));
  }

 private:
  float alpha_ = 1.0f;
  std::unique_ptr<cublasLtMatmulDescOpaque_t, MatmulDescDeleter> op_;
  LayoutPtr first_, second_, out_;
  cublasLtMatmulAlgo_t algo_{};
};

template <typename T>
std::vector<uint16_t> round_to(std::vector<float>& values) {
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

}  // namespace

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

std::vector<uint16_t> to_storage(DType dtype, std::vector<float>& values) {
  return dtype == DType::fp16 ? round_to<__half>(values) : round_to<__nv_bfloat16>(values);
}

namespace {

cudaDataType_t cuda_type(DType dtype) { return dtype == DType::fp16 ? CUDA_R_16F : CUDA_R_16BF; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

using FlashKernel = void (*)(FlashParams);

}  // namespace


// ---------------------------------------------------------------------------------------------------------
// Plan.

namespace {

// Everything a Plan holds. Lives outside the class so the launch helpers below can take it.
struct PlanState {
  Shape shape;
  DType dtype = DType::fp16;
  Impl impl = Impl::flash;
  WorkspaceLayout layout;
  float scale = 1.0f;
  // flash
  FlashKernel forward_kernel = nullptr, backward_kernel = nullptr;
  size_t forward_smem = 0, backward_smem = 0;
  int backward_rows = 0;
  // unfused: S, O in the forward; dV, dP, dQ, dK in the backward
  cuda::LtHandle lt;
  std::vector<LtProduct> forward_products, backward_products;
};

template <typename T, int D>
void select_flash(PlanState& s) {
  s.forward_kernel = flash_forward_kernel<T, D>;
  s.backward_kernel = flash_backward_kernel<T, D>;
  s.forward_smem = layout::fwd_smem_bytes(D);
  s.backward_smem = layout::bwd_smem_bytes(D);
  s.backward_rows = layout::bwd_rows(D);
}

// The shape's part of the flash kernels' parameters; the call fills in the pointers.
FlashParams flash_params(const PlanState& s) {
  const Shape& shape = s.shape;
  FlashParams p{};
  p.batch = shape.batch;
  p.heads_q = shape.heads_q;
  p.heads_kv = shape.heads_kv;
  p.group = shape.heads_q / shape.heads_kv;
  p.seq_q = shape.seq_q;
  p.seq_kv = shape.seq_kv;
  p.causal = shape.causal ? 1 : 0;
  p.causal_offset = shape.seq_kv - shape.seq_q;
  p.scale = s.scale;
  p.scale_log2 = s.scale * kLog2e;
  return p;
}

void require_workspace(const PlanState& s, const Workspace& workspace) {
  if (workspace.data == nullptr || workspace.bytes < s.layout.bytes)
    throw std::invalid_argument("attention workspace of " + std::to_string(workspace.bytes) + " bytes; " +
                                name(s.impl) + " needs " + std::to_string(s.layout.bytes) + " (workspace_bytes())");
  if (reinterpret_cast<uintptr_t>(workspace.data) % 256 != 0)
    throw std::invalid_argument("attention workspace is not 256-byte aligned");
}

void require_aligned(const PlanState& s, std::initializer_list<const void*> tensors) {
  const uintptr_t alignment = s.impl == Impl::unfused ? 256 : 16;
  for (const void* t : tensors) {
    if (t == nullptr) throw std::invalid_argument("attention tensor pointer is null");
    if (reinterpret_cast<uintptr_t>(t) % alignment != 0)
      throw std::invalid_argument(name(s.impl) + " attention needs tensors aligned to " + std::to_string(alignment) +
                                  " bytes");
  }
}

template <typename T>
void launch_row_dot(const Shape& shape, const void* d_o, const void* o, float* delta, cudaStream_t stream) {
  const long long rows = static_cast<long long>(lse_elements(shape));
  const unsigned blocks = static_cast<unsigned>(ceil_div(rows, kRowThreads / 32));
  row_dot_kernel<T><<<blocks, kRowThreads, 0, stream>>>(static_cast<const T*>(d_o), static_cast<const T*>(o), delta,
                                                        rows, shape.head_dim);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_scale_convert(const float* in, void* out, size_t count, float scale, cudaStream_t stream) {
  const int64_t wanted = ceil_div(static_cast<int64_t>(count), kRowThreads);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(wanted, 65536));  // grid-stride beyond
  scale_convert_kernel<T><<<blocks, kRowThreads, 0, stream>>>(in, static_cast<T*>(out), count, scale);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_softmax(const Shape& shape, const float* scores, void* probs, float* lse, cudaStream_t stream) {
  softmax_rows_kernel<T><<<static_cast<unsigned>(lse_elements(shape)), kRowThreads, 0, stream>>>(
      scores, static_cast<T*>(probs), lse, shape.seq_q, shape.seq_kv, shape.causal ? 1 : 0,
      shape.seq_kv - shape.seq_q);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_softmax_grad(const Shape& shape, const void* probs, const float* dprobs, const float* delta,
                         void* dscores, cudaStream_t stream) {
  softmax_grad_kernel<T><<<static_cast<unsigned>(lse_elements(shape)), kRowThreads, 0, stream>>>(
      static_cast<const T*>(probs), dprobs, delta, static_cast<T*>(dscores), shape.seq_kv);
  STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

struct Plan::State : PlanState {};

Plan::Plan(const Shape& shape, DType dtype, Impl impl) : state_(std::make_unique<State>()) {
  if (std::string problem = validate(shape, dtype, impl); !problem.empty()) throw std::invalid_argument(problem);
  State& s = *state_;
  s.shape = shape;
  s.dtype = dtype;
  s.impl = impl;
  s.layout = workspace_layout(shape, dtype, impl);
  s.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  int device = 0, major = 0;
  STRATA_KERNEL_CUDA_CHECK(cudaGetDevice(&device));
  STRATA_KERNEL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 8)  // mma.sync with bf16, ldmatrix and cp.async, and the sm_80/sm_90 build itself
    throw std::invalid_argument("gpu attention needs compute capability 8.0 or newer (device " + std::to_string(device) +
                                " has " + std::to_string(major) + ".x)");
  if (impl == Impl::flash) {
    if (dtype == DType::fp16)
      shape.head_dim == 64 ? select_flash<__half, 64>(s) : select_flash<__half, 128>(s);
    else
      shape.head_dim == 64 ? select_flash<__nv_bfloat16, 64>(s) : select_flash<__nv_bfloat16, 128>(s);
    int optin = 0;
    STRATA_KERNEL_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const size_t needed = std::max(s.forward_smem, s.backward_smem);
    if (static_cast<size_t>(optin) < needed)
      throw std::invalid_argument("flash attention needs " + std::to_string(needed) +
                                  " bytes of shared memory per block; device " + std::to_string(device) + " allows " +
                                  std::to_string(optin));
    STRATA_KERNEL_CUDA_CHECK(cudaFuncSetAttribute(s.forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(s.forward_smem)));
    STRATA_KERNEL_CUDA_CHECK(cudaFuncSetAttribute(s.backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(s.backward_smem)));
    return;
  }
  cublasLtHandle_t handle = nullptr;
  STRATA_KERNEL_CUBLAS_CHECK(cublasLtCreate(&handle));
  s.lt.reset(handle);
  // The layouts and algorithms depend on the shape alone; each call supplies its pointers.
  const UnfusedProducts u = unfused_products(shape, cuda_type(dtype), s.scale, UnfusedBuffers{});
  for (const RowMajorProduct* p : {&u.s, &u.o}) s.forward_products.emplace_back(handle, *p, cuda_type(dtype), u.batch);
  for (const RowMajorProduct* p : {&u.dv, &u.dp, &u.dq, &u.dk})
    s.backward_products.emplace_back(handle, *p, cuda_type(dtype), u.batch);
}

Plan::~Plan() = default;

void Plan::forward(const ForwardTensors& t, const Workspace& workspace, Stream stream) const {
  const State& s = *state_;
  require_workspace(s, workspace);
  require_aligned(s, {t.q, t.k, t.v, t.o, t.lse});
  const Shape& sh = s.shape;
  if (s.impl == Impl::flash) {
    FlashParams p = flash_params(s);
    p.q = t.q;
    p.k = t.k;
    p.v = t.v;
    p.o = t.o;
    p.lse = t.lse;
    const unsigned blocks = static_cast<unsigned>(ceil_div(sh.seq_q, kFwdRows) * sh.batch * sh.heads_q);
    s.forward_kernel<<<blocks, kThreads, s.forward_smem, stream>>>(p);
    STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
    return;
  }
  auto* base = static_cast<unsigned char*>(workspace.data);
  float* scores = reinterpret_cast<float*>(base + s.layout.scores);
  void* probs = base + s.layout.probs;
  const UnfusedProducts u =
      unfused_products(sh, cuda_type(s.dtype), s.scale,
                       {t.q, t.k, t.v, nullptr, t.o, nullptr, nullptr, nullptr, scores, probs, nullptr});
  void* lt_workspace = base + s.layout.cublaslt;
  s.forward_products[0].run(s.lt.get(), u.s, lt_workspace, stream);
  s.dtype == DType::fp16 ? launch_softmax<__half>(sh, scores, probs, t.lse, stream)
                         : launch_softmax<__nv_bfloat16>(sh, scores, probs, t.lse, stream);
  s.forward_products[1].run(s.lt.get(), u.o, lt_workspace, stream);
}

void Plan::backward(const BackwardTensors& t, const Workspace& workspace, Stream stream) const {
  const State& s = *state_;
  require_workspace(s, workspace);
  require_aligned(s, {t.q, t.k, t.v, t.o, t.d_o, t.lse, t.dq, t.dk, t.dv});
  const Shape& sh = s.shape;
  auto* base = static_cast<unsigned char*>(workspace.data);
  float* delta = reinterpret_cast<float*>(base + s.layout.delta);
  s.dtype == DType::fp16 ? launch_row_dot<__half>(sh, t.d_o, t.o, delta, stream)
                         : launch_row_dot<__nv_bfloat16>(sh, t.d_o, t.o, delta, stream);
  if (s.impl == Impl::flash) {
    float* dq_accum = reinterpret_cast<float*>(base + s.layout.dq_accum);
    const size_t q_count = q_elements(sh);
    STRATA_KERNEL_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, q_count * sizeof(float), stream));
    FlashParams p = flash_params(s);
    p.q = t.q;
    p.k = t.k;
    p.v = t.v;
    p.d_o = t.d_o;
    p.lse = const_cast<float*>(t.lse);  // the backward kernel only reads it
    p.delta = delta;
    p.dq_accum = dq_accum;
    p.dk = t.dk;
    p.dv = t.dv;
    const unsigned blocks = static_cast<unsigned>(ceil_div(sh.seq_kv, kBwdKeys) * sh.batch * sh.heads_kv);
    s.backward_kernel<<<blocks, kThreads, s.backward_smem, stream>>>(p);
    STRATA_KERNEL_CUDA_CHECK(cudaGetLastError());
    s.dtype == DType::fp16 ? launch_scale_convert<__half>(dq_accum, t.dq, q_count, s.scale, stream)
                           : launch_scale_convert<__nv_bfloat16>(dq_accum, t.dq, q_count, s.scale, stream);
    return;
  }
  float* scores = reinterpret_cast<float*>(base + s.layout.scores);  // dP here
  void* probs = base + s.layout.probs;
  void* dscores = base + s.layout.dscores;
  const UnfusedProducts u =
      unfused_products(sh, cuda_type(s.dtype), s.scale,
                       {t.q, t.k, t.v, t.d_o, nullptr, t.dq, t.dk, t.dv, scores, probs, dscores});
  void* lt_workspace = base + s.layout.cublaslt;
  s.backward_products[0].run(s.lt.get(), u.dv, lt_workspace, stream);
  s.backward_products[1].run(s.lt.get(), u.dp, lt_workspace, stream);
  s.dtype == DType::fp16 ? launch_softmax_grad<__half>(sh, probs, scores, delta, dscores, stream)
                         : launch_softmax_grad<__nv_bfloat16>(sh, probs, scores, delta, dscores, stream);
  s.backward_products[2].run(s.lt.get(), u.dq, lt_workspace, stream);
  s.backward_products[3].run(s.lt.get(), u.dk, lt_workspace, stream);
}

const Shape& Plan::shape() const { return state_->shape; }
DType Plan::dtype() const { return state_->dtype; }
Impl Plan::impl() const { return state_->impl; }
std::size_t Plan::workspace_bytes() const { return state_->layout.bytes; }

std::string Plan::description() const {
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

}  // namespace strata::attention::gpu
