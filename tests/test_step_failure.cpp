// A step that fails midway: an exception from inside a runner's forward after some layers have appended their rows
// and demoted a block into a new page (a layer hook that throws at layer 1, as a failed check or launch would), not
// before the cache is touched as the fault injector (engine/fault_injector.h) throws. The engine's recovery
// (Scheduler::step) ends that step's requests and goes on with the others, so the runner must be left as before the
// step: the sequence's length unchanged, the step retried giving the logits of a run that never failed, and the
// decode steps after it too (they read the rows and pages the failed step had written); freeing the sequences empties
// the pool. models/ref, int2 with windows 4 / 8 and pages of 8; the CPU runner, and the GPU runner where a CUDA
// device is (skipped elsewhere).
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "model/model.h"
#include "model/runner.h"
#include "test_helpers.h"
#ifdef KVQ_HAVE_CUDA
#include "cuda/gpu_model.h"
#include "cuda/runtime.h"
#endif

using namespace kvq;
using kvq::test::token_ids;

namespace {

Model& ref_model() {
  static std::unique_ptr<Model> m = Model::load(std::string(KVQ_SOURCE_DIR) + "/models/ref", 0);
  return *m;
}

CacheConfig small_int2() {  // windows 4 / 8, pages of 8 (the GPU's least), chunks of 32
  CacheConfig c;
  c.k.type = c.v.type = "int2";
  c.k.clip = 0.96f, c.v.clip = 0.92f;
  c.sink = 4, c.recent = 8, c.page_tokens = 8, c.max_chunk = 32;
  return c;
}

// Throws from inside the forward once layer `layer`'s attention has run (its rows are appended).
struct ThrowAtLayer final : Model::LayerHook {
  int layer;
  int thrown = 0;
  explicit ThrowAtLayer(int l) : layer(l) {}
  void on_layer_input(int, int, int, float*) override {}
  void on_attention_output(int l, int, int, const float*) override {
    if (l != layer) return;
    ++thrown;
    KVQ_FAIL("a failing step (test): layer {}", l);
  }
  void on_layer_output(int, int, int, const float*) override {}
};

constexpr int kPrompt = 32, kStep = 13, kDecode = 3;  // the failing step: positions [32, 45)

// The logits (every row) of the step [kPrompt, kPrompt + kStep) and of kDecode decode steps after it, each a
// [vocab] row, of a fresh sequence; with fail: the step is first tried with a layer hook that throws at layer 1.
std::vector<float> run(Runner& r, bool fail) {
  const std::vector<int32_t> t = token_ids(kPrompt + kStep + kDecode, 1);
  const int V = r.config().vocab_size;
  const int seq = r.new_sequence();
  std::vector<float> prompt(size_t(V) * kPrompt), out(size_t(V) * (kStep + kDecode));
  r.forward(seq, t.data(), kPrompt, prompt.data(), true);
  const int pages_before = r.page_pool().pages(seq);
  if (fail) {
    ThrowAtLayer hook(1);
    r.set_layer_hook(&hook);
    std::vector<float> lost(size_t(V) * kStep);
    EXPECT_THROW(r.forward(seq, t.data() + kPrompt, kStep, lost.data(), true), Error);
    r.set_layer_hook(nullptr);
    EXPECT_EQ(hook.thrown, 1);
    EXPECT_EQ(r.length(seq), kPrompt);  // nothing committed
    EXPECT_GE(r.page_pool().pages(seq), pages_before);
  }
  r.forward(seq, t.data() + kPrompt, kStep, out.data(), true);
  EXPECT_EQ(r.length(seq), kPrompt + kStep);
  EXPECT_GT(r.page_pool().pages(seq), pages_before);  // the step demoted rows into a page it took
  for (int i = 0; i < kDecode; ++i)
    r.forward(seq, t.data() + kPrompt + kStep + i, 1, out.data() + size_t(V) * (kStep + i), false);
  EXPECT_EQ(r.length(seq), kPrompt + kStep + kDecode);
  r.free_sequence(seq);
  EXPECT_EQ(r.page_pool().used_pages(), 0);
  EXPECT_EQ(r.page_pool().n_live(), 0);
  return out;
}

void expect_same_logits(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  bool finite = true;
  for (float x : got) finite = finite && std::isfinite(x);
  EXPECT_TRUE(finite);
}

}  // namespace

TEST(StepFailure, AStepThatThrowsMidwayLeavesTheCpuRunnerAsBeforeAndItsRetryGivesTheUnfailedLogits) {
  CpuRunner fresh(ref_model(), small_int2(), 256, 1);
  const std::vector<float> want = run(fresh, false);
  CpuRunner failing(ref_model(), small_int2(), 256, 1);
  expect_same_logits(run(failing, true), want);
}

#ifdef KVQ_HAVE_CUDA
TEST(StepFailure, AStepThatThrowsMidwayLeavesTheGpuCacheReadyAndItsRetryGivesTheUnfailedLogits) {
  if (!cuda::available()) GTEST_SKIP() << cuda::unavailable_reason();
  cuda::GpuModel fresh(ref_model(), small_int2(), 256, 1);
  const std::vector<float> want = run(fresh, false);
  cuda::GpuModel failing(ref_model(), small_int2(), 256, 1);
  expect_same_logits(run(failing, true), want);
}
#endif
