// What one generation request asks for and what it gives back, shared by the generate loop (engine/generation.h),
// the scheduler (engine/scheduler.h) and their callers (kvq run, bench decode, kvq serve).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/sampler.h"

namespace kvq {

struct GenerateParams {
  int max_tokens = 16;                // tokens to generate at most (0: prefill only)
  SamplerConfig sampler;              // temperature (0: greedy), top-k, top-p, seed
  std::vector<std::string> stop;      // stop strings: generation ends where one appears; it is not returned
  std::vector<int32_t> stop_ids;      // ids that end generation (EOS, end of turn): counted, not returned as text
  int top_logprobs = -1;              // -1: no logprobs; 0: the chosen token's; k: and the k most likely
  void validate() const;              // throws kvq::Error on out-of-range values
};

enum class FinishReason {
  None,       // still running
  Stop,       // a stop id or stop string
  Length,     // max_tokens
  Cancelled,     // the caller cancelled it (a client that went away, a server that stops)
  Error,         // the step it was in failed (any exception; its message in the update), or the device was lost
  QueueTimeout,  // it waited longer than the queue timeout without being admitted (kvq serve --queue-timeout)
  Deadline,      // it ran past its deadline (kvq serve --request-timeout)
};
// "stop", "length", "cancelled", "error", "queue_timeout", "deadline"
const char* finish_reason_name(FinishReason r);

struct TokenLogprob {
  int32_t id;     // token id
  float logprob;  // log p(id) under the model: log-softmax of the logits (temperature 1, no top-k / top-p)
};

// One generated token with, when asked (top_logprobs >= 0), its log-probability and the most likely alternatives.
struct GeneratedToken {
  int32_t id = -1;
  float logprob = 0;               // valid when top_logprobs >= 0
  std::vector<TokenLogprob> top;   // top_logprobs alternatives, most likely first
};

// What a request produced since the last update: text released so far (complete UTF-8, held back while it may still
// become a stop string), the tokens generated, and, in the last update, why it finished.
struct GenerationOutput {
  std::string text;
  std::vector<GeneratedToken> tokens;
  FinishReason finish = FinishReason::None;
  std::string error;  // FinishReason::Error: the kvq::Error message
};

}  // namespace kvq
