// llama.cpp's cache types on the GPU (codecs/llamacpp/codec_llamacpp.cuh: q8_0 and q4_0, their common pair; q5_0, q4_1
// and iq4_nl, the referee's others) against the CPU cache (codecs/llamacpp/codec_llamacpp.h) on identical inputs:
// stored rows byte for byte (both quantize with codecs/llamacpp/llamacpp_blocks.h's IEEE operations from the same bf16
// window rows), with and without llama.cpp's KV rotation (attn_rot, which the GPU cache applies itself as it applies
// every KvTransform); attention outputs by NMSE; the fast CUDA-core kernel against its reference twin at every GQA
// instance; the same at head dims 64 and 96 (the other types at 64: GpuCacheHeadDimsLlamaCpp); the rows' sizes and
// alignment on the host. The engine-level ppl against the CPU is in tests/test_gpu_model.cpp. Every test but the
// host-side GpuCacheGeometry one skips itself without a GPU.
#ifdef KVQ_HAVE_CUDA

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "codecs/llamacpp/attn_rot.h"
#include "codecs/registry.h"
#include "cuda/gpu_cache.h"
#include "cuda/gpu_instances.h"
#include "cuda/gpu_kernels.h"
#include "gpu_twin.h"
#include "kv/cache.h"
#include "rotation/rotation_file.h"

using namespace kvq;
using namespace kvq::gpu_test;

