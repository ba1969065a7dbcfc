// --kv-skip-layers (CacheConfig::skip_layers): the list's parser and its resolution against the model's layers, the
// per-layer cache layout (a skipped layer's quantized region holds bf16 rows; offsets and page bytes exact), the
// footprint's bits counting them, the rows a skipped layer stores, and attention: a skipped layer reads exactly what a
// bf16 cache reads, and the layers around it exactly what they read without the skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "codecs/layout.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "common/half.h"
#include "kv/cache.h"
#include "test_helpers.h"

using namespace kvq;

namespace {

using test::error_of;

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

CacheConfig config(const std::string& type, int group, int sink, int recent, int page, std::vector<int> skip = {}) {
  CacheConfig c;
  c.k = codec_spec(type, true, group, 0.f);
  c.v = codec_spec(type, false, group, 0.f);
  c.sink = sink;
  c.recent = recent;
  c.page_tokens = page;
  c.max_chunk = 64;
  c.skip_layers = std::move(skip);
  return c;
}

// Appends the same random keys / values ([n, n_kv, d] per layer) to every layer of each cache, in chunks of 64.
void fill(std::vector<KvCache*> caches, int n_tokens, uint32_t seed) {
  const KvCache& c0 = *caches[0];
  const int n_kv = c0.n_kv_heads(), d = c0.head_dim();
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (KvCache* c : caches) c->new_sequence();
  for (int p = 0; p < n_tokens; p += 64) {
    const int n = std::min(64, n_tokens - p);
    for (KvCache* c : caches) c->reserve(0, n);
    for (int l = 0; l < c0.n_layers(); ++l) {
      std::vector<float> k(size_t(n) * n_kv * d), v(k.size());
      for (size_t i = 0; i < k.size(); ++i) k[i] = nd(rng) + float(int(i % size_t(d)) % 5), v[i] = nd(rng);
      for (KvCache* c : caches) c->append(0, l, p, n, k.data(), v.data());
    }
    for (KvCache* c : caches) c->commit(0, n);
  }
}

// Attention outputs of layer l for the queries at [pos0, pos0 + n) (n_heads = 2 · n_kv).
std::vector<float> attend(const KvCache& c, int l, int pos0, int n, uint32_t seed) {
  const int hq = 2 * c.n_kv_heads(), d = c.head_dim();
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.2f);
  std::vector<float> q(size_t(n) * hq * d), out(q.size());
  for (float& x : q) x = nd(rng);
  ThreadPool pool(2);
  cache_attention(c, 0, l, pos0, n, q.data(), out.data(), AttentionShape{hq, c.n_kv_heads(), d}, pool);
  return out;
}

}  // namespace

TEST(SkipLayers, ParserTakesIntegersAndRefusesEmptyItemsNonIntegersAndRepeats) {
  EXPECT_EQ(parse_skip_layers("0,1,-2,-1"), (std::vector<int>{0, 1, -2, -1}));
  EXPECT_EQ(parse_skip_layers("5"), (std::vector<int>{5}));
  EXPECT_TRUE(parse_skip_layers("").empty());
  EXPECT_TRUE(has(error_of([] { parse_skip_layers("0,,1"); }), "empty item"));
  EXPECT_TRUE(has(error_of([] { parse_skip_layers("0,1,"); }), "empty item"));
  EXPECT_TRUE(has(error_of([] { parse_skip_layers("0,x"); }), "'x' is not a layer index"));
  EXPECT_TRUE(has(error_of([] { parse_skip_layers("1.5"); }), "'1.5' is not a layer index"));
  EXPECT_TRUE(has(error_of([] { parse_skip_layers(" 1"); }), "' 1' is not a layer index"));
  const std::string twice = error_of([] { parse_skip_layers("0,3,0"); });
  EXPECT_TRUE(has(twice, "--kv-skip-layers '0,3,0'") && has(twice, "layer 0 is named twice")) << twice;
}

