// Prefix caching on the GPU cache (cuda/gpu_cache.h, the same kv/prefix_cache.h and page pool as the CPU's),
// models/ref: a prompt that continues from another prompt's cached state gives the stored rows (sinks, pages, recent
// window) and the logits of a fresh run, bf16, int2 and int4 with int8 windows (KV4-RL), its final pages shared with
// the cached state; the scheduler prefills only past the cached prefix; a forked sequence (n > 1 choices) holds the
// same rows and gives the same logits. Skipped where no CUDA device is available.
#ifdef KVQ_HAVE_CUDA

#include <cstring>

#include <gtest/gtest.h>

#include "cuda/gpu_cache.h"
#include "cuda/gpu_model.h"
#include "cuda/runtime.h"
#include "engine/scheduler.h"
#include "test_helpers.h"

using namespace kvq;
using kvq::test::token_ids;
using kvq::cuda::GpuModel;

namespace {

Model& ref_model() {
  static std::unique_ptr<Model> m = Model::load(std::string(KVQ_SOURCE_DIR) + "/models/ref", 0);
  return *m;
}

constexpr int kChunk = 32;

// Windows 4 / 8, pages of 8 (the GPU's least), chunks of 32; kv4rl: int4 with INT8 windows (whose ring slots keep the
// body rows too, part of a cached prefix's state).
CacheConfig small_cache(const std::string& type) {
  CacheConfig c;
  c.k.type = c.v.type = type == "kv4rl" ? "int4" : type;
  if (type == "kv4rl") c.window = "int8";
  if (type == "int2") c.k.clip = 0.96f, c.v.clip = 0.92f;
  c.sink = 4, c.recent = 8, c.page_tokens = 8, c.max_chunk = kChunk;
  return c;
}

// Feeds [from, to) in chunks of kChunk (test::feed_chunks); with store: caches the state after each chunk.
std::vector<float> feed(GpuModel& g, int seq, const std::vector<int32_t>& t, int from, int to, bool store) {
  return test::feed_chunks(g, seq, t, from, to, kChunk, store);
}

// Every stored row of seq as a query at its last position reads it, K and V, every (layer, kv head).
std::vector<uint8_t> rows(GpuModel& g, int seq) {
  std::vector<uint8_t> out;
  const int len = g.length(seq);
  for (int l = 0; l < g.config().n_layers; ++l)
    for (int h = 0; h < g.config().n_kv_heads; ++h)
      for (bool values : {false, true}) {
        const std::vector<uint8_t> r = g.cache().download_rows(seq, l, h, values, 0, len);
        out.insert(out.end(), r.begin(), r.end());
      }
  return out;
}

}  // namespace

TEST(PrefixCacheGpu, ASharedPrefixRunEqualsAFreshRunRowForRowAndLogitForLogit) {
  if (!cuda::available()) GTEST_SKIP() << cuda::unavailable_reason();
  std::vector<int32_t> a = token_ids(96, 1), b = token_ids(96, 1);  // a shared prefix of 96 tokens: three chunks
  const std::vector<int32_t> a_own = token_ids(20, 2), b_own = token_ids(25, 3);
  a.insert(a.end(), a_own.begin(), a_own.end());
  b.insert(b.end(), b_own.begin(), b_own.end());
  for (const std::string type : {"bf16", "int2", "kv4rl"}) {
    SCOPED_TRACE(type);
    const int V = ref_model().config().vocab_size;
    GpuModel fresh(ref_model(), small_cache(type), 256, 1);
    const int fs = fresh.new_sequence();
    const std::vector<float> want = feed(fresh, fs, b, 0, int(b.size()), false);

    GpuModel shared(ref_model(), small_cache(type), 256, 2);
    shared.enable_prefix_cache();
    const int sa = shared.new_sequence();
    feed(shared, sa, a, 0, int(a.size()), true);
    const int first_page = shared.page_pool().page(sa, 0);
    shared.free_sequence(sa);
    ASSERT_EQ(shared.prefix_match(b.data(), int(b.size()), kChunk), 96);
    const int sb = shared.new_sequence();
    shared.prefix_attach(sb, b.data(), 96);
    EXPECT_EQ(shared.page_pool().page(sb, 0), first_page);  // shared, not copied
    const std::vector<float> got = feed(shared, sb, b, 96, int(b.size()), false);
    ASSERT_EQ(got.size(), size_t(b.size() - 96) * V);
    EXPECT_EQ(std::memcmp(got.data(), want.data() + (want.size() - got.size()), got.size() * sizeof(float)), 0);
    EXPECT_EQ(rows(shared, sb), rows(fresh, fs));
    EXPECT_EQ(shared.prefix_stats().entries, 3);
  }
}

TEST(PrefixCacheGpu, TheSchedulerPrefillsOnlyPastTheCachedPrefix) {
  if (!cuda::available()) GTEST_SKIP() << cuda::unavailable_reason();
  std::vector<int32_t> a = token_ids(70, 4), b = token_ids(70, 4);
  const std::vector<int32_t> a_own = token_ids(9, 5), b_own = token_ids(11, 6);
  a.insert(a.end(), a_own.begin(), a_own.end());
  b.insert(b.end(), b_own.begin(), b_own.end());
  GpuModel g(ref_model(), small_cache("int2"), 256, 2);
  SchedulerConfig sc;
  sc.prefix_cache = true;
  Scheduler s(g, sc);
  GenerateParams p;
  p.max_tokens = 4;
  p.sampler = SamplerConfig{.temperature = 0.f};
  std::vector<int64_t> rows;
  std::vector<int> cached;
  for (const auto& prompt : {a, b}) {
    s.add(std::make_unique<Generation>(prompt, p, nullptr));
    int64_t fed = 0;
    while (!s.idle()) {
      StepInfo info;
      for (auto& u : s.step(&info))
        if (u.output.finish != FinishReason::None) cached.push_back(u.cached_tokens);
      fed += info.rows;
    }
    rows.push_back(fed);
  }
  EXPECT_EQ(cached, (std::vector<int>{0, 64}));
  EXPECT_EQ(rows[1], int64_t(b.size()) - 64 + 3);
  EXPECT_EQ(g.page_pool().n_live(), 0);
}

TEST(PrefixCacheGpu, AForkedSequenceHoldsTheSameRowsAndGivesTheSameLogits) {
  if (!cuda::available()) GTEST_SKIP() << cuda::unavailable_reason();
  const std::vector<int32_t> prompt = token_ids(77, 7);
  for (const std::string type : {"bf16", "int2", "kv4rl"}) {
    SCOPED_TRACE(type);
    const int V = ref_model().config().vocab_size;
    GpuModel g(ref_model(), small_cache(type), 256, 2);
    const int a = g.new_sequence();
    feed(g, a, prompt, 0, int(prompt.size()), false);
    const int b = g.new_sequence();
    g.fork_sequence(a, b);  // n > 1 choices: b's cache is a copy of a's, pages of its own
    EXPECT_EQ(g.length(b), g.length(a));
    EXPECT_NE(g.page_pool().page(b, 0), g.page_pool().page(a, 0));
    EXPECT_EQ(rows(g, b), rows(g, a));
    std::vector<float> la(size_t(V), 0.f), lb(size_t(V), 0.f);
    const int32_t next = 42;
    g.forward(a, &next, 1, la.data(), false);
    g.forward(b, &next, 1, lb.data(), false);
    EXPECT_EQ(std::memcmp(la.data(), lb.data(), size_t(V) * sizeof(float)), 0);
  }
}

#endif  // KVQ_HAVE_CUDA
