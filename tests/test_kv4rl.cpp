// KV4-RL (METHODS §5.6): an INT4 body with INT8 sink / recent windows (--kv-window-type int8, --kv-cache-dtype kv4rl).
// Window rows are the §1 quantizer at b = 8; they demote at the same steps as BF16 windows, into the same body bytes
// (quantized from the BF16 value, not from the INT8 copy: kv/cache.h); attention differs from the BF16-window cache
// within a bound derived from the INT8 rows' error; the bytes counted are the stored ones, against §5.6's formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "attention/attention_ref.h"
#include "codecs/group_quant.h"
#include "codecs/int/codec_int.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "common/half.h"
#include "common/thread_pool.h"
#include "kv/cache.h"
#include "test_helpers.h"

using namespace kvq;

namespace {

constexpr int kD = 128, kG = 128;  // head_dim and group: int4 rows of 68 bytes (4.25 b), int8 rows of 132 (8.25 b)

CacheConfig config(const std::string& body, const std::string& window, int sink, int recent, int page, int chunk) {
  CacheConfig c;
  c.k = codec_spec(body, true, kG, 0.f);
  c.v = codec_spec(body, false, kG, 0.f);
  c.window = window;
  c.sink = sink, c.recent = recent, c.page_tokens = page, c.max_chunk = chunk;
  return c;
}

// Rows [n, n_kv, d]: N(0, 1) plus a per-channel offset (keys have outlier channels), so every group spans 0.
std::vector<float> random_rows(std::mt19937& rng, int n, int n_kv, float offset) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(n) * n_kv * kD);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) + offset * float(int(i % kD) % 7 - 3);
  return x;
}

float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

using test::error_of;

// Two caches fed the same rows: one with BF16 windows, one with INT8 windows.
struct Pair {
  KvCache bf16, int8;
  int seq_b, seq_i;
  std::vector<float> k, v;  // every row appended so far [n, n_kv, d]
  Pair(const CacheConfig& cb, const CacheConfig& ci, int n_layers, int n_kv, int max_ctx)
      : bf16(cb, n_layers, n_kv, kD, max_ctx), int8(ci, n_layers, n_kv, kD, max_ctx), seq_b(bf16.new_sequence()),
        seq_i(int8.new_sequence()) {}
  void append(int n, const std::vector<float>& kn, const std::vector<float>& vn) {
    const int p = bf16.length(seq_b);
    for (auto [c, s] : {std::pair{&bf16, seq_b}, std::pair{&int8, seq_i}}) {
      c->reserve(s, n);
      for (int l = 0; l < c->n_layers(); ++l) c->append(s, l, p, n, kn.data(), vn.data());
      c->commit(s, n);
    }
    k.insert(k.end(), kn.begin(), kn.end());
    v.insert(v.end(), vn.begin(), vn.end());
  }
};

}  // namespace

