// The twin harness of the GPU cache tests (tests/test_gpu_cache.cpp, tests/test_gpu_llamacpp.cpp): random rows, the
// same sequences driven through a CPU KvCache and a GpuKvCache step by step (attention compared by NMSE, stored rows
// byte for byte), and one decode step of a filled GPU cache (fast kernel vs its reference twin), at head_dim kD = 128
// unless a d is given. CUDA builds only.
#pragma once

#ifdef KVQ_HAVE_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "common/thread_pool.h"
#include "cuda/gpu_cache.h"
#include "cuda/gpu_instances.h"
#include "cuda/runtime.h"
#include "kv/cache.h"
#include "kv/transform.h"
#include "test_helpers.h"

#define REQUIRE_GPU() \
  if (!kvq::cuda::available()) GTEST_SKIP() << kvq::cuda::unavailable_reason()

namespace kvq::gpu_test {

constexpr int kD = 128;

enum class Data { Gaussian, HeavyTailed };

// [n, heads, d]: N(0, 1) (or a log-normal scale mixture of it: heavy tails, outliers) plus a per-channel offset.
inline std::vector<float> random_rows(std::mt19937& rng, int n, int heads, Data data, float scale = 1.f, int d = kD) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(n) * heads * d);
  for (size_t i = 0; i < x.size(); ++i) {
    float v = nd(rng);
    if (data == Data::HeavyTailed) v *= std::exp(0.9f * nd(rng));
    x[i] = scale * (v + 0.5f * float(int(i % d) % 7 - 3));
  }
  return x;
}

inline KvTransform random_transform(int n_layers, int n_kv, std::mt19937& rng, int d = kD) {
  KvTransform t;
  t.n_layers = n_layers, t.n_kv_heads = n_kv, t.head_dim = d, t.name = "test";
  std::normal_distribution<float> nd(0.f, 0.7f);
  t.key_mean.resize(size_t(n_layers) * n_kv * d);
  for (auto& x : t.key_mean) x = nd(rng);
  for (int i = 0; i < n_layers * n_kv; ++i) {
    const auto rk = test::random_orthogonal(d, rng), rv = test::random_orthogonal(d, rng);
    t.r_k.insert(t.r_k.end(), rk.begin(), rk.end());
    t.r_v.insert(t.r_v.end(), rv.begin(), rv.end());
  }
  return t;
}

inline double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = double(got[i]) - double(want[i]);
    num += e * e;
    den += double(want[i]) * double(want[i]);
  }
  return den > 0 ? num / den : num;
}

template <class T>
struct Dev {  // a device copy of a host vector
  cuda::DeviceBuffer buf;
  explicit Dev(const std::vector<T>& h) : buf(h.size() * sizeof(T)) { buf.upload(h.data(), h.size() * sizeof(T)); }
  explicit Dev(size_t n) : buf(n * sizeof(T)) {}
  T* get() const { return buf.as<T>(); }
};

// The NMSE that decoded tiles add where c runs on them at head_dim d (cuda/gpu_instances.h: the decoded keys and
// values, q and P' rounded to f16; the H100 measured up to 6.8e-6 against the exact twin), else 0: the bf16 instance's
// 1e-4, which rounds q and P' to bf16. Twin's comparisons take at least this budget.
inline double decoded_tile_budget(const CacheConfig& c, int d) {
  const int i = cuda::gpu_instance(c, d);
  return i >= 0 && cuda::kGpuInstances[i].path == cuda::GpuPath::kDecodedTile ? 1e-4 : 0.0;
}

// c on its CUDA-core row where a decoded-tile row would take it: a sliding window over n_layers that no test sequence
// reaches (2^20 positions), which only the CUDA-core rows run.
inline CacheConfig on_cuda_cores(CacheConfig c, int n_layers = 1) {
  c.attn_window.assign(size_t(n_layers), 1 << 20);
  return c;
}

// c with the transform t, which the GPU cache applies itself (the CPU twin applies it around its cache).
inline CacheConfig with_transform(CacheConfig c, const KvTransform& t) {
  c.transform = std::make_shared<KvTransform>(t);
  return c;
}

// The same sequences in a CPU KvCache and a GpuKvCache of head_dim d, driven through identical steps.
struct Twin {
  static constexpr int kLayers = 2, kKv = 2, kHeads = 8;  // GQA group of 4
  CacheConfig cfg;
  int d;
  KvCache cpu;
  cuda::GpuKvCache gpu;
  KvTransform tf;
  ThreadPool pool{0};
  std::vector<int> cpu_ids, gpu_ids;
  double worst_nmse = 0;

