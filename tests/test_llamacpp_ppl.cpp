// The golden perplexity check: kvq's ppl for each of llama.cpp's cache types (its KV rotation on and off) against
// llama.cpp's own ppl on the same tokens, two eval domains (tests/golden/llamacpp_ppl.json; the llama.cpp commit,
// command lines and what is scored: tests/golden/llamacpp_ppl.README.md). Short windows keep it fast: models/ref,
// one window of 512 tokens per domain, every next-token prediction scored, no sink / recent windows (llama.cpp's
// cache has none).
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/sha256.h"
#include "eval/perplexity.h"
#include "kv/cache.h"
#include "kv/codec_registry.h"
#include "model/model.h"
#include "rotation/attn_rot.h"
#include "tokenizer/tokenizer.h"

using namespace kvq;

namespace {

const std::string kSrc = KVQ_SOURCE_DIR;

const nlohmann::json& golden() {
  static const nlohmann::json j = [] {
    std::ifstream f(kSrc + "/tests/golden/llamacpp_ppl.json");
    return nlohmann::json::parse(f);
  }();
  return j;
}

Model& model() {
  static std::unique_ptr<Model> m = Model::load(kSrc + "/models/ref", 2);
  return *m;
}

// The first ctx · windows ids of a domain's eval text as kvq ppl tokenizes it (the file's first 40000 characters
// tokenize to the same leading ids as the whole file), checked against the sha256 of the ids llama.cpp scored.
const std::vector<int32_t>& ids(const std::string& domain) {
  static std::map<std::string, std::vector<int32_t>> cache;
  auto it = cache.find(domain);
  if (it != cache.end()) return it->second;
  const nlohmann::json& d = golden().at("domains").at(domain);
  const Tokenizer tok = Tokenizer::load(kSrc + "/models/ref/tokenizer.json");
  std::ifstream f(kSrc + "/" + d.at("file").get<std::string>(), std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<int32_t> v = tok.encode(ss.str().substr(0, 40000));
  const size_t n = size_t(golden().at("ctx").get<int>()) * golden().at("windows").get<int>();
  EXPECT_GT(v.size(), n + 64) << domain;
  v.resize(n);
  Sha256 h;
  h.update(v.data(), v.size() * sizeof(int32_t));  // little-endian int32, as llama.cpp's llama_token
  EXPECT_EQ(h.hex_digest(), d.at("ids_sha256").get<std::string>()) << domain << ": not the tokens llama.cpp scored";
  return cache[domain] = std::move(v);
}

double kvq_ppl(const std::string& domain, const std::string& type, bool attn_rot) {
  CacheConfig c;
  c.k = codec_spec(type, true, kDefaultGroup, 0.f);
  c.v = codec_spec(type, false, kDefaultGroup, 0.f);
  c.sink = 0, c.recent = 0;
  const ModelConfig& mc = model().config();
  if (const AttnRot r = attn_rot_for(c, mc.head_dim); attn_rot && r.on())
    c.transform = std::make_shared<KvTransform>(attn_rot_transform(r, mc.n_layers, mc.n_kv_heads, mc.head_dim));
  return perplexity(model(), c, ids(domain), golden().at("ctx").get<int>(), golden().at("windows").get<int>()).ppl();
}

class LlamaCppPpl : public ::testing::TestWithParam<std::string> {};

}  // namespace

// Budget: 0.1% relative wherever the two engines do the same arithmetic up to float rounding (16-bit caches, and
// q8_0 with its 8-bit query); the runs' own "tolerance" field says otherwise and why (README).
TEST_P(LlamaCppPpl, KvqPerplexityMatchesLlamaCppsOnTheSameTokens) {
  const std::string type = GetParam();
  int checked = 0;
  for (const nlohmann::json& r : golden().at("runs")) {
    if (r.at("type") != type) continue;
    const std::string domain = r.at("domain");
    const bool rot = r.at("attn_rot");
    const double want = r.at("ppl"), tol = r.value("tolerance", 0.001);
    const double got = kvq_ppl(domain, type, rot);
    std::printf("%s %s attn_rot %s: kvq %.4f llama.cpp %.4f (%+.3f%%, budget %.2f%%)\n", domain.c_str(), type.c_str(),
                rot ? "on" : "off", got, want, 100 * (got / want - 1), 100 * tol);
    EXPECT_NEAR(got / want, 1.0, tol) << domain << " " << type << " attn_rot " << rot;
    ++checked;
  }
  EXPECT_GE(checked, 2) << type;
}

INSTANTIATE_TEST_SUITE_P(Types, LlamaCppPpl,
                         ::testing::Values("f16", "bf16", "q8_0", "q5_0", "q4_1", "q4_0", "iq4_nl"),
                         [](const auto& info) { return info.param; });
