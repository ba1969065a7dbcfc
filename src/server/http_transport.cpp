#include "server/http_transport.h"

#include <chrono>
#include <cmath>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <fmt/format.h>

#include "common/error.h"

namespace kvq::server {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;

void TransportOptions::validate() const {
  KVQ_CHECK(io_threads >= 1 && io_threads <= 256, "serve: --http-threads {} must be in [1, 256]", io_threads);
  KVQ_CHECK(max_connections >= 1, "serve: --max-connections {} must be >= 1", max_connections);
  for (double t : {idle_timeout_s, header_timeout_s, body_timeout_s, write_timeout_s})
    KVQ_CHECK(std::isfinite(t) && t > 0 && t <= 86400, "serve: an HTTP timeout of {} s must be in (0, 86400]", t);
}

namespace {

constexpr size_t kMaxBuffered = size_t(64) << 10;  // bytes read ahead of the next request (pipelined) while handling

std::chrono::steady_clock::duration span(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

// "HTTP/1.1 200 OK\r\n..." for a response of body_bytes (or chunked when body_bytes < 0).
std::string head(int status, const std::string& content_type, long body_bytes, bool keep_alive) {
  std::string h = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\n", status,
                              std::string(http::obsolete_reason(http::int_to_status(unsigned(status)))),
                              content_type);
  if (body_bytes >= 0) h += fmt::format("Content-Length: {}\r\n", body_bytes);
  else h += "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n";
  h += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return h;
}

std::string chunk(const std::string& data) { return fmt::format("{:x}\r\n", data.size()) + data + "\r\n"; }

}  // namespace

namespace transport {
class Connection;
}  // namespace transport

struct HttpTransport::Impl {
  TransportOptions opt;
  Handler handle;
  ErrorBody error_body;
  const std::atomic<bool>& closing;
  // Declared before the io_context: connections destroyed with it still count themselves out.
  std::atomic<int64_t> open{0}, total{0}, refused{0}, timeouts{0}, bad{0};
  std::mutex conns_mu;
  std::vector<std::weak_ptr<transport::Connection>> conns;  // every connection, for stop()
  net::io_context ioc;
  net::strand<net::io_context::executor_type> accept_strand{ioc.get_executor()};  // the acceptor's operations
  tcp::acceptor acceptor{accept_strand};
  net::steady_timer accept_retry{accept_strand};

  Impl(TransportOptions o, Handler h, ErrorBody e, const std::atomic<bool>& c)
      : opt(std::move(o)), handle(std::move(h)), error_body(std::move(e)), closing(c) {}
  void accept();
};

namespace transport {

// One request of a connection (the transport's side of an Exchange); lives until its response is written or the
// connection is gone, and then tells the connection.
class ExchangeImpl final : public Exchange, public std::enable_shared_from_this<ExchangeImpl> {
 public:
  explicit ExchangeImpl(std::shared_ptr<Connection> c) : conn_(std::move(c)) {}
  void reply(int status, std::string content_type, std::string body) override;
  void stream_begin(std::string content_type) override;
  void stream_write(std::string chunk) override;
  void stream_end() override;
  void post(std::function<void()> fn) override;
  void on_gone(std::function<void()> fn) override;
  void on_done(std::function<void()> fn) override;

  // On the strand.
  void gone();  // the client went away
  void done();  // over (written or gone)
  bool over() const { return over_; }

 private:
  std::shared_ptr<Connection> conn_;
  std::vector<std::function<void()>> gone_fns_, done_fns_;
  bool gone_ = false, over_ = false;
};

class Connection final : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket s, HttpTransport::Impl& t)
      : t_(t), socket_(std::move(s)), read_timer_(socket_.get_executor()), write_timer_(socket_.get_executor()) {
    ++t_.open;
  }
  ~Connection() { --t_.open; }

  void start() { read_next(); }
  net::any_io_executor executor() { return socket_.get_executor(); }
  // From the exchange (on the strand): bytes of its response, in order; last: the response ends with them.
  void send(std::string bytes, bool last);
  bool closed() const { return closed_; }
  bool keep_alive() const { return keep_alive_ && !t_.closing; }
  void close();

