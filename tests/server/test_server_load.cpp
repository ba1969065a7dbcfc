// kvq serve under load, over HTTP on loopback: concurrent clients with mixed prompt lengths, streaming against
// non-streaming, stop strings and logprobs, a pool too small for the running requests (preemption), and clients
// that disconnect mid-stream. Greedy outputs are compared with the same requests served one at a time: on the CPU a
// sequence's arithmetic does not depend on what else is in the step, and prefill chunks are not cut by the load.
#include <cstdio>
#include <map>
#include <random>

#include "server_harness.h"

using namespace kvq;
using namespace kvq::test;

namespace {

const char* kCompletions = "/v1/completions";
const char* kChat = "/v1/chat/completions";

// Sinks 4, window 8, pages of 8, chunks of 16: short requests hold pages.
CacheConfig small_cache() {
  CacheConfig c;
  c.sink = 4, c.recent = 8, c.page_tokens = 8, c.max_chunk = 16;
  return c;
}

struct Req {
  json body;
  int max_tokens;
};

// n requests of token-id prompts of mixed lengths in [min_len, max_len], greedy, max_tokens in [lo, hi], ignore_eos.
std::vector<Req> mixed_requests(int n, int min_len, int max_len, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Req> out;
  for (int i = 0; i < n; ++i) {
    const int len = min_len + int(rng() % uint32_t(max_len - min_len + 1));
    json ids = json::array();
    for (int t = 0; t < len; ++t) ids.push_back(int(rng() % 8000) + 1);
    const int mt = lo + int(rng() % uint32_t(hi - lo + 1));
    out.push_back({{{"prompt", ids}, {"max_tokens", mt}, {"temperature", 0}, {"ignore_eos", true}}, mt});
  }
  return out;
}

struct Answer {
  int status = 0;
  std::string error;  // without a response: the client's error
  std::string text;
  int completion_tokens = -1;
  std::string finish;
};

Answer ask(const TestServer& s, const json& body, bool stream) {
  Answer a;
  if (!stream) {
    const Reply r = post(s, kCompletions, body.dump());
    a.status = r.status;
    a.error = r.error;
    if (r.status == 200) {
      a.text = r.body["choices"][0]["text"];
      a.completion_tokens = r.body["usage"]["completion_tokens"];
      a.finish = r.body["choices"][0]["finish_reason"];
    }
    return a;
  }
  json b = body;
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  const Streamed st = post_stream(s, kCompletions, b.dump());
  a.status = st.done ? st.status : -1;
  a.error = st.error;
  a.text = st.text;
  for (const json& e : st.events) {
    if (e.contains("usage") && e["usage"].is_object()) a.completion_tokens = e["usage"]["completion_tokens"];
    if (!e["choices"].empty() && e["choices"][0]["finish_reason"].is_string())
      a.finish = e["choices"][0]["finish_reason"];
  }
  return a;
}

// Runs the requests from concurrent clients (stream: every other one streams); returns the answers in order.
std::vector<Answer> ask_all(const TestServer& s, const std::vector<Req>& reqs) {
  std::vector<Answer> out(reqs.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < reqs.size(); ++i)
    clients.emplace_back([&, i] { out[i] = ask(s, reqs[i].body, i % 2 == 1); });
  for (auto& c : clients) c.join();
  return out;
}

}  // namespace

