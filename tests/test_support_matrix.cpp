// The support matrix of `kvq info --codecs` (codecs/support_matrix.h): every codec of the table at each head_dim asked
// for, the bytes and bits its CPU codec stores, and the GPU path from the instance table (cuda/gpu_instances.h).
#include <gtest/gtest.h>

#include <algorithm>

#include <set>
#include <string>

#include "codecs/registry.h"
#include "codecs/support_matrix.h"

using namespace kvq;

namespace {

const SupportRow* find_row(const std::vector<SupportRow>& rows, const std::string& codec, const std::string& role,
                           int d, int group) {
  for (const SupportRow& r : rows)
    if (r.codec == codec && r.role == role && r.head_dim == d && r.group == group) return &r;
  return nullptr;
}

}  // namespace

TEST(SupportMatrix, ListsEveryCodecOfTheTableAtEveryHeadDim) {
  const std::vector<SupportRow> rows = support_matrix({64, 128});
  std::set<std::pair<std::string, int>> seen;
  for (const SupportRow& r : rows) seen.insert({r.codec, r.head_dim});
  for (const CodecTraits& t : codec_table())
    for (int d : {64, 128}) EXPECT_TRUE(seen.count({std::string(t.name), d})) << t.name << " d " << d;
}

TEST(SupportMatrix, BytesAndBitsAreWhatTheCodecsStore) {
  const std::vector<SupportRow> rows = support_matrix({64, 128});
  const SupportRow* int2 = find_row(rows, "int2", "k,v", 128, 128);
  ASSERT_NE(int2, nullptr);
  EXPECT_TRUE(int2->cpu);
  EXPECT_DOUBLE_EQ(int2->bytes_per_token, 36.0);  // layout::IntRow<128, 128, 2>
  EXPECT_DOUBLE_EQ(int2->bits, 2.25);
  const SupportRow* bf16 = find_row(rows, "bf16", "k,v", 64, 0);
  ASSERT_NE(bf16, nullptr);
  EXPECT_DOUBLE_EQ(bf16->bytes_per_token, 128.0);
  EXPECT_DOUBLE_EQ(bf16->bits, 16.0);
  const SupportRow* kivi_k = find_row(rows, "kivi2", "k", 128, 32);  // 4·128 + 32·32 bytes per 32 tokens
  ASSERT_NE(kivi_k, nullptr);
  EXPECT_DOUBLE_EQ(kivi_k->bytes_per_token, (4.0 * 128 + 32 * 32) / 32);
  EXPECT_DOUBLE_EQ(kivi_k->bits, 3.0);
  const SupportRow* odd = find_row(rows, "int4", "k,v", 64, 128);  // a group larger than head_dim
  ASSERT_NE(odd, nullptr);
  EXPECT_FALSE(odd->cpu);
}

TEST(SupportMatrix, TheGpuColumnIsTheInstanceTables) {
  const std::vector<SupportRow> rows = support_matrix({64, 128});
  EXPECT_EQ(find_row(rows, "int2", "k,v", 128, 128)->cuda, "tensor-core");
  EXPECT_EQ(find_row(rows, "bf16", "k,v", 128, 0)->cuda, "tensor-core");
  EXPECT_EQ(find_row(rows, "int8", "k,v", 128, 64)->cuda, "decoded-tile");  // the other formats at 128
  EXPECT_EQ(find_row(rows, "int8", "k,v", 64, 64)->cuda, "CUDA-core");
  EXPECT_EQ(find_row(rows, "int2", "k,v", 128, 64)->cuda, "decoded-tile");
  EXPECT_EQ(find_row(rows, "int2", "k,v", 64, 32)->cuda, "CUDA-core");  // int2 of one 128-value group only at 128
  EXPECT_EQ(find_row(rows, "bf16", "k,v", 64, 0)->cuda, "tensor-core");
  EXPECT_EQ(find_row(rows, "f32", "k,v", 128, 0)->cuda, "");   // CPU only
  EXPECT_EQ(find_row(rows, "pnmix", "k", 128, 0)->cuda, "decoded-tile");  // keys of per-head widths (a file's)
  EXPECT_EQ(find_row(rows, "pnmix", "k", 64, 0)->cuda, "CUDA-core");
  const std::vector<SupportRow> at256 = support_matrix({256});
  EXPECT_EQ(find_row(at256, "pnmix", "k", 256, 0)->cuda, "");  // not compiled at 256
  const std::string text = format_support_matrix(rows);
  EXPECT_NE(text.find("codec"), std::string::npos);
  EXPECT_NE(text.find("tensor-core"), std::string::npos);
}

