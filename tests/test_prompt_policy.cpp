// The prompt boundary (kv/cache.h PromptPolicy, Runner::end_prompt, eval/perplexity.h prompt_tokens): exact-prompt,
// quantize-after-prompt and evict against references built from the raw rows and the codecs' decode, the eviction
// score and selection by hand, the bytes each policy stores, scoring with a prompt (ppl, KL, passkey's boundary), and
// one clear error per bad input. The model-level cases run models/ref at 256 tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <span>

#include "attention/attention.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "common/half.h"
#include "cuda/gpu_instances.h"
#include "eval/evaluator.h"
#include "eval/fidelity.h"
#include "eval/passkey.h"
#include "eval/perplexity.h"
#include "kv/cache.h"
#include "kv/evict.h"
#include "model/model.h"
#include "model/runner.h"
#include "tokenizer/tokenizer.h"

using namespace kvq;

namespace {

constexpr int kKv = 2, kD = 64, kHeads = 4;  // cache-level cases: 1 layer, GQA group of 2

CacheConfig cache_config(const std::string& type, int sink, int recent, PromptPolicy policy, double evict_bits = 0) {
  CacheConfig c;
  c.k = codec_spec(type, true, 32, 0.f);
  c.v = codec_spec(type, false, 32, 0.f);
  c.sink = sink;
  c.recent = recent;
  c.page_tokens = 16;
  c.max_chunk = 64;
  c.prompt_policy = policy;
  c.evict_bits = evict_bits;
  return c;
}

std::vector<float> random_rows(std::mt19937& rng, int n, int width, float offset) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(n) * width);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) + offset * float(int(i % kD) % 5 - 2);
  return x;
}

float bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// One layer's keys, values and queries of a sequence, appended to a cache in chunks like Model::attention_block does.
struct Stream {
  std::vector<float> k, v, q;  // [n, kKv, kD], [n, kKv, kD], [n, kHeads, kD] (q scaled)
  explicit Stream(int n, uint32_t seed) {
    std::mt19937 rng{seed};
    k = random_rows(rng, n, kKv * kD, 1.5f);
    v = random_rows(rng, n, kKv * kD, 0.f);
    q = random_rows(rng, n, kHeads * kD, 0.5f);
    for (float& x : q) x *= 0.25f;
  }
  // Appends [pos, end) in chunks of `chunk` and returns the attention outputs of those queries [end - pos, heads, d].
  std::vector<float> feed(KvCache& cache, int seq, int pos, int end, int chunk, ThreadPool& pool) const {
    std::vector<float> out(size_t(end - pos) * kHeads * kD);
    for (int p = pos; p < end; p += chunk) {
      const int n = std::min(chunk, end - p);
      cache.reserve(seq, n);
      cache.observe_queries(seq, 0, p, n, q.data() + size_t(p) * kHeads * kD, kHeads);
      cache.append(seq, 0, p, n, k.data() + size_t(p) * kKv * kD, v.data() + size_t(p) * kKv * kD);
      cache_attention(cache, seq, 0, p, n, q.data() + size_t(p) * kHeads * kD,
                      out.data() + size_t(p - pos) * kHeads * kD, AttentionShape{kHeads, kKv, kD}, pool);
      cache.commit(seq, n);
    }
    return out;
  }
};

// Attention in double of the query at t (head j) over the rows `row(pos, kv, h)` of the positions in `keep`.
template <class Row>
std::vector<double> reference_attention(const float* q, const std::vector<int>& keep, int j, Row row) {
  const int h = j / (kHeads / kKv);
  std::vector<double> s, out(kD, 0.0);
  double mx = -INFINITY, sum = 0;
  for (int pos : keep) {
    const std::vector<float> k = row(pos, 0, h);
    double dot = 0;
    for (int c = 0; c < kD; ++c) dot += double(q[size_t(j) * kD + c]) * k[size_t(c)];
    s.push_back(dot);
    mx = std::max(mx, dot);
  }
  for (size_t i = 0; i < keep.size(); ++i) {
    const double p = std::exp(s[i] - mx);
    sum += p;
    const std::vector<float> v = row(keep[i], 1, h);
    for (int c = 0; c < kD; ++c) out[size_t(c)] += p * v[size_t(c)];
  }
  for (double& x : out) x /= sum;
  return out;
}

std::vector<int> iota_to(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

}  // namespace

