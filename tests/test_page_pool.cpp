// The cache layout (kv/cache_layout.h) and the page pool (kv/page_pool.h) that the CPU and GPU caches share: the
// pool's free list and block tables (reserve / free / reuse, all-or-nothing reserves, the exhaustion error), its
// admission arithmetic, the layout's sizes and footprint against the formulas KvCache used before the layout, and a
// cache sized in bytes holding exactly the sequences that fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "codecs/registry.h"
#include "common/error.h"
#include "kv/cache.h"
#include "kv/cache_layout.h"
#include "kv/page_pool.h"
#include "test_helpers.h"

using namespace kvq;

namespace {

// A small layout: 2 layers, 1 kv head, S0 = 4, W = 8, P = 16, chunk 16, per-token K / V blocks of 40 / 24 bytes,
// window rows of 64 bytes. qe(t) = 4 + max(0, t - 11): a sequence of n tokens holds ceil(max(0, n - 12) / 16) pages.
CacheLayout small_layout() {
  return make_cache_layout(2, 1, 32, 4, 8, 16, 16, {1, 40}, {1, 24}, 64);
}

using test::error_of;

// Everything reserve() may change, to check that a refused reserve changed nothing.
struct PoolState {
  std::vector<int> table, pages, lengths;
  int free_pages;
  bool operator==(const PoolState&) const = default;
};
PoolState state(const PagePool& p) {
  PoolState s{p.table(), {}, {}, p.free_pages()};
  for (int i = 0; i < p.n_slots(); ++i) s.pages.push_back(p.pages(i)), s.lengths.push_back(p.length(i));
  return s;
}

// Reserves (and commits) seq to n_tokens in chunks of the layout's max_chunk.
void grow(PagePool& p, int seq, int n_tokens) {
  while (p.length(seq) < n_tokens) {
    const int n = std::min(p.layout().max_chunk, n_tokens - p.length(seq));
    p.reserve(seq, n);
    p.commit(seq, n);
  }
}

CodecSpec spec(const std::string& type, int group, bool key) {
  CodecSpec s;
  s.type = type;
  s.group = group;
  s.clip = type == "int2" ? 0.96f : 1.0f;
  s.per_channel = key && type.rfind("kivi", 0) == 0;
  return s;
}

CacheConfig config(const std::string& k, const std::string& v, int group, const std::string& window, int sink,
                   int recent, int page, int chunk) {
  CacheConfig c;
  c.k = spec(k, group, true);
  c.v = spec(v, group, false);
  c.window = window;
  c.sink = sink, c.recent = recent, c.page_tokens = page, c.max_chunk = chunk;
  return c;
}

// KvCache::footprint as it was written before the layout (kv/cache.cpp), from the codecs.
CacheFootprint footprint_before_layout(const KvCache& c, int n) {
  const KvCodec &k = c.k_codec(), &v = c.v_codec(), &w = c.window_codec();
  const int n_kv = c.n_kv_heads(), S0 = c.config().sink, W = c.config().recent, B = c.block_tokens();
  const double elems = 2.0 * n_kv * c.head_dim();
  const double window_bytes = 2.0 * n_kv * double(w.bytes_per_block());
  const double quant_bytes = n_kv * (double(k.bytes_per_block()) / k.tokens_per_block() +
                                     double(v.bytes_per_block()) / v.tokens_per_block());
  const int qe = S0 + std::max(0, n - W - S0) / B * B;  // qe(n - 1)
  const int n_window = std::min(n, n - (qe - S0));
  // Since KV4-RL: a quantized window codec keeps the body rows of the recent window's tokens too (kv/cache.h).
  const double body_bytes = window_quantized(c.config()) ? quant_bytes : 0.0;
  const double total =
      n_window * window_bytes + (n_window - std::min(n, S0)) * body_bytes + (n - n_window) * quant_bytes;
  return {total / n, 8.0 * total / (double(n) * elems), 8.0 * quant_bytes / elems};
}

// A sequence's windows as KvCache allocated them before the pool held them: sinks + ring (+ the ring's body rows).
size_t windows_before_pool(const KvCache& c) {
  const CacheConfig& cfg = c.config();
  const KvCodec &k = c.k_codec(), &v = c.v_codec();
  const size_t ring = size_t(cfg.recent + c.block_tokens() + std::min(cfg.max_chunk, kAppendTokens));  // one append
  const size_t body_row = window_quantized(cfg) ? k.bytes_per_block() + v.bytes_per_block() : 0;  // per-token rows
  return size_t(c.n_layers()) * 2 * c.n_kv_heads() * (cfg.sink + ring) * c.window_codec().bytes_per_block() +
         size_t(c.n_layers()) * c.n_kv_heads() * ring * body_row;
}

// KvCache's pages as written before the layout: max_ctx's pages of one sequence.
size_t pages_before_layout(const KvCache& c) {
  const CacheConfig& cfg = c.config();
  const KvCodec &k = c.k_codec(), &v = c.v_codec();
  const size_t P = size_t(cfg.page_tokens);
  const size_t head = P / k.tokens_per_block() * k.bytes_per_block() + P / v.tokens_per_block() * v.bytes_per_block();
  return (std::max(0, c.max_ctx() - cfg.sink) + P - 1) / P * head * c.n_layers() * c.n_kv_heads();
}

}  // namespace

