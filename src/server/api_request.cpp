#include "server/api_request.h"

#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace kvq::server {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw ApiError(400, message, param); }

const char* kind_of(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number with a fraction";
    default: return "an integer";
  }
}

// Nesting depth of JSON text, outside strings; stops counting past the limit. The body is checked before it is
// parsed so that no input nests deeper than the parser and the destructors are asked to go.
bool nests_deeper_than(std::string_view s, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// Field readers: absent and null mean "not given"; anything of the wrong type or range is a 400 naming the field.
const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::optional<bool> opt_bool(const json& j, const char* key) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(key, fmt::format("'{}' must be a boolean, not {}", key, kind_of(*v)));
  return v->get<bool>();
}

std::optional<int64_t> opt_int(const json& j, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) bad(key, fmt::format("'{}' must be an integer, not {}", key, kind_of(*v)));
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    bad(key, fmt::format("'{}' must be in [{}, {}]", key, lo, hi));
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) bad(key, fmt::format("'{}' must be in [{}, {}] (got {})", key, lo, hi, x));
  return x;
}

std::optional<double> opt_number(const json& j, const char* key, double lo, double hi) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(key, fmt::format("'{}' must be a number, not {}", key, kind_of(*v)));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) bad(key, fmt::format("'{}' must be in [{}, {}] (got {})", key, lo, hi, x));
  return x;
}

std::string text_of(const json& v, const std::string& param) {
  if (!v.is_string()) bad(param, fmt::format("'{}' must be a string, not {}", param, kind_of(v)));
  return v.get<std::string>();
}

// A parameter kvq does not implement: accepted only at its no-op value.
void require_noop(const json& j, const char* key, const std::function<bool(const json&)>& is_noop,
                  const char* noop) {
  const json* v = field(j, key);
  if (v && !is_noop(*v)) bad(key, fmt::format("'{}' is not supported by kvq serve (only {})", key, noop));
}

std::vector<int32_t> token_ids(const json& a, const std::string& param) {
  std::vector<int32_t> ids;
  for (const json& t : a) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
      bad(param, fmt::format("'{}' as an array holds token ids (integers >= 0), not {}", param, kind_of(t)));
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  return ids;
}

// prompt: a string, an array of token ids, or an array holding one of those (kvq runs one prompt per request).
void parse_prompt(const json& j, ApiRequest& r) {
  const json* v = field(j, "prompt");
  if (!v) bad("prompt", "'prompt' is required");
  if (v->is_array() && v->size() == 1 && ((*v)[0].is_string() || (*v)[0].is_array())) v = &(*v)[0];
  if (v->is_string()) {
    r.prompt = v->get<std::string>();
  } else if (v->is_array() && !v->empty() && (*v)[0].is_string()) {
    bad("prompt", fmt::format("'prompt' holds {} prompts; kvq serve takes one per request", v->size()));
  } else if (v->is_array() && !v->empty() && (*v)[0].is_array()) {
    bad("prompt", fmt::format("'prompt' holds {} token-id prompts; kvq serve takes one per request", v->size()));
  } else if (v->is_array()) {
    r.prompt_ids = token_ids(*v, "prompt");
    if (r.prompt_ids.empty()) bad("prompt", "'prompt' is an empty array");
  } else {
    bad("prompt", fmt::format("'prompt' must be a string or an array of token ids, not {}", kind_of(*v)));
  }
}

std::string message_content(const json& m, const std::string& param) {
  const json* c = field(m, "content");
  if (!c) return {};  // an assistant turn may have none
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) bad(param, fmt::format("'{}' must be a string or an array of text parts, not {}", param,
                                             kind_of(*c)));
  std::string out;
  for (size_t i = 0; i < c->size(); ++i) {
    const json& part = (*c)[i];
    const std::string p = fmt::format("{}[{}]", param, i);
    if (!part.is_object()) bad(p, fmt::format("'{}' must be an object, not {}", p, kind_of(part)));
    const json* type = field(part, "type");
    if (!type || !type->is_string() || type->get<std::string>() != "text")
      bad(p, fmt::format("'{}.type' must be \"text\" (kvq serve reads text only)", p));
    const json* text = field(part, "text");
    if (!text) bad(p + ".text", fmt::format("'{}.text' is required", p));
    out += (i ? "\n" : "") + text_of(*text, p + ".text");
  }
  return out;
}

