// kvq bench decode: prefill and decode speed of a model through the configured KV cache.
#include <chrono>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "common/error.h"

namespace kvq::cli {

namespace {

struct BenchDecodeOptions {
  ModelOptions model;
  CacheOptions cache;
  int ctx = 512;
  int n_decode = 32;
  bool json = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void bench_decode(const BenchDecodeOptions& o) {
  KVQ_CHECK(o.ctx >= 1, "--ctx-size must be >= 1");
  const Plan p = plan(o.model, o.cache, o.ctx + o.n_decode);
  auto model = load_model(o.model, p);
  Model& m = *model;
  const ModelConfig& c = m.config();
  KvCache cache(p.cache, c.n_layers, c.n_kv_heads, c.head_dim, p.ctx);
  log_cache(cache, "bench:");
  std::mt19937 rng(1234);
  std::vector<int32_t> ids(size_t(o.ctx));
  for (auto& id : ids) id = int32_t(rng() % uint32_t(c.vocab_size));
  const int seq = cache.new_sequence(), chunk = cache.config().max_chunk;
  std::vector<float> logits(size_t(chunk) * c.vocab_size);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.ctx; i += chunk)
    m.forward(cache, seq, ids.data() + i, std::min(chunk, o.ctx - i), logits.data(), false);
  const double prefill_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  int32_t next = 1;
  for (int i = 0; i < o.n_decode; ++i) {
    m.forward(cache, seq, &next, 1, logits.data(), false);
    next = int32_t(std::max_element(logits.begin(), logits.begin() + c.vocab_size) - logits.begin());
  }
  const double decode_s = seconds_since(t0);
  const CacheFootprint f = cache.footprint(o.ctx);
  const double prefill_tps = o.ctx / prefill_s, decode_tps = o.n_decode / decode_s;
  if (o.json) {
    nlohmann::json j = {{"model", o.model.dir}, {"ctx", o.ctx}, {"n_decode", o.n_decode},
                        {"threads", m.pool().size()}, {"cache", cache.config().describe()},
                        {"kv_bits_effective", f.bits_per_element}, {"load_seconds", m.load_seconds()},
                        {"prefill_tokens_per_second", prefill_tps}, {"decode_tokens_per_second", decode_tps},
                        {"decode_ms_per_token", 1e3 * decode_s / o.n_decode}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("load %.3f s | prefill %d tokens: %.1f tok/s | decode %d tokens at ctx %d: %.1f tok/s (%.2f ms/token)"
                " | %d threads | %s\n",
                m.load_seconds(), o.ctx, prefill_tps, o.n_decode, o.ctx, decode_tps, 1e3 * decode_s / o.n_decode,
                m.pool().size(), cache.config().describe().c_str());
  }
}

}  // namespace

void add_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks (decode)");
  bench->require_subcommand(1);
  auto o = std::make_shared<BenchDecodeOptions>();
  CLI::App* dec = bench->add_subcommand("decode", "prefill and decode tokens/s of a model");
  add_model_options(dec, o->model);
  add_cache_options(dec, o->cache);
  dec->add_option("-c,--ctx-size", o->ctx, "tokens to prefill before decoding");
  dec->add_option("-n,--n-decode", o->n_decode, "tokens to decode")->check(CLI::Range(1, 1 << 20));
  dec->add_flag("--json", o->json, "print one JSON object");
  dec->callback([o] { bench_decode(*o); });
}

}  // namespace kvq::cli