TEST(CacheLayout, SizesQuantEndAndPagesForByHand) {
  const CacheLayout l = small_layout();
  EXPECT_EQ(l.block_tokens, 1);
  EXPECT_EQ(l.ring_tokens, 8 + 1 + 16);
  EXPECT_EQ(l.k_region, 16 * 40);
  EXPECT_EQ(l.v_region, 16 * 24);
  EXPECT_EQ(l.head_bytes, 16 * 64);
  EXPECT_EQ(l.page_bytes, 2 * 16 * 64);
  EXPECT_EQ(l.sink_bytes(), 2 * 2 * 1 * 4 * 64);
  EXPECT_EQ(l.ring_bytes(), 2 * 2 * 1 * 25 * 64);
  EXPECT_EQ(l.window_bytes(), 2 * 2 * 29 * 64);
  EXPECT_EQ(l.window_pages(), 4);  // 7424 bytes in pages of 2048
  EXPECT_EQ(l.window_offset(5), 5 * 2048);
  for (int n : {0, 1, 12, 13, 28, 29, 44, 45, 100}) {
    EXPECT_EQ(l.pages_for(n), (std::max(0, n - 12) + 15) / 16) << n;
    EXPECT_EQ(l.sequence_bytes(n), (4 + l.pages_for(n)) * l.page_bytes) << n;
  }
  EXPECT_EQ(l.pages_per_seq(100), (100 - 4 + 15) / 16);
  EXPECT_EQ(l.pages_per_seq(3), 0);
  // KIVI keys of 32 tokens: B = 32, demotion in whole blocks.
  const CacheLayout kivi = make_cache_layout(1, 1, 128, 4, 16, 64, 8, {32, 1536}, {1, 36}, 256);
  EXPECT_EQ(kivi.block_tokens, 32);
  EXPECT_EQ(kivi.ring_tokens, 16 + 32 + 8);
  EXPECT_EQ(kivi.k_region, 2 * 1536);
  EXPECT_EQ(kivi.quant_end(50), 4);   // 51 - 20 = 31 < 32
  EXPECT_EQ(kivi.quant_end(51), 36);  // a whole block has left the window
  EXPECT_EQ(kivi.pages_for(52), 1);
}