// After every step (decode steps and chunks), both caches expose the same runs: the quantized region ends at the same
// position and holds byte-identical body rows (the same tokens demoted at the same steps, into the same bytes), and the
// INT8 cache's window rows are exactly the int8 codec's rows of the raw values. Two layers and two kv heads (the body
// rows' places in the ring), also with a bf16-skipped layer.
TEST(Kv4rl, WindowRowsAreInt8AndDemoteIntoTheBf16WindowCachesBytesAtTheSameSteps) {
  const int n_kv = 2, S0 = 16, W = 64, P = 32, chunk = 64;
  const IntCodec int8_rows("int8", kD, kG, 8, 1.0f);
  for (const std::vector<int>& skip : {std::vector<int>{}, std::vector<int>{1}}) {
    CacheConfig cb = config("int4", "bf16", S0, W, P, chunk), ci = config("int4", "int8", S0, W, P, chunk);
    cb.skip_layers = ci.skip_layers = skip;
    Pair c(cb, ci, 2, n_kv, 700);
    ASSERT_EQ(c.int8.window_codec().name(), "int8");
    ASSERT_EQ(c.int8.window_codec().bytes_per_block(), 132u);
    ASSERT_EQ(c.int8.layout().ring_body, n_kv * (2 * 68 + (skip.empty() ? 2 * 68 : 2 * 256)));  // layer 0, layer 1
    std::mt19937 rng(7);
    const int steps[] = {5, 1, 1, 33, 1, 64, 7, 1, 1, 60, 64, 2, 1, 64, 64, 1, 50, 1};
    int demoted_steps = 0;
    for (int n : steps) {
      const int p = c.bf16.length(c.seq_b), qe_before = c.int8.quant_end(p - 1);
      c.append(n, random_rows(rng, n, n_kv, 2.f), random_rows(rng, n, n_kv, 0.f));
      demoted_steps += c.int8.quant_end(p + n - 1) > qe_before;
      for (int l = 0; l < 2; ++l)
        for (int h = 0; h < n_kv; ++h) {
          std::vector<KvCache::Run> rb, ri;
          c.bf16.runs(c.seq_b, l, h, p, p + n - 1, rb);
          c.int8.runs(c.seq_i, l, h, p, p + n - 1, ri);
          ASSERT_EQ(rb.size(), ri.size()) << "step at " << p;
          for (size_t r = 0; r < rb.size(); ++r) {
            ASSERT_EQ(rb[r].kind, ri[r].kind);
            ASSERT_EQ(rb[r].pos0, ri[r].pos0);
            ASSERT_EQ(rb[r].n, ri[r].n);
            if (ri[r].kind == KvCache::RunKind::Quant) {
              const size_t kb = ri[r].k_codec->bytes_per_block(), vb = ri[r].v_codec->bytes_per_block();
              EXPECT_EQ(std::memcmp(rb[r].k, ri[r].k, ri[r].n * kb), 0) << "layer " << l << " keys at " << ri[r].pos0;
              EXPECT_EQ(std::memcmp(rb[r].v, ri[r].v, ri[r].n * vb), 0) << "layer " << l << " values at " << ri[r].pos0;
              continue;
            }
            ASSERT_EQ(ri[r].k_codec, &c.int8.window_codec());
            std::vector<uint8_t> row(132);
            for (int i = 0; i < ri[r].n; ++i)
              for (int kv = 0; kv < 2; ++kv) {
                int8_rows.encode((kv ? c.v : c.k).data() + (size_t(ri[r].pos0 + i) * n_kv + h) * kD, row.data());
                ASSERT_EQ(std::memcmp((kv ? ri[r].v : ri[r].k) + size_t(i) * 132, row.data(), 132), 0)
                    << "window row " << ri[r].pos0 + i;
              }
          }
        }
      if (HasFatalFailure()) return;
    }
    EXPECT_GT(demoted_steps, 8);
    EXPECT_EQ(c.int8.quant_end(c.int8.length(c.seq_i) - 1), c.int8.length(c.seq_i) - W);
  }
}

// The spec's test (METHODS §5.6): a body row demoted from an INT8 window is the §1 quantizer at b = 4 of the BF16
// value (scalar reference: quantize_group on bf16(x)), not of the INT8 copy. Token by token, so every demoted row left
// the caller's hands steps before it was demoted. The two choices differ on most rows, mostly in their fp16 scale /
// zero (the INT8 copy moves a group's min and max); on these rows their squared errors against x agree to about seven
// digits (printed), so the choice costs bytes (the test below) rather than buying measurable accuracy here.
TEST(Kv4rl, DemotionQuantizesTheBf16ValueNotTheInt8Copy) {
  const int n_kv = 2, n = 300;
  KvCache cache(config("int4", "int8", 4, 16, 16, 8), 1, n_kv, kD, n);
  const IntCodec int4("int4", kD, kG, 4, 1.0f), int8("int8", kD, kG, 8, 1.0f);
  std::mt19937 rng(11);
  std::vector<float> k, v;
  const int seq = cache.new_sequence();
  for (int p = 0; p < n; ++p) {
    const auto kp = random_rows(rng, 1, n_kv, 2.f), vp = random_rows(rng, 1, n_kv, 0.f);
    cache.reserve(seq, 1);
    cache.append(seq, 0, p, 1, kp.data(), vp.data());
    cache.commit(seq, 1);
    k.insert(k.end(), kp.begin(), kp.end());
    v.insert(v.end(), vp.begin(), vp.end());
  }
  int rows = 0, rows_differ = 0, params_differ = 0;
  double err_unrounded = 0, err_copy = 0;
  std::vector<float> ref(kD), got(kD), copy(kD), tmp(kD);
  std::vector<uint8_t> block(132), codes(kG);
  for (int h = 0; h < n_kv; ++h) {
    std::vector<KvCache::Run> runs;
    cache.runs(seq, 0, h, n - 1, n - 1, runs);
    for (const KvCache::Run& r : runs) {
      if (r.kind != KvCache::RunKind::Quant) continue;
      for (int i = 0; i < r.n; ++i)
        for (int kv = 0; kv < 2; ++kv) {
          const float* x = (kv ? v : k).data() + (size_t(r.pos0 + i) * n_kv + h) * kD;
          // Scalar reference: quantize bf16(x) at b = 4, dequantize with the stored fp16 scale and zero.
          for (int c = 0; c < kD; ++c) tmp[size_t(c)] = bf16_round(x[c]);
          const GroupQuant gq = quantize_group(tmp.data(), kG, 4, 1.0f, codes.data());
          for (int c = 0; c < kD; ++c) ref[size_t(c)] = dequant_value(codes[size_t(c)], gq.scale, gq.zero);
          int4.decode((kv ? r.v : r.k) + size_t(i) * 68, got.data());
          ASSERT_EQ(std::memcmp(got.data(), ref.data(), sizeof(float) * kD), 0) << "row " << r.pos0 + i;
          // The alternative: re-quantize the INT8 window row.
          int8.encode(x, block.data());
          int8.decode(block.data(), tmp.data());
          int4.encode(tmp.data(), block.data());
          int4.decode(block.data(), copy.data());
          rows_differ += std::memcmp(copy.data(), ref.data(), sizeof(float) * kD) != 0;
          params_differ += std::memcmp(block.data(), (kv ? r.v : r.k) + size_t(i) * 68, 4) != 0;
          ++rows;
          for (int c = 0; c < kD; ++c) {
            err_unrounded += double(ref[size_t(c)] - x[c]) * (ref[size_t(c)] - x[c]);
            err_copy += double(copy[size_t(c)] - x[c]) * (copy[size_t(c)] - x[c]);
          }
        }
    }
  }
  std::printf("demoted rows %d: %d differ between the BF16 value and the INT8 copy (%d in their fp16 scale / zero); "
              "squared error against x %.7g vs %.7g\n", rows, rows_differ, params_differ, err_unrounded, err_copy);
  EXPECT_EQ(rows, 2 * n_kv * (n - 4 - 16));
  EXPECT_GT(rows_differ, rows / 2);
}

