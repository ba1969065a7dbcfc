// The GPU instance table (cuda/gpu_instances.h) on the host, without CUDA: every row's codecs are codec-table rows
// the GPU can store, the support predicate runs every row at every head_dim it is compiled for and refuses every
// other combination with one line that names it and lists what the GPU runs, and the combinations the GPU tests
// exercise all have a row.
#include <set>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "codecs/registry.h"
#include "cuda/gpu_instances.h"

using namespace kvq;
using namespace kvq::cuda;

namespace {

constexpr int kD = 128;  // the head_dim of the timed shapes, where every row is compiled

// A cache of key spec type kt (per channel when its codec has per-channel keys) and value type vt, group G.
CacheConfig config(std::string_view kt, std::string_view vt, int group, int page = 128, int d = kD) {
  CacheConfig c;
  c.k = codec_spec(kt, true, group, 0.f);
  c.v = codec_spec(vt, false, group, 0.f);
  c.k.head_dim = c.v.head_dim = d;
  c.page_tokens = page;
  return c;
}

bool has(const std::string& s, std::string_view what) { return s.find(what) != std::string::npos; }

}  // namespace

TEST(GpuInstances, EveryRowNamesCodecsOfTheCodecTableThatTheGpuStores) {
  const auto table = codec_table();
  std::set<std::tuple<GpuPath, CodecId, CodecId, CodecId>> seen;
  for (int i = 0; i < kGpuInstanceCount; ++i) {
    const GpuInstance& r = kGpuInstances[i];
    SCOPED_TRACE("row " + std::to_string(i));
    ASSERT_LT(size_t(r.k), table.size());
    ASSERT_LT(size_t(r.v), table.size());
    const CodecTraits &k = codec_traits(r.k), &v = codec_traits(r.v);
    EXPECT_EQ(k.id, r.k);
    EXPECT_EQ(v.id, r.v);
    EXPECT_NE(r.k, CodecId::kF32);  // the GPU stores no f32 rows
    EXPECT_NE(r.v, CodecId::kF32);
    // values are per-token rows: KIVI's are int rows; a format with its own groups (OScaR) names its own rows
    EXPECT_TRUE(!v.per_channel_keys || fixed_format(v)) << v.name;
    EXPECT_TRUE(r.groups != 0 && (r.groups & ~kAnyGroup) == 0);
    EXPECT_TRUE(r.page_multiple > 0 && r.page_multiple % 8 == 0) << "aligned row loads";
    EXPECT_TRUE(r.head_dims != 0 && (r.head_dims & ~kEveryDim) == 0);
    // d = 80: bf16 rows only (no group of a quantized side divides it)
    if (gpu_row_compiled(r, 80)) {
      EXPECT_TRUE(r.k == CodecId::kBf16 && r.v == CodecId::kBf16) << k.name << "/" << v.name;
    }
    EXPECT_TRUE(gpu_row_compiled(r, kD)) << "every row runs the timed head_dim";
    if (r.path == GpuPath::kTensorCore) {  // decode_attention_mma.cu: int2 rows of one 128-value group, bf16 rows
      for (CodecId id : {r.k, r.v}) EXPECT_TRUE(id == CodecId::kInt2 || id == CodecId::kBf16);
      if (r.k == CodecId::kInt2 || r.v == CodecId::kInt2) {
        EXPECT_EQ(r.groups, kG128);
        EXPECT_EQ(r.head_dims, kD128) << "one 128-value group a row";
      }
      EXPECT_EQ(r.page_multiple % 16, 0) << "tiles of 16 positions never cross a page";
    }
    if (r.path == GpuPath::kDecodedTile) {  // the same kernel on staged bf16 tiles of 16 positions
      EXPECT_EQ(r.head_dims, kDecodedDims);
      EXPECT_EQ(r.page_multiple % 16, 0) << "tiles of 16 positions never cross a page";
      EXPECT_FALSE(r.k == CodecId::kBf16 && r.v == CodecId::kBf16) << "bf16 rows are the tensor-core row's";
      // sliding windows and pages of 8 take the pair's CUDA-core row; NexusQuant's rows, which go back through their
      // Hadamard across a warp, run on decoded tiles alone
      const bool hadamard_rows = r.k == CodecId::kNexusquant || r.k == CodecId::kE8_2;
      bool twin = false;
      for (const GpuInstance& c : kGpuInstances)
        twin |= c.path == GpuPath::kCudaCore && c.k == r.k && c.v == r.v && c.window == r.window;
      EXPECT_TRUE(twin || hadamard_rows) << k.name << "/" << v.name << ": a decoded-tile pair without a CUDA-core row";
    }
    // the formats: int rows, KIVI blocks and llama.cpp blocks pack units of 32 values (bf16 rows: of 16 bytes); a
    // Hadamard of d needs a power of two; KIVI's key-block demotion holds G x d bf16 in shared memory (none at 256)
    const CodecTransform t = implied_transform(codec_spec(k.name, true, 128, 0.f), codec_spec(v.name, false, 128, 0.f));
    for (int d : kGpuHeadDims) {
      if (!gpu_row_compiled(r, d)) continue;
      EXPECT_EQ(d % (r.k == CodecId::kBf16 && r.v == CodecId::kBf16 ? 16 : 32), 0) << d;
      if (t == CodecTransform::kHadamard || t == CodecTransform::kHadamardKeys) {
        EXPECT_EQ(d & (d - 1), 0) << d;
      }
      if (k.per_channel_keys && k.grouped) {
        EXPECT_LE(d, 128) << d;
      }
    }
    // windows: bf16, or int8 (KV4-RL) on a CUDA-core or decoded-tile row (the kernels that read window rows through a
    // device codec; the tensor-core rows' window blocks take bf16 rows)
    if (r.window != CodecId::kBf16) {
      EXPECT_EQ(r.window, CodecId::kInt8);
      EXPECT_NE(r.path, GpuPath::kTensorCore);
    }
    EXPECT_TRUE(seen.insert({r.path, r.k, r.v, r.window}).second) << "duplicate row";
  }
  // Rows come path by path in kGpuPaths' order (tensor-core, decoded-tile, CUDA-core): the predicate takes the first
  // row that fits.
  for (int i = 1; i < kGpuInstanceCount; ++i)
    EXPECT_LE(int(kGpuInstances[i - 1].path), int(kGpuInstances[i].path)) << "row " << i;
  EXPECT_EQ(int(kGpuPaths[0]), 0);
  EXPECT_EQ(int(kGpuPaths[1]), 1);
  EXPECT_EQ(int(kGpuPaths[2]), 2);
}

