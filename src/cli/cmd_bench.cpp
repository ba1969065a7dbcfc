// kvq bench decode: prefill and decode speed of a model through the configured KV cache, the share of the read probe
// a decode step reaches, at a given concurrency or (--seqs max) at what the KV budget holds, optionally against the
// bf16 cache in the same call (--vs-bf16); with --dummy-weights at real model shapes (models/shapes/, timing only).
// kvq bench attention: decode-step attention over a KvCache filled with random rows (no model), against the
// bf16 cache of the same shapes, with bytes read, GB/s, the append cost and the machine's read bandwidth.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>


#include <nlohmann/json.hpp>

#include "attention/attention.h"
#include "attention/attention_bench.h"
#include "calib/pnmix.h"
#include "cli/attention_cost.h"
#include "cli/bench_cuda.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "common/thread_pool.h"
#include "engine/scheduler.h"
#include "rotation/rotation_file.h"

namespace kvq::cli {

namespace {

struct BenchDecodeOptions {
  ModelOptions model;
  CacheOptions cache;
  std::vector<int> ctx = {512};  // contexts to prefill before decoding, one run each
  int n_decode = 32;             // timed decode steps
  int warmup = 4;                // untimed decode steps before them (the first steps of a shape capture its CUDA graph)
  std::string seqs = "1";        // concurrent sequences (one token each per decode step), or "max": what the KV
                                 // budget holds at each context
  bool vs_bf16 = false;          // also run the bf16 cache of the same windows first, and print the ratio
  bool beyond_trained_ctx = false;  // allow ctx past max_position_embeddings (throughput only)
  bool fill_cache = false;  // --device cuda: random K/V rows instead of a prefill through the model (decode only)
  bool json = false;
  int decode_steps() const { return warmup + n_decode; }  // tokens each sequence decodes past its prefill
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The bf16 cache a quantized one is timed against: the same windows (bf16 rows), page and chunk, none of its quantizer
// flags.
CacheOptions bf16_options(const CacheOptions& c) {
  CacheOptions bf = c;
  bf.type_both.clear();
  bf.type_k = bf.type_v = "bf16";
  bf.window_type.clear();  // KV4-RL's int8 windows are its own
  bf.group = 0, bf.clip_k = bf.clip_v = -1;
  bf.rotation = "none";
  bf.kv_scales.clear();    // FP8's
  bf.skip_layers.clear();  // every layer is bf16 already
  return bf;
}

constexpr double kDefaultFigureGib = 8;  // budget of the computed sequences-that-fit figure without --kv-budget-gib

// --seqs: a count, or 0 for "max".
int parse_seqs(const std::string& s) {
  if (s == "max") return 0;
  int n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  KVQ_CHECK(ec == std::errc() && end == s.data() + s.size() && n >= 1 && n <= (1 << 16),
            "--seqs '{}': give a count in [1, 65536] or max", s);
  return n;
}

// The sequences a run decodes: --seqs max (requested 0) takes what the runner's pool admits at len tokens
// (PagePool::sequences_at; the runner was built to fill its KV budget), a count must fit in it.
int sequences_to_run(const Runner& r, int requested, int len) {
  const int fit = r.page_pool().sequences_at(len);
  const double mib = double(r.cache_bytes()) / double(1 << 20);
  KVQ_CHECK(fit >= std::max(requested, 1),
            "bench decode: the KV pool ({:.1f} MiB) holds {} sequences of {} tokens, fewer than --seqs {}", mib, fit,
            len, requested > 0 ? std::to_string(requested) : "max (at least 1)");
  return requested > 0 ? requested : std::min(fit, r.max_seqs());
}

// What a decode step reads and the share of the read probe it reaches.
struct StepReads {
  double bytes = 0;  // the weights a step reads (Runner::weight_bytes) + every sequence's stored cache
  double gbps = 0;   // bytes over the step's time
  double share = 0;  // of the read probe measured in the same run
};
StepReads step_reads(double weight_bytes, double cache_bytes, double step_seconds, double probe_bytes_per_s) {
  StepReads s;
  s.bytes = weight_bytes + cache_bytes;
  s.gbps = s.bytes / step_seconds / 1e9;
  s.share = probe_bytes_per_s > 0 ? s.gbps * 1e9 / probe_bytes_per_s : 0;
  return s;
}

// The read bandwidth (bytes/s) decode steps are set against, measured in the same run before any runner: the
// device's streaming-read probe, or the CPU threads' (as bench attention).
double read_probe(const BenchDecodeOptions& o, ModelSource& m) {
  if (o.model.device == "cuda") return read_bandwidth_cuda();
  return read_bandwidth(m.host->pool(), size_t(512) << 20);
}

// --kv-budget-gib on the CPU: a KvCache built from the budget at ctx tokens per sequence, filled with sequences
// reserved to ctx until the pool refuses one.
PoolProbe probe_pool_cpu(const CacheConfig& cfg, int n_layers, int n_kv_heads, int head_dim, int ctx,
                         size_t budget_bytes) {
  KvCache cache(cfg, n_layers, n_kv_heads, head_dim, ctx, 0, budget_bytes);
  PoolProbe r;
  r.n_slots = cache.pool().n_slots(), r.n_pages = cache.pool().n_pages(), r.bytes = cache.bytes_allocated();
  try {
    for (;;) {
      const int seq = cache.new_sequence();
      for (int done = 0; done < ctx;) {  // reserve and commit without storing: pages are what is counted
        const int n = std::min(cfg.max_chunk, ctx - done);
        cache.reserve(seq, n);
        cache.commit(seq, n);
        done += n;
      }
      ++r.held;
    }
  } catch (const Error& e) {
    r.refusal = e.what();
  }
  return r;
}

struct DecodeResult {
  int seqs = 0;
  double decode_tps = 0;  // tokens/s of all sequences
};

// --fill-cache: the n_seqs sequences' caches filled to ctx tokens with random K/V rows (fill_cache_cuda), then
// o.warmup untimed and o.n_decode timed greedy decode steps through the runner, one token of every sequence each (as
// the scheduler's decode steps: the last rows, their argmax on the device, fed back). Returns the timed seconds.
double decode_filled(Runner& r, int n_seqs, int ctx, const BenchDecodeOptions& o) {
  std::vector<int> seqs;
  for (int b = 0; b < n_seqs; ++b) seqs.push_back(r.new_sequence());
  fill_cache_cuda(r, seqs, ctx);
  std::vector<int32_t> ids(seqs.size()), next(seqs.size());
  std::mt19937 rng(1234);
  for (auto& id : ids) id = int32_t(rng() % uint32_t(r.config().vocab_size));
  const std::vector<int> ones(seqs.size(), 1);
  auto step = [&] {
    r.forward(seqs, ones, ids.data(), LogitRows::Last, nullptr, next.data());
    ids.swap(next);
  };
  for (int i = 0; i < o.warmup; ++i) step();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.n_decode; ++i) step();
  r.synchronize();
  const double s = seconds_since(t0);
  for (int seq : seqs) r.free_sequence(seq);
  return s;
}

// One context and cache, through the one request loop (engine/scheduler.h, prefill first): the sequences (--seqs, or
// what the KV budget holds) as requests of ctx random ids are prefilled (no logits but each one's last row), then
// o.warmup untimed and o.n_decode timed batched greedy decode steps, each one token of every sequence (each feeds
// back its own argmax); with --fill-cache the caches are filled with random K/V instead (decode_filled). base: the
// bf16 run of the same context (--vs-bf16), whose ratio is printed.
DecodeResult bench_decode_one(const BenchDecodeOptions& o, ModelSource& m, const Plan& p, int ctx, int requested,
                              double probe, const DecodeResult* base) {
  const ModelConfig& c = m.config;
  const int len = ctx + o.decode_steps();
  auto runner = make_runner(m, o.model, p, len, requested);
  Runner& r = *runner;
  log_runner(r, "bench:");
  const int n_seqs = sequences_to_run(r, requested, len);
  double prefill_s = 0, decode_s = 0;  // prefill: 0 with --fill-cache (not timed)
  if (o.fill_cache) {
    decode_s = decode_filled(r, n_seqs, ctx, o);
  } else {
    SchedulerConfig sc;
    sc.max_seqs = n_seqs;
    sc.policy = SchedulerConfig::kPrefillFirst;
    Scheduler sched(r, sc);
    GenerateParams gp;
    gp.max_tokens = o.decode_steps() + 1;  // the prefill's token, then one per decode step (the last one is not fed)
    gp.sampler.temperature = 0;            // greedy: the argmax is taken where the logits are; no stop ids
    std::mt19937 rng(1234);
    for (int b = 0; b < n_seqs; ++b) {
      std::vector<int32_t> ids(static_cast<size_t>(ctx));
      for (auto& id : ids) id = int32_t(rng() % uint32_t(c.vocab_size));
      sched.add(std::make_unique<Generation>(std::move(ids), gp, nullptr));
    }
    auto step = [&](StepInfo& info) {
      int first_tokens = 0;
      for (const Scheduler::Update& u : sched.step(&info)) {
        KVQ_CHECK(u.output.finish != FinishReason::Error, "bench decode: {}", u.output.error);
        first_tokens += u.generated_tokens == 1;
      }
      return first_tokens;
    };
    auto t0 = std::chrono::steady_clock::now();
    StepInfo info;
    for (int started = 0; started < n_seqs;) started += step(info);  // prefill: every sequence to its first token
    r.synchronize();
    prefill_s = seconds_since(t0);
    auto decode_step = [&] {
      step(info);
      KVQ_CHECK(info.rows == n_seqs && info.decode_rows == n_seqs,
                "bench decode: a decode step of {} rows ({} decode) where {} sequences decode", info.rows,
                info.decode_rows, n_seqs);
    };
    for (int i = 0; i < o.warmup; ++i) decode_step();
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.n_decode; ++i) decode_step();
    r.synchronize();
    decode_s = seconds_since(t0);
    KVQ_CHECK(sched.idle(), "bench decode: {} requests left after the decode steps", sched.n_running());
  }
  // What a pool built from --kv-budget-gib really holds at ctx (allocated, not computed), with the timing runner gone.
  const CacheConfig cache_cfg = r.cache_config();
  const std::string runner_desc = r.describe();
  const size_t weight_bytes = r.weight_bytes(), cache_bytes = r.cache_bytes();
  const CacheFootprint f = r.footprint(ctx);
  runner.reset();
  std::optional<PoolProbe> held;
  if (p.kv_budget_bytes > 0)
    held = o.model.device == "cuda"
               ? probe_pool_cuda(cache_cfg, c.n_layers, c.n_kv_heads, c.head_dim, ctx, p.kv_budget_bytes)
               : probe_pool_cpu(cache_cfg, c.n_layers, c.n_kv_heads, c.head_dim, ctx, p.kv_budget_bytes);

