// kvq serve's HTTP front end: the OpenAI-compatible endpoints over an Engine, on the event-driven transport
// (server/http_transport.h: a fixed number of I/O threads, deadlines for idle and slow clients, 431 / 413 at once,
// pipelining in order).
//
//   POST /v1/completions, POST /v1/chat/completions   streaming (server-sent events, then "data: [DONE]") or not
//   GET  /v1/models   GET /health   GET /metrics (Prometheus text)
//   POST /debug/fault   only with test hooks (kvq serve --test-hooks): arms a fault in the next engine step
//
// Every error is an OpenAI error body with its status (server/api_error.h). With an API key, every path but /health
// and /metrics needs "Authorization: Bearer KEY" (the scheme in any case), checked before routing: an unknown path
// gets 401 without a key, like a known one. The I/O threads only route: a completion request is parsed, tokenized and
// submitted by one of `workers` threads, so /health and /metrics are answered whatever the workers and the engine
// are doing. A client that goes away (a stream or not) is cancelled and the engine frees its sequence. drain()
// refuses new requests (503), waits for every request in flight to finish and be written, then stops the server.
// /health is 503 while draining and once the engine's device is lost (Engine::healthy).
//
// Without a tokenizer (kvq serve --dummy-weights: random weights, timing only) the server takes token ids only:
// /v1/completions with a prompt of ids, no stop strings, no logprobs; replies carry the token counts (usage) and stream
// chunks as the tokens come, with empty text. Everything that needs text is refused with a 400 that says so.
#pragma once

#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "engine/engine.h"
#include "engine/fault_injector.h"
#include "server/api_request.h"
#include "server/api_response.h"
#include "server/chat_template.h"
#include "server/http_transport.h"
#include "tokenizer/tokenizer.h"

namespace kvq::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port
  std::string api_key;                   // "" : no authentication
  std::string model_name;                // the model's id in /v1/models and responses
  TransportOptions http;                 // I/O threads, connections, body size, deadlines
  int workers = 2;                       // threads that parse, tokenize and submit completion requests
  bool lenient_fields = false;           // unknown request fields: ignored (each name logged once), not refused
};

class HttpServer {
 public:
  // engine, tok and chat must outlive the server; chat: nullopt when the model has no chat template; tok: null for
  // token ids only (see above; then no chat template either). faults: the engine's runner wrapper that POST
  // /debug/fault arms (kvq serve --test-hooks), or null: no such endpoint.
  HttpServer(Engine& engine, const Tokenizer* tok, const ModelConfig& model, const CacheConfig& cache, int max_ctx,
             std::optional<ChatTemplate> chat, ServerOptions opt, FaultInjectingRunner* faults = nullptr);
  ~HttpServer();

  int bind();   // binds host:port; returns the port (a free one for port 0); kvq::Error when it cannot
  void run();   // serves until stop() or the end of a drain (blocking)
  void drain();  // refuses new requests, waits for those in flight, then stops (blocking; call from another thread)
  void stop();  // stops now (streams in progress are cut, their requests cancelled)
  bool draining() const { return draining_; }
  TransportStats transport_stats() const { return http_.stats(); }

  // The handlers' logic, without the transport (tests call it too): a completion request's body to the engine's
  // inputs. Throws ApiError for bad input.
  struct Prepared {
    ApiRequest req;
    std::vector<int32_t> prompt;
    GenerateParams params;
  };
  Prepared prepare(const std::string& body, Endpoint endpoint) const;

 private:
  struct Completion;  // a request in flight: its exchange, its engine stream, what is written
  struct Gate;        // closed by stop(): the engine thread no longer reaches the transport
  struct Workers;
  void handle(std::shared_ptr<Exchange> x, HttpRequest r);
  void completion(const std::shared_ptr<Exchange>& x, const HttpRequest& r, Endpoint endpoint);
  void pump(Completion& c);  // on the exchange's strand: writes what the engine produced
  bool authorized(const HttpRequest& r, Exchange& x) const;
  void health(Exchange& x) const;
  void fault(const HttpRequest& r, Exchange& x);
  void log_ignored(const std::string& field) const;  // once per field name (--lenient-fields)

  Engine& engine_;
  const Tokenizer* tok_;  // null: token ids only
  const ModelConfig& model_;
  CacheConfig cache_;
  int max_ctx_;
  std::optional<ChatTemplate> chat_;
  std::optional<int32_t> end_of_turn_id_;  // the chat template's end of turn as a token, when the vocab has it
  ServerOptions opt_;
  FaultInjectingRunner* faults_;
  std::atomic<bool> draining_{false};
  std::atomic<int> open_responses_{0};     // completion requests from routing until their response is over
  std::atomic<uint64_t> next_id_{1};
  std::shared_ptr<Gate> gate_;
  mutable std::mutex ignored_mu_;
  mutable std::set<std::string> ignored_;  // unknown fields logged so far
  std::mutex live_mu_;
  std::map<uint64_t, std::shared_ptr<Completion>> live_;  // completions in flight (their owner until written)
  HttpTransport http_;
  std::unique_ptr<Workers> workers_;  // declared last: joined first, while the transport still exists
};

}  // namespace kvq::server
