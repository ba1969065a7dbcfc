// KV cache + attention against the scalar reference (attention/attention_ref.h): demotion order and contents,
// the quant_end rule, fast attention accuracy per codec, LSE merge, split-KV, transform invariance, and
// perplexity end to end on models/ref.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "attention/attention.h"
#include "attention/attention_ref.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "eval/perplexity.h"
#include "kv/cache.h"
#include "kv/transform.h"
#include "model/model.h"
#include "rotation/rotation_file.h"
#include "simd/simd.h"
#include "test_helpers.h"
#include "tokenizer/tokenizer.h"

using namespace kvq;

namespace {

CodecSpec spec(const std::string& type, int group, bool key) {
  CodecSpec s;
  s.type = type;
  s.group = group;
  s.clip = 1.0f;
  s.per_channel = key && codec_traits(type).per_channel_keys;
  s.token_scale = key && codec_traits(type).token_scale_keys;
  return s;
}

CacheConfig config(const std::string& type, int group, int sink, int recent, int page, int chunk) {
  CacheConfig c;
  c.k = spec(type, group, true);
  c.v = spec(type, group, false);
  c.sink = sink;
  c.recent = recent;
  c.page_tokens = page;
  c.max_chunk = chunk;
  if (type == "f32") c.window = "f32";
  c.key_rope = test::rope_inv_freq(128);  // for key codecs that store keys without RoPE (kv/codec_rope.h)
  c.k = test::with_test_widths(c.k, 1, 2);  // PN-Mix keys: widths for attention_nmse's 1 layer × 2 kv heads
  return c;
}

// Rows [n, n_kv, d] of N(0, 1) values plus a per-channel offset (keys have outlier channels in practice).
std::vector<float> random_rows(std::mt19937& rng, int n, int n_kv, int d, float offset) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(n) * n_kv * d);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) + offset * float(int(i % size_t(d)) % 7 - 3);
  return x;
}

// Rows of one (layer, kv head) as the runs for [t_first, t_last] expose them, decoded: window rows and quantized
// rows by position (a position may be in both: recent for early queries, quantized for later ones).
struct DecodedView {
  std::vector<std::vector<float>> window_k, window_v, quant_k, quant_v;  // [pos] -> row, empty if absent
};

DecodedView decode_view(const KvCache& cache, int seq, int h, int t_first, int t_last) {
  const int d = cache.head_dim();
  std::vector<KvCache::Run> runs;
  cache.runs(seq, 0, h, t_first, t_last, runs);
  DecodedView dv;
  for (auto* v : {&dv.window_k, &dv.window_v, &dv.quant_k, &dv.quant_v}) v->resize(size_t(t_last) + 1);
  int last_end[3] = {0, 0, 0};  // per run kind: runs of one kind are contiguous and in position order
  for (const auto& r : runs) {
    const bool quant = r.kind == KvCache::RunKind::Quant;
    int& end = last_end[int(r.kind)];
    if (end > 0) {
      EXPECT_EQ(r.pos0, end) << "runs of one kind out of position order";
    }
    end = r.pos0 + r.n;
    if (quant) {
      EXPECT_EQ((r.pos0 - cache.config().sink) % cache.config().page_tokens, 0) << "quant run off a page";
    }
    for (int kv = 0; kv < 2; ++kv) {
      const KvCodec& codec = quant ? (kv ? cache.v_codec() : cache.k_codec()) : cache.window_codec();
      const int tpb = codec.tokens_per_block();
      EXPECT_EQ(r.n % tpb, 0);
      std::vector<float> rows(size_t(tpb) * d);
      for (int t0 = 0; t0 < r.n; t0 += tpb) {
        codec.decode_at((kv ? r.v : r.k) + size_t(t0 / tpb) * codec.bytes_per_block(), r.pos0 + t0, rows.data());
        for (int i = 0; i < tpb; ++i) {
          auto& dst = quant ? (kv ? dv.quant_v : dv.quant_k) : (kv ? dv.window_v : dv.window_k);
          dst[size_t(r.pos0 + t0 + i)].assign(rows.begin() + i * d, rows.begin() + (i + 1) * d);
        }
      }
    }
  }
  return dv;
}

// Checks that every row a query at t reads from the cache is bit-identical to the reference's row.
void expect_view_matches(const KvCache& cache, const ReferenceKv& ref, const DecodedView& dv, int h, int t,
                         const std::string& what) {
  const int d = cache.head_dim(), S0 = cache.config().sink, qe = ref.quant_end(t);
  ASSERT_EQ(cache.quant_end(t), qe) << what << " t=" << t;
  for (int pos = 0; pos <= t; ++pos) {
    const bool quant = pos >= S0 && pos < qe;
    const auto& k = quant ? dv.quant_k[size_t(pos)] : dv.window_k[size_t(pos)];
    const auto& v = quant ? dv.quant_v[size_t(pos)] : dv.window_v[size_t(pos)];
    ASSERT_EQ(int(k.size()), d) << what << ": no " << (quant ? "quantized" : "window") << " key row for pos " << pos
                                << " (query " << t << ")";
    ASSERT_EQ(int(v.size()), d) << what << ": no value row for pos " << pos;
    ASSERT_EQ(std::memcmp(k.data(), ref.key(t, pos, h), sizeof(float) * d), 0)
        << what << ": key row " << pos << " for query " << t << (quant ? " (quantized)" : " (window)");
    ASSERT_EQ(std::memcmp(v.data(), ref.value(t, pos, h), sizeof(float) * d), 0)
        << what << ": value row " << pos << " for query " << t;
  }
}