TEST(GpuInstances, PredicateRunsEveryRowOfTheTableAtEachOfItsHeadDims) {
  for (int i = 0; i < kGpuInstanceCount; ++i) {
    const GpuInstance& r = kGpuInstances[i];
    const std::string_view kt = codec_traits(r.k).name, vt = codec_traits(r.v).name;
    for (int d : kGpuHeadDims) {
      // some group and page size select exactly this row at d; a CUDA-core row whose pages a decoded-tile row takes
      // first (OScaR's and Kitty's at 128) with a sliding window
      bool selected = false;
      for (bool slides : {false, true})
        for (int group : {32, 64, 128})
          for (int page = 8; page <= 256; page += 8) {
            if (!gpu_detail::takes_group(r.groups, group)) continue;
            if (slides && r.path != GpuPath::kCudaCore) continue;
            CacheConfig c = config(kt, vt, group, page, d);
            c.window = codec_traits(r.window).name;
            if (slides) c.attn_window = {4096};
            const int got = gpu_instance(c, d);
            const bool divides = (!codec_traits(r.k).grouped || codec_traits(r.k).per_channel_keys || d % group == 0) &&
                                 (!codec_traits(r.v).grouped || d % group == 0);
            if (gpu_row_compiled(r, d) && divides && page % r.page_multiple == 0) {
              ASSERT_GE(got, 0) << kt << "/" << vt << " g" << group << " page " << page << " d " << d;
              EXPECT_EQ(kGpuInstances[got].k, r.k);
              EXPECT_EQ(kGpuInstances[got].v, r.v);
              EXPECT_EQ(kGpuInstances[got].window, r.window);
              EXPECT_TRUE(gpu_row_compiled(kGpuInstances[got], d));
              EXPECT_LE(got, i) << "the first row that fits runs the cache";
              EXPECT_EQ(gpu_unsupported(c, d), "");
            }
            selected |= got == i;
          }
      EXPECT_EQ(selected, gpu_row_compiled(r, d)) << "row " << i << " (" << kt << " / " << vt << ") at d " << d;
    }
  }
}

