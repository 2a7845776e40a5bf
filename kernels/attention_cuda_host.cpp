// The host side of the GPU attention backends (see attention_cuda.h): names, parsing, validation, the
// workspace layout and the check against the float64 reference, built with or without CUDA so the CPU build
// tests them.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention_cuda.h"
#include "kernels/flash_layout.h"

namespace strata::attention::gpu {

namespace {
double rows_of(const Shape& s) { return static_cast<double>(s.batch) * s.heads_q * s.seq_q; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
std::size_t aligned(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

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
      if (!(ref[i] == have)) {
        ++report.bad;
        report.worst_excess = INFINITY;
        report.worst_at = i;
      }
      continue;
    }
    const double diff = std::abs(have - ref[i]);
    report.max_abs = std::max(report.max_abs, diff);
    diff_squares += diff * diff;
    const double allowed = std::max(tol * (std::abs(ref[i]) + ref_rms), bound[i]);
    if (diff > allowed) ++report.bad;
    if (allowed > 0.0 && diff / allowed > report.worst_excess) {
      report.worst_excess = diff / allowed;
      report.worst_at = i;
    }
  }
  report.rel_l2 = ref_squares > 0.0 ? std::sqrt(diff_squares / ref_squares) : std::sqrt(diff_squares);
  return report;
}

// Bounds on the rounding in dQ, dK and dV of one slice (the query heads of one kv head: Q, O, dO (group, Sq, D),
// K, V (Skv, D)). Both GPU paths store dS in the dtype and form delta from O in the dtype, so the terms of
// dQ_i = scale sum_j dS_ij K_j each carry a relative error of about the dtype's unit roundoff u. Those terms
// cancel by construction (sum_j dS_ij = 0: a row that sees two keys has dS_i0 = -dS_i1), which leaves dQ of
// rows with few keys far below its terms and below the tensor's RMS, where compare()'s element test alone would
// flag plain rounding. The bound is 2 u scale sum_j (|dS_ij| + P_ij sum_d |dO_id O_id|) |K_jc|, and the same
// with Q for dK. Both paths also take P in the dtype for dV_j = sum_i P_ij dO_i: under a causal mask the first
// keys gather many rows, whose signed terms can cancel far below the tensor's RMS (seen on an H200: 2 of
// 524,288 elements of dV at 1.12 x compare()'s bound, at S = 4096). The rows' dO take either sign, so the
// rounding errors of the terms add as the root of their sum of squares: the bound is 8 u sqrt(sum_i (P_ij dO_ic)^2),
// about 14 standard deviations of rounding P to nearest (an error uniform within u P; room for the smaller
// roundings in forming P). It is above compare()'s own allowance only for keys with many large terms (the first
// keys of a causal mask), where a key off in the mask still moves an element several times more than it.
void gradient_bounds(const Shape& slice, const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, const std::vector<double>& o, const std::vector<double>& d_o,
                     const std::vector<double>& lse, double unit_roundoff, std::vector<double>& dq_bound,
                     std::vector<double>& dk_bound, std::vector<double>& dv_bound) {
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
        dv_bound[static_cast<size_t>(j) * d + c] += (p * doi[c]) * (p * doi[c]);
      }
    }
  }
  for (double& b : dq_bound) b *= 2.0 * unit_roundoff * scale;
  for (double& b : dk_bound) b *= 2.0 * unit_roundoff * scale;
  for (double& b : dv_bound) b = 8.0 * unit_roundoff * std::sqrt(b);
}

}  // namespace

std::string name(Impl impl) { return impl == Impl::flash ? "flash" : "unfused"; }
std::string name(DType dtype) { return dtype == DType::bf16 ? "bf16" : "fp16"; }

std::optional<Impl> parse_impl(const std::string& text) {
  if (text == "unfused") return Impl::unfused;
  if (text == "flash") return Impl::flash;
  return std::nullopt;
}

std::optional<DType> parse_dtype(const std::string& text) {
  if (text == "fp16") return DType::fp16;
  if (text == "bf16") return DType::bf16;
  return std::nullopt;
}

std::size_t unfused_workspace_bytes(const Shape& s) {
  const double bytes = static_cast<double>(s.batch) * s.heads_q * s.seq_q * s.seq_kv * 8.0;
  return bytes >= static_cast<double>(std::numeric_limits<std::size_t>::max() / 2)
             ? std::numeric_limits<std::size_t>::max()
             : static_cast<std::size_t>(bytes);
}

std::string validate(const Shape& s, DType dtype, Impl impl) {
  if (dtype != DType::fp16 && dtype != DType::bf16) return "unknown dtype (the gpu kernels take fp16 or bf16)";
  if (impl != Impl::unfused && impl != Impl::flash) return "unknown attention implementation (unfused or flash)";
  if (std::string problem = attention::validate(s); !problem.empty()) return problem;
  // Row-wise kernels and the flash grids index blocks with int.
  if (rows_of(s) > INT_MAX) return "batch * heads_q * seq_q exceeds the int range of the gpu kernels' grids";
  if (impl == Impl::flash) {
    if (s.head_dim != 64 && s.head_dim != 128)
      return "flash attention supports head_dim 64 and 128 only (got " + std::to_string(s.head_dim) + ")";
    if (static_cast<double>(ceil_div(s.seq_q, layout::kFwdRows)) * s.batch * s.heads_q > INT_MAX ||
        static_cast<double>(ceil_div(s.seq_kv, layout::kBwdKeys)) * s.batch * s.heads_kv > INT_MAX)
      return "flash attention grid exceeds the int range";
  } else {
    const std::size_t bytes = unfused_workspace_bytes(s);
    if (bytes > kUnfusedWorkspaceLimitBytes) {
      char text[200];
      std::snprintf(text, sizeof text,
                    "unfused attention materialises batch*heads_q*seq_q*seq_kv scores: %.2f GiB of workspace "
                    "exceeds its %.0f GiB limit (use flash)",
                    static_cast<double>(bytes) / (1u << 30),
                    static_cast<double>(kUnfusedWorkspaceLimitBytes) / (1u << 30));
      return text;
    }
  }
  return "";
}