TEST(PromptPolicy, NamesRoundTripAndBadValuesAreClearErrors) {
  for (const char* name : {"decode-faithful", "exact-prompt", "quantize-after-prompt", "evict"})
    EXPECT_EQ(prompt_policy_name(parse_prompt_policy(name)), name);
  try {
    parse_prompt_policy("exact");
    FAIL() << "an unknown policy was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("known: decode-faithful, exact-prompt"), std::string::npos) << e.what();
  }
  // evict keeps unquantized rows, within its bits; bits belong to evict alone; quantize-after-prompt needs a bf16 window
  EXPECT_THROW(KvCache(cache_config("int2", 4, 8, PromptPolicy::kEvict, 3), 1, kKv, kD, 64), Error);
  EXPECT_THROW(KvCache(cache_config("bf16", 4, 8, PromptPolicy::kEvict, 0), 1, kKv, kD, 64), Error);
  EXPECT_THROW(KvCache(cache_config("bf16", 4, 8, PromptPolicy::kEvict, 17), 1, kKv, kD, 64), Error);
  EXPECT_THROW(KvCache(cache_config("int2", 4, 8, PromptPolicy::kExactPrompt, 3), 1, kKv, kD, 64), Error);
  CacheConfig int8_windows = cache_config("int4", 4, 8, PromptPolicy::kQuantizeAfterPrompt);
  int8_windows.window = "int8";
  EXPECT_THROW(KvCache(int8_windows, 1, kKv, kD, 64), Error);
  int8_windows.prompt_policy = PromptPolicy::kExactPrompt;  // exact-prompt reads the stored windows after the prompt
  EXPECT_NO_THROW(KvCache(int8_windows, 1, kKv, kD, 64));
  // One prompt per sequence.
  KvCache cache(cache_config("int2", 4, 8, PromptPolicy::kExactPrompt), 1, kKv, kD, 64);
  const int seq = cache.new_sequence();
  EXPECT_EQ(cache.prompt_end(seq), -1);
  cache.end_prompt(seq);
  EXPECT_EQ(cache.prompt_end(seq), 0);
  EXPECT_THROW(cache.end_prompt(seq), Error);
  // The GPU cache runs every policy (tests/test_gpu_prompt_policy.cpp); evict with a sliding window it refuses naming
  // the policy.
  EXPECT_EQ(cuda::gpu_unsupported(cache_config("int2", 64, 256, PromptPolicy::kExactPrompt), 128), "");
  EXPECT_EQ(cuda::gpu_unsupported(cache_config("int2", 64, 256, PromptPolicy::kQuantizeAfterPrompt), 128), "");
  CacheConfig evict = cache_config("bf16", 64, 256, PromptPolicy::kEvict, 4);
  EXPECT_EQ(cuda::gpu_unsupported(evict, 128), "");
  evict.attn_window = {4096};
  const std::string why = cuda::gpu_unsupported(evict, 128);
  EXPECT_NE(why.find("prompt policy 'evict' with a sliding window is not supported on the GPU"), std::string::npos)
      << why;
  // The description names a policy other than the default, and only then.
  EXPECT_EQ(cache_config("int2", 4, 8, PromptPolicy::kDecodeFaithful).describe().find("prompt="), std::string::npos);
  EXPECT_NE(cache_config("bf16", 4, 8, PromptPolicy::kEvict, 2.5).describe().find("prompt=evict/b2.5"),
            std::string::npos);
}

