// The flash attention kernels' data layout (kernels/flash_layout.h), checked on the host: the mma.sync
// m16n8k16 and ldmatrix.x4 index maps are composed exactly as the kernels issue them (addresses, register
// reuse of accumulators, the dS^T staging) and must reproduce each tile product of the forward and backward
// passes; the tile sizes must fit the shared memory of sm_80 and sm_90; and the host side of GPU attention
// (kernels/attention_cuda_host.cpp): request validation, the workspace layout, and the float64 check, fed with
// the CPU kernels' results. Small integer values keep every tile product exact.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_cuda.h"
#include "kernels/gemm_check.h"
#include "kernels/flash_layout.h"

namespace strata::attention::gpu::layout {
namespace {

struct Matrix {
  int rows = 0, cols = 0;
  std::vector<double> values;
  Matrix(int r, int c) : rows(r), cols(c), values(static_cast<std::size_t>(r) * static_cast<std::size_t>(c), 0.0) {}
  double& at(int r, int c) { return values[static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c)]; }
  double at(int r, int c) const {
    return values[static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c)];
  }
};

Matrix random_matrix(int rows, int cols, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> small(-3, 3);
  Matrix m(rows, cols);
  for (double& x : m.values) x = small(rng);
  return m;
}

Matrix transpose(const Matrix& m) {
  Matrix t(m.cols, m.rows);
  for (int r = 0; r < m.rows; ++r)
    for (int c = 0; c < m.cols; ++c) t.at(c, r) = m.at(r, c);
  return t;
}

// rows [row0, row0 + rows) of a times b.
Matrix product(const Matrix& a, const Matrix& b, int row0, int rows) {
  Matrix c(rows, b.cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < b.cols; ++j)
      for (int k = 0; k < a.cols; ++k) c.at(i, j) += a.at(row0 + i, k) * b.at(k, j);
  return c;
}

// One warp's registers: four 32-bit registers of two 16-bit halves per lane (an A fragment or an ldmatrix.x4
// result), and one 16x8 fp32 accumulator tile.
using Fragment = std::array<std::array<std::array<double, 2>, 4>, 32>;
using Accumulator = std::array<std::array<double, 4>, 32>;

// ldmatrix.x4 (.trans when `trans`) with lane L supplying the address of row row0 + address(L).row, column
// col0 + address(L).col of `m`, as the kernels compute it.
Fragment ldmatrix_x4(const Matrix& m, int row0, int col0, Element (*address)(int), bool trans) {
  Fragment out{};
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i)
      for (int half = 0; half < 2; ++half) {
        const Element e = ldmatrix_element(lane, half, trans);  // within matrix i, in memory order
        const Element row_start = address(8 * i + e.row);        // the lane that addressed that row
        out[static_cast<std::size_t>(lane)][static_cast<std::size_t>(i)][static_cast<std::size_t>(half)] =
            m.at(row0 + row_start.row, col0 + row_start.col + e.col);
      }
  return out;
}

// mma.sync.m16n8k16: d += A B with A from `a` and B from registers b_first, b_first + 1 of `b`.
void mma(Accumulator& d, const Fragment& a, const Fragment& b, int b_first) {
  Matrix am(16, 16), bm(16, 8);
  for (int lane = 0; lane < 32; ++lane)
    for (int half = 0; half < 2; ++half) {
      for (int reg = 0; reg < 4; ++reg) {
        const Element e = a_element(lane, reg, half);
        am.at(e.row, e.col) = a[static_cast<std::size_t>(lane)][static_cast<std::size_t>(reg)][static_cast<std::size_t>(half)];
      }
      for (int reg = 0; reg < 2; ++reg) {
        const Element e = b_element(lane, reg, half);
        bm.at(e.row, e.col) =
            b[static_cast<std::size_t>(lane)][static_cast<std::size_t>(b_first + reg)][static_cast<std::size_t>(half)];
      }
    }
  for (int lane = 0; lane < 32; ++lane)
    for (int index = 0; index < 4; ++index) {
      const Element e = c_element(lane, index);
      double sum = 0.0;
      for (int k = 0; k < 16; ++k) sum += am.at(e.row, k) * bm.at(k, e.col);
      d[static_cast<std::size_t>(lane)][static_cast<std::size_t>(index)] += sum;
    }
}

