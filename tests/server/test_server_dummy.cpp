// kvq serve --dummy-weights: random weights of models/ref's config behind the server, no tokenizer and no chat
// template. Prompts of token ids run and are answered with token counts (the engine really generated them: /metrics
// counts them too); whatever needs text gets a 400 that says the server has no tokenizer.
#include "server_harness.h"

using namespace kvq;
using namespace kvq::test;

namespace {

const char* kCompletions = "/v1/completions";

json ids_request(int n_prompt, int max_tokens) {
  json ids = json::array();
  for (int i = 0; i < n_prompt; ++i) ids.push_back(1 + (i * 37) % 8000);
  return {{"prompt", ids}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}};
}

}  // namespace

TEST(ServerDummyWeights, TokenIdPromptsRunAndRepliesCountTheirTokens) {
  ServerSetup setup;
  setup.ctx = 96;
  setup.dummy_weights = true;
  TestServer s(setup);

  const Reply r = post(s, kCompletions, ids_request(20, 7).dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& choice = r.body["choices"][0];
  EXPECT_EQ(choice["text"], "");  // no tokenizer: no text
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], 20);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 7);

  json body = ids_request(12, 5);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const Streamed st = post_stream(s, kCompletions, body.dump());
  ASSERT_EQ(st.status, 200);
  EXPECT_TRUE(st.done);
  EXPECT_EQ(st.text, "");
  int token_chunks = 0;  // chunks before the finish: the tokens as they came (several may share a chunk)
  for (const json& e : st.events)
    if (!e["choices"].empty() && e["choices"][0]["finish_reason"].is_null()) ++token_chunks;
  EXPECT_GE(token_chunks, 1);
  EXPECT_LE(token_chunks, 5);
  ASSERT_FALSE(st.events.empty());
  EXPECT_EQ(st.events.back()["usage"]["completion_tokens"], 5);  // the usage chunk comes last
  EXPECT_EQ(st.events.back()["usage"]["prompt_tokens"], 12);
  EXPECT_TRUE(eventually([&] { return metric(s, "kvq_generation_tokens_total") == 12; }));
}

TEST(ServerDummyWeights, WhatNeedsTextIsRefusedNamingItsParameter) {
  ServerSetup setup;
  setup.ctx = 64;
  setup.dummy_weights = true;
  TestServer s(setup);
  const std::string bad = "invalid_request_error", why = "no tokenizer (kvq serve --dummy-weights";
  expect_error(post(s, kCompletions, R"({"prompt": "hello", "max_tokens": 2})"), 400, bad, "prompt", "no_tokenizer",
               why);
  expect_error(post(s, "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})"), 400, bad,
               "messages", "no_tokenizer", why);
  json stop = ids_request(4, 2);
  stop["stop"] = "\n";
  expect_error(post(s, kCompletions, stop.dump()), 400, bad, "stop", "no_tokenizer", why);
  json lp = ids_request(4, 2);
  lp["logprobs"] = 1;
  expect_error(post(s, kCompletions, lp.dump()), 400, bad, "logprobs", "no_tokenizer", why);
  // An id past the config's vocabulary is refused as with a tokenizer; the server goes on.
  expect_error(post(s, kCompletions, R"({"prompt": [1, 8192], "max_tokens": 1})"), 400, bad, "prompt", "",
               "outside the vocabulary of 8192");
  EXPECT_EQ(post(s, kCompletions, ids_request(4, 2).dump()).status, 200);
}