TEST(PromptPolicy, ExactPromptReadsExactRowsInThePromptAndTheStoredCacheAfterIt) {
  ThreadPool pool(2);
  const int P = 150, N = 230;
  const Stream st(N, 7);
  // The prompt's queries: equal to a bf16 cache without windows (the same pieces: exactly), not to int2's.
  KvCache exact(cache_config("int2", 0, 0, PromptPolicy::kExactPrompt), 1, kKv, kD, N);
  KvCache plain(cache_config("int2", 0, 0, PromptPolicy::kDecodeFaithful), 1, kKv, kD, N);
  CacheConfig bf16_cfg = cache_config("bf16", 0, 0, PromptPolicy::kDecodeFaithful);
  bf16_cfg.page_tokens = 128;  // pieces of 128 rows from position 0, as the exact store's
  KvCache bf(bf16_cfg, 1, kKv, kD, N);
  const int se = exact.new_sequence(), sp = plain.new_sequence(), sb = bf.new_sequence();
  const std::vector<float> oe = st.feed(exact, se, 0, P, 64, pool), op = st.feed(plain, sp, 0, P, 64, pool);
  const std::vector<float> ob = st.feed(bf, sb, 0, P, 64, pool);
  EXPECT_EQ(std::memcmp(oe.data(), ob.data(), oe.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(oe.data(), op.data(), oe.size() * sizeof(float)), 0);
  // After the prompt: the stored rows, the same as the decode-faithful int2 cache's (bit for bit), not bf16's.
  exact.end_prompt(se);
  plain.end_prompt(sp);
  bf.end_prompt(sb);
  const std::vector<float> ae = st.feed(exact, se, P, N, 32, pool), ap = st.feed(plain, sp, P, N, 32, pool);
  const std::vector<float> ab = st.feed(bf, sb, P, N, 32, pool);
  EXPECT_EQ(std::memcmp(ae.data(), ap.data(), ae.size() * sizeof(float)), 0);
  double diff = 0;
  for (size_t i = 0; i < ae.size(); ++i) diff = std::max(diff, double(std::abs(ae[i] - ab[i])));
  EXPECT_GT(diff, 0.05);  // int2 without windows is far from bf16
  EXPECT_EQ(exact.footprint(N, P).bits_per_element, exact.footprint(N).bits_per_element);
}

TEST(PromptPolicy, QuantizeAfterPromptFreezesTheCodecRegionAndKeepsLaterRowsBf16) {
  ThreadPool pool(2);
  const int S0 = 4, W = 16, P = 100, N = 180;
  const Stream st(N, 11);
  const CacheConfig cfg = cache_config("int2", S0, W, PromptPolicy::kQuantizeAfterPrompt);
  KvCache cache(cfg, 1, kKv, kD, N);
  const int seq = cache.new_sequence();
  st.feed(cache, seq, 0, P, 64, pool);
  cache.end_prompt(seq);
  const std::vector<float> out = st.feed(cache, seq, P, N, 7, pool);
  const int qe = cache.quant_end(P - 1);  // S0 + P - W - S0 = 84
  ASSERT_EQ(qe, 84);
  // The runs of the last query: sinks, pages up to qe(P - 1) only, then the exact store for everything later.
  std::vector<KvCache::Run> runs;
  cache.runs(seq, 0, 1, N - 1, N - 1, runs);
  ASSERT_GE(runs.size(), 3u);
  EXPECT_EQ(runs.front().kind, KvCache::RunKind::Sink);
  EXPECT_EQ(runs.back().kind, KvCache::RunKind::Exact);
  EXPECT_EQ(runs.back().pos0, qe);
  EXPECT_EQ(runs.back().n, N - qe);
  EXPECT_EQ(runs[runs.size() - 2].pos0 + runs[runs.size() - 2].n, qe);
  // The reference: bf16(x) outside [S0, qe(P - 1)), the codec's decode of the encoded bf16 rows inside it.
  CodecSpec ks = cfg.k, vs = cfg.v;
  ks.head_dim = vs.head_dim = kD;
  const auto kc = make_codec(ks), vc = make_codec(vs);
  auto row = [&](int pos, int kv, int h) {
    const float* x = (kv ? st.v : st.k).data() + (size_t(pos) * kKv + h) * kD;
    std::vector<float> r(kD);
    for (int c = 0; c < kD; ++c) r[size_t(c)] = bf16(x[c]);
    if (pos >= S0 && pos < qe) {
      const KvCodec& codec = kv ? *vc : *kc;
      std::vector<uint8_t> block(codec.bytes_per_block());
      codec.encode_at(r.data(), pos, block.data());
      codec.decode_at(block.data(), pos, r.data());
    }
    return r;
  };
  // The exact run holds bf16(x) of every row from qe(P - 1) on, bit for bit.
  const KvCache::Run& ex = runs.back();
  std::vector<float> got(kD);
  for (int i = 0; i < ex.n; ++i)
    for (int kv = 0; kv < 2; ++kv) {
      ex.k_codec->decode((kv ? ex.v : ex.k) + size_t(i) * ex.k_codec->bytes_per_block(), got.data());
      ASSERT_EQ(got, row(qe + i, kv, 1)) << "exact row " << qe + i;
    }
  // Attention after the prompt against it (the int2 kernels round q: held by NMSE as the cache's attention tests are;
  // a row after qe(P - 1) read through int2 would cost ~1e-2).
  for (int t : {P, P + 41, N - 1})
    for (int j = 0; j < kHeads; ++j) {
      const std::vector<double> want = reference_attention(st.q.data() + size_t(t) * kHeads * kD, iota_to(t + 1), j, row);
      double num = 0, den = 0;
      for (int c = 0; c < kD; ++c) {
        const double e = out[(size_t(t - P) * kHeads + j) * kD + c] - want[size_t(c)];
        num += e * e, den += want[size_t(c)] * want[size_t(c)];
      }
      EXPECT_LE(num / den, 1e-6) << "query " << t << " head " << j;
    }
  // Bytes at context N: S0 + (N - qe) bf16 rows, qe - S0 int2 rows (2.25 + 16 / 32 · ... : the codec's b_q).
  const CacheFootprint f = cache.footprint(N, P);
  const double bq = cache.footprint(N).quant_bits_per_element;
  EXPECT_NEAR(f.bits_per_element, (double(N - (qe - S0)) * 16 + double(qe - S0) * bq) / N, 1e-9);
}

TEST(PromptPolicy, EvictScoreAndSelectionByHand) {
  // One query at position 1 over k0 = 0, k1 = ln 3 e0 (q = e0): p = (1/4, 3/4); v0 = e0, v1 = 3 e1:
  // o = (1/4, 9/4), ||o|| = sqrt(82) / 4; score0 = 1/4 · (1/4) / ||o||, score1 = 3/4 · 27/4 / ||o||.
  // A second query at position 0 reads only t = 0: p = 1, o = v0, score0 += 1 · <v0, v0 / ||v0||> = 1.
  const int d = 8;
  std::vector<float> keys(2 * d, 0.f), values(2 * d, 0.f), q(2 * d, 0.f);
  keys[d + 0] = float(std::log(3.0));
  values[0] = 1.f;
  values[d + 1] = 3.f;
  q[0] = 1.f;
  q[d] = 1.f;
  const int q_pos[2] = {1, 0};
  const std::vector<double> s = evict_scores(keys.data(), values.data(), 2, d, q.data(), q_pos, 2, 1);
  const double norm = std::sqrt(82.0) / 4;
  EXPECT_NEAR(s[0], 0.25 * 0.25 / norm + 1.0, 1e-6);
  EXPECT_NEAR(s[1], 0.75 * 6.75 / norm, 1e-6);
  // Selection: sinks [0, 2), recent [9, 12), then the best 2 of [2, 9); 5 and 7 tie above 3: the lower (5) first.
  const std::vector<double> score = {0, 0, 0.1, 0.8, 0.2, 0.9, 0.3, 0.9, 0.5, 0, 0, 0};
  EXPECT_EQ(evict_keep(score, 2, 3, 7), (std::vector<int>{0, 1, 5, 7, 9, 10, 11}));
  EXPECT_EQ(evict_keep(score, 2, 3, 6), (std::vector<int>{0, 1, 5, 9, 10, 11}));
  EXPECT_EQ(evict_keep(score, 2, 3, 12), iota_to(12));
  EXPECT_THROW(evict_keep(score, 2, 3, 4), Error);  // cannot hold the windows
  EXPECT_EQ(evict_budget(2.79, 16, 1000), 174);
  EXPECT_EQ(evict_budget(16, 16, 1000), 1000);
  EXPECT_THROW(evict_budget(0, 16, 10), Error);
}

TEST(PromptPolicy, EvictKeepsTheTopTokensWithinTheBytesAndNeverReadsTheOthersAgain) {
  ThreadPool pool(2);
  const int S0 = 4, W = 8, P = 120, N = 170;
  const double bits = 4.0;
  const Stream st(N, 23);
  KvCache cache(cache_config("bf16", S0, W, PromptPolicy::kEvict, bits), 1, kKv, kD, N);
  const int seq = cache.new_sequence();
  st.feed(cache, seq, 0, P, 50, pool);
  cache.end_prompt(seq);
  const std::vector<float> out = st.feed(cache, seq, P, N, 9, pool);
  const int budget = evict_budget(bits, 16, P);  // 30 tokens
  ASSERT_EQ(budget, 30);
  auto row = [&](int pos, int kv, int h) {
    const float* x = (kv ? st.v : st.k).data() + (size_t(pos) * kKv + h) * kD;
    std::vector<float> r(kD);
    for (int c = 0; c < kD; ++c) r[size_t(c)] = bf16(x[c]);
    return r;
  };
  for (int h = 0; h < kKv; ++h) {
    // The kept set from the raw rows and the last 32 prompt queries, independently of the cache's store.
    std::vector<float> keys, values, queries;
    for (int t = 0; t < P; ++t) {
      const auto k = row(t, 0, h), v = row(t, 1, h);
      keys.insert(keys.end(), k.begin(), k.end());
      values.insert(values.end(), v.begin(), v.end());
    }
    std::vector<int> q_pos;
    for (int t = P - kEvictObserve; t < P; ++t) {
      q_pos.push_back(t);
      const float* q = st.q.data() + (size_t(t) * kHeads + h * 2) * kD;
      queries.insert(queries.end(), q, q + 2 * kD);
    }
    const std::vector<int> keep =
        evict_keep(evict_scores(keys.data(), values.data(), P, kD, queries.data(), q_pos.data(), kEvictObserve, 2),
                   S0, W, budget);
    ASSERT_EQ(int(keep.size()), budget);
    std::vector<KvCache::Run> runs;
    cache.runs(seq, 0, h, N - 1, N - 1, runs);
    ASSERT_EQ(runs.size(), 1u);
    ASSERT_EQ(runs[0].kind, KvCache::RunKind::Exact);
    ASSERT_EQ(runs[0].n, budget + N - P);
    ASSERT_NE(runs[0].positions, nullptr);
    EXPECT_EQ(std::vector<int>(runs[0].positions, runs[0].positions + budget), keep);
    for (int i = budget; i < runs[0].n; ++i) EXPECT_EQ(runs[0].positions[i], P + i - budget);
    // Attention after the prompt over the kept set and the later tokens only.
    for (int t : {P, P + 17, N - 1}) {
      std::vector<int> view = keep;
      for (int u = P; u <= t; ++u) view.push_back(u);
      for (int j = 2 * h; j < 2 * h + 2; ++j) {
        const std::vector<double> want = reference_attention(st.q.data() + size_t(t) * kHeads * kD, view, j, row);
        for (int c = 0; c < kD; ++c)
          ASSERT_NEAR(out[(size_t(t - P) * kHeads + j) * kD + c], want[size_t(c)], 2e-5) << t << " " << j;
      }
    }
  }
  // Bytes at the prompt: bits/16 of the prompt's BF16 bytes, within one token's rows; later tokens at 16 bits.
  const double bf16_bytes = double(P) * 2 * kKv * kD * 2;
  const double stored = cache.footprint(P, P).bytes_per_token_per_layer * P;
  EXPECT_LE(std::abs(stored - bits / 16 * bf16_bytes), 2.0 * kKv * kD * 2);
  EXPECT_NEAR(cache.footprint(N, P).bits_per_element, 16.0 * (budget + N - P) / N, 1e-9);
}

TEST(PromptPolicy, EvictWithABudgetOfEverythingEqualsBf16) {
  ThreadPool pool(2);
  const int P = 140, N = 200;
  const Stream st(N, 5);
  KvCache ev(cache_config("bf16", 0, 0, PromptPolicy::kEvict, 16), 1, kKv, kD, N);
  CacheConfig bf16_cfg = cache_config("bf16", 0, 0, PromptPolicy::kDecodeFaithful);
  bf16_cfg.page_tokens = 128;
  KvCache bf(bf16_cfg, 1, kKv, kD, N);
  const int se = ev.new_sequence(), sb = bf.new_sequence();
  const auto pe = st.feed(ev, se, 0, P, 64, pool), pb = st.feed(bf, sb, 0, P, 64, pool);
  ev.end_prompt(se);
  bf.end_prompt(sb);
  const auto ae = st.feed(ev, se, P, N, 13, pool), ab = st.feed(bf, sb, P, N, 13, pool);
  EXPECT_EQ(std::memcmp(pe.data(), pb.data(), pe.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(ae.data(), ab.data(), ae.size() * sizeof(float)), 0);
  EXPECT_EQ(ev.footprint(N, P).bits_per_element, 16.0);
}

// The budget stated at a context N (CacheConfig::evict_ctx, the referee's eviction row): every token after the prompt
// is kept, so the prompt keeps floor(bits N / 16) - (N - P) and a sequence of N tokens stores floor(bits N / 16)
// tokens' rows; the stored bytes at N equal bits/16 of N tokens' BF16 bytes, exactly where bits N / 16 is an integer.
TEST(PromptPolicy, EvictBudgetStatedAtAContextCountsTheTokensAfterThePrompt) {
  // by hand: int2 64/256 at 2048 stores 320 BF16 tokens + 1728 x 72 B per (token, kv head) = 563 BF16 tokens' bytes,
  // b_eff = 4.3984375; with a prompt of 1920 the 128 later tokens leave 435 prompt tokens
  EXPECT_EQ(evict_budget(4.3984375, 16, 1920, 2048), 435);
  EXPECT_EQ(evict_budget(4.3984375, 16, 2048, 2048), 563);
  EXPECT_EQ(evict_budget(2.79, 16, 1000, 0), evict_budget(2.79, 16, 1000));  // 0: the prompt's end, as before
  EXPECT_EQ(evict_budget(2.79, 16, 1000, 1000), 174);
  EXPECT_EQ(evict_budget(16, 16, 100, 300), 100);  // everything: at most the prompt
  EXPECT_THROW(evict_budget(4.0, 16, 100, 1000), Error);  // 250 tokens' rows cannot keep the 900 after the prompt
  EXPECT_THROW(evict_budget(4.0, 16, 300, 200), Error);   // the context is shorter than the prompt
  EXPECT_NO_THROW(evict_check_windows(12, 4, 8, 100));
  EXPECT_THROW(evict_check_windows(11, 4, 8, 100), Error);  // 4 sinks + 8 recent do not fit 11
  EXPECT_NO_THROW(evict_check_windows(3, 4, 8, 3));         // a prompt shorter than the sinks keeps what it has

  ThreadPool pool(2);
  const int S0 = 4, W = 8, P = 150, N = 170;
  const double bits = 3.5;  // 3.5 x 170 / 16 = 37.1875: 37 tokens' rows at N, 17 of the prompt's
  const Stream st(N, 31);
  CacheConfig cfg = cache_config("bf16", S0, W, PromptPolicy::kEvict, bits);
  cfg.evict_ctx = N;
  EXPECT_NE(cfg.describe().find("prompt=evict/b3.5@170"), std::string::npos) << cfg.describe();
  KvCache cache(cfg, 1, kKv, kD, N);
  const int seq = cache.new_sequence();
  st.feed(cache, seq, 0, P, 64, pool);
  cache.end_prompt(seq);
  st.feed(cache, seq, P, N, 7, pool);
  std::vector<KvCache::Run> runs;
  for (int h = 0; h < kKv; ++h) {  // what a query at the last position reads: 17 prompt tokens and the 20 later ones
    cache.runs(seq, 0, h, N - 1, N - 1, runs);
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].n, 37);
    EXPECT_LT(runs[0].positions[16], P);
    EXPECT_EQ(runs[0].positions[17], P);
  }
  const double row_bytes = 2.0 * kKv * kD * 2;  // one token's K and V rows of every kv head, bf16
  EXPECT_DOUBLE_EQ(cache.footprint(N, P).bytes_per_token_per_layer * N, 37 * row_bytes);
  EXPECT_LE(bits / 16 * N * row_bytes - cache.footprint(N, P).bytes_per_token_per_layer * N, row_bytes);
  // a budget that cannot hold the prompt's windows is refused by the footprint already (the referee's check before
  // any run), as end_prompt would refuse it
  CacheConfig tight = cfg;
  tight.evict_bits = 16.0 * 30 / N;  // 30 tokens' rows: 10 of the prompt's, fewer than its 4 + 8 window tokens
  EXPECT_THROW(KvCache(tight, 1, kKv, kD, N).footprint(N, P), Error);
  // ... and by end_prompt before it changes anything: the prompt stays open (the GPU cache's too, cuda/gpu_cache.cpp)
  KvCache refused(tight, 1, kKv, kD, N);
  const int r = refused.new_sequence();
  st.feed(refused, r, 0, P, 64, pool);
  EXPECT_THROW(refused.end_prompt(r), Error);
  EXPECT_EQ(refused.prompt_end(r), -1);
  refused.runs(r, 0, 0, P - 1, P - 1, runs);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].n, P) << "the open prompt still reads every exact row";
  EXPECT_EQ(runs[0].positions, nullptr);
  CacheConfig other = cache_config("bf16", S0, W, PromptPolicy::kExactPrompt);  // the context belongs to evict alone
  other.evict_ctx = N;
  EXPECT_THROW(KvCache(other, 1, kKv, kD, N), Error);
}

