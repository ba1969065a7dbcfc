// kvq serve: an OpenAI-compatible HTTP server (server/http_server.h) over the continuous-batching engine
// (engine/engine.h), with llama-server's flags. SIGTERM / SIGINT drain: new requests get 503, those in flight
// finish, then the process exits 0; a second signal stops at once.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "cli/options.h"
#include "common/error.h"
#include "engine/engine.h"
#include "engine/fault_injector.h"
#include "server/http_server.h"

namespace kvq::cli {

namespace {

struct ServeOptions {
  ModelOptions model;
  CacheOptions cache;
  int ctx = 0;            // -c: tokens per sequence (0: the model's maximum)
  int parallel = 4;       // -np: running sequences at most
  int max_queue = 64;     // queued requests beyond the running ones
  double queue_timeout = 0;    // --queue-timeout S: a request not admitted after S seconds gets 503 (0: none)
  double request_timeout = 0;  // --request-timeout S: a request not finished S seconds after arrival gets 504
  bool test_hooks = false;       // --test-hooks: POST /debug/fault arms a fault in the next engine step (tests only)
  bool no_prefix_cache = false;  // --no-prefix-cache
  bool host_sampling = false;    // --host-sampling
  std::string chat_template;  // --chat-template NAME (default: the model's)
  server::ServerOptions http;
};

// "at 1024: 12, at 4096: 3, at 8192: 1": the sequences the empty pool holds at a few lengths up to ctx.
std::string concurrency_line(const PagePool& pool, int ctx) {
  std::string s;
  for (int n : {1024, 4096, 32768, ctx})
    if (n <= ctx && (n == ctx || n * 2 <= ctx))
      s += fmt::format("{}{} at {} tokens", s.empty() ? "" : ", ", pool.sequences_at(n), n);
  return s;
}

// SIGTERM / SIGINT reach whichever thread the kernel picks (OpenBLAS starts its threads before main), so the handler
// only writes the signal's number to a pipe; one thread reads it and drains.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const char c = char(sig);
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &c, 1);
}

int next_signal() {  // blocks; 0: woken by the process itself
  char c = 0;
  while (read(g_signal_pipe[0], &c, 1) < 0 && errno == EINTR) {
  }
  return c;
}

void serve(const ServeOptions& o) {
  KVQ_CHECK(pipe(g_signal_pipe) == 0, "serve: pipe: {}", std::strerror(errno));
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that went away is a failed write, not a signal

  const Plan p = plan(o.model, o.cache, o.ctx);
  // --dummy-weights (timing only): no tokenizer and no chat template: the server takes token ids and replies with
  // token counts (server/http_server.h); random weights sample ids that no tokenizer need have.
  const bool dummy = o.model.dummy_weights;
  KVQ_CHECK(!dummy || o.chat_template.empty(),
            "serve: --chat-template needs text; with --dummy-weights the server takes token ids only");
  const std::optional<Tokenizer> tok = dummy ? std::nullopt : std::optional<Tokenizer>(load_tokenizer(o.model));
  const std::optional<server::ChatTemplate> chat =
      dummy ? std::nullopt : server::load_chat_template(o.model.dir, o.chat_template);
  server::ServerOptions http = o.http;
  if (http.model_name.empty()) http.model_name = std::filesystem::path(o.model.dir).lexically_normal().filename();
  if (http.model_name.empty() || http.model_name == ".") http.model_name = "kvq";
  ModelSource model = load_model_source(o.model, p);
  auto runner = make_runner(model, o.model, p, p.ctx, o.parallel);
  // --test-hooks: the engine runs through a fault injector (POST /debug/fault), so the tests of a failing step and of
  // a lost device drive the real binary.
  std::optional<FaultInjectingRunner> faults;
  if (o.test_hooks) faults.emplace(*runner);
  Runner& r = faults ? static_cast<Runner&>(*faults) : *runner;
  log_runner(r, "serve:");
  EngineConfig ec;
  ec.scheduler.max_seqs = o.parallel;
  ec.max_queue = o.max_queue;
  ec.queue_timeout_s = o.queue_timeout;
  ec.request_timeout_s = o.request_timeout;
  ec.scheduler.prefix_cache = !o.no_prefix_cache;
  ec.scheduler.device_sampling = !o.host_sampling;
  Engine engine(r, ec);
  const PagePool& pool = r.page_pool();
  const ModelConfig& mc = r.config();
  std::fprintf(stderr, "kvq: serve: model '%s' (%s, %d layers, vocab %d, context %d), chat template %s\n",
               http.model_name.c_str(), std::string(arch_name(mc.arch)).c_str(), mc.n_layers, mc.vocab_size, p.ctx,
               chat ? (chat->name + " (" + chat->source + ")").c_str() : "none (chat requests are refused)");
  if (dummy)
    std::fprintf(stderr, "kvq: serve: dummy weights: timing only; no tokenizer: prompts of token ids on "
                 "/v1/completions, replies with token counts, not text\n");
  std::fprintf(stderr,
               "kvq: serve: KV cache %s: %.1f MiB, %d pages x %d tokens (a sequence's windows take %d), %d sequence "
               "slots, holds %d tokens in sequences of %d; concurrent sequences: %s\n",
               r.cache_config().describe().c_str(), double(pool.bytes()) / double(1 << 20), pool.n_pages(),
               pool.layout().page_tokens, pool.layout().window_pages(), pool.n_slots(),
               pool.sequences_at(p.ctx) * p.ctx, p.ctx, concurrency_line(pool, p.ctx).c_str());
  std::fprintf(stderr, "kvq: serve: %d running at most (-np), %d queued (--max-queue), %d tokens per step (prefill "
               "chunks of %d)%s\n",
               engine.scheduler_config().max_seqs, o.max_queue, engine.scheduler_config().token_budget,
               r.cache_config().max_chunk, http.api_key.empty() ? "" : ", API key required");
  std::fprintf(stderr, "kvq: serve: HTTP: %d I/O threads, %d workers, %d connections at most; timeouts: idle %g s, "
               "headers %g s, body %g s, write %g s, queue %s, request %s%s\n",
               http.http.io_threads, http.workers, http.http.max_connections, http.http.idle_timeout_s,
               http.http.header_timeout_s, http.http.body_timeout_s, http.http.write_timeout_s,
               o.queue_timeout > 0 ? fmt::format("{:g} s", o.queue_timeout).c_str() : "none",
               o.request_timeout > 0 ? fmt::format("{:g} s", o.request_timeout).c_str() : "none",
               o.test_hooks ? "; test hooks on (POST /debug/fault)" : "");
  std::fprintf(stderr, "kvq: serve: sampling: %s\n",
               !r.gumbel_sampling() ? "on the host, from each row of logits"
               : o.host_sampling    ? "on the host, from each row of logits (--host-sampling)"
                                    : fmt::format("on the device for temperature alone (Gumbel-max), top_k <= {} "
                                                  "and top_p / min_p (the rows' largest logits; a wider nucleus reads "
                                                  "its row); bias, penalties and logprobs on the host",
                                                  r.max_top_logits())
                                          .c_str());
  std::fprintf(stderr, "kvq: serve: prefix cache: %s\n",
               o.no_prefix_cache ? "off (--no-prefix-cache)"
                                 : "on (prompt states at every chunk boundary; pages shared, evicted least recently "
                                   "used first)");

  server::HttpServer srv(engine, tok ? &*tok : nullptr, mc, r.cache_config(), p.ctx, chat, http,
                         faults ? &*faults : nullptr);
  const int port = srv.bind();
  std::fprintf(stderr, "kvq: serve: listening on http://%s:%d\n", http.host.c_str(), port);

  std::thread signals([&] {
    const int sig = next_signal();
    if (sig == 0) return;
    std::fprintf(stderr, "kvq: serve: %s: draining %d request(s), then exiting (again: stop now)\n",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT", engine.in_flight());
    std::thread drain([&] { srv.drain(); });
    if (next_signal() != 0) {
      std::fprintf(stderr, "kvq: serve: second signal: stopping now\n");
      srv.stop();
    }
    drain.join();
  });
  srv.run();
  const char wake = 0;  // the signal thread, wherever it waits
  [[maybe_unused]] const ssize_t n = write(g_signal_pipe[1], &wake, 1);
  signals.join();
  std::fprintf(stderr, "kvq: serve: stopped\n");
}

}  // namespace

