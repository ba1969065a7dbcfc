// The server's pure parts: request parsing (every field read, every form of prompt and content, unsupported values
// refused with the field named), the chat templates rendered natively against the Jinja templates they stand for
// (hand-expanded), their recognition from tokenizer_config.json texts, and the Prometheus text of the metrics.
#include <gtest/gtest.h>

#include "common/error.h"
#include "server/api_error.h"
#include "server/api_request.h"
#include "server/chat_template.h"
#include "server/metrics.h"

using namespace kvq;
using namespace kvq::server;

namespace {

ApiError error_of(const std::string& body, Endpoint e) {
  try {
    parse_api_request(body, e);
  } catch (const ApiError& err) {
    return err;
  }
  ADD_FAILURE() << "no error for " << body;
  return ApiError(0, "");
}

}  // namespace

TEST(ApiRequest, ReadsEveryFieldOfACompletionRequest) {
  const ApiRequest r = parse_api_request(
      R"({"model": "ref", "prompt": "hello", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 12,
          "seed": 42, "stop": ["a", "bc"], "stream": true, "stream_options": {"include_usage": true},
          "logprobs": 3, "ignore_eos": true, "n": 1, "echo": false, "presence_penalty": 0, "user": "u"})",
      Endpoint::Completions);
  EXPECT_EQ(r.model, "ref");
  EXPECT_EQ(r.prompt, "hello");
  EXPECT_TRUE(r.prompt_ids.empty());
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 12);
  EXPECT_EQ(*r.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.stream && r.include_usage && r.ignore_eos);
  EXPECT_EQ(r.logprobs, 3);
  // Defaults: OpenAI's.
  const ApiRequest d = parse_api_request(R"({"prompt": "x"})", Endpoint::Completions);
  EXPECT_FALSE(d.max_tokens);
  EXPECT_FLOAT_EQ(d.temperature, 1.0f);
  EXPECT_FLOAT_EQ(d.top_p, 1.0f);
  EXPECT_EQ(d.top_k, 0);
  EXPECT_FALSE(d.seed);
  EXPECT_EQ(d.logprobs, -1);
  EXPECT_FALSE(d.stream);
}

TEST(ApiRequest, PromptFormsAndChatContentParts) {
  EXPECT_EQ(parse_api_request(R"({"prompt": [1, 2, 3]})", Endpoint::Completions).prompt_ids,
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse_api_request(R"({"prompt": [[4, 5]]})", Endpoint::Completions).prompt_ids,
            (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(parse_api_request(R"({"prompt": ["one"]})", Endpoint::Completions).prompt, "one");
  const ApiRequest c = parse_api_request(
      R"({"messages": [{"role": "developer", "content": "be brief"},
                       {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                       {"role": "assistant", "content": null, "refusal": null}],
          "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 2})",
      Endpoint::Chat);
  ASSERT_EQ(c.messages.size(), 3u);
  EXPECT_EQ(c.messages[0].role, "system");
  EXPECT_EQ(c.messages[1].content, "a\nb");
  EXPECT_EQ(c.messages[2].content, "");
  EXPECT_EQ(*c.max_tokens, 9);
  EXPECT_EQ(c.logprobs, 2);
}

TEST(ApiRequest, RefusesWhatItDoesNotImplementNamingTheField) {
  struct Case {
    const char* body;
    Endpoint e;
    const char* param;
  } cases[] = {
      {R"({"prompt": "x", "best_of": 2})", Endpoint::Completions, "best_of"},
      {R"({"prompt": "x", "echo": true})", Endpoint::Completions, "echo"},
      {R"({"prompt": "x", "suffix": "s"})", Endpoint::Completions, "suffix"},
      {R"({"prompt": "x", "logit_bias": {"x5": 1}})", Endpoint::Completions, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"5": 101}})", Endpoint::Completions, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": [5]})", Endpoint::Completions, "logit_bias"},
      {R"({"prompt": "x", "frequency_penalty": 2.5})", Endpoint::Completions, "frequency_penalty"},
      {R"({"prompt": "x", "presence_penalty": -3})", Endpoint::Completions, "presence_penalty"},
      {R"({"prompt": "x", "repetition_penalty": 0})", Endpoint::Completions, "repetition_penalty"},
      {R"({"prompt": "x", "min_p": 1.5})", Endpoint::Completions, "min_p"},
      {R"({"prompt": "x", "n": 0})", Endpoint::Completions, "n"},
      {R"({"prompt": "x", "n": 129})", Endpoint::Completions, "n"},
      {R"({"prompt": "x", "guided_json": {}})", Endpoint::Completions, "guided_json"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", Endpoint::Completions, "stream_options"},
      {R"({"prompt": "x", "stop": [""]})", Endpoint::Completions, "stop"},
      {R"({"prompt": "x", "top_k": -2})", Endpoint::Completions, "top_k"},
      {R"({"prompt": "x", "messages": []})", Endpoint::Completions, "messages"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", Endpoint::Chat, "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})",
       Endpoint::Chat, "response_format"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", Endpoint::Chat,
       "messages[0].content[0]"},
      {R"({"messages": [{"role": "user", "content": "x", "name": "bob"}]})", Endpoint::Chat, "messages[0].name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "prompt": "y"})", Endpoint::Chat, "prompt"},
  };
  for (const Case& c : cases) {
    const ApiError e = error_of(c.body, c.e);
    EXPECT_EQ(e.status(), 400) << c.body;
    EXPECT_EQ(e.param(), c.param) << c.body << ": " << e.what();
    EXPECT_EQ(e.body()["error"]["type"], "invalid_request_error");
  }
}

