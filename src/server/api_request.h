// The request bodies of POST /v1/completions and POST /v1/chat/completions (OpenAI API), parsed and validated before
// any work: every bad field is an ApiError (400) naming the field and what is accepted. Parameters kvq does not
// implement are refused when set to anything but their no-op value (n = 1, penalties 0, ...), never ignored; unknown
// fields are refused as OpenAI does. The fuzz target fuzz/fuzz_request.cpp drives this parser.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
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
  std::optional<uint64_t> seed;             // unset: a random seed
  std::vector<std::string> stop;            // up to kMaxStops non-empty strings
  bool stream = false;
  bool include_usage = false;               // stream_options.include_usage
  int logprobs = -1;                        // -1: none; k >= 0: the chosen token's and the top k (<= kMaxLogprobs)
  bool ignore_eos = false;                  // vLLM's extension: generate max_tokens whatever the model says
};

constexpr int kMaxStops = 16;
constexpr int kMaxLogprobs = 20;
constexpr int kMaxJsonDepth = 32;  // nesting of the request body at most (objects and arrays)

// Parses a request body; throws ApiError (400) on malformed JSON, wrong types, out-of-range values, unsupported or
// unknown parameters.
ApiRequest parse_api_request(std::string_view body, Endpoint endpoint);

}  // namespace kvq::server
