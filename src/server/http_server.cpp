#include "server/http_server.h"

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <random>
#include <thread>

#include <httplib.h>

#include "common/error.h"
#include "server/api_error.h"
#include "server/api_response.h"
#include "server/metrics.h"

namespace kvq::server {

namespace {

constexpr auto kPoll = std::chrono::milliseconds(100);  // a waiting handler re-checks its stream this often
// Connections the kernel holds before accept (capped by net.core.somaxconn). httplib listens with a backlog of 5: a
// burst of clients overflows it, the kernel falls back to SYN cookies and some clients' connections are closed
// before any response (measured: 3 of 25 runs of 32 concurrent clients under load, TcpExtListenOverflows).
constexpr int kListenBacklog = 4096;

void send_json(httplib::Response& res, int status, const nlohmann::json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status(), e.body()); }

// Counts a response from its handler's start until it is written (streams: until their provider is released).
struct OpenResponse {
  std::atomic<int>& n;
  explicit OpenResponse(std::atomic<int>& c) : n(c) { ++n; }
  ~OpenResponse() { --n; }
};

bool same_secret(const std::string& a, const std::string& b) {  // constant time in the key's length
  unsigned diff = unsigned(a.size() ^ b.size());
  for (size_t i = 0; i < a.size(); ++i) diff |= unsigned(uint8_t(a[i]) ^ uint8_t(i < b.size() ? b[i] : 0));
  return diff == 0;
}

}  // namespace

HttpServer::HttpServer(Engine& engine, const Tokenizer* tok, const ModelConfig& model, const CacheConfig& cache,
                       int max_ctx, std::optional<ChatTemplate> chat, ServerOptions opt)
    : engine_(engine), tok_(tok), model_(model), cache_(cache), max_ctx_(max_ctx), chat_(std::move(chat)),
      opt_(std::move(opt)), http_(std::make_unique<httplib::Server>()) {
  KVQ_CHECK(tok_ || !chat_, "serve: the chat template {} needs a tokenizer", chat_ ? chat_->name : "");
  if (chat_) end_of_turn_id_ = tok_->find(chat_->end_of_turn);
  if (chat_ && chat_->name.rfind("llama3", 0) == 0) {  // BOS: written only when encode() does not add it itself
    const std::optional<int32_t> bos = tok_->find("<|begin_of_text|>");
    const std::vector<int32_t> empty = tok_->encode("");
    chat_->write_bos = bos && (empty.empty() || empty.front() != *bos);
  }
  const int threads = opt_.http_threads > 0
                          ? opt_.http_threads
                          : engine_.scheduler_config().max_seqs + engine_.max_queue() + 4;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_->set_payload_max_length(opt_.max_body_bytes);
  http_->set_keep_alive_timeout(5);
  http_->set_socket_options([this](socket_t sock) {  // httplib's own options; the socket is kept for bind()
    httplib::default_socket_options(sock);
    listen_fd_ = sock;
  });
  routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const int port = opt_.port == 0 ? http_->bind_to_any_port(opt_.host) : (http_->bind_to_port(opt_.host, opt_.port)
                                                                           ? opt_.port : -1);
  KVQ_CHECK(port > 0, "serve: cannot listen on {}:{} (in use, or not an address of this machine)", opt_.host,
            opt_.port);
  // listen() again on the listening socket sets its backlog (Linux keeps the socket and its port).
  KVQ_CHECK(::listen(listen_fd_, kListenBacklog) == 0, "serve: cannot set the listen backlog on {}:{}: {}", opt_.host,
            port, std::strerror(errno));
  return port;
}

void HttpServer::run() { http_->listen_after_bind(); }

void HttpServer::stop() { http_->stop(); }