  // KV memory from the cache's own accounting: bytes stored per sequence at ctx, and how many fit the budget.
  const double seq_bytes = f.bytes_per_token_per_layer * c.n_layers * ctx;
  const double kv_mib = seq_bytes * n_seqs / double(1 << 20);
  const double budget_gib = o.cache.kv_budget_gib > 0 ? o.cache.kv_budget_gib : kDefaultFigureGib;
  const double budget = budget_gib * double(1ull << 30);
  const long fit = long(std::floor(budget / seq_bytes));
  const double prefill_tps = o.fill_cache ? 0.0 : double(n_seqs) * ctx / prefill_s;
  const double decode_tps = double(n_seqs) * o.n_decode / decode_s;
  const double ms_step = 1e3 * decode_s / o.n_decode;
  // A decode step reads every weight once (an untied embedding only at its rows) and every sequence's cache
  // (approximately: its stored bytes at ctx).
  const StepReads reads = step_reads(double(weight_bytes), seq_bytes * n_seqs, ms_step * 1e-3, probe);
  const DecodeResult result{n_seqs, decode_tps};
  const std::string timing_only = m.dummy ? "dummy weights: timing only" : "";
  if (o.json) {
    nlohmann::json j = {{"model", o.model.dir}, {"ctx", ctx}, {"n_decode", o.n_decode}, {"warmup", o.warmup},
                        {"threads", m.threads()}, {"simd", simd_level_name(parse_simd_level(o.model.simd))},
                        {"cache", cache_cfg.describe()},
                        {"kv_bits_effective", f.bits_per_element}, {"load_seconds", m.load_seconds()},
                        {"prefill_tokens_per_second", o.fill_cache ? nlohmann::json() : nlohmann::json(prefill_tps)},
                        {"cache_filled_random", o.fill_cache}, {"decode_tokens_per_second", decode_tps},
                        {"decode_ms_per_token", ms_step / n_seqs}, {"device", o.model.device},
                        {"runner", runner_desc}, {"seqs", n_seqs}, {"seqs_max", requested == 0},
                        {"decode_ms_per_step", ms_step}, {"kv_mib", kv_mib},
                        {"kv_mib_allocated", double(cache_bytes) / double(1 << 20)},
                        {"kv_bytes_per_token", f.bytes_per_token_per_layer * c.n_layers},
                        {"kv_budget_gib", budget_gib}, {"max_seqs_in_budget", fit},
                        {"weight_bytes", weight_bytes}, {"step_bytes_read_approx", reads.bytes},
                        {"step_read_gbps", reads.gbps}, {"read_probe_gbps", probe / 1e9},
                        {"fraction_of_read_probe", reads.share},
                        {"weights", m.dummy ? "dummy (timing only)" : "checkpoint"}, {"timing_only", m.dummy}};
    if (held)
      j.update({{"seqs_held_in_budget", held->held}, {"pool_slots", held->n_slots}, {"pool_pages", held->n_pages},
                {"pool_mib_allocated", double(held->bytes) / double(1 << 20)}, {"pool_refused", held->refusal}});
    if (base)
      j["vs_bf16"] = {{"decode_tokens_per_second", decode_tps / base->decode_tps},
                      {"seqs", double(n_seqs) / double(base->seqs)}, {"bf16_seqs", base->seqs},
                      {"bf16_decode_tokens_per_second", base->decode_tps}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    const std::string prefill =
        o.fill_cache ? fmt::format("{} x {} tokens of random K/V (--fill-cache, no prefill)", n_seqs, ctx)
                     : fmt::format("prefill {} x {} tokens: {:.1f} tok/s", n_seqs, ctx, prefill_tps);
    std::printf("load %.3f s | %s | decode %d steps of %d%s at ctx %d (after %d "
                "untimed): %.1f tok/s (%.3f ms/step, ~%.1f MB read/step, %.1f GB/s = %.0f%% of the %.1f GB/s read "
                "probe) | KV %.1f MiB (%.0f B/token), %ld sequences fit in %g GiB | %s | %s",
                m.load_seconds(), prefill.c_str(), o.n_decode, n_seqs, requested == 0 ? " (--seqs max)" : "",
                ctx, o.warmup, decode_tps, ms_step, reads.bytes / 1e6, reads.gbps, 100.0 * reads.share, probe / 1e9,
                kv_mib, f.bytes_per_token_per_layer * c.n_layers, fit, budget_gib, runner_desc.c_str(),
                cache_cfg.describe().c_str());
    if (held)  // allocated, not computed: next to the figure above
      std::printf(" | a pool of %g GiB holds %d sequences of %d tokens (%d slots + %d pages allocated, %.1f MiB; the "
                  "next refused: %s)",
                  budget_gib, held->held, ctx, held->n_slots, held->n_pages, double(held->bytes) / double(1 << 20),
                  held->refusal.c_str());
    if (base)
      std::printf(" | vs bf16: %.2fx tokens/s at %.2fx the sequences (%d)", decode_tps / base->decode_tps,
                  double(n_seqs) / double(base->seqs), base->seqs);
    if (m.dummy) std::printf(" | %s", timing_only.c_str());
    std::printf("\n");
  }
  std::fflush(stdout);
  return result;
}

void bench_decode(const BenchDecodeOptions& o) {
  KVQ_CHECK(!o.ctx.empty(), "--ctx-size: give at least one context");
  KVQ_CHECK(!o.fill_cache || o.model.device == "cuda",
            "--fill-cache fills the GPU cache (--device cuda); on the CPU the caches are prefilled through the model");
  for (int ctx : o.ctx) KVQ_CHECK(ctx >= 1, "--ctx-size {} must be >= 1", ctx);
  const int requested = parse_seqs(o.seqs);
  KVQ_CHECK(requested > 0 || o.model.device == "cuda" || o.cache.kv_budget_gib > 0,
            "bench decode --seqs max --device cpu needs --kv-budget-gib (the CPU cache allocates its whole pool up "
            "front, so kvq does not size it from the machine's free memory)");
  const int max_ctx = *std::max_element(o.ctx.begin(), o.ctx.end());
  const int max_len = max_ctx + o.decode_steps();
  const Plan p = plan(o.model, o.cache, max_len, o.beyond_trained_ctx);
  KVQ_CHECK(!o.vs_bf16 || !(p.cache.k.type == "bf16" && p.cache.v.type == "bf16" && !p.cache.transform),
            "--vs-bf16: the cache is bf16 already (give the cache to compare with -ctk / -ctv)");
  std::optional<Plan> base;  // --vs-bf16: checked with the other before any weights are read
  if (o.vs_bf16) base = plan(o.model, bf16_options(o.cache), max_len, o.beyond_trained_ctx);
  // A KV budget that holds no sequence of the longest context (or not the slots asked for): refused before any
  // weights are read, with the pool's own message.
  const ModelConfig& mc = p.model;
  for (const Plan* q : std::initializer_list<const Plan*>{&p, base ? &*base : nullptr})
    if (q && q->kv_budget_bytes > 0)
      PagePool::for_budget(cache_layout(q->cache, mc.n_layers, mc.n_kv_heads, mc.head_dim), max_len, requested,
                           q->kv_budget_bytes);
  if (max_len > p.model.max_ctx)
    fmt::print(stderr, "kvq: bench: context {} is past the model's trained {} tokens (--beyond-trained-ctx): timing only\n",
               max_len, p.model.max_ctx);
  ModelSource model = load_model_source(o.model, p);
  const double probe = read_probe(o, model);
  for (int ctx : o.ctx) {
    std::optional<DecodeResult> b;
    if (base) b = bench_decode_one(o, model, *base, ctx, requested, probe, nullptr);
    bench_decode_one(o, model, p, ctx, requested, probe, b ? &*b : nullptr);
  }
}

struct BenchGemmOptions {
  std::string dir;        // model or shape directory
  std::vector<int> rows;  // empty: the default list
  int iters = 20;
  int lt_algos = 0;       // --lt: cuBLASLt heuristic algorithms timed per GEMM
};

struct BenchAttentionOptions {
  CacheOptions cache;
  int ctx = 8192;         // tokens in the cache before the timed decode steps
  int q_heads = 32;       // query heads
  int kv_heads = 8;       // kv heads
  int head_dim = 128;     // d
  int batch = 1;          // sequences, one decode query each per step
  int prefill = 0;        // --device cuda, > 0: time one prefill chunk of this many queries instead of decode steps
  int split = 0;          // --device cuda: positions per KV split of the decode kernel (0: the planner's)
  int iters = 20;         // timed decode steps per configuration
  int threads = 0;        // worker threads (0: all cores)
  std::string simd;       // --simd: the cache kernels' level ("": the best this CPU has)
  bool hot = false;       // keep the cache in the CPU caches between steps (default: evict it)
  bool json = false;
  std::string device = "cpu";   // cpu | cuda
  std::vector<int> ctx_list;    // --ctx values (cuda: a grid; cpu: one value)
  std::vector<int> batch_list;  // --batch values
  std::vector<std::string> caches;  // --caches: cache types or presets timed in one run (empty: the cache flags')
};

// The one-layer cache of a bench with the transform its codecs imply (TurboQuant's Hadamard on keys) and PN-Mix keys'
// widths (calib/pnmix.h's timing widths: the budget of the widths c has, e.g. a referee row's, else 2 bits): the rows
// are random, so they only have to be there; the GPU bench times the query rotation with the attention, the CPU bench
// not.
CacheConfig bench_cache(CacheConfig c, int kv_heads, int head_dim) {
  c.transform = codec_transform(c, 1, kv_heads, head_dim);
  if (codec_traits(c.k.type).per_head) {
    const double key_bits = c.k.pair_bits ? c.k.pair_bits->key_bits() : 2.0;
    c.k.pair_bits = std::make_shared<const PairBitTable>(timing_pair_bits(1, kv_heads, head_dim, key_bits));
  }
  return c;
}

// The caches under test: the cache flags', or each --caches entry (a --kv-cache-dtype value: a codec or a preset; or
// K:V, keys K and values V as -ctk K -ctv V give them, e.g. llama.cpp's q8_0:q4_0) with the other cache flags
// (windows, page, chunk).
std::vector<CacheConfig> tested_caches(const BenchAttentionOptions& o) {
  KVQ_CHECK(o.cache.rotation == "none",
            "bench attention: --rotation does not apply (random rows; the query rotation is once per step)");
  KVQ_CHECK(o.cache.attn_rot.empty(),
            "bench attention: --attn-rot does not apply (random rows; the query rotation is once per step)");
  KVQ_CHECK(o.cache.kv_scales.empty(), "bench attention: --kv-scales does not apply (random rows, one layer: a "
            "per-tensor scale changes no cost; bench decode takes it)");
  KVQ_CHECK(o.cache.pnmix.empty(), "bench attention: --pnmix does not apply (random rows, one layer: pnmix keys are "
            "timed with widths of 2 bits on average in all four widths)");
  std::vector<CacheConfig> out;
  if (o.caches.empty()) out.push_back(bench_cache(o.cache.config(o.head_dim), o.kv_heads, o.head_dim));
  for (const std::string& t : o.caches) {
    CacheOptions c = o.cache;
    if (const size_t colon = t.find(':'); colon != std::string::npos) {
      c.type_both.clear();
      c.type_k = t.substr(0, colon), c.type_v = t.substr(colon + 1);
    } else {
      c.type_both = t;
    }
    out.push_back(bench_cache(c.config(o.head_dim), o.kv_heads, o.head_dim));
  }
  return out;
}

// --device cuda: the grid of shapes (defaults: batch {1, 8, 32, 64} x ctx {4K, 16K, 64K, 128K}).
void bench_attention_device(const BenchAttentionOptions& o) {
  GpuAttentionBench g;
  for (const CacheConfig& c : tested_caches(o)) g.caches.push_back(with_bench_rope(c, o.head_dim));
  g.batches = o.batch_list.empty() ? std::vector<int>{1, 8, 32, 64} : o.batch_list;
  g.ctxs = o.ctx_list.empty() ? std::vector<int>{4096, 16384, 65536, 131072} : o.ctx_list;
  g.q_heads = o.q_heads, g.kv_heads = o.kv_heads, g.head_dim = o.head_dim, g.iters = o.iters, g.json = o.json;
  g.prefill = o.prefill;
  g.split_tokens = o.split;
  bench_attention_cuda(g);
}

void bench_attention(const BenchAttentionOptions& o) {
  KVQ_CHECK(o.ctx >= 1 && o.batch >= 1 && o.iters >= 1, "bench attention: --ctx {}, --batch {}, --iters {} must be >= 1",
            o.ctx, o.batch, o.iters);
  KVQ_CHECK(o.q_heads >= 1 && o.kv_heads >= 1 && o.q_heads % o.kv_heads == 0,
            "bench attention: --q-heads {} must be a multiple of --kv-heads {}", o.q_heads, o.kv_heads);
  const SimdLevel simd = parse_simd_level(o.simd);  // refused before any work, as the caches below
  const std::vector<CacheConfig> tested = tested_caches(o);
  for (const CacheConfig& c : tested)
    KvCache probe(with_bench_rope(c, o.head_dim), 1, o.kv_heads, o.head_dim, 1);
  ThreadPool pool(o.threads);
  const double bw = read_bandwidth(pool, size_t(512) << 20);
  std::vector<uint8_t> evict(o.hot ? 0 : size_t(96) << 20, 1);
  const AttentionBenchShape shape{.ctx = o.ctx, .batch = o.batch, .q_heads = o.q_heads, .kv_heads = o.kv_heads,
                                  .head_dim = o.head_dim, .iters = o.iters, .hot = o.hot};
  const auto at_level = [&](CacheConfig c) {
    c.simd = simd;
    return c;
  };
  std::vector<AttentionFigures> figures = {
      bench_attention_cpu(shape, at_level(bf16_options(o.cache).config(o.head_dim)), pool, evict)};
  for (const CacheConfig& c : tested) figures.push_back(bench_attention_cpu(shape, at_level(c), pool, evict));
  const AttentionFigures& base = figures[0];
  double load[3] = {0, 0, 0};
  if (FILE* fl = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(fl, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
    std::fclose(fl);
  }
  if (!o.json)
    std::printf("read bandwidth %.1f GB/s (%d threads, 512 MB streaming read) | load average %.2f %.2f %.2f | "
                "ctx %d batch %d q-heads %d kv-heads %d d %d | %s kernels | %s\n",
                bw / 1e9, pool.size(), load[0], load[1], load[2], o.ctx, o.batch, o.q_heads, o.kv_heads, o.head_dim,
                simd_level_name(simd), o.hot ? "hot caches" : "caches evicted before each step");
  for (const AttentionFigures& fig : figures) {
    const AttentionFigures* f = &fig;
    const double gbps = f->bytes_read / (f->ms * 1e-3) / 1e9;
    const double speedup = base.ms / f->ms;
    const double append_pct = 100.0 * f->append_ms / (f->ms / o.batch);
    if (o.json) {
      nlohmann::json j = {{"cache", f->cache}, {"ctx", o.ctx}, {"batch", o.batch}, {"threads", pool.size()},
                          {"simd", simd_level_name(simd)},
                          {"q_heads", o.q_heads}, {"kv_heads", o.kv_heads}, {"head_dim", o.head_dim},
                          {"iters", o.iters}, {"hot", o.hot}, {"ms", f->ms}, {"ms_min", f->ms_min}, {"cpu_ms", f->cpu_ms},
                          {"bytes_read", f->bytes_read}, {"gbps", gbps}, {"speedup_vs_bf16", speedup},
                          {"append_ms_per_token", f->append_ms}, {"append_pct_of_step", append_pct},
                          {"kv_bits_effective", f->bits}, {"read_bandwidth_gbps", bw / 1e9},
                          {"fraction_of_read_bandwidth", gbps * 1e9 / bw}, {"load_average", load[0]}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%-62s %8.3f ms/step (min %.3f, cpu %.3f) | %7.2f MB read | %6.2f GB/s (%3.0f%% of read bw) | "
                  "speedup_vs_bf16 %.2fx | append %.4f ms/token/layer = %.1f%% of a step | %.2f bits/elem\n",
                  f->cache.c_str(), f->ms, f->ms_min, f->cpu_ms, f->bytes_read / 1e6, gbps, 100.0 * gbps * 1e9 / bw, speedup,
                  f->append_ms, append_pct, f->bits);
    }
  }
}

}  // namespace

std::string CostShape::text() const {
  return fmt::format("{} x {}, q{}/kv{}/d{}", batch, ctx, q_heads, kv_heads, head_dim);
}

CostShape parse_cost_shape(const std::string& s) {
  CostShape c;
  const size_t x = s.find('x');
  const auto number = [&](std::string_view t, int lo, int hi, int* out) {
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), *out);
    return ec == std::errc() && end == t.data() + t.size() && *out >= lo && *out <= hi;
  };
  KVQ_CHECK(x != std::string::npos && number(std::string_view(s).substr(0, x), 1, 1024, &c.batch) &&
                number(std::string_view(s).substr(x + 1), 1, 1 << 20, &c.ctx),
            "--cost-shape '{}': give sequences x context, e.g. 8x32768 (1..1024 sequences, 1..1048576 tokens)", s);
  return c;
}