// llama.cpp's blocks of 32 (codecs/llamacpp/codec_llamacpp.h): the CPU codec's bytes and bits; every block type on
// decoded tiles at head_dim 128 and CUDA cores at 64 (their instance rows: q8_0 / q4_0, q4_0 / q4_0, q8_0 / q8_0, q5_0,
// q4_1, iq4_nl), and f16, llama.cpp's default type, the same.
TEST(SupportMatrix, LlamaCppBlockTypesRunOnDecodedTilesAt128AndCudaCoresAt64) {
  const std::vector<SupportRow> rows = support_matrix({64, 128});
  const struct {
    const char* type;
    double bytes, bits;
  } cases[] = {{"q8_0", 136, 8.5}, {"q5_0", 88, 5.5}, {"q4_1", 80, 5.0}, {"q4_0", 72, 4.5}, {"iq4_nl", 72, 4.5}};
  for (const auto& c : cases) {
    const SupportRow* r = find_row(rows, c.type, "k,v", 128, 0);
    ASSERT_NE(r, nullptr) << c.type;
    EXPECT_DOUBLE_EQ(r->bytes_per_token, c.bytes) << c.type;  // 4 blocks of 32 values
    EXPECT_DOUBLE_EQ(r->bits, c.bits) << c.type;
    EXPECT_EQ(r->cuda, "decoded-tile") << c.type;
    EXPECT_EQ(find_row(rows, c.type, "k,v", 64, 0)->cuda, "CUDA-core") << c.type;
  }
  EXPECT_EQ(find_row(rows, "f16", "k,v", 128, 0)->cuda, "decoded-tile");
  EXPECT_EQ(find_row(rows, "f16", "k,v", 64, 0)->cuda, "CUDA-core");
}

// TurboQuant: keys-only codebook rows ("k"), the GPU column from the first row that stores the codec (the preset pairs'
// rows), and the presets' own table
// (bytes of both codecs, the implied transform, kvq's extension labelled).
TEST(SupportMatrix, TurboQuantRowsAndPresets) {
  const std::vector<SupportRow> rows = support_matrix({64, 128});
  const SupportRow* k3 = find_row(rows, "tq3nc", "k", 128, 0);
  ASSERT_NE(k3, nullptr);
  EXPECT_DOUBLE_EQ(k3->bytes_per_token, 50.0);
  EXPECT_DOUBLE_EQ(k3->bits, 3.125);
  EXPECT_EQ(k3->cuda, "decoded-tile");  // its first row: with tqv4 (turboquant_k3v4_nc)
  EXPECT_EQ(find_row(rows, "tq3nc", "k", 64, 0)->cuda, "CUDA-core");
  EXPECT_EQ(find_row(rows, "tq3", "k", 128, 0)->cuda, "decoded-tile");  // uncorrected keys, with tqv3
  EXPECT_EQ(find_row(rows, "tqv2", "k,v", 128, 0)->cuda, "decoded-tile");
  EXPECT_EQ(find_row(rows, "fp8e4m3", "k,v", 128, 0)->cuda, "decoded-tile");
  const std::vector<PresetRow> presets = preset_matrix({128});
  ASSERT_EQ(presets.size(), codec_presets().size());
  const PresetRow* tq2 = nullptr;
  for (const PresetRow& p : presets) {
    EXPECT_TRUE(p.cpu) << p.preset;
    if (p.preset.rfind("turboquant_", 0) != 0) continue;  // KV4-RL: the test below
    EXPECT_EQ(p.kvq_extension, p.preset == "turboquant_2bit") << p.preset;
    EXPECT_EQ(p.transform, p.k == "fp8e4m3" ? "none" : "hadamard_k") << p.preset;
    EXPECT_EQ(p.cuda, "decoded-tile") << p.preset;
    EXPECT_EQ(p.window, "bf16") << p.preset;
    if (p.preset == "turboquant_2bit") tq2 = &p;
  }
  ASSERT_NE(tq2, nullptr);
  EXPECT_DOUBLE_EQ(tq2->bytes_per_token, 70.0);
  EXPECT_NE(format_preset_matrix(presets).find("(kvq extension)"), std::string::npos);
}