TEST(ApiRequest, ReadsTheSamplingFieldsClientsSend) {
  const ApiRequest r = parse_api_request(
      R"({"prompt": "x", "n": 3, "presence_penalty": 0.5, "frequency_penalty": -1.25, "repetition_penalty": 1.1,
          "min_p": 0.05, "logit_bias": {"7": -100, "42": 2.5}, "seed": 9})",
      Endpoint::Completions);
  EXPECT_EQ(r.n, 3);
  EXPECT_FLOAT_EQ(r.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.frequency_penalty, -1.25f);
  EXPECT_FLOAT_EQ(r.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(r.min_p, 0.05f);
  ASSERT_EQ(r.logit_bias.size(), 2u);
  EXPECT_EQ(r.logit_bias[0], (std::pair<int32_t, float>{42, 2.5f}));  // nlohmann orders object keys
  EXPECT_EQ(r.logit_bias[1], (std::pair<int32_t, float>{7, -100.f}));
  EXPECT_EQ(*r.seed, 9u);
  EXPECT_TRUE(r.ignored.empty());
}

TEST(ApiRequest, LenientFieldsIgnoresUnknownFieldsAndListsThem) {
  const char* body = R"({"prompt": "x", "guided_json": {"type": "object"}, "skip_special_tokens": true, "n": 2})";
  EXPECT_EQ(error_of(body, Endpoint::Completions).param(), "guided_json");
  const ApiRequest r = parse_api_request(body, Endpoint::Completions, ParseOptions{.lenient_fields = true});
  EXPECT_EQ(r.ignored, (std::vector<std::string>{"guided_json", "skip_special_tokens"}));
  EXPECT_EQ(r.n, 2);
  // Known fields are still checked.
  try {
    parse_api_request(R"({"prompt": "x", "guided_json": 1, "n": "two"})", Endpoint::Completions,
                      ParseOptions{.lenient_fields = true});
    ADD_FAILURE() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "n");
  }
}