TEST(SkipLayers, ResolvedFromTheEndAndCheckedAgainstTheModel) {
  const LayerSet s = skipped_layers(config("int2", 128, 0, 0, 16, {0, 1, -2, -1}), 28);
  for (int l = 0; l < 28; ++l) EXPECT_EQ(s.has(l), l < 2 || l >= 26) << l;
  EXPECT_EQ(s.count_below(28), 4);
  EXPECT_EQ(s.count_below(26), 2);
  const std::string out = error_of([] { skipped_layers(config("int2", 128, 0, 0, 16, {0, 8}), 8); });
  EXPECT_TRUE(has(out, "layer 8 is out of range for a model of 8 layers (0 .. 7, or -8 .. -1 from the end)")) << out;
  EXPECT_TRUE(
      has(error_of([] { skipped_layers(config("int2", 128, 0, 0, 16, {-9}), 8); }), "layer -9 is out of range"));
  const std::string same = error_of([] { skipped_layers(config("int2", 128, 0, 0, 16, {1, -7}), 8); });
  EXPECT_TRUE(has(same, "1 and -7 both name layer 1 of 8")) << same;
  // The cache refuses them when it is built, naming the flag.
  EXPECT_TRUE(has(error_of([] { KvCache(config("int2", 128, 4, 16, 16, {3}), 3, 1, 128, 100); }), "--kv-skip-layers"));
}

// Layers 0 and 3 of 4 skipped, 2 kv heads, d = 64, int2 G = 64 (a 20-byte row) on pages of 16 tokens: a quantized
// layer's head holds 16 · (20 + 20) bytes, a skipped one's 16 · (128 + 128) of bf16 rows.
TEST(SkipLayers, LayoutGivesSkippedLayersBf16RowsAndExactOffsets) {
  const CacheConfig cfg = config("int2", 64, 4, 8, 16, {0, -1});
  const CacheLayout l = cache_layout(cfg, 4, 2, 64);
  const int64_t quant_head = 16 * (20 + 20), skip_head = 16 * (128 + 128);
  EXPECT_EQ(l.n_skipped, 2);
  EXPECT_EQ(l.skip_row, 128);
  EXPECT_EQ(l.head_bytes, quant_head);
  EXPECT_EQ(l.layer_head_bytes(0), skip_head);
  EXPECT_EQ(l.layer_head_bytes(1), quant_head);
  EXPECT_EQ(l.layer_k_region(3), 16 * 128);
  EXPECT_EQ(l.layer_k_region(2), 16 * 20);
  EXPECT_EQ(l.layer_offset(0), 0);
  EXPECT_EQ(l.layer_offset(1), 2 * skip_head);
  EXPECT_EQ(l.layer_offset(2), 2 * (skip_head + quant_head));
  EXPECT_EQ(l.layer_offset(3), 2 * (skip_head + 2 * quant_head));
  EXPECT_EQ(l.page_bytes, 2 * (2 * skip_head + 2 * quant_head));
  // The pool is sized in those bytes: a cache of 2 sequences of 100 tokens holds ceil((100 - 4) / 16) = 6 pages each
  // and each sequence's windows.
  KvCache cache(cfg, 4, 2, 64, 100, 2);
  EXPECT_EQ(cache.pool().n_pages(), 12 + 2 * l.window_pages());
  EXPECT_EQ(cache.bytes_allocated(), size_t(cache.pool().n_pages()) * size_t(l.page_bytes));
  // No skip: the layout of before (every layer quantized).
  const CacheLayout plain = cache_layout(config("int2", 64, 4, 8, 16), 4, 2, 64);
  EXPECT_EQ(plain.page_bytes, 4 * 2 * quant_head);
  EXPECT_EQ(plain.layer_offset(3), 3 * 2 * quant_head);
}