// The default head dims, 64, 80, 96, 128 and 256: the CPU and GPU columns agree but where the page says why not (KIVI,
// TurboQuant and llama.cpp's q8_0 / q4_0 at 256: the GPU compiles no pair there; TurboQuant's values at 96: their only
// GPU pairs are TurboQuant keys, which need a power of two; fp8e5m2, fp8_per_token_head, q5_0, q4_1 and iq4_nl at 96
// and 256, PN-Mix at 256: the budget; NexusQuant's nexusquant and e8_2 away from 128: decoded tiles alone); at 80 only
// the CPU's f32 / bf16 / f16 rows run (the other CPU codecs take multiples of 32, the GPU compiles no kernel at 80),
// and neither runs the Hadamard codecs at 96.
TEST(SupportMatrix, CpuAndGpuColumnsAgreeAtEveryHeadDimButWhereThePageSaysWhy) {
  const std::vector<SupportRow> rows = support_matrix();
  std::set<int> dims;
  for (const SupportRow& r : rows) dims.insert(r.head_dim);
  EXPECT_EQ(dims, (std::set<int>{64, 80, 96, 128, 256}));
  for (const SupportRow& r : rows) {
    const std::string what =
        r.codec + " " + r.role + " d " + std::to_string(r.head_dim) + " g" + std::to_string(r.group);
    if (r.head_dim == 80) {  // unquantized rows only; the GPU stores bf16 (no f32 rows at any d, f16 not at 80)
      EXPECT_EQ(r.cpu, r.codec == "f32" || r.codec == "bf16" || r.codec == "f16") << what;
      EXPECT_EQ(r.cuda, r.codec == "bf16" ? "tensor-core" : "") << what;
    }
    if (!r.cuda.empty()) {
      EXPECT_TRUE(r.cpu) << what << ": on the GPU but not the CPU";
    }
    const bool tq = r.codec.rfind("tq", 0) == 0;
    const bool explained = r.head_dim == 80 || (r.head_dim == 256 && (r.codec.rfind("kivi", 0) == 0 ||
                                                  r.codec.rfind("kitty", 0) == 0 || tq || r.codec == "q8_0" ||
                                                  r.codec == "q4_0" || r.codec == "pnmix")) ||
                           (r.codec.rfind("tqv", 0) == 0 && r.head_dim == 96) ||
                           ((r.codec == "fp8e5m2" || r.codec == "fp8_per_token_head" || r.codec == "q5_0" ||
                             r.codec == "q4_1" || r.codec == "iq4_nl") &&
                            (r.head_dim == 96 || r.head_dim == 256)) ||
                           ((r.codec == "nexusquant" || r.codec == "e8_2") && r.head_dim != 128);
    if (r.cpu && r.cuda.empty() && !explained) {
      // codecs the GPU stores at 128 run at every other head_dim their format allows
      const SupportRow* at128 = find_row(rows, r.codec, r.role, 128, r.group);
      ASSERT_NE(at128, nullptr) << what;
      EXPECT_EQ(at128->cuda, "") << what << ": on the GPU at 128 but not here, and the page does not say why";
    }
  }
  EXPECT_EQ(find_row(rows, "kivi2", "k", 256, 128)->cuda, "");
  EXPECT_TRUE(find_row(rows, "kivi2", "k", 256, 128)->cpu);
  EXPECT_EQ(find_row(rows, "tqv3", "k,v", 96, 0)->cuda, "");
  EXPECT_FALSE(find_row(rows, "tq3nc", "k", 96, 0)->cpu);  // the Hadamard of d needs a power of two
  EXPECT_FALSE(find_row(rows, "oscar_int2", "k", 96, 0)->cpu);
  EXPECT_EQ(find_row(rows, "tq3nc", "k", 64, 0)->cuda, "CUDA-core");
  EXPECT_EQ(find_row(rows, "tq3nc", "k", 256, 0)->cuda, "");  // the budget
  EXPECT_EQ(find_row(rows, "oscar_int2", "k", 256, 0)->cuda, "CUDA-core");
  EXPECT_EQ(find_row(rows, "int2", "k,v", 256, 128)->cuda, "CUDA-core");
  EXPECT_EQ(find_row(rows, "int2", "k,v", 128, 128)->cuda, "tensor-core");
  EXPECT_EQ(find_row(rows, "bf16", "k,v", 256, 0)->cuda, "tensor-core");
  EXPECT_EQ(find_row(rows, "q8_0", "k,v", 96, 0)->cuda, "CUDA-core");
}

// KV4-RL's preset: int4 keys and values (68 + 68 bytes at d = 128), INT8 windows, no transform, on the GPU's
// decoded-tile row that names int8 windows (the other decoded-tile int4 row keeps bf16 ones).
TEST(SupportMatrix, Kv4rlPresetRowNamesItsInt8WindowsAndItsGpuRow) {
  const std::vector<PresetRow> presets = preset_matrix({128});
  const auto it = std::find_if(presets.begin(), presets.end(), [](const PresetRow& p) { return p.preset == "kv4rl"; });
  ASSERT_NE(it, presets.end());
  EXPECT_EQ(it->k, "int4");
  EXPECT_EQ(it->v, "int4");
  EXPECT_EQ(it->window, "int8");
  EXPECT_TRUE(it->kvq_extension);
  EXPECT_DOUBLE_EQ(it->bytes_per_token, 136.0);
  EXPECT_DOUBLE_EQ(it->bits, 4.25);
  EXPECT_EQ(it->transform, "none");
  EXPECT_EQ(it->cuda, "decoded-tile");
  EXPECT_NE(format_preset_matrix(presets).find("kv4rl                int4     int4   int8"), std::string::npos)
      << format_preset_matrix(presets);
}
