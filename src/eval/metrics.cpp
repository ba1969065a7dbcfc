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
    own.resize(size_t(vocab) * 2);
    scratch = own.data();
  }
  double* lp = scratch;
  double* lq = scratch + vocab;
  log_softmax(p_logits, vocab, lp);
  log_softmax(q_logits, vocab, lq);
  double kl = 0;
  for (int i = 0; i < vocab; ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return kl;
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