// Appends n_tokens in chunks and checks the decode view of the first and last query of every chunk's round (a chunk
// is appended and attended append_tokens rows at a time: the ring holds no more).
void run_demotion_case(const std::string& type, int sink, int recent, int page, int chunk, int n_tokens,
                       const std::string& window = "") {
  const int n_kv = 2, d = 64, group = 32;
  CacheConfig cfg = config(type, group, sink, recent, page, chunk);
  if (!window.empty()) cfg.window = window;
  cfg.key_rope = test::rope_inv_freq(d);
  const std::string what = fmt::format("{} chunk={} page={}", cfg.describe(), chunk, page);
  KvCache cache(cfg, 1, n_kv, d, n_tokens);
  ReferenceKv ref(cfg, n_kv, d);
  std::mt19937 rng{uint32_t(sink * 7 + recent * 13 + page * 17 + chunk)};
  const int seq = cache.new_sequence();
  for (int p = 0; p < n_tokens; p += chunk) {
    const int n = std::min(chunk, n_tokens - p);
    const auto k = random_rows(rng, n, n_kv, d, 2.f), v = random_rows(rng, n, n_kv, d, 0.f);
    cache.reserve(seq, n);
    for (int r = 0; r < n; r += cache.layout().append_tokens) {
      const int m = std::min(cache.layout().append_tokens, n - r), a = p + r;
      const size_t at = size_t(r) * n_kv * d;
      cache.append(seq, 0, a, m, k.data() + at, v.data() + at);
      ref.append(m, k.data() + at, v.data() + at);
      for (int t = a; t < a + m; ++t) ASSERT_EQ(cache.quant_end(t), ref.quant_end(t)) << what;
      for (int h = 0; h < n_kv; ++h) {
        const DecodedView dv = decode_view(cache, seq, h, a, a + m - 1);
        expect_view_matches(cache, ref, dv, h, a, what);
        expect_view_matches(cache, ref, dv, h, a + m - 1, what);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
    cache.commit(seq, n);
  }
}

double nmse(const std::vector<double>& ref, const float* x) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) num += (x[i] - ref[i]) * (x[i] - ref[i]), den += ref[i] * ref[i];
  return num / den;
}

}  // namespace

TEST(CacheDemotion, QuantEndRuleByHandIncludingKiviBlocks) {
  // Per-token int2: S0 = 4, W = 16: position 4 is demoted once it is 17 tokens old (t = 20).
  KvCache c1(config("int2", 32, 4, 16, 16, 8), 1, 1, 64, 100);
  EXPECT_EQ(c1.block_tokens(), 1);
  EXPECT_EQ(c1.quant_end(0), 4);
  EXPECT_EQ(c1.quant_end(19), 4);
  EXPECT_EQ(c1.quant_end(20), 5);
  EXPECT_EQ(c1.quant_end(50), 35);
  // KIVI G = 32: block [4, 36) leaves the window [t - 15, t] when t - 15 > 35, i.e. at t = 51, all at once.
  KvCache c2(config("kivi2", 32, 4, 16, 32, 8), 1, 1, 64, 200);
  EXPECT_EQ(c2.block_tokens(), 32);
  EXPECT_EQ(c2.quant_end(50), 4);
  EXPECT_EQ(c2.quant_end(51), 36);
  EXPECT_EQ(c2.quant_end(82), 36);
  EXPECT_EQ(c2.quant_end(83), 68);
  // No windows: every token is quantized as soon as it arrives (per-token), or per whole block (KIVI).
  KvCache c3(config("int2", 32, 0, 0, 16, 8), 1, 1, 64, 100);
  EXPECT_EQ(c3.quant_end(0), 1);
  EXPECT_EQ(c3.quant_end(9), 10);
  KvCache c4(config("kivi2", 32, 0, 0, 32, 8), 1, 1, 64, 100);
  EXPECT_EQ(c4.quant_end(30), 0);
  EXPECT_EQ(c4.quant_end(31), 32);
}

TEST(CacheDemotion, PageSizeNotMultipleOfKiviBlockIsAnError) {
  EXPECT_THROW(KvCache(config("kivi2", 32, 4, 16, 16, 8), 1, 1, 64, 100), Error);
}