// The combinations tests/test_gpu_cache.cpp, test_gpu_llamacpp.cpp and test_gpu_model.cpp run (as their configs build
// them), and the path each takes.
TEST(GpuInstances, EveryCombinationTheGpuTestsRunHasARow) {
  struct Case {
    const char *k, *v;
    int group;
    GpuPath path;
  };
  // pages of 128 and 32: every quantized format on decoded tiles but int2 of one 128-value group (tensor cores) and
  // turboquant_3bit_nc / _2bit (their CUDA-core kernels are faster)
  constexpr GpuPath kDecoded = GpuPath::kDecodedTile;
  const Case cases[] = {
      {"bf16", "bf16", 128, GpuPath::kTensorCore},  {"int2", "int2", 128, GpuPath::kTensorCore},
      {"int2", "int2", 64, kDecoded},     {"int2", "int2", 32, kDecoded},     {"int4", "int4", 128, kDecoded},
      {"int4", "int4", 32, kDecoded},     {"int8", "int8", 128, kDecoded},    {"int8", "int8", 32, kDecoded},
      {"kivi2", "kivi2", 128, kDecoded},  {"kivi2", "kivi2", 64, kDecoded},   {"kivi2", "kivi2", 32, kDecoded},
      {"kivi4", "kivi4", 128, kDecoded},  {"kivi4", "kivi4", 32, kDecoded},   {"int4", "int2", 64, kDecoded},
      {"tq4nc", "tqv4", 128, kDecoded},   {"tq3nc", "tqv4", 128, kDecoded},   {"kivi2", "int4", 64, kDecoded},
      {"q8_0", "q4_0", 128, kDecoded},
      {"tq3nc", "tqv3", 128, kDecoded},   {"tq2nc", "tqv2", 128, kDecoded},
      {"q4_0", "q4_0", 128, kDecoded},    {"q8_0", "q8_0", 128, kDecoded},    {"f16", "f16", 128, kDecoded},
      {"fp8e4m3", "fp8e4m3", 128, kDecoded},  {"oscar_int2", "oscar_int2", 128, kDecoded},
      {"nexusquant", "nexusquant", 128, kDecoded},  {"e8_2", "e8_2", 128, kDecoded},
  };
  for (const Case& c : cases)
    for (int page : {128, 32}) {
      const CacheConfig cfg = config(c.k, c.v, c.group, page);
      const int i = gpu_instance(cfg, kD);
      ASSERT_GE(i, 0) << cfg.describe() << ": " << gpu_unsupported(cfg, kD);
      EXPECT_EQ(kGpuInstances[i].path, c.path) << cfg.describe();
    }
  // KIVI keys without per_channel are int rows of their bits; so are KIVI values.
  CacheConfig per_token = config("kivi2", "kivi2", 128);
  per_token.k.per_channel = false;
  EXPECT_EQ(kGpuInstances[gpu_instance(per_token, kD)].k, CodecId::kInt2);
  // A page of 8 rows: no tensor-core tile fits, the CUDA-core rows run int2, int4 and bf16.
  EXPECT_EQ(kGpuInstances[gpu_instance(config("int2", "int2", 128, 8), kD)].path, GpuPath::kCudaCore);
  EXPECT_EQ(kGpuInstances[gpu_instance(config("int4", "int4", 128, 8), kD)].path, GpuPath::kCudaCore);
  EXPECT_EQ(kGpuInstances[gpu_instance(config("bf16", "bf16", 128, 24), kD)].path, GpuPath::kCudaCore);
  // NexusQuant's rows run on decoded tiles alone: a sliding window, a page of 8 or another head dim is refused by name
  CacheConfig slides = config("e8_2", "e8_2", 128);
  slides.attn_window = {4096};
  for (const auto& [c, d] : {std::pair{slides, kD}, std::pair{config("e8_2", "e8_2", 128, 8), kD},
                             std::pair{config("nexusquant", "nexusquant", 128, 128, 64), 64}}) {
    EXPECT_LT(gpu_instance(c, d), 0) << c.describe();
    EXPECT_TRUE(has(gpu_unsupported(c, d), "no compiled GPU instance")) << gpu_unsupported(c, d);
  }
}

