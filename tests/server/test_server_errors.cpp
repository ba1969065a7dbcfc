// kvq serve on bad input and faults, over HTTP: each case gets its status and the OpenAI error body
// {"error": {"message", "type", "param", "code"}} naming what is wrong, and the server keeps serving.
#include "server_harness.h"

using namespace kvq;
using namespace kvq::test;

namespace {

const char* kCompletions = "/v1/completions";
const char* kChat = "/v1/chat/completions";

std::string ids_prompt(int n) {
  json a = json::array();
  for (int i = 0; i < n; ++i) a.push_back(100 + i % 50);
  return json{{"prompt", a}, {"max_tokens", 1}}.dump();
}

}  // namespace

TEST(ServerErrors, EveryBadRequestGetsItsStatusAndErrorBodyAndTheServerGoesOn) {
  ServerSetup setup;
  setup.ctx = 64;
  setup.max_body_bytes = 64 << 10;
  TestServer s(setup);
  const std::string bad = "invalid_request_error";
  // Malformed JSON, and JSON that is not an object.
  expect_error(post(s, kCompletions, "{\"prompt\": \"hi\""), 400, bad, "", "invalid_json", "not valid JSON");
  expect_error(post(s, kCompletions, "[1, 2]"), 400, bad, "", "", "must be a JSON object");
  expect_error(post(s, kCompletions, std::string(40, '[') + std::string(40, ']')), 400, bad, "", "", "nests deeper");
  // Wrong types.
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "max_tokens": "ten"})"), 400, bad, "max_tokens", "",
               "'max_tokens' must be an integer, not a string");
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "max_tokens": 2.5})"), 400, bad, "max_tokens", "",
               "must be an integer");
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "temperature": "hot"})"), 400, bad, "temperature", "",
               "must be a number");
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "stream": "yes"})"), 400, bad, "stream", "",
               "must be a boolean");
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "stop": 5})"), 400, bad, "stop", "",
               "a string or an array of strings");
  expect_error(post(s, kCompletions, R"({"prompt": 5})"), 400, bad, "prompt", "",
               "a string or an array of token ids");
  expect_error(post(s, kCompletions, R"({"max_tokens": 3})"), 400, bad, "prompt", "", "'prompt' is required");
  expect_error(post(s, kChat, R"({"messages": "hi"})"), 400, bad, "messages", "", "must be a non-empty array");
  expect_error(post(s, kChat, R"({"messages": [{"role": 7, "content": "x"}]})"), 400, bad, "messages[0].role", "",
               "must be a string");
  expect_error(post(s, kChat, R"({"messages": [{"role": "tool", "content": "x"}]})"), 400, bad, "messages[0].role",
               "", "is not supported");
  // Out of range and unsupported.
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "temperature": 3})"), 400, bad, "temperature", "",
               "in [0, 2]");
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "top_p": 0})"), 400, bad, "top_p", "", "(0, 1]");
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "logprobs": 21})"), 400, bad, "logprobs", "", "[0, 20]");
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "max_tokens": 0})"), 400, bad, "max_tokens", "", "[1,");
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "n": 5})"), 400, bad, "n", "", "at most 4 requests at once");
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "logit_bias": {"9000": 1}})"), 400, bad, "logit_bias", "",
               "outside the vocabulary");
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "frobnicate": 1})"), 400, bad, "frobnicate", "",
               "unrecognized request argument");
  expect_error(post(s, kChat, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})"),
               400, bad, "tools", "", "does not call tools");
  expect_error(post(s, kCompletions, R"({"prompt": [1, 9000]})"), 400, bad, "prompt", "",
               "outside the vocabulary of 8192");
  expect_error(post(s, kCompletions, R"({"prompt": ""})"), 400, bad, "prompt", "", "encodes to no tokens");
  expect_error(post(s, kCompletions, R"({"prompt": ["a", "b"]})"), 400, bad, "prompt", "", "one per request");
  // Prompt or max_tokens past the context (64 tokens).
  expect_error(post(s, kCompletions, ids_prompt(64)), 400, bad, "prompt", "context_length_exceeded",
               "maximum context length is 64 tokens");
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "max_tokens": 64})"), 400, bad, "max_tokens",
               "context_length_exceeded", "(1 in the prompt, 64 in the completion)");
  // Unknown model, unknown URL, a body over the limit.
  expect_error(post(s, kCompletions, R"({"prompt": "hi", "model": "gpt-4"})"), 404, bad, "model", "model_not_found",
               "`gpt-4` does not exist");
  expect_error(post(s, "/v1/embeddings", "{}"), 404, bad, "", "unknown_url", "POST /v1/embeddings");
  expect_error(post(s, kCompletions, json{{"prompt", std::string(100 << 10, 'a')}}.dump()), 413, bad, "",
               "request_too_large", "larger than the server accepts");
  // Still serving, and nothing was left running.
  const Reply ok = post(s, kCompletions, R"({"prompt": "The kernel", "max_tokens": 2, "model": "ref"})");
  EXPECT_EQ(ok.status, 200) << ok.raw;
  EXPECT_EQ(ok.body["usage"]["completion_tokens"].get<int>() <= 2, true);
  EXPECT_TRUE(eventually([&] { return metric(s, "kvq_requests_running") == 0; }));  // published after the step
  EXPECT_EQ(metric(s, "kvq_kv_sequences_live"), 0);
}

