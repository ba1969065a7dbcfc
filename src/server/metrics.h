// GET /metrics: the engine's counters in the Prometheus text format (version 0.0.4), names prefixed kvq_.
#pragma once

#include <string>

#include "engine/engine.h"
#include "kv/cache.h"
#include "server/http_transport.h"

namespace kvq::server {

// model: the served name; cache: the cache's configuration (its types and windows go in kvq_cache_info's labels);
// http: the transport's connection counters.
std::string render_metrics(const EngineStats& s, const std::string& model, const CacheConfig& cache,
                           const TransportStats& http = {});

}  // namespace kvq::server