// ---- models/ref: the policies through the model, scoring with a prompt ----

namespace {

const std::string kModelDir = std::string(KVQ_SOURCE_DIR) + "/models/ref";

struct ModelFixture {
  std::unique_ptr<Model> model = Model::load(kModelDir, 2);
  Tokenizer tok = Tokenizer::load(kModelDir + "/tokenizer.json");
  std::vector<int32_t> ids;
  ModelFixture() {
    std::ifstream in(std::string(KVQ_SOURCE_DIR) + "/data/eval/python.txt", std::ios::binary);
    std::string text(6000, '\0');
    in.read(text.data(), std::streamsize(text.size()));
    text.resize(size_t(in.gcount()));
    ids = tok.encode(text);
  }
};

ModelFixture& mfx() {
  static ModelFixture f;
  return f;
}

CacheConfig model_cache(const std::string& type, PromptPolicy policy, double evict_bits = 0) {
  CacheConfig c;
  c.k = codec_spec(type, true, 128, 0.f);
  c.v = codec_spec(type, false, 128, 0.f);
  c.sink = c.recent = 0;  // pieces of 128 rows from 0 in every store: bf16 results equal bit for bit
  c.max_chunk = 64;
  c.prompt_policy = policy;
  c.evict_bits = evict_bits;
  return c;
}

constexpr int kCtx = 256, kPrompt = 128;

// The fixture's text as the one eval domain, and ppl + KL over one window of kCtx (the eval tests below).
std::vector<EvalDomain> fixture_domain(const ModelFixture& f) {
  std::vector<EvalDomain> domains(1);
  domains[0].name = "python";
  domains[0].ids = f.ids;
  return domains;
}

EvalConfig one_window_ppl_kl() {
  EvalConfig c;
  c.tasks = {"ppl", "kl"};
  c.ctx = {kCtx};
  c.windows = 1;
  c.bootstrap = 10;
  return c;
}

}  // namespace