TEST(CacheDemotion, RowsMatchReferenceOverChunksAndWindows) {
  // Every (sink, recent) × chunk size, page 16, per-token int2 and KIVI (G = 32 tokens, page 32).
  for (auto [sink, recent] : {std::pair{0, 0}, {4, 16}, {64, 256}, {16, 64}})
    for (int chunk : {1, 7, 64, 300}) {
      const int n_tokens = sink + recent + (chunk == 1 ? 150 : 420);
      run_demotion_case("int2", sink, recent, 16, chunk, n_tokens);
      if (HasFatalFailure()) return;
      run_demotion_case("kivi2", sink, recent, 32, chunk, n_tokens);
      if (HasFatalFailure()) return;
    }
}

TEST(CacheDemotion, RowsMatchReferenceOverPageSizes) {
  for (int page : {1, 16, 64, 128})
    for (int chunk : {7, 300}) {
      run_demotion_case("int4", 4, 16, page, chunk, 700);
      if (HasFatalFailure()) return;
      if (page % 32 == 0) run_demotion_case("kivi2", 4, 16, page, chunk, 700);
      if (HasFatalFailure()) return;
      run_demotion_case("nexusquant", 4, 16, page, chunk, 700);  // keys stored without RoPE: positional
      if (page % 128 == 0) run_demotion_case("kitty_int2", 4, 16, page, chunk, 700);  // key blocks of 128 tokens
      if (HasFatalFailure()) return;
    }
}

TEST(CacheDemotion, Int8WindowRowsMatchReferenceOverChunksAndWindows) {
  // KV4-RL's INT8 windows (METHODS §5.6): window rows are int8 round trips, demoted rows the body codec's of bf16(x).
  for (auto [sink, recent] : {std::pair{0, 0}, {4, 16}, {16, 64}})
    for (int chunk : {1, 7, 64, 300}) {
      for (const char* body : {"int4", "int2"}) {
        run_demotion_case(body, sink, recent, 16, chunk, sink + recent + (chunk == 1 ? 150 : 420), "int8");
        if (HasFatalFailure()) return;
      }
    }
  run_demotion_case("nexusquant", 4, 16, 16, 7, 300, "int8");  // a positional body codec, encoded at append
}

namespace {

// Fast cache_attention vs the reference over a sequence of n_tokens, one cache per SIMD level of `levels` (cfg's own
// when empty) fed the same rows: all but the last 1 + n_check tokens are appended without attention, then a chunk of
// up to 40 queries (some checked), then one decode query. Returns the worst NMSE seen at each level (the references
// are computed once for all levels); `versus` (optional) gets each level's worst NMSE against a second reference.
std::vector<double> attention_nmse_at(const CacheConfig& cfg, const std::vector<SimdLevel>& levels, int n_tokens,
                                      const CacheConfig* other = nullptr, std::vector<double>* versus = nullptr) {
  const int n_kv = 2, hq = 8, d = 128, chunk_last = 40;
  std::vector<std::unique_ptr<KvCache>> caches;
  for (SimdLevel level : levels.empty() ? std::vector<SimdLevel>{cfg.simd} : levels) {
    CacheConfig c = cfg;
    c.simd = level;
    caches.push_back(std::make_unique<KvCache>(c, 1, n_kv, d, n_tokens));
  }
  ReferenceKv ref(cfg, n_kv, d);
  std::unique_ptr<ReferenceKv> ref2 = other ? std::make_unique<ReferenceKv>(*other, n_kv, d) : nullptr;
  ThreadPool pool(2);
  std::mt19937 rng{uint32_t(n_tokens)};
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<int> seqs;
  for (auto& c : caches) seqs.push_back(c->new_sequence());
  const int n_prefill = std::max(0, n_tokens - 1 - chunk_last);
  std::vector<double> worst(caches.size(), 0.0), worst2(caches.size(), 0.0);
  auto step = [&](int p, int n, bool attend) {
    const auto k = random_rows(rng, n, n_kv, d, 1.f), v = random_rows(rng, n, n_kv, d, 0.f);
    for (size_t i = 0; i < caches.size(); ++i) {
      caches[i]->reserve(seqs[i], n);
      caches[i]->append(seqs[i], 0, p, n, k.data(), v.data());
      caches[i]->commit(seqs[i], n);
    }
    ref.append(n, k.data(), v.data());
    if (ref2) ref2->append(n, k.data(), v.data());
    if (!attend) return;
    std::vector<float> q(size_t(n) * hq * d);
    for (auto& x : q) x = 2.f * nd(rng) / std::sqrt(float(d));  // peaked enough that the weights vary a lot
    std::vector<std::vector<float>> out(caches.size(), std::vector<float>(q.size()));
    for (size_t c = 0; c < caches.size(); ++c)
      cache_attention(*caches[c], seqs[c], 0, p, n, q.data(), out[c].data(), AttentionShape{hq, n_kv, d}, pool);
    for (int i : {0, n / 3, n / 2, n - 2, n - 1}) {
      if (i < 0) continue;
      std::vector<double> expect(size_t(hq) * d), expect2(ref2 ? expect.size() : 0);
      ref.attend(p + i, q.data() + size_t(i) * hq * d, hq, expect.data());
      if (ref2) ref2->attend(p + i, q.data() + size_t(i) * hq * d, hq, expect2.data());
      for (size_t c = 0; c < caches.size(); ++c) {
        worst[c] = std::max(worst[c], nmse(expect, out[c].data() + size_t(i) * hq * d));
        if (ref2) worst2[c] = std::max(worst2[c], nmse(expect2, out[c].data() + size_t(i) * hq * d));
      }
    }
  };
  for (int p = 0; p < n_prefill; p += cfg.max_chunk) step(p, std::min(cfg.max_chunk, n_prefill - p), false);
  if (n_tokens - 1 > n_prefill) step(n_prefill, n_tokens - 1 - n_prefill, true);
  step(n_tokens - 1, 1, true);
  if (versus) *versus = worst2;
  return worst;
}

// The same at cfg's own SIMD level: the worst NMSE; `versus` (optional) the worst against a second reference.
double attention_nmse(const CacheConfig& cfg, int n_tokens, const CacheConfig* other = nullptr,
                      double* versus = nullptr) {
  std::vector<double> v;
  const double worst = attention_nmse_at(cfg, {}, n_tokens, other, versus ? &v : nullptr)[0];
  if (versus) *versus = v[0];
  return worst;
}

}  // namespace