// The kernels' a_from_accumulators: two accumulator tiles as one A fragment.
Fragment a_from_accumulators(const Accumulator& even, const Accumulator& odd) {
  Fragment out{};
  for (int lane = 0; lane < 32; ++lane)
    for (int reg = 0; reg < 4; ++reg)
      for (int half = 0; half < 2; ++half) {
        const Accumulator& c = c_from_a_tile(reg) == 0 ? even : odd;
        out[static_cast<std::size_t>(lane)][static_cast<std::size_t>(reg)][static_cast<std::size_t>(half)] =
            c[static_cast<std::size_t>(lane)][static_cast<std::size_t>(c_from_a_index(reg, half))];
      }
  return out;
}

// Accumulator tiles side by side as a 16 x 8n matrix, through the C map.
Matrix gather(const std::vector<Accumulator>& tiles) {
  Matrix out(16, 8 * static_cast<int>(tiles.size()));
  for (std::size_t j = 0; j < tiles.size(); ++j)
    for (int lane = 0; lane < 32; ++lane)
      for (int index = 0; index < 4; ++index) {
        const Element e = c_element(lane, index);
        out.at(e.row, 8 * static_cast<int>(j) + e.col) = tiles[j][static_cast<std::size_t>(lane)][static_cast<std::size_t>(index)];
      }
  return out;
}

void expect_equal(const Matrix& got, const Matrix& want, const std::string& what) {
  ASSERT_EQ(got.rows, want.rows) << what;
  ASSERT_EQ(got.cols, want.cols) << what;
  int wrong = 0;
  for (int r = 0; r < got.rows; ++r)
    for (int c = 0; c < got.cols; ++c)
      if (got.at(r, c) != want.at(r, c) && wrong++ < 3)
        ADD_FAILURE() << what << ": (" << r << ", " << c << ") got " << got.at(r, c) << " want " << want.at(r, c);
  EXPECT_EQ(wrong, 0) << what;
}

std::mt19937_64 seeded(const char* test) {
  const std::uint64_t seed = 20261123;
  std::printf("[ seed     ] %s seed=%llu\n", test, static_cast<unsigned long long>(seed));
  return std::mt19937_64(seed);
}

// Every map covers its tile exactly once, or a product built from it would silently miss elements.
TEST(FlashLayout, FragmentMapsCoverTheirTilesOnce) {
  std::vector<int> a(256, 0), b(128, 0), c(128, 0), down(256, 0), across(256, 0);
  for (int lane = 0; lane < 32; ++lane) {
    for (int reg = 0; reg < 4; ++reg)
      for (int half = 0; half < 2; ++half) {
        const Element e = a_element(lane, reg, half);
        ++a[static_cast<std::size_t>(e.row * 16 + e.col)];
      }
    for (int reg = 0; reg < 2; ++reg)
      for (int half = 0; half < 2; ++half) {
        const Element e = b_element(lane, reg, half);
        ++b[static_cast<std::size_t>(e.row * 8 + e.col)];
      }
    for (int index = 0; index < 4; ++index) {
      const Element e = c_element(lane, index);
      ++c[static_cast<std::size_t>(e.row * 8 + e.col)];
    }
    // Each lane addresses one 8-element row of the 16x16 tile.
    for (int k = 0; k < 8; ++k) {
      ++down[static_cast<std::size_t>(x4_down_first(lane).row * 16 + x4_down_first(lane).col + k)];
      ++across[static_cast<std::size_t>(x4_across_first(lane).row * 16 + x4_across_first(lane).col + k)];
    }
  }
  for (const auto* counts : {&a, &b, &c, &down, &across})
    for (int n : *counts) EXPECT_EQ(n, 1);
}