WorkspaceLayout workspace_layout(const Shape& s, DType /*dtype: P and dS are 16-bit in both*/, Impl impl) {
  const std::size_t rows = lse_elements(s), q = q_elements(s);
  const std::size_t scores = rows * static_cast<std::size_t>(s.seq_kv);
  WorkspaceLayout w;
  w.delta = 0;
  std::size_t end = aligned(rows * sizeof(float));
  if (impl == Impl::flash) {
    w.dq_accum = end;
    end += aligned(q * sizeof(float));
  } else {
    w.scores = end;
    end += aligned(scores * sizeof(float));
    w.probs = end;
    end += aligned(scores * 2);
    w.dscores = end;
    end += aligned(scores * 2);
    w.cublaslt = end;
    end += kUnfusedCublasLtBytes;
  }
  w.bytes = end;
  return w;
}

std::size_t workspace_bytes(const Shape& shape, DType dtype, Impl impl) {
  return workspace_layout(shape, dtype, impl).bytes;
}

CheckReport check(const Shape& s, DType dtype, const HostTensors& t, bool backward, int batch, int kv_head) {
  if (batch < 0 || batch >= s.batch)
    throw std::invalid_argument("check: batch " + std::to_string(batch) + " out of range [0, " + std::to_string(s.batch) + ")");
  if (kv_head < 0 || kv_head >= s.heads_kv)
    throw std::invalid_argument("check: kv_head " + std::to_string(kv_head) + " out of range [0, " +
                     std::to_string(s.heads_kv) + ")");
  if (backward && (t.dq == nullptr || t.dk == nullptr || t.dv == nullptr))
    throw std::invalid_argument("check: the backward is checked without dq, dk and dv");
  const int group = s.heads_q / s.heads_kv;
  const Shape slice{1, group, 1, s.seq_q, s.seq_kv, s.head_dim, s.causal};
  // The group's query heads are consecutive, so their rows of Q, O, dO, dQ and lse are contiguous.
  const size_t first_head = static_cast<size_t>(batch) * s.heads_q + static_cast<size_t>(kv_head) * group;
  const size_t q_offset = first_head * s.seq_q * s.head_dim;
  const size_t q_count = static_cast<size_t>(group) * s.seq_q * s.head_dim;
  const size_t kv_offset = (static_cast<size_t>(batch) * s.heads_kv + kv_head) * s.seq_kv * s.head_dim;
  const size_t kv_count = static_cast<size_t>(s.seq_kv) * s.head_dim;
  const size_t lse_offset = first_head * s.seq_q, lse_count = static_cast<size_t>(group) * s.seq_q;
  auto slice_of = [](const float* x, size_t offset, size_t count) {
    return std::vector<double>(x + offset, x + offset + count);
  };

  CheckReport report;
  report.backward = backward;
  report.tolerance = tolerance(dtype == DType::fp16 ? Precision::fp16 : Precision::bf16);
  const double tol = report.tolerance;

  const std::vector<double> q = slice_of(t.q, q_offset, q_count);
  const std::vector<double> k = slice_of(t.k, kv_offset, kv_count);
  const std::vector<double> v = slice_of(t.v, kv_offset, kv_count);
  std::vector<double> o_ref(q_count), lse_ref(lse_count);
  reference_forward(slice, q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data());
  report.o = compare(t.o + q_offset, o_ref.data(), q_count, tol);
  report.lse = compare(t.lse + lse_offset, lse_ref.data(), lse_count, tol);
  report.passed = within(report.o, tol) && within(report.lse, tol);

  if (backward) {
    const std::vector<double> d_o = slice_of(t.d_o, q_offset, q_count);
    std::vector<double> dq_ref(q_count), dk_ref(kv_count), dv_ref(kv_count);
    reference_backward(slice, q.data(), k.data(), v.data(), o_ref.data(), d_o.data(), lse_ref.data(), dq_ref.data(),
                       dk_ref.data(), dv_ref.data());
    std::vector<double> dq_bound(q_count), dk_bound(kv_count), dv_bound(kv_count);
    const double unit_roundoff = dtype == DType::fp16 ? 0x1.0p-11 : 0x1.0p-8;
    gradient_bounds(slice, q, k, v, o_ref, d_o, lse_ref, unit_roundoff, dq_bound, dk_bound, dv_bound);
    report.dq = compare_bounded(t.dq + q_offset, dq_ref.data(), dq_bound, tol);
    report.dk = compare_bounded(t.dk + kv_offset, dk_ref.data(), dk_bound, tol);
    report.dv = compare_bounded(t.dv + kv_offset, dv_ref.data(), dv_bound, tol);
    report.passed = report.passed && within(report.dq, tol) && within(report.dk, tol) && within(report.dv, tol);
  }

  // A bad element is named by its row of the slice (query head of the group x position, or key position for dK
  // and dV) and its column.
  const auto d = static_cast<size_t>(s.head_dim);
  report.summary = describe("o", report.o, d) + ", " + describe("lse", report.lse, 1);
  if (backward)
    report.summary +=
        ", " + describe("dq", report.dq, d) + ", " + describe("dk", report.dk, d) + ", " + describe("dv", report.dv, d);
  char tail[64];
  std::snprintf(tail, sizeof tail, " (tolerance %.0e): %s", tol, report.passed ? "pass" : "FAIL");
  report.summary += tail;
  return report;
}

}  // namespace strata::attention::gpu
