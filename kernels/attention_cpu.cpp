// CPU attention kernels. The flash kernels walk (query block x key block) tiles with an online softmax, so
// the score matrix only ever exists one L2-sized tile at a time. The block products run on register-blocked
// AVX-512 kernels that read their operands in place (or on cblas_sgemm, the portable engine), and the softmax
// between them is one vectorised exp2 pass per tile, so the kernels run close to the FMA peak. Also here:
// the materialised baseline, shape checks, FLOP conventions and error reports.
#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __AVX512F__
// GCC 12 reports the intrinsics' internal _mm512_undefined_ps() placeholders as uninitialised once they are
// inlined (GCC bug 105593); the report points into the header, so it is silenced for the header only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#endif

#include "kernels/attention.h"

namespace strata::attention {
namespace {

constexpr float kLog2e = 1.44269504088896340736f;
constexpr double kLn2 = 0.69314718055994530942;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------------------
// Geometry: strides, head mapping and the causal window, derived once per call.

struct Geometry {
  explicit Geometry(const Shape& s)
      : batch(s.batch),
        heads_q(s.heads_q),
        heads_kv(s.heads_kv),
        seq_q(s.seq_q),
        seq_kv(s.seq_kv),
        dim(s.head_dim),
        group(s.heads_q / s.heads_kv),
        causal(s.causal),
        causal_offset(static_cast<long>(s.seq_kv) - s.seq_q),
        inv_sqrt_dim(1.0f / std::sqrt(static_cast<float>(s.head_dim))) {}

  // Keys visible to query row i are [0, visible_keys(i)). Bottom-right alignment: i sees j <= i + Skv - Sq.
  int visible_keys(long i) const {
    if (!causal) return seq_kv;
    return static_cast<int>(std::clamp<long>(i + causal_offset + 1, 0, seq_kv));
  }
  // First query row that sees key j (rows before it are entirely masked for this key).
  int first_row_seeing(int j) const {
    if (!causal) return 0;
    return static_cast<int>(std::clamp<long>(j - causal_offset, 0, seq_q));
  }

  std::size_t q_head(int b, int h) const {  // offset of the (Sq, D) rows of query head h
    return (static_cast<std::size_t>(b) * heads_q + h) * seq_q * dim;
  }
  std::size_t kv_head(int b, int h_kv) const {  // offset of the (Skv, D) rows of kv head h_kv
    return (static_cast<std::size_t>(b) * heads_kv + h_kv) * seq_kv * dim;
  }
  std::size_t lse_head(int b, int h) const { return (static_cast<std::size_t>(b) * heads_q + h) * seq_q; }

  int batch, heads_q, heads_kv, seq_q, seq_kv, dim, group;
  bool causal;
  long causal_offset;
  float inv_sqrt_dim;
};

void require_valid(const Shape& shape, const CpuOptions& options) {
  if (std::string problem = validate(shape); !problem.empty()) throw std::invalid_argument(problem);
  if (std::string problem = validate(options); !problem.empty()) throw std::invalid_argument(problem);
}

// ---------------------------------------------------------------------------------------------------------
// Memory and threading.

struct AlignedDelete {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
};
using AlignedFloats = std::unique_ptr<float[], AlignedDelete>;

AlignedFloats allocate_floats(std::size_t n) {
  return AlignedFloats(static_cast<float*>(::operator new[](std::max<std::size_t>(n, 1) * sizeof(float),
                                                            std::align_val_t{64})));
}

// Row stride of a score tile. A power-of-two stride makes the column walks of transposed GEMM operands hit
// the same few L1 sets; one extra cache line per row spreads them.
int tile_stride(int columns) { return (columns + 15) / 16 * 16 + 16; }

// Holds the BLAS library to one thread while a kernel runs, because the kernel already parallelises over
// tiles and nested BLAS threads would oversubscribe the cores. Only OpenBLAS exposes the switch; the
// setting is process-wide, so concurrent BLAS users elsewhere in the process see it too.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() {
#ifdef OPENBLAS_VERSION
    previous_ = openblas_get_num_threads();
    if (previous_ != 1) openblas_set_num_threads(1);
#endif
  }
  ~SingleThreadedBlas() {
#ifdef OPENBLAS_VERSION
    if (previous_ != 1) openblas_set_num_threads(previous_);
#endif
  }
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;

 private:
  int previous_ = 1;
};

// Runs body(task, worker) for every task in [0, tasks), on up to `threads` workers taking tasks in order
// one at a time, so that uneven (causal) tasks balance themselves. worker < workers(threads, tasks).
int workers(int threads, int tasks) { return std::max(1, std::min(threads, tasks)); }

template <class Body>
void parallel_for(int tasks, int threads, const Body& body) {
#ifdef _OPENMP
  const int n = workers(threads, tasks);
  if (n > 1) {
#pragma omp parallel for num_threads(n) schedule(dynamic, 1)
    for (int task = 0; task < tasks; ++task) body(task, omp_get_thread_num());
    return;
  }
#else
  (void)threads;
#endif
  for (int task = 0; task < tasks; ++task) body(task, 0);
}

// ---------------------------------------------------------------------------------------------------------
// exp2 and row operations. Scores are computed from Q (or K) pre-multiplied by log2(e)/sqrt(D), so the softmax
// needs 2^x rather than e^x: one multiply fewer per score.

// Arguments are clamped here so that results stay normal floats: subnormal operands are slow on some
// cores, and 2^-125 is far below the fp32 resolution of any row sum >= 1, so the clamp changes nothing.
constexpr float kExp2Floor = -125.0f;

// 2^f on [-1/2, 1/2]: degree-5 near-minimax polynomial, relative error 7.5e-8 (2.4e-7 evaluated in fp32).
constexpr float kExp2Poly[] = {1.000000071654655f, 0.6931469670638645f, 0.24022119723933727f,
                               0.05550713274959886f, 0.009675541330691812f, 0.0013276471520054795f};

#ifdef __AVX512F__
// 2^x for x <= ~0 (anything below kExp2Floor counts as kExp2Floor): x = n + f with |f| <= 1/2, the
// polynomial for 2^f, vscalefps for the 2^n. NaN propagates.
inline __m512 exp2_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(kExp2Floor), x);  // operand order keeps a NaN x
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(kExp2Poly[5]);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[4]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[3]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[2]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[1]));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[0]));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 tail_mask(int remaining) { return static_cast<__mmask16>((1u << remaining) - 1u); }