// Forward, one warp: S (16 x Bc) = Q K^T, then O (16 x D) = P V with P kept in the accumulators' registers.
void check_forward(int head_dim) {
  const int d = head_dim, bc = kFwdKeys, warp = 1;
  std::mt19937_64 rng = seeded("FlashLayout.Forward");
  const Matrix q = random_matrix(kFwdRows, d, rng), k = random_matrix(bc, d, rng), v = random_matrix(bc, d, rng);

  std::vector<Fragment> qf;
  for (int kt = 0; kt < d / 16; ++kt) qf.push_back(ldmatrix_x4(q, warp * 16, kt * 16, x4_down_first, false));
  std::vector<Accumulator> s(static_cast<std::size_t>(bc / 8), Accumulator{});
  for (int kt = 0; kt < d / 16; ++kt)
    for (int nt2 = 0; nt2 < bc / 16; ++nt2) {
      const Fragment kb = ldmatrix_x4(k, nt2 * 16, kt * 16, x4_across_first, false);
      mma(s[static_cast<std::size_t>(2 * nt2)], qf[static_cast<std::size_t>(kt)], kb, 0);
      mma(s[static_cast<std::size_t>(2 * nt2 + 1)], qf[static_cast<std::size_t>(kt)], kb, 2);
    }
  const Matrix scores = gather(s);
  expect_equal(scores, product(q, transpose(k), warp * 16, 16), "S = Q K^T, D " + std::to_string(d));

  std::vector<Accumulator> o(static_cast<std::size_t>(d / 8), Accumulator{});
  for (int kt = 0; kt < bc / 16; ++kt) {
    const Fragment pa = a_from_accumulators(s[static_cast<std::size_t>(2 * kt)], s[static_cast<std::size_t>(2 * kt + 1)]);
    for (int dt2 = 0; dt2 < d / 16; ++dt2) {
      const Fragment vb = ldmatrix_x4(v, kt * 16, dt2 * 16, x4_down_first, true);
      mma(o[static_cast<std::size_t>(2 * dt2)], pa, vb, 0);
      mma(o[static_cast<std::size_t>(2 * dt2 + 1)], pa, vb, 2);
    }
  }
  expect_equal(gather(o), product(scores, v, 0, 16), "O = P V, D " + std::to_string(d));
}

TEST(FlashLayout, ForwardTileProductsD64) { check_forward(64); }
TEST(FlashLayout, ForwardTileProductsD128) { check_forward(128); }

