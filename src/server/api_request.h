// The request bodies of POST /v1/completions and POST /v1/chat/completions (OpenAI API), parsed and validated before
// any work: every bad field is an ApiError (400) naming the field and what is accepted. Parameters kvq does not
// implement are refused when set to anything but their no-op value (best_of = 1, echo false, ...), never ignored;
// unknown fields are refused as OpenAI does, or, with ParseOptions::lenient_fields (kvq serve --lenient-fields),
// ignored and listed in ApiRequest::ignored (the server logs each name once). The fuzz target fuzz/fuzz_request.cpp
// drives this parser.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvq::server {

enum class Endpoint { Completions, Chat };

struct ChatMessage {
  std::string role;     // system | user | assistant ("developer" is read as system)
  std::string content;  // a string, or the text parts joined by "\n"
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;                        // "" when not given (the served model)
  // Completions: the prompt, as text or as token ids (prompt_ids non-empty).
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  // Chat: the conversation.
  std::vector<ChatMessage> messages;

  std::optional<int> max_tokens;            // max_tokens / max_completion_tokens; unset: the endpoint's default
  float temperature = 1.0f;                 // [0, 2]; 0: greedy
  float top_p = 1.0f;                       // (0, 1]
  int top_k = 0;                            // 0 or -1: off
  std::optional<uint64_t> seed;             // unset: a random seed; choice i of n is seeded seed + i
  int n = 1;                                // choices of the prompt, [1, kMaxChoices] (the server: at most -np)
  float presence_penalty = 0;               // [-2, 2]
  float frequency_penalty = 0;              // [-2, 2]
  float repetition_penalty = 1;             // vLLM's extension: (0, 10]
  float min_p = 0;                          // vLLM's extension: [0, 1]
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100]), at most kMaxLogitBias
  std::vector<std::string> stop;            // up to kMaxStops non-empty strings
  bool stream = false;
  bool include_usage = false;               // stream_options.include_usage
  int logprobs = -1;                        // -1: none; k >= 0: the chosen token's and the top k (<= kMaxLogprobs)
  bool ignore_eos = false;                  // vLLM's extension: generate max_tokens whatever the model says
  std::vector<std::string> ignored;         // unknown fields ignored (ParseOptions::lenient_fields)
};

struct ParseOptions {
  bool lenient_fields = false;  // unknown fields are ignored (listed in ApiRequest::ignored) instead of refused
};

constexpr int kMaxStops = 16;
constexpr int kMaxLogprobs = 20;
constexpr int kMaxJsonDepth = 32;  // nesting of the request body at most (objects and arrays)
constexpr int kMaxChoices = 128;   // n at most (OpenAI's limit)
constexpr int kMaxLogitBias = 1024;  // logit_bias entries at most

// Parses a request body; throws ApiError (400) on malformed JSON, wrong types, out-of-range values, unsupported or
// unknown parameters.
ApiRequest parse_api_request(std::string_view body, Endpoint endpoint, const ParseOptions& opt = {});

}  // namespace kvq::server
