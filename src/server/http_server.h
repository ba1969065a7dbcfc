// kvq serve's HTTP front end on cpp-httplib: the OpenAI-compatible endpoints over an Engine.
//
//   POST /v1/completions, POST /v1/chat/completions   streaming (server-sent events, then "data: [DONE]") or not
//   GET  /v1/models   GET /health   GET /metrics (Prometheus text)
//
// Every error is an OpenAI error body with its status (server/api_error.h). With an API key, /v1/* needs
// "Authorization: Bearer KEY" (401 otherwise); /health and /metrics stay open. A streaming client that goes away is
// cancelled at the next write that fails, and the engine frees its sequence. drain() refuses new requests (503),
// waits for every request in flight to finish and be written, then stops the server.
//
// Without a tokenizer (kvq serve --dummy-weights: random weights, timing only) the server takes token ids only:
// /v1/completions with a prompt of ids, no stop strings, no logprobs; replies carry the token counts (usage) and stream
// chunks as the tokens come, with empty text. Everything that needs text is refused with a 400 that says so.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "server/api_request.h"
#include "server/api_response.h"
#include "server/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace kvq::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                       // 0: any free port
  std::string api_key;                   // "" : no authentication
  std::string model_name;                // the model's id in /v1/models and responses
  size_t max_body_bytes = size_t(8) << 20;  // larger request bodies: 413
  int http_threads = 0;                  // 0: one per request in flight (running + queued) + 4
};

class HttpServer {
 public:
  // engine, tok and chat must outlive the server; chat: nullopt when the model has no chat template; tok: null for
  // token ids only (see above; then no chat template either).
  HttpServer(Engine& engine, const Tokenizer* tok, const ModelConfig& model, const CacheConfig& cache, int max_ctx,
             std::optional<ChatTemplate> chat, ServerOptions opt);
  ~HttpServer();

  int bind();   // binds host:port; returns the port (a free one for port 0); kvq::Error when it cannot
  void run();   // serves until stop() or the end of a drain (blocking)
  void drain();  // refuses new requests, waits for those in flight, then stops (blocking; call from another thread)
  void stop();  // stops now (streams in progress are cut)
  bool draining() const { return draining_; }

  // The handlers' logic, without the transport (tests call it too): a completion request's body to the engine's
  // inputs. Throws ApiError for bad input.
  struct Prepared {
    ApiRequest req;
    std::vector<int32_t> prompt;
    GenerateParams params;
  };
  Prepared prepare(const std::string& body, Endpoint endpoint) const;

 private:
  void routes();
  void completion(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  void stream(httplib::Response& res, std::shared_ptr<RequestStream> s, const ResponseContext& ctx);
  bool authorized(const httplib::Request& req, httplib::Response& res) const;

  Engine& engine_;
  const Tokenizer* tok_;  // null: token ids only
  const ModelConfig& model_;
  CacheConfig cache_;
  int max_ctx_;
  std::optional<ChatTemplate> chat_;
  std::optional<int32_t> end_of_turn_id_;  // the chat template's end of turn as a token, when the vocab has it
  ServerOptions opt_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> draining_{false};
  std::atomic<int> open_responses_{0};     // handlers running + streams still writing
  std::atomic<uint64_t> next_id_{1};
  int listen_fd_ = -1;  // the listening socket (set while httplib creates it; bind() widens its backlog)
};

}  // namespace kvq::server