TEST(PromptPolicyModel, EveryPolicyAtBf16EqualsTheBf16CacheAndPromptZeroIsTodaysScoring) {
  ModelFixture& f = mfx();
  const PerplexityResult want =
      perplexity(*f.model, model_cache("bf16", PromptPolicy::kDecodeFaithful), f.ids, kCtx, 1, {}, kPrompt);
  EXPECT_EQ(want.tokens_scored, kCtx - kPrompt);
  EXPECT_EQ(want.prompt_tokens, kPrompt);
  for (auto [policy, bits] : {std::pair{PromptPolicy::kExactPrompt, 0.0}, {PromptPolicy::kQuantizeAfterPrompt, 0.0},
                              {PromptPolicy::kEvict, 16.0}}) {
    const PerplexityResult got = perplexity(*f.model, model_cache("bf16", policy, bits), f.ids, kCtx, 1, {}, kPrompt);
    EXPECT_EQ(got.window_nll[0], want.window_nll[0]) << prompt_policy_name(policy);
  }
  // P = 0: every target but the first token's, from one plain chunked pass (what perplexity always did).
  CpuRunner runner(*f.model, model_cache("int2", PromptPolicy::kDecodeFaithful), kCtx);
  const int V = f.model->config().vocab_size;
  std::vector<float> logits(size_t(64) * V);
  const int seq = runner.new_sequence();
  double nll = 0;
  for (int pos = 0; pos < kCtx; pos += 64) {
    runner.forward(seq, f.ids.data() + pos, 64, logits.data(), true);
    for (int i = 0; i < 64; ++i)
      if (pos + i + 1 < kCtx) nll += token_nll(logits.data() + size_t(i) * V, V, f.ids[size_t(pos + i + 1)]);
  }
  runner.free_sequence(seq);
  const PerplexityResult p0 = perplexity(runner, f.ids, kCtx, 1);
  EXPECT_EQ(p0.window_nll[0], nll);
  EXPECT_EQ(p0.tokens_scored, kCtx - 1);
  // The prompt must leave a target: P >= ctx is one clear error.
  EXPECT_THROW(perplexity(runner, f.ids, kCtx, 1, {}, kCtx), Error);
}

