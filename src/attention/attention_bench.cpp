#include "attention/attention_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include <time.h>

#include "attention/attention.h"
#include "model/config.h"

namespace kvq {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of the whole process (all threads), seconds: unlike wall time, barely affected by other load.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

double read_bandwidth(ThreadPool& pool, size_t bytes) {
  const size_t n = bytes / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  const int parts = pool.size() * 4;
  pool.parallel_for(parts, [&](int64_t p, int) {  // first touch by the threads that read it
    for (size_t i = n * size_t(p) / parts; i < n * size_t(p + 1) / parts; ++i) buf[i] = i;
  });
  std::atomic<uint64_t> sink{0};
  double best = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(parts, [&](int64_t p, int) {
      uint64_t a[8] = {};
      const size_t b = n * size_t(p) / parts, e = n * size_t(p + 1) / parts;
      size_t i = b;
      for (; i + 8 <= e; i += 8)
        for (int k = 0; k < 8; ++k) a[k] += buf[i + size_t(k)];
      for (; i < e; ++i) a[0] += buf[i];
      sink += a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
    });
    best = std::max(best, double(n * sizeof(uint64_t)) / seconds_since(t0));
  }
  return sink.load() == 1 ? 0 : best;  // (sink keeps the reads alive)
}

CacheConfig with_bench_rope(CacheConfig c, int head_dim) {
  ModelConfig mc;
  mc.head_dim = head_dim;
  mc.rope.theta = 1e6;
  c.key_rope = mc.rope_inv_freq();
  return c;
}


double decode_bytes(const KvCache& cache, int seq, int t) {
  std::vector<KvCache::Run> runs;
  double bytes = 0;
  for (int h = 0; h < cache.n_kv_heads(); ++h) {
    cache.runs(seq, 0, h, t, t, runs);
    for (const auto& r : runs)  // each run's blocks in its codecs (the quantized region's, or the window's)
      bytes += double(r.n / r.k_codec->tokens_per_block()) * double(r.k_codec->bytes_per_block()) +
               double(r.n / r.v_codec->tokens_per_block()) * double(r.v_codec->bytes_per_block());
  }
  return bytes;
}

AttentionFigures bench_attention_cpu(const AttentionBenchShape& o, const CacheConfig& cfg, ThreadPool& pool,
                                     std::vector<uint8_t>& evict) {
  const int d = o.head_dim, hk = o.kv_heads, hq = o.q_heads;
  const int n_append = 64;  // tokens appended after the decode steps to time append + demote
  CacheConfig c = with_bench_rope(cfg, d);
  KvCache cache(c, 1, hk, d, o.ctx + n_append, o.batch);
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int chunk = c.max_chunk;
  // One chunk of N(0, 1) rows, appended again and again: drawing every row would cost more than encoding it.
  std::vector<float> k(size_t(chunk) * hk * d), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) k[i] = nd(rng), v[i] = nd(rng);
  std::vector<int> seqs;
  for (int b = 0; b < o.batch; ++b) {
    const int seq = cache.new_sequence();
    seqs.push_back(seq);
    for (int p = 0; p < o.ctx; p += chunk) {
      const int n = std::min(chunk, o.ctx - p);
      cache.reserve(seq, n);
      cache.append(seq, 0, p, n, k.data(), v.data());
      cache.commit(seq, n);
    }
  }
  const float scale = 1.f / std::sqrt(float(d));
  std::vector<float> q(size_t(o.batch) * hq * d), out(q.size());
  for (auto& x : q) x = nd(rng) * scale;
  AttentionFigures f;
  f.cache = cache.config().describe();
  f.bits = cache.footprint(o.ctx).bits_per_element;
  for (int seq : seqs) f.bytes_read += decode_bytes(cache, seq, o.ctx - 1);
  const AttentionShape shape{hq, hk, d};
  std::vector<AttentionJob> jobs;
  for (int b = 0; b < o.batch; ++b)
    jobs.push_back({seqs[size_t(b)], o.ctx - 1, 1, q.data() + size_t(b) * hq * d, out.data() + size_t(b) * hq * d});
  auto step = [&] { cache_attention(cache, jobs, 0, shape, pool); };
  step();  // warm-up
  std::vector<double> ms, cpu;
  uint64_t touch = 0;
  for (int it = 0; it < o.iters; ++it) {
    if (!o.hot)
      for (size_t i = 0; i < evict.size(); i += 64) touch += evict[i];  // read 96 MB: push the cache out of L1-L3
    const double c0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    ms.push_back(1e3 * seconds_since(t0));
    cpu.push_back(1e3 * (process_cpu_seconds() - c0));
  }
  f.ms = median(ms);
  f.cpu_ms = median(cpu);
  if (touch == 1) std::fprintf(stderr, "\n");  // keeps the eviction reads alive
  f.ms_min = *std::min_element(ms.begin(), ms.end());
  // Append one token of one layer (window encode + demotion of what leaves the window), sequence 0.
  std::vector<double> ams;
  for (int i = 0; i < n_append; ++i) {
    for (size_t j = 0; j < size_t(hk) * d; ++j) k[j] = nd(rng), v[j] = nd(rng);
    const auto t0 = std::chrono::steady_clock::now();
    cache.reserve(seqs[0], 1);
    cache.append(seqs[0], 0, o.ctx + i, 1, k.data(), v.data());
    cache.commit(seqs[0], 1);
    ams.push_back(1e3 * seconds_since(t0));
  }
  // Mean: KIVI demotes a whole block every G tokens, so the cost per token is the average.
  double sum = 0;
  for (double a : ams) sum += a;
  f.append_ms = sum / double(ams.size());
  return f;
}

}  // namespace kvq