TEST(CacheLayout, FootprintAndAllocationEqualKvCacheBeforeTheLayoutOnSeveralConfigs) {
  const std::vector<CacheConfig> configs = {
      config("bf16", "bf16", 128, "bf16", 64, 256, 128, 512), config("int2", "int2", 128, "bf16", 64, 256, 128, 512),
      config("int2", "int2", 32, "int8", 16, 64, 32, 100),    config("int4", "int2", 64, "int2", 5, 7, 16, 33),
      config("kivi2", "kivi2", 32, "bf16", 16, 64, 64, 64),   config("kivi2", "int2", 128, "bf16", 64, 256, 128, 512),
      config("f32", "f32", 128, "f32", 16, 64, 32, 16)};
  for (const CacheConfig& cfg : configs) {
    const std::string what = cfg.describe() + " window " + cfg.window;
    const KvCache c(cfg, 3, 2, 128, 3000, 2);
    const CacheLayout& l = c.layout();
    EXPECT_EQ(l.block_tokens, c.block_tokens()) << what;
    EXPECT_EQ(size_t(l.window_row), c.window_codec().bytes_per_block()) << what;
    // Two sequences: each one's pages at max_ctx and its windows, in whole pages from an aligned start.
    EXPECT_EQ(size_t(l.window_bytes()), windows_before_pool(c)) << what;
    EXPECT_EQ(size_t(l.pages_per_seq(3000) * l.page_bytes), pages_before_layout(c)) << what;
    EXPECT_EQ(c.bytes_allocated(), size_t(2 * (l.pages_per_seq(3000) + l.window_pages())) * size_t(l.page_bytes))
        << what;
    const int64_t pad = l.page_bytes % CacheLayout::kWindowAlign == 0 ? 0 : CacheLayout::kWindowAlign - 1;
    EXPECT_GE(l.window_pages() * l.page_bytes, l.window_bytes() + pad) << what;
    EXPECT_LT((l.window_pages() - 1) * l.page_bytes, l.window_bytes() + pad) << what;
    const CacheLayout built = cache_layout(cfg, 3, 2, 128);  // the form that builds its own codecs (GPU cache)
    EXPECT_EQ(built.page_bytes, l.page_bytes) << what;
    EXPECT_EQ(built.window_bytes(), l.window_bytes()) << what;
    for (int n : {1, 63, 64, 65, 300, 320, 321, 351, 352, 999, 3000}) {
      const CacheFootprint a = c.footprint(n), b = footprint_before_layout(c, n);
      EXPECT_EQ(a.bytes_per_token_per_layer, b.bytes_per_token_per_layer) << what << " n " << n;
      EXPECT_EQ(a.bits_per_element, b.bits_per_element) << what << " n " << n;
      EXPECT_EQ(a.quant_bits_per_element, b.quant_bits_per_element) << what << " n " << n;
    }
  }
  // Hand values of b_q: int2 / G = 128 stores 2.25 bits (fp16 scale + zero per 128 values), bf16 16, f32 32.
  EXPECT_DOUBLE_EQ(KvCache(configs[1], 1, 1, 128, 64).footprint(4096).quant_bits_per_element, 2.25);
  EXPECT_DOUBLE_EQ(KvCache(configs[0], 1, 1, 128, 64).footprint(4096).bits_per_element, 16.0);
  EXPECT_DOUBLE_EQ(KvCache(configs[6], 1, 1, 128, 64).footprint(4096).bits_per_element, 32.0);
}

