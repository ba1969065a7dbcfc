#include "server_harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "server/chat_template.h"

namespace kvq::test {

const std::string& source_dir() {
  static const std::string s = KVQ_SOURCE_DIR;
  return s;
}

Model& ref_model() {
  static std::unique_ptr<Model> m = Model::load(source_dir() + "/models/ref", 2);
  return *m;
}

Model& ref_dummy_model() {
  static std::unique_ptr<Model> m = Model::dummy(source_dir() + "/models/ref", ref_model().config(), 0, 2);
  return *m;
}

const Tokenizer& ref_tokenizer() {
  static const Tokenizer t = Tokenizer::load(source_dir() + "/models/ref/tokenizer.json");
  return t;
}

TestServer::TestServer(const ServerSetup& s) {
  Model& m = s.dummy_weights ? ref_dummy_model() : ref_model();
  const ModelConfig& mc = m.config();
  size_t budget = 0;
  if (s.kv_pages > 0) {
    const CacheLayout l = cache_layout(s.cache, mc.n_layers, mc.n_kv_heads, mc.head_dim);
    budget = size_t(s.np * l.window_pages() + s.kv_pages) * size_t(l.page_bytes);
  }
  runner_ = std::make_unique<CpuRunner>(m, s.cache, s.ctx, s.np, budget);
  if (s.kv_pages > 0) {
    const CacheLayout& l = runner_->page_pool().layout();
    EXPECT_EQ(runner_->page_pool().n_pages(), s.np * l.window_pages() + s.kv_pages);
  }
  faults_ = std::make_unique<FaultInjectingRunner>(*runner_);
  EngineConfig ec;
  ec.scheduler.max_seqs = s.np;
  ec.max_queue = s.max_queue;
  ec.queue_timeout_s = s.queue_timeout_s;
  ec.scheduler.prefix_cache = s.prefix_cache;
  ec.request_timeout_s = s.request_timeout_s;
  engine_ = std::make_unique<Engine>(*faults_, ec);
  server::ServerOptions opt;
  opt.host = "127.0.0.1";
  opt.port = 0;
  opt.api_key = s.api_key;
  opt.model_name = "ref";
  opt.http = s.http;
  opt.http.max_body_bytes = s.max_body_bytes;
  opt.workers = s.workers;
  auto chat = s.chat && !s.dummy_weights ? server::load_chat_template(source_dir() + "/models/ref", "") : std::nullopt;
  const Tokenizer* tok = s.dummy_weights ? nullptr : &ref_tokenizer();
  http_ = std::make_unique<server::HttpServer>(*engine_, tok, mc, s.cache, s.ctx, chat, opt, faults_.get());
  port_ = http_->bind();
  thread_ = std::thread([this] { http_->run(); });
}

TestServer::~TestServer() {
  if (thread_.joinable()) {
    http_->stop();
    thread_.join();
  }
}

void TestServer::join() {
  if (thread_.joinable()) thread_.join();
}

httplib::Client TestServer::client() const {
  httplib::Client c("127.0.0.1", port_);
  c.set_read_timeout(120, 0);
  c.set_write_timeout(30, 0);
  c.set_connection_timeout(10, 0);
  return c;
}

namespace {
Reply reply_of(const httplib::Result& r) {
  Reply out;
  if (!r) {
    out.error = httplib::to_string(r.error());
    return out;
  }
  out.status = r->status;
  out.raw = r->body;
  out.body = json::parse(r->body, nullptr, false);
  return out;
}
}  // namespace

Reply post(const TestServer& s, const std::string& path, const std::string& body, const httplib::Headers& headers) {
  httplib::Client c = s.client();
  return reply_of(c.Post(path.c_str(), headers, body, "application/json"));
}

Reply get(const TestServer& s, const std::string& path, const httplib::Headers& headers) {
  httplib::Client c = s.client();
  return reply_of(c.Get(path.c_str(), headers));
}

Streamed post_stream(const TestServer& s, const std::string& path, const std::string& body, int stop_after,
                     const std::atomic<bool>* stop) {
  Streamed out;
  std::string buf;
  httplib::Client c = s.client();
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    for (size_t end; (end = buf.find("\n\n")) != std::string::npos;) {
      const std::string event = buf.substr(0, end);
      buf.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string data_text = event.substr(6);
      if (data_text == "[DONE]") {
        out.done = true;
        continue;
      }
      const json j = json::parse(data_text, nullptr, false);
      out.events.push_back(j);
      if (j.contains("choices") && !j["choices"].empty()) {
        const json& ch = j["choices"][0];
        if (ch.contains("text")) out.text += ch["text"].get<std::string>();
        if (ch.contains("delta") && ch["delta"].contains("content"))
          out.text += ch["delta"]["content"].get<std::string>();
      }
      if (stop_after > 0 && int(out.events.size()) >= stop_after) return false;  // the client goes away
      if (stop && *stop) return false;
    }
    return true;
  };
  httplib::Result r = c.send(req);
  if (r)
    out.status = r->status;
  else
    out.error = httplib::to_string(r.error());
  return out;
}