// The other head dims (tests/test_gpu_cache.cpp's HeadDims suites, test_gpu_prefill.cpp, test_gpu_model.cpp's tiny
// checkpoints): bf16 on tensor cores at every d, int2 of any group on CUDA cores away from 128 (the default group
// divides d: 64 at 64, 32 at 96, 128 at 256), the others where their formats allow.
TEST(GpuInstances, EveryCombinationTheHeadDimTestsRunHasARow) {
  struct Case {
    const char *k, *v;
    int group, d;
    GpuPath path;
  };
  const Case cases[] = {
      {"bf16", "bf16", 128, 64, GpuPath::kTensorCore},   {"bf16", "bf16", 128, 96, GpuPath::kTensorCore},
      {"bf16", "bf16", 128, 256, GpuPath::kTensorCore},  {"int2", "int2", 64, 64, GpuPath::kCudaCore},
      {"int2", "int2", 32, 64, GpuPath::kCudaCore},      {"int2", "int2", 32, 96, GpuPath::kCudaCore},
      {"int2", "int2", 128, 256, GpuPath::kCudaCore},    {"int2", "int2", 64, 256, GpuPath::kCudaCore},
      {"int4", "int4", 64, 64, GpuPath::kCudaCore},      {"int8", "int8", 32, 96, GpuPath::kCudaCore},
      {"int4", "int4", 32, 96, GpuPath::kCudaCore},      {"int4", "int4", 128, 256, GpuPath::kCudaCore},
      {"int8", "int8", 64, 64, GpuPath::kCudaCore},      {"int8", "int8", 128, 256, GpuPath::kCudaCore},
      {"int4", "int2", 32, 96, GpuPath::kCudaCore},      {"kivi2", "kivi2", 64, 64, GpuPath::kCudaCore},
      {"kivi2", "kivi2", 32, 64, GpuPath::kCudaCore},
      {"kivi4", "kivi4", 32, 96, GpuPath::kCudaCore},
      {"oscar_int2", "oscar_int2", 128, 64, GpuPath::kCudaCore},
      {"oscar_int2", "oscar_int2", 128, 256, GpuPath::kCudaCore},
      {"tq3nc", "tqv3", 128, 64, GpuPath::kCudaCore},    {"tq2nc", "tqv2", 128, 64, GpuPath::kCudaCore},
      {"tq3nc", "tqv4", 128, 64, GpuPath::kCudaCore},    {"tq4nc", "tqv4", 128, 64, GpuPath::kCudaCore},
      {"q8_0", "q4_0", 128, 64, GpuPath::kCudaCore},     {"q4_0", "q4_0", 128, 96, GpuPath::kCudaCore},
      {"q8_0", "q8_0", 128, 96, GpuPath::kCudaCore},     {"q8_0", "q4_0", 128, 96, GpuPath::kCudaCore},
      {"q4_0", "q4_0", 128, 64, GpuPath::kCudaCore},
  };
  for (const Case& c : cases)
    for (int page : {128, 32}) {
      const CacheConfig cfg = config(c.k, c.v, c.group, page, c.d);
      const int i = gpu_instance(cfg, c.d);
      ASSERT_GE(i, 0) << cfg.describe() << " d " << c.d << ": " << gpu_unsupported(cfg, c.d);
      EXPECT_EQ(kGpuInstances[i].path, c.path) << cfg.describe() << " d " << c.d;
    }
}