// A demotion block B of 256 over OScaR's 32-token key blocks with no windows (its as-shipped schedule, METHODS §5.4):
// qe(t) = floor((t + 1) / 256) · 256, the ring holds W + B + chunk rows, and the footprint counts the newest n mod 256
// tokens as bf16 window rows and the rest at OScaR's bytes, by hand. d = 128, 8 kv heads, one layer: a bf16 token is
// 2 · 8 · 256 = 4096 B; an OScaR token 8 · (1536 / 32 + 48) + 4 (ν) = 772 B.
TEST(CacheLayout, DemotionBlockOf256GivesOscarsResidualScheduleAndBytesByHand) {
  CacheConfig cfg;
  cfg.k = codec_spec("oscar_int2", true, 128, 0.f);
  cfg.v = codec_spec("oscar_int2", false, 128, 0.f);
  cfg.sink = 0, cfg.recent = 0, cfg.page_tokens = 128, cfg.max_chunk = 100, cfg.demote_block = 256;
  const KvCache c(cfg, 1, 8, 128, 3000);
  const CacheLayout& l = c.layout();
  EXPECT_EQ(l.codec_tokens, 32);
  EXPECT_EQ(l.block_tokens, 256);
  EXPECT_EQ(c.block_tokens(), 256);
  EXPECT_EQ(c.codec_block_tokens(), 32);
  EXPECT_EQ(l.ring_tokens, 0 + 256 + 100);
  EXPECT_EQ(l.ring_bytes(), int64_t(1) * 2 * 8 * 356 * 256);  // bf16 rows of d = 128
  for (int t = -1; t < 3000; ++t) ASSERT_EQ(c.quant_end(t), (t + 1) / 256 * 256) << "t " << t;
  EXPECT_EQ(c.quant_end(254), 0);
  EXPECT_EQ(c.quant_end(255), 256);
  EXPECT_EQ(c.quant_end(511), 512);
  EXPECT_EQ(l.pages_for(255), 0);
  EXPECT_EQ(l.pages_for(256), 2);  // one demotion block spans two 128-token pages
  EXPECT_EQ(l.pages_for(767), 4);
  // n = 300: 256 quantized, 44 in the FP16 (here bf16) residual.
  const CacheFootprint f300 = c.footprint(300);
  EXPECT_DOUBLE_EQ(f300.bytes_per_token_per_layer, (44 * 4096.0 + 256 * 772.0) / 300);  // 1259.52
  EXPECT_DOUBLE_EQ(f300.bits_per_element, 8 * (44 * 4096.0 + 256 * 772.0) / (300 * 2048.0));  // 4.92
  EXPECT_DOUBLE_EQ(f300.bits_per_element, 4.92);
  EXPECT_DOUBLE_EQ(f300.quant_bits_per_element, 8 * 772.0 / 2048);  // 3.015625 (METHODS §5.4: 3.02 b)
  EXPECT_DOUBLE_EQ(c.footprint(255).bits_per_element, 16.0);        // all residual
  EXPECT_DOUBLE_EQ(c.footprint(256).bits_per_element, 3.015625);    // none
  EXPECT_DOUBLE_EQ(c.footprint(2048).bits_per_element, 3.015625);   // 2048 = 8 blocks
  EXPECT_DOUBLE_EQ(c.footprint(2303).bits_per_element, 8 * (255 * 4096.0 + 2048 * 772.0) / (2303 * 2048.0));
  // The default block (0: the codecs' own, 32) differs: at n = 300, 288 are quantized and 12 are residual.
  CacheConfig own = cfg;
  own.demote_block = 0;
  const KvCache c32(own, 1, 8, 128, 3000);
  EXPECT_EQ(c32.block_tokens(), 32);
  EXPECT_EQ(c32.layout().ring_tokens, 32 + 100);
  EXPECT_DOUBLE_EQ(c32.footprint(300).bytes_per_token_per_layer, (12 * 4096.0 + 288 * 772.0) / 300);
  // With windows: qe(t) = S0 + floor(max(0, t + 1 - W - S0) / 256) · 256, S0 = 64, W = 256 (int2, codec block 1).
  CacheConfig w = cfg;
  w.k = codec_spec("int2", true, 128, 0.f), w.v = codec_spec("int2", false, 128, 0.f);
  w.sink = 64, w.recent = 256, w.demote_block = 256;
  const KvCache cw(w, 1, 8, 128, 3000);
  EXPECT_EQ(cw.codec_block_tokens(), 1);
  EXPECT_EQ(cw.quant_end(574), 64);
  EXPECT_EQ(cw.quant_end(575), 320);
  EXPECT_EQ(cw.quant_end(830), 320);
  EXPECT_EQ(cw.quant_end(831), 576);
}