// Backward, every warp of a block (16 keys each): S^T = K Q^T and dP^T = V dO^T, then dV += P^T dO and
// dK += dS^T Q from registers; dS^T staged in shared memory through the C map; dQ = dS K by ldmatrix.trans of
// the staged dS^T, split over the warps as the kernel splits it.
void check_backward(int head_dim) {
  const int d = head_dim, bc = kBwdKeys, br = bwd_rows(d);
  ASSERT_EQ(br % 16, 0);
  const int row_tiles = br / 16, cols = bwd_dq_cols(d);
  ASSERT_EQ(row_tiles * (d / cols), kWarps) << "the dQ step must give every warp one (row tile, column range)";
  std::mt19937_64 rng = seeded("FlashLayout.Backward");
  const Matrix k = random_matrix(bc, d, rng), v = random_matrix(bc, d, rng);
  const Matrix q = random_matrix(br, d, rng), d_o = random_matrix(br, d, rng);
  Matrix staged(bc, br);  // sdS: dS^T, keys x queries
  for (int warp = 0; warp < kWarps; ++warp) {
    const std::string what = "D " + std::to_string(d) + " warp " + std::to_string(warp);
    std::vector<Accumulator> st(static_cast<std::size_t>(br / 8), Accumulator{}), dpt(st);
    for (int kt = 0; kt < d / 16; ++kt) {
      const Fragment ka = ldmatrix_x4(k, warp * 16, kt * 16, x4_down_first, false);
      const Fragment va = ldmatrix_x4(v, warp * 16, kt * 16, x4_down_first, false);
      for (int nt2 = 0; nt2 < br / 16; ++nt2) {
        const Fragment qb = ldmatrix_x4(q, nt2 * 16, kt * 16, x4_across_first, false);
        const Fragment ob = ldmatrix_x4(d_o, nt2 * 16, kt * 16, x4_across_first, false);
        mma(st[static_cast<std::size_t>(2 * nt2)], ka, qb, 0);
        mma(st[static_cast<std::size_t>(2 * nt2 + 1)], ka, qb, 2);
        mma(dpt[static_cast<std::size_t>(2 * nt2)], va, ob, 0);
        mma(dpt[static_cast<std::size_t>(2 * nt2 + 1)], va, ob, 2);
      }
    }
    const Matrix s_t = gather(st), dp_t = gather(dpt);
    expect_equal(s_t, product(k, transpose(q), warp * 16, 16), "S^T = K Q^T, " + what);
    expect_equal(dp_t, product(v, transpose(d_o), warp * 16, 16), "dP^T = V dO^T, " + what);

    std::vector<Accumulator> dv(static_cast<std::size_t>(d / 8), Accumulator{}), dk(dv);
    for (int kt = 0; kt < br / 16; ++kt) {
      const Fragment pa = a_from_accumulators(st[static_cast<std::size_t>(2 * kt)], st[static_cast<std::size_t>(2 * kt + 1)]);
      const Fragment da = a_from_accumulators(dpt[static_cast<std::size_t>(2 * kt)], dpt[static_cast<std::size_t>(2 * kt + 1)]);
      for (int dt2 = 0; dt2 < d / 16; ++dt2) {
        const Fragment ob = ldmatrix_x4(d_o, kt * 16, dt2 * 16, x4_down_first, true);
        const Fragment qb = ldmatrix_x4(q, kt * 16, dt2 * 16, x4_down_first, true);
        mma(dv[static_cast<std::size_t>(2 * dt2)], pa, ob, 0);
        mma(dv[static_cast<std::size_t>(2 * dt2 + 1)], pa, ob, 2);
        mma(dk[static_cast<std::size_t>(2 * dt2)], da, qb, 0);
        mma(dk[static_cast<std::size_t>(2 * dt2 + 1)], da, qb, 2);
      }
    }
    expect_equal(gather(dv), product(s_t, d_o, 0, 16), "dV = P^T dO, " + what);
    expect_equal(gather(dk), product(dp_t, q, 0, 16), "dK = dS^T Q, " + what);

    // The kernel's store of dP^T (standing in for dS^T) into sdS: rows warp*16 + g (+8), columns nt*8 + 2t (+1).
    for (std::size_t nt = 0; nt < dpt.size(); ++nt)
      for (int lane = 0; lane < 32; ++lane)
        for (int index = 0; index < 4; ++index) {
          const Element e = c_element(lane, index);
          staged.at(warp * 16 + e.row, static_cast<int>(nt) * 8 + e.col) =
              dpt[nt][static_cast<std::size_t>(lane)][static_cast<std::size_t>(index)];
        }
  }
  expect_equal(staged, product(v, transpose(d_o), 0, bc), "sdS = dS^T, D " + std::to_string(d));

  const Matrix ds = transpose(staged);  // queries x keys
  Matrix dq(br, d);
  std::vector<int> written(static_cast<std::size_t>(br * d), 0);
  for (int warp = 0; warp < kWarps; ++warp) {
    const int mt = warp % row_tiles, c0 = (warp / row_tiles) * cols;
    std::vector<Accumulator> acc(static_cast<std::size_t>(cols / 8), Accumulator{});
    for (int kt = 0; kt < bc / 16; ++kt) {
      const Fragment sa = ldmatrix_x4(staged, kt * 16, mt * 16, x4_across_first, true);
      for (int dt2 = 0; dt2 < cols / 16; ++dt2) {
        const Fragment kb = ldmatrix_x4(k, kt * 16, c0 + dt2 * 16, x4_down_first, true);
        mma(acc[static_cast<std::size_t>(2 * dt2)], sa, kb, 0);
        mma(acc[static_cast<std::size_t>(2 * dt2 + 1)], sa, kb, 2);
      }
    }
    const Matrix part = gather(acc);
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < cols; ++c) {
        dq.at(mt * 16 + r, c0 + c) = part.at(r, c);
        ++written[static_cast<std::size_t>((mt * 16 + r) * d + c0 + c)];
      }
  }
  for (int n : written) EXPECT_EQ(n, 1) << "every dQ element from exactly one warp";
  expect_equal(dq, product(ds, k, 0, br), "dQ = dS K, D " + std::to_string(d));
}