void HttpServer::drain() {
  draining_ = true;
  engine_.close();
  while (engine_.in_flight() > 0 || open_responses_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  http_->stop();
}

bool HttpServer::authorized(const httplib::Request& req, httplib::Response& res) const {
  if (opt_.api_key.empty()) return true;
  const std::string auth = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (auth.empty()) {
    send_error(res, ApiError(401, "You didn't provide an API key: send it as \"Authorization: Bearer KEY\".", "",
                             "missing_api_key"));
    return false;
  }
  if (auth.compare(0, prefix.size(), prefix) != 0 || !same_secret(auth.substr(prefix.size()), opt_.api_key)) {
    send_error(res, ApiError(401, "Incorrect API key provided.", "", "invalid_api_key"));
    return false;
  }
  return true;
}

HttpServer::Prepared HttpServer::prepare(const std::string& body, Endpoint endpoint) const {
  Prepared p;
  p.req = parse_api_request(body, endpoint);
  const ApiRequest& r = p.req;
  if (!r.model.empty() && r.model != opt_.model_name)
    throw ApiError(404, fmt::format("The model `{}` does not exist (this server runs `{}`).", r.model,
                                    opt_.model_name),
                   "model", "model_not_found");
  const char* what = endpoint == Endpoint::Chat ? "messages" : "prompt";
  if (!tok_) {  // token ids only: whatever needs text is refused, naming its parameter
    auto ids_only = [](const char* param) {
      return ApiError(400, "this server has no tokenizer (kvq serve --dummy-weights: random weights, timing only): "
                      "it takes a prompt of token ids on /v1/completions, without stop strings or logprobs, and "
                      "replies with token counts, not text", param, "no_tokenizer");
    };
    if (endpoint == Endpoint::Chat) throw ids_only("messages");
    if (r.prompt_ids.empty()) throw ids_only("prompt");
    if (!r.stop.empty()) throw ids_only("stop");
    if (r.logprobs >= 0) throw ids_only("logprobs");
  }
  if (endpoint == Endpoint::Chat) {
    if (!chat_)
      throw ApiError(400, fmt::format("this model has no chat template (no chat_template in tokenizer_config.json, "
                                      "chat_template.jinja or chat_template.json); start kvq serve with "
                                      "--chat-template NAME ({}), or use /v1/completions",
                                      chat_template_names()),
                     "messages");
    p.prompt = tok_->encode(chat_->render(r.messages));
  } else if (!r.prompt_ids.empty()) {
    for (int32_t id : r.prompt_ids)
      if (id >= model_.vocab_size)
        throw ApiError(400, fmt::format("prompt token id {} is outside the vocabulary of {} tokens", id,
                                        model_.vocab_size),
                       "prompt");
    p.prompt = r.prompt_ids;
  } else {
    p.prompt = tok_->encode(r.prompt);
  }
  const int n_prompt = int(p.prompt.size());
  if (n_prompt == 0) throw ApiError(400, fmt::format("the {} is empty: it encodes to no tokens", what), what);
  // max_tokens: OpenAI's defaults (completions 16, chat the rest of the context), then prompt + max_tokens must fit.
  const int max_tokens = r.max_tokens ? *r.max_tokens : endpoint == Endpoint::Chat ? max_ctx_ - n_prompt : 16;
  if (int64_t(n_prompt) + max_tokens > max_ctx_ || max_tokens < 1)
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens ({} "
                               "in the {}, {} in the completion). Please reduce the length of the {} or completion.",
                               max_ctx_, int64_t(n_prompt) + std::max(max_tokens, 0), n_prompt, what,
                               std::max(max_tokens, 0), what),
                   n_prompt >= max_ctx_ ? what : "max_tokens", "context_length_exceeded");
  GenerateParams& g = p.params;
  g.max_tokens = max_tokens;
  g.sampler.temperature = r.temperature;
  g.sampler.top_k = r.top_k;
  g.sampler.top_p = r.top_p;
  g.sampler.seed = r.seed ? *r.seed : std::random_device{}();
  g.stop = r.stop;
  if (!r.ignore_eos) {
    g.stop_ids = model_.eos_token_ids;
    if (endpoint == Endpoint::Chat) {
      if (end_of_turn_id_) g.stop_ids.push_back(*end_of_turn_id_);
      else g.stop.push_back(chat_->end_of_turn);
    }
  }
  g.top_logprobs = r.logprobs;
  return p;
}

void HttpServer::routes() {
  httplib::Server& s = *http_;
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler's own error body
    if (res.status == 413)
      return send_error(res, ApiError(413, "the request body is larger than the server accepts", "",
                                      "request_too_large"));
    if (res.status == 404)
      return send_error(res, ApiError(404, fmt::format("Invalid URL ({} {})", req.method, req.path), "",
                                      "unknown_url"));
    send_error(res, ApiError(res.status, fmt::format("HTTP {}", res.status)));
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const Error& e) {
      what = e.message();
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, what, "", "internal_error"));
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) return send_error(res, ApiError(503, "the server is shutting down", "", "shutting_down"));
    send_json(res, 200, {{"status", "ok"}});
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_metrics(engine_.stats(), opt_.model_name, cache_), "text/plain; version=0.0.4");
  });
  s.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    const nlohmann::json m = {{"id", opt_.model_name}, {"object", "model"}, {"created", int64_t(std::time(nullptr))},
                              {"owned_by", "kvq"}, {"max_model_len", max_ctx_}};
    send_json(res, 200, {{"object", "list"}, {"data", nlohmann::json::array({m})}});
  });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completion(req, res, Endpoint::Completions);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completion(req, res, Endpoint::Chat);
  });
}