// row[j] = 2^(row[j] - shift) for j < n.
void exp2_shifted(float* row, int n, float shift) {
  const __m512 vshift = _mm512_set1_ps(shift);
  int j = 0;
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(row + j, exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(row + j), vshift)));
  if (j < n) {
    const __mmask16 m = tail_mask(n - j);
    _mm512_mask_storeu_ps(row + j, m, exp2_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), vshift)));
  }
}
#else
// Portable 2^x for x <= ~0, written so the compiler can vectorise the loops that call it: round to nearest
// by the 1.5*2^23 trick, the same polynomial as the AVX-512 path, and 2^n assembled in the exponent bits.
inline float exp2_scalar(float x) {
  // x = max(x, kExp2Floor) on the bit patterns, because an integer min vectorises where a float compare (which
  // may trap on NaN) does not: a negative float's pattern grows with its magnitude, and every non-negative
  // float's pattern is below every negative one's.
  x = std::bit_cast<float>(std::min(std::bit_cast<std::uint32_t>(x), std::bit_cast<std::uint32_t>(kExp2Floor)));
  constexpr float kRoundingShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer...
  const float shifted = x + kRoundingShift;
  const float n = shifted - kRoundingShift;
  const float f = x - n;
  float p = kExp2Poly[5];
  for (int i = 4; i >= 0; --i) p = p * f + kExp2Poly[i];
  // ...which then sits in the low mantissa bits, ready to be moved into the exponent field of 2^n.
  const std::int32_t n_bits = std::bit_cast<std::int32_t>(shifted) - std::bit_cast<std::int32_t>(kRoundingShift);
  return p * std::bit_cast<float>((n_bits + 127) << 23);
}

void exp2_shifted(float* row, int n, float shift) {
  for (int j = 0; j < n; ++j) row[j] = exp2_scalar(row[j] - shift);
}
#endif

void fill(float* p, std::size_t n, float value) { std::fill(p, p + n, value); }

float dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Columns of tile row r that row (first_row + r) may see, for a tile whose columns start at key first_key.
int visible_columns(const Geometry& g, long row, int first_key, int columns) {
  return std::clamp(g.visible_keys(row) - first_key, 0, columns);
}

// ---------------------------------------------------------------------------------------------------------
// Block products. Every product in the flash kernels has the form
//   C (m, n) = alpha * A (m, k) B (k, n)  [+ diag(row_scale) C]
// with B and C row-major and A either row-major or stored transposed, so one engine interface covers them.
// The AVX-512 engine keeps a 6 x 64 block of C in 24 registers and streams B rows past broadcasts of A: it
// needs no packing, which on these block shapes is what separates cblas_sgemm from the FMA peak.

// Causal structure a product may exploit: which entries are known to be zero (A) or not needed (C), as
// a band that moves one column per row. Engines are free to ignore it; the AVX-512 one skips whole register
// blocks, which is what keeps the diagonal tiles of causal attention from costing a full tile.
enum class Band {
  none,
  a_upper,  // A(i, kk) == 0 for kk > i + shift
  a_lower,  // A(i, kk) == 0 for kk < i + shift
  c_upper,  // C(i, j) is not needed for j > i + shift, and may be left unwritten
  c_lower,  // C(i, j) is not needed for j < i + shift, and may be left unwritten
};

struct Product {
  int m = 0, n = 0, k = 0;
  const float* a = nullptr;
  long lda = 0;
  bool a_transposed = false;  // false: A(i, kk) = a[i * lda + kk]; true: A(i, kk) = a[kk * lda + i]
  const float* b = nullptr;
  long ldb = 0;
  float* c = nullptr;
  long ldc = 0;
  float alpha = 1.0f;
  bool accumulate = false;            // add to C instead of overwriting it
  const float* row_scale = nullptr;   // with accumulate: C row i is first multiplied by row_scale[i]
  Band band = Band::none;
  long shift = 0;
};

void blas_product(const Product& p) {
  if (p.accumulate && p.row_scale != nullptr) {
    for (int i = 0; i < p.m; ++i) {
      if (p.row_scale[i] == 1.0f) continue;
      float* row = p.c + i * p.ldc;
      for (int j = 0; j < p.n; ++j) row[j] *= p.row_scale[i];
    }
  }
  cblas_sgemm(CblasRowMajor, p.a_transposed ? CblasTrans : CblasNoTrans, CblasNoTrans, p.m, p.n, p.k, p.alpha,
              p.a, static_cast<int>(p.lda), p.b, static_cast<int>(p.ldb), p.accumulate ? 1.0f : 0.0f, p.c,
              static_cast<int>(p.ldc));
}

#ifdef __AVX512F__
constexpr int kTileRows = 6;     // rows of C per register block
constexpr int kTileVectors = 4;  // 16-float vectors of C per row of a register block: 24 accumulators

// One register block: rows [0, R) and vectors [0, V) of C; the last vector keeps only the lanes in `last`.
template <int R, int V, bool kTransposedA>
void product_block(int depth, const float* a, long lda, const float* b, long ldb, float* c, long ldc,
                   __mmask16 last, float alpha, bool accumulate, const float* row_scale) {
  // The unroll pragmas make GCC keep acc[][] in registers; left to itself it spills the accumulators.
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int kk = 0; kk < depth; ++kk) {
    const float* b_row = b + kk * ldb;
    __m512 bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      bv[v] = v + 1 < V ? _mm512_loadu_ps(b_row + 16 * v) : _mm512_maskz_loadu_ps(last, b_row + 16 * v);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(kTransposedA ? a[kk * lda + r] : a[r * lda + kk]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 valpha = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512 scale = _mm512_set1_ps(accumulate && row_scale != nullptr ? row_scale[r] : 1.0f);
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __mmask16 lanes = v + 1 < V ? static_cast<__mmask16>(0xFFFF) : last;
      float* out = c + r * ldc + 16 * v;
      const __m512 old = accumulate ? _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, out), scale) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(out, lanes, _mm512_fmadd_ps(acc[r][v], valpha, old));
    }
  }
}

using ProductBlock = void (*)(int, const float*, long, const float*, long, float*, long, __mmask16, float, bool,
                              const float*);

template <bool kTransposedA, int V>
ProductBlock product_block_for_rows(int rows) {
  switch (rows) {
    case 1: return &product_block<1, V, kTransposedA>;
    case 2: return &product_block<2, V, kTransposedA>;
    case 3: return &product_block<3, V, kTransposedA>;
    case 4: return &product_block<4, V, kTransposedA>;
    case 5: return &product_block<5, V, kTransposedA>;
    default: return &product_block<kTileRows, V, kTransposedA>;
  }
}