// Budget: the reference uses the same decoded rows, so only kernel arithmetic differs: float sums over <= 4097
// rows (relative ~1e-7 each) and, on AVX-512 VNNI, queries / weights rounded to int16 (relative error <= 2^-16
// of the group's largest element, ~1.5e-5, giving output NMSE ~(1.5e-5)^2 · O(10)). 1e-6 leaves margin for
// both while the quantization error itself (int2 vs bf16 rows: NMSE ~1e-2) is four orders of magnitude larger.
// Rows of int2 with one 128-value group (int2 and kivi2 values at G = 128) use int8 queries / weights on VNNI
// (relative error 1/254 of the largest element): there the budget is a tenth of the quantization error the
// same cache shows against exact f32 rows, i.e. the kernel's rounding stays small beside what int2 costs.
// Every SIMD level this CPU runs (CacheConfig::simd, --simd): AVX2 rounds the int rows' operands as VNNI does.
TEST(CacheAttention, FastMatchesReferenceForEveryCodecAndAwkwardLengthsAtEverySimdLevel) {
  const double kBudget = 1e-6;
  std::vector<SimdLevel> levels;  // one cache per level, fed the same rows, against references computed once
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAvx512Vnni})
    if (simd_level_supported(level)) levels.push_back(level);
  for (const CodecTraits& t : codec_table()) {  // every codec of the table
    if (t.id == CodecId::kF32) continue;      // the exact rows the others are compared against
    const std::string type(t.name);
    std::vector<double> worst(levels.size(), 0.0);
    for (int n_tokens : {1, 63, 64, 65, 257, 1000, 4097}) {
      CacheConfig cfg = config(type, 128, 16, 64, 128, 512);
      if (t.keys_only) cfg.v = spec("bf16", 128, false);  // keys-only codecs (TurboQuant's codebook keys)
      cfg.transform = codec_transform(cfg, 1, 2, 128);    // the one they imply (random rows: not applied here)
      CacheConfig exact = cfg;
      exact.k.type = exact.v.type = "f32";
      exact.k.per_channel = exact.v.per_channel = false;
      std::vector<double> quant_error;
      const std::vector<double> e = attention_nmse_at(cfg, levels, n_tokens, &exact, &quant_error);
      for (size_t l = 0; l < levels.size(); ++l) {
        // int2 rows of one group take int8 operands where the level does
        const bool relative = simd_int8_operands(levels[l]) && t.grouped && t.code_bits == 2;
        const double budget = relative ? std::max(kBudget, 0.1 * quant_error[l]) : kBudget;
        EXPECT_LE(e[l], budget) << cfg.describe() << " at " << simd_level_name(levels[l]) << " n_tokens=" << n_tokens
                                << " quantization NMSE " << quant_error[l];
        worst[l] = std::max(worst[l], e[l]);
      }
    }
    for (size_t l = 0; l < levels.size(); ++l)
      std::printf("fast vs reference attention, %s, %s: worst NMSE %.3g\n", simd_level_name(levels[l]), type.c_str(),
                  worst[l]);
  }
}

