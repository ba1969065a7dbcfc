// Per-token fidelity metrics on logit rows (METHODS.md §8), all computed in double precision.
#pragma once

#include <cstdint>

namespace kvq {

// log softmax(logits[0..vocab)) into out[0..vocab).
void log_softmax(const float* logits, int vocab, double* out);

// KL(p ‖ q) = Σ_i p_i (log p_i - log q_i) in nats, p = softmax(p_logits), q = softmax(q_logits).
// Identical rows give exactly 0. scratch: 2 * vocab doubles, or null to allocate.
double kl_from_logits(const float* p_logits, const float* q_logits, int vocab, double* scratch = nullptr);

// Index of the largest logit (the first one on ties).
int argmax(const float* logits, int vocab);

// Perplexity from a summed NLL (nats) over n_tokens: exp(nll_sum / n_tokens).
double ppl_from_nll(double nll_sum, int64_t n_tokens);

// Relative error ‖a - b‖ / ‖b‖ from accumulated squared norms: sqrt(diff_sq / ref_sq); 0 when both are 0.
double relative_error(double diff_sq, double ref_sq);

}  // namespace kvq
