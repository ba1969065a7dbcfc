// Passkey (needle-in-a-haystack) retrieval in exactly the reference model's training format
// (scripts/qwen3_torch.py PASSKEY / passkey_example, models/ref/MODEL_CARD.md):
//
//   prompt = hay[:pos] + NEEDLE + hay[pos:] + QUESTION,   answer = " {key}"   (key: 5 digits, [10000, 99999])
//   NEEDLE   = " The pass key is {key}. Remember it. {key} is the pass key. "
//   QUESTION = " What is the pass key? The pass key is"
//   n_hay = ctx - len(needle) - len(question) - len(answer) token ids,  pos = round(depth * n_hay) (half to even,
//   as Python's round), hay = n_hay contiguous eval tokens from a seeded random start in [0, |haystack| - n_hay - 1].
//
// Each part is tokenized on its own, so the prompt holds the needle's ids verbatim at pos, and the prompt has
// ctx - len(answer) tokens. Scoring: greedy decoding of len(answer) tokens through the method's cache
// (decode-faithful: the prompt is prefilled in chunks, then one token per step), exact match of all of them. The
// needle prompt is the prompt of the cache's prompt policy: Runner::end_prompt is called after its prefill, so the
// first answer token comes from the prefill's last logits and the others read the cache as the policy left it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "eval/rng.h"
#include "kv/cache.h"
#include "model/runner.h"
#include "tokenizer/tokenizer.h"

namespace kvq {

inline constexpr const char* kPasskeyNeedle = " The pass key is {key}. Remember it. {key} is the pass key. ";
inline constexpr const char* kPasskeyQuestion = " What is the pass key? The pass key is";
inline constexpr const char* kPasskeyAnswer = " {key}";
inline constexpr int kPasskeyKeyMin = 10000, kPasskeyKeyMax = 99999;

struct PasskeyParts {
  std::vector<int32_t> needle, question, answer;  // token ids of each part, tokenized separately
};
PasskeyParts passkey_parts(const Tokenizer& tok, int key);

struct PasskeyPrompt {
  std::vector<int32_t> prompt;  // [ctx - len(answer)] hay[:pos] + needle + hay[pos:] + question
  std::vector<int32_t> answer;  // expected greedy continuation
  int key = 0;                  // the 5-digit pass key
  double depth = 0;             // needle depth in [0, 1]
  int needle_pos = 0;           // index of the needle's first token in prompt (= pos)
  int n_hay = 0;                // haystack tokens in the prompt
  int64_t hay_start = 0;        // first haystack token taken from the eval stream
};

// Python round(): nearest integer, halves to even.
int64_t round_half_even(double x);

// Builds one prompt from haystack[hay_start, hay_start + n_hay). kvq::Error when ctx is too short for the parts or
// the haystack too short.
PasskeyPrompt make_passkey_prompt(const Tokenizer& tok, std::span<const int32_t> haystack, int ctx, int key,
                                  double depth, int64_t hay_start);

// Seeded prompt source: per prompt draws the key, then the haystack start (the order of make_golden.py).
class PasskeyGenerator {
 public:
  PasskeyGenerator(const Tokenizer& tok, std::span<const int32_t> haystack, uint64_t seed)
      : tok_(&tok), hay_(haystack), rng_(seed) {}
  PasskeyPrompt next(int ctx, double depth);

 private:
  const Tokenizer* tok_;         // not owned
  std::span<const int32_t> hay_; // not owned: all eval tokens, domains concatenated in sorted order
  EvalRng rng_;
};

struct PasskeyCell {
  double depth = 0;  // needle depth
  int correct = 0;   // exact matches
  int trials = 0;    // prompts scored
  std::vector<int> keys;         // [trials] the pass key of each prompt (same seed: same prompts for every method)
  std::vector<uint8_t> correct_by_trial;  // [trials] 1 if that prompt was answered exactly
};

struct PasskeyResult {
  int ctx = 0;                         // context length (prompt + answer)
  std::vector<PasskeyCell> by_depth;   // one cell per depth, in the order given
  int correct = 0, trials = 0;         // over all depths
  double seconds = 0;                  // wall time
};

// Prefills prompt into sequence seq of the runner in chunks of max_chunk and returns the argmax of its last row (the
// first greedy token).
int32_t prefill_argmax(Runner& runner, int seq, std::span<const int32_t> prompt);

// Greedy decoding: prefills prompt through the runner's cache (a fresh sequence, chunks of max_chunk), calls
// Runner::end_prompt, then decodes
// n_new tokens one at a time (argmax where the logits are); the runner must hold prompt.size() + n_new - 1 tokens.
// Frees the sequence.
std::vector<int32_t> greedy_decode(Runner& runner, std::span<const int32_t> prompt, int n_new);

// Accuracy over depths × trials prompts of ctx tokens, prompts from gen, through the runner (the method's cache
// and transform; it must hold ctx tokens). progress(done, total) per prompt.
PasskeyResult run_passkey(Runner& runner, PasskeyGenerator& gen, int ctx, const std::vector<double>& depths, int trials,
                          const std::function<void(int, int)>& progress = {});

}  // namespace kvq
