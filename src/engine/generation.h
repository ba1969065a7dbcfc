// One request's generate loop, step by step: which tokens its next forward feeds (prefill chunks of the prompt, then
// one token per decode step), what to do with the logits of a chunk's last row (sample with the request's own
// Sampler, log-probabilities, detokenise incrementally, stop at a stop id, a stop string or max_tokens), and how to
// rebuild its cache after a preemption.
//
// Recompute replays the request's own step shapes: every forward it took (its chunk sizes from position 0) is kept
// in order, and after a preemption the same chunks are fed again before anything new. A CPU forward of a sequence
// depends only on that sequence's chunks (not on what else is in the step: tests/test_runner.cpp), so a preempted
// request's cache, logits and tokens are bit-identical to an unpreempted run. Its sampler is not rewound: the
// tokens it already chose are fed, not sampled again.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "engine/request.h"
#include "engine/stop_matcher.h"
#include "model/gumbel.h"
#include "model/sampler.h"
#include "tokenizer/tokenizer.h"

namespace kvq {

// What a step returned for the last row of a chunk that predicts: its argmax, and what choosing needs besides — the
// whole row of logits [vocab], its top_n largest (Runner::top_logits: ids and logits in the sampler's order; with the
// row's mass for a top_p / min_p draw over the whole vocabulary, Runner::row_mass), or the token drawn from it by the
// Gumbel-max trick (Runner::gumbel_argmax; -1: none), or nothing when !needs_logits().
struct RowLogits {
  int32_t argmax = 0;
  int32_t gumbel = -1;
  const float* logits = nullptr;
  const int32_t* top_ids = nullptr;
  const float* top_logits = nullptr;
  int top_n = 0;
  const smath::RowMass* mass = nullptr;
};

class Generation {
 public:
  // tok: for the text (null: ids only, as bench decode). It must outlive the generation.
  Generation(std::vector<int32_t> prompt, GenerateParams params, const Tokenizer* tok);

  const GenerateParams& params() const { return params_; }
  int prompt_tokens() const { return int(prompt_.size()); }
  int generated_tokens() const { return int(tokens_.size()) - prompt_tokens(); }
  int known() const { return int(tokens_.size()); }  // prompt + generated
  int fed() const { return fed_; }                    // tokens the cache holds
  // Tokens its cache holds at most: the prompt and every generated token but the last (which is never fed).
  int max_cache_length() const { return prompt_tokens() + std::max(params_.max_tokens - 1, 0); }

  // The next forward. next_chunk: its size when nothing limits it (a replayed chunk, else a prefill chunk of at most
  // max_chunk tokens, else 1 for decode); chunk_fixed: it is replayed and must be fed whole, not cut to a budget.
  int next_chunk(int max_chunk) const;
  bool chunk_fixed() const { return cursor_ < steps_.size(); }
  bool decoding() const { return !chunk_fixed() && known() - fed_ == 1; }
  const int32_t* ids() const { return tokens_.data() + fed_; }  // the tokens the next chunk starts with
  const int32_t* tokens() const { return tokens_.data(); }      // [known()]: the prompt, then the generated tokens
  // Whether a chunk of n tokens ends at the last known token: its last row's logits choose the next token.
  bool predicts(int n) const { return fed_ + n == known(); }
  // Whether choosing needs the logits themselves (sampling, logprobs) rather than only their argmax.
  bool needs_logits() const {
    return params_.sampler.temperature > 0.f || params_.top_logprobs >= 0 || params_.sampler.transforms_logits();
  }

