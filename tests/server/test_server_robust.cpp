// kvq serve against hostile clients and failing steps, over HTTP on loopback: idle and trickling connections that must
// not starve a normal request, oversize headers, the API key before routing, pipelined requests, a bounded number of
// threads, /health and /metrics while every request slot is taken, a step that throws (the engine goes on), a lost
// device (/health 503), a non-streaming client that goes away, the queue timeout and the request deadline.
// Deadlines here are generous client timeouts, never measurements.
#include <dirent.h>

#include "server_harness.h"

using namespace kvq;
using namespace kvq::test;
using namespace std::chrono_literals;

namespace {

const char* kCompletions = "/v1/completions";

int thread_count() {  // threads of this process: the entries of /proc/self/task
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

std::string http_post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// A greedy completion of a short prompt: its text, as served alone.
const json kShort = {{"prompt", "The kernel"}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}};

// A request that holds its slot for seconds even on a fast CPU (models/ref decodes ~300-700 tok/s here); the tests end
// it by leaving (a stream's client goes away), by a deadline, or by closing the socket. Servers that run it: ctx 4096.
json long_request(bool stream, int max_tokens = 4000) {
  return {{"prompt", "The kernel"}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true},
          {"stream", stream}};
}

}  // namespace

TEST(ServerRobust, IdleAndTricklingConnectionsDoNotStarveANormalRequestAndAreClosedAtTheirDeadlines) {
  ServerSetup setup;
  setup.ctx = 64;
  setup.http.idle_timeout_s = 2;
  setup.http.header_timeout_s = 3;
  TestServer s(setup);
  const Reply want = post(s, kCompletions, kShort.dump());
  ASSERT_EQ(want.status, 200) << want.raw;

  // 200 idle connections and 120 that send one header byte at a time (a slowloris).
  std::vector<std::unique_ptr<RawSocket>> idle, trickle;
  for (int i = 0; i < 200; ++i) idle.push_back(std::make_unique<RawSocket>(s.port()));
  for (int i = 0; i < 120; ++i) trickle.push_back(std::make_unique<RawSocket>(s.port()));
  const std::string slow = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Padding: " + std::string(400, 'a');
  std::atomic<bool> stop{false};
  std::thread trickler([&] {
    for (size_t at = 0; !stop && at < slow.size(); ++at) {
      for (auto& t : trickle) t->send(slow.substr(at, 1));
      std::this_thread::sleep_for(200ms);
    }
  });
  std::this_thread::sleep_for(600ms);  // every trickling connection has sent a few bytes
  // A normal request still gets its reply, within a client timeout of one second.
  httplib::Client c("127.0.0.1", s.port());
  c.set_connection_timeout(1, 0);
  c.set_read_timeout(1, 0);
  c.set_write_timeout(1, 0);
  const httplib::Result r = c.Post(kCompletions, kShort.dump(), "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  const json body = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(body.is_object()) << r->body;
  EXPECT_EQ(body["choices"][0]["text"], want.body["choices"][0]["text"]);
  EXPECT_EQ(body["usage"]["completion_tokens"], 4);
  const httplib::Result h = c.Get("/health");
  ASSERT_TRUE(h) << httplib::to_string(h.error());
  EXPECT_EQ(h->status, 200);
  EXPECT_GE(metric(s, "kvq_http_connections"), 320);

  // The server closes them: the trickling ones at their header deadline, whatever they send, the idle ones at theirs.
  for (auto& t : trickle) EXPECT_TRUE(t->closed_by_server(30s));
  stop = true;
  trickler.join();
  for (auto& i : idle) EXPECT_TRUE(i->closed_by_server(30s));
  EXPECT_GE(metric(s, "kvq_http_timeouts_total"), 320);
  EXPECT_TRUE(eventually([&] { return metric(s, "kvq_http_connections") <= 1; }));
}

TEST(ServerRobust, OversizeHeadersGet431AndAMalformedRequest400) {
  ServerSetup setup;
  setup.ctx = 64;
  TestServer s(setup);
  RawSocket big(s.port());
  big.send("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20 << 10, 'b') + "\r\n\r\n");
  const RawSocket::Response r = big.read_response(30s);
  EXPECT_EQ(r.status, 431) << r.head;
  const json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.body;
  EXPECT_EQ(j["error"]["code"], "request_header_fields_too_large");
  EXPECT_TRUE(big.closed_by_server(30s));

  RawSocket bad(s.port());
  bad.send("GET /health HTTP/1.1\r\nHost x\r\n\r\n");  // a header line without a colon
  const RawSocket::Response b = bad.read_response(30s);
  EXPECT_EQ(b.status, 400) << b.head;
  EXPECT_NE(b.body.find("malformed HTTP request"), std::string::npos) << b.body;
  EXPECT_EQ(get(s, "/health").status, 200);
  EXPECT_EQ(metric(s, "kvq_http_bad_requests_total"), 2);
}

TEST(ServerRobust, TheApiKeyIsCheckedBeforeRoutingAndTheBearerSchemeInAnyCase) {
  ServerSetup setup;
  setup.ctx = 64;
  setup.api_key = "sekret";
  TestServer s(setup);
  expect_error(post(s, "/v1/embeddings", "{}"), 401, "authentication_error", "", "missing_api_key", "API key");
  expect_error(get(s, "/nothing/here"), 401, "authentication_error", "", "missing_api_key", "API key");
  expect_error(post(s, "/v1/embeddings", "{}", {{"Authorization", "Bearer sekret"}}), 404, "invalid_request_error", "",
               "unknown_url", "POST /v1/embeddings");
  for (const char* auth : {"bearer sekret", "BEARER sekret", "Bearer   sekret", "bEaReR sekret"}) {
    const Reply m = get(s, "/v1/models", {{"Authorization", auth}});
    EXPECT_EQ(m.status, 200) << auth << ": " << m.raw;
  }
  for (const char* auth : {"Basic sekret", "Bearersekret", "bearer sekre", "bearer sekret2"})
    expect_error(get(s, "/v1/models", {{"Authorization", auth}}), 401, "authentication_error", "", "invalid_api_key",
                 "Incorrect API key");
}

TEST(ServerRobust, PipelinedRequestsAreAnsweredInOrder) {
  ServerSetup setup;
  setup.ctx = 64;
  TestServer s(setup);
  json other = kShort;
  other["prompt"] = "A page";
  const Reply a = post(s, kCompletions, kShort.dump()), b = post(s, kCompletions, other.dump());
  ASSERT_EQ(a.status, 200);
  ASSERT_EQ(b.status, 200);
  RawSocket sock(s.port());
  ASSERT_TRUE(sock.send(http_post(kCompletions, kShort.dump()) + "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" +
                        http_post(kCompletions, other.dump())));
  const RawSocket::Response r1 = sock.read_response(60s), r2 = sock.read_response(60s), r3 = sock.read_response(60s);
  ASSERT_EQ(r1.status, 200) << r1.head;
  ASSERT_EQ(r2.status, 200) << r2.head;
  ASSERT_EQ(r3.status, 200) << r3.head;
  EXPECT_EQ(json::parse(r1.body)["choices"][0]["text"], a.body["choices"][0]["text"]);
  EXPECT_EQ(json::parse(r2.body)["object"], "list");
  EXPECT_EQ(json::parse(r3.body)["choices"][0]["text"], b.body["choices"][0]["text"]);
}

TEST(ServerRobust, HttpThreadsAreBoundedIndependentlyOfTheQueueAndConnections) {
  ServerSetup setup;
  setup.ctx = 64;
  setup.np = 2;
  setup.max_queue = 1 << 20;  // the most kvq serve accepts: threads do not follow it
  setup.http.io_threads = 2;
  setup.workers = 2;
  TestServer s(setup);
  EXPECT_EQ(get(s, "/health").status, 200);
  const int threads = thread_count();
  std::vector<std::unique_ptr<RawSocket>> conns;
  for (int i = 0; i < 300; ++i) conns.push_back(std::make_unique<RawSocket>(s.port()));
  std::vector<std::thread> clients;
  std::vector<int> status(16, 0);
  for (int i = 0; i < 16; ++i)
    clients.emplace_back([&, i] { status[size_t(i)] = post(s, kCompletions, kShort.dump()).status; });
  ASSERT_TRUE(eventually([&] { return metric(s, "kvq_http_connections") >= 300; }));
  // The 16 client threads are this test's own; the server has not started any.
  EXPECT_LE(thread_count(), threads + 16);
  for (auto& c : clients) c.join();
  for (int st : status) EXPECT_EQ(st, 200);
  EXPECT_EQ(thread_count(), threads);
}

TEST(ServerRobust, HealthAndMetricsAreAnsweredWhileEveryRequestSlotIsTaken) {
  ServerSetup setup;
  setup.ctx = 4096;
  setup.np = 1;
  setup.max_queue = 3;
  setup.workers = 1;
  TestServer s(setup);
  std::atomic<bool> leave{false};
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i)
    clients.emplace_back([&] { post_stream(s, kCompletions, long_request(true).dump(), 0, &leave); });
  ASSERT_TRUE(eventually([&] {
    return metric(s, "kvq_requests_running") == 1 && metric(s, "kvq_requests_waiting") == 3;
  }));
  expect_error(post(s, kCompletions, kShort.dump()), 429, "rate_limit_error", "", "queue_full", "busy");
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(5, 0);
  const httplib::Result h = c.Get("/health"), m = c.Get("/metrics");
  ASSERT_TRUE(h && m);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("kvq_requests_waiting 3"), std::string::npos);
  leave = true;
  for (auto& t : clients) t.join();
  EXPECT_TRUE(eventually(
      [&] { return metric(s, "kvq_requests_running") == 0 && metric(s, "kvq_kv_sequences_live") == 0; }));
}