TEST(FlashLayout, BackwardTileProductsD64) { check_backward(64); }
TEST(FlashLayout, BackwardTileProductsD128) { check_backward(128); }

// Opt-in shared memory per block: sm_80 (A100) 163 KiB, sm_90 (H100) 227 KiB. The kernels request their
// footprint at launch; a tile change that outgrows the smaller one should fail here, not on the first A100.
TEST(FlashLayout, SharedMemoryFitsEveryTargetArchitecture) {
  constexpr std::size_t kSm80OptIn = 166912;
  for (int d : {64, 128}) {
    EXPECT_LE(fwd_smem_bytes(d), kSm80OptIn) << "forward, D " << d;
    EXPECT_LE(bwd_smem_bytes(d), kSm80OptIn) << "backward, D " << d;
    // cp.async and ldmatrix need 16-byte aligned rows: padded rows of 16-bit elements.
    EXPECT_EQ(padded(d) * 2 % 16, 0);
    EXPECT_EQ(padded(bwd_rows(d)) * 2 % 16, 0);
  }
  // Q, K[2], V[2] at D 64: (64 + 256) rows x 72 halves.
  EXPECT_EQ(fwd_smem_bytes(64), std::size_t{320 * 72 * 2});
  // K, V, Q[2], dO[2] at D 128 (Br 32): 256 rows x 136 halves; dS^T 64 x 40 halves; lse and delta 4 x 32 floats.
  EXPECT_EQ(bwd_smem_bytes(128), std::size_t{256 * 136 * 2 + 64 * 40 * 2 + 128 * 4});
}

TEST(GpuAttentionRequests, ValidateNamesTheFirstProblem) {
  const Shape ok{2, 4, 2, 77, 93, 64, true};
  EXPECT_EQ(validate(ok, DType::bf16, Impl::flash), "");
  EXPECT_EQ(validate(ok, DType::fp16, Impl::unfused), "");
  Shape d96 = ok;
  d96.head_dim = 96;
  EXPECT_NE(validate(d96, DType::bf16, Impl::flash).find("head_dim 64 and 128"), std::string::npos);
  EXPECT_EQ(validate(d96, DType::bf16, Impl::unfused), "");
  Shape huge = ok;
  huge.seq_q = huge.seq_kv = 1 << 16;
  huge.heads_q = huge.heads_kv = 16;
  EXPECT_GT(unfused_workspace_bytes(huge), kUnfusedWorkspaceLimitBytes);
  EXPECT_NE(validate(huge, DType::bf16, Impl::unfused).find("use flash"), std::string::npos);
  EXPECT_EQ(validate(huge, DType::bf16, Impl::flash), "");
  EXPECT_EQ(unfused_workspace_bytes(ok), std::size_t{2 * 4 * 77 * 93 * 8});
}

