// Every architecture against Hugging Face transformers, on the CPU: the tiny random checkpoints under tests/models
// (scripts/make_tiny_models.py, tests/models/MANIFEST.json: Llama 3.2 with llama3 RoPE scaling and tied embeddings,
// Qwen2.5 with q/k/v biases, Qwen3 at head_dim 128 and 256, Mistral with a sliding window of 24 that the 33- and
// 80-token prompts run past, Llama at head_dim 96 and 80), each with transformers 5.17's logits (eager attention in
// fp32 on the bf16 weights) of the first and last 8 positions of three prompts, and 24-token greedy continuations
// with each step's top-1 minus top-2 logit.
//
// Bounds. kvq computes the same fp32 maths on the same bf16 weights in another summation order (and, in the 64-row
// tiles of its attention, another softmax order), so with an f32 cache the logits differ by float rounding only: the
// measured worst |Δ logit| is 2.6e-6 over the seven models (logits of std ~0.7); kF32Bound = 2e-5 leaves 7x. A bf16
// cache rounds every key and value to bf16 (relative 2^-9), which moves these logits by up to 1.4e-2 (measured, llama-d96):
// kBf16Bound = 3e-2.
// Greedy continuations must equal transformers' step by step while the step's recorded margin exceeds twice the
// bound (below that, a rounding-level difference may legitimately pick the other token and the rest diverges).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/mapped_file.h"
#include "model/model.h"
#include "model/runner.h"
#include "model/safetensors.h"

using namespace kvq;

namespace {

const std::string kModels = std::string(KVQ_SOURCE_DIR) + "/tests/models";
constexpr double kF32Bound = 2e-5;
constexpr double kBf16Bound = 3e-2;

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = {"llama3-d64", "qwen2.5-d64", "qwen3-d128",  "qwen3-d256",
                                                 "mistral-d64-sw", "llama-d96", "llama-d80"};
  return names;
}

template <class T>
std::vector<T> golden(const SafeTensorsFile& f, const std::string& name, DType dtype) {
  const TensorInfo& info = f.at(name);
  EXPECT_EQ(info.dtype, dtype) << name;
  std::vector<T> out(size_t(info.numel()));
  std::memcpy(out.data(), f.data(info), out.size() * sizeof(T));
  return out;
}

struct Prompt {
  std::vector<int32_t> ids, rows, greedy;
  std::vector<float> logits, margin;  // [rows, vocab], [greedy]
};

std::vector<Prompt> prompts(const std::string& model) {
  const auto f = SafeTensorsFile::open(kModels + "/" + model + "/golden.safetensors");
  std::vector<Prompt> out;
  for (int p = 0; f->find("p" + std::to_string(p) + ".ids"); ++p) {
    const std::string k = "p" + std::to_string(p) + ".";
    out.push_back({golden<int32_t>(*f, k + "ids", DType::I32), golden<int32_t>(*f, k + "rows", DType::I32),
                   golden<int32_t>(*f, k + "greedy", DType::I32), golden<float>(*f, k + "logits", DType::F32),
                   golden<float>(*f, k + "margin", DType::F32)});
  }
  return out;
}

CacheConfig cache_of(const std::string& type, int chunk, int page) {
  CacheConfig c;
  c.k.type = c.v.type = c.window = type;
  c.sink = c.recent = 0;
  c.max_chunk = chunk;
  c.page_tokens = page;
  return c;
}

struct Result {
  double max_delta = 0;  // worst |Δ logit| over the stored rows of every prompt
  int greedy_checked = 0;  // greedy steps compared (while the margin exceeded 2 x the bound)
};

// Prefills each prompt in chunks of `chunk` through a CpuRunner of `type` (pages of `page` tokens), compares the
// stored rows' logits, then decodes greedily and compares the tokens while transformers' margin exceeds 2 x bound.
Result run_model(Model& m, const std::string& name, const std::string& type, int chunk, int page, double bound) {
  const int V = m.config().vocab_size;
  Result res;
  for (const Prompt& p : prompts(name)) {
    CpuRunner r(m, cache_of(type, chunk, page), int(p.ids.size() + p.greedy.size()) + 1);
    const int seq = r.new_sequence(), n = int(p.ids.size());
    std::vector<float> logits(size_t(n) * V);
    for (int i = 0; i < n; i += chunk) {
      const int k = std::min(chunk, n - i);
      r.forward(seq, p.ids.data() + i, k, logits.data() + size_t(i) * V, true);
    }
    for (size_t j = 0; j < p.rows.size(); ++j)
      for (int v = 0; v < V; ++v)
        res.max_delta = std::max(res.max_delta, std::fabs(double(logits[size_t(p.rows[j]) * V + v]) -
                                                          double(p.logits[j * size_t(V) + size_t(v)])));
    std::vector<float> step(logits.end() - V, logits.end());
    for (size_t i = 0; i < p.greedy.size(); ++i) {
      int32_t next = argmax_row(step.data(), V);
      if (p.margin[i] <= 2 * bound) break;  // a near tie: the rest may diverge legitimately
      EXPECT_EQ(next, p.greedy[i]) << name << " " << type << ": prompt of " << n << " tokens, greedy step " << i
                                   << " (transformers' margin " << p.margin[i] << ")";
      if (next != p.greedy[i]) break;
      ++res.greedy_checked;
      next = p.greedy[i];
      r.forward(seq, &next, 1, step.data(), false);
    }
  }
  return res;
}

}  // namespace