namespace {

// Keys kt, values vt as the CLI builds them (-ctk kt -ctv vt), windows (sink, recent), pages of 128, with llama.cpp's
// KV rotation when attn_rot (codec_transform: what --attn-rot auto turns on; n_layers x n_kv heads).
CacheConfig llama_config(const std::string& kt, const std::string& vt, int sink, int recent, bool attn_rot,
                         int n_layers, int n_kv, int chunk = 512, int d = kD) {
  CacheConfig c;
  c.k = codec_spec(kt, true, kDefaultGroup, 0.f);
  c.v = codec_spec(vt, false, kDefaultGroup, 0.f);
  c.k.head_dim = c.v.head_dim = d;
  c.sink = sink, c.recent = recent;
  c.page_tokens = 128;
  c.max_chunk = chunk;
  if (attn_rot) c.transform = codec_transform(c, n_layers, n_kv, d);
  return c;
}

using Pair = std::pair<const char*, const char*>;  // (keys, values)
const Pair kPairs[] = {{"q8_0", "q4_0"}, {"q4_0", "q4_0"}, {"q8_0", "q8_0"}};
// The other block types: q5_0's high-bit word, q4_1's min (scores fold it with Σ q), iq4_nl's table (at 64 and 128).
const Pair kOtherPairs[] = {{"q5_0", "q5_0"}, {"q4_1", "q4_1"}, {"iq4_nl", "iq4_nl"}};
const std::vector<std::pair<int, int>> kWindows = {{64, 256}, {16, 64}, {0, 0}};

// (keys, values), (sink, recent), variant: 0 Gaussian, 1 heavy-tailed, 2 heavy-tailed with attn_rot.
using Case = std::tuple<Pair, std::pair<int, int>, int>;
class GpuVsCpuLlamaCpp : public ::testing::TestWithParam<Case> {};

// Both caches round the (rotated) rows to bf16 in the window and quantize those with the same float operations, so
// every stored row is bit-identical, with attn_rot too (the rotation is computed in the CPU's double order:
// kv_append.cu, kv/transform.cpp). Attention: both decode x̂ = d·level exactly and differ by float summation order
// only (no integer operands on either side; the CPU's block kernels are float FMAs): NMSE 1e-6.
TEST_P(GpuVsCpuLlamaCpp, StoredRowsAreBitIdenticalAndAttentionMatchesTheCpuCache) {
  REQUIRE_GPU();
  const auto& [pair, win, variant] = GetParam();
  const CacheConfig cfg =
      llama_config(pair.first, pair.second, win.first, win.second, variant == 2, Twin::kLayers, Twin::kKv);
  ASSERT_GE(cuda::gpu_instance(cfg, kD), 0) << cuda::gpu_unsupported(cfg, kD);
  if (variant == 2) {
    ASSERT_TRUE(cfg.transform) << "attn_rot is on for llama.cpp's quantized types at head_dim 128";
    ASSERT_EQ(cfg.transform->name, "attn_rot");
  }
  std::mt19937 rng(3000 + variant * 17 + win.first);
  const Data data = variant == 0 ? Data::Gaussian : Data::HeavyTailed;
  const std::vector<int> lengths = {1, 63, 64, 65, 257, 1000, 4097};
  Twin tw(cfg, 4097 + 64, int(lengths.size()), cfg.transform ? *cfg.transform : KvTransform{});
  const double b = 1e-6;
  for (size_t i = 0; i < lengths.size(); ++i) tw.prefill(int(i), lengths[i], rng, data, b);
  std::vector<int> all, ones(lengths.size(), 1), mixed;
  for (size_t i = 0; i < lengths.size(); ++i) all.push_back(int(i)), mixed.push_back(1 + int(i) * 5);
  for (int s = 0; s < 3; ++s) tw.step(all, ones, rng, data, true, b, "decode step " + std::to_string(s));
  tw.step(all, mixed, rng, data, true, b, "mixed step");
  int64_t total = 0, bad = 0;
  for (size_t i = 0; i < lengths.size(); ++i) bad += tw.row_mismatches(int(i), &total);
  static const char* kVariant[] = {"gauss", "heavy", "heavy attn_rot"};
  std::printf("[ gpu    ] k=%s v=%s sink %d recent %d %s: worst NMSE %.3g, %lld of %lld stored rows differ\n",
              pair.first, pair.second, win.first, win.second, kVariant[variant], tw.worst_nmse, (long long)bad,
              (long long)total);
  EXPECT_EQ(bad, 0) << "identical inputs must give bit-identical stored rows";
  EXPECT_GT(total, 0);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto& [pair, win, variant] = info.param;
  static const char* v[] = {"gauss", "heavy", "heavy_attn_rot"};
  return std::string("k_") + pair.first + "_v_" + pair.second + "_s" + std::to_string(win.first) + "_w" +
         std::to_string(win.second) + "_" + v[variant];
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, GpuVsCpuLlamaCpp,
                         ::testing::Combine(::testing::ValuesIn(kPairs), ::testing::ValuesIn(kWindows),
                                            ::testing::Values(0, 1, 2)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(LlamaCppBlocks, GpuVsCpuLlamaCpp,
                         ::testing::Combine(::testing::ValuesIn(kOtherPairs), ::testing::ValuesIn(kWindows),
                                            ::testing::Values(1, 2)),
                         case_name);

// The fast kernel (at d = 128 and pages of 128: decoded tiles; CUDA-core rows hold whole rows in registers, the block
// scale once per block and query) against the reference
// twin (per channel: llamacpp::value, the host's dequantizer, block-reduced), at every GQA instance (g = 1, 2, 3, 4:
// the compiled 1, 2, 4 and the generic kernel), over the windows, with attn_rot.
TEST(GpuCache, FastAttentionMatchesReferenceTwinForLlamaCppTypes) {
  REQUIRE_GPU();
  std::vector<Pair> pairs(std::begin(kPairs), std::end(kPairs));
  pairs.insert(pairs.end(), std::begin(kOtherPairs), std::end(kOtherPairs));
  for (const Pair& pair : pairs)
    for (const auto& [sink, recent] : std::vector<std::pair<int, int>>{{64, 256}, {0, 0}})
      for (int heads : {8, 16, 24, 32}) {
        const CacheConfig cfg = llama_config(pair.first, pair.second, sink, recent, true, 1, 8);
        const auto fast = decode_once(cfg, 2000, 0, false, heads), ref = decode_once(cfg, 2000, 0, true, heads);
        const double e = nmse(fast, ref);
        EXPECT_LT(e, std::max(1e-9, decoded_tile_budget(cfg, kD)))
            << pair.first << "/" << pair.second << " sink " << sink << " recent " << recent << " g " << heads / 8;
        if (heads == 32)
          std::printf("[ gpu    ] fast vs reference twin, k=%s v=%s sink %d recent %d: NMSE %.3g\n", pair.first,
                      pair.second, sink, recent, e);
      }
}

// attn_rot changes what the GPU stores, not what attention computes (H is orthogonal; queries are rotated like the
// keys and outputs rotated back by H_v): the same rows with the rotation on and off store other codes, and both
// caches' outputs stay near the bf16 cache's. The bound, NMSE 0.5, is loose: q4_0 on these heavy-tailed rows has a
// per-row NMSE up to ~0.2 (a block's absmax sets a step of |m| / 8), which a peaked softmax barely averages down; an
// output left in the rotated basis (H_v o for o) would be uncorrelated with the bf16 one: NMSE ~2.
TEST(GpuCache, AttnRotChangesTheStoredCodesButNotWhatAttentionComputes) {
  REQUIRE_GPU();
  const CacheConfig on = llama_config("q8_0", "q4_0", 16, 64, true, 1, 8);
  const CacheConfig off = llama_config("q8_0", "q4_0", 16, 64, false, 1, 8);
  CacheConfig exact = off;  // bf16 pages: the attention the quantized caches approximate
  exact.k = CodecSpec{.type = "bf16", .head_dim = kD}, exact.v = exact.k;
  const auto a = decode_once(on, 1500, 0, false), b = decode_once(off, 1500, 0, false),
             want = decode_once(exact, 1500, 0, false);  // the same random rows (decode_once's fixed seed)
  const double e_on = nmse(a, want), e_off = nmse(b, want), e_ab = nmse(a, b);
  std::printf("[ gpu    ] k=q8_0 v=q4_0 NMSE against bf16: attn_rot on %.3g, off %.3g; on vs off %.3g\n", e_on, e_off,
              e_ab);
  EXPECT_GT(e_ab, 0.0) << "the rotation must change the stored codes";
  EXPECT_LT(e_on, 0.5);
  EXPECT_LT(e_off, 0.5);
}

// At head dims 64 and 96 (their rows are not compiled at 256: cuda/gpu_instances.h's budget): rows of 2 and 3 blocks
// (2-byte aligned at 96: 102 / 54 bytes), read in 4- and 2-byte words; attn_rot where llama.cpp applies it (64:
// head_dim % 64 == 0). Stored rows byte for byte and attention within the d = 128 budget, then the fast kernel
// against its reference twin (GQA groups 1 and 8).
using DimCase = std::tuple<Pair, int, bool>;  // (keys, values), head_dim, attn_rot
class GpuCacheHeadDimsLlamaCpp : public ::testing::TestWithParam<DimCase> {};

TEST_P(GpuCacheHeadDimsLlamaCpp, StoredRowsAreBitIdenticalAndAttentionMatchesTheCpuCache) {
  REQUIRE_GPU();
  const auto& [pair, d, rot] = GetParam();
  const CacheConfig cfg = llama_config(pair.first, pair.second, 16, 64, rot, Twin::kLayers, Twin::kKv, 512, d);
  ASSERT_GE(cuda::gpu_instance(cfg, d), 0) << cuda::gpu_unsupported(cfg, d);
  EXPECT_EQ(cfg.transform != nullptr, rot && d % 64 == 0) << "attn_rot rotates head_dim multiples of 64";
  std::mt19937 rng(3100 + d + rot);
  const std::vector<int> lengths = {1, 65, 257, 1000, 2049};
  Twin tw(cfg, 2049 + 64, int(lengths.size()), cfg.transform ? *cfg.transform : KvTransform{}, d);
  const double b = 1e-6;
  for (size_t i = 0; i < lengths.size(); ++i) tw.prefill(int(i), lengths[i], rng, Data::HeavyTailed, b);
  std::vector<int> all, ones(lengths.size(), 1);
  for (size_t i = 0; i < lengths.size(); ++i) all.push_back(int(i));
  for (int s = 0; s < 2; ++s) tw.step(all, ones, rng, Data::HeavyTailed, true, b, "decode step " + std::to_string(s));
  int64_t total = 0, bad = 0;
  for (size_t i = 0; i < lengths.size(); ++i) bad += tw.row_mismatches(int(i), &total);
  std::printf("[ gpu    ] d %d k=%s v=%s attn_rot %d: worst NMSE %.3g, %lld of %lld stored rows differ\n", d,
              pair.first, pair.second, int(rot), tw.worst_nmse, (long long)bad, (long long)total);
  EXPECT_EQ(bad, 0) << "identical inputs must give bit-identical stored rows";
  EXPECT_GT(total, 0);
  for (int heads : {8, 64}) {
    const CacheConfig one = llama_config(pair.first, pair.second, 16, 64, rot, 1, 8, 512, d);
    const double e = nmse(decode_once(one, 2000, 0, false, heads, d), decode_once(one, 2000, 0, true, heads, d));
    EXPECT_LT(e, 1e-9) << "fast vs reference twin, d " << d << " g " << heads / 8;
  }
}

std::string dim_case_name(const ::testing::TestParamInfo<DimCase>& info) {
  const auto& [pair, d, rot] = info.param;
  return "d" + std::to_string(d) + "_k_" + pair.first + "_v_" + pair.second + (rot ? "_attn_rot" : "");
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, GpuCacheHeadDimsLlamaCpp,
                         ::testing::Combine(::testing::ValuesIn(kPairs), ::testing::Values(64, 96),
                                            ::testing::Values(false, true)),
                         dim_case_name);
INSTANTIATE_TEST_SUITE_P(LlamaCppBlocks, GpuCacheHeadDimsLlamaCpp,
                         ::testing::Combine(::testing::ValuesIn(kOtherPairs), ::testing::Values(64),
                                            ::testing::Values(false, true)),
                         dim_case_name);

}  // namespace

// --- Host side, no GPU needed.

// The rows the device codec reads: the CPU codec's blocks (136 / 88 / 80 / 72 bytes per 128-value row), 8-byte aligned
// rows and heads (the fast score's 8-byte loads), layers at multiples of 16 bytes (a --kv-skip-layers bf16 layer's 16-byte
// loads), and the CUDA-core instance rows of the six pairs.
TEST(GpuCacheGeometry, LlamaCppRowsAreTheCpuBlocksAnd8ByteAligned) {
  std::vector<Pair> pairs(std::begin(kPairs), std::end(kPairs));
  pairs.insert(pairs.end(), std::begin(kOtherPairs), std::end(kOtherPairs));
  const auto row_bytes = [](const std::string& t) {
    return t == "q8_0" ? 136 : t == "q5_0" ? 88 : t == "q4_1" ? 80 : 72;  // 4 blocks of 34, 22, 20, 18 bytes
  };
  for (const Pair& pair : pairs)
    for (int page : {8, 24, 128}) {
      CacheConfig cfg = llama_config(pair.first, pair.second, 16, 64, false, 3, 2);
      cfg.page_tokens = page;
      cfg.skip_layers = {1};
      const std::string what = cfg.describe() + " page " + std::to_string(page);
      const int i = cuda::gpu_instance(cfg, kD);
      ASSERT_GE(i, 0) << what << ": " << cuda::gpu_unsupported(cfg, kD);
      // decoded tiles where a tile of 16 fits the page, else the CUDA-core row
      EXPECT_EQ(cuda::kGpuInstances[i].path, page % 16 == 0 ? cuda::GpuPath::kDecodedTile : cuda::GpuPath::kCudaCore)
          << what;
      const KvCache cpu(cfg, 3, 2, kD, 1000, 1);
      for (int layer = 0; layer < 3; ++layer) {
        const cuda::CacheGeometry g = cuda::cache_geometry(cfg, 3, 2, 1000, layer);
        if (layer == 1) continue;  // the skipped layer: bf16 rows (tests/test_gpu_cache.cpp)
        EXPECT_EQ(size_t(g.k_row), cpu.k_codec().bytes_per_block()) << what;
        EXPECT_EQ(size_t(g.v_row), cpu.v_codec().bytes_per_block()) << what;
        EXPECT_EQ(g.k_row, row_bytes(pair.first)) << what;
        EXPECT_EQ(g.v_row, row_bytes(pair.second)) << what;
        EXPECT_EQ(g.k_row % 8, 0) << what;
        EXPECT_EQ(g.v_row % 8, 0) << what;
        EXPECT_EQ(g.k_region % 8, 0) << what;
        EXPECT_EQ(g.head_bytes % 8, 0) << what;
        EXPECT_EQ(g.page_bytes % 16, 0) << what;
        EXPECT_EQ(g.layer_offset % 16, 0) << what << " layer " << layer;
      }
      EXPECT_EQ(cuda::cache_geometry(cfg, 3, 2, 1000, 2).layer_offset % 16, 0) << what << ": after the bf16 layer";
    }
}

#endif  // KVQ_HAVE_CUDA