template <bool kTransposedA>
ProductBlock product_block_for(int rows, int vectors) {
  switch (vectors) {
    case 1: return product_block_for_rows<kTransposedA, 1>(rows);
    case 2: return product_block_for_rows<kTransposedA, 2>(rows);
    case 3: return product_block_for_rows<kTransposedA, 3>(rows);
    default: return product_block_for_rows<kTransposedA, kTileVectors>(rows);
  }
}

void register_blocked_product(const Product& p) {
  constexpr int kColumns = 16 * kTileVectors;
  // Column strips outer: a strip of B (k x 64) is reused by every row block while it is hot in L1/L2.
  for (int col = 0; col < p.n; col += kColumns) {
    const int width = std::min(kColumns, p.n - col);
    const int vectors = (width + 15) / 16;
    const int tail = width - 16 * (vectors - 1);
    const auto last = static_cast<__mmask16>((1u << tail) - 1u);
    for (int row = 0; row < p.m; row += kTileRows) {
      const int rows = std::min(kTileRows, p.m - row);
      const long last_row = row + rows - 1;
      if (p.band == Band::c_upper && col > last_row + p.shift) continue;
      if (p.band == Band::c_lower && col + width - 1 < row + p.shift) continue;
      long k_begin = 0, k_end = p.k;
      if (p.band == Band::a_upper) k_end = std::clamp<long>(last_row + p.shift + 1, 0, p.k);
      if (p.band == Band::a_lower) k_begin = std::clamp<long>(row + p.shift, 0, p.k);
      const int depth = static_cast<int>(std::max<long>(k_end - k_begin, 0));
      const float* a = p.a_transposed ? p.a + k_begin * p.lda + row : p.a + row * p.lda + k_begin;
      const ProductBlock block = p.a_transposed ? product_block_for<true>(rows, vectors)
                                                : product_block_for<false>(rows, vectors);
      block(depth, a, p.lda, p.b + k_begin * p.ldb + col, p.ldb, p.c + row * p.ldc + col, p.ldc, last, p.alpha,
            p.accumulate, p.row_scale == nullptr ? nullptr : p.row_scale + row);
    }
  }
}
#endif

void product(const CpuOptions& options, const Product& p) {
  if (p.m == 0 || p.n == 0) return;
#ifdef __AVX512F__
  if (options.products == BlockProducts::automatic) {
    register_blocked_product(p);
    return;
  }
#else
  (void)options;
#endif
  blas_product(p);
}

// dst (cols, ld_dst) = scale * src^T for src (rows, cols) row-major with row stride ld_src.
void transpose_scaled(const float* src, int rows, int cols, long ld_src, float scale, float* dst, long ld_dst) {
  for (int j = 0; j < cols; ++j) {
    for (int i = 0; i < rows; ++i) dst[j * ld_dst + i] = src[i * ld_src + j] * scale;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Flash forward. A task owns `rows` queries of one head and walks the keys they may see in tiles. Scores are
// kept transposed, S^T (keys, queries): the online softmax then runs down columns, so the running max, the
// sums and the masks are plain per-lane vector operations, with no horizontal reductions.

struct ForwardWorkspace {
  ForwardWorkspace(const Geometry& g, const CpuOptions& o)
      : query_stride(tile_stride(o.q_block)),
        q_transposed(allocate_floats(static_cast<std::size_t>(g.dim) * query_stride)),
        tile(allocate_floats(static_cast<std::size_t>(o.kv_block) * query_stride)),
        running_max(allocate_floats(query_stride)),
        running_sum(allocate_floats(query_stride)),
        rescale(allocate_floats(query_stride)) {}

  long query_stride;          // row stride of the query-indexed arrays, q_block rounded up plus one line
  AlignedFloats q_transposed; // (D, query_stride): Q^T * log2(e)/sqrt(D)
  AlignedFloats tile;         // (kv_block, query_stride): S^T, then P^T in place
  AlignedFloats running_max;  // (q_block): max score so far, log2 units
  AlignedFloats running_sum;  // (q_block): sum of 2^(score - running_max) so far
  AlignedFloats rescale;      // (q_block): factor this tile applies to the O accumulated so far
};

// Query lanes a tile row may use: all of [0, rows) outside causal diagonal tiles; on them, the queries from
// first_lane on, where first_lane = (key) - (first query) - (Skv - Sq).
struct TileMask {
  bool causal;
  long first_lane_of_row0;  // first visible lane of tile row 0; row j's is this + j
};

#ifdef __AVX512F__
// Lanes [lane0, lane0 + 16) below `rows`.
inline __mmask16 lanes_in_range(int lane0, int rows) {
  const int n = std::clamp(rows - lane0, 0, 16);
  return static_cast<__mmask16>(n == 16 ? 0xFFFFu : (1u << n) - 1u);
}

// Lanes [lane0, lane0 + 16) of tile row j that are in range and visible.
inline __mmask16 lane_mask(const TileMask& mask, int j, int lane0, __mmask16 in_range) {
  if (!mask.causal) return in_range;
  const long first = std::clamp<long>(mask.first_lane_of_row0 + j - lane0, 0, 16);
  return static_cast<__mmask16>(in_range & ~((1u << first) - 1u));
}

// Online-softmax step on one strip of G*16 query lanes of the S^T tile: max down the columns, P^T = 2^(S^T -
// new max) in place, running sums, and the factor that the O rows accumulated so far must be scaled by.
template <int G>
void softmax_strip(int keys, int rows, int lane0, const TileMask& mask, ForwardWorkspace& ws) {
  float* tile = ws.tile.get();
  const long stride = ws.query_stride;
  // Tile rows from `visible_keys` on have no visible lane in this strip: their P^T is plain zeros, and their
  // scores may never have been computed (the product skips blocks that are masked throughout).
  const int visible_keys =
      mask.causal ? static_cast<int>(std::clamp<long>(lane0 + 16 * G - mask.first_lane_of_row0, 0, keys)) : keys;
  for (int j = visible_keys; j < keys; ++j) {
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(tile + j * stride + lane0 + 16 * g, _mm512_setzero_ps());
  }
  __mmask16 in_range[G];
  __m512 new_max[G];
  for (int g = 0; g < G; ++g) {
    in_range[g] = lanes_in_range(lane0 + 16 * g, rows);
    new_max[g] = _mm512_loadu_ps(ws.running_max.get() + lane0 + 16 * g);
  }
  for (int j = 0; j < visible_keys; ++j) {
    const float* row = tile + j * stride + lane0;
    for (int g = 0; g < G; ++g) {
      const __mmask16 m = lane_mask(mask, j, lane0 + 16 * g, in_range[g]);
      new_max[g] = _mm512_mask_max_ps(new_max[g], m, new_max[g], _mm512_loadu_ps(row + 16 * g));
    }
  }
  __m512 sum[G];
  for (int g = 0; g < G; ++g) sum[g] = _mm512_setzero_ps();
  for (int j = 0; j < visible_keys; ++j) {
    float* row = tile + j * stride + lane0;
    for (int g = 0; g < G; ++g) {
      const __mmask16 m = lane_mask(mask, j, lane0 + 16 * g, in_range[g]);
      // Masked lanes may hold scores against a -inf max (a query that has seen no key yet): they become 0.
      const __m512 p = _mm512_maskz_mov_ps(m, exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(row + 16 * g), new_max[g])));
      _mm512_storeu_ps(row + 16 * g, p);
      sum[g] = _mm512_add_ps(sum[g], p);
    }
  }
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  for (int g = 0; g < G; ++g) {
    const int at = lane0 + 16 * g;
    const __m512 old_max = _mm512_loadu_ps(ws.running_max.get() + at);
    // A query that has seen no key keeps max -inf and scale 1 (its O is still zero either way).
    const __mmask16 seen = _mm512_cmp_ps_mask(new_max[g], neg_inf, _CMP_NEQ_OQ);
    const __m512 shrink = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), seen, exp2_ps(_mm512_sub_ps(old_max, new_max[g])));
    const __m512 old_sum = _mm512_loadu_ps(ws.running_sum.get() + at);
    _mm512_storeu_ps(ws.running_sum.get() + at, _mm512_fmadd_ps(old_sum, shrink, sum[g]));
    _mm512_storeu_ps(ws.running_max.get() + at, new_max[g]);
    _mm512_storeu_ps(ws.rescale.get() + at, shrink);
  }
}