std::function<nlohmann::json(const CacheConfig&)> attention_cost_probe(const std::string& device,
                                                                        const CostShape& shape,
                                                                        const std::optional<CostShape>& model_shape,
                                                                        int threads, SimdLevel simd) {
  struct State {
    std::unique_ptr<ThreadPool> pool;
    std::vector<uint8_t> evict;
    double bw = 0;  // bytes/s, at the first call
  };
  auto st = std::make_shared<State>();
  const auto measure = [=](const CacheConfig& row, const CostShape& at) {
    CacheConfig c = row;
    c.k.head_dim = c.v.head_dim = at.head_dim;
    c = with_bench_rope(bench_cache(c, at.kv_heads, at.head_dim), at.head_dim);  // RoPE: E8's keys
    nlohmann::json j = {{"shape", at.text()}};
    double us = 0, bytes = 0;
    if (device == "cuda") {
      if (st->bw == 0) st->bw = read_bandwidth_cuda();
      const GpuAttentionCost g =
          attention_cost_cuda(c, at.batch, at.ctx, at.q_heads, at.kv_heads, at.head_dim, at.iters);
      us = g.us, bytes = g.bytes_read;
      j["device"] = g.device;
    } else {
      if (!st->pool) {
        st->pool = std::make_unique<ThreadPool>(threads);
        st->evict.assign(size_t(96) << 20, 1);
        st->bw = read_bandwidth(*st->pool, size_t(512) << 20);
      }
      c.simd = simd;
      const AttentionBenchShape b{.ctx = at.ctx, .batch = at.batch, .q_heads = at.q_heads,
                                  .kv_heads = at.kv_heads, .head_dim = at.head_dim, .iters = at.iters};
      const AttentionFigures f = bench_attention_cpu(b, c, *st->pool, st->evict);
      us = 1e3 * f.ms, bytes = f.bytes_read;
      j["device"] = fmt::format("cpu, {} threads, {} kernels", st->pool->size(), simd_level_name(simd));
    }
    j["attention_us"] = us;
    j["bytes_read"] = bytes;
    j["read_probe_gbps"] = st->bw / 1e9;
    j["fraction_of_read_probe"] = us > 0 && st->bw > 0 ? bytes / (us * 1e-6) / st->bw : 0.0;
    return j;
  };
  return [=](const CacheConfig& row) {
    nlohmann::json j = measure(row, shape);
    if (model_shape) {
      try {
        j["model_shape"] = measure(row, *model_shape);
      } catch (const Error& e) {
        j["model_shape"] = {{"shape", model_shape->text()}, {"unsupported", e.what()}};
      }
    }
    return j;
  };
}