// Attention with INT8 windows against the same cache with BF16 windows (the body rows are identical, test above).
// Bound: a window row differs by δ = int8(x) - bf16(x), each element within s/2 + 2^-9 |x|: int8(x) is within s/2
// of x (s the group's fp16 scale: the §1 code is round-to-nearest on a grid of step s whose ends cover the group when
// it spans 0; checked here), bf16(x) within 2^-9 |x|. Scores then move by at most ε = max_i |q·δk_i|, so every
// softmax weight by a factor within e^{±2ε}, and per channel c
//   |o'_c - o_c| <= max_i |δv_ic| + (e^{2ε} - 1) Σ_i p_i |v_ic - o_c|
// (o' - o = Σ p'_i δv_i + Σ (p'_i - p_i)(v_i - o), Σ p' = Σ p = 1), with p, o, v of the BF16-window rows (double,
// from the scalar reference), plus 1e-5 (1 + |o_c|) for the kernels' float sums.
TEST(Kv4rl, AttentionIsWithinTheInt8BoundOfTheBf16WindowCache) {
  const int n_kv = 2, hq = 8, S0 = 16, W = 64, P = 32, n_tokens = 600, n_last = 40;
  const CacheConfig cb = config("int4", "bf16", S0, W, P, 64), ci = config("int4", "int8", S0, W, P, 64);
  Pair c(cb, ci, 1, n_kv, n_tokens);
  ReferenceKv ref_b(cb, n_kv, kD), ref_i(ci, n_kv, kD);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  ThreadPool pool(2);
  for (int p = 0; p < n_tokens - n_last; p += 64) {
    const int n = std::min(64, n_tokens - n_last - p);
    const auto k = random_rows(rng, n, n_kv, 1.f), v = random_rows(rng, n, n_kv, 0.f);
    c.append(n, k, v);
    ref_b.append(n, k.data(), v.data());
    ref_i.append(n, k.data(), v.data());
  }
  const auto k = random_rows(rng, n_last, n_kv, 1.f), v = random_rows(rng, n_last, n_kv, 0.f);
  const int p0 = n_tokens - n_last;
  c.append(n_last, k, v);
  ref_b.append(n_last, k.data(), v.data());
  ref_i.append(n_last, k.data(), v.data());
  // The INT8 element bound on every window row (sinks and the recent window of the last query).
  for (int pos = 0; pos < n_tokens; ++pos) {
    if (pos >= S0 && pos < ref_i.quant_end(n_tokens - 1)) continue;
    for (int h = 0; h < n_kv; ++h)
      for (int kv = 0; kv < 2; ++kv) {
        const float* x = (kv ? c.v : c.k).data() + (size_t(pos) * n_kv + h) * kD;
        const float* w = kv ? ref_i.value(n_tokens - 1, pos, h) : ref_i.key(n_tokens - 1, pos, h);
        const auto [lo, hi] = std::minmax_element(x, x + kD);
        ASSERT_TRUE(*lo < 0.f && *hi > 0.f);  // the group spans 0: its fp16 zero is within the code range
        const float s = group_scale(*lo, *hi, 8);
        for (int i = 0; i < kD; ++i) ASSERT_LE(std::abs(w[i] - x[i]), 0.5f * s * (1 + 1e-4f)) << pos;
      }
  }
  std::vector<float> q(size_t(n_last) * hq * kD), out_b(q.size()), out_i(q.size());
  for (auto& x : q) x = 2.f * nd(rng) / std::sqrt(float(kD));
  cache_attention(c.bf16, c.seq_b, 0, p0, n_last, q.data(), out_b.data(), AttentionShape{hq, n_kv, kD}, pool);
  cache_attention(c.int8, c.seq_i, 0, p0, n_last, q.data(), out_i.data(), AttentionShape{hq, n_kv, kD}, pool);
  double worst_ratio = 0, max_diff = 0;
  for (int i = 0; i < n_last; ++i) {
    const int t = p0 + i;
    for (int h = 0; h < n_kv; ++h) {
      // The rows query t reads, BF16-window (b) and INT8-window (i) caches: [pos] -> row.
      std::vector<const float*> kb(size_t(t) + 1), ki(kb.size()), vb(kb.size()), vi(kb.size());
      std::vector<double> dv_max(kD, 0.0);  // max_i |δv_ic|
      for (int pos = 0; pos <= t; ++pos) {
        kb[size_t(pos)] = ref_b.key(t, pos, h), ki[size_t(pos)] = ref_i.key(t, pos, h);
        vb[size_t(pos)] = ref_b.value(t, pos, h), vi[size_t(pos)] = ref_i.value(t, pos, h);
        for (int e = 0; e < kD; ++e)
          dv_max[size_t(e)] = std::max(dv_max[size_t(e)], std::abs(double(vi[size_t(pos)][e]) - vb[size_t(pos)][e]));
      }
      for (int j = h * (hq / n_kv); j < (h + 1) * (hq / n_kv); ++j) {
        const float* qj = q.data() + (size_t(i) * hq + j) * kD;
        std::vector<double> p(size_t(t) + 1);
        double eps = 0, mx = -INFINITY;
        for (int pos = 0; pos <= t; ++pos) {
          double dot = 0, ddot = 0;
          for (int e = 0; e < kD; ++e) {
            dot += double(qj[e]) * kb[size_t(pos)][e];
            ddot += double(qj[e]) * (double(ki[size_t(pos)][e]) - kb[size_t(pos)][e]);
          }
          p[size_t(pos)] = dot;
          eps = std::max(eps, std::abs(ddot));
          mx = std::max(mx, dot);
        }
        double sum = 0;
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (double& x : p) x /= sum;
        std::vector<double> o(kD, 0.0), mad(kD, 0.0);  // o and Σ_i p_i |v_ic - o_c|
        for (int pos = 0; pos <= t; ++pos)
          for (int e = 0; e < kD; ++e) o[size_t(e)] += p[size_t(pos)] * vb[size_t(pos)][e];
        for (int pos = 0; pos <= t; ++pos)
          for (int e = 0; e < kD; ++e) mad[size_t(e)] += p[size_t(pos)] * std::abs(vb[size_t(pos)][e] - o[size_t(e)]);
        for (int e = 0; e < kD; ++e) {
          const size_t at = (size_t(i) * hq + j) * kD + size_t(e);
          const double bound =
              dv_max[size_t(e)] + std::expm1(2 * eps) * mad[size_t(e)] + 1e-5 * (1 + std::abs(o[size_t(e)]));
          const double diff = std::abs(double(out_i[at]) - out_b[at]);
          ASSERT_LE(diff, bound) << "query " << t << " head " << j << " channel " << e;
          worst_ratio = std::max(worst_ratio, diff / bound);
          max_diff = std::max(max_diff, diff);
        }
      }
    }
  }
  std::printf("INT8 vs BF16 windows: largest output difference %.3g, at most %.2f of its bound\n", max_diff,
              worst_ratio);
  EXPECT_GT(max_diff, 1e-4);  // the window rows really are INT8
}