// A sliding window (Mistral, CacheConfig::attn_window): every query reads exactly the positions (t - w, t] as the
// reference does (which skips the rest), through sinks, pages and the recent ring alike, and the runs of a chunk
// start at its first query's window: no row behind it is handed out (per-token codecs: none at all; KIVI keys: the
// rest of the 128-token block holding the window's start).
TEST(CacheAttention, SlidingWindowReadsOnlyTheWindowAndMatchesTheReference) {
  for (const char* type : {"bf16", "int2", "kivi2"})
    for (int w : {1, 24, 100, 300}) {
      CacheConfig cfg = config(type, 128, 16, 64, 128, 512);
      cfg.attn_window = {w};
      CacheConfig exact = cfg;  // the budget of FastMatchesReferenceForEveryCodecAndAwkwardLengths
      exact.k.type = exact.v.type = "f32";
      exact.k.per_channel = exact.v.per_channel = false;
      // int2 rows of one group take int8 operands at AVX2 and VNNI (simd_int8_operands), as in the test above
      const bool relative = simd_int8_operands(best_simd_level()) && std::string(type) != "bf16";
      for (int n_tokens : {65, 1000}) {
        double quant_error = 0;
        const double e = attention_nmse(cfg, n_tokens, &exact, &quant_error);
        EXPECT_LE(e, relative ? std::max(1e-6, 0.1 * quant_error) : 1e-6) << type << " window " << w;
      }
      KvCache cache(cfg, 1, 2, 128, 1000);
      std::mt19937 rng{7};
      const int seq = cache.new_sequence();
      const int slack = cache.codec_block_tokens() - 1;  // a quantized run starts on a codec block
      for (int p = 0; p < 900; p += 100) {  // rounds the ring holds; the runs of the queries of each
        const auto k = random_rows(rng, 100, 2, 128, 1.f), v = random_rows(rng, 100, 2, 128, 0.f);
        cache.reserve(seq, 100);
        cache.append(seq, 0, p, 100, k.data(), v.data());
        cache.commit(seq, 100);
        for (int t_first : {p, p + 20, p + 99}) {  // the window's start in the sinks, the pages and the ring
          std::vector<KvCache::Run> runs;
          cache.runs(seq, 0, 1, t_first, p + 99, runs);
          int first = 1 << 30;
          for (const KvCache::Run& r : runs) first = std::min(first, r.pos0);
          const int lo = std::max(0, t_first - w + 1);
          EXPECT_GE(first, lo - slack) << type << " window " << w << " queries from " << t_first;
          EXPECT_LE(first, lo) << type << " window " << w << " queries from " << t_first;
        }
      }
      // Queries past the rows the ring still holds are refused (they would read rows later appends overwrote).
      std::vector<KvCache::Run> runs;
      EXPECT_THROW(cache.runs(seq, 0, 1, 100, 899, runs), Error) << type << " window " << w;
    }
}

TEST(CacheAttention, FastMatchesReferenceWithInt8Windows) {
  // The windows read through the int8 codec's fast paths (KV4-RL): the same budget as any codec above.
  for (int n_tokens : {1, 65, 1000}) {
    CacheConfig cfg = config("int4", 128, 16, 64, 128, 512);
    cfg.window = "int8";
    EXPECT_LE(attention_nmse(cfg, n_tokens), 1e-6) << cfg.describe() << " n_tokens=" << n_tokens;
  }
}

TEST(CacheAttention, Int2DiffersFromBf16ByFarMoreThanTheBudget) {
  // The NMSE test above has teeth: against an all-bf16 reference the int2 cache is visibly different, by far
  // more than the fast kernels' own rounding (int8 operands on VNNI: a tenth of it, see above).
  const CacheConfig cfg = config("int2", 128, 16, 64, 128, 512), bf = config("bf16", 128, 16, 64, 128, 512);
  double vs_bf16 = 0;
  const double e = attention_nmse(cfg, 1000, &bf, &vs_bf16);
  const SimdLevel best = best_simd_level();
  EXPECT_LE(e, simd_int8_operands(best) ? 0.1 * vs_bf16 : 1e-6) << "vs bf16 " << vs_bf16;
  EXPECT_GT(vs_bf16, 1e-3);
}