TEST(ServerLoad, ConcurrentClientsWithMixedPromptsGetTheirTokensAndThePoolEmpties) {
  ServerSetup setup;
  setup.cache = small_cache();
  setup.ctx = 200;
  setup.np = 8;
  setup.max_queue = 64;
  TestServer s(setup);
  // 8 distinct requests (prompts of 4 to 70 tokens), each sent by 4 of the 32 clients; the reference is each
  // one served alone.
  const std::vector<Req> distinct = mixed_requests(8, 4, 70, 2, 6, 11);
  std::vector<Req> reqs;
  for (int i = 0; i < 32; ++i) reqs.push_back(distinct[size_t(i % 8)]);
  std::vector<Answer> alone;
  for (const Req& r : distinct) alone.push_back(ask(s, r.body, false));
  const double steps0 = metric(s, "kvq_engine_steps_total");
  const std::vector<Answer> together = ask_all(s, reqs);
  int tokens = 0, alone_tokens = 0;
  for (const Req& r : distinct) alone_tokens += r.max_tokens;
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    ASSERT_EQ(alone[i % 8].status, 200) << alone[i % 8].error;
    ASSERT_EQ(together[i].status, 200) << together[i].error;
    EXPECT_EQ(together[i].completion_tokens, reqs[i].max_tokens);
    EXPECT_EQ(together[i].finish, "length");
    EXPECT_EQ(together[i].text, alone[i % 8].text);
    tokens += reqs[i].max_tokens;
  }
  ASSERT_TRUE(eventually([&] { return metric(s, "kvq_requests_running") == 0; }));
  EXPECT_EQ(metric(s, "kvq_requests_waiting"), 0);
  EXPECT_EQ(metric(s, "kvq_kv_pages_used"), 0);
  EXPECT_EQ(metric(s, "kvq_kv_sequences_live"), 0);
  EXPECT_EQ(metric(s, "kvq_generation_tokens_total"), alone_tokens + tokens);
  EXPECT_EQ(metric(s, "kvq_requests_finished_total{reason=\"length\"}"), 8 + 32);
  EXPECT_LT(metric(s, "kvq_engine_steps_total") - steps0, tokens);  // batched: fewer steps than tokens
}

TEST(ServerLoad, APoolTooSmallForTheRunningRequestsPreemptsAndStillGivesTheUnpreemptedOutput) {
  ServerSetup big;
  big.cache = small_cache();
  big.ctx = 64;
  big.np = 6;
  ServerSetup tight = big;
  const CacheLayout l = cache_layout(tight.cache, 8, 2, 128);
  tight.kv_pages = l.pages_for(tight.ctx);  // one sequence of the whole context: the budget's least
  std::vector<Req> reqs = mixed_requests(6, 20, 30, 12, 16, 5);
  reqs[2].body["temperature"] = 0.7;  // one sampled request: its seed replays too
  reqs[2].body["seed"] = 3;
  std::vector<Answer> want, got;
  double preemptions = 0;
  {
    TestServer s(big);
    want = ask_all(s, reqs);
    EXPECT_EQ(metric(s, "kvq_preemptions_total"), 0);
  }
  {
    TestServer s(tight);
    got = ask_all(s, reqs);
    preemptions = metric(s, "kvq_preemptions_total");
    ASSERT_TRUE(eventually([&] { return metric(s, "kvq_requests_running") == 0; }));
    EXPECT_EQ(metric(s, "kvq_kv_pages_used"), 0);
  }
  // Whether the HTTP requests overlap enough to exhaust the pool depends on timing (under ASan they may arrive one at
  // a time); the deterministic preemption check is Scheduler.PreemptionCompletesEveryRequestWithTheUnpreemptedOutput.
  // Here: whatever the overlap, every reply through the tight pool equals the unpreempted one.
  std::printf("preemptions through the tight pool: %g\n", preemptions);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    ASSERT_EQ(got[i].status, 200);
    EXPECT_EQ(got[i].completion_tokens, reqs[i].max_tokens);
    EXPECT_EQ(got[i].text, want[i].text);
  }
}