// Bits counted from the stored bytes: with no windows, b_q = b_eff = the layers' average: (2 · 2.5 + 2 · 16) / 4.
TEST(SkipLayers, FootprintCountsTheSkippedLayersBf16Rows) {
  const CacheFootprint f = cache_layout(config("int2", 64, 0, 0, 16, {0, -1}), 4, 2, 64).footprint(4096);
  EXPECT_DOUBLE_EQ(f.quant_bits_per_element, (2 * 2.5 + 2 * 16.0) / 4);
  EXPECT_DOUBLE_EQ(f.bits_per_element, (2 * 2.5 + 2 * 16.0) / 4);
  EXPECT_DOUBLE_EQ(f.bytes_per_token_per_layer, (2 * 2 * (20 + 20) + 2 * 2 * (128 + 128)) / 4.0);  // 2 kv heads
  // With windows 64/256 at 4096 tokens: (S0 + W) rows at 16 bits, the rest at b_q (METHODS §6).
  const CacheFootprint w = cache_layout(config("int2", 64, 64, 256, 16, {0, -1}), 4, 2, 64).footprint(4096);
  EXPECT_NEAR(w.bits_per_element, f.quant_bits_per_element + 320.0 * (16 - f.quant_bits_per_element) / 4096, 1e-12);
  const CacheFootprint none = cache_layout(config("int2", 64, 0, 0, 16), 4, 2, 64).footprint(4096);
  EXPECT_DOUBLE_EQ(none.quant_bits_per_element, 2.5);
}

// A skipped layer's pages hold the bf16 bits of its rows; the other layers' the int2 codec's.
TEST(SkipLayers, SkippedLayersStoreBf16RowsInTheirPages) {
  const int n_kv = 2, d = 64, n = 40;
  KvCache cache(config("int2", 64, 0, 0, 16, {1}), 3, n_kv, d, n);
  const int seq = cache.new_sequence();
  cache.reserve(seq, n);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<std::vector<float>> k(3), v(3);
  for (int l = 0; l < 3; ++l) {
    for (auto* x : {&k[size_t(l)], &v[size_t(l)]}) {
      x->resize(size_t(n) * n_kv * d);
      for (float& e : *x) e = nd(rng);
    }
    cache.append(seq, l, 0, n, k[size_t(l)].data(), v[size_t(l)].data());
  }
  cache.commit(seq, n);
  EXPECT_TRUE(cache.layer_skipped(1));
  EXPECT_FALSE(cache.layer_skipped(0));
  EXPECT_EQ(cache.k_codec(1).name(), "bf16");
  EXPECT_EQ(cache.v_codec(1).name(), "bf16");
  EXPECT_EQ(cache.k_codec(2).name(), "int2");
  std::vector<KvCache::Run> runs;
  for (int l = 0; l < 3; ++l)
    for (int h = 0; h < n_kv; ++h) {
      cache.runs(seq, l, h, n - 1, n - 1, runs);
      int quant_rows = 0;
      for (const KvCache::Run& r : runs) {
        if (r.kind != KvCache::RunKind::Quant) continue;
        EXPECT_EQ(r.k_codec, &cache.k_codec(l));
        for (int kv = 0; kv < 2; ++kv) {
          const KvCodec& codec = kv ? cache.v_codec(l) : cache.k_codec(l);
          std::vector<uint8_t> want(codec.bytes_per_block());
          for (int i = 0; i < r.n; ++i) {
            const float* x = (kv ? v : k)[size_t(l)].data() + (size_t(r.pos0 + i) * n_kv + h) * d;
            std::vector<float> rounded(x, x + d);  // what the bf16 ring held before demotion
            for (float& e : rounded) e = bf16_to_f32(f32_to_bf16(e));
            codec.encode(rounded.data(), want.data());
            ASSERT_EQ(std::memcmp((kv ? r.v : r.k) + size_t(i) * codec.bytes_per_block(), want.data(), want.size()), 0)
                << "layer " << l << " head " << h << " pos " << r.pos0 + i << (kv ? " V" : " K");
            if (l == 1) {  // bf16 rows: 2 d bytes, the bf16 bits of the value
              bf16_t b;
              std::memcpy(&b, (kv ? r.v : r.k) + size_t(i) * 2 * d, 2);
              ASSERT_EQ(b, f32_to_bf16(x[0]));
            }
          }
        }
        quant_rows += r.n;
      }
      EXPECT_EQ(quant_rows, n) << "windows 0/0: every row is in the quantized region";
    }
  EXPECT_EQ(cache.k_codec(1).bytes_per_block(), size_t(layout::bf16_row_bytes(d)));
}