void online_softmax_step(int keys, int rows, const TileMask& mask, ForwardWorkspace& ws) {
  int lane0 = 0;
  for (; rows - lane0 > 48; lane0 += 64) softmax_strip<4>(keys, rows, lane0, mask, ws);
  switch ((rows - lane0 + 15) / 16) {
    case 3: softmax_strip<3>(keys, rows, lane0, mask, ws); break;
    case 2: softmax_strip<2>(keys, rows, lane0, mask, ws); break;
    case 1: softmax_strip<1>(keys, rows, lane0, mask, ws); break;
    default: break;
  }
}
#else
// Portable online-softmax step over the S^T tile; the inner loops run along query lanes and vectorise.
void online_softmax_step(int keys, int rows, const TileMask& mask, ForwardWorkspace& ws) {
  float* tile = ws.tile.get();
  float* max = ws.running_max.get();
  float* sum = ws.running_sum.get();
  float* rescale = ws.rescale.get();
  auto first_lane = [&](int j) {
    return mask.causal ? static_cast<int>(std::clamp<long>(mask.first_lane_of_row0 + j, 0, rows)) : 0;
  };
  for (int i = 0; i < rows; ++i) rescale[i] = max[i];  // old max, until the scale factors replace it
  for (int j = 0; j < keys; ++j) {
    const float* row = tile + j * ws.query_stride;
    for (int i = first_lane(j); i < rows; ++i) max[i] = std::max(max[i], row[i]);
  }
  for (int i = 0; i < rows; ++i) {
    const float old_max = rescale[i];
    rescale[i] = max[i] == kNegInf ? 1.0f : exp2_scalar(old_max - max[i]);
    sum[i] *= rescale[i];
  }
  for (int j = 0; j < keys; ++j) {
    float* row = tile + j * ws.query_stride;
    const int first = first_lane(j);
    for (int i = 0; i < first; ++i) row[i] = 0.0f;
    for (int i = first; i < rows; ++i) {
      row[i] = exp2_scalar(row[i] - max[i]);
      sum[i] += row[i];
    }
  }
}
#endif

// O /= row sum, lse = ln(sum of e^score). Rows that saw no key get zeros and -inf.
void finish_rows(float* o, float* lse, int rows, int dim, const ForwardWorkspace& ws) {
  for (int r = 0; r < rows; ++r) {
    float* row = o + static_cast<std::size_t>(r) * dim;
    const float sum = ws.running_sum[r];
    if (sum == 0.0f) {
      fill(row, dim, 0.0f);
      lse[r] = kNegInf;
      continue;
    }
    const float inv = 1.0f / sum;
    for (int c = 0; c < dim; ++c) row[c] *= inv;
    lse[r] = static_cast<float>((static_cast<double>(ws.running_max[r]) + std::log2(static_cast<double>(sum))) *
                                kLn2);
  }
}

// One task: rows [first_row, first_row + rows) of one query head against all the keys they may see.
//   q, o (rows, D) of the query head; k, v (Skv, D) of its kv head; lse (rows).
void forward_query_block(const Geometry& g, const CpuOptions& opt, long first_row, int rows, const float* q,
                         const float* k, const float* v, float* o, float* lse, ForwardWorkspace& ws) {
  const int dim = g.dim;
  fill(ws.running_max.get(), ws.query_stride, kNegInf);
  fill(ws.running_sum.get(), ws.query_stride, 0.0f);
  // The last row sees the most keys; tiles beyond that are fully masked for the whole block.
  const int key_end = g.visible_keys(first_row + rows - 1);
  if (key_end == 0) {
    finish_rows(o, lse, rows, dim, ws);
    return;
  }
  transpose_scaled(q, rows, dim, dim, kLog2e * g.inv_sqrt_dim, ws.q_transposed.get(), ws.query_stride);

  for (int first_key = 0; first_key < key_end; first_key += opt.kv_block) {
    const int keys = std::min(opt.kv_block, key_end - first_key);
    // Only tiles crossing the diagonal need the mask: there the first row cannot see the last key. Query i
    // of the block sees key j of the tile when j <= i + shift.
    const bool diagonal = g.causal && g.visible_keys(first_row) < first_key + keys;
    const long shift = first_row + g.causal_offset - first_key;
    // S^T = K Qs^T: (keys, D) x (D, rows)
    product(opt, {.m = keys, .n = rows, .k = dim, .a = k + static_cast<std::size_t>(first_key) * dim, .lda = dim,
                  .b = ws.q_transposed.get(), .ldb = ws.query_stride, .c = ws.tile.get(), .ldc = ws.query_stride,
                  .band = diagonal ? Band::c_lower : Band::none, .shift = -shift});
    online_softmax_step(keys, rows, TileMask{diagonal, -shift}, ws);
    // O = diag(rescale) O + P V: (rows, keys) x (keys, D), P read from the transposed tile. The first tile
    // overwrites, so O needs no zeroing.
    product(opt, {.m = rows, .n = dim, .k = keys, .a = ws.tile.get(), .lda = ws.query_stride, .a_transposed = true,
                  .b = v + static_cast<std::size_t>(first_key) * dim, .ldb = dim, .c = o, .ldc = dim,
                  .accumulate = first_key > 0, .row_scale = ws.rescale.get(),
                  .band = diagonal ? Band::a_upper : Band::none, .shift = shift});
  }
  finish_rows(o, lse, rows, dim, ws);
}