TEST(ServerLoad, StreamingEqualsNonStreamingWithUsageStopStringsAndLogprobs) {
  ServerSetup setup;
  setup.ctx = 128;
  TestServer s(setup);
  const json base = {{"prompt", "The Linux kernel"}, {"max_tokens", 12}, {"temperature", 0}};
  const Answer whole = ask(s, base, false);
  const Answer streamed = ask(s, base, true);
  ASSERT_EQ(whole.status, 200);
  EXPECT_EQ(streamed.status, 200);
  EXPECT_EQ(streamed.text, whole.text);
  EXPECT_EQ(streamed.completion_tokens, whole.completion_tokens);
  EXPECT_EQ(streamed.finish, whole.finish);

  // A stop string from the middle of the greedy text: the output ends before it, streaming or not.
  ASSERT_GE(whole.text.size(), 8u);
  const std::string stop = whole.text.substr(whole.text.size() / 2, 3);
  json with_stop = base;
  with_stop["stop"] = {stop, "\x01never"};
  const std::string before = whole.text.substr(0, whole.text.find(stop));
  for (bool stream : {false, true}) {
    const Answer a = ask(s, with_stop, stream);
    EXPECT_EQ(a.text, before) << "stream " << stream;
    EXPECT_EQ(a.finish, "stop") << "stream " << stream;
  }

  // Logprobs of greedy tokens: the chosen token is the most likely one.
  json lp = base;
  lp["logprobs"] = 2;
  const Reply r = post(s, kCompletions, lp.dump());
  ASSERT_EQ(r.status, 200);
  const json& l = r.body["choices"][0]["logprobs"];
  ASSERT_EQ(l["tokens"].size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    ASSERT_EQ(l["top_logprobs"][i].size(), 2u);
    const double chosen = l["token_logprobs"][i];
    EXPECT_LE(chosen, 0.0);
    double best = -1e30;
    for (const auto& [tok, v] : l["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_DOUBLE_EQ(chosen, best);
  }

  // Chat, streaming and not: the same reply; the stream opens with the assistant role and ends with [DONE].
  const json chat = {{"messages", {{{"role", "system"}, {"content", "You answer briefly."}},
                                   {{"role", "user"}, {"content", "What is a kernel?"}}}},
                     {"max_tokens", 6}, {"temperature", 0}};
  const Reply c = post(s, kChat, chat.dump());
  ASSERT_EQ(c.status, 200) << c.raw;
  EXPECT_EQ(c.body["object"], "chat.completion");
  EXPECT_EQ(c.body["choices"][0]["message"]["role"], "assistant");
  const std::string rendered = "<|im_start|>system\nYou answer briefly.<|im_end|>\n<|im_start|>user\nWhat is a "
                               "kernel?<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(c.body["usage"]["prompt_tokens"], int(ref_tokenizer().encode(rendered).size()));
  json chat_stream = chat;
  chat_stream["stream"] = true;
  const Streamed cs = post_stream(s, kChat, chat_stream.dump());
  EXPECT_TRUE(cs.done);
  ASSERT_GE(cs.events.size(), 2u);
  EXPECT_EQ(cs.events.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(cs.events.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(cs.events.back()["choices"][0]["finish_reason"].is_string());
  EXPECT_EQ(cs.text, c.body["choices"][0]["message"]["content"].get<std::string>());
}

TEST(ServerLoad, AClientThatDisconnectsMidStreamFreesItsPages) {
  ServerSetup setup;
  setup.cache = small_cache();
  setup.ctx = 256;
  TestServer s(setup);
  std::atomic<bool> leave{false};
  std::thread client([&] {
    post_stream(s, kCompletions, R"({"prompt": "The kernel", "max_tokens": 250, "ignore_eos": true, "stream": true})",
                0, &leave);
  });
  // Past the 12 window tokens it holds pages; then the client goes away.
  const bool holds = eventually([&] { return metric(s, "kvq_kv_pages_used") > 0; });
  leave = true;
  client.join();
  ASSERT_TRUE(holds);
  ASSERT_TRUE(eventually([&] { return metric(s, "kvq_requests_running") == 0; }));
  EXPECT_EQ(metric(s, "kvq_requests_finished_total{reason=\"cancelled\"}"), 1);
  EXPECT_EQ(metric(s, "kvq_kv_pages_used"), 0);
  EXPECT_EQ(metric(s, "kvq_kv_sequences_live"), 0);
  EXPECT_LT(metric(s, "kvq_generation_tokens_total"), 250);
}

TEST(ServerLoad, NChoicesEqualSingleRequestsSeededSeedPlusIndexStreamingOrNot) {
  ServerSetup setup;
  setup.ctx = 128;
  TestServer s(setup);
  const json base = {{"prompt", "The Linux kernel"}, {"max_tokens", 8}, {"temperature", 0.9}, {"seed", 40},
                     {"presence_penalty", 0.5}, {"frequency_penalty", 0.25}, {"repetition_penalty", 1.1},
                     {"min_p", 0.02}, {"ignore_eos", true}};
  std::vector<std::string> single;
  for (int i = 0; i < 3; ++i) {
    json one = base;
    one["seed"] = 40 + i;
    const Reply r = post(s, kCompletions, one.dump());
    ASSERT_EQ(r.status, 200) << r.raw;
    single.push_back(r.body["choices"][0]["text"]);
  }
  EXPECT_NE(single[0], single[1]);
  json three = base;
  three["n"] = 3;
  const Reply r = post(s, kCompletions, three.dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.body["choices"][i]["index"], i);
    EXPECT_EQ(r.body["choices"][i]["text"], single[size_t(i)]) << "choice " << i;
    EXPECT_EQ(r.body["choices"][i]["finish_reason"], "length");
  }
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 24);
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], int(ref_tokenizer().encode("The Linux kernel").size()));
  // Streaming: each choice's chunks carry its index; joined per index they are the same texts.
  three["stream"] = true;
  three["stream_options"] = {{"include_usage", true}};
  const Streamed st = post_stream(s, kCompletions, three.dump());
  ASSERT_TRUE(st.done);
  std::vector<std::string> texts(3);
  std::vector<int> finishes(3, 0);
  for (const json& e : st.events) {
    if (e["choices"].empty()) continue;
    const json& ch = e["choices"][0];
    texts[ch["index"].get<size_t>()] += ch["text"].get<std::string>();
    finishes[ch["index"].get<size_t>()] += ch["finish_reason"].is_string();
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(texts[size_t(i)], single[size_t(i)]) << "choice " << i;
    EXPECT_EQ(finishes[size_t(i)], 1) << "choice " << i;
  }
  EXPECT_EQ(st.events.back()["usage"]["completion_tokens"], 24);
  EXPECT_TRUE(eventually([&] { return metric(s, "kvq_kv_sequences_live") == 0; }));
}

