// Log-probabilities of a generated token: log-softmax of the model's logits (temperature 1, before top-k / top-p),
// the chosen token's and the k most likely (OpenAI `logprobs` / `top_logprobs`).
#pragma once

#include <cstdint>

#include "engine/request.h"

namespace kvq {

// logits: [vocab]. top: alternatives wanted (0: none); they come most likely first, ties by lower id.
GeneratedToken token_logprobs(const float* logits, int vocab, int32_t chosen, int top);

}  // namespace kvq