 private:
  void read_next();
  void read_header();
  void on_header(error_code ec);
  void read_body();
  void dispatch();
  void watch();
  void write_next();
  void fail(int status, const std::string& message);  // a transport error response, then close
  void linger();  // after a last response: stop sending, drain what the client still sends (2 s at most), close
  // A deadline on timer; disarm() before its handler runs makes it a no-op even when it has already expired.
  void arm(net::steady_timer& timer, uint64_t& gen, double seconds);
  void disarm(net::steady_timer& timer, uint64_t& gen) {
    ++gen;
    timer.cancel();
  }

  HttpTransport::Impl& t_;
  tcp::socket socket_;
  net::steady_timer read_timer_, write_timer_;
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<ExchangeImpl> exchange_;  // the request being handled
  std::deque<std::pair<std::string, bool>> out_;  // bytes to write, and whether they end a response
  bool writing_ = false, watching_ = false, reading_ = false, closed_ = false, keep_alive_ = true;
  bool after_exchange_ = false;  // close after the write in flight (a transport error response)
  bool lingering_ = false;
  uint64_t read_gen_ = 0, write_gen_ = 0;  // deadlines armed so far (see disarm)
  char drain_[4096];
};

void Connection::arm(net::steady_timer& timer, uint64_t& gen, double seconds) {
  timer.expires_after(span(seconds));
  timer.async_wait([self = shared_from_this(), &gen, g = ++gen](error_code ec) {
    if (ec || g != gen || self->closed_) return;  // cancelled, or the operation finished in time
    if (!self->lingering_) ++self->t_.timeouts;
    self->close();
  });
}

void Connection::linger() {
  if (closed_ || lingering_) return;
  lingering_ = true;
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);  // the client sees the end of the response
  arm(read_timer_, read_gen_, 2.0);
  struct Drain {
    std::shared_ptr<Connection> self;
    void operator()(error_code ec, size_t) {
      if (ec || self->closed_) return self->close();
      self->socket_.async_read_some(net::buffer(self->drain_), std::move(*this));
    }
  };
  socket_.async_read_some(net::buffer(drain_), Drain{shared_from_this()});
}

void Connection::close() {
  if (closed_) return;
  closed_ = true;
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  disarm(read_timer_, read_gen_);
  disarm(write_timer_, write_gen_);
  out_.clear();
  if (exchange_) {
    std::shared_ptr<ExchangeImpl> x = std::move(exchange_);
    x->gone();
  }
}

void Connection::read_next() {
  if (closed_) return;
  exchange_.reset();
  if (buffer_.size() > 0) return read_header();  // a pipelined request is already here
  reading_ = true;
  arm(read_timer_, read_gen_, t_.opt.idle_timeout_s);
  socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
    self->disarm(self->read_timer_, self->read_gen_);
    if (ec || self->closed_) return self->close();
    self->read_header();
  });
}

void Connection::read_header() {
  reading_ = true;
  parser_.emplace();
  parser_->header_limit(std::uint32_t(kMaxHeaderBytes));
  parser_->body_limit(std::uint64_t(t_.opt.max_body_bytes));
  arm(read_timer_, read_gen_, t_.opt.header_timeout_s);
  http::async_read_header(socket_, buffer_, *parser_,
                          [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
}

void Connection::on_header(error_code ec) {
  disarm(read_timer_, read_gen_);
  if (closed_) return;
  if (ec == http::error::header_limit)
    return fail(431, fmt::format("the request's headers are larger than the {} KiB the server accepts",
                                 kMaxHeaderBytes >> 10));
  if (ec == http::error::body_limit) return fail(413, "the request body is larger than the server accepts");
  if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == net::error::eof ||
      ec == net::error::connection_reset || ec == net::error::operation_aborted || ec == net::error::bad_descriptor)
    return close();
  if (ec) return fail(400, fmt::format("malformed HTTP request: {}", ec.message()));
  const auto& req = parser_->get();
  const auto expect = req.find(http::field::expect);
  if (expect != req.end() && !parser_->is_done()) {
    if (!boost::beast::iequals(expect->value(), "100-continue"))
      return fail(400, "unsupported Expect header (only 100-continue)");  // RFC 9110 wants 417; one clear error
    send("HTTP/1.1 100 Continue\r\n\r\n", false);
  }
  read_body();
}

void Connection::read_body() {
  if (parser_->is_done()) return dispatch();
  arm(read_timer_, read_gen_, t_.opt.body_timeout_s);
  http::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
    self->disarm(self->read_timer_, self->read_gen_);
    if (self->closed_) return;
    if (ec == http::error::body_limit) return self->fail(413, "the request body is larger than the server accepts");
    if (ec == net::error::eof || ec == http::error::end_of_stream || ec == http::error::partial_message ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted)
      return self->close();
    if (ec) return self->fail(400, fmt::format("malformed HTTP request body: {}", ec.message()));
    self->dispatch();
  });
}