TEST(ModelsGolden, EveryArchitectureMatchesTransformersWithAnF32Cache) {
  for (const std::string& name : model_names()) {
    SCOPED_TRACE(name);
    auto m = Model::load(kModels + "/" + name, 2);
    // one chunk per prompt, and chunks of 16 over pages of 16 (the sliding window crosses chunks and pages)
    for (const auto& [chunk, page] : {std::pair{512, 128}, std::pair{16, 16}}) {
      const Result r = run_model(*m, name, "f32", chunk, page, kF32Bound);
      std::printf("%-15s f32 cache, chunk %3d: max |delta logit| %.3g, %d greedy steps equal\n", name.c_str(), chunk,
                  r.max_delta, r.greedy_checked);
      EXPECT_LT(r.max_delta, kF32Bound) << "chunk " << chunk;
      EXPECT_GE(r.greedy_checked, 3 * 20) << "chunk " << chunk;  // measured: all 72 (no margin below 4e-5)
    }
  }
}

TEST(ModelsGolden, EveryArchitectureMatchesTransformersWithABf16Cache) {
  for (const std::string& name : model_names()) {
    SCOPED_TRACE(name);
    auto m = Model::load(kModels + "/" + name, 2);
    const Result r = run_model(*m, name, "bf16", 16, 16, kBf16Bound);
    std::printf("%-15s bf16 cache: max |delta logit| %.3g, %d greedy steps equal\n", name.c_str(), r.max_delta,
                r.greedy_checked);
    EXPECT_LT(r.max_delta, kBf16Bound);
    EXPECT_GE(r.greedy_checked, 3);  // the steps of a clear margin (> 0.06): at least a few
  }
}

// The sliding window is what makes Mistral's logits right: the same weights read with "sliding_window": null (every
// earlier position) match transformers within the window's first 24 positions and are far from it past them. And a
// cache without the model's windows is refused, never read past them.
TEST(ModelsGolden, MistralWithoutItsSlidingWindowDiffersOnlyPastTheWindow) {
  namespace fs = std::filesystem;
  const std::string src = kModels + "/mistral-d64-sw";
  const std::string dir = (fs::temp_directory_path() / ("kvq_mistral_nowindow_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  nlohmann::json cfg = nlohmann::json::parse(read_file_bytes(src + "/config.json"));
  cfg["sliding_window"] = nullptr;
  std::ofstream(dir + "/config.json") << cfg.dump();
  fs::copy_file(src + "/model.safetensors", dir + "/model.safetensors", fs::copy_options::overwrite_existing);
  auto with = Model::load(src, 2), without = Model::load(dir, 2);
  ASSERT_EQ(with->config().sliding_window(), 24);
  ASSERT_EQ(without->config().sliding_window(), 0);
  const Prompt p = prompts("mistral-d64-sw")[2];  // 80 tokens: rows 0-7 and 72-79 are stored
  const int V = with->config().vocab_size, n = int(p.ids.size());
  std::vector<float> logits(size_t(n) * V);
  CpuRunner r(*without, cache_of("f32", 512, 128), n);
  r.forward(r.new_sequence(), p.ids.data(), n, logits.data(), true);
  double inside = 0, past = 0;  // worst |Δ| of rows < 24, of rows >= 24
  for (size_t j = 0; j < p.rows.size(); ++j)
    for (int v = 0; v < V; ++v) {
      const double d = std::fabs(double(logits[size_t(p.rows[j]) * V + v]) - p.logits[j * size_t(V) + size_t(v)]);
      double& worst = p.rows[j] < 24 ? inside : past;
      worst = std::max(worst, d);
    }
  std::printf("mistral-d64-sw read without its window: max |delta logit| %.3g in the window's first 24 positions, %.3g "
              "past them\n", inside, past);
  EXPECT_LT(inside, kF32Bound);
  EXPECT_GT(past, 1000 * kF32Bound);
  KvCache cache(cache_of("f32", 512, 128), with->config().n_layers, with->config().n_kv_heads,
                with->config().head_dim, 128);
  EXPECT_THROW(with->forward(cache, cache.new_sequence(), p.ids.data(), n, logits.data(), true), Error);
  fs::remove_all(dir);
}