// The bytes counted (CacheLayout::footprint, kvq info) are the bytes stored: INT8 rows of 132 bytes for the sinks and
// the recent window, and for the recent window also the body rows kept beside them (136 bytes per kv head: K + V),
// which demotion copies into the pages. So b_eff(N) = 4.25 + (S0 (8.25 - 4.25) + W · 8.25) / N: §5.6's formula
// 4.25 + (S0 + W)(8.25 - 4.25) / N plus W · 4.25 / N, the price of quantizing from the BF16 value.
TEST(Kv4rl, CountedBytesAreTheStoredBytesAgainstTheFormula) {
  const int n_layers = 3, n_kv = 2, S0 = 64, W = 256;
  const CacheConfig ci = config("int4", "int8", S0, W, 128, 512), cb = config("int4", "bf16", S0, W, 128, 512);
  const CacheLayout l = cache_layout(ci, n_layers, n_kv, kD), lb = cache_layout(cb, n_layers, n_kv, kD);
  EXPECT_EQ(l.window_row, 132);
  EXPECT_EQ(l.ring_body, int64_t(n_layers) * n_kv * 136);
  EXPECT_EQ(l.page_bytes, lb.page_bytes);
  EXPECT_EQ(l.window_bytes(), int64_t(n_layers) * 2 * n_kv * (S0 + l.ring_tokens) * 132 +
                                  int64_t(l.ring_tokens) * n_layers * n_kv * 136);
  EXPECT_EQ(lb.ring_body, 0);
  for (int N : {1024, 2048, 4096, 8192, 32768, 131072}) {
    const double spec = 4.25 + (S0 + W) * (8.25 - 4.25) / N;
    const double stored = 4.25 + (S0 * (8.25 - 4.25) + W * 8.25) / N;
    EXPECT_DOUBLE_EQ(l.footprint(N).bits_per_element, stored) << N;
    EXPECT_NEAR(stored - spec, W * 4.25 / N, 1e-12) << N;
    EXPECT_DOUBLE_EQ(l.footprint(N).quant_bits_per_element, 4.25) << N;
    EXPECT_DOUBLE_EQ(lb.footprint(N).bits_per_element, 4.25 + (S0 + W) * (16 - 4.25) / N) << N;  // §6, BF16
    std::printf("N %6d: b_eff int4 + int8 windows %.4f (§5.6 formula %.4f), + bf16 windows %.4f\n", N, stored, spec,
                lb.footprint(N).bits_per_element);
  }
  // Short sequences: the sinks hold no body rows; recent tokens do.
  EXPECT_DOUBLE_EQ(l.footprint(40).bits_per_element, 8.25);
  EXPECT_DOUBLE_EQ(l.footprint(100).bits_per_element, (64 * 8.25 + 36 * (8.25 + 4.25)) / 100);
  // The pool allocates what the layout says: pages, two sequences' windows among them.
  const KvCache cache(ci, n_layers, n_kv, kD, 4096, 2);
  EXPECT_EQ(cache.pool().n_pages(), 2 * (l.pages_per_seq(4096) + l.window_pages()));
  EXPECT_EQ(cache.bytes_allocated(), size_t(cache.pool().n_pages()) * size_t(l.page_bytes));
}

