#include "server/http_server.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>
#include <thread>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include "common/error.h"
#include "server/api_error.h"
#include "server/api_response.h"
#include "server/metrics.h"

namespace kvq::server {

namespace {

std::string json_text(const nlohmann::json& j) { return dump(j); }

void send(Exchange& x, int status, const nlohmann::json& j) { x.reply(status, "application/json", json_text(j)); }

void send_error(Exchange& x, const ApiError& e) { send(x, e.status(), e.body()); }

bool same_secret(const std::string& a, const std::string& b) {  // constant time in the key's length
  unsigned diff = unsigned(a.size() ^ b.size());
  for (size_t i = 0; i < a.size(); ++i) diff |= unsigned(uint8_t(a[i]) ^ uint8_t(i < b.size() ? b[i] : 0));
  return diff == 0;
}

ApiError shutting_down() { return ApiError(503, "the server is shutting down", "", "shutting_down"); }

// The error a request that ended without finishing its text gets (as a response, or a stream's last event); once the
// device is lost (device_lost), an engine error is 503 device_lost: the request cannot be served here any more.
ApiError finish_error(const GenerationOutput& out, bool device_lost) {
  if (out.finish == FinishReason::Error && device_lost) return ApiError(503, out.error, "", "device_lost");
  switch (out.finish) {
    case FinishReason::Cancelled: return ApiError(503, "the request was cancelled: the server is shutting down", "",
                                                  "shutting_down");
    case FinishReason::QueueTimeout: return ApiError(503, out.error, "", "queue_timeout");
    case FinishReason::Deadline: return ApiError(504, out.error, "", "request_timeout");
    default: return ApiError(500, out.error, "", "internal_error");
  }
}

bool finished_text(FinishReason r) { return r == FinishReason::Stop || r == FinishReason::Length; }

}  // namespace

struct HttpServer::Gate {
  std::mutex mu;
  bool open = true;
};

struct HttpServer::Workers {
  boost::asio::thread_pool pool;
  explicit Workers(int n) : pool(size_t(n)) {}
  ~Workers() { pool.join(); }
};

struct HttpServer::Completion {
  std::shared_ptr<Exchange> x;
  std::vector<std::shared_ptr<RequestStream>> rs;  // [n] one per choice
  ResponseContext ctx;
  bool streaming = false;
  int prompt_tokens = 0;
  std::vector<bool> first;              // [n] streaming: nothing of choice i written yet (chat opens with the role)
  std::vector<GenerationOutput> all;    // [n] not streaming: everything so far; streaming: each choice's finish
  bool written = false;                 // the response's end was handed to the exchange
};

HttpServer::HttpServer(Engine& engine, const Tokenizer* tok, const ModelConfig& model, const CacheConfig& cache,
                       int max_ctx, std::optional<ChatTemplate> chat, ServerOptions opt, FaultInjectingRunner* faults)
    : engine_(engine), tok_(tok), model_(model), cache_(cache), max_ctx_(max_ctx), chat_(std::move(chat)),
      opt_(std::move(opt)), faults_(faults), gate_(std::make_shared<Gate>()),
      http_(opt_.http, [this](std::shared_ptr<Exchange> x, HttpRequest r) { handle(std::move(x), std::move(r)); },
            [](int status, const std::string& message) {
              const char* code = status == 431 ? "request_header_fields_too_large"
                                 : status == 413 ? "request_too_large" : "invalid_http";
              return json_text(ApiError(status, message, "", code).body());
            }) {
  KVQ_CHECK(tok_ || !chat_, "serve: the chat template {} needs a tokenizer", chat_ ? chat_->name : "");
  KVQ_CHECK(opt_.workers >= 1 && opt_.workers <= 256, "serve: --workers {} must be in [1, 256]", opt_.workers);
  if (chat_) end_of_turn_id_ = tok_->find(chat_->end_of_turn);
  if (chat_ && chat_->name.rfind("llama3", 0) == 0) {  // BOS: written only when encode() does not add it itself
    const std::optional<int32_t> bos = tok_->find("<|begin_of_text|>");
    const std::vector<int32_t> empty = tok_->encode("");
    chat_->write_bos = bos && (empty.empty() || empty.front() != *bos);
  }
  workers_ = std::make_unique<Workers>(opt_.workers);
}

HttpServer::~HttpServer() {
  stop();
  workers_.reset();  // joined: no worker reaches the transport any more
  std::lock_guard<std::mutex> lk(live_mu_);
  live_.clear();  // before the transport: completions hold its exchanges
}

int HttpServer::bind() { return http_.bind(opt_.host, opt_.port); }

void HttpServer::run() { http_.run(); }

void HttpServer::stop() {
  {
    std::lock_guard<std::mutex> lk(gate_->mu);
    gate_->open = false;
  }
  http_.stop();
}

void HttpServer::drain() {
  draining_ = true;
  http_.close_after_responses();
  engine_.close();
  while (engine_.in_flight() > 0 || open_responses_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop();
}

bool HttpServer::authorized(const HttpRequest& r, Exchange& x) const {
  if (opt_.api_key.empty()) return true;
  if (r.authorization.empty()) {
    send_error(x, ApiError(401, "You didn't provide an API key: send it as \"Authorization: Bearer KEY\".", "",
                           "missing_api_key"));
    return false;
  }
  // "Bearer" in any case (RFC 9110: auth schemes are case-insensitive), then the key after its spaces.
  const std::string& a = r.authorization;
  const bool bearer = a.size() > 6 && (a[6] == ' ' || a[6] == '\t') &&
                      std::equal(a.begin(), a.begin() + 6, "bearer", [](char c, char l) {
                        return char(std::tolower(static_cast<unsigned char>(c))) == l;
                      });
  const size_t key = bearer ? a.find_first_not_of(" \t", 6) : std::string::npos;
  if (key == std::string::npos || !same_secret(a.substr(key), opt_.api_key)) {
    send_error(x, ApiError(401, "Incorrect API key provided.", "", "invalid_api_key"));
    return false;
  }
  return true;
}

void HttpServer::health(Exchange& x) const {
  if (draining_) return send_error(x, shutting_down());
  std::string why;
  if (!engine_.healthy(&why))
    return send_error(x, ApiError(503, fmt::format("the device is lost: {}", why), "", "device_lost"));
  send(x, 200, {{"status", "ok"}});
}

void HttpServer::fault(const HttpRequest& r, Exchange& x) {
  const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("fault") || !j["fault"].is_string())
    return send_error(x, ApiError(400, "POST /debug/fault takes {\"fault\": \"error\" | \"bad_alloc\" | "
                                  "\"device_lost\"}", "fault"));
  try {
    faults_->arm(parse_fault(j["fault"].get<std::string>()));
  } catch (const Error& e) {
    return send_error(x, ApiError(400, e.message(), "fault"));
  }
  send(x, 200, {{"armed", j["fault"]}});
}

void HttpServer::handle(std::shared_ptr<Exchange> x, HttpRequest r) {
  const bool open = r.path == "/health" || r.path == "/metrics";
  if (!open && !authorized(r, *x)) return;
  if (r.method == "GET" && r.path == "/health") return health(*x);
  if (r.method == "GET" && r.path == "/metrics")
    return x->reply(200, "text/plain; version=0.0.4",
                    render_metrics(engine_.stats(), opt_.model_name, cache_, http_.stats()));
  if (r.method == "GET" && r.path == "/v1/models") {
    const nlohmann::json m = {{"id", opt_.model_name}, {"object", "model"}, {"created", int64_t(std::time(nullptr))},
                              {"owned_by", "kvq"}, {"max_model_len", max_ctx_}};
    return send(*x, 200, {{"object", "list"}, {"data", nlohmann::json::array({m})}});
  }
  if (r.method == "POST" && (r.path == "/v1/completions" || r.path == "/v1/chat/completions")) {
    const Endpoint endpoint = r.path == "/v1/completions" ? Endpoint::Completions : Endpoint::Chat;
    ++open_responses_;
    x->on_done([this] { --open_responses_; });
    boost::asio::post(workers_->pool, [this, x, r = std::move(r), endpoint] {
      try {
        completion(x, r, endpoint);
      } catch (const std::exception& e) {  // bad_alloc, ...: this request's 500; the worker goes on
        send_error(*x, ApiError(500, fmt::format("internal error: {}", e.what()), "", "internal_error"));
      }
    });
    return;
  }
  if (faults_ && r.method == "POST" && r.path == "/debug/fault") return fault(r, *x);
  send_error(*x, ApiError(404, fmt::format("Invalid URL ({} {})", r.method, r.path), "", "unknown_url"));
}

HttpServer::Prepared HttpServer::prepare(const std::string& body, Endpoint endpoint) const {
  Prepared p;
  p.req = parse_api_request(body, endpoint, ParseOptions{.lenient_fields = opt_.lenient_fields});
  const ApiRequest& r = p.req;
  for (const std::string& f : r.ignored) log_ignored(f);
  if (r.n > engine_.scheduler_config().max_seqs)
    throw ApiError(400, fmt::format("'n' is {}: this server runs at most {} requests at once (-np), and the choices of "
                                    "one request run together", r.n, engine_.scheduler_config().max_seqs),
                   "n");
  for (const auto& [id, bias] : r.logit_bias)
    if (id >= model_.vocab_size)
      throw ApiError(400, fmt::format("logit_bias: token id {} is outside the vocabulary of {} tokens", id,
                                      model_.vocab_size),
                     "logit_bias");
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
  g.sampler.min_p = r.min_p;
  g.sampler.presence_penalty = r.presence_penalty;
  g.sampler.frequency_penalty = r.frequency_penalty;
  g.sampler.repetition_penalty = r.repetition_penalty;
  g.sampler.logit_bias = r.logit_bias;
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

void HttpServer::completion(const std::shared_ptr<Exchange>& x, const HttpRequest& r, Endpoint endpoint) {
  if (draining_) return send_error(*x, shutting_down());
  Prepared p;
  try {
    p = prepare(r.body, endpoint);
  } catch (const ApiError& e) {
    return send_error(*x, e);
  }
  const int n_prompt = int(p.prompt.size());
  // n choices: one generation each, choice i seeded seed + i; the engine prefills the prompt once.
  std::vector<std::unique_ptr<Generation>> gens;
  for (int i = 0; i < p.req.n; ++i) {
    GenerateParams gp = p.params;
    gp.sampler.seed += uint64_t(i);
    gens.push_back(std::make_unique<Generation>(p.prompt, gp, tok_));
  }
  std::vector<std::shared_ptr<RequestStream>> rs;
  const Engine::Submit status = engine_.submit_group(std::move(gens), rs);
  if (status == Engine::Submit::Closed) return send_error(*x, shutting_down());
  if (status == Engine::Submit::Unavailable) {
    std::string why;
    engine_.healthy(&why);
    return send_error(*x, ApiError(503, fmt::format("the device is lost: {}", why), "", "device_lost"));
  }
  if (status == Engine::Submit::QueueFull)
    return send_error(*x, ApiError(429, fmt::format("the server is busy: {} requests running and {} queued, the "
                                                    "most it takes (-np, --max-queue); retry later",
                                                    engine_.scheduler_config().max_seqs, engine_.max_queue()),
                                   "", "queue_full"));
  const bool chat = endpoint == Endpoint::Chat;
  const uint64_t id = next_id_++;
  auto c = std::make_shared<Completion>();
  c->x = x;
  c->rs = rs;
  c->ctx = ResponseContext{endpoint, fmt::format("{}-{:016x}", chat ? "chatcmpl" : "cmpl", id),
                           int64_t(std::time(nullptr)), opt_.model_name, p.req.logprobs >= 0, p.req.include_usage,
                           tok_};
  c->streaming = p.req.stream;
  c->prompt_tokens = n_prompt;
  c->all.resize(rs.size());
  c->first.assign(rs.size(), true);
  {
    std::lock_guard<std::mutex> lk(live_mu_);
    live_[id] = c;
  }
  const std::weak_ptr<Completion> weak = c;
  x->on_gone([this, weak] {  // the client went away: the engine frees the sequences
    if (std::shared_ptr<Completion> cc = weak.lock())
      for (const auto& s : cc->rs) engine_.cancel(*s);
  });
  x->on_done([this, id] {
    std::lock_guard<std::mutex> lk(live_mu_);
    live_.erase(id);
  });
  if (c->streaming) x->stream_begin("text/event-stream");
  // The engine thread only posts the pump to the connection's strand, and not once the server is stopping.
  for (const auto& s : rs)
    s->on_update([this, weak, gate = gate_] {
      std::lock_guard<std::mutex> lk(gate->mu);
      if (!gate->open) return;
      if (std::shared_ptr<Completion> cc = weak.lock()) cc->x->post([this, cc] { pump(*cc); });
    });
}

void HttpServer::log_ignored(const std::string& field) const {
  std::lock_guard<std::mutex> lk(ignored_mu_);
  if (ignored_.insert(field).second)
    std::fprintf(stderr, "kvq: serve: ignoring the unknown request field '%s' (--lenient-fields; logged once)\n",
                 field.c_str());
}

void HttpServer::pump(Completion& c) {
  if (c.written) return;
  const size_t n = c.rs.size();
  std::string chunk;
  for (size_t i = 0; i < n; ++i) {
    GenerationOutput out;
    if (c.all[i].finish != FinishReason::None || !c.rs[i]->wait(out, std::chrono::milliseconds(0))) continue;
    const bool done = out.finish != FinishReason::None;
    if (!c.streaming) {
      c.all[i].text += out.text;
      c.all[i].tokens.insert(c.all[i].tokens.end(), out.tokens.begin(), out.tokens.end());
      c.all[i].finish = out.finish;
      c.all[i].error = out.error;
      continue;
    }
    c.all[i].finish = out.finish;
    if (done && !finished_text(out.finish)) {  // the request ends: one error event for all its choices
      c.written = true;
      for (const auto& s : c.rs) engine_.cancel(*s);
      c.x->stream_write(chunk + sse(finish_error(out, !engine_.healthy()).body()) + kSseDone);
      return c.x->stream_end();
    }
    const bool role = c.first[i] && c.ctx.endpoint == Endpoint::Chat;  // each chat choice opens with it
    if (!out.text.empty() || !out.tokens.empty() || role)
      chunk += sse(stream_chunk(c.ctx, out.text, out.tokens, FinishReason::None, role, int(i)));
    c.first[i] = false;
    if (done) chunk += sse(stream_chunk(c.ctx, "", {}, out.finish, false, int(i)));
  }
  const bool all_done =
      std::all_of(c.all.begin(), c.all.end(), [](const GenerationOutput& o) { return o.finish != FinishReason::None; });
  int generated = 0;
  for (const auto& s : c.rs) generated += s->generated_tokens();
  if (!c.streaming) {
    if (!all_done) return;
    c.written = true;
    for (const GenerationOutput& o : c.all)
      if (!finished_text(o.finish)) return send_error(*c.x, finish_error(o, !engine_.healthy()));
    return send(*c.x, 200, full_response(c.ctx, c.all, c.prompt_tokens, generated, c.rs[0]->cached_tokens()));
  }
  if (all_done) {
    if (c.ctx.include_usage)
      chunk += sse(usage_chunk(c.ctx, c.prompt_tokens, generated, c.rs[0]->cached_tokens()));
    chunk += kSseDone;
  }
  if (!chunk.empty()) c.x->stream_write(std::move(chunk));
  if (all_done) {
    c.written = true;
    c.x->stream_end();
  }
}

}  // namespace kvq::server