TEST(CacheLayout, DemotionBlockThatIsNotAPositiveMultipleOfTheCodecBlockIsOneError) {
  CacheConfig cfg;
  cfg.k = codec_spec("oscar_int2", true, 128, 0.f);
  cfg.v = codec_spec("oscar_int2", false, 128, 0.f);
  cfg.sink = 0, cfg.recent = 0;
  for (int bad : {48, 16, 1, -32, -1, kMaxDemoteBlock + 32}) {
    cfg.demote_block = bad;
    const std::string e = error_of([&] { cache_layout(cfg, 1, 8, 128); });
    EXPECT_NE(e.find(fmt::format("KV cache: demotion block {} (--kv-demote-block) must be a positive multiple of the "
                                 "codec block of 32 tokens", bad)), std::string::npos) << e;
    EXPECT_NE(error_of([&] { KvCache(cfg, 1, 8, 128, 100); }).find("demotion block"), std::string::npos) << bad;
  }
  cfg.demote_block = kMaxDemoteBlock;  // the largest, a multiple of 32
  EXPECT_EQ(cache_layout(cfg, 1, 8, 128).block_tokens, kMaxDemoteBlock);
  // KIVI keys of 128 tokens: 64 is not a multiple; 384 is.
  CacheConfig kivi = config("kivi2", "kivi2", 128, "bf16", 64, 256, 128, 512);
  kivi.demote_block = 64;
  EXPECT_NE(error_of([&] { cache_layout(kivi, 1, 2, 128); }).find("codec block of 128 tokens"), std::string::npos);
  kivi.demote_block = 384;
  EXPECT_EQ(cache_layout(kivi, 1, 2, 128).block_tokens, 384);
  // Per-token codecs: any positive block.
  CacheConfig int2 = config("int2", "int2", 128, "bf16", 64, 256, 128, 512);
  int2.demote_block = 7;
  EXPECT_EQ(cache_layout(int2, 1, 2, 128).block_tokens, 7);
  EXPECT_EQ(cache_layout(int2, 1, 2, 128).ring_tokens, 256 + 7 + 128);  // W + B + the rows of one append, not 512
}

TEST(PagePool, ReserveTakesPagesInOrderAndFreeReturnsThemForReuse) {
  // Two slots; each sequence's windows take 4 pages from the top, its tokens' pages come from the bottom.
  PagePool p(small_layout(), 100, {2, 5 + 2 * 4});
  EXPECT_EQ(p.table_width(), small_layout().pages_per_seq(100));
  const int a = p.open(), b = p.open();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(p.window_offset(a), 9 * 2048);  // pages 9 .. 12
  EXPECT_EQ(p.window_offset(b), 5 * 2048);  // pages 5 .. 8
  EXPECT_EQ(p.used_pages(), 8);
  EXPECT_EQ(error_of([&] { p.open(); }), "KV cache: all 2 sequence slots are in use");
  grow(p, a, 12);  // all in the windows
  EXPECT_EQ(p.pages(a), 0);
  grow(p, a, 13);
  EXPECT_EQ(p.pages(a), 1);
  EXPECT_EQ(p.page(a, 0), 0);
  grow(p, b, 29);  // two pages: 1, 2
  EXPECT_EQ(p.pages(b), 2);
  EXPECT_EQ(p.page(b, 0), 1);
  EXPECT_EQ(p.page(b, 1), 2);
  grow(p, a, 45);  // a's second and third: 3, 4
  EXPECT_EQ(p.page(a, 1), 3);
  EXPECT_EQ(p.page(a, 2), 4);
  EXPECT_EQ(p.free_pages(), 0);
  EXPECT_EQ(p.table()[size_t(a) * p.table_width() + 3], -1);
  // Free b: its pages and windows come back and are taken again in the same order.
  p.close(b);
  EXPECT_FALSE(p.live(b));
  EXPECT_EQ(p.free_pages(), 2 + 4);
  EXPECT_EQ(error_of([&] { p.window_offset(b); }), "KV cache: sequence 1 is not live");  // no windows
  EXPECT_EQ(p.table()[size_t(b) * p.table_width()], -1);
  const int c = p.open();
  EXPECT_EQ(c, b);  // the lowest free slot
  EXPECT_EQ(p.length(c), 0);
  EXPECT_EQ(p.window_offset(c), 5 * 2048);
  grow(p, c, 29);
  EXPECT_EQ(p.page(c, 0), 1);
  EXPECT_EQ(p.page(c, 1), 2);
  EXPECT_EQ(error_of([&] { p.close(5); }), "KV cache: sequence 5 is not live");
  EXPECT_EQ(error_of([&] { p.window_offset(5); }), "KV cache: sequence 5 is not live");
}