// ---------------------------------------------------------------------------------------------------------
// Flash backward (flash-attention-2): for each key block, recompute P from lse for every query block that
// sees it, and accumulate dV += P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dK += dS^T Q, dQ += dS K.

struct BackwardWorkspace {
  BackwardWorkspace(const Geometry& g, const CpuOptions& o)
      : key_stride(tile_stride(o.bwd_kv_block)),
        k_transposed(allocate_floats(static_cast<std::size_t>(g.dim) * key_stride)),
        v_transposed(allocate_floats(static_cast<std::size_t>(g.dim) * key_stride)),
        probs(allocate_floats(static_cast<std::size_t>(o.bwd_q_block) * key_stride)),
        dprobs(allocate_floats(static_cast<std::size_t>(o.bwd_q_block) * key_stride)),
        lse_log2(allocate_floats(o.bwd_q_block)),
        delta(allocate_floats(o.bwd_q_block)) {}

  long key_stride;            // row stride of key-indexed tiles
  AlignedFloats k_transposed; // (D, key_stride): K^T * log2(e)/sqrt(D) of the current key block
  AlignedFloats v_transposed; // (D, key_stride): V^T of the current key block
  AlignedFloats probs;        // (q_block, key_stride): scores, then P in place
  AlignedFloats dprobs;       // (q_block, key_stride): dP, then dS in place
  AlignedFloats lse_log2;     // (q_block): lse in log2 units, to match the scaled scores
  AlignedFloats delta;        // (q_block): rowsum(dO * O)
};

// Pointers of one (batch, kv head) group; query-side tensors point at the group's first query head.
struct BackwardGroup {
  const float *q, *k, *v, *o, *d_o, *lse;  // q, o, d_o: (group, Sq, D); k, v: (Skv, D); lse: (group, Sq)
  float *dk, *dv;                          // (Skv, D)
};

void prepare_query_rows(const Geometry& g, const float* o, const float* d_o, const float* lse, int rows,
                        BackwardWorkspace& ws) {
  for (int r = 0; r < rows; ++r) {
    const std::size_t at = static_cast<std::size_t>(r) * g.dim;
    ws.delta[r] = dot(d_o + at, o + at, g.dim);
    ws.lse_log2[r] = lse[r] * kLog2e;
  }
}

// P = 2^(S - lse) in place on the (rows, columns) tile; masked columns and rows without keys become zero.
void probabilities_from_lse(const Geometry& g, long first_row, int first_key, int rows, int columns, bool masked,
                            BackwardWorkspace& ws) {
  for (int r = 0; r < rows; ++r) {
    float* s = ws.probs.get() + r * ws.key_stride;
    int visible = masked ? visible_columns(g, first_row + r, first_key, columns) : columns;
    if (ws.lse_log2[r] == kNegInf) visible = 0;
    exp2_shifted(s, visible, ws.lse_log2[r]);
    fill(s + visible, columns - visible, 0.0f);
  }
}

// dS = P * (dP - delta), in place over dP; zero where masked (dP may not have been computed there).
void softmax_gradient(const Geometry& g, long first_row, int first_key, int rows, int columns, bool masked,
                      BackwardWorkspace& ws) {
  for (int r = 0; r < rows; ++r) {
    const float* p = ws.probs.get() + r * ws.key_stride;
    float* ds = ws.dprobs.get() + r * ws.key_stride;
    const int visible = masked ? visible_columns(g, first_row + r, first_key, columns) : columns;
    const float delta = ws.delta[r];
    for (int c = 0; c < visible; ++c) ds[c] = p[c] * (ds[c] - delta);
    fill(ds + visible, columns - visible, 0.0f);
  }
}