TEST(PromptPolicyModel, ExactPromptLogitsEqualBf16AndTheContinuationReadsInt2) {
  ModelFixture& f = mfx();
  const int V = f.model->config().vocab_size;
  CpuRunner exact(*f.model, model_cache("int2", PromptPolicy::kExactPrompt), kCtx);
  CpuRunner bf(*f.model, model_cache("bf16", PromptPolicy::kDecodeFaithful), kCtx);
  CpuRunner plain(*f.model, model_cache("int2", PromptPolicy::kDecodeFaithful), kCtx);
  std::vector<float> le(size_t(64) * V), lb(le.size()), lp(le.size());
  const int se = exact.new_sequence(), sb = bf.new_sequence(), sp = plain.new_sequence();
  double prompt_vs_int2 = 0, after_vs_bf16 = 0;
  for (int pos = 0; pos < kCtx; pos += 64) {
    if (pos == kPrompt) exact.end_prompt(se), bf.end_prompt(sb), plain.end_prompt(sp);
    exact.forward(se, f.ids.data() + pos, 64, le.data(), true);
    bf.forward(sb, f.ids.data() + pos, 64, lb.data(), true);
    plain.forward(sp, f.ids.data() + pos, 64, lp.data(), true);
    if (pos < kPrompt) {
      ASSERT_EQ(std::memcmp(le.data(), lb.data(), le.size() * sizeof(float)), 0) << "prompt chunk at " << pos;
      for (size_t i = 0; i < le.size(); ++i) prompt_vs_int2 = std::max(prompt_vs_int2, double(std::abs(le[i] - lp[i])));
    } else {
      for (size_t i = 0; i < le.size(); ++i) after_vs_bf16 = std::max(after_vs_bf16, double(std::abs(le[i] - lb[i])));
    }
  }
  EXPECT_GT(prompt_vs_int2, 0.1);  // the decode-faithful int2 prompt is not exact
  EXPECT_GT(after_vs_bf16, 0.1);   // after the prompt, the int2 cache is read
}