// Away from the compiled head dims, and where a row's format or budget leaves a d out, one line names the
// combination and the head dims the GPU takes.
TEST(GpuInstances, PredicateRefusesOtherHeadDimsWithOneLineNamingThem) {
  for (int d : {48, 32, 160, 512}) {
    const std::string why = gpu_unsupported(config("bf16", "bf16", 128, 128, d), d);
    EXPECT_TRUE(has(why, "head_dim " + std::to_string(d) + ": the GPU kernels take head_dim 64, 80, 96, 128 and 256"))
        << why;
    EXPECT_FALSE(has(why, "\n")) << why;
    EXPECT_EQ(gpu_instance(config("bf16", "bf16", 128, 128, d), d), -1);
  }
  // KIVI keys at 256, TurboQuant keys at 96 (a Hadamard of d) and at 256 (the budget), llama.cpp's and the mixed
  // int4 / int2 at 256 (the budget), int2 of one 128-value group at 64 (no group of 128 divides 64), int2/g64 at 96,
  // int8/g32 at 80 (bf16 rows only)
  for (const auto& [k, v, group, d] :
       {std::tuple{"kivi2", "kivi2", 128, 256}, {"tq3nc", "tqv3", 128, 96}, {"tq2nc", "tqv2", 128, 256},
        {"q8_0", "q4_0", 128, 256}, {"int4", "int2", 128, 256}, {"int2", "int2", 128, 64}, {"int2", "int2", 64, 96},
        {"int8", "int8", 32, 80}}) {
    const CacheConfig c = config(k, v, group, 128, d);
    const std::string why = gpu_unsupported(c, d);
    EXPECT_EQ(gpu_instance(c, d), -1) << why;
    EXPECT_TRUE(has(why, std::string("keys ") + k) && has(why, "at head_dim " + std::to_string(d))) << why;
    EXPECT_TRUE(has(why, "no compiled GPU instance; the GPU runs head_dim 64, 80, 96, 128 and 256")) << why;
  }
}

// A sliding-window cache (Mistral) takes the CUDA-core row of its pair (tensor-core and decoded tiles alike); a pair
// only tensor cores run is refused.
TEST(GpuInstances, SlidingWindowCachesTakeCudaCoreRows) {
  for (const auto& [k, path] : {std::pair{"bf16", GpuPath::kTensorCore}, {"int2", GpuPath::kTensorCore},
                                {"int4", GpuPath::kDecodedTile}, {"kitty_int2", GpuPath::kDecodedTile}}) {
    CacheConfig c = config(k, k, 128, 128, kD);
    ASSERT_EQ(kGpuInstances[gpu_instance(c, kD)].path, path) << k;
    c.attn_window = {0, 4096};
    const int i = gpu_instance(c, kD);
    ASSERT_GE(i, 0) << gpu_unsupported(c, kD);
    EXPECT_EQ(kGpuInstances[i].path, GpuPath::kCudaCore) << k;
    c.attn_window = {0, 0};  // no layer slides
    EXPECT_EQ(kGpuInstances[gpu_instance(c, kD)].path, path) << k;
  }
  CacheConfig mixed = config("int2", "bf16", 128, 128, kD);
  mixed.attn_window = {4096};
  EXPECT_EQ(gpu_instance(mixed, kD), -1);
  EXPECT_TRUE(has(gpu_unsupported(mixed, kD), "with a sliding window (CUDA-core instances only)"))
      << gpu_unsupported(mixed, kD);
}