void Connection::dispatch() {
  reading_ = false;
  http::request<http::string_body> req = parser_->release();
  parser_.reset();
  keep_alive_ = req.keep_alive();
  HttpRequest r;
  r.method = std::string(req.method_string());
  const std::string target(req.target());
  r.path = target.substr(0, target.find('?'));
  if (auto a = req.find(http::field::authorization); a != req.end()) r.authorization = std::string(a->value());
  r.body = std::move(req.body());
  exchange_ = std::make_shared<ExchangeImpl>(shared_from_this());
  watch();
  try {
    t_.handle(exchange_, std::move(r));
  } catch (const std::exception& e) {  // never out of the I/O thread: this request gets a 500, the server goes on
    const std::string body = t_.error_body(500, fmt::format("internal error: {}", e.what()));
    exchange_->reply(500, "application/json", body);
  }
}

// While a request is handled: read ahead (a pipelined request, kept in the buffer) and notice a client that closes
// or resets the connection.
void Connection::watch() {
  if (watching_ || closed_ || reading_ || buffer_.size() >= kMaxBuffered) return;
  watching_ = true;
  socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](error_code ec, size_t n) {
    self->watching_ = false;
    self->buffer_.commit(n);
    if (self->closed_ || self->lingering_) return;
    if (ec && ec != net::error::operation_aborted) return self->close();  // gone: eof, reset
    if (self->exchange_) return self->watch();  // still handling: go on watching
    if (!self->writing_) self->read_next();     // the response is written: the next request
  });
}

void Connection::send(std::string bytes, bool last) {
  if (closed_) return;
  out_.emplace_back(std::move(bytes), last);
  if (!writing_) write_next();
}

void Connection::write_next() {
  if (out_.empty() || closed_) return;
  writing_ = true;
  arm(write_timer_, write_gen_, t_.opt.write_timeout_s);
  net::async_write(socket_, net::buffer(out_.front().first), [self = shared_from_this()](error_code ec, size_t) {
    self->disarm(self->write_timer_, self->write_gen_);
    self->writing_ = false;
    if (self->closed_) return;
    if (ec) return self->close();  // the client went away (or stopped reading: the timer closed the socket)
    const bool last = self->out_.front().second;
    self->out_.pop_front();
    if (!last) return self->write_next();
    // A response is written.
    if (std::shared_ptr<ExchangeImpl> x = std::move(self->exchange_)) x->done();
    if (self->after_exchange_ || !self->keep_alive()) {
      if (self->watching_) self->socket_.cancel();  // the watch's read ends; lingering drains instead
      return self->linger();
    }
    if (self->watching_) {
      self->socket_.cancel();  // the watch's read ends (operation_aborted), then reads the next request
      return;
    }
    self->read_next();
  });
}

void Connection::fail(int status, const std::string& message) {
  ++t_.bad;
  reading_ = false;
  keep_alive_ = false;
  after_exchange_ = true;
  const std::string body = t_.error_body(status, message);
  send(head(status, "application/json", long(body.size()), false) + body, true);
}

void ExchangeImpl::reply(int status, std::string content_type, std::string body) {
  post([self = shared_from_this(), status, ct = std::move(content_type), b = std::move(body)]() mutable {
    if (self->over_ || self->conn_->closed()) return;
    self->conn_->send(head(status, ct, long(b.size()), self->conn_->keep_alive()) + b, true);
  });
}

void ExchangeImpl::stream_begin(std::string content_type) {
  post([self = shared_from_this(), ct = std::move(content_type)] {
    if (self->over_ || self->conn_->closed()) return;
    self->conn_->send(head(200, ct, -1, self->conn_->keep_alive()), false);
  });
}

void ExchangeImpl::stream_write(std::string data) {
  post([self = shared_from_this(), d = std::move(data)] {
    if (self->over_ || self->conn_->closed() || d.empty()) return;
    self->conn_->send(chunk(d), false);
  });
}