// Keys [first_key, first_key + keys) of one group against every query row of the group that sees them.
// dK/dV rows of the block belong to this call alone; dQ accumulates into dq (the output, or the worker's
// private copy when key blocks are split), laid out (group, Sq, D) like the group's queries.
void backward_key_block(const Geometry& g, const CpuOptions& opt, const BackwardGroup& grp, int first_key,
                        int keys, float* dq, BackwardWorkspace& ws) {
  const int dim = g.dim;
  const std::size_t key_offset = static_cast<std::size_t>(first_key) * dim;
  const float* k = grp.k + key_offset;  // (keys, D)
  float* dk = grp.dk + key_offset;
  float* dv = grp.dv + key_offset;
  fill(dk, static_cast<std::size_t>(keys) * dim, 0.0f);
  fill(dv, static_cast<std::size_t>(keys) * dim, 0.0f);
  transpose_scaled(k, keys, dim, dim, kLog2e * g.inv_sqrt_dim, ws.k_transposed.get(), ws.key_stride);
  transpose_scaled(grp.v + key_offset, keys, dim, dim, 1.0f, ws.v_transposed.get(), ws.key_stride);
  const long ld = ws.key_stride;

  const long head_rows = static_cast<long>(g.seq_q) * dim;
  for (int head = 0; head < g.group; ++head) {
    for (long first_row = g.first_row_seeing(first_key); first_row < g.seq_q; first_row += opt.bwd_q_block) {
      const int rows = static_cast<int>(std::min<long>(opt.bwd_q_block, g.seq_q - first_row));
      // Keys of this block seen by the block's last row; first_row_seeing() makes it at least 1.
      const int columns = std::min(keys, g.visible_keys(first_row + rows - 1) - first_key);
      const bool masked = g.causal && g.visible_keys(first_row) < first_key + columns;
      // Query i of the chunk sees key j of the block when j <= i + shift.
      const long shift = first_row + g.causal_offset - first_key;
      const Band queries_by_keys = masked ? Band::c_upper : Band::none;  // (rows, columns) outputs
      const Band keys_from_queries = masked ? Band::a_lower : Band::none;  // (columns, D) += (columns, rows) ...
      const Band queries_from_keys = masked ? Band::a_upper : Band::none;  // (rows, D) += (rows, columns) ...
      const std::size_t row_offset = head * head_rows + first_row * dim;
      const float* q = grp.q + row_offset;  // (rows, D)
      const float* d_o = grp.d_o + row_offset;
      prepare_query_rows(g, grp.o + row_offset, d_o, grp.lse + head * g.seq_q + first_row, rows, ws);

      // S = Q Ks^T: (rows, D) x (D, columns), then P from lse.
      product(opt, {.m = rows, .n = columns, .k = dim, .a = q, .lda = dim, .b = ws.k_transposed.get(), .ldb = ld,
                    .c = ws.probs.get(), .ldc = ld, .band = queries_by_keys, .shift = shift});
      probabilities_from_lse(g, first_row, first_key, rows, columns, masked, ws);
      // dV += P^T dO: (columns, rows) x (rows, D)
      product(opt, {.m = columns, .n = dim, .k = rows, .a = ws.probs.get(), .lda = ld, .a_transposed = true,
                    .b = d_o, .ldb = dim, .c = dv, .ldc = dim, .accumulate = true, .band = keys_from_queries,
                    .shift = -shift});
      // dP = dO V^T: (rows, D) x (D, columns), then dS.
      product(opt, {.m = rows, .n = columns, .k = dim, .a = d_o, .lda = dim, .b = ws.v_transposed.get(), .ldb = ld,
                    .c = ws.dprobs.get(), .ldc = ld, .band = queries_by_keys, .shift = shift});
      softmax_gradient(g, first_row, first_key, rows, columns, masked, ws);
      // dK += dS^T Q / sqrt(D): (columns, rows) x (rows, D)
      product(opt, {.m = columns, .n = dim, .k = rows, .a = ws.dprobs.get(), .lda = ld, .a_transposed = true,
                    .b = q, .ldb = dim, .c = dk, .ldc = dim, .alpha = g.inv_sqrt_dim, .accumulate = true,
                    .band = keys_from_queries, .shift = -shift});
      // dQ += dS K / sqrt(D): (rows, columns) x (columns, D)
      product(opt, {.m = rows, .n = dim, .k = columns, .a = ws.dprobs.get(), .lda = ld, .b = k, .ldb = dim,
                    .c = dq + row_offset, .ldc = dim, .alpha = g.inv_sqrt_dim, .accumulate = true,
                    .band = queries_from_keys, .shift = shift});
    }
  }
}

// How many ways to split each group's key blocks across tasks. Groups alone are enough when there are
// several per thread; otherwise enough splits for ~4 tasks per thread keep the (causally uneven) work
// balanced, at the price of a private dQ per worker.
int backward_splits(const Geometry& g, const CpuOptions& opt, int key_blocks) {
  const int groups = g.batch * g.heads_kv;
  if (opt.threads == 1 || groups >= 4 * opt.threads) return 1;
  return std::min(key_blocks, (4 * opt.threads + groups - 1) / groups);
}

// ---------------------------------------------------------------------------------------------------------
// Materialised baseline.