// A chunk longer than the ring's round (kv/cache_layout.h: W + B + 128 slots) is appended and attended in rounds by
// append_and_attend: two sequences in one batch, chunks of 400 (four rounds, after 200 tokens) and 130 (two, from 0),
// every query against the reference at the exact scalar level; the same chunk appended at once and then attended is
// refused (its first queries' rows are gone from the ring).
TEST(CacheAttention, ChunksLongerThanTheRingAreAttendedInRoundsAndMatchTheReference) {
  const int n_kv = 2, hq = 8, d = 128;
  for (const char* type : {"int2", "bf16", "kivi2"}) {
    CacheConfig cfg = config(type, 128, 16, 64, 128, 512);
    cfg.simd = SimdLevel::kScalar;  // exact float kernels: the budget of the reference comparisons above
    KvCache cache(cfg, 1, n_kv, d, 1024, 3);
    ASSERT_EQ(cache.layout().append_tokens, 128);
    ASSERT_LT(cache.layout().ring_tokens, 400) << type;
    ReferenceKv ref_a(cfg, n_kv, d), ref_b(cfg, n_kv, d);
    ReferenceKv* refs[2] = {&ref_a, &ref_b};
    ThreadPool pool(2);
    std::mt19937 rng{11};
    const int a = cache.new_sequence(), b = cache.new_sequence();
    {  // 200 tokens of a first, without attention
      const auto k = random_rows(rng, 200, n_kv, d, 1.f), v = random_rows(rng, 200, n_kv, d, 0.f);
      cache.reserve(a, 200);
      cache.append(a, 0, 0, 200, k.data(), v.data());
      cache.commit(a, 200);
      ref_a.append(200, k.data(), v.data());
    }
    const int n[2] = {400, 130}, pos0[2] = {200, 0};
    std::vector<float> k[2], v[2], q[2], out[2];
    std::vector<AppendJob> jobs;
    for (int j = 0; j < 2; ++j) {
      k[j] = random_rows(rng, n[j], n_kv, d, 1.f), v[j] = random_rows(rng, n[j], n_kv, d, 0.f);
      q[j] = random_rows(rng, n[j], hq, d, 0.f);
      for (float& x : q[j]) x *= 2.f / std::sqrt(float(d));
      out[j].assign(q[j].size(), 0.f);
      cache.reserve(j ? b : a, n[j]);
      jobs.push_back({j ? b : a, pos0[j], n[j], k[j].data(), v[j].data(), q[j].data(), out[j].data()});
    }
    append_and_attend(cache, jobs, 0, AttentionShape{hq, n_kv, d}, pool);
    double worst = 0;
    for (int j = 0; j < 2; ++j) {
      cache.commit(j ? b : a, n[j]);
      refs[j]->append(n[j], k[j].data(), v[j].data());
      for (int i = 0; i < n[j]; ++i) {
        std::vector<double> expect(size_t(hq) * d);
        refs[j]->attend(pos0[j] + i, q[j].data() + size_t(i) * hq * d, hq, expect.data());
        worst = std::max(worst, nmse(expect, out[j].data() + size_t(i) * hq * d));
      }
    }
    EXPECT_LE(worst, 1e-6) << type;
    // The same 400 rows appended at once, then attended: the ring no longer holds the first queries' rows.
    const int c = cache.new_sequence();
    std::vector<float> o(q[0].size());
    cache.reserve(c, 400);
    cache.append(c, 0, 0, 400, k[0].data(), v[0].data());
    EXPECT_THROW(cache_attention(cache, c, 0, 0, 400, q[0].data(), o.data(), AttentionShape{hq, n_kv, d}, pool), Error)
        << type;
  }
}

TEST(SoftmaxMerge, MergedSegmentsEqualOneSoftmaxOverTheConcatenation) {
  const int rows = 3, d = 8, n = 50;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> s(size_t(rows) * n), v(size_t(n) * d);
  for (auto& x : s) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  auto state_over = [&](int lo, int hi) {  // direct online-softmax state of keys [lo, hi)
    SoftmaxState st;
    st.reset(rows, d);
    for (int r = 0; r < rows; ++r) {
      if (hi <= lo) continue;
      float m = -INFINITY;
      for (int i = lo; i < hi; ++i) m = std::max(m, s[size_t(r) * n + i]);
      st.m[size_t(r)] = m;
      for (int i = lo; i < hi; ++i) {
        const float w = std::exp(s[size_t(r) * n + i] - m);
        st.l[size_t(r)] += w;
        for (int c = 0; c < d; ++c) st.acc[size_t(r) * d + c] += w * v[size_t(i) * d + c];
      }
    }
    return st;
  };
  const SoftmaxState whole = state_over(0, n);
  for (auto cuts : {std::vector<int>{0, 17, 50}, {0, 1, 2, 30, 49, 50}, {0, 0, 25, 25, 50}}) {
    SoftmaxState st = state_over(cuts[0], cuts[1]);
    for (size_t c = 2; c < cuts.size(); ++c) st.merge(state_over(cuts[c - 1], cuts[c]), d);
    for (int r = 0; r < rows; ++r) {
      EXPECT_NEAR(std::log(st.l[size_t(r)]) + st.m[size_t(r)], std::log(whole.l[size_t(r)]) + whole.m[size_t(r)],
                  1e-5);
      for (int c = 0; c < d; ++c)
        EXPECT_NEAR(st.acc[size_t(r) * d + c] / st.l[size_t(r)], whole.acc[size_t(r) * d + c] / whole.l[size_t(r)],
                    1e-5);
    }
  }
}

