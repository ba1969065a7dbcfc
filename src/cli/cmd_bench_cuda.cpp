// kvq bench attention --device cuda: per shape (batch, ctx) the median time of one decode-step attention call of
// the GPU cache (query rotation, attention over the decode-faithful view of every sequence, split-KV merge),
// the bytes it reads, TB/s, the fraction of a read-bandwidth probe measured in the same run, and the speedup
// over the bf16 cache of the same shape. Caches are filled on the GPU with random rows in large chunks. Also kvq bench
// gemm: the decode step's GEMMs at a model's shapes, and bench decode's GPU helpers (the pool probe, --fill-cache).
#include "cli/bench_cuda.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"

#ifdef KVQ_HAVE_CUDA
#include "codecs/codec.h"
#include "cuda/bench_support.h"
#include "cuda/gpu_cache.h"
#include "cuda/gpu_instances.h"
#include "cuda/gpu_model.h"
#include "cuda/runtime.h"
#include "kv/page_pool.h"
#endif

namespace kvq::cli {

#ifndef KVQ_HAVE_CUDA

void bench_attention_cuda(const GpuAttentionBench&) {
  KVQ_FAIL("--device cuda: this kvq was built without CUDA (configure with nvcc available, -DKVQ_CUDA=ON)");
}

PoolProbe probe_pool_cuda(const CacheConfig&, int, int, int, int, size_t) {
  KVQ_FAIL("--device cuda: this kvq was built without CUDA (configure with nvcc available, -DKVQ_CUDA=ON)");
}

void bench_gemm_cuda(const GpuGemmBench&) {
  KVQ_FAIL("--device cuda: this kvq was built without CUDA (configure with nvcc available, -DKVQ_CUDA=ON)");
}

double read_bandwidth_cuda() {
  KVQ_FAIL("--device cuda: this kvq was built without CUDA (configure with nvcc available, -DKVQ_CUDA=ON)");
}

void fill_cache_cuda(Runner&, const std::vector<int>&, int) {
  KVQ_FAIL("--device cuda: this kvq was built without CUDA (configure with nvcc available, -DKVQ_CUDA=ON)");
}

GpuAttentionCost attention_cost_cuda(const CacheConfig&, int, int, int, int, int, int) {
  KVQ_FAIL("--device cuda: this kvq was built without CUDA (configure with nvcc available, -DKVQ_CUDA=ON)");
}

#else

namespace {

constexpr int kFillRows = 65536;  // rows appended per fill step (all sequences together)

// "k=int4 v=int4", and the windows where they are not bf16: "k=int4 v=int4 w=int8" (KV4-RL).
std::string pair_label(const CacheConfig& c) {
  return "k=" + c.k.type + " v=" + c.v.type + (c.window == "bf16" ? "" : " w=" + c.window);
}

struct ShapeResult {
  double us = 0;          // median microseconds of one decode-step attention call
  double bytes_read = 0;  // cache bytes that call reads
};

// Device bytes a cache of this shape needs, to skip shapes that do not fit: its pool as GpuKvCache allocates it (the
// pages of batch sequences of max_ctx tokens and their windows), the fill's staging rows and a margin.
double bytes_needed(const GpuAttentionBench& o, const CacheConfig& cfg, int batch, int max_ctx, int chunk) {
  const CacheLayout layout = cuda::GpuKvCache::layout_of(cfg, 1, o.kv_heads, o.head_dim, max_ctx);
  const double pool = double(PagePool::for_sequences(layout, max_ctx, batch).n_pages) * double(layout.page_bytes);
  const double fill = 2.0 * double(chunk) * batch * o.kv_heads * o.head_dim * 4;
  return pool + fill + (64 << 20);
}

// Fills seqs of cache to ctx tokens each with N(0, 1) key and value rows: steps of chunk rows of every sequence,
// staged in k and v (room for chunk x seqs rows of row_floats) and appended to layers 0 .. n_layers - 1. seed
// advances by two a step.
void fill_random(cuda::GpuKvCache& cache, const std::vector<int>& seqs, int ctx, int chunk, int n_layers,
                 size_t row_floats, cuda::DeviceBuffer& k, cuda::DeviceBuffer& v, uint64_t& seed) {
  for (int p = 0; p < ctx; p += chunk) {
    const int n = std::min(chunk, ctx - p);
    const size_t floats = size_t(n) * seqs.size() * row_floats;
    cuda::fill_normal(k.as<float>(), floats, seed++, 1.f, cache.stream());
    cuda::fill_normal(v.as<float>(), floats, seed++, 1.f, cache.stream());
    cache.begin_step(seqs, std::vector<int>(seqs.size(), n));
    for (int l = 0; l < n_layers; ++l) cache.append(l, k.as<float>(), v.as<float>());
    cache.commit_step();
  }
}

std::optional<ShapeResult> run_shape(const GpuAttentionBench& o, CacheConfig cfg, int batch, int ctx) {
  const int chunk = std::max(1, std::min({2048, ctx, kFillRows / batch}));
  cfg.max_chunk = chunk;
  const double need = bytes_needed(o, cfg, batch, ctx + 1, chunk);
  const double avail = 0.92 * double(cuda::free_device_memory());
  if (need > avail) {
    std::fprintf(stderr, "note: skipping batch %d ctx %d k=%s v=%s: needs %.1f GB, %.1f GB free\n", batch, ctx,
                 cfg.k.type.c_str(), cfg.v.type.c_str(), need / 1e9, avail / 1e9);
    return std::nullopt;
  }
  cuda::GpuKvCache cache(cfg, 1, o.kv_heads, o.head_dim, ctx + 1, batch);
  std::vector<int> seqs;
  for (int b = 0; b < batch; ++b) seqs.push_back(cache.new_sequence());
  const size_t row_floats = size_t(o.kv_heads) * o.head_dim;
  cuda::DeviceBuffer k(size_t(chunk) * batch * row_floats * 4), v(k.bytes());
  cuda::DeviceBuffer q(size_t(batch) * o.q_heads * o.head_dim * 4), out(q.bytes());
  uint64_t seed = 1;
  fill_random(cache, seqs, ctx, chunk, 1, row_floats, k, v, seed);
  cache.set_split_tokens(o.split_tokens);
  // The timed step: one decode token per sequence (appended once), attention timed repeatedly.
  cuda::fill_normal(k.as<float>(), size_t(batch) * row_floats, seed++, 1.f, cache.stream());
  cuda::fill_normal(v.as<float>(), size_t(batch) * row_floats, seed++, 1.f, cache.stream());
  cuda::fill_normal(q.as<float>(), size_t(batch) * o.q_heads * o.head_dim, seed++, 1.f, cache.stream());
  cache.begin_step(seqs, std::vector<int>(size_t(batch), 1));
  cache.append(0, k.as<float>(), v.as<float>());
  ShapeResult r;
  r.us = 1e3 * cuda::median_step_ms([&] { cache.attention(0, q.as<float>(), o.q_heads, out.as<float>()); }, 3,
                                    o.iters, cache.stream());
  r.bytes_read = double(cache.step_bytes_read(0));
  cache.commit_step();
  cuda::sync("bench attention");
  return r;
}

// --prefill: one sequence filled to ctx, then one step of `o.prefill` queries; the chunk's append and attention as a
// model step runs them (GpuKvCache::append_and_attend: rounds of the ring's append_tokens rows) timed with the prefill
// kernel and with every row on the decode kernels (the same cache and rows; each call appends the same rows again).
struct PrefillResult {
  double kernel_us = 0, per_row_us = 0;  // median microseconds of one attention call
  double flops = 0;                      // 4 d n_heads Σ (view length): QK^T and PV over every row's view
  bool kernel_ran = false;               // the cache took the prefill kernel (its codecs have it)
};

std::optional<PrefillResult> run_prefill(const GpuAttentionBench& o, CacheConfig cfg, int ctx) {
  const int fill = std::max(1, std::min(2048, ctx));
  cfg.max_chunk = std::max(fill, o.prefill);
  const double need = bytes_needed(o, cfg, 1, ctx + o.prefill, cfg.max_chunk) +
                      double(o.prefill) * o.q_heads * o.head_dim * 4 * 4;  // q, out and the partials
  const double avail = 0.92 * double(cuda::free_device_memory());
  if (need > avail) {
    std::fprintf(stderr, "note: skipping prefill ctx %d k=%s v=%s: needs %.1f GB, %.1f GB free\n", ctx,
                 cfg.k.type.c_str(), cfg.v.type.c_str(), need / 1e9, avail / 1e9);
    return std::nullopt;
  }
  cuda::GpuKvCache cache(cfg, 1, o.kv_heads, o.head_dim, ctx + o.prefill, 1);
  const int seq = cache.new_sequence();
  const size_t row_floats = size_t(o.kv_heads) * o.head_dim;
  const int rows = std::max(fill, o.prefill);
  cuda::DeviceBuffer k(size_t(rows) * row_floats * 4), v(k.bytes());
  cuda::DeviceBuffer q(size_t(o.prefill) * o.q_heads * o.head_dim * 4), out(q.bytes());
  uint64_t seed = 1;
  fill_random(cache, {seq}, ctx, fill, 1, row_floats, k, v, seed);
  cuda::fill_normal(k.as<float>(), size_t(o.prefill) * row_floats, seed++, 1.f, cache.stream());
  cuda::fill_normal(v.as<float>(), size_t(o.prefill) * row_floats, seed++, 1.f, cache.stream());
  cuda::fill_normal(q.as<float>(), size_t(o.prefill) * o.q_heads * o.head_dim, seed++, 1.f, cache.stream());
  cache.begin_step({seq}, {o.prefill});
  PrefillResult r;
  auto time = [&](int prefill_rows) {
    cache.set_prefill_rows(prefill_rows);
    return 1e3 * cuda::median_step_ms(
                     [&] {
                       cache.append_and_attend(0, k.as<float>(), v.as<float>(), q.as<float>(), o.q_heads,
                                               out.as<float>());
                     },
                     2, o.iters, cache.stream());
  };
  r.kernel_us = time(1);
  r.kernel_ran = cache.prefill_kernel_calls() > 0;
  r.per_row_us = time(0);
  cache.commit_step();
  cuda::sync("bench attention --prefill");
  for (int i = 0; i < o.prefill; ++i) r.flops += 4.0 * o.head_dim * o.q_heads * double(ctx + i + 1);
  return r;
}

// --prefill: per context and cache, the chunk's attention on the prefill kernel against the per-row path.
void bench_prefill(const GpuAttentionBench& o) {
  if (!o.json)
    std::printf("%s | one chunk of %d queries per context (append + attention), batch 1 | q-heads %d kv-heads %d "
                "d %d | median of %d\n"
                "%7s %-24s %12s %12s %9s %12s %9s\n",
                cuda::device_description().c_str(), o.prefill, o.q_heads, o.kv_heads, o.head_dim, o.iters, "ctx",
                "cache", "kernel us", "per-row us", "speedup", "kernel tok/s", "TFLOP/s");
  nlohmann::json records = nlohmann::json::array();
  for (int ctx : o.ctxs)
    for (const CacheConfig& cache : o.caches) {
      const std::optional<PrefillResult> r = run_prefill(o, cache, ctx);
      if (!r) continue;
      const double speedup = r->per_row_us / r->kernel_us, tps = o.prefill / (r->kernel_us * 1e-6);
      const double tflops = r->flops / (r->kernel_us * 1e-6) / 1e12;
      const std::string name = pair_label(cache) + (r->kernel_ran ? "" : " (per-row)");
      if (o.json) {
        records.push_back({{"ctx", ctx}, {"prefill_rows", o.prefill}, {"type_k", cache.k.type},
                           {"type_v", cache.v.type}, {"window", cache.window}, {"prefill_kernel", r->kernel_ran},
                           {"kernel_us", r->kernel_us}, {"per_row_us", r->per_row_us}, {"speedup", speedup},
                           {"tokens_per_second", tps}, {"tflops", tflops}});
      } else {
        std::printf("%7d %-24s %12.1f %12.1f %8.2fx %12.0f %9.1f\n", ctx, name.c_str(), r->kernel_us, r->per_row_us,
                    speedup, tps, tflops);
        std::fflush(stdout);
      }
    }
  if (o.json) std::printf("%s\n", records.dump(1).c_str());
}

}  // namespace

GpuAttentionCost attention_cost_cuda(const CacheConfig& cfg, int batch, int ctx, int q_heads, int kv_heads,
                                     int head_dim, int iters) {
  const std::string why = cuda::gpu_unsupported(cfg, head_dim);
  KVQ_CHECK(why.empty(), "{}", why);
  GpuAttentionBench o;
  o.q_heads = q_heads, o.kv_heads = kv_heads, o.head_dim = head_dim, o.iters = iters;
  const std::optional<ShapeResult> r = run_shape(o, cfg, batch, ctx);
  KVQ_CHECK(r.has_value(), "batch {} x ctx {} does not fit the GPU's free memory", batch, ctx);
  return {r->us, r->bytes_read, cuda::device_description()};
}

void bench_attention_cuda(const GpuAttentionBench& o) {
  KVQ_CHECK(o.q_heads % o.kv_heads == 0 && o.q_heads / o.kv_heads <= 8,
            "bench attention --device cuda: --q-heads {} over --kv-heads {} (GQA group 1 .. 8 supported)", o.q_heads,
            o.kv_heads);
  KVQ_CHECK(!o.batches.empty() && !o.ctxs.empty(), "bench attention: empty --batch or --ctx list");
  for (int b : o.batches) KVQ_CHECK(b >= 1, "bench attention: --batch {} must be >= 1", b);
  for (int c : o.ctxs) KVQ_CHECK(c >= 1, "bench attention: --ctx {} must be >= 1", c);
  KVQ_CHECK(!o.caches.empty(), "bench attention: no cache to time");
  cuda::require_device();
  // refused early, a --head-dim the GPU does not compile included (one line naming it: gpu_instances.h)
  for (const CacheConfig& c : o.caches) cuda::GpuKvCache probe(c, 1, o.kv_heads, o.head_dim, 1, 1);
  if (o.prefill > 0) return bench_prefill(o);
  const double probe_bw = read_bandwidth_cuda();
  CacheConfig bf = o.caches[0];
  bf.k = CodecSpec{.type = "bf16", .head_dim = o.head_dim}, bf.v = bf.k;
  bf.window = "bf16";  // the bf16 cache's windows: a first cache of KV4-RL's int8 windows keeps only their sizes
  bf.transform = nullptr;
  if (!o.json)
    std::printf("%s | read probe %.2f TB/s | q-heads %d kv-heads %d d %d | KV split %s | median of %d steps\n"
                "%6s %7s %-24s %10s %12s %7s %7s %8s\n",
                cuda::device_description().c_str(), probe_bw / 1e12, o.q_heads, o.kv_heads, o.head_dim,
                o.split_tokens ? std::to_string((o.split_tokens + 127) / 128 * 128).c_str() : "auto", o.iters,
                "batch", "ctx", "cache", "us", "MB read", "TB/s", "%probe", "vs bf16");
  nlohmann::json records = nlohmann::json::array();
  for (int batch : o.batches)
    for (int ctx : o.ctxs) {
      const std::optional<ShapeResult> base = run_shape(o, bf, batch, ctx);
      for (const CacheConfig& cache : o.caches) {
        const bool is_bf16 = cache.k.type == "bf16" && cache.v.type == "bf16" && cache.window == "bf16" &&
                             !cache.transform;
        const std::optional<ShapeResult> test = is_bf16 ? base : run_shape(o, cache, batch, ctx);
        if (!test) continue;
        const double tbps = test->bytes_read / (test->us * 1e-6) / 1e12;
        const double pct = 100.0 * tbps * 1e12 / probe_bw;
        const double speedup = base ? base->us / test->us : NAN;
        if (o.json) {
          nlohmann::json j = {{"batch", batch}, {"ctx", ctx}, {"type_k", cache.k.type}, {"type_v", cache.v.type},
                              {"window", cache.window}, {"transform", cache.rotation()}, {"us", test->us},
                              {"bytes_read", test->bytes_read}, {"tbps", tbps}, {"pct_probe", pct},
                              {"probe_tbps", probe_bw / 1e12}};
          j["speedup_vs_bf16"] = base ? nlohmann::json(speedup) : nlohmann::json(nullptr);
          records.push_back(j);
        } else {
          std::printf("%6d %7d %-24s %10.1f %12.2f %7.3f %6.1f%% %7.2fx\n", batch, ctx, pair_label(cache).c_str(),
                      test->us, test->bytes_read / 1e6, tbps, pct, speedup);
          std::fflush(stdout);
        }
      }
    }
  if (o.json) std::printf("%s\n", records.dump(1).c_str());
}

double read_bandwidth_cuda() {
  cuda::require_device();
  return cuda::read_bandwidth_probe(std::min<size_t>(size_t(2) << 30, cuda::free_device_memory() / 4));
}

void bench_gemm_cuda(const GpuGemmBench& o) {
  const ModelConfig& m = o.model;
  struct Gemm {
    const char* name;
    int out, in, per_step;  // per_step: how many a decode step runs
  };
  const int L = m.n_layers, H = m.hidden_size, I = m.intermediate_size, qd = m.n_heads * m.head_dim;
  const Gemm gemms[] = {{"qkv", qd + 2 * m.n_kv_heads * m.head_dim, H, L}, {"o", H, qd, L},
                        {"gate_up", 2 * I, H, L}, {"down", H, I, L}, {"head", m.vocab_size, H, 1}};
  const double bw = read_bandwidth_cuda();
  std::printf("bf16 GEMMs of a decode step (cuBLAS, fp32 accumulation and output), W read cold; read probe %.2f "
              "TB/s%s\n",
              bw / 1e12, o.lt_algos > 0 ? "; beside it the fastest of cuBLASLt's heuristic algorithms" : "");
  for (int rows : o.rows) {
    double step_ms = 0, step_lt_ms = 0, step_bytes = 0;
    bool lt_all = o.lt_algos > 0;  // every GEMM has a cuBLASLt time
    for (const Gemm& g : gemms) {
      const cuda::GemmTiming t = cuda::time_gemm_bf16(rows, g.out, g.in, o.iters, o.lt_algos);
      const double bytes = double(g.out) * g.in * 2 + double(rows) * (g.in * 2 + g.out * 4);
      std::printf("rows %4d %-8s %6d x %6d | %8.1f MB | %8.1f us | %5.2f TB/s | %3.0f%% of the probe", rows, g.name,
                  g.out, g.in, bytes / 1e6, t.ms * 1e3, bytes / (t.ms * 1e-3) / 1e12, 100 * bytes / (t.ms * 1e-3) / bw);
      if (t.lt_timed > 0)
        std::printf(" | cuBLASLt %8.1f us, %3.0f%%, %.2fx (best of %d, heuristic's #%d: %s)", t.lt_ms * 1e3,
                    100 * bytes / (t.lt_ms * 1e-3) / bw, t.ms / t.lt_ms, t.lt_timed, t.lt_rank + 1, t.lt_algo);
      else if (o.lt_algos > 0)
        std::printf(" | cuBLASLt: no algorithm");
      std::printf("\n");
      step_ms += g.per_step * t.ms;
      step_lt_ms += g.per_step * t.lt_ms;
      step_bytes += g.per_step * bytes;
      lt_all = lt_all && t.lt_timed > 0;
    }
    std::printf("rows %4d a step's GEMMs: %.3f GB in %.3f ms, %.0f%% of the probe", rows, step_bytes / 1e9, step_ms,
                100 * step_bytes / (step_ms * 1e-3) / bw);
    if (lt_all)
      std::printf("; with each GEMM's fastest cuBLASLt algorithm %.3f ms, %.0f%%", step_lt_ms,
                  100 * step_bytes / (step_lt_ms * 1e-3) / bw);
    std::printf("\n");
  }
}

PoolProbe probe_pool_cuda(const CacheConfig& cfg, int n_layers, int n_kv_heads, int head_dim, int ctx,
                          size_t budget_bytes) {
  cuda::GpuKvCache cache(cfg, n_layers, n_kv_heads, head_dim, ctx, 0, budget_bytes);
  PoolProbe r;
  r.n_slots = cache.pool().n_slots(), r.n_pages = cache.pool().n_pages(), r.bytes = cache.bytes_allocated();
  try {
    for (;;) {
      const int seq = cache.new_sequence();
      for (int done = 0; done < ctx;) {  // steps that reserve pages and store nothing: pages are what is counted
        const int n = std::min(cfg.max_chunk, ctx - done);
        cache.begin_step({seq}, {n});
        cache.commit_step();
        done += n;
      }
      ++r.held;
    }
  } catch (const Error& e) {
    r.refusal = e.what();
  }
  cuda::sync("bench decode: pool probe");
  return r;
}

void fill_cache_cuda(Runner& runner, const std::vector<int>& seqs, int ctx) {
  auto* gpu = dynamic_cast<cuda::GpuModel*>(&runner);
  KVQ_CHECK(gpu, "--fill-cache: the cache is filled on the GPU (--device cuda)");
  cuda::GpuKvCache& cache = gpu->cache();
  const ModelConfig& c = gpu->config();
  const int batch = int(seqs.size());
  const int chunk = std::max(1, std::min(gpu->cache_config().max_chunk, kFillRows / batch));
  const size_t row_floats = size_t(c.n_kv_heads) * size_t(c.head_dim);
  cuda::DeviceBuffer k(size_t(chunk) * size_t(batch) * row_floats * sizeof(float)), v(k.bytes());
  uint64_t seed = 1;
  fill_random(cache, seqs, ctx, chunk, c.n_layers, row_floats, k, v, seed);
  cuda::sync("bench decode --fill-cache");
}

#endif  // KVQ_HAVE_CUDA

}  // namespace kvq::cli