  // When needs_logits(): how many of the row's largest logits choose as the whole row would (Sampler::top_candidates;
  // 0: the whole row, as log-probabilities also need), and whether with the row's mass (and its query).
  int top_candidates(int vocab) const { return params_.top_logprobs >= 0 ? 0 : sampler_.top_candidates(vocab); }
  bool needs_row_mass(int vocab) const { return top_candidates(vocab) > 0 && sampler_.needs_row_mass(vocab); }
  smath::MassQuery mass_query() const {
    return {double(params_.sampler.temperature), double(params_.sampler.min_p)};
  }
  // When needs_logits(): whether the token is drawn by the Gumbel-max trick from logits the runner may keep (no bias
  // or penalty applied on the host, no log-probabilities), and the draw to ask for.
  bool gumbel_draw(int vocab) const {
    return params_.top_logprobs < 0 && !params_.sampler.transforms_logits() && sampler_.draws_by_gumbel(vocab);
  }
  gumbel::Draw next_draw() const { return {sampler_.gumbel_base(), double(params_.sampler.temperature)}; }

  // The forward of n tokens from ids() ran (the cache holds them now).
  void fed_chunk(int n);
  // The last row after a chunk for which predicts(n) held: chooses the next token (from the row's logits, its top_n
  // >= top_candidates(vocab) largest, its Gumbel draw when gumbel_draw(vocab), or its argmax when !needs_logits()) or
  // finishes at max_tokens.
  void accept(const RowLogits& row, int vocab);
  // accept() in two halves, for a step that chooses the tokens of its sequences in parallel: choose() draws the token
  // (and its log-probabilities) and changes nothing but this generation's sampler, so it may run before fed_chunk();
  // take() appends it, detokenises and stops, after fed_chunk(). Both only where accept() would choose (not finished,
  // generated_tokens() < max_tokens). choose() gives id -1, drawing nothing, when the row's largest logits and mass do
  // not decide the draw: then it needs the row itself.
  GeneratedToken choose(const RowLogits& row, int vocab);
  void take(GeneratedToken t);
  // The scheduler freed this sequence's cache: the next chunks replay its steps from position 0.
  void preempt();
  // n > 1 choices: this generation (of the same prompt, nothing fed) takes over the prefill of leader, whose whole
  // prompt was just fed (before leader's accept): its cache is a fork of the leader's (Runner::fork_sequence) and its
  // steps are the leader's chunks, replayed after a preemption as its own. Then accept() chooses its first token from
  // the leader's logits with its own sampler.
  void adopt_prefill(const Generation& leader);
  // Prefix caching: the cache of this generation's new sequence holds its first len tokens (a cached prefix attached at
  // admission). They count as fed, as the forwards a fresh run feeds (chunks of max_chunk), so that a replay after a
  // preemption recomputes the same chunks. Returns false, changing nothing, unless len < known(), nothing is fed and
  // len ends one of its forwards (fresh: a multiple of max_chunk; a replay: one of its recorded chunks).
  bool skip_prefix(int len, int max_chunk);
  // Prompt tokens taken from the prefix cache at its first admission (usage.prompt_tokens_details.cached_tokens).
  int cached_tokens() const { return std::max(cached_, 0); }
  // Ends it now with reason (Cancelled, Error: message).
  void finish(FinishReason reason, std::string message = {});

  bool finished() const { return finish_ != FinishReason::None; }
  FinishReason finish_reason() const { return finish_; }
  // What it produced since the last take (the text, the tokens, and the finish once it has finished).
  GenerationOutput take_output();

 private:
  struct Run {  // steps_: `count` forwards of `n` tokens each
    int n, count;
  };
  void emit(int32_t id);
  void finish_text();

  std::vector<int32_t> prompt_;
  GenerateParams params_;
  const Tokenizer* tok_;
  Sampler sampler_;
  std::optional<StreamDecoder> decoder_;
  StopMatcher stop_;
  std::vector<int32_t> tokens_;  // prompt, then the generated tokens
  int fed_ = 0;
  std::vector<Run> steps_;       // every forward so far, in order
  size_t cursor_ = 0;            // == steps_.size() unless replaying; replay: the step to feed next
  int cursor_done_ = 0;          // forwards of steps_[cursor_] already replayed
  int cached_ = -1;              // prompt tokens from the prefix cache at the first admission (-1: not admitted)
  FinishReason finish_ = FinishReason::None;
  GenerationOutput out_;         // pending output
};

}  // namespace kvq
