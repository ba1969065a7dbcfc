// The golden perplexity check: kvq's ppl for each of llama.cpp's cache types (its KV rotation on and off) against
// llama.cpp's own ppl on the same tokens, two eval domains (tests/golden/llamacpp_ppl.json; the llama.cpp commit,
// command lines and what is scored: tests/golden/llamacpp_ppl.README.md). Short windows keep it fast: models/ref,
// one window of 512 tokens per domain, every next-token prediction scored, no sink / recent windows (llama.cpp's
// cache has none): what `kvq ppl -c 512 --chunks 1 -ctk T -ctv T --kv-sink 0 --kv-recent 0 [--attn-rot off]` scores.
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

#include "codecs/registry.h"
#include "common/sha256.h"
#include "eval/perplexity.h"
#include "kv/cache.h"
#include "model/model.h"
#include "rotation/rotation_file.h"
#include "tokenizer/tokenizer.h"

using namespace kvq;

namespace {

const std::string kSrc = KVQ_SOURCE_DIR;

class LlamaCppPpl : public ::testing::TestWithParam<const char*> {};

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

// The first ctx · windows ids of a domain's eval text as kvq ppl tokenizes it (the file's first 5 characters per id
// needed tokenize to the same leading ids as the whole file), checked against the sha256 of the ids llama.cpp scored.
std::vector<int32_t> ids(const nlohmann::json& protocol, const std::string& domain) {
  const nlohmann::json& d = protocol.at("domains").at(domain);
  const size_t n = size_t(protocol.at("ctx").get<int>()) * protocol.at("windows").get<int>();
  static const Tokenizer tok = Tokenizer::load(kSrc + "/models/ref/tokenizer.json");
  std::ifstream f(kSrc + "/" + d.at("file").get<std::string>(), std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<int32_t> v = tok.encode(ss.str().substr(0, 5 * n + 20000));
  EXPECT_GT(v.size(), n + 64) << domain;
  v.resize(n);
  Sha256 h;
  h.update(v.data(), v.size() * sizeof(int32_t));  // little-endian int32, as llama.cpp's llama_token
  EXPECT_EQ(h.hex_digest(), d.at("ids_sha256").get<std::string>()) << domain << ": not the tokens llama.cpp scored";
  return v;
}

double kvq_ppl(const nlohmann::json& protocol, const std::vector<int32_t>& ids, const std::string& type, bool attn_rot) {
  CacheConfig c;
  c.k = codec_spec(type, true, kDefaultGroup, 0.f);
  c.v = codec_spec(type, false, kDefaultGroup, 0.f);
  c.sink = 0, c.recent = 0;
  const ModelConfig& mc = model().config();
  if (attn_rot) c.transform = codec_transform(c, mc.n_layers, mc.n_kv_heads, mc.head_dim);  // as kvq ppl builds it
  return perplexity(model(), c, ids, protocol.at("ctx").get<int>(), protocol.at("windows").get<int>()).ppl();
}

// Every run of one type in a protocol: kvq's ppl within the run's tolerance of llama.cpp's.
void check_type(const std::string& protocol_name, const std::string& type) {
  const nlohmann::json& p = golden().at("protocols").at(protocol_name);
  std::map<std::string, std::vector<int32_t>> tokens;
  int checked = 0;
  for (const nlohmann::json& r : p.at("runs")) {
    if (r.at("type") != type) continue;
    const std::string domain = r.at("domain");
    if (!tokens.count(domain)) tokens[domain] = ids(p, domain);
    const bool rot = r.at("attn_rot");
    const double want = r.at("ppl"), tol = r.at("tolerance");
    const double got = kvq_ppl(p, tokens[domain], type, rot);
    std::printf("%s %s %s attn_rot %s: kvq %.4f llama.cpp %.4f (%+.3f%%, budget %.2f%%)\n", protocol_name.c_str(),
                domain.c_str(), type.c_str(), rot ? "on" : "off", got, want, 100 * (got / want - 1), 100 * tol);
    EXPECT_NEAR(got / want, 1.0, tol) << domain << " " << type << " attn_rot " << rot;
    ++checked;
  }
  EXPECT_GE(checked, 1) << type;
}

const char* const kTypes[] = {"f16", "bf16", "q8_0", "q5_0", "q4_1", "q4_0", "iq4_nl"};

}  // namespace

// The budgets (each run's "tolerance"; README): 0.1% for the 16-bit caches; q8_0 0.25% and the 4-5 bit types 1.5%,
// the measured floor of a 511-token window: exact invariances at float-rounding scale already move kvq's own ppl by
// up to 0.06% (q8_0) and 0.4% (4-5 bits), because a code that flips in one layer changes what the next layers quantize.
TEST_P(LlamaCppPpl, KvqPerplexityMatchesLlamaCppsOnTheSameTokens) { check_type("short", GetParam()); }

INSTANTIATE_TEST_SUITE_P(Types, LlamaCppPpl, ::testing::ValuesIn(kTypes), [](const auto& info) {
  return std::string(info.param);
});

// The long protocol (python, 4 windows of 2048 tokens: 8,188 predictions, the figures of docs/research/llamacpp-kv.md
// §4): tighter budgets, too slow for CI (minutes); run with --gtest_also_run_disabled_tests.
TEST(LlamaCppPplLong, DISABLED_KvqPerplexityMatchesLlamaCppsOverFourWindowsOf2048) {
  for (const char* t : kTypes) check_type("long", t);
}
