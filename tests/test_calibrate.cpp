// Calibration on the reference model with a small budget: OptR improves the held-out objective on every head it
// keeps, the learned rotations are orthogonal, rotation files round-trip and refuse other cache grids, and
// centering + rotation leave a lossless cache's perplexity unchanged.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "calib/calibrate.h"
#include "common/error.h"
#include "eval/perplexity.h"
#include "rotation/rotation_file.h"
#include "tokenizer/tokenizer.h"

using namespace kvq;

namespace {

const std::string kSrc = KVQ_SOURCE_DIR;

std::vector<int32_t> tokens_of(const std::string& path, size_t max_tokens) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const Tokenizer tok = Tokenizer::load(kSrc + "/models/ref/tokenizer.json");
  std::vector<int32_t> ids = tok.encode(ss.str().substr(0, max_tokens * 8));
  ids.resize(std::min(ids.size(), max_tokens));
  return ids;
}

CalibrateConfig small_optr() {
  CalibrateConfig c;
  c.method = "optr";
  c.base = "oscar";
  c.tokens = 2048;
  c.chunk = 512;
  c.n_queries = 32;
  c.steps = 10;
  c.cache.k = {.type = "int2", .head_dim = 128, .group = 128, .clip = 0.96f};
  c.cache.v = {.type = "int2", .head_dim = 128, .group = 128, .clip = 0.92f};
  c.cache.sink = 16;
  c.cache.recent = 64;
  return c;
}

double max_orthogonality_error(const std::vector<float>& r, int d) {
  double worst = 0;
  for (size_t m = 0; m < r.size() / (size_t(d) * d); ++m) {
    const float* R = r.data() + m * d * d;
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(R[i * d + c]) * R[j * d + c];
        worst = std::max(worst, std::fabs(dot - (i == j)));
      }
  }
  return worst;
}

}  // namespace

TEST(Calibrate, OptrImprovesHeldOutLossOnKeptHeadsAndRoundTrips) {
  auto model = Model::load(kSrc + "/models/ref", 2);
  const auto ids = tokens_of(kSrc + "/data/calib/linux.txt", 2048);
  const CalibrateConfig cfg = small_optr();
  CalibrateReport rep;
  const KvTransform t = calibrate(*model, ids, cfg, &rep);
  EXPECT_EQ(t.name, "optr(oscar)");
  ASSERT_EQ(rep.heads.size(), size_t(model->config().n_layers * model->config().n_kv_heads));
  int kept = 0;
  for (const auto& h : rep.heads) {
    if (h.key_kept) EXPECT_LT(h.key_after, h.key_before) << "layer " << h.layer << " head " << h.head;
    else EXPECT_EQ(h.key_after, h.key_before);
    if (h.value_kept) EXPECT_LT(h.value_after, h.value_before) << "layer " << h.layer << " head " << h.head;
    else EXPECT_EQ(h.value_after, h.value_before);
    kept += h.key_kept + h.value_kept;
  }
  EXPECT_GT(kept, 0) << "OptR kept no learned rotation at all";
  EXPECT_LT(max_orthogonality_error(t.r_k, 128), 1e-4);
  EXPECT_LT(max_orthogonality_error(t.r_v, 128), 1e-4);
  ASSERT_EQ(t.key_mean.size(), size_t(8 * 2 * 128));  // optr centres keys

  const std::string path = (std::filesystem::temp_directory_path() / "kvq_test_optr.safetensors").string();
  nlohmann::json meta = {{"method", t.name}, {"model_fingerprint", model->fingerprint()},
                         {"cache", {{"type_k", "int2"}, {"type_v", "int2"}, {"group", 128}, {"clip_k", 0.96f},
                                    {"clip_v", 0.92f}, {"sink", 16}, {"recent", 64}}}};
  save_rotation_file(path, t, meta);
  const RotationFile f = load_rotation_file(path);
  EXPECT_EQ(f.transform.r_k, t.r_k);
  EXPECT_EQ(f.transform.key_mean, t.key_mean);
  EXPECT_NO_THROW(check_rotation_fits(f, model->fingerprint(), 8, 2, 128, cfg.cache));
  CacheConfig other = cfg.cache;
  other.recent = 256;
  EXPECT_THROW(check_rotation_fits(f, model->fingerprint(), 8, 2, 128, other), Error);
  EXPECT_THROW(check_rotation_fits(f, "0123456789abcdef", 8, 2, 128, cfg.cache), Error);
  std::filesystem::remove(path);
}

TEST(Calibrate, CentringAndRotationLeaveLosslessPerplexityUnchanged) {
  // With an f32 cache, (k - mu) R_K, q R_K, v R_V and o R_V^T are exact: ppl must not move.
  auto model = Model::load(kSrc + "/models/ref", 2);
  const auto calib = tokens_of(kSrc + "/data/calib/python.txt", 1024);
  CalibrateConfig cfg;
  cfg.method = "oscar";
  cfg.tokens = 1024;
  cfg.chunk = 512;
  cfg.center_keys = 1;
  const KvTransform t = calibrate(*model, calib, cfg);
  ASSERT_FALSE(t.key_mean.empty());
  const auto eval = tokens_of(kSrc + "/data/eval/python.txt", 512);
  CacheConfig f32;
  f32.k.type = f32.v.type = f32.window = "f32";
  const double plain = perplexity(*model, f32, eval, 512, 1).ppl();
  f32.transform = std::make_shared<KvTransform>(t);
  const double rotated = perplexity(*model, f32, eval, 512, 1).ppl();
  EXPECT_NEAR(rotated / plain, 1.0, 1e-4) << plain << " vs " << rotated;
}

TEST(Calibrate, RejectsBadSettingsBeforeAnyWork) {
  auto model = Model::load(kSrc + "/models/ref", 1);
  const std::vector<int32_t> ids(4096, 7);
  CalibrateConfig c = small_optr();
  c.method = "spinquant";
  EXPECT_THROW(calibrate(*model, ids, c), Error);
  c = small_optr();
  c.cache.sink = 256, c.cache.recent = 256;  // nothing left to quantize in a 512-token chunk
  EXPECT_THROW(calibrate(*model, ids, c), Error);
  c = small_optr();
  c.tokens = 1024;  // 2 chunks < 2 calibration + 2 held-out
  EXPECT_THROW(calibrate(*model, ids, c), Error);
  c = small_optr();
  c.cache.k.type = c.cache.v.type = "kivi2";
  EXPECT_THROW(calibrate(*model, ids, c), Error);
}
