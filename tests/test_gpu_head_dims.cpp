// Every row of the GPU instance table (cuda/gpu_instances.h) at every head dim it is compiled for, found by walking the
// table, so a new row or a new d is tested by default: a cache as the CLI builds it that selects exactly that (row, d),
// the GPU cache against the CPU KvCache + cache_attention on identical inputs (stored rows byte for byte, attention by
// NMSE) and the fast kernel against its reference twin at GQA groups 1 and 8. The host-side checks
// (GpuHeadDimsTable.*Host*) run everywhere the CUDA backend is built; the others skip themselves without a GPU.
#ifdef KVQ_HAVE_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "codecs/registry.h"
#include "common/error.h"
#include "cuda/attention_cuda_core.h"
#include "cuda/gpu_cache.h"
#include "cuda/gpu_instances.h"
#include "gpu_twin.h"
#include "kv/cache.h"
#include "rotation/rotation_file.h"
#include "simd/simd.h"
#include "test_helpers.h"

using namespace kvq;
using namespace kvq::gpu_test;

namespace {

// The caches that run row i of the table at head_dim d for n_layers x n_kv heads, in this order until f (taking a const
// CacheConfig&) returns true: the row's codecs as -ctk / -ctv build them (default clips; KIVI and OScaR keys per
// channel; PN-Mix keys with test::pnmix_widths), groups from the largest the row takes that fits d, pages from the
// smallest size that selects the row and holds whole key blocks (the CUDA-core bf16 row: 8, which no tensor-core tile
// fits), windows 16 / 64 and the transform the codecs imply (TurboQuant's Hadamard, llama.cpp's attn_rot); then the
// same with a sliding window of 2^20 positions, which no test sequence reaches (for a CUDA-core row whose every page
// size a decoded-tile row takes first: OScaR's, Kitty's at d = 128). Keys stored without RoPE (NexusQuant's) get the
// frequencies of base 1e6. Only caches the CPU cache layout also takes.
template <class F>
void for_each_row_config(int i, int d, int n_layers, int n_kv, F&& f) {
  const cuda::GpuInstance& r = cuda::kGpuInstances[i];
  for (bool slides : {false, true})
    for (int group : {128, 64, 32})
      for (int page = r.page_multiple; page <= 256; page += r.page_multiple) {
        CacheConfig c;
        c.k = codec_spec(codec_traits(r.k).name, true, group, 0.f);
        c.v = codec_spec(codec_traits(r.v).name, false, group, 0.f);
        c.k.head_dim = c.v.head_dim = d;
        c.k = test::with_test_widths(c.k, n_layers, n_kv);  // PN-Mix keys: test widths at d
        c.sink = 16, c.recent = 64, c.page_tokens = page, c.max_chunk = 512;
        c.window = codec_traits(r.window).name;  // bf16, or KV4-RL's int8
        if (codec_traits(r.k).pre_rope_keys) c.key_rope = test::rope_inv_freq(d, 1e6);  // NexusQuant's keys
        if (slides) c.attn_window.assign(size_t(n_layers), 1 << 20);
        if (cuda::gpu_instance(c, d) != i) continue;
        try {
          c.transform = codec_transform(c, n_layers, n_kv, d);
          cache_layout(c, n_layers, n_kv, d);  // pages of whole key blocks (KIVI: G tokens), the implied transform
        } catch (const Error&) {
          continue;
        }
        if (f(std::as_const(c))) return;
      }
}

// The first of them (the largest group, the smallest page, no sliding window where one selects the row); nullopt
// when none selects it.
std::optional<CacheConfig> row_config(int i, int d, int n_layers, int n_kv) {
  std::optional<CacheConfig> first;
  for_each_row_config(i, d, n_layers, n_kv, [&](const CacheConfig& c) {
    first = c;
    return true;
  });
  return first;
}

struct RowDim {
  int row, d;
};
std::vector<RowDim> compiled_row_dims() {
  std::vector<RowDim> out;
  for (int i = 0; i < cuda::kGpuInstanceCount; ++i)
    for (int d : cuda::kGpuHeadDims)
      if (cuda::gpu_row_compiled(cuda::kGpuInstances[i], d)) out.push_back({i, d});
  return out;
}

// Extra NMSE of the tensor-core paths (tests/test_gpu_cache.cpp's operand_budget): a bf16 side rounds q and P' to bf16
// (1e-4), int2 rows of one 128-value group (d = 128) P' and q to f16 or int8 terms (1e-5), decoded tiles the decoded
// rows, q and P' to f16 (decoded_tile_budget, 1e-4); 0 on CUDA cores (float arithmetic on the decoded rows, against
// which the reference twin is held to 1e-9).
double operand_budget(const CacheConfig& c, cuda::GpuPath path) {
  if (path == cuda::GpuPath::kCudaCore) return 0.0;
  return path == cuda::GpuPath::kDecodedTile || c.k.type == "bf16" || c.v.type == "bf16" ? 1e-4 : 1e-5;
}

// NMSE budget of GPU vs CPU attention (the budgets of tests/test_gpu_cache.cpp, from the cache's specs): the
// tensor-core operands; int2 / kivi2 rows of one 128-value group at d = 128 take the CPU's int8 path on AVX2 and
// AVX-512 VNNI (2e-3); per-channel key blocks (KIVI, OScaR) fold the scale into q before the CPU's int16 rounding,
// TurboQuant and llama.cpp's blocks and the transforms their codecs imply sum in another order (1e-6); bf16 on CUDA
// cores is float arithmetic on identical decoded rows on both sides (1e-7); the int rows take the CPU's int16 operands
// (AVX2 and AVX-512 VNNI: q and p·scale rounded per group and tile, relative 2^-16 of the largest element, which this
// heavy-tailed data makes coarse for the others: up to 9.8e-7 observed on the H200's host; 2e-6).
double budget(const CacheConfig& c, int d, cuda::GpuPath path) {
  const auto plain = [](const CodecSpec& s) {
    return !s.per_channel && (s.type == "bf16" || s.type == "int8" || s.type == "int4" || s.type == "int2");
  };
  const auto whole_row_int2 = [&](const CodecSpec& s) {
    return (s.type == "int2" || s.type == "kivi2") && s.group == 128 && d == 128;
  };
  const auto int_rows = [](const CodecSpec& s) { return s.type != "bf16"; };
  double b = plain(c.k) && plain(c.v) && !c.transform ? 1e-7 : 1e-6;
  if ((int_rows(c.k) || int_rows(c.v)) && simd_int8_operands(best_simd_level())) b = std::max(b, 2e-6);
  if ((whole_row_int2(c.k) || whole_row_int2(c.v)) && simd_int8_operands(best_simd_level())) b = 2e-3;
  return std::max(b, operand_budget(c, path));
}

std::string what(int i, int d, const CacheConfig& c) {
  return "row " + std::to_string(i) + " (" + cuda::gpu_path_name(cuda::kGpuInstances[i].path) + ") d " +
         std::to_string(d) + ": " + c.describe() + " page " + std::to_string(c.page_tokens);
}

// Host side: every compiled (row, d) has a cache that selects it, which the CPU cache also takes (the two support
// matrices agree on it), with rows of the CPU layout's sizes.
TEST(GpuHeadDimsTable, EveryCompiledRowAndHeadDimHasACacheTheCpuAlsoTakesHost) {
  int n = 0;
  for (const auto& [i, d] : compiled_row_dims()) {
    const std::optional<CacheConfig> c = row_config(i, d, 2, 2);
    ASSERT_TRUE(c.has_value()) << "row " << i << " at d " << d
                               << ": no group and page size select it that the CPU cache takes";
    EXPECT_EQ(cuda::gpu_unsupported(*c, d), "") << what(i, d, *c);
    EXPECT_NO_THROW(KvCache(*c, 2, 2, d, 1024, 1)) << what(i, d, *c) << ": the CPU cache refuses it";
    const cuda::CacheGeometry g = cuda::cache_geometry(*c, 2, 2, 1024);
    EXPECT_EQ(g.instance, i) << what(i, d, *c);
    EXPECT_EQ(int(g.head_dim), d) << what(i, d, *c);
    EXPECT_TRUE(row_config(i, d, 1, 8).has_value()) << what(i, d, *c) << ": not in the decode_once shape";
    ++n;
  }
  // 128 at every row; the table's head dims at the others
  EXPECT_GE(n, cuda::kGpuInstanceCount + 4);
}

// Host side: the decoded-tile kernel copies each tile's 16 rows by 16-byte cp.async, so every layout of a decoded-tile
// row (each group it takes, every page size that selects it, every layer of a cache with a skipped bf16 layer) keeps
// tiles at 16-byte offsets (cuda::tiles_aligned16), which GpuKvCache also checks.
TEST(GpuHeadDimsTable, DecodedTileRowsKeepTilesAt16ByteOffsetsHost) {
  int rows = 0;
  for (const auto& [i, d] : compiled_row_dims()) {
    if (cuda::kGpuInstances[i].path != cuda::GpuPath::kDecodedTile) continue;
    int layouts = 0;
    for_each_row_config(i, d, 3, 2, [&](const CacheConfig& base) {
      for (bool skip : {false, true}) {
        CacheConfig c = base;
        if (skip) c.skip_layers = {1};
        try {
          cache_layout(c, 3, 2, d);
        } catch (const Error&) {
          continue;
        }
        for (int layer : {0, 2})
          EXPECT_TRUE(cuda::tiles_aligned16(cuda::cache_geometry(c, 3, 2, 1024, layer)))
              << what(i, d, c) << " layer " << layer << (skip ? " (layer 1 skipped)" : "");
        ++layouts;
      }
      return false;
    });
    EXPECT_GT(layouts, 0) << "row " << i << " at d " << d;
    ++rows;
  }
  EXPECT_GT(rows, 10);
}

// Host side: the CUDA-core kernels compiled in shards (cuda/attention_cuda_core.h) give every CUDA-core (row, d) its
// own kernels, one per GQA instance the row compiles at d, and none to a tensor-core row or an uncompiled d; every
// shard compiles some pairs.
TEST(GpuHeadDimsTable, TheShardedCudaCoreKernelsCoverEveryCudaCoreRowAndHeadDimHost) {
  std::set<cuda::CudaCoreKernel> all;
  std::vector<int> per_shard(cuda::kCudaCoreShards, 0);
  for (int i = 0; i < cuda::kGpuInstanceCount; ++i) {
    const cuda::GpuInstance& r = cuda::kGpuInstances[i];
    for (const int d : cuda::kGpuHeadDims) {
      cuda::CacheGeometry g{};
      g.instance = i;
      g.head_dim = uint16_t(d);
      const bool cuda_core = r.path == cuda::GpuPath::kCudaCore && cuda::gpu_row_compiled(r, d);
      std::set<cuda::CudaCoreKernel> pair;
      for (const int gq : {1, 2, 4, 8}) {
        const cuda::CudaCoreKernel k = cuda::cuda_core_kernel(g, gq);
        EXPECT_EQ(k != nullptr, cuda_core) << "row " << i << " d " << d << " g " << gq;
        if (k) pair.insert(k);
      }
      if (!cuda_core) continue;
      EXPECT_EQ(pair.size(), cuda::gpu_every_gqa(r, d) ? 4u : 1u) << "row " << i << " d " << d;
      for (const cuda::CudaCoreKernel k : pair) EXPECT_TRUE(all.insert(k).second) << "row " << i << " d " << d;
      ++per_shard[cuda::cuda_core_shard(i, d)];
    }
  }
  cuda::CacheGeometry none{};
  none.instance = -1;
  none.head_dim = 128;
  EXPECT_EQ(cuda::cuda_core_kernel(none, 1), nullptr);
  for (int s = 0; s < cuda::kCudaCoreShards; ++s) EXPECT_GT(per_shard[s], 0) << "shard " << s << " compiles nothing";
  std::printf("CUDA-core kernels: %zu over %d shards (pairs a shard:", all.size(), cuda::kCudaCoreShards);
  for (const int n : per_shard) std::printf(" %d", n);
  std::printf(")\n");
}

// The GPU cache of every compiled (row, d) against the CPU cache: prefill chunks, batched decode and a mixed step over
// sequences of awkward lengths; stored rows byte for byte (the codecs' own transforms included: both caches rotate with
// the same double operations, a Hadamard as the same butterflies: cuda/rotate.cuh) and attention within the row's budget; then the fast kernel against its reference twin
// (exact float arithmetic on the CUDA-core rows; the tensor-core operand rounding on the others) at GQA groups 1 and 8.
TEST(GpuHeadDimsTable, EveryCompiledRowMatchesTheCpuCacheAndItsReferenceTwinAtEveryHeadDim) {
  REQUIRE_GPU();
  for (const auto& [i, d] : compiled_row_dims()) {
    const cuda::GpuPath path = cuda::kGpuInstances[i].path;
    const std::optional<CacheConfig> cfg = row_config(i, d, Twin::kLayers, Twin::kKv);
    ASSERT_TRUE(cfg.has_value()) << "row " << i << " d " << d;
    const std::string name = what(i, d, *cfg);
    SCOPED_TRACE(name);
    std::mt19937 rng(5000 + 31 * i + d);
    const std::vector<int> lengths = {1, 70, 333, 1100};
    Twin tw(*cfg, 1100 + 64, int(lengths.size()), cfg->transform ? *cfg->transform : KvTransform{}, d);
    const double b = budget(*cfg, d, path);
    for (size_t s = 0; s < lengths.size(); ++s) tw.prefill(int(s), lengths[s], rng, Data::HeavyTailed, b);
    std::vector<int> all, ones(lengths.size(), 1), mixed;
    for (size_t s = 0; s < lengths.size(); ++s) all.push_back(int(s)), mixed.push_back(1 + int(s) * 7);
    tw.step(all, ones, rng, Data::HeavyTailed, true, b, "decode step");
    tw.step(all, mixed, rng, Data::Gaussian, true, b, "mixed step");
    int64_t total = 0, bad = 0;
    for (size_t s = 0; s < lengths.size(); ++s) bad += tw.row_mismatches(int(s), &total);
    EXPECT_GT(total, 0);
    EXPECT_EQ(bad, 0) << "identical inputs must give bit-identical stored rows";

    const std::optional<CacheConfig> one = row_config(i, d, 1, 8);  // decode_once's shape: 1 layer, 8 kv heads
    ASSERT_TRUE(one.has_value());
    double worst = 0;
    for (int heads : {8, 64}) {
      const auto fast = decode_once(*one, 1500, 0, false, heads, d), ref = decode_once(*one, 1500, 0, true, heads, d);
      const double e = nmse(fast, ref);
      worst = std::max(worst, e);
      EXPECT_LT(e, std::max(1e-9, operand_budget(*one, path)))
          << "fast vs reference twin, GQA group " << heads / 8;
    }
    std::printf("[ gpu    ] %s: vs CPU worst NMSE %.3g (budget %.0e), %lld of %lld stored rows differ; fast vs "
                "reference twin NMSE %.3g\n",
                name.c_str(), tw.worst_nmse, b, (long long)bad, (long long)total, worst);
  }
}

}  // namespace

#endif  // KVQ_HAVE_CUDA
