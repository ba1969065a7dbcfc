// Every architecture against Hugging Face transformers on the GPU: the tiny checkpoints of tests/models (see
// tests/test_models_golden.cpp for what each one checks and the goldens), run by GpuModel with fp32 GEMMs.
//   - bf16 cache: the stored rows' logits within kBf16Bound of transformers' and greedy continuations equal to
//     transformers' while its margin exceeds twice that bound (the CPU test's bounds: the GPU adds only another
//     summation order with fp32 GEMMs);
//   - int2 cache (the default group for the model's head_dim, small windows so that the prompts are quantized): the
//     GPU against the CPU's scalar kernels on the same cache, top-1 equal on every stored row where the CPU's own
//     top-1 margin exceeds kInt2Margin, RMS of the difference within kInt2Rms of the logits' RMS (a rounding-level
//     difference flips a few 2-bit codes; a wrong kernel moves logits by O(10%)).
// Mistral's sliding window runs on the CUDA-core instances (its 80-token prompts run past the window of 24). A model
// the GPU refuses would be skipped by name with the refusal, and so is the int2 half of one whose head_dim no group
// divides (80: bf16 rows only, on either device); the test skips as a whole only when the GPU runs none of them.
// Skipped where no CUDA device is available.
#ifdef KVQ_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <gtest/gtest.h>

#include "codecs/registry.h"
#include "common/error.h"
#include "cuda/gpu_model.h"
#include "cuda/runtime.h"
#include "model/model.h"
#include "model/runner.h"
#include "model/safetensors.h"
#include "simd/simd.h"

using namespace kvq;
using kvq::cuda::GemmPrecision;
using kvq::cuda::GpuModel;

namespace {

const std::string kModels = std::string(KVQ_SOURCE_DIR) + "/tests/models";
const char* const kNames[] = {"llama3-d64", "qwen2.5-d64", "qwen3-d128", "qwen3-d256",
                              "mistral-d64-sw", "llama-d96", "llama-d80"};
constexpr double kBf16Bound = 2e-2;
constexpr double kInt2Margin = 0.1;
constexpr double kInt2Rms = 2e-2;

struct Prompt {
  std::vector<int32_t> ids, rows, greedy;
  std::vector<float> logits, margin;
};

template <class T>
std::vector<T> read(const SafeTensorsFile& f, const std::string& name) {
  const TensorInfo& info = f.at(name);
  std::vector<T> out(size_t(info.numel()));
  std::memcpy(out.data(), f.data(info), out.size() * sizeof(T));
  return out;
}

std::vector<Prompt> prompts(const std::string& model) {
  const auto f = SafeTensorsFile::open(kModels + "/" + model + "/golden.safetensors");
  std::vector<Prompt> out;
  for (int p = 0; f->find("p" + std::to_string(p) + ".ids"); ++p) {
    const std::string k = "p" + std::to_string(p) + ".";
    out.push_back({read<int32_t>(*f, k + "ids"), read<int32_t>(*f, k + "rows"), read<int32_t>(*f, k + "greedy"),
                   read<float>(*f, k + "logits"), read<float>(*f, k + "margin")});
  }
  return out;
}

CacheConfig cache_of(const std::string& type, int head_dim) {
  CacheConfig c;
  c.k = codec_spec(type, true, std::max(default_group(head_dim), 32), 0.f);
  c.v = codec_spec(type, false, std::max(default_group(head_dim), 32), 0.f);
  c.sink = type == "bf16" ? 0 : 4;
  c.recent = type == "bf16" ? 0 : 8;
  c.page_tokens = 16;
  c.max_chunk = 32;
  return c;
}

// Logits of every position of the prompt, prefilled in chunks of the cache's max_chunk.
std::vector<float> prefill(Runner& r, int seq, const std::vector<int32_t>& ids) {
  const int V = r.config().vocab_size, chunk = r.cache_config().max_chunk, n = int(ids.size());
  std::vector<float> logits(size_t(n) * V);
  for (int i = 0; i < n; i += chunk)
    r.forward(seq, ids.data() + i, std::min(chunk, n - i), logits.data() + size_t(i) * V, true);
  return logits;
}

}  // namespace

