// kvq serve in-process for the server tests: models/ref on the CPU behind an Engine and an HttpServer on a free
// loopback port, and a few HTTP helpers (JSON requests, server-sent-event streams, /metrics values). Every wait is
// bounded: HTTP timeouts, polling loops with a deadline.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/fault_injector.h"
#include "model/runner.h"
#include "server/http_server.h"

namespace kvq::test {

using nlohmann::json;

struct ServerSetup {
  CacheConfig cache;           // bf16 by default
  int ctx = 256;               // tokens per sequence
  int np = 4;                  // running requests at most
  int max_queue = 32;
  int kv_pages = 0;            // > 0: a pool of np sequences' windows and this many pages (a tight budget)
  std::string api_key;
  bool chat = true;            // models/ref's ChatML template, or none
  bool dummy_weights = false;  // kvq serve --dummy-weights: random weights of models/ref's config, no tokenizer
                               // and no chat template (token ids only)
  size_t max_body_bytes = size_t(1) << 20;
  bool prefix_cache = true;     // as kvq serve (--no-prefix-cache: false)
  double queue_timeout_s = 0;   // EngineConfig
  double request_timeout_s = 0;
  server::TransportOptions http;  // I/O threads, deadlines (max_body_bytes above overrides its body limit)
  int workers = 2;
};

const std::string& source_dir();
Model& ref_model();
Model& ref_dummy_model();  // Model::dummy of models/ref's config (seed 0)
const Tokenizer& ref_tokenizer();

class TestServer {
 public:
  explicit TestServer(const ServerSetup& s);
  ~TestServer();  // stops the server (if a drain has not) and joins it
  int port() const { return port_; }
  httplib::Client client() const;  // a new client with 120 s timeouts
  server::HttpServer& http() { return *http_; }
  Engine& engine() { return *engine_; }
  Runner& runner() { return *runner_; }
  FaultInjectingRunner& faults() { return *faults_; }  // what the engine runs: arm() makes its next step fail
  void join();  // waits for run() to return (after a drain)

 private:
  std::unique_ptr<CpuRunner> runner_;
  std::unique_ptr<FaultInjectingRunner> faults_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<server::HttpServer> http_;
  std::thread thread_;
  int port_ = 0;
};

struct Reply {
  int status = 0;      // 0: no response
  json body;           // the parsed body (discarded when not JSON)
  std::string raw;
  std::string error;   // without a response: the client's error (httplib::to_string)
};
Reply post(const TestServer& s, const std::string& path, const std::string& body,
           const httplib::Headers& headers = {});
Reply get(const TestServer& s, const std::string& path, const httplib::Headers& headers = {});

// A streamed response: the JSON of every "data:" event before [DONE], whether [DONE] came, and the text of the
// choices joined (text or delta.content).
struct Streamed {
  int status = 0;
  std::string error;  // without a response: the client's error
  std::vector<json> events;
  bool done = false;
  std::string text;
};
// The client closes the connection after stop_after events (0: reads to the end), or at the first event after *stop
// is set.
Streamed post_stream(const TestServer& s, const std::string& path, const std::string& body, int stop_after = 0,
                     const std::atomic<bool>* stop = nullptr);

// The value of an unlabelled (or exactly labelled, e.g. kvq_requests_finished_total{reason="cancelled"}) metric.
double metric(const TestServer& s, const std::string& name);
// Polls until pred() or the deadline; returns pred().
bool eventually(const std::function<bool()>& pred, std::chrono::seconds deadline = std::chrono::seconds(60));

// A raw TCP client on loopback, for what an HTTP client library will not send (pipelining, trickled headers, oversize
// headers, idle connections). Every read waits at most its timeout.
class RawSocket {
 public:
  explicit RawSocket(int port);  // connects (ADD_FAILURE when it cannot)
  ~RawSocket();
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;
  bool send(const std::string& bytes);  // false when the connection is gone
  void close();
  // One HTTP response (head and a Content-Length or chunked body), or status 0 when none came within timeout or
  // the connection closed first.
  struct Response {
    int status = 0;
    std::string head, body;
  };
  Response read_response(std::chrono::milliseconds timeout);
  // Whether the server closed the connection (a read returns end of file or a reset) within timeout.
  bool closed_by_server(std::chrono::milliseconds timeout);

 private:
  bool fill(std::chrono::steady_clock::time_point deadline);  // reads more into buf_; false on timeout / close
  int fd_ = -1;
  std::string buf_;
};

// The OpenAI error body: {"error": {"message", "type", "param", "code"}} with these values (param / code: "" is null).
void expect_error(const Reply& r, int status, const std::string& type, const std::string& param,
                  const std::string& code, const std::string& message_part);

}  // namespace kvq::test
