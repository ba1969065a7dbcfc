// Per-token fidelity metrics on logit rows (docs/guide/methods.md §8), all computed in double precision.
#pragma once

#include <cstdint>

namespace kvq {

// log softmax(logits[0..vocab)) into out[0..vocab).
void log_softmax(const float* logits, int vocab, double* out);

// KL(p ‖ q) = Σ_i p_i (log p_i - log q_i) in nats, p = softmax(p_logits), q = softmax(q_logits).
// Identical rows give exactly 0. scratch: vocab doubles, or null to allocate.
double kl_from_logits(const float* p_logits, const float* q_logits, int vocab, double* scratch = nullptr);

// Everything the lockstep comparison needs from one pair of rows, with one log-softmax of each (2 · vocab exps):
// KL(p ‖ q) as kl_from_logits, whether the argmaxes agree, and for target >= 0 the NLL of target under p and q,
// bit for bit eval::token_nll's. scratch: vocab doubles.
struct RowFidelity {
  double kl = 0;           // KL(p ‖ q) in nats
  bool top1_agree = false; // argmax(p) == argmax(q) (first maximum on ties)
  double nll_p = 0, nll_q = 0;  // -log p(target), -log q(target); 0 when target < 0
};
RowFidelity row_fidelity(const float* p_logits, const float* q_logits, int vocab, int32_t target, double* scratch);

// Index of the largest logit (the first one on ties).
int argmax(const float* logits, int vocab);

// Perplexity from a summed NLL (nats) over n_tokens: exp(nll_sum / n_tokens).
double ppl_from_nll(double nll_sum, int64_t n_tokens);

// Relative error ‖a - b‖ / ‖b‖ from accumulated squared norms: sqrt(diff_sq / ref_sq); 0 when both are 0.
double relative_error(double diff_sq, double ref_sq);

}  // namespace kvq