// Row softmax of a (rows, columns) score matrix already scaled by 1/sqrt(D), with the causal mask; writes
// lse per row. Plain scalar exp: this is the reference point the flash kernels are measured against.
void softmax_rows(const Geometry& g, float* s, float* lse) {
  for (int i = 0; i < g.seq_q; ++i) {
    float* row = s + static_cast<std::size_t>(i) * g.seq_kv;
    const int visible = g.visible_keys(i);
    if (visible == 0) {
      fill(row, g.seq_kv, 0.0f);
      lse[i] = kNegInf;
      continue;
    }
    const float max_score = *std::max_element(row, row + visible);
    float sum = 0.0f;
    for (int j = 0; j < visible; ++j) {
      row[j] = std::exp(row[j] - max_score);
      sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (int j = 0; j < visible; ++j) row[j] *= inv;
    fill(row + visible, g.seq_kv - visible, 0.0f);
    lse[i] = max_score + std::log(sum);
  }
}

// P = exp(S - lse) with the causal mask, from a scaled score matrix.
void probabilities_from_lse(const Geometry& g, float* s, const float* lse) {
  for (int i = 0; i < g.seq_q; ++i) {
    float* row = s + static_cast<std::size_t>(i) * g.seq_kv;
    const int visible = lse[i] == kNegInf ? 0 : g.visible_keys(i);
    for (int j = 0; j < visible; ++j) row[j] = std::exp(row[j] - lse[i]);
    fill(row + visible, g.seq_kv - visible, 0.0f);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Shapes, options, FLOPs.

std::string validate(const Shape& s) {
  if (s.batch <= 0) return "batch must be positive (got " + std::to_string(s.batch) + ")";
  if (s.heads_q <= 0) return "heads_q must be positive (got " + std::to_string(s.heads_q) + ")";
  if (s.heads_kv <= 0) return "heads_kv must be positive (got " + std::to_string(s.heads_kv) + ")";
  if (s.heads_q % s.heads_kv != 0) {
    return "heads_q (" + std::to_string(s.heads_q) + ") must be a multiple of heads_kv (" +
           std::to_string(s.heads_kv) + ") for grouped-query attention";
  }
  if (s.seq_q <= 0) return "seq_q must be positive (got " + std::to_string(s.seq_q) + ")";
  if (s.seq_kv <= 0) return "seq_kv must be positive (got " + std::to_string(s.seq_kv) + ")";
  if (s.head_dim <= 0) return "head_dim must be positive (got " + std::to_string(s.head_dim) + ")";
  // BLAS takes int dimensions and leading dimensions; one head's rows must be addressable by them.
  constexpr long kIntMax = std::numeric_limits<int>::max();
  if (static_cast<long>(std::max(s.seq_q, s.seq_kv)) * s.head_dim > kIntMax) {
    return "seq * head_dim exceeds the BLAS int range";
  }
  return "";
}

std::string validate(const CpuOptions& o) {
  if (o.threads <= 0) return "threads must be positive (got " + std::to_string(o.threads) + ")";
#ifndef _OPENMP
  if (o.threads > 1) return "threads > 1 needs the attention kernels compiled with OpenMP";
#endif
  if (o.q_block <= 0 || o.kv_block <= 0) return "forward block sizes must be positive";
  if (o.bwd_q_block <= 0 || o.bwd_kv_block <= 0) return "backward block sizes must be positive";
  return "";
}

std::size_t q_elements(const Shape& s) {
  return static_cast<std::size_t>(s.batch) * s.heads_q * s.seq_q * s.head_dim;
}
std::size_t kv_elements(const Shape& s) {
  return static_cast<std::size_t>(s.batch) * s.heads_kv * s.seq_kv * s.head_dim;
}
std::size_t lse_elements(const Shape& s) { return static_cast<std::size_t>(s.batch) * s.heads_q * s.seq_q; }

double forward_flops(const Shape& s) {
  const double full = 4.0 * s.batch * s.heads_q * static_cast<double>(s.seq_q) * s.seq_kv * s.head_dim;
  return s.causal ? full / 2.0 : full;
}
double backward_flops(const Shape& s) { return 2.5 * forward_flops(s); }

// ---------------------------------------------------------------------------------------------------------
// Kernels.

void flash_forward(const Shape& shape, const float* q, const float* k, const float* v, float* o, float* lse,
                   const CpuOptions& options) {
  require_valid(shape, options);
  const Geometry g(shape);
  const SingleThreadedBlas blas_guard;
  const int query_blocks = (g.seq_q + options.q_block - 1) / options.q_block;
  const int tasks = g.batch * g.heads_q * query_blocks;
  std::vector<ForwardWorkspace> workspaces;
  for (int w = 0; w < workers(options.threads, tasks); ++w) workspaces.emplace_back(g, options);

  parallel_for(tasks, options.threads, [&](int task, int worker) {
    const int head_index = task / query_blocks;  // b * Hq + h
    const int b = head_index / g.heads_q;
    const int h = head_index % g.heads_q;
    // Causal blocks grow with the row index: hand out the late (heavy) blocks of a head first.
    const int block = g.causal ? query_blocks - 1 - task % query_blocks : task % query_blocks;
    const long first_row = static_cast<long>(block) * options.q_block;
    const int rows = static_cast<int>(std::min<long>(options.q_block, g.seq_q - first_row));
    const std::size_t q_offset = g.q_head(b, h) + first_row * g.dim;
    const std::size_t kv_offset = g.kv_head(b, h / g.group);
    forward_query_block(g, options, first_row, rows, q + q_offset, k + kv_offset, v + kv_offset, o + q_offset,
                        lse + g.lse_head(b, h) + first_row, workspaces[worker]);
  });
}

void flash_backward(const Shape& shape, const float* q, const float* k, const float* v, const float* o,
                    const float* d_o, const float* lse, float* dq, float* dk, float* dv,
                    const CpuOptions& options) {
  require_valid(shape, options);
  const Geometry g(shape);
  const SingleThreadedBlas blas_guard;
  const int key_blocks = (g.seq_kv + options.bwd_kv_block - 1) / options.bwd_kv_block;
  const int splits = backward_splits(g, options, key_blocks);
  const int groups = g.batch * g.heads_kv;
  const int tasks = groups * splits;
  const int worker_count = workers(options.threads, tasks);
  const std::size_t dq_size = q_elements(shape);

  // Split groups put tasks that add into the same dQ rows on different workers: each worker then
  // accumulates into its own dQ (worker 0 into dq itself), and the copies are summed at the end.
  const bool private_dq = splits > 1 && worker_count > 1;
  AlignedFloats dq_copies = allocate_floats(private_dq ? (worker_count - 1) * dq_size : 0);
  auto dq_of_worker = [&](int worker) {
    return private_dq && worker > 0 ? dq_copies.get() + (worker - 1) * dq_size : dq;
  };
  fill(dq, dq_size, 0.0f);
  if (private_dq) fill(dq_copies.get(), (worker_count - 1) * dq_size, 0.0f);

  std::vector<BackwardWorkspace> workspaces;
  for (int w = 0; w < worker_count; ++w) workspaces.emplace_back(g, options);

  parallel_for(tasks, options.threads, [&](int task, int worker) {
    const int group_index = task / splits;  // b * Hkv + h_kv
    const int split = task % splits;
    const int b = group_index / g.heads_kv;
    const int h_kv = group_index % g.heads_kv;
    const int first_head = h_kv * g.group;
    const std::size_t q_offset = g.q_head(b, first_head);
    const std::size_t kv_offset = g.kv_head(b, h_kv);
    const BackwardGroup grp{q + q_offset,   k + kv_offset, v + kv_offset,
                            o + q_offset,   d_o + q_offset, lse + g.lse_head(b, first_head),
                            dk + kv_offset, dv + kv_offset};
    // Interleaved key blocks per split: under causal masking late blocks are light, so this evens out work.
    for (int block = split; block < key_blocks; block += splits) {
      const int first_key = block * options.bwd_kv_block;
      const int keys = std::min(options.bwd_kv_block, g.seq_kv - first_key);
      backward_key_block(g, options, grp, first_key, keys, dq_of_worker(worker) + q_offset, workspaces[worker]);
    }
  });

  if (private_dq) {
    constexpr std::size_t kChunk = 1 << 16;
    const int chunks = static_cast<int>((dq_size + kChunk - 1) / kChunk);
    parallel_for(chunks, options.threads, [&](int chunk, int) {
      const std::size_t begin = chunk * kChunk;
      const std::size_t end = std::min(dq_size, begin + kChunk);
      for (int worker = 1; worker < worker_count; ++worker) {
        const float* copy = dq_of_worker(worker);
        for (std::size_t i = begin; i < end; ++i) dq[i] += copy[i];
      }
    });
  }
}

void naive_forward(const Shape& shape, const float* q, const float* k, const float* v, float* o, float* lse,
                   const CpuOptions& options) {
  require_valid(shape, options);
  const Geometry g(shape);
  const SingleThreadedBlas blas_guard;
  const int tasks = g.batch * g.heads_q;
  std::vector<AlignedFloats> scores;  // (Sq, Skv) per worker
  for (int w = 0; w < workers(options.threads, tasks); ++w) {
    scores.push_back(allocate_floats(static_cast<std::size_t>(g.seq_q) * g.seq_kv));
  }

  parallel_for(tasks, options.threads, [&](int task, int worker) {
    const int b = task / g.heads_q;
    const int h = task % g.heads_q;
    const std::size_t q_offset = g.q_head(b, h);
    const std::size_t kv_offset = g.kv_head(b, h / g.group);
    float* s = scores[worker].get();
    // S = Q K^T / sqrt(D): (Sq, D) x (D, Skv)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g.seq_q, g.seq_kv, g.dim, g.inv_sqrt_dim, q + q_offset,
                g.dim, k + kv_offset, g.dim, 0.0f, s, g.seq_kv);
    softmax_rows(g, s, lse + g.lse_head(b, h));
    // O = P V: (Sq, Skv) x (Skv, D)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g.seq_q, g.dim, g.seq_kv, 1.0f, s, g.seq_kv,
                v + kv_offset, g.dim, 0.0f, o + q_offset, g.dim);
  });
}

void naive_backward(const Shape& shape, const float* q, const float* k, const float* v, const float* o,
                    const float* d_o, const float* lse, float* dq, float* dk, float* dv,
                    const CpuOptions& options) {
  require_valid(shape, options);
  const Geometry g(shape);
  const SingleThreadedBlas blas_guard;
  // One task per (batch, kv head): the query heads of a group all add into the same dK/dV.
  const int tasks = g.batch * g.heads_kv;
  const std::size_t matrix = static_cast<std::size_t>(g.seq_q) * g.seq_kv;
  struct Buffers {
    AlignedFloats p, dp, delta;  // (Sq, Skv), (Sq, Skv), (Sq)
  };
  std::vector<Buffers> buffers;
  for (int w = 0; w < workers(options.threads, tasks); ++w) {
    buffers.push_back({allocate_floats(matrix), allocate_floats(matrix), allocate_floats(g.seq_q)});
  }

  parallel_for(tasks, options.threads, [&](int task, int worker) {
    const int b = task / g.heads_kv;
    const int h_kv = task % g.heads_kv;
    const std::size_t kv_offset = g.kv_head(b, h_kv);
    const float* kh = k + kv_offset;  // (Skv, D)
    const float* vh = v + kv_offset;
    float* dkh = dk + kv_offset;
    float* dvh = dv + kv_offset;
    fill(dkh, static_cast<std::size_t>(g.seq_kv) * g.dim, 0.0f);
    fill(dvh, static_cast<std::size_t>(g.seq_kv) * g.dim, 0.0f);
    float* p = buffers[worker].p.get();
    float* dp = buffers[worker].dp.get();
    float* delta = buffers[worker].delta.get();
    for (int h = h_kv * g.group; h < (h_kv + 1) * g.group; ++h) {
      const std::size_t q_offset = g.q_head(b, h);
      const float* qh = q + q_offset;  // (Sq, D)
      const float* doh = d_o + q_offset;
      // P = exp(Q K^T / sqrt(D) - lse): (Sq, Skv)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g.seq_q, g.seq_kv, g.dim, g.inv_sqrt_dim, qh, g.dim,
                  kh, g.dim, 0.0f, p, g.seq_kv);
      probabilities_from_lse(g, p, lse + g.lse_head(b, h));
      // dV += P^T dO: (Skv, Sq) x (Sq, D)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g.seq_kv, g.dim, g.seq_q, 1.0f, p, g.seq_kv, doh,
                  g.dim, 1.0f, dvh, g.dim);
      // dP = dO V^T: (Sq, D) x (D, Skv)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g.seq_q, g.seq_kv, g.dim, 1.0f, doh, g.dim, vh, g.dim,
                  0.0f, dp, g.seq_kv);
      for (int i = 0; i < g.seq_q; ++i) {
        const std::size_t at = static_cast<std::size_t>(i) * g.dim;
        delta[i] = dot(doh + at, o + q_offset + at, g.dim);
      }
      for (std::size_t x = 0; x < matrix; ++x) dp[x] = p[x] * (dp[x] - delta[x / g.seq_kv]);
      // dQ = dS K / sqrt(D): (Sq, Skv) x (Skv, D)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g.seq_q, g.dim, g.seq_kv, g.inv_sqrt_dim, dp,
                  g.seq_kv, kh, g.dim, 0.0f, dq + q_offset, g.dim);
      // dK += dS^T Q / sqrt(D): (Skv, Sq) x (Sq, D)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g.seq_kv, g.dim, g.seq_q, g.inv_sqrt_dim, dp, g.seq_kv,
                  qh, g.dim, 1.0f, dkh, g.dim);
    }
  });
}