void ExchangeImpl::stream_end() {
  post([self = shared_from_this()] {
    if (self->over_ || self->conn_->closed()) return;
    self->conn_->send("0\r\n\r\n", true);
  });
}

void ExchangeImpl::post(std::function<void()> fn) { net::post(conn_->executor(), std::move(fn)); }

void ExchangeImpl::on_gone(std::function<void()> fn) {
  post([self = shared_from_this(), f = std::move(fn)]() mutable {
    if (self->gone_) return f();
    if (!self->over_) self->gone_fns_.push_back(std::move(f));
  });
}

void ExchangeImpl::on_done(std::function<void()> fn) {
  post([self = shared_from_this(), f = std::move(fn)]() mutable {
    if (self->over_) return f();
    self->done_fns_.push_back(std::move(f));
  });
}

void ExchangeImpl::gone() {
  if (over_) return;
  gone_ = true;
  for (auto& f : std::exchange(gone_fns_, {})) f();
  done();
}

void ExchangeImpl::done() {
  if (over_) return;
  over_ = true;
  gone_fns_.clear();
  for (auto& f : std::exchange(done_fns_, {})) f();
}

}  // namespace transport

void HttpTransport::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](error_code ec, tcp::socket s) {
    if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {  // out of file descriptors, ...: try again shortly instead of spinning
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](error_code e) {
        if (!e) accept();
      });
      return;
    }
    ++total;
    if (open >= opt.max_connections) {
      ++refused;
      error_code ignored;
      s.close(ignored);
    } else {
      error_code ignored;
      s.set_option(tcp::no_delay(true), ignored);
      auto c = std::make_shared<transport::Connection>(std::move(s), *this);
      {
        std::lock_guard<std::mutex> lk(conns_mu);
        std::erase_if(conns, [](const std::weak_ptr<transport::Connection>& w) { return w.expired(); });
        conns.push_back(c);
      }
      c->start();
    }
    accept();
  });
}

HttpTransport::HttpTransport(TransportOptions opt, Handler handle, ErrorBody error_body) {
  opt.validate();
  impl_ = std::make_unique<Impl>(std::move(opt), std::move(handle), std::move(error_body), closing_);
}

HttpTransport::~HttpTransport() = default;  // the io_context's destructor destroys what is still queued in it

int HttpTransport::bind(const std::string& host, int port) {
  Impl& m = *impl_;
  error_code ec;
  tcp::resolver resolver(m.ioc);
  const auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  KVQ_CHECK(!ec && !results.empty(), "serve: cannot listen on {}:{}: {}", host, port,
            ec ? ec.message() : "no such address");
  const tcp::endpoint ep = results.begin()->endpoint();
  m.acceptor.open(ep.protocol(), ec);
  if (!ec) m.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) m.acceptor.bind(ep, ec);
  if (!ec) m.acceptor.listen(kListenBacklog, ec);
  KVQ_CHECK(!ec, "serve: cannot listen on {}:{} ({}: in use, or not an address of this machine)", host, port,
            ec.message());
  return m.acceptor.local_endpoint().port();
}

void HttpTransport::run() {
  Impl& m = *impl_;
  net::post(m.accept_strand, [&m] { m.accept(); });
  std::vector<std::thread> threads;
  for (int i = 1; i < m.opt.io_threads; ++i) threads.emplace_back([&m] { m.ioc.run(); });
  m.ioc.run();
  for (std::thread& t : threads) t.join();
}

void HttpTransport::stop() {
  if (!impl_) return;
  // Closes the acceptor and every connection on their strands; run() returns once nothing is left to do.
  net::post(impl_->accept_strand, [m = impl_.get()] {
    error_code ignored;
    m->acceptor.close(ignored);
    m->accept_retry.cancel();
    std::lock_guard<std::mutex> lk(m->conns_mu);
    for (const std::weak_ptr<transport::Connection>& w : m->conns)
      if (std::shared_ptr<transport::Connection> c = w.lock()) net::post(c->executor(), [c] { c->close(); });
    m->conns.clear();
  });
}

TransportStats HttpTransport::stats() const {
  const Impl& m = *impl_;
  return {m.open.load(), m.total.load(), m.refused.load(), m.timeouts.load(), m.bad.load()};
}

}  // namespace kvq::server