void add_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "an OpenAI-compatible HTTP server with continuous batching");
  add_model_options(cmd, o->model);
  add_cache_options(cmd, o->cache);
  add_kv_budget_option(cmd, o->cache);
  add_device_options(cmd, o->model);
  add_fold_values_option(cmd, o->model);
  cmd->add_option("-c,--ctx-size", o->ctx, "tokens per sequence: prompt + completion (0: the model's maximum)");
  cmd->add_option("--parallel", o->parallel, "sequences running at once (alias -np)")->check(CLI::Range(1, 4096));
  cmd->add_option("--max-queue", o->max_queue, "requests queued beyond the running ones; more get 429")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--queue-timeout", o->queue_timeout,
                  "seconds a request may wait in the queue before it is refused with 503 (0: no limit)")
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--request-timeout", o->request_timeout,
                  "seconds from a request's arrival to its last token before it is ended with 504 (0: no limit)")
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--http-threads", o->http.http.io_threads,
                  "I/O threads that serve every HTTP connection (not one per connection or request)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--workers", o->http.workers, "threads that parse and tokenize completion requests")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--max-connections", o->http.http.max_connections,
                  "HTTP connections open at most; more are closed at once")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--idle-timeout", o->http.http.idle_timeout_s,
                  "seconds a connection may wait for a request's first byte (keep-alive included)")
      ->check(CLI::Range(0.001, 86400.0));
  cmd->add_option("--header-timeout", o->http.http.header_timeout_s,
                  "seconds from a request's first byte to the end of its headers")
      ->check(CLI::Range(0.001, 86400.0));
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache,
                "do not keep the states of prompts for later requests that share their prefix (on by default)");
  cmd->add_flag("--host-sampling", o->host_sampling,
                "GPU: copy every sampled row of logits to the host and sample there, instead of drawing on the device "
                "(temperature alone) or selecting a row's largest logits there (top_k, top_p, min_p); for comparison: "
                "the same tokens");
  cmd->add_flag("--lenient-fields", o->http.lenient_fields,
                "ignore unknown request fields (vLLM's extra_body ones; each name logged once) instead of refusing "
                "them");
  cmd->add_flag("--test-hooks", o->test_hooks,
                "tests only: POST /debug/fault {\"fault\": \"error\" | \"bad_alloc\" | \"device_lost\"} makes the next "
                "engine step fail");
  cmd->add_option("--host", o->http.host, "address to listen on");
  cmd->add_option("--port", o->http.port, "port to listen on (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->http.api_key, "require \"Authorization: Bearer KEY\" on /v1/*");
  cmd->add_option("--alias", o->http.model_name, "the model's id in the API (default: the model directory's name)");
  cmd->add_option("--chat-template", o->chat_template,
                  "chat template by name: " + server::chat_template_names() + " (default: the model's chat_template)");
  cmd->callback([o] { serve(*o); });
}

}  // namespace kvq::cli
