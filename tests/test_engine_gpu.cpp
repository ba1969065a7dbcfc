// The engine on the GPU runner (cuda/gpu_model.h), models/ref: a mixed step — one sequence's decode token beside
// other sequences' prefill chunks, as the continuous-batching scheduler sends it — gives each sequence the logits it
// gets alone (within the GPU tolerance of tests/test_gpu_model.cpp: the attention split follows the whole step), and
// the scheduler completes concurrent requests through a pool too small for them (preemption), the pool empty after.
// Skipped where no CUDA device is available.
#ifdef KVQ_HAVE_CUDA

#include <cmath>

#include <gtest/gtest.h>

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

CacheConfig small_cache(const std::string& type) {  // windows 4 / 8, pages of 8 (the GPU's least), chunks of 32
  CacheConfig c;
  c.k.type = c.v.type = type;
  if (type == "int2") c.k.clip = 0.96f, c.v.clip = 0.92f;
  c.sink = 4, c.recent = 8, c.page_tokens = 8, c.max_chunk = 32;
  return c;
}

// Last-row logits of seq after feeding chunks (sizes) of tokens.
std::vector<float> feed(Runner& r, int seq, const std::vector<int32_t>& tokens, const std::vector<int>& chunks) {
  std::vector<float> logits(size_t(r.config().vocab_size));
  size_t at = 0;
  for (int n : chunks) {
    r.forward(seq, tokens.data() + at, n, logits.data(), false);
    at += size_t(n);
  }
  return logits;
}

}  // namespace

TEST(EngineGpu, AMixedStepOfDecodeAndPrefillChunksGivesEachSequenceItsLogitsAlone) {
  if (!cuda::available()) GTEST_SKIP() << cuda::unavailable_reason();
  Model& m = ref_model();
  const int V = m.config().vocab_size;
  for (const std::string type : {"bf16", "int2"}) {
    const CacheConfig cc = small_cache(type);
    const std::vector<int32_t> a = token_ids(101, 1), b = token_ids(72, 2), c = token_ids(20, 3);
    // Before the mixed step: a holds 100 tokens, b 40. The step: a's 101st token, b's next 32, c's first 20.
    std::vector<std::vector<float>> alone;
    {
      GpuModel g(m, cc, 256, 1);
      alone.push_back(feed(g, g.new_sequence(), a, {32, 32, 32, 4, 1}));
    }
    {
      GpuModel g(m, cc, 256, 1);
      alone.push_back(feed(g, g.new_sequence(), b, {32, 8, 32}));
    }
    {
      GpuModel g(m, cc, 256, 1);
      alone.push_back(feed(g, g.new_sequence(), c, {20}));
    }
    CacheConfig mixed = cc;  // the mixed step is 53 rows: the runner's activations hold max(chunk, seqs) rows
    mixed.max_chunk = 64;
    GpuModel g(m, mixed, 256, 3);
    const int sa = g.new_sequence(), sb = g.new_sequence(), sc = g.new_sequence();
    feed(g, sa, a, {32, 32, 32, 4});
    feed(g, sb, b, {32, 8});
    std::vector<int32_t> step = {a[100]};
    step.insert(step.end(), b.begin() + 40, b.end());
    step.insert(step.end(), c.begin(), c.end());
    std::vector<float> logits(3 * size_t(V));
    std::vector<int32_t> argmax(3);
    g.forward({sa, sb, sc}, {1, 32, 20}, step.data(), LogitRows::Last, logits.data(), argmax.data());
    for (int s = 0; s < 3; ++s) {
      double max_abs = 0, sr = 0;
      for (int i = 0; i < V; ++i) {
        max_abs = std::max(max_abs, std::abs(double(logits[size_t(s) * V + i]) - alone[size_t(s)][size_t(i)]));
        sr += double(alone[size_t(s)][size_t(i)]) * alone[size_t(s)][size_t(i)];
      }
      const double rms = std::sqrt(sr / V);
      EXPECT_LE(max_abs, 5e-2 * rms) << type << " sequence " << s;
      EXPECT_EQ(argmax[size_t(s)], argmax_row(alone[size_t(s)].data(), V)) << type << " sequence " << s;
    }
  }
}

TEST(EngineGpu, SchedulerCompletesConcurrentRequestsThroughATightPool) {
  if (!cuda::available()) GTEST_SKIP() << cuda::unavailable_reason();
  Model& m = ref_model();
  const CacheConfig cc = small_cache("int2");
  const CacheLayout l = cache_layout(cc, m.config().n_layers, m.config().n_kv_heads, m.config().head_dim);
  const int ctx = 128, seqs = 6;
  // Two sequences' windows and the pages of one sequence of the whole context: the two running grow past them.
  GpuModel g(m, cc, ctx, seqs, cuda::GemmPrecision::Bf16,
             size_t(2 * l.window_pages() + l.pages_for(ctx)) * size_t(l.page_bytes));
  Scheduler s(g);
  GenerateParams p;
  p.sampler.temperature = 0;
  for (int i = 0; i < 12; ++i) {
    p.max_tokens = 20 + i;
    s.add(std::make_unique<Generation>(token_ids(40 + 3 * i, i), p, nullptr));
  }
  std::vector<int> generated;
  for (int guard = 0; guard < 5000 && !s.idle(); ++guard)
    for (const Scheduler::Update& u : s.step()) {
      ASSERT_NE(u.output.finish, FinishReason::Error) << u.output.error;
      if (u.output.finish != FinishReason::None) generated.push_back(u.generated_tokens);
    }
  EXPECT_TRUE(s.idle());
  ASSERT_EQ(generated.size(), 12u);
  int total = 0;
  for (int n : generated) total += n;
  EXPECT_EQ(total, 12 * 20 + 66);  // every request its max_tokens (no stop ids)
  EXPECT_GT(s.preemptions(), 0);
  EXPECT_EQ(g.page_pool().used_pages(), 0);
  EXPECT_EQ(g.page_pool().n_live(), 0);
}

#endif  // KVQ_HAVE_CUDA
