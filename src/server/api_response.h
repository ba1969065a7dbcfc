// The response bodies of the completion endpoints (OpenAI API): whole responses with usage, server-sent-event chunks
// for streaming ("data: {...}\n\n", ending in "data: [DONE]\n\n"), and the logprobs of each endpoint's format.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "server/api_request.h"
#include "tokenizer/tokenizer.h"

namespace kvq::server {

// What every body of one response shares.
struct ResponseContext {
  Endpoint endpoint;
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  int64_t created;      // unix seconds
  std::string model;
  bool logprobs;        // the request asked for them
  bool include_usage;   // streaming: "usage": null in every chunk, then a usage chunk
  const Tokenizer* tok;  // null: a server of token ids only (no logprobs asked)
};

// One whole response (non-streaming): each choice's text, finish_reason and logprobs (choices[i]: outs[i]), and the
// usage (completion_tokens: of all choices).
nlohmann::json full_response(const ResponseContext& c, const std::vector<GenerationOutput>& outs, int prompt_tokens,
                             int completion_tokens, int cached_tokens = 0);
// One streaming chunk of choice `index`'s text (and the tokens it came with); finish != None: that choice's last one,
// with its finish_reason. Chat: first = true adds the assistant role to the delta.
nlohmann::json stream_chunk(const ResponseContext& c, const std::string& text,
                            const std::vector<GeneratedToken>& tokens, FinishReason finish, bool first, int index = 0);
// The usage chunk of a stream with include_usage ("choices": []).
nlohmann::json usage_chunk(const ResponseContext& c, int prompt_tokens, int completion_tokens, int cached_tokens = 0);
// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details": {"cached_tokens"}} (OpenAI's: the
// prompt tokens served from the prefix cache).
nlohmann::json usage(int prompt_tokens, int completion_tokens, int cached_tokens = 0);

// "data: <json>\n\n"; invalid UTF-8 (a token's partial bytes) becomes U+FFFD.
std::string sse(const nlohmann::json& j);
constexpr const char* kSseDone = "data: [DONE]\n\n";
// JSON text; invalid UTF-8 becomes U+FFFD.
std::string dump(const nlohmann::json& j);

}  // namespace kvq::server