TEST(CacheAttention, SplitKvDecodeEqualsSingleThread) {
  for (const std::string type : {"int2", "bf16", "kivi2"}) {
    const int n_kv = 2, hq = 8, d = 128, n_tokens = 3000;
    const CacheConfig cfg = config(type, 128, 64, 256, 128, 512);
    KvCache cache(cfg, 1, n_kv, d, n_tokens);
    std::mt19937 rng(9);
    const int seq = cache.new_sequence();
    for (int p = 0; p < n_tokens; p += 512) {
      const int n = std::min(512, n_tokens - p);
      const auto k = random_rows(rng, n, n_kv, d, 1.f), v = random_rows(rng, n, n_kv, d, 0.f);
      cache.reserve(seq, n);
      cache.append(seq, 0, p, n, k.data(), v.data());
      cache.commit(seq, n);
    }
    const auto q = random_rows(rng, hq, 1, d, 0.f);
    std::vector<float> one(size_t(hq) * d), four(one.size());
    ThreadPool p1(1), p4(4);
    cache_attention(cache, seq, 0, n_tokens - 1, 1, q.data(), one.data(), AttentionShape{hq, n_kv, d}, p1);
    cache_attention(cache, seq, 0, n_tokens - 1, 1, q.data(), four.data(), AttentionShape{hq, n_kv, d}, p4);
    for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(four[i], one[i], 1e-5 * (1 + std::abs(one[i]))) << type;
  }
}

TEST(CacheAttention, F32CacheIsInvariantToKeyCenteringAndOrthogonalRotations) {
  const int n_kv = 2, hq = 8, d = 64, n_tokens = 700, chunk = 100;
  const CacheConfig cfg = config("f32", 32, 16, 64, 32, chunk);
  auto t = std::make_shared<KvTransform>();
  t->n_layers = 1, t->n_kv_heads = n_kv, t->head_dim = d, t->name = "test";
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int h = 0; h < n_kv; ++h) {
    for (auto* r : {&t->r_k, &t->r_v}) {
      const auto m = test::random_orthogonal(d, rng);
      r->insert(r->end(), m.begin(), m.end());
    }
    for (int c = 0; c < d; ++c) t->key_mean.push_back(3.f * nd(rng));
  }
  KvCache plain(cfg, 1, n_kv, d, n_tokens), rotated(cfg, 1, n_kv, d, n_tokens);
  ThreadPool pool(2);
  const int s1 = plain.new_sequence(), s2 = rotated.new_sequence();
  double worst = 0;
  for (int p = 0; p < n_tokens; p += chunk) {
    const int n = std::min(chunk, n_tokens - p);
    auto k = random_rows(rng, n, n_kv, d, 2.f), v = random_rows(rng, n, n_kv, d, 0.f);
    auto q = random_rows(rng, n, hq, d, 0.f);
    for (auto& x : q) x *= 2.f / std::sqrt(float(d));
    std::vector<float> out1(q.size()), out2(q.size());
    plain.reserve(s1, n);
    plain.append(s1, 0, p, n, k.data(), v.data());
    plain.commit(s1, n);
    cache_attention(plain, s1, 0, p, n, q.data(), out1.data(), AttentionShape{hq, n_kv, d}, pool);
    // As model.cpp does: transform k, v, q; append; attend; un-rotate the outputs.
    t->keys(0, n, k.data());
    t->values(0, n, v.data());
    t->queries(0, n, hq, q.data());
    rotated.reserve(s2, n);
    rotated.append(s2, 0, p, n, k.data(), v.data());
    rotated.commit(s2, n);
    cache_attention(rotated, s2, 0, p, n, q.data(), out2.data(), AttentionShape{hq, n_kv, d}, pool);
    t->outputs(0, n, hq, out2.data());
    for (size_t i = 0; i < out1.size(); ++i) worst = std::max(worst, double(std::abs(out1[i] - out2[i])));
  }
  EXPECT_LE(worst, 1e-5);
  // And the transform is not the identity: the cached keys differ.
  std::vector<KvCache::Run> r1, r2;
  plain.runs(s1, 0, 0, n_tokens - 1, n_tokens - 1, r1);
  rotated.runs(s2, 0, 0, n_tokens - 1, n_tokens - 1, r2);
  EXPECT_NE(std::memcmp(r1[0].k, r2[0].k, 64), 0);
}

namespace {

// Perplexity of models/ref over the first 1024 tokens of data/eval/linux.txt through a cache of `type` (clip: both
// sides' where the codec takes one), memoised by the cache's description so that tests share their runs.
double ref_ppl(const std::string& type, int sink, int recent, float clip, std::vector<int> skip_layers = {}) {
  static std::unique_ptr<Model> model = Model::load(std::string(KVQ_SOURCE_DIR) + "/models/ref", 2);
  static const std::vector<int32_t> ids = [] {
    const Tokenizer tok = Tokenizer::load(std::string(KVQ_SOURCE_DIR) + "/models/ref/tokenizer.json");
    std::ifstream f(std::string(KVQ_SOURCE_DIR) + "/data/eval/linux.txt");
    std::stringstream ss;
    ss << f.rdbuf();
    std::vector<int32_t> all = tok.encode(ss.str().substr(0, 20000));
    all.resize(std::min<size_t>(all.size(), 1024));
    return all;
  }();
  EXPECT_EQ(ids.size(), 1024u);
  CacheConfig c = config(type, 128, sink, recent, 128, 512);
  c.k.clip = c.v.clip = clip;
  c.skip_layers = std::move(skip_layers);
  static std::map<std::string, double> done;
  const auto [it, fresh] = done.try_emplace(c.describe(), 0.0);
  if (fresh) it->second = perplexity(*model, c, ids, 1024, 1).ppl();
  return it->second;
}

}  // namespace