double metric(const TestServer& s, const std::string& name) {
  const Reply r = get(s, "/metrics");
  EXPECT_EQ(r.status, 200);
  size_t pos = 0;
  while ((pos = r.raw.find(name + " ", pos)) != std::string::npos) {
    if (pos == 0 || r.raw[pos - 1] == '\n') return std::stod(r.raw.substr(pos + name.size() + 1));
    pos += name.size();
  }
  ADD_FAILURE() << "no metric " << name;
  return -1;
}

bool eventually(const std::function<bool()>& pred, std::chrono::seconds deadline) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

RawSocket::RawSocket(int port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ADD_FAILURE() << "cannot connect to 127.0.0.1:" << port << ": " << std::strerror(errno);
    close();
  }
}

RawSocket::~RawSocket() { close(); }

void RawSocket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool RawSocket::send(const std::string& bytes) {
  for (size_t at = 0; at < bytes.size();) {
    if (fd_ < 0) return false;
    const ssize_t n = ::send(fd_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += size_t(n);
  }
  return fd_ >= 0;
}

bool RawSocket::fill(std::chrono::steady_clock::time_point deadline) {
  if (fd_ < 0) return false;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return false;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, int(left.count())) <= 0) return false;
  char tmp[65536];
  const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
  if (n <= 0) return false;
  buf_.append(tmp, size_t(n));
  return true;
}

RawSocket::Response RawSocket::read_response(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Response r;
  size_t end;
  while ((end = buf_.find("\r\n\r\n")) == std::string::npos)
    if (!fill(deadline)) return r;
  std::string head = buf_.substr(0, end + 4);
  std::string lower = head;
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  size_t at = end + 4;
  std::string body;
  if (const size_t cl = lower.find("content-length:"); cl != std::string::npos) {
    const size_t n = std::stoul(head.substr(cl + 15));
    while (buf_.size() < at + n)
      if (!fill(deadline)) return r;
    body = buf_.substr(at, n);
    at += n;
  } else if (lower.find("transfer-encoding: chunked") != std::string::npos) {
    for (;;) {
      size_t eol;
      while ((eol = buf_.find("\r\n", at)) == std::string::npos)
        if (!fill(deadline)) return r;
      const size_t n = std::stoul(buf_.substr(at, eol - at), nullptr, 16);
      while (buf_.size() < eol + 2 + n + 2)
        if (!fill(deadline)) return r;
      body += buf_.substr(eol + 2, n);
      at = eol + 2 + n + 2;
      if (n == 0) break;
    }
  }
  buf_.erase(0, at);
  r.status = std::stoi(head.substr(9, 3));
  r.head = std::move(head);
  r.body = std::move(body);
  return r;
}

bool RawSocket::closed_by_server(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (fd_ >= 0 && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd_, POLLIN, 0};
    const int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(
                             deadline - std::chrono::steady_clock::now()).count());
    if (::poll(&p, 1, std::max(left, 0)) <= 0) continue;
    char tmp[4096];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) return true;  // end of file, or reset
  }
  return false;
}

void expect_error(const Reply& r, int status, const std::string& type, const std::string& param,
                  const std::string& code, const std::string& message_part) {
  EXPECT_EQ(r.status, status) << r.raw;
  ASSERT_TRUE(r.body.is_object() && r.body.contains("error")) << r.raw;
  const json& e = r.body["error"];
  ASSERT_TRUE(e.is_object()) << r.raw;
  ASSERT_EQ(e.size(), 4u) << r.raw;  // message, type, param, code: nothing else
  EXPECT_EQ(e["type"], type) << r.raw;
  EXPECT_EQ(e["param"], param.empty() ? json(nullptr) : json(param)) << r.raw;
  EXPECT_EQ(e["code"], code.empty() ? json(nullptr) : json(code)) << r.raw;
  ASSERT_TRUE(e["message"].is_string()) << r.raw;
  EXPECT_NE(e["message"].get<std::string>().find(message_part), std::string::npos) << r.raw;
}

}  // namespace kvq::test