TEST(GpuInstances, PredicateRefusesEveryOtherCombinationWithOneLineNamingIt) {
  int refused = 0;
  for (const CodecTraits& k : codec_table())
    for (const CodecTraits& v : codec_table())
      for (int group : {32, 64, 128}) {
        const CacheConfig c = config(k.name, v.name, group);
        const std::string why = gpu_unsupported(c, kD);
        if (gpu_instance(c, kD) >= 0) {
          EXPECT_EQ(why, "");
          continue;
        }
        ++refused;
        SCOPED_TRACE(c.describe());
        EXPECT_TRUE(has(why, k.name)) << why;
        EXPECT_TRUE(has(why, v.name)) << why;
        EXPECT_TRUE(has(why, "int2") && has(why, "kivi2") && has(why, "tensor-core")) << why;  // lists the rows
        EXPECT_FALSE(has(why, "\n")) << why;
      }
  EXPECT_GT(refused, 0);
  // Named refusals: no row for the pair, f32, per-channel values, head_dim, windows, page size, group, clip.
  EXPECT_TRUE(has(gpu_unsupported(config("int8", "int4", 128), kD), "keys int8/g128 with values int4/g128"));
  EXPECT_TRUE(has(gpu_unsupported(config("f32", "f32", 128), kD), "f32"));
  CacheConfig kivi = config("kivi2", "kivi2", 128);
  kivi.v.per_channel = true;
  const std::string pc = gpu_unsupported(kivi, kD);
  EXPECT_TRUE(has(pc, "value type kivi2/g128 per channel")) << pc;
  CacheConfig int2_pc = config("int2", "int2", 128);
  int2_pc.k.per_channel = true;
  EXPECT_TRUE(has(gpu_unsupported(int2_pc, kD), "key type int2/g128 per channel"));
  EXPECT_TRUE(has(gpu_unsupported(config("int2", "int2", 128), 64), "head_dim 64"));
  CacheConfig f32w = config("int2", "int2", 128);
  f32w.window = "f32";
  EXPECT_TRUE(has(gpu_unsupported(f32w, kD), "window type 'f32'"));
  CacheConfig kv4rl = config("int4", "int4", 128);  // KV4-RL's INT8 windows: its int4 rows, never bf16 windows
  kv4rl.window = "int8";
  EXPECT_EQ(gpu_unsupported(kv4rl, kD), "");
  EXPECT_EQ(kGpuInstances[gpu_instance(kv4rl, kD)].window, CodecId::kInt8);
  EXPECT_EQ(kGpuInstances[gpu_instance(kv4rl, kD)].path, GpuPath::kDecodedTile);  // d = 128, pages of 128
  CacheConfig kv4rl_p8 = kv4rl;  // pages of 8 and the other head dims: the CUDA-core row
  kv4rl_p8.page_tokens = 8;
  EXPECT_EQ(kGpuInstances[gpu_instance(kv4rl_p8, kD)].path, GpuPath::kCudaCore);
  EXPECT_EQ(kGpuInstances[gpu_instance(kv4rl_p8, kD)].window, CodecId::kInt8);
  CacheConfig kv4rl_d64 = config("int4", "int4", 32, 128, 64);
  kv4rl_d64.window = "int8";
  EXPECT_EQ(kGpuInstances[gpu_instance(kv4rl_d64, 64)].path, GpuPath::kCudaCore);
  CacheConfig int8w_int2 = config("int2", "int2", 128);  // int8 windows beside another body: no row
  int8w_int2.window = "int8";
  EXPECT_TRUE(has(gpu_unsupported(int8w_int2, kD), "keys int2/g128 with values int2/g128 and int8 windows"));
  CacheConfig int8w_skip = kv4rl;
  int8w_skip.skip_layers = {0};
  EXPECT_TRUE(has(gpu_unsupported(int8w_skip, kD), "int8 windows (--kv-window-type int8) with --kv-skip-layers"));
  CacheConfig int8w_exact = kv4rl;
  int8w_exact.prompt_policy = PromptPolicy::kExactPrompt;
  EXPECT_TRUE(has(gpu_unsupported(int8w_exact, kD), "with the prompt policy 'exact-prompt'"));
  EXPECT_TRUE(has(gpu_unsupported(config("int2", "int2", 128, 12), kD), "pages of 12 tokens"));
  EXPECT_TRUE(has(gpu_unsupported(config("int2", "bf16", 64), kD), "keys int2/g64 with values bf16"));
  CacheConfig bad_clip = config("int2", "int2", 128);
  bad_clip.v.clip = 1.5f;
  EXPECT_TRUE(has(gpu_unsupported(bad_clip, kD), "clip"));
  // OScaR keys as the codec table defines them only: per-channel blocks with their token scale.
  CacheConfig unscaled = config("oscar_int2", "oscar_int2", 128);
  unscaled.k.token_scale = false;
  EXPECT_TRUE(has(gpu_unsupported(unscaled, kD), "key type oscar_int2 per channel without a token scale"))
      << gpu_unsupported(unscaled, kD);
  CacheConfig per_token_oscar = config("oscar_int2", "oscar_int2", 128);
  per_token_oscar.k.per_channel = false;
  EXPECT_TRUE(has(gpu_unsupported(per_token_oscar, kD), "its keys are per-channel blocks"));
  CacheConfig scaled_int2 = config("int2", "int2", 128);
  scaled_int2.k.token_scale = true;
  EXPECT_TRUE(has(gpu_unsupported(scaled_int2, kD), "key type int2/g128 with a token scale"));
  EXPECT_TRUE(has(gpu_unsupported(config("oscar_int2", "oscar_int2", 128, 48), kD), "pages of 48 tokens"));
  // Kitty's value rows are min / scale rows of its own (codecs/kitty/codec_kitty.h), not the int2 rows a KIVI value maps to.
  EXPECT_TRUE(has(gpu_unsupported(config("int2", "kitty_int2", 128), kD), "values kitty_int2"));
  // Kitty's key blocks are 128 tokens: pages of 64 are refused; at d = 256 its block demotion does not fit.
  EXPECT_TRUE(has(gpu_unsupported(config("kitty_int2", "kitty_int2", 128, 64), kD), "pages of 64 tokens"));
  EXPECT_TRUE(has(gpu_unsupported(config("kitty_int2_20", "kitty_int2_20", 128, 128, 256), 256), "head_dim 256"));
  EXPECT_GE(gpu_instance(config("kitty_int2", "kitty_int2", 128), kD), 0);
  EXPECT_GE(gpu_instance(config("kitty_int2_20", "kitty_int2_20", 128, 256, 64), 64), 0);
  // llama.cpp's pairs the table does not list (mixed types but q8_0 / q4_0) have no GPU kernels: refused by name,
  // never run as another codec's rows.
  EXPECT_TRUE(has(gpu_unsupported(config("q5_0", "q4_1", 128), kD), "keys q5_0 with values q4_1"));
  EXPECT_TRUE(has(gpu_unsupported(config("q4_0", "q8_0", 128), kD), "keys q4_0 with values q8_0"));
  EXPECT_TRUE(has(gpu_unsupported(config("q8_0", "bf16", 128), kD), "keys q8_0 with values bf16"));
  EXPECT_TRUE(has(gpu_unsupported(config("f16", "q8_0", 128), kD), "keys f16 with values q8_0"));
  EXPECT_EQ(gpu_unsupported(config("f16", "f16", 128, 8, 256), 256), "");  // llama.cpp's default type, every d but 80
  EXPECT_TRUE(gpu_spec_stored({.type = "q8_0", .head_dim = kD, .group = 128}));
  EXPECT_TRUE(gpu_spec_stored({.type = "q4_0", .head_dim = kD, .group = 128}));
  EXPECT_TRUE(gpu_spec_stored({.type = "q8_0", .head_dim = 64, .group = 128}));
  EXPECT_FALSE(gpu_spec_stored({.type = "q8_0", .head_dim = 80, .group = 128}));
  EXPECT_FALSE(gpu_spec_stored({.type = "q8_0", .head_dim = 256, .group = 128}));  // the budget
  for (const char* type : {"q5_0", "q4_1", "iq4_nl"}) {
    EXPECT_TRUE(gpu_spec_stored({.type = type, .head_dim = kD, .group = 128})) << type;
    EXPECT_FALSE(gpu_spec_stored({.type = type, .head_dim = 96, .group = 128})) << type;  // the budget
  }
  EXPECT_TRUE(gpu_spec_stored({.type = "f16", .head_dim = kD, .group = 128}));
  EXPECT_FALSE(gpu_spec_stored({.type = "f16", .head_dim = 80, .group = 128}));
  CacheConfig unknown = config("int2", "int2", 128);
  unknown.k.type = "kivi8";
  EXPECT_TRUE(has(gpu_unsupported(unknown, kD), "'kivi8' is unknown"));
  EXPECT_EQ(gpu_instance(unknown, kD), -1);
}