TEST(PagePool, ExhaustedPoolNamesTheSequenceAndChangesNothing) {
  PagePool p(small_layout(), 100, {3, 3 + 3 * 4});
  const int a = p.open(), b = p.open(), c = p.open();
  grow(p, a, 13);  // page 0
  grow(p, b, 13);  // page 1
  grow(p, c, 12);  // no page yet; page 2 is free
  const PoolState before = state(p);
  // a and b each need one more page to reach 29 tokens: each alone would fit, together they do not. Refused as a
  // whole, nothing taken.
  EXPECT_EQ(p.pages_short(a, 29), 1);
  EXPECT_EQ(error_of([&] { p.reserve(std::vector<int>{a, b}, std::vector<int>{16, 16}); }),
            "KV cache: page pool exhausted: sequences 0, 1 need 2 more pages, 1 free of 15 (0.0 MiB)");
  EXPECT_EQ(state(p), before);
  grow(p, c, 28);  // takes page 2
  EXPECT_EQ(p.page(c, 0), 2);
  const PoolState full = state(p);
  EXPECT_EQ(error_of([&] { p.reserve(a, 16); }),
            "KV cache: page pool exhausted: sequence 0 needs 1 more page, 0 free of 15 (0.0 MiB)");
  EXPECT_EQ(state(p), full);
  // The other refusals, also before any change.
  EXPECT_EQ(error_of([&] { p.reserve(a, 17); }), "KV cache: chunk of 17 tokens exceeds the ring's chunk size 16");
  p.commit(a, 100 - 13 - 5);
  EXPECT_EQ(error_of([&] { p.reserve(a, 6); }),
            "context overflow: 101 tokens exceed the cache's context of 100 tokens");
  EXPECT_EQ(error_of([&] { p.reserve(std::vector<int>{b, b}, std::vector<int>{1, 1}); }),
            "KV cache: sequence 1 appears twice in one reserve");
  p.close(b);
  EXPECT_EQ(error_of([&] { p.reserve(b, 1); }), "KV cache: sequence 1 is not live");
  EXPECT_EQ(p.free_pages(), 1 + 4);
}

TEST(PagePool, AdmissionArithmeticInPagesAndBytes) {
  const CacheLayout l = small_layout();
  PagePool p(l, 100, {3, 22});
  EXPECT_EQ(p.bytes(), size_t(22 * l.page_bytes));
  EXPECT_EQ(p.used_bytes(), 0u);
  EXPECT_EQ(p.sequences_at(100), 2);  // 4 + 6 pages each, 22 pages
  EXPECT_EQ(p.sequences_at(44), 3);   // 4 + 2 pages each, but 3 slots
  EXPECT_EQ(p.sequences_at(10), 3);   // windows only
  EXPECT_TRUE(p.can_admit(100));
  EXPECT_FALSE(p.can_admit(101));     // past max_ctx
  const int a = p.open();
  grow(p, a, 92);                     // 5 pages
  EXPECT_EQ(p.used_pages(), 4 + 5);
  EXPECT_EQ(p.pages_short(a, 100), 1);
  EXPECT_EQ(p.used_bytes(), size_t(9 * l.page_bytes));
  EXPECT_EQ(p.free_bytes(), p.bytes() - p.used_bytes());
  EXPECT_TRUE(p.can_admit(100));      // 10 pages, 13 free
  const int b = p.open();
  grow(p, b, 44);                     // 2 pages: 7 free
  EXPECT_FALSE(p.can_admit(100));     // 10 pages
  EXPECT_TRUE(p.can_admit(28));       // 4 + 1
  EXPECT_TRUE(p.can_open());
  const int c = p.open();
  EXPECT_EQ(p.n_live(), 3);
  EXPECT_FALSE(p.can_open());         // no slot left
  EXPECT_FALSE(p.can_admit(1));
  p.close(b);
  p.close(c);
  EXPECT_TRUE(p.can_admit(1));
}

