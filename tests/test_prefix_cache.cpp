// Prefix caching (kv/prefix_cache.h) on the CPU cache, models/ref: a prompt that continues from a cached prefix of
// another prompt gives the pages, windows and logits of a fresh run byte for byte (bf16 and int2, with windows), its
// final pages are the cached ones (shared, not copied), eviction under pressure frees the least recently used
// prefixes, and the scheduler prefills only past the cached prefix, with the output of a run without the cache.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "common/error.h"
#include "engine/scheduler.h"
#include "model/runner.h"
#include "test_helpers.h"

using namespace kvq;
using kvq::test::token_ids;

namespace {

Model& ref_model() {
  static std::unique_ptr<Model> m = Model::load(std::string(KVQ_SOURCE_DIR) + "/models/ref", 2);
  return *m;
}

constexpr int kChunk = 16;

CacheConfig cache(const std::string& type) {  // windows 4 / 8, pages of 8, chunks of 16: prompts reach the pages
  CacheConfig c;
  c.k.type = c.v.type = type;
  if (type == "int2") c.k.clip = 0.96f, c.v.clip = 0.92f;
  c.sink = 4, c.recent = 8, c.page_tokens = 8, c.max_chunk = kChunk;
  return c;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Feeds [from, to) in chunks of kChunk (test::feed_chunks); with store: caches the state after each chunk.
std::vector<float> feed(CpuRunner& r, int seq, const std::vector<int32_t>& t, int from, int to, bool store) {
  return test::feed_chunks(r, seq, t, from, to, kChunk, store);
}

// Every byte a query at the sequence's last position reads, run by run, for every (layer, kv head).
std::vector<uint8_t> cache_bytes(KvCache& c, int seq) {
  std::vector<uint8_t> out;
  std::vector<KvCache::Run> runs;
  const int t = c.length(seq) - 1;
  for (int l = 0; l < c.n_layers(); ++l)
    for (int h = 0; h < c.n_kv_heads(); ++h) {
      c.runs(seq, l, h, t, t, runs);
      for (const KvCache::Run& r : runs) {
        const size_t kb = size_t(r.n / r.k_codec->tokens_per_block()) * r.k_codec->bytes_per_block();
        const size_t vb = size_t(r.n / r.v_codec->tokens_per_block()) * r.v_codec->bytes_per_block();
        out.push_back(uint8_t(r.kind));
        out.insert(out.end(), r.k, r.k + kb);
        out.insert(out.end(), r.v, r.v + vb);
      }
    }
  return out;
}

int32_t argmax(const float* x, int n) { return int32_t(std::max_element(x, x + n) - x); }

}  // namespace

TEST(PrefixCache, ASharedPrefixRunEqualsAFreshRunByteForByteAndLogitForLogit) {
  const std::vector<int32_t> x = token_ids(48, 1);  // the shared prefix: three chunks
  const std::vector<int32_t> a = concat(x, token_ids(10, 2)), b = concat(x, token_ids(13, 3));
  CacheConfig sinks_only = cache("int2");  // kvq's default windows: every position of these prompts is a sink
  sinks_only.sink = 64, sinks_only.recent = 256;
  for (const CacheConfig& cc : {cache("bf16"), cache("int2"), sinks_only}) {
    SCOPED_TRACE(cc.describe());
    const int V = ref_model().config().vocab_size;
    // Fresh: b from position 0, then 6 greedy decode steps.
    CpuRunner fresh(ref_model(), cc, 128, 1);
    const int fs = fresh.new_sequence();
    std::vector<float> want = feed(fresh, fs, b, 0, int(b.size()), false);
    const std::vector<uint8_t> want_bytes = cache_bytes(fresh.cache(), fs);  // at the prompt's end
    std::vector<int32_t> t = b;
    std::vector<std::vector<float>> want_decode;
    std::vector<float> row(want.end() - V, want.end());
    for (int i = 0; i < 6; ++i) {
      t.push_back(argmax(row.data(), V));
      fresh.forward(fs, &t.back(), 1, row.data(), false);
      want_decode.push_back(row);
    }

    // Shared: a runs first and ends; b continues from a's cached state at 48.
    CpuRunner shared(ref_model(), cc, 128, 2);
    shared.cache().enable_prefix_cache(int64_t(64) << 20);  // copied bytes: room for every state here
    const int sa = shared.new_sequence();
    feed(shared, sa, a, 0, int(a.size()), true);
    std::vector<int> a_pages;
    for (int i = 0; i < shared.page_pool().pages(sa); ++i) a_pages.push_back(shared.page_pool().page(sa, i));
    shared.free_sequence(sa);
    EXPECT_EQ(shared.page_pool().used_pages(), 0);  // a's final pages are cached: free to take, until evicted
    EXPECT_EQ(shared.page_pool().cached_pages() > 0, cc.sink == 4);  // with 64 sinks no page is final yet
    EXPECT_EQ(shared.prefix_match(b.data(), int(b.size()), kChunk), 48);
    EXPECT_EQ(shared.prefix_match(token_ids(61, 9).data(), 61, kChunk), 0);
    const int sb = shared.new_sequence();
    shared.prefix_attach(sb, b.data(), 48);
    EXPECT_EQ(shared.length(sb), 48);
    // The final pages below qe(47) are a's own pages, shared.
    const int full = (std::max(cc.sink, shared.cache().quant_end(47)) - cc.sink) / 8;
    EXPECT_EQ(full > 0, cc.sink == 4);
    for (int i = 0; i < full; ++i) {
      EXPECT_EQ(shared.page_pool().page(sb, i), a_pages[size_t(i)]) << "page " << i;
      EXPECT_EQ(shared.page_pool().seq_refs(a_pages[size_t(i)]), 1);
      EXPECT_GE(shared.page_pool().cache_refs(a_pages[size_t(i)]), 1);
    }
    const std::vector<float> got = feed(shared, sb, b, 48, int(b.size()), false);
    // The chunk past the prefix: every row's logits equal the fresh run's rows 48 .. end, bit for bit.
    ASSERT_EQ(got.size(), size_t(b.size() - 48) * V);
    EXPECT_EQ(std::memcmp(got.data(), want.data() + (want.size() - got.size()), got.size() * sizeof(float)), 0);
    EXPECT_EQ(cache_bytes(shared.cache(), sb), want_bytes);
    for (int i = 0; i < 6; ++i) {
      shared.forward(sb, &t[b.size() + size_t(i)], 1, row.data(), false);
      EXPECT_EQ(std::memcmp(row.data(), want_decode[size_t(i)].data(), size_t(V) * sizeof(float)), 0) << "step " << i;
    }
    EXPECT_EQ(cache_bytes(shared.cache(), sb), cache_bytes(fresh.cache(), fs));
    shared.free_sequence(sb);
    EXPECT_EQ(shared.page_pool().used_pages(), 0);
  }
}

TEST(PrefixCache, EvictionUnderPressureFreesTheLeastRecentlyUsedPrefixesFirst) {
  const ModelConfig& mc = ref_model().config();
  const CacheConfig cc = cache("int2");
  const CacheLayout l = cache_layout(cc, mc.n_layers, mc.n_kv_heads, mc.head_dim);
  // Two slots, one sequence's windows and pages for two sequences of the whole context.
  const int ctx = 128, n = 2 * l.pages_for(ctx), w = l.window_pages();
  CpuRunner r(ref_model(), cc, ctx, 2, size_t(w + n) * size_t(l.page_bytes));
  ASSERT_EQ(r.page_pool().n_pages(), w + n);
  ASSERT_EQ(l.pages_for(64), 7);
  r.cache().enable_prefix_cache(int64_t(64) << 20);  // copied bytes: room for every state here
  // Three 64-token prompts, each run and ended: their states at 16, 32, 48 and 64 stay cached, and 6 final pages each.
  std::vector<std::vector<int32_t>> p;
  for (int k = 0; k < 3; ++k) {
    p.push_back(token_ids(64, 10 + k));
    const int s = r.new_sequence();
    feed(r, s, p.back(), 0, 64, true);
    r.free_sequence(s);
  }
  EXPECT_EQ(r.prefix_stats().entries, 12);
  EXPECT_EQ(r.page_pool().cached_pages(), 18);
  EXPECT_EQ(r.page_pool().free_pages(), w + n);  // cached pages count as free
  // The first prompt's state at 48 is used again: the least recently used are now its other states, then the second
  // prompt's.
  EXPECT_EQ(r.prefix_match(p[0].data(), 64, kChunk), 48);
  const int s0 = r.new_sequence();
  r.prefix_attach(s0, p[0].data(), 48);
  r.free_sequence(s0);
  // A sequence of the whole context takes its windows and 15 pages, w + 12 are on the free list: taking the other 3
  // evicts, oldest first,
  // the first prompt's states at 16, 32 and 64 (2 pages not shared with its state at 48) and the second prompt's four.
  const int s = r.new_sequence();
  feed(r, s, token_ids(ctx, 20), 0, ctx, false);
  EXPECT_EQ(r.page_pool().pages(s), l.pages_for(ctx));
  EXPECT_EQ(r.prefix_stats().evictions, 7);
  EXPECT_EQ(r.prefix_stats().entries, 5);
  EXPECT_EQ(r.prefix_match(p[0].data(), 64, kChunk), 48);  // used recently: kept
  EXPECT_EQ(r.prefix_match(p[1].data(), 64, kChunk), 0);   // the least recently used: gone
  EXPECT_EQ(r.prefix_match(p[2].data(), 64, kChunk), 48);
  EXPECT_EQ(r.page_pool().cached_pages(), 4 + 6);
  r.free_sequence(s);
  EXPECT_EQ(r.page_pool().free_pages(), w + n);
  EXPECT_EQ(r.page_pool().used_pages(), 0);
}

TEST(PrefixCache, TheSchedulerPrefillsOnlyPastTheCachedPrefixWithTheSameOutput) {
  const std::vector<int32_t> x = token_ids(40, 4);
  const std::vector<int32_t> a = concat(x, token_ids(9, 5)), b = concat(x, token_ids(7, 6));
  GenerateParams g;
  g.max_tokens = 8;
  g.sampler = SamplerConfig{.temperature = 0.f};
  auto run = [&](bool prefix, std::vector<int64_t>* rows, std::vector<int>* cached) {
    CpuRunner r(ref_model(), cache("int2"), 128, 2);
    SchedulerConfig sc;
    sc.prefix_cache = prefix;
    Scheduler s(r, sc);
    std::vector<std::vector<int32_t>> out;
    for (const auto& prompt : {a, b}) {
      const Scheduler::Id id = s.add(std::make_unique<Generation>(prompt, g, nullptr));
      std::vector<int32_t> tokens;
      int64_t fed = 0;
      while (!s.idle()) {
        StepInfo info;
        for (auto& u : s.step(&info)) {
          EXPECT_EQ(u.id, id);
          for (const auto& t : u.output.tokens) tokens.push_back(t.id);
          if (cached && u.output.finish != FinishReason::None) cached->push_back(u.cached_tokens);
        }
        fed += info.rows;
      }
      out.push_back(tokens);
      if (rows) rows->push_back(fed);
    }
    EXPECT_EQ(r.page_pool().n_live(), 0);
    EXPECT_EQ(r.prefix_stats().hit_tokens, prefix ? 32 : 0);
    return out;
  };
  std::vector<int64_t> rows;
  std::vector<int> cached;
  const auto without = run(false, nullptr, nullptr);
  const auto with = run(true, &rows, &cached);
  EXPECT_EQ(with, without);
  EXPECT_EQ(cached, (std::vector<int>{0, 32}));  // b continues from a's state at 32 (its largest chunk boundary)
  EXPECT_EQ(rows[0], int64_t(a.size()) + 7);
  EXPECT_EQ(rows[1], int64_t(b.size()) - 32 + 7);
}