// gpu_spec_stored (behind cuda::gpu_codec_supported): one spec, keys or values, whatever the other side.
TEST(GpuInstances, SpecStoredForKeysOrValues) {
  for (const char* type : {"bf16", "int8", "int4", "int2", "kivi2", "kivi4", "oscar_int2"})
    for (int group : {32, 64, 128}) {
      CodecSpec s = codec_spec(type, false, group, 0.f);
      s.head_dim = kD;
      EXPECT_TRUE(gpu_spec_stored(s)) << type << "/g" << group;
      s = codec_spec(type, true, group, 0.f);
      s.head_dim = kD;
      EXPECT_TRUE(gpu_spec_stored(s)) << type << "/g" << group << " keys";
    }
  EXPECT_TRUE(gpu_spec_stored({.type = "kivi2", .head_dim = 64, .group = 128, .per_channel = true}));  // G tokens
  EXPECT_FALSE(gpu_spec_stored({.type = "kivi2", .head_dim = 256, .group = 128, .per_channel = true}));
  EXPECT_FALSE(gpu_spec_stored({.type = "int2", .head_dim = 64, .group = 128}));  // G must divide d
  EXPECT_TRUE(gpu_spec_stored({.type = "int2", .head_dim = 96, .group = 32}));
  EXPECT_TRUE(gpu_spec_stored({.type = "bf16", .head_dim = 80, .group = 128}));
  EXPECT_FALSE(gpu_spec_stored({.type = "int8", .head_dim = 80, .group = 32}));
  EXPECT_FALSE(gpu_spec_stored({.type = "kivi2", .head_dim = kD, .group = 16, .per_channel = true}));
  EXPECT_FALSE(gpu_spec_stored({.type = "int2", .head_dim = kD, .group = 128, .per_channel = true}));
  EXPECT_FALSE(gpu_spec_stored({.type = "bf16", .head_dim = kD, .group = 128, .per_channel = true}));
  EXPECT_FALSE(gpu_spec_stored({.type = "kivi8", .head_dim = kD, .group = 128}));
  EXPECT_FALSE(gpu_spec_stored({.type = "f32", .head_dim = kD, .group = 128}));
  EXPECT_FALSE(gpu_spec_stored({.type = "int2", .head_dim = kD, .group = 128, .clip = 0.f}));
}

