#include "server/metrics.h"

#include <fmt/format.h>

namespace kvq::server {

namespace {

// A label value: backslash, double quote and newline escaped.
std::string label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} {2}\n{0} {3}\n", name, help, type, value);
}

void histogram(std::string& out, const char* name, const char* help, const Histogram& h) {
  out += fmt::format("# HELP {0} {1}\n# TYPE {0} histogram\n", name, help);
  uint64_t cum = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cum += h.counts[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, h.bounds[i], cum);
  }
  out += fmt::format("{0}_bucket{{le=\"+Inf\"}} {1}\n{0}_sum {2}\n{0}_count {1}\n", name, h.count, h.sum);
}

}  // namespace

std::string render_metrics(const EngineStats& s, const std::string& model, const CacheConfig& cache,
                           const TransportStats& http) {
  std::string out;
  out += fmt::format(
      "# HELP kvq_cache_info The KV cache of the served model.\n# TYPE kvq_cache_info gauge\n"
      "kvq_cache_info{{model=\"{}\",cache_type_k=\"{}\",cache_type_v=\"{}\",group_k=\"{}\",group_v=\"{}\","
      "sink=\"{}\",recent=\"{}\",page_tokens=\"{}\",rotation=\"{}\"}} 1\n",
      label(model), label(cache.k.type), label(cache.v.type), cache.k.group, cache.v.group, cache.sink, cache.recent,
      cache.page_tokens, label(cache.rotation()));
  metric(out, "kvq_requests_running", "gauge", "Requests running (admitted, holding a sequence).", s.running);
  metric(out, "kvq_requests_waiting", "gauge", "Requests queued, not yet admitted (preempted ones included).",
         s.waiting);
  out += "# HELP kvq_requests_finished_total Requests finished, by finish reason.\n"
         "# TYPE kvq_requests_finished_total counter\n";
  out += fmt::format("kvq_requests_finished_total{{reason=\"stop\"}} {}\n", s.finished_stop);
  out += fmt::format("kvq_requests_finished_total{{reason=\"length\"}} {}\n", s.finished_length);
  out += fmt::format("kvq_requests_finished_total{{reason=\"cancelled\"}} {}\n", s.finished_cancelled);
  out += fmt::format("kvq_requests_finished_total{{reason=\"error\"}} {}\n", s.finished_error);
  out += fmt::format("kvq_requests_finished_total{{reason=\"queue_timeout\"}} {}\n", s.finished_queue_timeout);
  out += fmt::format("kvq_requests_finished_total{{reason=\"deadline\"}} {}\n", s.finished_deadline);
  metric(out, "kvq_prompt_tokens_total", "counter", "Prompt tokens of requests that got their first token.",
         double(s.prompt_tokens));
  metric(out, "kvq_generation_tokens_total", "counter", "Tokens generated.", double(s.generated_tokens));
  metric(out, "kvq_preemptions_total", "counter", "Requests preempted (their cache freed, to be recomputed).",
         double(s.preemptions));
  metric(out, "kvq_engine_steps_total", "counter", "Forward steps of the engine.", double(s.steps));
  metric(out, "kvq_engine_step_failures_total", "counter",
         "Engine steps that threw (their requests ended with an error; the engine went on).", double(s.step_failures));
  metric(out, "kvq_engine_healthy", "gauge", "1 while the engine can serve, 0 once its device is lost.",
         s.healthy ? 1 : 0);
  metric(out, "kvq_kv_pages_used", "gauge", "KV cache pages held by sequences.", s.pages_used);
  metric(out, "kvq_kv_pages_free", "gauge", "KV cache pages free.", s.pages_free);
  metric(out, "kvq_kv_sequences_live", "gauge", "KV cache sequence slots in use.", s.slots_live);
  metric(out, "kvq_kv_sequence_slots", "gauge", "KV cache sequence slots.", s.slots);
  metric(out, "kvq_kv_bytes_used", "gauge", "KV cache bytes held: pages in use and the windows of live sequences.",
         double(s.bytes_used));
  metric(out, "kvq_kv_bytes_free", "gauge", "KV cache bytes free: free pages and the windows of free slots.",
         double(s.bytes_free));
  metric(out, "kvq_kv_bytes_total", "gauge", "KV cache bytes allocated (pages and every slot's windows).",
         double(s.bytes_total));
  metric(out, "kvq_prefix_cache_enabled", "gauge", "1 when prefix caching is on.", s.prefix.enabled ? 1 : 0);
  metric(out, "kvq_prefix_cache_hit_tokens_total", "counter",
         "Prompt tokens of admitted requests taken from the prefix cache.", double(s.prefix.hit_tokens));
  metric(out, "kvq_prefix_cache_miss_tokens_total", "counter",
         "Prompt tokens of admitted requests that were prefilled.", double(s.prefix.miss_tokens));
  metric(out, "kvq_prefix_cache_entries", "gauge", "Cached prefixes.", double(s.prefix.entries));
  metric(out, "kvq_prefix_cache_pages", "gauge", "KV cache pages held only by cached prefixes (reclaimable).",
         double(s.prefix.pages));
  metric(out, "kvq_prefix_cache_state_bytes", "gauge",
         "Bytes cached prefixes keep besides their pages (windows, partly filled pages).",
         double(s.prefix.state_bytes));
  metric(out, "kvq_prefix_cache_evictions_total", "counter", "Cached prefixes evicted (least recently used first).",
         double(s.prefix.evictions));
  metric(out, "kvq_http_connections", "gauge", "HTTP connections open.", double(http.connections_open));
  metric(out, "kvq_http_connections_total", "counter", "HTTP connections accepted.", double(http.connections_total));
  metric(out, "kvq_http_connections_refused_total", "counter",
         "HTTP connections closed at once: the most the server keeps open were open.",
         double(http.connections_refused));
  metric(out, "kvq_http_timeouts_total", "counter",
         "HTTP connections closed at a deadline (idle, slow headers or body, a client that does not read).",
         double(http.timeouts));
  metric(out, "kvq_http_bad_requests_total", "counter",
         "Malformed requests, oversize headers or bodies (400, 431, 413).", double(http.bad_requests));
  histogram(out, "kvq_time_to_first_token_seconds", "From arrival to the first generated token.", s.ttft);
  histogram(out, "kvq_inter_token_latency_seconds", "Between consecutive tokens of a request.", s.itl);
  histogram(out, "kvq_request_duration_seconds", "From arrival to the last token.", s.e2e);
  return out;
}

}  // namespace kvq::server