// Slots cost nothing: the sequences that run are the ones whose windows and pages the pool holds. A window needs its
// pages in a row: pages that cached prefixes keep (counted free) can leave enough free pages but no run of them.
TEST(PagePool, WindowsComeFromThePagesAndNeedThemInARow) {
  const CacheLayout l = small_layout();
  PagePool p(l, 100, {8, 10});
  EXPECT_EQ(p.sequences_at(13), 2);  // 4 + 1 pages each
  const int a = p.open(), b = p.open();
  EXPECT_EQ(p.window_offset(a), 6 * 2048);
  EXPECT_EQ(p.window_offset(b), 2 * 2048);
  EXPECT_FALSE(p.can_open());  // 2 free pages, 6 slots
  EXPECT_EQ(error_of([&] { p.open(); }),
            "KV cache: page pool exhausted: a sequence's windows need 4 pages in a row (0.0 MiB), 2 free of 10");
  p.close(a);
  EXPECT_TRUE(p.can_open());
  p.close(b);
  // A sequence holds pages 0 .. 2 and leaves page 1 to a cached prefix; the next takes 0 and 2 again.
  const int c = p.open();
  grow(p, c, 45);
  EXPECT_EQ(p.page(c, 1), 1);
  p.cache_ref(1, 1);
  p.close(c);
  const int d = p.open();
  grow(p, d, 29);
  EXPECT_EQ(p.page(d, 0), 0);
  EXPECT_EQ(p.page(d, 1), 2);
  // Free: 3, 4, 5, and page 1 held by the cache only: four, but no four in a row.
  EXPECT_EQ(p.free_pages(), 4);
  EXPECT_FALSE(p.can_open());
  EXPECT_FALSE(p.can_admit(1));
  EXPECT_EQ(error_of([&] { p.open(); }), "KV cache: page pool exhausted: a sequence's windows need 4 pages in a row "
                                         "(0.0 MiB), 4 free of 10 but not in a row");
}

// Windows start at a 256-byte boundary whatever the page size: the run leaves room for the padding.
TEST(PagePool, WindowsStartAlignedWhenPagesAreNot) {
  const CacheLayout odd = make_cache_layout(1, 1, 32, 4, 8, 16, 16, {1, 41}, {1, 24}, 64);  // pages of 1040 bytes
  ASSERT_EQ(odd.page_bytes, 1040);
  EXPECT_EQ(odd.window_pages(), (odd.window_bytes() + 255 + 1039) / 1040);
  PagePool p(odd, 100, {3, 3 * odd.sequence_pages(100)});
  for (int i = 0; i < 3; ++i) {
    const int s = p.open();
    const int64_t at = p.window_offset(s);
    EXPECT_EQ(at % 256, 0) << s;
    const int first = int(p.bytes() / 1040) - (s + 1) * odd.window_pages();  // runs from the top down
    EXPECT_GE(at, int64_t(first) * 1040) << s;
    EXPECT_LE(at + odd.window_bytes(), int64_t(first + odd.window_pages()) * 1040) << s;
  }
}

TEST(PagePool, SizedFromABudgetOrForSequences) {
  const CacheLayout l = small_layout();
  const PagePool::Size today = PagePool::for_sequences(l, 100, 4);
  EXPECT_EQ(today.n_slots, 4);
  EXPECT_EQ(today.n_pages, 4 * (l.pages_per_seq(100) + l.window_pages()));
  // A budget of 15.5 pages: 15 pages, whichever slots they serve.
  const size_t budget = size_t(15 * l.page_bytes + l.page_bytes / 2);
  const PagePool::Size s = PagePool::for_budget(l, 100, 2, budget);
  EXPECT_EQ(s.n_slots, 2);
  EXPECT_EQ(s.n_pages, 15);
  EXPECT_EQ(PagePool::for_budget(l, 100, 8, budget).n_pages, 15);
  // Slots from the budget: sequences of 100 tokens (4 + 6 pages each).
  const PagePool::Size aut = PagePool::for_budget(l, 100, 0, budget);
  EXPECT_EQ(aut.n_slots, int(budget / size_t(l.sequence_bytes(100))));
  EXPECT_EQ(aut.n_slots, 1);
  // An ample budget gives no more than max_seqs sequences of max_ctx need.
  EXPECT_EQ(PagePool::for_budget(l, 100, 4, size_t(1) << 30).n_pages, today.n_pages);
  // Too small for one sequence of max_ctx: one error naming its windows and pages.
  EXPECT_EQ(error_of([&] { PagePool::for_budget(l, 100, 2, size_t(9 * l.page_bytes)); }),
            "KV cache: a budget of 0.0 MiB does not hold one sequence of 100 tokens (10 pages of 0.00 MiB: 4 for its "
            "windows, 6 for its tokens)");
}

