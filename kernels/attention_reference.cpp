// float64 reference attention: plain loops over a materialised (Sq x Skv) softmax, one (batch, head) at a
// time. Deliberately shares no code with the fp32 kernels beyond the shape checks, so that a bug in the
// kernels' blocking, masking or scaling cannot hide in the reference as well.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/attention.h"

namespace strata::attention {
namespace {

struct ReferenceGeometry {
  explicit ReferenceGeometry(const Shape& s)
      : shape(s), group(s.heads_q / s.heads_kv), scale(1.0 / std::sqrt(static_cast<double>(s.head_dim))) {}

  // Keys visible to query row i are [0, visible_keys(i)); bottom-right causal alignment.
  long visible_keys(long i) const {
    if (!shape.causal) return shape.seq_kv;
    const long end = i + (static_cast<long>(shape.seq_kv) - shape.seq_q) + 1;
    return end < 0 ? 0 : (end > shape.seq_kv ? shape.seq_kv : end);
  }
  std::size_t q_offset(int b, int h) const {  // start of (Sq, D) rows of query head h
    return (static_cast<std::size_t>(b) * shape.heads_q + h) * shape.seq_q * shape.head_dim;
  }
  std::size_t kv_offset(int b, int h) const {  // start of (Skv, D) rows of the kv head serving query head h
    return (static_cast<std::size_t>(b) * shape.heads_kv + h / group) * shape.seq_kv * shape.head_dim;
  }
  std::size_t lse_offset(int b, int h) const {
    return (static_cast<std::size_t>(b) * shape.heads_q + h) * shape.seq_q;
  }

  const Shape shape;
  const int group;
  const double scale;
};

void require_valid(const Shape& shape) {
  if (const std::string problem = validate(shape); !problem.empty()) throw std::invalid_argument(problem);
}

double dot(const double* a, const double* b, int n) {
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Softmax probabilities of one (batch, head): P (Sq, Skv), zero where masked. Rows that see no key stay zero.
void probabilities(const ReferenceGeometry& g, const double* q, const double* k, const double* lse,
                   std::vector<double>& p) {
  const Shape& s = g.shape;
  for (long i = 0; i < s.seq_q; ++i) {
    double* row = &p[static_cast<std::size_t>(i) * s.seq_kv];
    const long visible = g.visible_keys(i);
    for (long j = 0; j < s.seq_kv; ++j) {
      row[j] = j < visible ? std::exp(g.scale * dot(q + i * s.head_dim, k + j * s.head_dim, s.head_dim) - lse[i])
                           : 0.0;
    }
  }
}

// Log-sum-exp of each row's scaled scores, -inf for rows that see no key.
void log_sum_exp(const ReferenceGeometry& g, const double* q, const double* k, double* lse) {
  const Shape& s = g.shape;
  std::vector<double> scores(static_cast<std::size_t>(s.seq_kv));
  for (long i = 0; i < s.seq_q; ++i) {
    const long visible = g.visible_keys(i);
    if (visible == 0) {
      lse[i] = -std::numeric_limits<double>::infinity();
      continue;
    }
    double max_score = -std::numeric_limits<double>::infinity();
    for (long j = 0; j < visible; ++j) {
      scores[j] = g.scale * dot(q + i * s.head_dim, k + j * s.head_dim, s.head_dim);
      max_score = std::max(max_score, scores[j]);
    }
    double sum = 0.0;
    for (long j = 0; j < visible; ++j) sum += std::exp(scores[j] - max_score);
    lse[i] = max_score + std::log(sum);
  }
}

}  // namespace

void reference_forward(const Shape& shape, const double* q, const double* k, const double* v, double* o,
                       double* lse) {
  require_valid(shape);
  const ReferenceGeometry g(shape);
  const int d = shape.head_dim;
  std::vector<double> p(static_cast<std::size_t>(shape.seq_q) * shape.seq_kv);
  for (int b = 0; b < shape.batch; ++b) {
    for (int h = 0; h < shape.heads_q; ++h) {
      const double* qh = q + g.q_offset(b, h);  // (Sq, D)
      const double* kh = k + g.kv_offset(b, h);  // (Skv, D)
      const double* vh = v + g.kv_offset(b, h);  // (Skv, D)
      double* oh = o + g.q_offset(b, h);         // (Sq, D)
      double* lh = lse + g.lse_offset(b, h);     // (Sq)
      log_sum_exp(g, qh, kh, lh);
      probabilities(g, qh, kh, lh, p);
      for (long i = 0; i < shape.seq_q; ++i) {
        double* out = oh + i * d;
        for (int c = 0; c < d; ++c) out[c] = 0.0;
        for (long j = 0; j < shape.seq_kv; ++j) {
          const double pij = p[static_cast<std::size_t>(i) * shape.seq_kv + j];
          for (int c = 0; c < d; ++c) out[c] += pij * vh[j * d + c];
        }
      }
    }
  }
}

void reference_backward(const Shape& shape, const double* q, const double* k, const double* v, const double* o,
                        const double* d_o, const double* lse, double* dq, double* dk, double* dv) {
  require_valid(shape);
  const ReferenceGeometry g(shape);
  const int d = shape.head_dim;
  const std::size_t kv_total = kv_elements(shape);
  for (std::size_t x = 0; x < kv_total; ++x) dk[x] = dv[x] = 0.0;

  std::vector<double> p(static_cast<std::size_t>(shape.seq_q) * shape.seq_kv);
  for (int b = 0; b < shape.batch; ++b) {
    for (int h = 0; h < shape.heads_q; ++h) {
      const double* qh = q + g.q_offset(b, h);
      const double* oh = o + g.q_offset(b, h);
      const double* doh = d_o + g.q_offset(b, h);
      const double* kh = k + g.kv_offset(b, h);
      const double* vh = v + g.kv_offset(b, h);
      double* dqh = dq + g.q_offset(b, h);
      double* dkh = dk + g.kv_offset(b, h);  // shared by the query heads of a group: accumulate
      double* dvh = dv + g.kv_offset(b, h);
      probabilities(g, qh, kh, lse + g.lse_offset(b, h), p);

      for (long i = 0; i < shape.seq_q; ++i) {
        const double* do_i = doh + i * d;
        // Softmax backward: dS_ij = P_ij * (dP_ij - sum_j' P_ij' dP_ij'), and that sum equals dO_i . O_i.
        const double delta = dot(do_i, oh + i * d, d);
        double* dq_i = dqh + i * d;
        for (int c = 0; c < d; ++c) dq_i[c] = 0.0;
        for (long j = 0; j < shape.seq_kv; ++j) {
          const double pij = p[static_cast<std::size_t>(i) * shape.seq_kv + j];
          if (pij == 0.0) continue;  // masked (or underflowed) pairs carry no gradient
          const double dp = dot(do_i, vh + j * d, d);
          const double ds = pij * (dp - delta) * g.scale;
          for (int c = 0; c < d; ++c) {
            dq_i[c] += ds * kh[j * d + c];
            dkh[j * d + c] += ds * qh[i * d + c];
            dvh[j * d + c] += pij * do_i[c];
          }
        }
      }
    }
  }
}

}  // namespace strata::attention
