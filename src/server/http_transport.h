// kvq serve's HTTP/1.1 transport: event-driven on Boost.Asio, requests parsed by Boost.Beast's parser. A fixed number
// of I/O threads (TransportOptions::io_threads) serves every connection, so idle and slow connections cost a socket
// and a few KiB, never a thread, and cannot keep other clients waiting:
//
//   - a connection waits at most idle_timeout_s for the first byte of a request (a new or a kept-alive connection),
//     then at most header_timeout_s for the rest of its headers and body_timeout_s for its body; a client that is
//     slower (a slowloris trickling its headers) is closed when its deadline passes, whatever it sends meanwhile;
//   - headers over kMaxHeaderBytes get 431 at once, a body over max_body_bytes (a Content-Length, or chunks) 413 at
//     once, a malformed request 400; each closes the connection;
//   - a response write that does not finish within write_timeout_s (a client that stops reading) closes the
//     connection;
//   - requests are answered one at a time per connection, in the order they came: pipelined requests are read after
//     the response before them is written;
//   - while a request is handled, the connection is watched: a client that closes or resets it is reported to the
//     handler (Exchange::on_gone: the server cancels its engine request), streaming or not;
//   - "Expect: 100-continue" is answered before the body is read; HTTP/1.0 and "Connection: close" close after the
//     response.
// Beyond max_connections open connections a new one is closed at once. The handler is called on the connection's
// I/O thread and must not block: work that takes time goes to the server's own workers.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace kvq::server {

constexpr size_t kMaxHeaderBytes = size_t(16) << 10;  // the request line and every header together

struct TransportOptions {
  int io_threads = 2;               // threads that serve every connection (not per connection or request)
  int max_connections = 4096;       // open connections at most; more are closed at once
  size_t max_body_bytes = size_t(8) << 20;  // larger request bodies: 413
  double idle_timeout_s = 5;        // waiting for a request's first byte (keep-alive included)
  double header_timeout_s = 10;     // from its first byte to the end of its headers
  double body_timeout_s = 30;       // from the end of its headers to the end of its body
  double write_timeout_s = 30;      // one write of a response (a chunk of a stream) to the client
  void validate() const;            // kvq::Error naming a value out of range
};

// What the transport counts (gauges and counters for /metrics).
struct TransportStats {
  int64_t connections_open = 0;     // now
  int64_t connections_total = 0;   // accepted since start
  int64_t connections_refused = 0;  // closed at once: max_connections open already
  int64_t timeouts = 0;             // connections closed at a read or write deadline
  int64_t bad_requests = 0;         // malformed (400), oversize headers (431) or bodies (413)
};

// One parsed request.
struct HttpRequest {
  std::string method;         // "GET", "POST", ...
  std::string path;           // the target without its query string
  std::string authorization;  // the Authorization header ("" when absent)
  std::string body;
};

// One request's response channel. Every method may be called from any thread; they run in order on the
// connection's I/O thread (its strand).
class Exchange {
 public:
  virtual ~Exchange() = default;
  // A whole response; the exchange is over once it is written.
  virtual void reply(int status, std::string content_type, std::string body) = 0;
  // A chunked 200 response: its header, then chunks as they come, then its end (the exchange is over once written).
  virtual void stream_begin(std::string content_type) = 0;
  virtual void stream_write(std::string chunk) = 0;
  virtual void stream_end() = 0;
  // Runs fn on the connection's strand, after what was posted before.
  virtual void post(std::function<void()> fn) = 0;
  // fn runs once, on the strand, if the client goes away before the response is written (it closed or reset the
  // connection, or stopped reading for write_timeout_s); at once when it has gone already. Several may be set.
  virtual void on_gone(std::function<void()> fn) = 0;
  // fn runs once, on the strand, when the exchange is over: its response written, or the connection gone (at once
  // when it is over already). Several may be set.
  virtual void on_done(std::function<void()> fn) = 0;
};

class HttpTransport {
 public:
  // handle(exchange, request): on the connection's I/O thread, must not block. error_body(status, message): the body
  // of the transport's own error responses (400, 413, 431).
  using Handler = std::function<void(std::shared_ptr<Exchange>, HttpRequest)>;
  using ErrorBody = std::function<std::string(int status, const std::string& message)>;
  HttpTransport(TransportOptions opt, Handler handle, ErrorBody error_body);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Binds host:port (0: any free port) with a listen backlog of kListenBacklog; returns the port. kvq::Error when it
  // cannot.
  int bind(const std::string& host, int port);
  void run();    // serves on io_threads threads (the caller's among them) until stop(); blocking
  void stop();   // stops now: connections are closed, responses in progress cut
  // From now on every response closes its connection after it is written (a server that drains).
  void close_after_responses() { closing_ = true; }
  TransportStats stats() const;

  static constexpr int kListenBacklog = 4096;

  struct Impl;  // the io_context, the acceptor and the connections (http_transport.cpp)

 private:
  std::atomic<bool> closing_{false};
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvq::server
