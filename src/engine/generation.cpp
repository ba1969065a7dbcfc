#include "engine/generation.h"

#include <algorithm>

#include "common/error.h"
#include "engine/logprobs.h"

namespace kvq {

void GenerateParams::validate() const {
  KVQ_CHECK(max_tokens >= 0, "max_tokens must be >= 0 (got {})", max_tokens);
  KVQ_CHECK(top_logprobs >= -1, "top_logprobs must be >= 0 (got {})", top_logprobs);
  sampler.validate();
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "none";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
    case FinishReason::QueueTimeout: return "queue_timeout";
    case FinishReason::Deadline: return "deadline";
  }
  return "?";
}

Generation::Generation(std::vector<int32_t> prompt, GenerateParams params, const Tokenizer* tok)
    : prompt_(std::move(prompt)), params_(std::move(params)), tok_(tok), sampler_(params_.sampler),
      stop_(params_.stop) {
  params_.validate();
  KVQ_CHECK(!prompt_.empty(), "the prompt is empty (a request needs at least one token)");
  if (tok_) decoder_.emplace(*tok_);
  tokens_ = prompt_;
  sampler_.observe_prompt(prompt_.data(), int(prompt_.size()));  // the repetition penalty counts the prompt
  tokens_.reserve(prompt_.size() + size_t(params_.max_tokens));
}

int Generation::next_chunk(int max_chunk) const {
  if (chunk_fixed()) return steps_[cursor_].n;
  return std::min(known() - fed_, max_chunk);
}

void Generation::fed_chunk(int n) {
  KVQ_CHECK(n >= 1 && fed_ + n <= known(), "generation: a chunk of {} tokens at {} of {} known", n, fed_, known());
  if (chunk_fixed()) {
    KVQ_CHECK(n == steps_[cursor_].n, "generation: replayed a chunk of {} tokens where the run had {}", n,
              steps_[cursor_].n);
    if (++cursor_done_ == steps_[cursor_].count) ++cursor_, cursor_done_ = 0;
  } else {
    if (!steps_.empty() && steps_.back().n == n)
      ++steps_.back().count;
    else
      steps_.push_back({n, 1});
    cursor_ = steps_.size();
  }
  fed_ += n;
}

void Generation::preempt() {
  fed_ = 0;
  cursor_ = 0;
  cursor_done_ = 0;
}

void Generation::adopt_prefill(const Generation& leader) {
  KVQ_CHECK(prompt_ == leader.prompt_ && fed_ == 0 && generated_tokens() == 0 && leader.fed_ == leader.known() &&
                leader.generated_tokens() == 0,
            "generation: adopt_prefill of a leader at {} of {} tokens ({} generated) by a choice at {}", leader.fed_,
            leader.known(), leader.generated_tokens(), fed_);
  steps_ = leader.steps_;
  cursor_ = steps_.size();
  cursor_done_ = 0;
  fed_ = leader.fed_;
}

bool Generation::skip_prefix(int len, int max_chunk) {
  if (len <= 0 || len >= known() || fed_ != 0 || max_chunk <= 0) return false;
  if (steps_.empty()) {  // fresh: the chunks a fresh run feeds from position 0
    if (len % max_chunk != 0) return false;
    steps_.push_back({max_chunk, len / max_chunk});
    cursor_ = steps_.size();
    cursor_done_ = 0;
    fed_ = len;
    if (cached_ < 0) cached_ = len;
    return true;
  }
  int at = 0;  // a replay: len must end one of its recorded forwards
  for (size_t i = 0; i < steps_.size() && at < len; ++i) {
    const Run r = steps_[i];
    if ((len - at) % r.n == 0 && (len - at) / r.n <= r.count) {
      const int k = (len - at) / r.n;
      cursor_ = k == r.count ? i + 1 : i;
      cursor_done_ = k == r.count ? 0 : k;
      fed_ = len;
      return true;
    }
    at += r.n * r.count;
  }
  return false;
}

void Generation::accept(const RowLogits& row, int vocab) {
  KVQ_CHECK(!finished() && fed_ == known(), "generation: logits accepted at {} of {} known tokens", fed_, known());
  if (generated_tokens() >= params_.max_tokens) return finish(FinishReason::Length);
  GeneratedToken t = choose(row, vocab);
  KVQ_CHECK(t.id >= 0, "generation: the row's largest logits do not decide the draw; it needs the row");
  take(std::move(t));
}

GeneratedToken Generation::choose(const RowLogits& row, int vocab) {
  const float* logits = row.logits;
  int32_t id = row.argmax;
  if (logits) {
    id = sampler_.sample(logits, vocab);
  } else if (needs_logits() && gumbel_draw(vocab)) {
    KVQ_CHECK(row.gumbel >= 0, "generation: drawing by the Gumbel-max trick needs the row's draw or its logits");
    id = sampler_.take_gumbel(row.gumbel);
  } else if (needs_logits()) {
    KVQ_CHECK(row.top_n > 0 && params_.top_logprobs < 0, "generation: choosing needs the whole row of logits");
    id = sampler_.sample_top(row.top_ids, row.top_logits, row.top_n, vocab, row.mass);
    if (id < 0) return GeneratedToken{-1, 0.f, {}};
  }
  return params_.top_logprobs >= 0 ? token_logprobs(logits, vocab, id, params_.top_logprobs)
                                   : GeneratedToken{id, 0.f, {}};
}

void Generation::take(GeneratedToken t) {
  KVQ_CHECK(t.id >= 0 && !finished() && fed_ == known() && generated_tokens() < params_.max_tokens,
            "generation: a token taken at {} of {} known tokens, {} of {} generated", fed_, known(),
            generated_tokens(), params_.max_tokens);
  const int32_t id = t.id;
  sampler_.observe(id);
  tokens_.push_back(id);
  out_.tokens.push_back(std::move(t));
  if (std::find(params_.stop_ids.begin(), params_.stop_ids.end(), id) != params_.stop_ids.end())
    return finish(FinishReason::Stop);
  emit(id);
  if (stop_.stopped()) return finish(FinishReason::Stop);
  if (generated_tokens() >= params_.max_tokens) finish(FinishReason::Length);
}

void Generation::emit(int32_t id) {
  if (decoder_) out_.text += stop_.push(decoder_->push(id));
}

void Generation::finish_text() {
  if (!decoder_) return;
  out_.text += stop_.push(decoder_->flush());
  out_.text += stop_.flush();
}

void Generation::finish(FinishReason reason, std::string message) {
  if (finished()) return;
  finish_ = reason;
  if (reason == FinishReason::Stop || reason == FinishReason::Length) finish_text();
  out_.finish = reason;
  out_.error = std::move(message);
}

GenerationOutput Generation::take_output() {
  GenerationOutput o = std::move(out_);
  out_ = {};
  return o;
}

}  // namespace kvq