TEST(PromptPolicyModel, EvalScoresTheSameTargetsInPplAndKlAndPasskeyEndsThePromptAtTheNeedlePrompt) {
  ModelFixture& f = mfx();
  const std::vector<EvalDomain> domains = fixture_domain(f);
  EvalConfig c = one_window_ppl_kl();
  c.prompt_fraction = 0.5;
  const CacheConfig cache = model_cache("int2", PromptPolicy::kExactPrompt);
  const EvalReport r = evaluate(*f.model, f.tok, cache, domains, c);
  ASSERT_EQ(r.ppl.size(), 1u);
  EXPECT_EQ(r.prompt_tokens, std::vector<int>{kPrompt});
  EXPECT_EQ(r.ppl[0].prompt_tokens, kPrompt);
  EXPECT_EQ(r.ppl[0].tokens, kCtx - kPrompt);
  EXPECT_EQ(r.kl[0].tokens, kCtx - kPrompt + 1);  // the rows predicting positions >= P, the last row included
  const PerplexityResult p = perplexity(*f.model, cache, f.ids, kCtx, 1, {}, kPrompt);
  EXPECT_EQ(r.ppl[0].window_nll[0], p.window_nll[0]);  // the lockstep pass scores what perplexity() scores
  EXPECT_GT(r.kl[0].kl.estimate, 0.0);
  // Bad prompts: both forms, or nothing left to score.
  EvalConfig both = c;
  both.prompt_tokens = 10;
  EXPECT_THROW(evaluate(*f.model, f.tok, cache, domains, both), Error);
  EvalConfig whole = c;
  whole.prompt_fraction = 0;
  whole.prompt_tokens = kCtx;
  EXPECT_THROW(evaluate(*f.model, f.tok, cache, domains, whole), Error);
  // Passkey's boundary: greedy_decode ends the prompt after the needle prompt's prefill, so with exact-prompt the first
  // answer token is the BF16 cache's (the prefill is exact) and an evict cache holding everything answers as BF16.
  const std::span<const int32_t> prompt(f.ids.data(), 200);
  CpuRunner bf(*f.model, model_cache("bf16", PromptPolicy::kDecodeFaithful), kCtx);
  CpuRunner exact(*f.model, cache, kCtx);
  CpuRunner all(*f.model, model_cache("bf16", PromptPolicy::kEvict, 16), kCtx);
  const std::vector<int32_t> want = greedy_decode(bf, prompt, 6);
  EXPECT_EQ(greedy_decode(exact, prompt, 1)[0], want[0]);
  EXPECT_EQ(greedy_decode(all, prompt, 6), want);
}

// A tail (EvalConfig::tail_fraction): each window's NLL over its targets at positions >= T, from the same pass, in the
// lockstep pass as in perplexity(); for a decode-faithful cache it equals a run whose prompt is T (the referee pairs
// its eviction row, prompt T, with every other run on it).
TEST(PromptPolicyModel, TailSumsTheTargetsAfterItAndEqualsARunWithThatPrompt) {
  ModelFixture& f = mfx();
  const std::vector<EvalDomain> domains = fixture_domain(f);
  EvalConfig c = one_window_ppl_kl();
  c.tail_fraction = 0.75;  // T = 192, a multiple of the chunk: the same chunks as a prompt of 192
  const CacheConfig cache = model_cache("int2", PromptPolicy::kDecodeFaithful);
  const EvalReport r = evaluate(*f.model, f.tok, cache, domains, c);
  ASSERT_EQ(r.ppl.size(), 1u);
  EXPECT_EQ(r.ppl[0].tail_prompt_tokens, 192);
  ASSERT_EQ(r.ppl[0].window_nll_tail.size(), 1u);
  const PerplexityResult prompt_t = perplexity(*f.model, cache, f.ids, kCtx, 1, {}, 192);
  EXPECT_EQ(r.ppl[0].window_nll_tail[0], prompt_t.window_nll[0]);
  const PerplexityResult plain = perplexity(*f.model, cache, f.ids, kCtx, 1, {}, 0, 192);
  EXPECT_EQ(plain.window_nll_tail, r.ppl[0].window_nll_tail);  // perplexity() sums the same tail
  EXPECT_EQ(plain.window_nll, r.ppl[0].window_nll);             // and the whole window as without one
  EXPECT_GT(r.ppl[0].window_nll[0], r.ppl[0].window_nll_tail[0]);
  const nlohmann::json j = report_json(r)["results"]["ppl"]["256"]["python"];
  EXPECT_EQ(j["prompt_tokens"], 0);
  EXPECT_EQ(j["tail"]["prompt_tokens"], 192);
  EXPECT_EQ(j["tail"]["tokens"], 64);
  EXPECT_EQ(j["tail"]["window_nll"][0].get<double>(), prompt_t.window_nll[0]);
  // A tail before the prompt, or none left to score, is one clear error.
  EvalConfig early = c;
  early.prompt_fraction = 0.8;
  EXPECT_THROW(evaluate(*f.model, f.tok, cache, domains, early), Error);
  EXPECT_THROW(perplexity(*f.model, cache, f.ids, kCtx, 1, {}, 0, kCtx), Error);
}