TEST(CachePerplexity, Bf16MatchesF32AndInt8MatchesBf16AndInt2WithoutWindowsDegrades) {
  const double f32 = ref_ppl("f32", 0, 0, 1.f), bf16 = ref_ppl("bf16", 64, 256, 1.f);
  const double int8 = ref_ppl("int8", 0, 0, 1.f), int2 = ref_ppl("int2", 0, 0, 1.f);
  std::printf("ppl models/ref linux 1024: f32 %.4f bf16 %.4f int8 %.4f int2(no windows) %.4f\n", f32, bf16, int8,
              int2);
  EXPECT_NEAR(bf16 / f32, 1.0, 0.002);
  EXPECT_NEAR(int8 / bf16, 1.0, 0.005);
  EXPECT_GT(int2 / bf16, 1.10);
}

// End to end on models/ref (8 layers), no windows: keeping layers 0, 1, -2, -1 in bf16 (vLLM TurboQuant's policy; half
// of this model's layers) recovers part of int2's loss; Kitty's 2.53-bit cache (keys per channel over 128-token blocks,
// the largest quarter boosted) loses far less than per-token int2 and still reads its quantized rows.
TEST(CachePerplexity, SkippedBf16LayersReduceTheInt2ErrorAndKittyDegradesPlausibly) {
  const double bf16 = ref_ppl("bf16", 64, 256, 1.f), int2 = ref_ppl("int2", 0, 0, 1.f);
  const double skip = ref_ppl("int2", 0, 0, 1.f, {0, 1, -2, -1}), kitty = ref_ppl("kitty_int2", 0, 0, 1.f);
  std::printf("ppl models/ref linux 1024, no windows: bf16 %.4f int2 %.4f int2+skip(0,1,-2,-1) %.4f kitty_int2 %.4f\n",
              bf16, int2, skip, kitty);
  EXPECT_LT(std::log(skip / bf16), 0.8 * std::log(int2 / bf16));  // the skipped layers' share of the error is gone
  EXPECT_GT(skip / bf16, 1.005);                                  // the other half is still int2
  EXPECT_GT(kitty / bf16, 1.005);                                 // the quantized rows are read
  EXPECT_LT(kitty, int2);
}

// The vectorized exp of the online softmax: relative error <= 2e-7 (about 2 ulp; the Cephes polynomial's bound
// plus the rounding of r = x - n·ln2 and of 2^n·p) against std::exp on [-87, 0], 0 below -87.3, and exact max.
TEST(SoftmaxKernels, EveryLevelMatchesStdExpAndExactMax) {
  std::vector<float> x;
  for (int i = 0; i <= 20000; ++i) x.push_back(-87.f * float(i) / 20000.f);
  for (float v : {-87.29f, -87.31f, -100.f, -1e30f, -INFINITY}) x.push_back(v);
  for (int level = 0; level <= int(SimdLevel::kAvx512Vnni); ++level) {
    if (!simd_level_supported(SimdLevel(level))) continue;
    const SoftmaxKernels k = softmax_kernels(SimdLevel(level));
    for (int n : {1, 7, 16, 17, 33, int(x.size())}) {
      std::vector<float> y(x.begin(), x.begin() + n);
      const float m_in = 0.5f;  // exp(x - m) with a non-zero max
      const float sum = k.exp_sum(y.data(), n, m_in);
      double ref_sum = 0;
      for (int i = 0; i < n; ++i) {
        const float xm = x[size_t(i)] - m_in;  // the float argument every level sees
        const double e = std::exp(double(xm));
        ref_sum += e;
        if (xm < -87.3f)
          EXPECT_LE(y[size_t(i)], 1.3e-38f) << "level " << level << " x " << x[size_t(i)];
        else
          EXPECT_NEAR(y[size_t(i)], e, 2e-7 * e) << "level " << level << " x " << x[size_t(i)];
      }
      // float summation of n terms: relative error <= n·2^-24 on top of the 2e-7 of each term
      EXPECT_NEAR(sum, ref_sum, (2e-7 + n * 6e-8) * ref_sum) << "level " << level << " n " << n;
      EXPECT_EQ(k.max(x.data() + 3, n), softmax_max_ref(x.data() + 3, n)) << "level " << level;
    }
    EXPECT_EQ(k.max(x.data(), 0), -INFINITY);
  }
}