// Demotion from the BF16 value encodes a row at a time: body codecs with blocks of tokens, or token-scaled keys, are
// refused with INT8 windows, before any work.
TEST(Kv4rl, BlockAndTokenScaledBodiesAreRefusedWithInt8Windows) {
  EXPECT_NE(error_of([] { KvCache(config("kivi2", "int8", 64, 256, 128, 512), 1, 1, kD, 1024); })
                .find("window type 'int8' needs per-token key and value codecs"),
            std::string::npos);
  CacheConfig scaled = config("int4", "int8", 64, 256, 128, 512);
  scaled.k.token_scale = true;
  EXPECT_NE(error_of([&] { cache_layout(scaled, 1, 1, kD); }).find("k=int4 has blocks of 1 tokens and a token scale"),
            std::string::npos);
  EXPECT_NO_THROW(cache_layout(config("int2", "int8", 64, 256, 128, 512), 1, 1, kD));
}

// The preset: int4 keys and values with INT8 windows, one row of the one preset table.
TEST(Kv4rl, PresetNamesInt4BodyAndInt8Windows) {
  const CodecPreset* p = find_preset("kv4rl");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->k, CodecId::kInt4);
  EXPECT_EQ(p->v, CodecId::kInt4);
  EXPECT_EQ(p->window, CodecId::kInt8);
  EXPECT_TRUE(p->kvq_extension);
  EXPECT_NE(preset_names().find("kv4rl (int4 / int4, int8 windows, kvq extension)"), std::string::npos);
  for (const CodecPreset& other : codec_presets())
    if (other.name != "kv4rl") {
      EXPECT_EQ(other.window, CodecId::kBf16) << other.name;
    }
}