TEST(GpuModelsGolden, EveryArchitectureTheGpuRunsMatchesTransformersAndTheCpu) {
  if (!kvq::cuda::available()) GTEST_SKIP() << kvq::cuda::unavailable_reason();
  std::vector<std::string> ran, skipped;
  for (const char* name : kNames) {
    SCOPED_TRACE(name);
    auto m = Model::load(kModels + "/" + name, 0);
    const int V = m->config().vocab_size, d = m->config().head_dim;
    std::unique_ptr<GpuModel> bf16, int2;
    try {
      bf16 = std::make_unique<GpuModel>(*m, cache_of("bf16", d), 256, 1, GemmPrecision::Fp32);
    } catch (const Error& e) {
      skipped.push_back(std::string(name) + ": " + e.what());
      std::printf("skipped %s: %s\n", name, e.what());
      continue;
    }
    ran.push_back(name);
    // The CPU's int2 reference runs the scalar kernels: the SIMD levels that round queries and weights to int8 (AVX2,
    // AVX-512 VNNI at one 128-value group) move qwen3-d128's logits by 2.7% RMS from the exact ones by themselves.
    std::unique_ptr<Model> scalar;
    std::unique_ptr<CpuRunner> cpu_int2;
    if (default_group(d) > 0) {  // int2 rows need a group dividing head_dim (the CPU refuses the others too)
      int2 = std::make_unique<GpuModel>(*m, cache_of("int2", d), 256, 1, GemmPrecision::Fp32);
      scalar = Model::load(kModels + "/" + name, 0, SimdLevel::kScalar);
      cpu_int2 = std::make_unique<CpuRunner>(*scalar, cache_of("int2", d), 256);
    } else {
      std::printf("%s: no int2 cache at head_dim %d (no group divides it): bf16 only\n", name, d);
    }
    double worst = 0, worst_rms = 0;
    int greedy_equal = 0, greedy_checked = 0, top1_checked = 0;
    for (const Prompt& p : prompts(name)) {
      // bf16 cache against transformers
      int seq = bf16->new_sequence();
      const std::vector<float> got = prefill(*bf16, seq, p.ids);
      for (size_t j = 0; j < p.rows.size(); ++j)
        for (int v = 0; v < V; ++v)
          worst = std::max(worst, std::fabs(double(got[size_t(p.rows[j]) * V + v]) - p.logits[j * size_t(V) + v]));
      std::vector<float> step(got.end() - V, got.end());
      // transformers' greedy steps up to the first whose top-1 margin is within twice the bound (past it either
      // token is right)
      for (size_t i = 0; i < p.greedy.size() && p.margin[i] > 2 * kBf16Bound; ++i) ++greedy_checked;
      for (size_t i = 0; i < p.greedy.size() && p.margin[i] > 2 * kBf16Bound; ++i) {
        int32_t next = argmax_row(step.data(), V);
        EXPECT_EQ(next, p.greedy[i]) << "bf16 cache: prompt of " << p.ids.size() << " tokens, greedy step " << i;
        if (next != p.greedy[i]) break;
        ++greedy_equal;
        bf16->forward(seq, &next, 1, step.data(), false);
      }
      bf16->free_sequence(seq);
      if (!int2) continue;
      // int2 cache against the CPU's
      seq = int2->new_sequence();
      const int cseq = cpu_int2->new_sequence();
      const std::vector<float> g = prefill(*int2, seq, p.ids), c = prefill(*cpu_int2, cseq, p.ids);
      double ss = 0, sr = 0;
      for (size_t i = 0; i < c.size(); ++i) ss += (double(g[i]) - c[i]) * (double(g[i]) - c[i]), sr += double(c[i]) * c[i];
      worst_rms = std::max(worst_rms, std::sqrt(ss / sr));
      for (int32_t row : p.rows) {
        const float* cr = c.data() + size_t(row) * V;
        std::vector<float> top(cr, cr + V);
        std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
        if (top[0] - top[1] <= kInt2Margin) continue;
        ++top1_checked;
        EXPECT_EQ(argmax_row(g.data() + size_t(row) * V, V), argmax_row(cr, V)) << "int2 cache: row " << row;
      }
      int2->free_sequence(seq);
      cpu_int2->free_sequence(cseq);
    }
    std::printf("%-15s GPU bf16 cache: max |delta logit| vs transformers %.3g, %d of %d greedy steps equal; int2 "
                "cache: RMS diff vs CPU %.3g of the logits' RMS, %d top-1 rows equal\n",
                name, worst, greedy_equal, greedy_checked, worst_rms, top1_checked);
    EXPECT_LT(worst, kBf16Bound);
    EXPECT_EQ(greedy_equal, greedy_checked);
    EXPECT_GT(greedy_checked, 0);
    if (int2) {
      EXPECT_LT(worst_rms, kInt2Rms);
      EXPECT_GT(top1_checked, 0);
    }
  }
  std::string list;
  for (const std::string& s : skipped) list += "\n  " + s;
  RecordProperty("models_run", int(ran.size()));
  if (ran.empty()) GTEST_SKIP() << "the GPU runs none of the tiny models:" << list;
  if (!skipped.empty()) std::printf("%zu of %zu models skipped on the GPU:%s\n", skipped.size(), std::size(kNames),
                                    list.c_str());
}

#endif  // KVQ_HAVE_CUDA
