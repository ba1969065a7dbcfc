#include "server/api_response.h"

namespace kvq::server {

namespace {

using nlohmann::json;

const char* finish_name(FinishReason r) { return r == FinishReason::Length ? "length" : "stop"; }

// Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"} (offsets in bytes
// from the start of the completion).
json completion_logprobs(const ResponseContext& c, const std::vector<GeneratedToken>& tokens, size_t& offset) {
  json toks = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const GeneratedToken& t : tokens) {
    const std::string s = c.tok->token_bytes(t.id);
    toks.push_back(s);
    lps.push_back(t.logprob);
    json top = json::object();
    for (const TokenLogprob& a : t.top) top[c.tok->token_bytes(a.id)] = a.logprob;
    tops.push_back(top);
    offs.push_back(offset);
    offset += s.size();
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char ch : s) b.push_back(int(ch));
  return b;
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
json chat_logprobs(const ResponseContext& c, const std::vector<GeneratedToken>& tokens) {
  json content = json::array();
  for (const GeneratedToken& t : tokens) {
    const std::string s = c.tok->token_bytes(t.id);
    json top = json::array();
    for (const TokenLogprob& a : t.top) {
      const std::string as = c.tok->token_bytes(a.id);
      top.push_back({{"token", as}, {"logprob", a.logprob}, {"bytes", bytes_of(as)}});
    }
    content.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json head(const ResponseContext& c, const char* object) {
  return {{"id", c.id}, {"object", object}, {"created", c.created}, {"model", c.model}};
}

}  // namespace

json usage(int prompt_tokens, int completion_tokens, int cached_tokens) {
  return {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

json full_response(const ResponseContext& c, const std::vector<GenerationOutput>& outs, int prompt_tokens,
                   int completion_tokens, int cached_tokens) {
  json choices = json::array();
  for (size_t i = 0; i < outs.size(); ++i) {
    const GenerationOutput& out = outs[i];
    json choice = {{"index", i}, {"finish_reason", finish_name(out.finish)}};
    if (c.endpoint == Endpoint::Chat) {
      choice["message"] = {{"role", "assistant"}, {"content", out.text}};
      choice["logprobs"] = c.logprobs ? chat_logprobs(c, out.tokens) : json(nullptr);
    } else {
      size_t offset = 0;
      choice["text"] = out.text;
      choice["logprobs"] = c.logprobs ? completion_logprobs(c, out.tokens, offset) : json(nullptr);
    }
    choices.push_back(std::move(choice));
  }
  json j = head(c, c.endpoint == Endpoint::Chat ? "chat.completion" : "text_completion");
  j["choices"] = std::move(choices);
  j["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens);
  return j;
}

json stream_chunk(const ResponseContext& c, const std::string& text, const std::vector<GeneratedToken>& tokens,
                  FinishReason finish, bool first, int index) {
  json choice = {{"index", index}};
  choice["finish_reason"] = finish == FinishReason::None ? json(nullptr) : json(finish_name(finish));
  if (c.endpoint == Endpoint::Chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = delta;
    choice["logprobs"] = c.logprobs && !tokens.empty() ? chat_logprobs(c, tokens) : json(nullptr);
  } else {
    size_t offset = 0;  // offsets within the chunk
    choice["text"] = text;
    choice["logprobs"] = c.logprobs && !tokens.empty() ? completion_logprobs(c, tokens, offset) : json(nullptr);
  }
  json j = head(c, c.endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array({choice});
  if (c.include_usage) j["usage"] = nullptr;
  return j;
}

json usage_chunk(const ResponseContext& c, int prompt_tokens, int completion_tokens, int cached_tokens) {
  json j = head(c, c.endpoint == Endpoint::Chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens);
  return j;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace kvq::server