TEST(ServerLoad, LogitBiasSteersGreedyDecoding) {
  ServerSetup setup;
  setup.ctx = 128;
  TestServer s(setup);
  const std::vector<int32_t> word = ref_tokenizer().encode(" kernel");
  ASSERT_EQ(word.size(), 1u);
  const json body = {{"prompt", "The Linux"}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true},
                     {"logit_bias", {{std::to_string(word[0]), 100}}}};
  const Reply r = post(s, kCompletions, body.dump());
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["text"], " kernel kernel kernel kernel");
}

TEST(ServerLoad, PromptsSharingAPrefixReportCachedTokensAndGiveTheOutputWithoutTheCache) {
  // Four requests sharing a 40-token prefix (chunks of 16: cached states at 16 and 32), greedy and sampled.
  json prefix = json::array();
  for (int i = 0; i < 40; ++i) prefix.push_back(1 + (i * 7919) % 8000);
  std::vector<json> bodies;
  for (int k = 0; k < 4; ++k) {
    json prompt = prefix;
    for (int i = 0; i < 5 + k; ++i) prompt.push_back(1 + (i * 104729 + k * 31) % 8000);
    bodies.push_back({{"prompt", prompt}, {"max_tokens", 6}, {"temperature", k % 2 ? 0.8 : 0.0}, {"seed", k},
                      {"ignore_eos", true}});
  }
  std::vector<std::string> want;
  {
    ServerSetup off;
    off.cache = small_cache();
    off.ctx = 128;
    off.prefix_cache = false;
    TestServer s(off);
    for (const json& b : bodies) {
      const Reply r = post(s, kCompletions, b.dump());
      ASSERT_EQ(r.status, 200) << r.raw;
      EXPECT_EQ(r.body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
      want.push_back(r.body["choices"][0]["text"]);
    }
    EXPECT_EQ(metric(s, "kvq_prefix_cache_enabled"), 0);
  }
  ServerSetup on;
  on.cache = small_cache();
  on.ctx = 128;
  TestServer s(on);
  for (size_t k = 0; k < bodies.size(); ++k) {
    const Reply r = post(s, kCompletions, bodies[k].dump());
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["choices"][0]["text"], want[k]) << "request " << k;
    EXPECT_EQ(r.body["usage"]["prompt_tokens_details"]["cached_tokens"], k == 0 ? 0 : 32) << "request " << k;
  }
  EXPECT_EQ(metric(s, "kvq_prefix_cache_hit_tokens_total"), 3 * 32);
  EXPECT_EQ(metric(s, "kvq_prefix_cache_miss_tokens_total"), 45 + (46 - 32) + (47 - 32) + (48 - 32));
  EXPECT_GT(metric(s, "kvq_prefix_cache_entries"), 0);
  EXPECT_TRUE(eventually([&] { return metric(s, "kvq_kv_sequences_live") == 0; }));
  EXPECT_EQ(metric(s, "kvq_kv_pages_used"), 0);
  // Streaming reports it too.
  json st = bodies[1];
  st["stream"] = true;
  st["stream_options"] = {{"include_usage", true}};
  const Streamed streamed = post_stream(s, kCompletions, st.dump());
  ASSERT_FALSE(streamed.events.empty());
  EXPECT_EQ(streamed.events.back()["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
  EXPECT_EQ(streamed.text, want[1]);
}
