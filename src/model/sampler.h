// Token sampling from logits, seeded: logit bias and repetition penalties (OpenAI's presence / frequency penalties,
// the CTRL repetition penalty of Hugging Face and vLLM), then greedy (temperature 0) or temperature + top-k + top-p
// (nucleus) + min-p.
//
// Order, as vLLM: logits + logit_bias; repetition_penalty over every token of the prompt and of the generated text
// (logit / p where the logit is > 0, logit * p otherwise); frequency_penalty × count and presence_penalty ×
// [count > 0] subtracted over the generated tokens; then greedy takes the first largest, or sampling keeps the top_k largest,
// of those the smallest prefix whose probability (softmax at the temperature over the top_k) reaches top_p, and of
// those the tokens with probability >= min_p × the largest, and draws one from them in proportion.
//
// Without a full sort of the vocabulary: the candidates are ordered by (logit desc, id asc), a total order, and only
// as far as needed: top_k by one selection (nth_element), then sorted blocks of the largest remaining (64, 256, ...)
// until the prefix that top_p keeps and the draw are reached. Typical distributions need a few hundred; the result
// does not depend on how far the order was taken. A top_k of at most kMaxSortedTopK is selected in one pass over the
// row (a bar that rises as it goes) and sorted whole, so that the sums over it run in the total order: then the k
// largest logits alone, in that order (the GPU selects them where the logits are: Runner::top_logits), draw the same
// token as the whole row (sample_top).
//
// The probabilities are exp((logit - max) / T) by model/sampling_math.h's exponential and their sum runs in its fixed
// blocked order, so that the GPU computes a row's mass with the host's bits (sample_top with a RowMass: a top_p or
// min_p draw over the whole vocabulary from the row's 1024 largest logits, where its nucleus lies within them).
//
// Sampling at a temperature alone (no top_k below the vocabulary, top_p 1, min_p 0: OpenAI's default request) draws by
// the Gumbel-max trick instead (model/gumbel.h): the token of the largest logit / T + Gumbel noise, the noise a pure
// function of (seed, draw, token), one pass over the row. The GPU draws it where the logits are
// (Runner::gumbel_argmax): the same token, bit for bit.
#pragma once

#include <cstdint>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/sampling_math.h"

namespace kvq {

struct SamplerConfig {
  float temperature = 0.8f;  // 0: greedy (argmax)
  int top_k = 40;            // keep the k most likely tokens (0: all)
  float top_p = 0.95f;       // then the smallest set with cumulative probability >= top_p (1: all)
  uint64_t seed = 0;         // RNG seed
  float min_p = 0.f;              // then the tokens with probability >= min_p × the largest (0: all)
  float presence_penalty = 0.f;   // subtracted from the logit of every token generated so far, once
  float frequency_penalty = 0.f;  // subtracted from the logit of every generated token, times its count
  float repetition_penalty = 1.f;  // > 0: tokens of the prompt or generated: logit / p (> 0) or logit * p (1: off)
  std::vector<std::pair<int32_t, float>> logit_bias = {};  // (token id, added to its logit)
  void validate() const;     // throws kvq::Error on out-of-range values
  // Whether the logits are changed before choosing (bias, penalties): greedy then needs them, not the raw argmax.
  bool transforms_logits() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& cfg);
  // The tokens the penalties count: the prompt (repetition penalty), then every generated token as it is chosen.
  void observe_prompt(const int32_t* ids, int n);
  void observe(int32_t id);
  // logits [vocab] + bias and penalties for the tokens observed so far (the scores sample() chooses from), in place.
  void apply_penalties(float* logits, int vocab) const;
  int32_t sample(const float* logits, int vocab);

  // How many of a row's largest logits sample_top needs to choose as sample() would from the whole row of `vocab`, for
  // a draw (temperature > 0) from unchanged logits (no bias, no penalty) that the Gumbel-max trick does not make:
  // top_k when it is smaller than the vocabulary and at most kMaxSortedTopK; else (top_p or min_p over the whole
  // vocabulary) the kMaxSortedTopK largest with the row's mass (needs_row_mass), which decide the draw when its top_p
  // nucleus or min_p set lies within them. 0 when it needs the whole row.
  int top_candidates(int vocab) const;
  bool needs_row_mass(int vocab) const;
  // sample() from the n >= top_candidates(vocab) largest logits of a row: ids[i], logits[i] in the total order (logit
  // desc, id asc), and when needs_row_mass(vocab) the row's mass (smath::RowMass over every token at this sampler's
  // temperature and min_p). The same token as sample() on the whole row, and the same draws after it; or -1, drawing
  // nothing, when the candidates do not decide it (a nucleus wider than them): then sample() must see the row.
  int32_t sample_top(const int32_t* ids, const float* logits, int n, int vocab, const smath::RowMass* mass = nullptr);

  // Whether sample() draws by the Gumbel-max trick (see the header) for a row of `vocab` logits.
  bool draws_by_gumbel(int vocab) const;
  // The next draw's noise (gumbel::draw_base) and temperature, for a token drawn elsewhere from the same logits
  // (Runner::gumbel_argmax); then take_gumbel(that token) counts the draw as sample() would have.
  uint64_t gumbel_base() const;
  int32_t take_gumbel(int32_t id) { return ++draws_, id; }

 private:
  struct Cand {
    float logit;  // after bias and penalties
    int32_t id;
    double p;     // exp((logit - max) / temperature)
  };
  void order_prefix(size_t n);  // cand_[0, n) become the n first of the total order
  // Temperature, top_p, min_p and the draw over cand_ (top_k applied); with mass, cand_ holds the row's largest
  // logits and mass what the whole row sums to (-1 when they do not decide the draw).
  int32_t draw(int vocab, const smath::RowMass* mass = nullptr);

  SamplerConfig cfg_;
  std::mt19937_64 rng_;
  uint64_t draws_ = 0;                          // tokens drawn by the Gumbel-max trick so far
  std::unordered_map<int32_t, int> generated_;  // generated token -> count
  std::vector<int32_t> seen_;                   // every distinct token of the prompt and the generated text
  std::vector<bool> seen_mask_;                 // [grows to the largest id] membership of seen_
  std::vector<float> work_;                     // [vocab] the logits with bias and penalties
  std::vector<Cand> cand_;
  size_t ordered_ = 0;                          // cand_[0, ordered_) are in order, the largest of all
};

}  // namespace kvq