void parse_messages(const json& j, ApiRequest& r) {
  const json* v = field(j, "messages");
  if (!v) bad("messages", "'messages' is required");
  if (!v->is_array() || v->empty())
    bad("messages", fmt::format("'messages' must be a non-empty array, not {}", v->is_array() ? "empty" : kind_of(*v)));
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string p = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(p, fmt::format("'{}' must be an object, not {}", p, kind_of(m)));
    // role and content; other fields only when empty (a response's message sent back: "refusal": null, ...).
    for (const auto& [key, value] : m.items())
      if (key != "role" && key != "content" && !value.is_null() && !((value.is_array() || value.is_object()) &&
                                                                       value.empty()))
        bad(p + "." + key, fmt::format("'{}.{}' is not supported by kvq serve (it reads role and content)", p, key));
    const json* role = field(m, "role");
    if (!role) bad(p + ".role", fmt::format("'{}.role' is required", p));
    std::string rl = text_of(*role, p + ".role");
    if (rl == "developer") rl = "system";
    if (rl != "system" && rl != "user" && rl != "assistant")
      bad(p + ".role", fmt::format("'{}.role' \"{}\" is not supported (system, developer, user, assistant)", p, rl));
    r.messages.push_back({rl, message_content(m, p + ".content")});
  }
}

void parse_stop(const json& j, ApiRequest& r) {
  const json* v = field(j, "stop");
  if (!v) return;
  if (v->is_string()) {
    r.stop.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i) r.stop.push_back(text_of((*v)[i], fmt::format("stop[{}]", i)));
  } else {
    bad("stop", fmt::format("'stop' must be a string or an array of strings, not {}", kind_of(*v)));
  }
  if (int(r.stop.size()) > kMaxStops)
    bad("stop", fmt::format("'stop' holds {} strings, at most {}", r.stop.size(), kMaxStops));
  for (const std::string& s : r.stop)
    if (s.empty()) bad("stop", "'stop' strings must not be empty");
}

const std::set<std::string>& known_fields(Endpoint e) {
  static const std::set<std::string> completions = {
      "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options",
      "logprobs", "ignore_eos", "n", "best_of", "echo", "suffix", "presence_penalty", "frequency_penalty",
      "logit_bias", "user", "repetition_penalty", "min_p"};
  static const std::set<std::string> chat = {
      "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop",
      "stream", "stream_options", "logprobs", "top_logprobs", "ignore_eos", "n", "presence_penalty",
      "frequency_penalty", "logit_bias", "user", "response_format", "tools", "tool_choice", "parallel_tool_calls",
      "repetition_penalty", "min_p"};
  return e == Endpoint::Chat ? chat : completions;
}

}  // namespace

// logit_bias: {"token id": bias}, the ids as decimal strings (OpenAI's form), biases in [-100, 100].
void parse_logit_bias(const json& j, ApiRequest& r) {
  const json* v = field(j, "logit_bias");
  if (!v) return;
  if (!v->is_object()) bad("logit_bias", fmt::format("'logit_bias' must be an object, not {}", kind_of(*v)));
  if (v->size() > size_t(kMaxLogitBias))
    bad("logit_bias", fmt::format("'logit_bias' holds {} entries, at most {}", v->size(), kMaxLogitBias));
  for (const auto& [key, value] : v->items()) {
    int64_t id = -1;
    const bool digits = !key.empty() && key.size() <= 10 &&
                        key.find_first_not_of("0123456789") == std::string::npos;
    if (digits) id = std::stoll(key);
    if (!digits || id > std::numeric_limits<int32_t>::max())
      bad("logit_bias", fmt::format("'logit_bias' keys are token ids (decimal strings), not \"{}\"", key));
    if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100))
      bad("logit_bias", fmt::format("'logit_bias' values are numbers in [-100, 100] (token {})", key));
    r.logit_bias.push_back({int32_t(id), float(value.get<double>())});
  }
}