// Every layer skipped: the attention of an int2 cache equals a bf16 cache's bit for bit (same rows, same windows, same
// pieces); with one layer skipped, the others read exactly what they read in a cache without the skip.
TEST(SkipLayers, AllSkippedEqualsBf16AndTheOtherLayersAreUnchanged) {
  const int n_layers = 3, n_kv = 2, d = 128, n_tokens = 300;
  KvCache all(config("int2", 128, 4, 16, 16, {0, 1, 2}), n_layers, n_kv, d, n_tokens);
  KvCache bf16(config("bf16", 128, 4, 16, 16), n_layers, n_kv, d, n_tokens);
  KvCache one(config("int2", 128, 4, 16, 16, {-2}), n_layers, n_kv, d, n_tokens);
  KvCache none(config("int2", 128, 4, 16, 16), n_layers, n_kv, d, n_tokens);
  fill({&all, &bf16, &one, &none}, n_tokens, 5);
  for (int l = 0; l < n_layers; ++l)
    for (auto [pos0, n] : {std::pair{n_tokens - 1, 1}, {n_tokens - 40, 40}}) {
      const std::vector<float> a = attend(all, l, pos0, n, 7), b = attend(bf16, l, pos0, n, 7);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "layer " << l << " queries " << n;
      const std::vector<float> o = attend(one, l, pos0, n, 7), q = attend(none, l, pos0, n, 7);
      if (l == 1) {
        ASSERT_EQ(std::memcmp(o.data(), b.data(), o.size() * sizeof(float)), 0) << "skipped layer 1";
        ASSERT_NE(std::memcmp(o.data(), q.data(), o.size() * sizeof(float)), 0) << "int2 differs from bf16";
      } else {
        ASSERT_EQ(std::memcmp(o.data(), q.data(), o.size() * sizeof(float)), 0) << "layer " << l;
      }
    }
}

// The same with Kitty's 128-token key blocks: the layers around a skipped one are unchanged, and the skipped one
// holds bf16 rows in blocks of 128 demoted at once.
TEST(SkipLayers, KittyLayersAroundASkippedOneAreUnchanged) {
  const int n_layers = 3, n_kv = 1, d = 64, n_tokens = 420;
  KvCache one(config("kitty_int2", 128, 4, 16, 128, {0}), n_layers, n_kv, d, n_tokens);
  KvCache none(config("kitty_int2", 128, 4, 16, 128), n_layers, n_kv, d, n_tokens);
  EXPECT_EQ(one.block_tokens(), 128);
  fill({&one, &none}, n_tokens, 9);
  for (int l = 1; l < n_layers; ++l) {
    const std::vector<float> a = attend(one, l, n_tokens - 1, 1, 3), b = attend(none, l, n_tokens - 1, 1, 3);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "layer " << l;
  }
  std::vector<KvCache::Run> runs;
  one.runs(0, 0, 0, n_tokens - 1, n_tokens - 1, runs);
  for (const KvCache::Run& r : runs) {
    if (r.kind == KvCache::RunKind::Quant) {
      EXPECT_EQ(r.k_codec->name(), "bf16");
    }
  }
}

TEST(SkipLayers, DescribedInTheCacheLine) {
  EXPECT_TRUE(has(config("int2", 128, 64, 256, 128, {0, 1, -2, -1}).describe(), "skip_layers=0,1,-2,-1"));
  EXPECT_FALSE(has(config("int2", 128, 64, 256, 128).describe(), "skip_layers"));
}
