// libFuzzer target for the server's request parser (server/api_request.h).
//   The first byte picks the endpoint (even: /v1/completions, odd: /v1/chat/completions); the rest is the request
//   body. Bad input must raise ApiError (a 4xx status with a well-formed error body), never crash or throw anything
//   else; a request that parses must hold values in the documented ranges, and a chat request renders through every
//   chat template.
// Seeds: tests/server/requests/*.json (scripts/run_fuzz.sh adds them); dictionary: fuzz/fuzz_request.dict.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/api_error.h"
#include "server/api_request.h"
#include "server/api_response.h"
#include "server/chat_template.h"

namespace {

void require(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "fuzz_request: invariant violated: %s\n", what);
    std::abort();
  }
}

void check(const kvq::server::ApiRequest& r) {
  using namespace kvq::server;
  require(!r.max_tokens || *r.max_tokens >= 1, "max_tokens >= 1");
  require(r.temperature >= 0 && r.temperature <= 2, "temperature in [0, 2]");
  require(r.top_p > 0 && r.top_p <= 1, "top_p in (0, 1]");
  require(r.top_k >= 0, "top_k >= 0");
  require(r.logprobs >= -1 && r.logprobs <= kMaxLogprobs, "logprobs in [-1, 20]");
  require(int(r.stop.size()) <= kMaxStops, "at most 16 stop strings");
  for (const std::string& s : r.stop) require(!s.empty(), "stop strings are not empty");
  require(!r.include_usage || r.stream, "include_usage only with stream");
  if (r.endpoint == Endpoint::Chat) {
    require(!r.messages.empty(), "chat: messages");
    for (const ChatMessage& m : r.messages)
      require(m.role == "system" || m.role == "user" || m.role == "assistant", "chat: known roles");
    for (const char* name : {"chatml", "qwen2.5", "qwen3", "llama3", "llama3.1"}) {
      const std::string text = chat_template_by_name(name, "fuzz").render(r.messages);
      require(text.size() >= r.messages.back().content.size(), "chat: the rendering holds the last message");
    }
  } else {
    require(!r.prompt_ids.empty() || r.messages.empty(), "completions: no messages");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto endpoint = data[0] % 2 ? kvq::server::Endpoint::Chat : kvq::server::Endpoint::Completions;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    check(kvq::server::parse_api_request(body, endpoint));
  } catch (const kvq::server::ApiError& e) {
    require(e.status() >= 400 && e.status() < 500, "a client error");
    const std::string text = kvq::server::dump(e.body());
    require(text.find("\"error\"") != std::string::npos, "an error body");
  }
  return 0;
}