TEST(GpuAttentionRequests, NamesRoundTrip) {
  for (Impl impl : {Impl::unfused, Impl::flash}) EXPECT_EQ(parse_impl(name(impl)), impl);
  for (DType dtype : {DType::fp16, DType::bf16}) EXPECT_EQ(parse_dtype(name(dtype)), dtype);
  EXPECT_EQ(parse_impl("naive"), std::nullopt);
  EXPECT_EQ(parse_dtype("fp32"), std::nullopt);
}

// Every part of the workspace 256-byte aligned, large enough, and apart from the others.
TEST(GpuAttentionRequests, WorkspacePartsAreAlignedAndDisjoint) {
  const Shape shape{2, 4, 2, 77, 93, 64, true};
  const std::size_t rows = 2 * 4 * 77, scores = rows * 93, q = rows * 64;
  for (Impl impl : {Impl::flash, Impl::unfused}) {
    const WorkspaceLayout w = workspace_layout(shape, DType::bf16, impl);
    EXPECT_EQ(workspace_bytes(shape, DType::bf16, impl), w.bytes);
    struct Part {
      std::size_t offset, bytes;
    };
    std::vector<Part> parts{{w.delta, rows * 4}};
    if (impl == Impl::flash) {
      parts.push_back({w.dq_accum, q * 4});
    } else {
      parts.push_back({w.scores, scores * 4});
      parts.push_back({w.probs, scores * 2});
      parts.push_back({w.dscores, scores * 2});
      parts.push_back({w.cublaslt, kUnfusedCublasLtBytes});
    }
    for (std::size_t i = 0; i < parts.size(); ++i) {
      EXPECT_EQ(parts[i].offset % 256, 0u) << name(impl) << " part " << i;
      EXPECT_LE(parts[i].offset + parts[i].bytes, w.bytes) << name(impl) << " part " << i;
      for (std::size_t j = 0; j < i; ++j)
        EXPECT_TRUE(parts[i].offset >= parts[j].offset + parts[j].bytes ||
                    parts[j].offset >= parts[i].offset + parts[i].bytes)
            << name(impl) << " parts " << j << " and " << i << " overlap";
    }
  }
  EXPECT_LT(workspace_bytes(shape, DType::fp16, Impl::flash), workspace_bytes(shape, DType::fp16, Impl::unfused));
}

// The GPU check on the CPU kernels' fp32 results (more accurate than any 16-bit kernel): they pass, and one
// wrong element of O, or of dK, in the checked slice fails it.
TEST(GpuAttentionCheck, PassesAccurateResultsAndCatchesAWrongElement) {
  const Shape shape{2, 4, 2, 37, 45, 64, true};
  std::vector<float> q(q_elements(shape)), k(kv_elements(shape)), v(k.size()), d_o(q.size());
  gemm::fill_uniform(q.data(), q.size(), 5);
  gemm::fill_uniform(k.data(), k.size(), 6);
  gemm::fill_uniform(v.data(), v.size(), 7);
  gemm::fill_uniform(d_o.data(), d_o.size(), 8);
  std::vector<float> o(q.size()), lse(lse_elements(shape)), dq(q.size()), dk(k.size()), dv(k.size());
  const CpuOptions options;
  flash_forward(shape, q.data(), k.data(), v.data(), o.data(), lse.data(), options);
  flash_backward(shape, q.data(), k.data(), v.data(), o.data(), d_o.data(), lse.data(), dq.data(), dk.data(),
                 dv.data(), options);
  const HostTensors tensors{q.data(), k.data(), v.data(), d_o.data(), o.data(), lse.data(),
                            dq.data(), dk.data(), dv.data()};
  for (int b = 0; b < shape.batch; ++b)
    for (int h = 0; h < shape.heads_kv; ++h) {
      const CheckReport report = check(shape, DType::bf16, tensors, true, b, h);
      EXPECT_TRUE(report.passed) << "batch " << b << " kv head " << h << ": " << report.summary;
    }
  // Batch 1, kv head 1: its first query head is 1 * 4 + 1 * 2 = 6; its keys start at (1 * 2 + 1) * 45 rows.
  const std::size_t o_element = std::size_t{6} * 37 * 64 + 5 * 64 + 3, k_element = std::size_t{3} * 45 * 64 + 7;
  const float o_right = o[o_element];
  o[o_element] = 2 * o_right + 1;
  EXPECT_FALSE(check(shape, DType::bf16, tensors, false, 1, 1).passed);
  EXPECT_TRUE(check(shape, DType::bf16, tensors, false, 0, 1).passed);  // another slice
  o[o_element] = o_right;
  dk[k_element] = 2 * dk[k_element] + 1;
  EXPECT_TRUE(check(shape, DType::bf16, tensors, false, 1, 1).passed);
  EXPECT_FALSE(check(shape, DType::bf16, tensors, true, 1, 1).passed);
  EXPECT_THROW(check(shape, DType::bf16, HostTensors{q.data(), k.data(), v.data(), d_o.data(), o.data(), lse.data()},
                     true, 0, 0),
               std::invalid_argument);
  EXPECT_THROW(check(shape, DType::bf16, tensors, false, 2, 0), std::invalid_argument);
}

