#include "eval/metrics.h"

#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"

namespace kvq {

void log_softmax(const float* logits, int vocab, double* out) {
  double mx = logits[0];
  for (int i = 1; i < vocab; ++i) mx = std::max(mx, double(logits[i]));
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int i = 0; i < vocab; ++i) out[i] = double(logits[i]) - lse;
}

double kl_from_logits(const float* p_logits, const float* q_logits, int vocab, double* scratch) {
  KVQ_CHECK(vocab > 0, "kl: empty vocabulary");
  std::vector<double> own;
  if (!scratch) {
    own.resize(size_t(vocab));
    scratch = own.data();
  }
  return row_fidelity(p_logits, q_logits, vocab, -1, scratch).kl;
}

RowFidelity row_fidelity(const float* p, const float* q, int vocab, int32_t target, double* scratch) {
  KVQ_CHECK(vocab > 0 && target < vocab, "row_fidelity: target {} outside a vocabulary of {}", target, vocab);
  // Maxima (as log_softmax) and argmaxes (as argmax) in one scan.
  double mp = p[0], mq = q[0];
  int ap = 0, aq = 0;
  for (int i = 1; i < vocab; ++i) {
    mp = std::max(mp, double(p[i]));
    mq = std::max(mq, double(q[i]));
    if (p[i] > p[ap]) ap = i;
    if (q[i] > q[aq]) aq = i;
  }
  // e_i = exp(p_i - max p) kept for p's probabilities; the sums in log_softmax's order.
  double* ep = scratch;
  double sp = 0, sq = 0;
  for (int i = 0; i < vocab; ++i) {
    ep[i] = std::exp(double(p[i]) - mp);
    sp += ep[i];
    sq += std::exp(double(q[i]) - mq);
  }
  const double lse_p = mp + std::log(sp), lse_q = mq + std::log(sq);
  RowFidelity r;
  for (int i = 0; i < vocab; ++i) r.kl += ep[i] / sp * ((double(p[i]) - lse_p) - (double(q[i]) - lse_q));
  r.top1_agree = ap == aq;
  if (target >= 0) {
    r.nll_p = lse_p - double(p[target]);
    r.nll_q = lse_q - double(q[target]);
  }
  return r;
}

int argmax(const float* logits, int vocab) {
  int best = 0;
  for (int i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

double ppl_from_nll(double nll_sum, int64_t n_tokens) {
  KVQ_CHECK(n_tokens > 0, "perplexity of zero tokens");
  return std::exp(nll_sum / double(n_tokens));
}

double relative_error(double diff_sq, double ref_sq) {
  if (diff_sq == 0) return 0;
  if (ref_sq == 0) return std::numeric_limits<double>::infinity();
  return std::sqrt(diff_sq / ref_sq);
}

}  // namespace kvq