TEST(ChatTemplate, RendersChatMLAsHuggingFaceDoes) {
  const ChatTemplate t = chat_template_by_name("chatml", "test");
  const std::vector<ChatMessage> m = {{"system", "S"}, {"user", "Hi"}, {"assistant", " ok "}, {"user", "More"}};
  EXPECT_EQ(t.render(m),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n ok "
            "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.end_of_turn, "<|im_end|>");
}

TEST(ChatTemplate, QwenDefaultSystemTurnsAndQwen3ReasoningStrip) {
  const std::vector<ChatMessage> user = {{"user", "Hi"}};
  EXPECT_EQ(chat_template_by_name("qwen2.5", "t").render(user),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(chat_template_by_name("qwen2", "t").render({{"system", "S"}, {"user", "Hi"}}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(chat_template_by_name("qwen3", "t").render({{"user", "a"}, {"assistant", "<think>\nx\n</think>\n\nb"},
                                                         {"user", "c"}}),
            "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>user\nc<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, RendersLlama3AndLlama31) {
  const std::vector<ChatMessage> m = {{"system", " Be brief. "}, {"user", " Hi\n"}};
  ChatTemplate l3 = chat_template_by_name("llama3", "t");
  EXPECT_EQ(l3.render(m),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>"
            "\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  l3.write_bos = true;
  EXPECT_EQ(l3.render({{"user", "Hi"}}).rfind("<|begin_of_text|><|start_header_id|>user", 0), 0u);
  const ChatTemplate l31 = chat_template_by_name("llama3.1", "t");
  EXPECT_EQ(l31.render({{"user", "Hi"}}),
            "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul "
            "2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant"
            "<|end_header_id|>\n\n");
  EXPECT_EQ(l31.end_of_turn, "<|eot_id|>");
}

TEST(ChatTemplate, RecognisesTheFamiliesFromTheirJinjaAndNamesAnUnknownOne) {
  EXPECT_EQ(detect_chat_template("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                                 "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}", "t").name,
            "chatml");
  EXPECT_EQ(detect_chat_template("{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                                 "assistant.<|im_end|>\\n' }}", "t").name,
            "qwen2.5");
  EXPECT_EQ(detect_chat_template("<|im_start|>{%- set content = content.split('</think>')[-1] %}", "t").name, "qwen3");
  EXPECT_EQ(detect_chat_template("{{ bos_token }}<|start_header_id|>{{ role }}<|end_header_id|>{{ c }}<|eot_id|>",
                                 "t").name,
            "llama3");
  EXPECT_EQ(detect_chat_template("<|start_header_id|>system{{- \"Cutting Knowledge Date: December 2023\\n\" }}"
                                 "<|eot_id|>", "t").name,
            "llama3.1");
  try {
    detect_chat_template("{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}", "tokenizer_config.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("tokenizer_config.json"), std::string::npos) << what;
    EXPECT_NE(what.find("[INST]"), std::string::npos) << what;
    EXPECT_NE(what.find("--chat-template"), std::string::npos) << what;
  }
  EXPECT_THROW(chat_template_by_name("vicuna", "t"), Error);
  const auto ref = load_chat_template(std::string(KVQ_SOURCE_DIR) + "/models/ref", "");
  ASSERT_TRUE(ref);
  EXPECT_EQ(ref->name, "chatml");
  EXPECT_NE(ref->source.find("tokenizer_config.json"), std::string::npos);
  EXPECT_EQ(load_chat_template(std::string(KVQ_SOURCE_DIR) + "/models/ref", "llama3")->name, "llama3");
}

TEST(Metrics, PrometheusTextOfTheCountersGaugesAndHistograms) {
  EngineStats s;
  s.running = 2, s.waiting = 1, s.generated_tokens = 40, s.pages_used = 3, s.bytes_used = 1 << 20;
  s.ttft.observe(0.02);
  s.ttft.observe(0.3);
  CacheConfig c;
  c.k.type = "int2", c.v.type = "int2";
  s.finished_queue_timeout = 4, s.step_failures = 5, s.healthy = false;
  s.prefix = {.enabled = true, .entries = 6, .pages = 7, .hit_tokens = 96, .miss_tokens = 150};
  server::TransportStats h{.connections_open = 320, .timeouts = 11};
  const std::string t = render_metrics(s, "ref", c, h);
  EXPECT_NE(t.find("\nkvq_requests_finished_total{reason=\"queue_timeout\"} 4\n"), std::string::npos);
  EXPECT_NE(t.find("\nkvq_engine_step_failures_total 5\n"), std::string::npos);
  EXPECT_NE(t.find("\nkvq_engine_healthy 0\n"), std::string::npos);
  EXPECT_NE(t.find("\nkvq_prefix_cache_hit_tokens_total 96\n"), std::string::npos);
  EXPECT_NE(t.find("\nkvq_prefix_cache_miss_tokens_total 150\n"), std::string::npos);
  EXPECT_NE(t.find("\nkvq_prefix_cache_entries 6\n"), std::string::npos);
  EXPECT_NE(t.find("\nkvq_prefix_cache_pages 7\n"), std::string::npos);
  EXPECT_NE(t.find("\nkvq_http_connections 320\n"), std::string::npos);
  EXPECT_NE(t.find("\nkvq_http_timeouts_total 11\n"), std::string::npos);
  EXPECT_NE(t.find("\nkvq_requests_running 2\n"), std::string::npos);
  EXPECT_NE(t.find("\nkvq_requests_waiting 1\n"), std::string::npos);
  EXPECT_NE(t.find("\nkvq_generation_tokens_total 40\n"), std::string::npos);
  EXPECT_NE(t.find("\nkvq_kv_pages_used 3\n"), std::string::npos);
  EXPECT_NE(t.find("\nkvq_kv_bytes_used 1048576\n"), std::string::npos);
  EXPECT_NE(t.find("cache_type_k=\"int2\",cache_type_v=\"int2\""), std::string::npos);
  // Cumulative buckets: 0.02 is in le=0.025 and above, 0.3 in le=0.5 and above.
  EXPECT_NE(t.find("kvq_time_to_first_token_seconds_bucket{le=\"0.01\"} 0\n"), std::string::npos);
  EXPECT_NE(t.find("kvq_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("kvq_time_to_first_token_seconds_bucket{le=\"0.25\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("kvq_time_to_first_token_seconds_bucket{le=\"0.5\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("kvq_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("kvq_time_to_first_token_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE kvq_inter_token_latency_seconds histogram\n"), std::string::npos);
}