// ---------------------------------------------------------------------------------------------------------
// Error reports.

namespace {

template <class Ref>
ErrorReport compare_values(const float* got, const Ref* ref, std::size_t n, double tol, double abs_floor) {
  double ref_squares = 0.0;
  std::size_t finite = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isfinite(static_cast<double>(ref[i]))) {
      ref_squares += static_cast<double>(ref[i]) * ref[i];
      ++finite;
    }
  }
  const double ref_rms = finite == 0 ? 0.0 : std::sqrt(ref_squares / static_cast<double>(finite));

  ErrorReport report;
  double diff_squares = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double want = static_cast<double>(ref[i]);
    const double have = static_cast<double>(got[i]);
    if (!std::isfinite(want) || !std::isfinite(have)) {
      if (!(want == have)) {  // NaN never matches; infinities must agree in sign
        ++report.bad;
        report.worst_excess = INFINITY;
        report.worst_at = i;
      }
      continue;
    }
    const double diff = std::abs(have - want);
    report.max_abs = std::max(report.max_abs, diff);
    const double beyond_floor = std::max(diff - abs_floor, 0.0);
    diff_squares += beyond_floor * beyond_floor;
    const double bound = std::max(tol * (std::abs(want) + ref_rms), abs_floor);
    if (diff > bound) ++report.bad;
    if (bound > 0.0 && diff / bound > report.worst_excess) {
      report.worst_excess = diff / bound;
      report.worst_at = i;
    }
  }
  report.rel_l2 = ref_squares > 0.0 ? std::sqrt(diff_squares / ref_squares) : std::sqrt(diff_squares);
  return report;
}

}  // namespace

ErrorReport compare(const float* got, const double* ref, std::size_t n, double tol, double abs_floor) {
  return compare_values(got, ref, n, tol, abs_floor);
}
ErrorReport compare(const float* got, const float* ref, std::size_t n, double tol, double abs_floor) {
  return compare_values(got, ref, n, tol, abs_floor);
}
bool within(const ErrorReport& report, double tol) { return report.bad == 0 && report.rel_l2 <= tol; }

std::string describe(const char* label, const ErrorReport& r, std::size_t width) {
  char text[192];
  if (r.bad == 0)
    std::snprintf(text, sizeof text, "%s rel_l2 %.2e bad 0", label, r.rel_l2);
  else
    std::snprintf(text, sizeof text, "%s rel_l2 %.2e bad %zu (worst %.2f x its bound at row %zu, column %zu)", label,
                  r.rel_l2, r.bad, r.worst_excess, r.worst_at / width, r.worst_at % width);
  return text;
}

}  // namespace strata::attention