TEST(ServerRobust, AStepThatThrowsEndsItsRequestsWith500AndTheServerGoesOn) {
  ServerSetup setup;
  setup.ctx = 64;
  TestServer s(setup);
  const Reply want = post(s, kCompletions, kShort.dump());
  ASSERT_EQ(want.status, 200);
  s.faults().arm(Fault::kBadAlloc);
  expect_error(post(s, kCompletions, kShort.dump()), 500, "server_error", "", "internal_error", "bad_alloc");
  s.faults().arm(Fault::kError);
  json st = kShort;
  st["stream"] = true;
  const Streamed failed = post_stream(s, kCompletions, st.dump());
  EXPECT_EQ(failed.status, 200);
  EXPECT_TRUE(failed.done);
  ASSERT_FALSE(failed.events.empty());
  EXPECT_EQ(failed.events.back()["error"]["code"], "internal_error");
  EXPECT_NE(failed.events.back()["error"]["message"].get<std::string>().find("injected fault"), std::string::npos);
  // Still serving, with the same output as before, and nothing held.
  const Reply again = post(s, kCompletions, kShort.dump());
  ASSERT_EQ(again.status, 200) << again.raw;
  EXPECT_EQ(again.body["choices"][0]["text"], want.body["choices"][0]["text"]);
  EXPECT_EQ(get(s, "/health").status, 200);
  EXPECT_EQ(s.faults().injected(), 2);
  EXPECT_EQ(metric(s, "kvq_engine_step_failures_total"), 2);
  EXPECT_EQ(metric(s, "kvq_requests_finished_total{reason=\"error\"}"), 2);
  EXPECT_TRUE(eventually([&] { return metric(s, "kvq_kv_sequences_live") == 0; }));
  EXPECT_EQ(metric(s, "kvq_kv_pages_used"), 0);
}