TEST(GpuInstances, SupportListIsOneLineGeneratedFromTheTable) {
  const std::string s = gpu_instances_text();
  EXPECT_FALSE(has(s, "\n"));
  EXPECT_TRUE(has(s, "the GPU runs head_dim 64, 80, 96, 128 and 256,")) << s;
  for (const GpuInstance& r : kGpuInstances) {
    EXPECT_TRUE(has(s, gpu_path_name(r.path)));
    EXPECT_TRUE(has(s, codec_traits(r.k).name));
    EXPECT_TRUE(has(s, codec_traits(r.v).name));
  }
  EXPECT_TRUE(has(s, "k=int2/g128 v=int2/g128 (d 128)")) << s;
  EXPECT_TRUE(has(s, "k=kivi2/per-channel v=int2 (d 64, 96 and 128)")) << s;
  EXPECT_TRUE(has(s, "k=tq3nc v=tqv3 (d 64 and 128)")) << s;
  EXPECT_TRUE(has(s, "k=q8_0 v=q4_0 (d 64, 96 and 128)")) << s;
  EXPECT_TRUE(has(s, "k=oscar_int2/per-channel v=oscar_int2 (d 64, 128 and 256; pages a multiple of 32)")) << s;
  EXPECT_TRUE(has(s, "k=kitty_int2/per-channel v=kitty_int2 (d 64, 96 and 128; pages a multiple of 128)")) << s;
  EXPECT_TRUE(has(s, "k=bf16 v=bf16,")) << s;  // every head_dim: none named
  // decoded tiles by the CUDA-core pairs they leave out, then their pairs without a CUDA-core row (NexusQuant's)
  EXPECT_TRUE(has(s, "; decoded-tile (pages a multiple of 16): the CUDA-core pairs below at d 128 but k=bf16 v=bf16, "
                     "k=nexusquant v=nexusquant (d 128), k=e8_2 v=e8_2 (d 128); CUDA-core"))
      << s;
}