  Twin(const CacheConfig& c, int max_ctx, int n_seqs, const KvTransform& t, int head_dim = kD)
      : cfg(c), d(head_dim), cpu(c, kLayers, kKv, d, max_ctx, n_seqs),
        gpu(with_transform(c, t), kLayers, kKv, d, max_ctx, n_seqs), tf(t) {
    for (int i = 0; i < n_seqs; ++i) cpu_ids.push_back(cpu.new_sequence()), gpu_ids.push_back(gpu.new_sequence());
  }

  // One step: sequence index b appends n[b] tokens. compare: check the attention outputs (budget = NMSE, at least
  // decoded_tile_budget).
  void step(const std::vector<int>& idx, const std::vector<int>& n, std::mt19937& rng, Data data, bool compare,
            double budget, const std::string& what) {
    budget = std::max(budget, decoded_tile_budget(cfg, d));
    int rows = 0;
    for (int x : n) rows += x;
    std::vector<int> gseq;
    for (int b : idx) gseq.push_back(gpu_ids[size_t(b)]);
    gpu.begin_step(gseq, n);
    ASSERT_EQ(gpu.step_rows(), rows);
    const float scale = 1.f / std::sqrt(float(d));
    for (int l = 0; l < kLayers; ++l) {
      const auto k = random_rows(rng, rows, kKv, data, 1.f, d), v = random_rows(rng, rows, kKv, data, 1.f, d);
      const auto q = random_rows(rng, rows, kHeads, data, 0.7f, d);
      Dev<float> dk(k), dv(v), dq(q), dout(q.size());
      if (compare)
        gpu.append_and_attend(l, dk.get(), dv.get(), dq.get(), kHeads, dout.get());
      else
        gpu.append(l, dk.get(), dv.get());
      cuda::sync("test step");
      std::vector<float> got(q.size()), want(q.size());
      dout.buf.download(got.data(), got.size() * sizeof(float));
      int r0 = 0;
      for (size_t b = 0; b < idx.size(); ++b) {
        const int s = cpu_ids[size_t(idx[b])], nb = n[b], pos0 = cpu.length(s);
        if (l == 0) cpu.reserve(s, nb);
        std::vector<float> kb(k.begin() + size_t(r0) * kKv * d, k.begin() + size_t(r0 + nb) * kKv * d);
        std::vector<float> vb(v.begin() + size_t(r0) * kKv * d, v.begin() + size_t(r0 + nb) * kKv * d);
        std::vector<float> qb(q.begin() + size_t(r0) * kHeads * d, q.begin() + size_t(r0 + nb) * kHeads * d);
        for (float& x : qb) x *= scale;  // as model.cpp: scale, then transform
        tf.keys(l, nb, kb.data());
        tf.values(l, nb, vb.data());
        tf.queries(l, nb, kHeads, qb.data());
        cpu.observe_queries(s, l, pos0, nb, qb.data(), kHeads);  // as model.cpp (the evict policy's; else nothing)
        if (compare) {
          append_and_attend(cpu, s, l, pos0, nb, kb.data(), vb.data(), qb.data(),
                            want.data() + size_t(r0) * kHeads * d, AttentionShape{kHeads, kKv, d}, pool);
          tf.outputs(l, nb, kHeads, want.data() + size_t(r0) * kHeads * d);
        } else {
          cpu.append(s, l, pos0, nb, kb.data(), vb.data());
        }
        r0 += nb;
      }
      if (compare) {
        const double e = nmse(got, want);
        worst_nmse = std::max(worst_nmse, e);
        EXPECT_LT(e, budget) << what << " layer " << l;
        for (float x : got) ASSERT_TRUE(std::isfinite(x)) << what << ": non-finite GPU output";
      }
    }
    for (size_t b = 0; b < idx.size(); ++b) cpu.commit(cpu_ids[size_t(idx[b])], n[b]);
    gpu.commit_step();
  }

  // Prefill sequence b to `len` tokens in chunks of the cache's chunk size; compares the first and last chunk.
  void prefill(int b, int len, std::mt19937& rng, Data data, double budget) {
    const int chunk = cfg.max_chunk;
    for (int p = 0; p < len; p += chunk) {
      const int n = std::min(chunk, len - p);
      step({b}, {n}, rng, data, p == 0 || p + n == len, budget,
           "prefill seq " + std::to_string(b) + " [" + std::to_string(p) + ", " + std::to_string(p + n) + ")");
    }
  }