std::vector<float> uniform(std::size_t count, uint64_t seed) {
  std::vector<float> values(count);
  gemm::fill_uniform(values.data(), count, seed);
  return values;
}

// The GPU paths take P in the dtype for dV = P^T dO. Under a causal mask the first keys gather many rows whose
// signed terms can cancel far below the tensor's RMS while still carrying that rounding: a dV formed so, with
// everything else exact, passes; one wrong element of it still fails.
TEST(GpuAttentionCheck, PassesADvFormedFromProbabilitiesInBf16) {
  const Shape shape{1, 1, 1, 512, 512, 32, true};
  const std::size_t qn = q_elements(shape), kn = kv_elements(shape);
  std::vector<float> qf = uniform(qn, 11), kf = uniform(kn, 12), vf = uniform(kn, 13), dof = uniform(qn, 14);
  // Key 0 is a sink that every query attends to, as in trained models: its dV gathers every row. The last row's
  // dO makes one column of dV_0 cancel to zero, so that element keeps only the rounding of its terms.
  const int d = shape.head_dim, last = shape.seq_q - 1, column = 5;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int row = 0; row < shape.seq_q; ++row) qf[static_cast<std::size_t>(row) * d] = 1.0f;
  kf[0] = 30.0f;
  std::vector<double> o(qn), lse(lse_elements(shape)), dq(qn), dk(kn), dv(kn);
  {
    const std::vector<double> q(qf.begin(), qf.end()), k(kf.begin(), kf.end()), v(vf.begin(), vf.end());
    reference_forward(shape, q.data(), k.data(), v.data(), o.data(), lse.data());
    auto p_of_sink = [&](int row) {
      double score = 0.0;
      for (int c = 0; c < d; ++c) score += q[static_cast<std::size_t>(row) * d + c] * k[static_cast<std::size_t>(c)];
      return std::exp(scale * score - lse[static_cast<std::size_t>(row)]);
    };
    double others = 0.0;
    for (int row = 0; row < last; ++row) others += p_of_sink(row) * dof[static_cast<std::size_t>(row) * d + column];
    dof[static_cast<std::size_t>(last) * d + column] = static_cast<float>(-others / p_of_sink(last));
  }
  const std::vector<double> q(qf.begin(), qf.end()), k(kf.begin(), kf.end()), v(vf.begin(), vf.end()),
      d_o(dof.begin(), dof.end());
  reference_backward(shape, q.data(), k.data(), v.data(), o.data(), d_o.data(), lse.data(), dq.data(), dk.data(),
                     dv.data());
  auto to_bf16 = [](double x) {  // round to nearest even, as the kernels' conversions do
    uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(x));
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<double>(std::bit_cast<float>(bits & 0xffff0000u));
  };
  std::vector<double> dv_bf16_p(kn, 0.0);
  for (int row = 0; row < shape.heads_q * shape.seq_q; ++row) {
    const int i = row % shape.seq_q;
    for (int j = 0; j <= i; ++j) {
      double score = 0.0;
      for (int c = 0; c < d; ++c) score += q[static_cast<std::size_t>(row) * d + c] * k[static_cast<std::size_t>(j) * d + c];
      const double p = to_bf16(std::exp(scale * score - lse[static_cast<std::size_t>(row)]));
      for (int c = 0; c < d; ++c)
        dv_bf16_p[static_cast<std::size_t>(j) * d + c] += p * d_o[static_cast<std::size_t>(row) * d + c];
    }
  }
  auto floats = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  std::vector<float> of = floats(o), lsef = floats(lse), dqf = floats(dq), dkf = floats(dk), dvf = floats(dv_bf16_p);
  const HostTensors tensors{qf.data(), kf.data(), vf.data(), dof.data(), of.data(), lsef.data(),
                            dqf.data(), dkf.data(), dvf.data()};
  const CheckReport report = check(shape, DType::bf16, tensors, true, 0, 0);
  EXPECT_TRUE(report.passed) << report.summary;
  dvf[std::size_t{3} * d + 5] = 2 * dvf[std::size_t{3} * d + 5] + 1;
  EXPECT_FALSE(check(shape, DType::bf16, tensors, true, 0, 0).passed);
}