ApiRequest parse_api_request(std::string_view body, Endpoint endpoint, const ParseOptions& opt) {
  if (nests_deeper_than(body, kMaxJsonDepth))
    throw ApiError(400, fmt::format("the request body nests deeper than {} levels", kMaxJsonDepth));
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON", "", "invalid_json");
  if (!j.is_object()) throw ApiError(400, fmt::format("the request body must be a JSON object, not {}", kind_of(j)));
  ApiRequest r;
  for (const auto& [key, value] : j.items())
    if (!known_fields(endpoint).count(key)) {
      if (!opt.lenient_fields)
        bad(key, fmt::format("unrecognized request argument supplied: {} (kvq serve --lenient-fields ignores unknown "
                             "fields)", key));
      r.ignored.push_back(key);
    }

  r.endpoint = endpoint;
  if (const json* m = field(j, "model")) r.model = text_of(*m, "model");
  if (endpoint == Endpoint::Completions) parse_prompt(j, r);
  else parse_messages(j, r);

  const int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  r.max_tokens = opt_int(j, "max_tokens", 1, kMaxInt);
  if (endpoint == Endpoint::Chat)
    if (auto m = opt_int(j, "max_completion_tokens", 1, kMaxInt)) r.max_tokens = m;
  if (auto t = opt_number(j, "temperature", 0.0, 2.0)) r.temperature = float(*t);
  if (auto p = opt_number(j, "top_p", 0.0, 1.0)) {
    if (*p <= 0) bad("top_p", "'top_p' must be in (0, 1] (got 0)");
    r.top_p = float(*p);
  }
  if (auto k = opt_int(j, "top_k", -1, kMaxInt)) r.top_k = int(std::max<int64_t>(*k, 0));
  if (auto s = opt_int(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    r.seed = uint64_t(*s);
  parse_stop(j, r);
  r.stream = opt_bool(j, "stream").value_or(false);
  if (const json* so = field(j, "stream_options")) {
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed with \"stream\": true");
    if (!so->is_object())
      bad("stream_options", fmt::format("'stream_options' must be an object, not {}", kind_of(*so)));
    for (const auto& [key, value] : so->items())
      if (key != "include_usage") bad("stream_options." + key, fmt::format("unrecognized stream option: {}", key));
    r.include_usage = opt_bool(*so, "include_usage").value_or(false);
  }
  if (endpoint == Endpoint::Completions) {
    if (auto lp = opt_int(j, "logprobs", 0, kMaxLogprobs)) r.logprobs = int(*lp);
  } else {
    const bool lp = opt_bool(j, "logprobs").value_or(false);
    const auto top = opt_int(j, "top_logprobs", 0, kMaxLogprobs);
    if (top && !lp) bad("top_logprobs", "'top_logprobs' needs \"logprobs\": true");
    if (lp) r.logprobs = int(top.value_or(0));
  }
  r.ignore_eos = opt_bool(j, "ignore_eos").value_or(false);
  if (auto n = opt_int(j, "n", 1, kMaxChoices)) r.n = int(*n);
  if (auto p = opt_number(j, "presence_penalty", -2.0, 2.0)) r.presence_penalty = float(*p);
  if (auto f = opt_number(j, "frequency_penalty", -2.0, 2.0)) r.frequency_penalty = float(*f);
  if (auto rp = opt_number(j, "repetition_penalty", 0.0, 10.0)) {
    if (*rp <= 0) bad("repetition_penalty", "'repetition_penalty' must be in (0, 10] (got 0)");
    r.repetition_penalty = float(*rp);
  }
  if (auto m = opt_number(j, "min_p", 0.0, 1.0)) r.min_p = float(*m);
  parse_logit_bias(j, r);
  if (const json* u = field(j, "user")) text_of(*u, "user");  // accepted, not used

  // Parameters kvq does not implement: their no-op values only.
  auto is_int = [](int64_t want) {
    return [want](const json& v) { return v.is_number_integer() && v.get<int64_t>() == want; };
  };
  auto is_false = [](const json& v) { return v.is_boolean() && !v.get<bool>(); };
  auto is_empty = [](const json& v) { return (v.is_object() || v.is_array()) && v.empty(); };
  if (endpoint == Endpoint::Completions) {
    require_noop(j, "best_of", is_int(1), "best_of = 1");
    require_noop(j, "echo", is_false, "false");
    require_noop(j, "suffix", [](const json& v) { return v.is_string() && v.get<std::string>().empty(); }, "\"\"");
  } else {
    require_noop(j, "response_format",
                 [](const json& v) { return v.is_object() && v.size() == 1 && v.value("type", json()) == "text"; },
                 "{\"type\": \"text\"}");
    require_noop(j, "tools", is_empty, "none: kvq serve does not call tools");
    require_noop(j, "tool_choice", [](const json& v) { return v == "none"; }, "\"none\"");
    require_noop(j, "parallel_tool_calls", [](const json& v) { return v.is_boolean(); }, "a boolean");
  }
  return r;
}

}  // namespace kvq::server