// A cache sized in bytes holds exactly floor(budget / (windows + pages of one sequence)) sequences at a context,
// counted by filling it until it refuses, and allocates no more than the budget.
TEST(KvCacheBudget, HoldsExactlyTheSequencesThatFitAtAContext) {
  for (const CacheConfig& cfg : {config("int2", "int2", 128, "bf16", 16, 64, 32, 64),
                                 config("bf16", "bf16", 128, "bf16", 16, 64, 32, 64),
                                 config("kivi2", "kivi2", 32, "bf16", 16, 64, 32, 64)}) {
    const CacheLayout l = cache_layout(cfg, 2, 2, 128);
    for (int ctx : {100, 1000}) {
      for (double n_seqs : {1.0, 2.5, 7.0, 12.99}) {
        const size_t budget = size_t(n_seqs * double(l.sequence_bytes(ctx)));
        const std::string what = cfg.describe() + " ctx " + std::to_string(ctx) + " budget " + std::to_string(budget);
        KvCache c(cfg, 2, 2, 128, ctx, 0, budget);
        EXPECT_LE(c.bytes_allocated(), budget) << what;
        int held = 0;
        std::string refusal;
        try {
          for (;;) {
            const int seq = c.new_sequence();
            for (int done = 0; done < ctx; done += cfg.max_chunk) {
              const int n = std::min(cfg.max_chunk, ctx - done);
              c.reserve(seq, n);
              c.commit(seq, n);
            }
            ++held;
          }
        } catch (const Error& e) {
          refusal = e.what();
        }
        EXPECT_EQ(held, int(std::floor(double(budget) / double(l.sequence_bytes(ctx))))) << what;
        EXPECT_EQ(refusal, "KV cache: all " + std::to_string(held) + " sequence slots are in use") << what;
        EXPECT_EQ(c.pool().sequences_at(ctx), held) << what;
      }
    }
  }
}

// With slots fixed, the budget's pages run out first: the cache refuses at the page level, names the sequence, and
// the refused sequence keeps what it had; freeing one sequence lets it go on.
TEST(KvCacheBudget, FixedSlotsRunOutOfPagesWithOneClearErrorAndNothingChanged) {
  const CacheConfig cfg = config("int2", "int2", 128, "bf16", 16, 64, 32, 64);
  const CacheLayout l = cache_layout(cfg, 2, 2, 128);
  const int ctx = 400;  // 10 pages each
  const int w = l.window_pages(), n_pages = 3 * w + 25;  // three sequences' windows and 25 pages for tokens
  const size_t budget = size_t(n_pages) * size_t(l.page_bytes);
  KvCache c(cfg, 2, 2, 128, ctx, 4, budget);
  EXPECT_EQ(c.max_seqs(), 4);
  EXPECT_EQ(c.pool().n_pages(), n_pages);
  EXPECT_EQ(c.bytes_allocated(), budget);
  EXPECT_EQ(c.pool().sequences_at(ctx), n_pages / (w + 10));
  std::vector<int> seqs;
  for (int i = 0; i < 3; ++i) seqs.push_back(c.new_sequence());
  auto fill = [&](int seq, int to) {
    while (c.length(seq) < to) {
      const int n = std::min(cfg.max_chunk, to - c.length(seq));
      c.reserve(seq, n);
      c.commit(seq, n);
    }
  };
  fill(seqs[0], ctx);
  fill(seqs[1], ctx);
  fill(seqs[2], 16 + 64 + 5 * 32);  // 5 pages: 0 free
  EXPECT_EQ(c.pool().free_pages(), 0);
  const int len = c.length(seqs[2]), pages = c.pool().pages(seqs[2]);
  EXPECT_EQ(error_of([&] { c.reserve(seqs[2], 1); }),
            fmt::format("KV cache: page pool exhausted: sequence 2 needs 1 more page, 0 free of {} ({:.1f} MiB)",
                        n_pages, n_pages * double(l.page_bytes) / double(1 << 20)));
  EXPECT_EQ(c.length(seqs[2]), len);
  EXPECT_EQ(c.pool().pages(seqs[2]), pages);
  c.free_sequence(seqs[0]);
  fill(seqs[2], ctx);
  EXPECT_EQ(c.pool().free_pages(), 5 + w);  // seqs[0]'s windows are free too
}