TEST(ServerErrors, ApiKeyIsRequiredOnV1AndHealthAndMetricsStayOpen) {
  ServerSetup setup;
  setup.ctx = 64;
  setup.api_key = "sekret";
  TestServer s(setup);
  expect_error(get(s, "/v1/models"), 401, "authentication_error", "", "missing_api_key", "didn't provide an API key");
  expect_error(get(s, "/v1/models", {{"Authorization", "Bearer wrong"}}), 401, "authentication_error", "",
               "invalid_api_key", "Incorrect API key");
  expect_error(post(s, kCompletions, R"({"prompt": "hi"})", {{"Authorization", "sekret"}}), 401,
               "authentication_error", "", "invalid_api_key", "Incorrect API key");
  const Reply models = get(s, "/v1/models", {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(models.status, 200);
  EXPECT_EQ(models.body["data"][0]["id"], "ref");
  EXPECT_EQ(get(s, "/health").status, 200);
  EXPECT_EQ(get(s, "/metrics").status, 200);
}

TEST(ServerErrors, ChatWithoutATemplateIsRefusedWithTheReason) {
  ServerSetup setup;
  setup.ctx = 64;
  setup.chat = false;
  TestServer s(setup);
  expect_error(post(s, kChat, R"({"messages": [{"role": "user", "content": "hi"}]})"), 400,
               "invalid_request_error", "messages", "", "no chat template");
}

TEST(ServerErrors, AFullQueueGets429AndDisconnectedClientsAreCancelled) {
  ServerSetup setup;
  setup.ctx = 256;
  setup.np = 1;
  setup.max_queue = 1;
  TestServer s(setup);
  const std::string long_stream = R"({"prompt": "The kernel", "max_tokens": 250, "ignore_eos": true, "stream": true})";
  // One running, one queued: the third is refused. Then both clients close their connections at their next event.
  std::atomic<bool> leave{false};
  std::thread a([&] { post_stream(s, kCompletions, long_stream, 0, &leave); });
  ASSERT_TRUE(eventually([&] { return metric(s, "kvq_requests_running") == 1; }));
  std::thread b([&] { post_stream(s, kCompletions, long_stream, 0, &leave); });
  ASSERT_TRUE(eventually([&] { return metric(s, "kvq_requests_waiting") == 1; }));
  expect_error(post(s, kCompletions, R"({"prompt": "hi"})"), 429, "rate_limit_error", "", "queue_full",
               "the server is busy");
  leave = true;
  a.join();
  b.join();
  // Both went away mid-stream: cancelled, their pages and slots freed, far from their 200 tokens.
  ASSERT_TRUE(eventually(
      [&] { return metric(s, "kvq_requests_running") == 0 && metric(s, "kvq_requests_waiting") == 0; }));
  EXPECT_EQ(metric(s, "kvq_requests_finished_total{reason=\"cancelled\"}"), 2);
  EXPECT_EQ(metric(s, "kvq_kv_pages_used"), 0);
  EXPECT_EQ(metric(s, "kvq_kv_sequences_live"), 0);
  EXPECT_LT(metric(s, "kvq_generation_tokens_total"), 500);
}

TEST(ServerErrors, DrainRefusesNewRequestsWith503AndFinishesTheStreamInFlight) {
  ServerSetup setup;
  setup.ctx = 128;
  TestServer s(setup);
  Streamed st;
  std::thread client([&] {
    st = post_stream(s, kCompletions,
                     R"({"prompt": "The kernel", "max_tokens": 60, "ignore_eos": true, "stream": true})");
  });
  ASSERT_TRUE(eventually([&] { return metric(s, "kvq_generation_tokens_total") >= 1; }));
  std::thread drain([&] { s.http().drain(); });
  ASSERT_TRUE(eventually([&] { return s.http().draining(); }));
  expect_error(post(s, kCompletions, R"({"prompt": "hi"})"), 503, "server_error", "", "shutting_down",
               "shutting down");
  expect_error(get(s, "/health"), 503, "server_error", "", "shutting_down", "shutting down");
  client.join();
  drain.join();
  s.join();  // run() returned: the drain stopped the server
  EXPECT_EQ(st.status, 200);
  EXPECT_TRUE(st.done);
  ASSERT_FALSE(st.events.empty());
  EXPECT_EQ(st.events.back()["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(s.engine().in_flight(), 0);
}