// The dV bound allows more than compare() only at keys with many large terms: on plain random inputs a mask one
// key off in one tile of 16 keys mid-sequence (row j - 1 also sees key j) still fails the check.
TEST(GpuAttentionCheck, CatchesAMaskOneKeyOffInOneTileOfDv) {
  const Shape shape{1, 1, 1, 512, 512, 32, true};
  const std::size_t qn = q_elements(shape), kn = kv_elements(shape);
  std::vector<float> qf = uniform(qn, 21), kf = uniform(kn, 22), vf = uniform(kn, 23), dof = uniform(qn, 24);
  const std::vector<double> q(qf.begin(), qf.end()), k(kf.begin(), kf.end()), v(vf.begin(), vf.end()),
      d_o(dof.begin(), dof.end());
  std::vector<double> o(qn), lse(lse_elements(shape)), dq(qn), dk(kn), dv(kn);
  reference_forward(shape, q.data(), k.data(), v.data(), o.data(), lse.data());
  reference_backward(shape, q.data(), k.data(), v.data(), o.data(), d_o.data(), lse.data(), dq.data(), dk.data(),
                     dv.data());
  auto floats = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  std::vector<float> of = floats(o), lsef = floats(lse), dqf = floats(dq), dkf = floats(dk), dvf = floats(dv);
  const HostTensors tensors{qf.data(), kf.data(), vf.data(), dof.data(), of.data(), lsef.data(),
                            dqf.data(), dkf.data(), dvf.data()};
  EXPECT_TRUE(check(shape, DType::bf16, tensors, true, 0, 0).passed);
  const int d = shape.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int j = 256; j < 272; ++j) {
    double score = 0.0;
    for (int c = 0; c < d; ++c) score += q[static_cast<std::size_t>(j - 1) * d + c] * k[static_cast<std::size_t>(j) * d + c];
    const double p = std::exp(scale * score - lse[static_cast<std::size_t>(j - 1)]);
    for (int c = 0; c < d; ++c)
      dvf[static_cast<std::size_t>(j) * d + c] += static_cast<float>(p * d_o[static_cast<std::size_t>(j - 1) * d + c]);
  }
  const CheckReport masked = check(shape, DType::bf16, tensors, true, 0, 0);
  EXPECT_FALSE(masked.passed);
}

}  // namespace
}  // namespace strata::attention::gpu::layout