TEST(ServerRobust, ALostDeviceTurnsHealthTo503AndStopsAdmitting) {
  ServerSetup setup;
  setup.ctx = 64;
  TestServer s(setup);
  EXPECT_EQ(get(s, "/health").status, 200);
  s.faults().arm(Fault::kDeviceLost);
  // The request whose step lost the device, and every later one, get 503; /health is 503 by the time they are told.
  expect_error(post(s, kCompletions, kShort.dump()), 503, "server_error", "", "device_lost", "GPU is lost");
  expect_error(get(s, "/health"), 503, "server_error", "", "device_lost", "the device is lost");
  expect_error(post(s, kCompletions, kShort.dump()), 503, "server_error", "", "device_lost", "the device is lost");
  EXPECT_EQ(metric(s, "kvq_engine_healthy"), 0);
  EXPECT_EQ(get(s, "/metrics").status, 200);
}

TEST(ServerRobust, ANonStreamingClientThatGoesAwayIsCancelled) {
  ServerSetup setup;
  setup.ctx = 4096;
  TestServer s(setup);
  {
    RawSocket sock(s.port());
    ASSERT_TRUE(sock.send(http_post(kCompletions, long_request(false).dump())));
    ASSERT_TRUE(eventually([&] { return metric(s, "kvq_generation_tokens_total") >= 1; }));
  }  // closed mid-request
  ASSERT_TRUE(eventually([&] { return metric(s, "kvq_requests_running") == 0; }));
  EXPECT_EQ(metric(s, "kvq_requests_finished_total{reason=\"cancelled\"}"), 1);
  EXPECT_LT(metric(s, "kvq_generation_tokens_total"), 4000);
  EXPECT_EQ(metric(s, "kvq_kv_sequences_live"), 0);
  EXPECT_EQ(metric(s, "kvq_kv_pages_used"), 0);
}

TEST(ServerRobust, ARequestPastTheQueueTimeoutGets503AndOnePastItsDeadline504) {
  {
    ServerSetup setup;
    setup.ctx = 4096;
    setup.np = 1;
    setup.queue_timeout_s = 0.3;
    TestServer s(setup);
    std::atomic<bool> leave{false};
    std::thread running([&] { post_stream(s, kCompletions, long_request(true).dump(), 0, &leave); });
    ASSERT_TRUE(eventually([&] { return metric(s, "kvq_generation_tokens_total") >= 1; }));
    expect_error(post(s, kCompletions, kShort.dump()), 503, "server_error", "", "queue_timeout", "--queue-timeout");
    EXPECT_EQ(metric(s, "kvq_requests_finished_total{reason=\"queue_timeout\"}"), 1);
    leave = true;
    running.join();
  }
  ServerSetup setup;
  setup.ctx = 4096;
  setup.request_timeout_s = 0.2;  // 4000 tokens take far longer on the CPU
  TestServer s(setup);
  expect_error(post(s, kCompletions, long_request(false).dump()), 504, "server_error", "", "request_timeout",
               "--request-timeout");
  const Streamed st = post_stream(s, kCompletions, long_request(true).dump());
  ASSERT_FALSE(st.events.empty());
  EXPECT_EQ(st.events.back()["error"]["code"], "request_timeout");
  EXPECT_EQ(metric(s, "kvq_requests_finished_total{reason=\"deadline\"}"), 2);
  EXPECT_TRUE(eventually([&] { return metric(s, "kvq_kv_sequences_live") == 0; }));
}