void add_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks (decode, attention, gemm)");
  bench->require_subcommand(1);
  auto o = std::make_shared<BenchDecodeOptions>();
  CLI::App* dec = bench->add_subcommand("decode", "prefill and decode tokens/s of a model");
  add_model_options(dec, o->model);
  add_cache_options(dec, o->cache);
  o->cache.random_rotation = true;
  dec->get_option("--rotation")
      ->description("key/value rotation: none, hadamard (QuaRot), a rotation file from kvq calibrate, or random: "
                    "random orthogonal R_K / R_V and key means in a rotation file's layout (timing only: what a "
                    "calibrated file costs, on a model with no calibration data)");
  add_device_options(dec, o->model);
  add_fold_values_option(dec, o->model);
  dec->add_option("-c,--ctx-size,--ctx", o->ctx, "tokens to prefill before decoding (a comma-separated list: one "
                  "run per context)")->delimiter(',');
  dec->add_option("-n,--n-decode", o->n_decode, "timed decode steps")->check(CLI::Range(1, 1 << 20));
  dec->add_option("--warmup", o->warmup, "untimed decode steps before the timed ones (the first steps of a shape run "
                  "eagerly and capture its CUDA graph)")->check(CLI::Range(0, 1 << 20));
  dec->add_option("--seqs", o->seqs, "concurrent sequences (one token each per decode step), or max: as many as "
                  "the KV budget holds at each context (--kv-budget-gib, or on the GPU 0.9 of the memory free after "
                  "the weights)");
  dec->add_flag("--vs-bf16", o->vs_bf16, "also time the bf16 cache of the same windows first (its own --seqs max) and "
                "print the ratio");
  add_kv_budget_option(dec, o->cache);  // also: the sequences a pool of this budget holds at each context
  dec->add_flag("--beyond-trained-ctx", o->beyond_trained_ctx,
                "allow contexts past the model's max_position_embeddings (throughput only: the tokens are meaningless)");
  dec->add_flag("--fill-cache", o->fill_cache,
                "--device cuda: fill every sequence's cache to the context with random K/V rows (N(0, 1), through the "
                "cache's own append and demotion) instead of prefilling it through the model, as scripts/bench_hf.py "
                "fills transformers' cache: decode figures only, for contexts and batches whose prefill would take "
                "far longer than the decode timed");
  dec->add_flag("--json", o->json, "print one JSON object");
  dec->callback([o] { bench_decode(*o); });

  auto a = std::make_shared<BenchAttentionOptions>();
  CLI::App* att = bench->add_subcommand("attention", "decode-step attention over a random-filled KV cache vs bf16");
  add_cache_options(att, a->cache);
  att->add_option("--ctx", a->ctx_list, "tokens in the cache (--device cuda: a list, e.g. 4096,65536)")
      ->check(CLI::Range(1, 1 << 24))
      ->delimiter(',');
  att->add_option("--q-heads", a->q_heads, "query heads")->check(CLI::Range(1, 1024));
  att->add_option("--kv-heads", a->kv_heads, "kv heads")->check(CLI::Range(1, 1024));
  att->add_option("--head-dim", a->head_dim, "head dimension d")->check(CLI::Range(1, 4096));
  att->add_option("--batch", a->batch_list, "sequences, one decode query each per step (--device cuda: a list)")
      ->check(CLI::Range(1, 4096))
      ->delimiter(',');
  att->add_option("--device", a->device, "cpu, or cuda (GPU cache and kernels; shape grid, JSON array)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  att->add_option("--iters", a->iters, "timed decode steps")->check(CLI::Range(1, 1 << 20));
  att->add_option("--prefill", a->prefill, "--device cuda: time one prefill chunk of this many queries at each --ctx "
                  "(one sequence), the tensor-core prefill kernel against the per-row path")
      ->check(CLI::Range(1, 1 << 16));
  att->add_option("--kv-split", a->split, "--device cuda: positions per KV split of the decode attention kernel, "
                  "rounded up to a multiple of 128 (default 0: the planner's choice)")
      ->check(CLI::Range(0, 1 << 24));
  att->add_option("-t,--threads", a->threads, "worker threads (0: all cores)")->check(CLI::Range(0, 1024));
  add_simd_option(att, a->simd);
  att->add_flag("--hot", a->hot, "leave the cache in the CPU caches between steps (default: evict 96 MB)");
  att->add_option("--caches", a->caches, "cache types or presets to time in one run against one bf16 baseline, e.g. "
                  "int2,turboquant_3bit_nc,q8_0:q4_0 (each a --kv-cache-dtype value, or K:V for keys K and values V, "
                  "with the other cache flags)")
      ->delimiter(',');
  att->add_flag("--json", a->json, "print one JSON object per configuration (--device cuda: one JSON array)");
  att->callback([a] {
    if (a->device == "cuda") return bench_attention_device(*a);
    KVQ_CHECK(a->prefill == 0, "bench attention: --prefill needs --device cuda");
    KVQ_CHECK(a->split == 0, "bench attention: --kv-split needs --device cuda");
    KVQ_CHECK(a->ctx_list.size() <= 1 && a->batch_list.size() <= 1,
              "bench attention: lists of --ctx / --batch need --device cuda (the CPU bench runs one shape)");
    if (!a->ctx_list.empty()) a->ctx = a->ctx_list[0];
    if (!a->batch_list.empty()) a->batch = a->batch_list[0];
    bench_attention(*a);
  });

  auto gm = std::make_shared<BenchGemmOptions>();
  CLI::App* gemm = bench->add_subcommand(
      "gemm", "GPU: the decode step's bf16 GEMMs (cuBLAS) at a model's shapes, time and share of the read bandwidth "
              "per row count");
  gemm->add_option("-m,--model", gm->dir, "checkpoint or shape directory (only config.json is read, e.g. "
                   "models/shapes/qwen3-8b)")->required()->check(CLI::ExistingDirectory);
  gemm->add_option("--rows", gm->rows, "rows per GEMM (sequences of a decode step), a list; default "
                   "1,8,16,32,64,128,256")
      ->check(CLI::Range(1, 4096))
      ->delimiter(',');
  gemm->add_option("--iters", gm->iters, "timed steps per GEMM, each at least 8 calls back to back (median reported)")
      ->check(CLI::Range(1, 1 << 20));
  gemm->add_option("--lt", gm->lt_algos, "also time the first N algorithms cuBLASLt's heuristic offers for each GEMM "
                   "and print the fastest beside cuBLAS's own choice (default 0: off)")
      ->check(CLI::Range(0, 1024));
  gemm->callback([gm] {
    GpuGemmBench g;
    g.model = ModelConfig::load(gm->dir + "/config.json");
    g.rows = gm->rows.empty() ? std::vector<int>{1, 8, 16, 32, 64, 128, 256} : gm->rows;
    g.iters = gm->iters;
    g.lt_algos = gm->lt_algos;
    bench_gemm_cuda(g);
  });
}

}  // namespace kvq::cli