  // Stored rows of every (layer, head, K/V) of sequence b: GPU bytes vs the CPU cache's runs. Returns the number
  // of rows that differ and counts rows in *total.
  int64_t row_mismatches(int b, int64_t* total) const {
    const int cs = cpu_ids[size_t(b)], gs = gpu_ids[size_t(b)], len = cpu.length(cs);
    EXPECT_EQ(gpu.length(gs), len);
    int64_t bad = 0;
    std::vector<KvCache::Run> runs;
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kKv; ++h)
        for (int kv = 0; kv < 2; ++kv) {
          // the runs a query at the last position reads: from position 0, or under a sliding window (Mistral) from
          // the window's first codec block
          cpu.runs(cs, l, h, len - 1, len - 1, runs);
          int pos = 0;
          for (const auto& r : runs) {
            if (cfg.attn_window_of(l) == 0) EXPECT_EQ(r.pos0, pos) << "runs out of order";
            else EXPECT_GE(r.pos0, pos) << "runs out of order";
            const KvCodec& codec = kv ? *r.v_codec : *r.k_codec;  // the layer's (bf16 if skipped) or the window's
            const size_t rb = codec.bytes_per_block();
            const uint8_t* src = kv ? r.v : r.k;
            // Blocks of the run: rows, or KIVI key blocks of G rows (whole blocks in download_rows, gpu_cache.h).
            const int tpb = codec.tokens_per_block();
            EXPECT_EQ(r.n % tpb, 0) << "a quantized run of partial blocks";
            const std::vector<uint8_t> g = gpu.download_rows(gs, l, h, kv == 1, r.pos0, r.n);
            EXPECT_EQ(g.size(), size_t(r.n / tpb) * rb) << "GPU rows of a different total size";
            for (int i = 0; i < r.n / tpb; ++i) {
              ++*total;
              const size_t off = size_t(i) * rb;
              if (off + rb > g.size() || std::memcmp(g.data() + off, src + off, rb) != 0) ++bad;
            }
            if (r.kind == KvCache::RunKind::Quant && kv == 0 && h == 0 && r.scale) {  // ν of the run, once per layer
              const std::vector<float> nu = gpu.download_scales(gs, l, r.pos0, r.n);
              for (int i = 0; i < r.n; ++i, ++*total)
                if (std::memcmp(&nu[size_t(i)], &r.scale[i], sizeof(float)) != 0) ++bad;
            }
            pos = r.pos0 + r.n;
          }
          EXPECT_EQ(pos, len);
        }
    return bad;
  }
};

// Fills a GPU cache of head_dim d with one sequence of `len` tokens (random rows) and returns its attention outputs for
// one decode step under the given split size and kernel.
inline std::vector<float> decode_once(const CacheConfig& cfg, int len, int split_tokens, bool reference,
                                      int kHeads = 32, int d = kD) {
  constexpr int kKv = 8;  // with 32 query heads: the benchmark's GQA shape
  cuda::GpuKvCache c(cfg, 1, kKv, d, len + 1, 1);
  const int s = c.new_sequence();
  std::mt19937 rng(77);
  for (int p = 0; p < len; p += cfg.max_chunk) {
    const int n = std::min(cfg.max_chunk, len - p);
    Dev<float> k(random_rows(rng, n, kKv, Data::HeavyTailed, 1.f, d));
    Dev<float> v(random_rows(rng, n, kKv, Data::HeavyTailed, 1.f, d));
    c.begin_step({s}, {n});
    c.append(0, k.get(), v.get());
    c.commit_step();
  }
  Dev<float> k(random_rows(rng, 1, kKv, Data::Gaussian, 1.f, d)), v(random_rows(rng, 1, kKv, Data::Gaussian, 1.f, d));
  Dev<float> q(random_rows(rng, 1, kHeads, Data::Gaussian, 2.f, d)), out(size_t(kHeads) * d);
  c.set_split_tokens(split_tokens);
  c.set_reference_attention(reference);
  c.begin_step({s}, {1});
  c.append_and_attend(0, k.get(), v.get(), q.get(), kHeads, out.get());
  c.commit_step();
  cuda::sync("decode_once");
  std::vector<float> o(size_t(kHeads) * d);
  out.buf.download(o.data(), o.size() * sizeof(float));
  return o;
}

}  // namespace kvq::gpu_test

#endif  // KVQ_HAVE_CUDA