// The tail's KL and top-1 (WindowFidelity::kl_sum_tail etc.): over the rows that predict positions >= T (rows T - 1 ..
// ctx - 1), against a direct computation from the bf16 and int2 runners' logits (log-softmax in double, KL(p_bf16 ‖
// p_int2), argmax agreement), equal to the KL of a run whose prompt is T (what the eviction row compares), in
// results.json's kl tail with its bootstrap CI; a whole window's KL is not its tail's.
TEST(PromptPolicyModel, TailKlAndTop1EqualADirectComputationOverTheTailRows) {
  ModelFixture& f = mfx();
  const std::vector<EvalDomain> domains = fixture_domain(f);
  EvalConfig c = one_window_ppl_kl();
  c.tail_fraction = 0.75;  // T = 192
  const int T = 192;
  const CacheConfig cache = model_cache("int2", PromptPolicy::kDecodeFaithful);
  const EvalReport r = evaluate(*f.model, f.tok, cache, domains, c);
  ASSERT_EQ(r.kl.size(), 1u);
  ASSERT_EQ(r.kl[0].per_window.size(), 1u);
  const WindowFidelity& w = r.kl[0].per_window[0];
  // Direct: both runners over the window in chunks of 64, rows T - 1 .. ctx - 1.
  const int V = f.model->config().vocab_size;
  CpuRunner bf(*f.model, model_cache("bf16", PromptPolicy::kDecodeFaithful), kCtx);
  CpuRunner q(*f.model, cache, kCtx);
  std::vector<float> lb(size_t(64) * V), lq(lb.size());
  const int sb = bf.new_sequence(), sq = q.new_sequence();
  double kl = 0;
  int64_t agree = 0, rows = 0;
  const auto log_softmax = [&](const float* x) {
    double mx = x[0];
    for (int i = 1; i < V; ++i) mx = std::max(mx, double(x[i]));
    double s = 0;
    for (int i = 0; i < V; ++i) s += std::exp(double(x[i]) - mx);
    std::vector<double> out(static_cast<size_t>(V));
    for (int i = 0; i < V; ++i) out[size_t(i)] = double(x[i]) - mx - std::log(s);
    return out;
  };
  for (int pos = 0; pos < kCtx; pos += 64) {
    bf.forward(sb, f.ids.data() + pos, 64, lb.data(), true);
    q.forward(sq, f.ids.data() + pos, 64, lq.data(), true);
    for (int i = 0; i < 64; ++i) {
      if (pos + i < T - 1) continue;
      const float* pb = lb.data() + size_t(i) * V;
      const float* pq = lq.data() + size_t(i) * V;
      const std::vector<double> a = log_softmax(pb), b = log_softmax(pq);
      double row = 0;
      for (int v = 0; v < V; ++v) row += std::exp(a[size_t(v)]) * (a[size_t(v)] - b[size_t(v)]);
      kl += row;
      agree += std::max_element(pb, pb + V) - pb == std::max_element(pq, pq + V) - pq;
      ++rows;
    }
  }
  bf.free_sequence(sb), q.free_sequence(sq);
  EXPECT_EQ(rows, kCtx - T + 1);
  EXPECT_EQ(w.tokens_tail, rows);
  EXPECT_EQ(w.top1_agree_tail, agree);
  EXPECT_NEAR(w.kl_sum_tail, kl, 1e-9 * kl);
  EXPECT_GT(w.kl_sum_tail, 0.0);
  EXPECT_LT(w.kl_sum_tail, w.kl_sum);  // the tail is part of the window (KL >= 0 on every row)
  EXPECT_LT(w.tokens_tail, w.tokens);
  // The same rows as a run with a prompt of T (the eviction row's own KL), bit for bit.
  EvalConfig prompt_t = one_window_ppl_kl();
  prompt_t.prompt_tokens = T;
  const EvalReport rp = evaluate(*f.model, f.tok, cache, domains, prompt_t);
  EXPECT_EQ(rp.kl[0].per_window[0].kl_sum, w.kl_sum_tail);
  EXPECT_EQ(rp.kl[0].per_window[0].top1_agree, w.top1_agree_tail);
  EXPECT_EQ(rp.kl[0].per_window[0].tokens, w.tokens_tail);
  EXPECT_EQ(rp.kl[0].tail_prompt_tokens, 0);  // no tail there: none recorded
  EXPECT_FALSE(report_json(rp)["results"]["kl"]["256"]["python"].contains("tail"));
  // The entry and results.json: the tail's mean and agreement, its CI (one window: degenerate at the estimate).
  EXPECT_EQ(r.kl[0].tail_prompt_tokens, T);
  EXPECT_EQ(r.kl[0].tail_tokens, rows);
  EXPECT_DOUBLE_EQ(r.kl[0].kl_tail.estimate, w.kl_sum_tail / double(rows));
  EXPECT_DOUBLE_EQ(r.kl[0].top1_tail.estimate, double(agree) / double(rows));
  const nlohmann::json j = report_json(r)["results"]["kl"]["256"]["python"];
  EXPECT_EQ(j["prompt_tokens"], 0);
  EXPECT_EQ(j["tail"]["prompt_tokens"], T);
  EXPECT_EQ(j["tail"]["tokens"], rows);
  EXPECT_DOUBLE_EQ(j["tail"]["kl_mean"].get<double>(), w.kl_sum_tail / double(rows));
  EXPECT_DOUBLE_EQ(j["tail"]["kl_ci95"][0].get<double>(), w.kl_sum_tail / double(rows));
  EXPECT_DOUBLE_EQ(j["tail"]["top1"].get<double>(), double(agree) / double(rows));
  EXPECT_EQ(j["tail"]["window_kl_sum"][0].get<double>(), w.kl_sum_tail);
  EXPECT_EQ(j["tail"]["window_top1_agree"][0].get<int64_t>(), agree);
  EXPECT_EQ(j["tail"]["window_tokens"][0].get<int64_t>(), rows);
  EXPECT_NE(j["kl_mean"].get<double>(), j["tail"]["kl_mean"].get<double>());
  // KL alone (no ppl task) records the tail too.
  EvalConfig kl_only = c;
  kl_only.tasks = {"kl"};
  EXPECT_EQ(evaluate(*f.model, f.tok, cache, domains, kl_only).kl[0].per_window[0].kl_sum_tail, w.kl_sum_tail);
}