void HttpServer::completion(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  OpenResponse open(open_responses_);
  if (!authorized(req, res)) return;
  if (draining_) return send_error(res, ApiError(503, "the server is shutting down", "", "shutting_down"));
  Prepared p;
  try {
    p = prepare(req.body, endpoint);
  } catch (const ApiError& e) {
    return send_error(res, e);
  }
  const int n_prompt = int(p.prompt.size());
  std::shared_ptr<RequestStream> rs;
  const Engine::Submit status =
      engine_.submit(std::make_unique<Generation>(std::move(p.prompt), p.params, tok_), rs);
  if (status == Engine::Submit::Closed)
    return send_error(res, ApiError(503, "the server is shutting down", "", "shutting_down"));
  if (status == Engine::Submit::QueueFull)
    return send_error(res, ApiError(429, fmt::format("the server is busy: {} requests running and {} queued, the "
                                                     "most it takes (-np, --max-queue); retry later",
                                                     engine_.scheduler_config().max_seqs, engine_.max_queue()),
                                    "", "queue_full"));
  const bool chat = endpoint == Endpoint::Chat;
  ResponseContext ctx{endpoint, fmt::format("{}-{:016x}", chat ? "chatcmpl" : "cmpl", next_id_++),
                      int64_t(std::time(nullptr)), opt_.model_name, p.req.logprobs >= 0, p.req.include_usage, tok_};
  if (p.req.stream) return stream(res, std::move(rs), ctx);
  GenerationOutput all;
  while (all.finish == FinishReason::None) rs->wait(all, kPoll);
  if (all.finish == FinishReason::Error)
    return send_error(res, ApiError(500, all.error, "", "internal_error"));
  if (all.finish == FinishReason::Cancelled)
    return send_error(res, ApiError(503, "the request was cancelled: the server is shutting down", "",
                                    "shutting_down"));
  send_json(res, 200, full_response(ctx, all, n_prompt, rs->generated_tokens()));
}

void HttpServer::stream(httplib::Response& res, std::shared_ptr<RequestStream> rs, const ResponseContext& ctx) {
  struct State {
    std::shared_ptr<RequestStream> rs;
    ResponseContext ctx;
    bool first = true;
  };
  auto st = std::make_shared<State>(State{std::move(rs), ctx});
  ++open_responses_;  // until the provider is released
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        GenerationOutput out;
        if (!st->rs->wait(out, kPoll)) return true;  // nothing yet: httplib calls again
        std::string chunk;
        if (out.finish == FinishReason::Error || out.finish == FinishReason::Cancelled) {
          const ApiError e = out.finish == FinishReason::Error
                                 ? ApiError(500, out.error, "", "internal_error")
                                 : ApiError(503, "the request was cancelled: the server is shutting down", "",
                                            "shutting_down");
          chunk = sse(e.body());
        } else {
          const bool role = st->first && st->ctx.endpoint == Endpoint::Chat;  // the chat stream opens with it
          if (!out.text.empty() || !out.tokens.empty() || role)
            chunk += sse(stream_chunk(st->ctx, out.text, out.tokens, FinishReason::None, role));
          st->first = false;
          if (out.finish != FinishReason::None) {
            chunk += sse(stream_chunk(st->ctx, "", {}, out.finish, false));
            if (st->ctx.include_usage)
              chunk += sse(usage_chunk(st->ctx, st->rs->prompt_tokens(), st->rs->generated_tokens()));
          }
        }
        if (out.finish != FinishReason::None) chunk += kSseDone;
        if (!sink.write(chunk.data(), chunk.size())) return false;  // the client went away
        if (out.finish != FinishReason::None) sink.done();
        return true;
      },
      [this, st](bool) {
        if (!st->rs->finished()) engine_.cancel(*st->rs);  // a client that went away: free its sequence
        --open_responses_;
      });
}

}  // namespace kvq::server
