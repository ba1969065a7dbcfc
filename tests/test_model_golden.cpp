// The CPU runtime against golden outputs from Hugging Face transformers (tests/golden, scripts/make_golden.py):
// logits of the first positions and the last position of every golden prompt, and 64-token greedy continuations.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>

#include "common/error.h"
#include "kv/cache.h"
#include "model/model.h"
#include "model/safetensors.h"

using namespace kvq;

namespace {

const std::string kModelDir = std::string(KVQ_SOURCE_DIR) + "/models/ref";
const std::string kGolden = std::string(KVQ_SOURCE_DIR) + "/tests/golden/golden.safetensors";

Model& ref_model() {
  static std::unique_ptr<Model> model = Model::load(kModelDir, 2);
  return *model;
}

std::vector<int32_t> golden_ints(const SafeTensorsFile& f, const std::string& name) {
  const TensorInfo& info = f.at(name);
  EXPECT_EQ(info.dtype, DType::I32);
  std::vector<int32_t> out(size_t(info.numel()));
  std::memcpy(out.data(), f.data(info), out.size() * sizeof(int32_t));
  return out;
}

CacheConfig f32_cache() {
  CacheConfig c;
  c.k.type = c.v.type = c.window = "f32";
  c.sink = c.recent = 0;
  return c;
}

// Prefill ids in chunks of max_chunk, returning the logits of every position [n, vocab].
std::vector<float> prefill_all(Model& m, KvCache& cache, int seq, const std::vector<int32_t>& ids) {
  const int V = m.config().vocab_size, chunk = cache.config().max_chunk;
  std::vector<float> logits(ids.size() * size_t(V));
  for (size_t i = 0; i < ids.size(); i += size_t(chunk)) {
    const int n = int(std::min(ids.size() - i, size_t(chunk)));
    m.forward(cache, seq, ids.data() + i, n, logits.data() + i * V, true);
  }
  return logits;
}

}  // namespace

TEST(ModelGolden, LogitsMatchTransformersWithinTolerance) {
  Model& m = ref_model();
  auto golden = SafeTensorsFile::open(kGolden);
  const int V = m.config().vocab_size;
  double worst = 0;
  for (int p = 0; golden->find("p" + std::to_string(p) + ".ids"); ++p) {
    const std::string key = "p" + std::to_string(p);
    const auto ids = golden_ints(*golden, key + ".ids");
    const auto positions = golden_ints(*golden, key + ".positions");
    const auto ref = to_f32(TensorRef{&golden->at(key + ".logits"), golden->data(golden->at(key + ".logits"))});
    KvCache cache(f32_cache(), m.config().n_layers, m.config().n_kv_heads, m.config().head_dim, 2048);
    const int seq = cache.new_sequence();
    const auto logits = prefill_all(m, cache, seq, ids);
    for (size_t r = 0; r < positions.size(); ++r)
      for (int v = 0; v < V; ++v)
        worst = std::max(worst, double(std::fabs(logits[size_t(positions[r]) * V + v] - ref[r * V + v])));
  }
  RecordProperty("max_abs_delta_logit", std::to_string(worst));
  std::printf("max |delta logit| vs transformers (f32 cache): %.3g\n", worst);
  EXPECT_LT(worst, 2e-3);
}

TEST(ModelGolden, GreedyContinuationIdenticalToTransformers) {
  Model& m = ref_model();
  auto golden = SafeTensorsFile::open(kGolden);
  const int V = m.config().vocab_size;
  for (int p = 0; golden->find("p" + std::to_string(p) + ".ids"); ++p) {
    const std::string key = "p" + std::to_string(p);
    const auto ids = golden_ints(*golden, key + ".ids");
    const auto want = golden_ints(*golden, key + ".greedy");
    KvCache cache(f32_cache(), m.config().n_layers, m.config().n_kv_heads, m.config().head_dim, 2048);
    const int seq = cache.new_sequence();
    std::vector<float> logits = prefill_all(m, cache, seq, ids);
    const float* last = logits.data() + (ids.size() - 1) * V;
    std::vector<int32_t> got;
    std::vector<float> step(static_cast<size_t>(V));
    for (size_t i = 0; i < want.size(); ++i) {
      int32_t next = int32_t(std::max_element(last, last + V) - last);
      got.push_back(next);
      m.forward(cache, seq, &next, 1, step.data(), false);
      last = step.data();
    }
    EXPECT_EQ(got, want) << "prompt " << p;
  }
}

TEST(ModelGolden, ChunkSizeDoesNotChangeLogits) {
  // Chunked prefill through the paged cache must equal one pass (f32 cache, so only summation order differs).
  Model& m = ref_model();
  auto golden = SafeTensorsFile::open(kGolden);
  const auto ids = golden_ints(*golden, "p3.ids");
  const int V = m.config().vocab_size;
  std::vector<std::vector<float>> runs;
  for (int chunk : {1024, 97, 512}) {
    CacheConfig cfg = f32_cache();
    cfg.max_chunk = chunk;
    cfg.page_tokens = 64;
    KvCache cache(cfg, m.config().n_layers, m.config().n_kv_heads, m.config().head_dim, 2048);
    runs.push_back(prefill_all(m, cache, cache.new_sequence(), ids));
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    double worst = 0;
    for (size_t i = 0; i < runs[0].size(); ++i) worst = std::max(worst, double(std::fabs(runs[r][i] - runs[0][i])));
    EXPECT_LT(worst, 1e-3) << "chunking " << r;
  }
  (void)V;
}

TEST(ModelGolden, ContextOverflowIsAnError) {
  Model& m = ref_model();
  KvCache cache(f32_cache(), m.config().n_layers, m.config().n_kv_heads, m.config().head_dim, 16);
  const int seq = cache.new_sequence();
  std::vector<int32_t> ids(17, 5);
  std::vector<float> logits(size_t(m.config().vocab_size));
  try {
    m.forward(cache, seq, ids.data(), 17, logits.data(), false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context overflow"), std::string::npos) << e.what();
  }
  ids[0] = 99999;
  EXPECT_THROW(m.forward(cache, seq, ids.data(), 1, logits.data(), false), Error);
}
