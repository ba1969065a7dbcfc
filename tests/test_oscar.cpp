// OScaR (oscar_int2, docs/guide/methods.md §5.4): the integer-zero-point quantizer on hand-worked groups (rounding half to
// even, the (0, 0) -> (-1, 1) case, groups without range, the fp16 storage), the codecs' stored bytes bit-exact
// against a scalar reference written from the spec, the bytes per block and per token, the token scale ν (the norm
// over all kv heads, stored once per token and layer), the lossless identity of dividing by ν and multiplying it
// back, the cache's rows against the attention reference, and perplexity on models/ref.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "attention/attention.h"
#include "attention/attention_ref.h"
#include "codecs/oscar/codec_oscar.h"
#include "codecs/oscar/oscar_format.h"
#include "codecs/registry.h"
#include "codecs/support_matrix.h"
#include "common/error.h"
#include "common/half.h"
#include "eval/perplexity.h"
#include "kv/cache.h"
#include "model/model.h"
#include "rotation/rotation_file.h"
#include "tokenizer/tokenizer.h"

using namespace kvq;

namespace {

constexpr int kG = layout::kOscarGroup;

CacheConfig oscar_config(int sink, int recent, int page, int chunk) {
  CacheConfig c;
  c.k = codec_spec("oscar_int2", true, kDefaultGroup, 0.f);
  c.v = codec_spec("oscar_int2", false, kDefaultGroup, 0.f);
  c.sink = sink, c.recent = recent, c.page_tokens = page, c.max_chunk = chunk;
  return c;
}

// c for a cache of (n_layers, n_kv, d), with the Hadamard its codecs imply (the cache refuses to run without it).
CacheConfig shaped(CacheConfig c, int n_layers, int n_kv, int d) {
  c.transform = codec_transform(c, n_layers, n_kv, d);
  return c;
}

// n values of N(0, 1) with a per-channel offset and 1% outliers x20 (rows of d).
std::vector<float> rows_of(std::mt19937& rng, size_t n, int d, float offset = 0.f) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = nd(rng) + offset * float(int(i % size_t(d)) % 5 - 2);
    if (u01(rng) < 0.01f) x[i] *= 20.f;
  }
  return x;
}

// --- The scalar reference, written from METHODS §5.4 alone: plain float operations, std::nearbyint (ties to even).
struct RefGroup {
  uint16_t scale, zero;  // fp16 bits as stored
  std::vector<uint8_t> codes;
};
RefGroup ref_group(const std::vector<float>& x) {
  float mn = x[0], mx = x[0];
  for (float v : x) mn = std::min(mn, v), mx = std::max(mx, v);
  if (mn == 0.f && mx == 0.f) mn = -1.f, mx = 1.f;
  RefGroup g{f32_to_fp16(0.f), f32_to_fp16(mn), std::vector<uint8_t>(x.size(), 0)};
  const float scale = (mx - mn) / 3.f;
  if (!(mx - mn > 0.f) || !(scale > 0.f)) return g;  // no range: x̂ = mn, codes 0
  const float z = std::nearbyint(-mn / scale);
  for (size_t i = 0; i < x.size(); ++i)
    g.codes[i] = uint8_t(std::clamp(std::nearbyint(x[i] / scale + z), 0.f, 3.f));
  g.scale = f32_to_fp16(scale);
  g.zero = f32_to_fp16(-z * scale);
  return g;
}

layout::OscarParams params_at(const uint8_t* p, int g) {
  layout::OscarParams q;
  std::memcpy(&q, p + 4 * g, 4);
  return q;
}

}  // namespace

// Hand-worked groups (every value below is exact in fp32 and fp16).
//   [-1, 2]:     scale 3/3 = 1, z = round(1) = 1; x / 1 + 1: -1 -> 0, -0.5 -> 0.5 -> 0 (ties to even; floor(x + 0.5)
//                would give 1), 0 -> 1, 0.5 -> 1.5 -> 2, 1.5 -> 2.5 -> 2 (even), 2 -> 3;
//                stored 1 (0x3c00), -1 (0xbc00).
//   [0.25, 1]:   scale 0.25, z = round(-1) = -1 (a negative zero point: all values positive); 0.25 -> 0, 0.5 -> 1,
//                0.625 -> 1.5 -> 2, 1 -> 3; stored 0.25 (0x3400), -(-1)·0.25 = 0.25 (0x3400): x̂ = 0.25 code + 0.25.
//   all zeros:   (0, 0) -> (-1, 1): scale = fp32(2/3), -mn / scale = 1.5 in fp32, z = 2 (even), 0 -> round(2) = 2;
//                stored fp16(2/3) = 0.66650390625 (0x3955), fp16(-2·fp32(2/3)) = -1.3330078125 (0xbd55):
//                x̂ = 2 · 0.66650390625 - 1.3330078125 = 0 exactly.
//   constant:    0.375 everywhere: no range: scale 0 (0x0000), zero_dequant 0.375 (0x3600), codes 0, x̂ = 0.375.
TEST(OscarQuantizer, HandWorkedGroupsRoundHalfToEvenAndStoreFp16ScaleAndMinusZScale) {
  struct Case {
    std::vector<float> x;
    std::vector<uint8_t> codes;
    uint16_t scale, zero;
  };
  const std::vector<Case> cases = {
      {{-1.f, -0.5f, 0.f, 0.5f, 1.5f, 2.f}, {0, 0, 1, 2, 2, 3}, 0x3c00, 0xbc00},
      {{0.25f, 0.5f, 0.625f, 1.f}, {0, 1, 2, 3}, 0x3400, 0x3400},
      {{0.f, 0.f, 0.f}, {2, 2, 2}, 0x3955, 0xbd55},
      {{0.375f, 0.375f}, {0, 0}, 0x0000, 0x3600},
  };
  for (const Case& c : cases) {
    const OscarGroup g = oscar_group_of([&](int i) { return c.x[size_t(i)]; }, int(c.x.size()));
    EXPECT_EQ(g.scale_bits, c.scale) << c.x[0];
    EXPECT_EQ(g.zero_bits, c.zero) << c.x[0];
    for (size_t i = 0; i < c.x.size(); ++i) {
      const uint8_t code = oscar_code(c.x[i], g);
      EXPECT_EQ(code, c.codes[i]) << "x = " << c.x[i];
      const float xh = oscar_dequant(code, g.scale_bits, g.zero_bits);
      if (c.scale == 0x3c00) {
        EXPECT_EQ(xh, float(code) - 1.f);
      } else if (c.scale == 0x3400) {
        EXPECT_EQ(xh, 0.25f * float(code) + 0.25f);
      } else {
        EXPECT_EQ(xh, c.x[i]) << "exact round trip";
      }
    }
  }
  EXPECT_EQ(fp16_to_f32(0x3955), 0.66650390625f);
  EXPECT_EQ(fp16_to_f32(0xbd55), -1.3330078125f);
}

TEST(OscarQuantizer, ValueRowStoresTheHandWorkedGroupsInItsLayout) {
  // d = 64: group 0 holds [-1, 2] values, group 1 all zeros; layout: OscarParams[2] then 16 bytes of codes.
  std::vector<float> x(64);
  const float g0[] = {-1.f, -0.5f, 0.f, 0.5f, 1.5f, 2.f};
  const uint8_t c0[] = {0, 0, 1, 2, 2, 3};
  for (int i = 0; i < 32; ++i) x[size_t(i)] = g0[i % 6];
  const OscarValueCodec codec(64);
  ASSERT_EQ(codec.bytes_per_block(), 24u);
  std::vector<uint8_t> row(24);
  codec.encode(x.data(), row.data());
  EXPECT_EQ(params_at(row.data(), 0).scale, 0x3c00);
  EXPECT_EQ(params_at(row.data(), 0).zero_dequant, 0xbc00);
  EXPECT_EQ(params_at(row.data(), 1).scale, 0x3955);
  EXPECT_EQ(params_at(row.data(), 1).zero_dequant, 0xbd55);
  for (int i = 0; i < 64; ++i)
    EXPECT_EQ(layout::unpack_code(row.data() + 8, i, 2), i < 32 ? c0[i % 6] : 2) << "value " << i;
  // Byte j of unit 0 holds values j, j+8, j+16, j+24 (layout.h): byte 0 = codes of values 0, 8, 16, 24.
  EXPECT_EQ(row[8], uint8_t(c0[0] | c0[8 % 6] << 2 | c0[16 % 6] << 4 | c0[24 % 6] << 6));
  std::vector<float> xh(64);
  codec.decode(row.data(), xh.data());
  for (int i = 32; i < 64; ++i) EXPECT_EQ(xh[size_t(i)], 0.f);
}

TEST(OscarCodecs, StoredBytesEqualTheScalarReferenceBitForBit) {
  for (int d : {64, 128}) {
    std::mt19937 rng{uint32_t(d)};
    CodecSpec ks = codec_spec("oscar_int2", true, kDefaultGroup, 0.f), vs = codec_spec("oscar_int2", false, 128, 0.f);
    ks.head_dim = vs.head_dim = d;
    const auto keys = make_codec(ks), values = make_codec(vs);
    ASSERT_EQ(keys->tokens_per_block(), kG);
    ASSERT_EQ(values->tokens_per_block(), 1);
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<float> x = rows_of(rng, size_t(kG) * d, d, 2.f);
      if (trial == 1) std::fill(x.begin() + d, x.begin() + 3 * d, 0.f);  // zero rows: (0, 0) -> (-1, 1) groups
      if (trial == 2)
        for (int t = 0; t < kG; ++t) x[size_t(t) * d + 5] = 0.75f;  // a constant channel (no range)
      if (trial == 3)
        for (float& v : x) v = std::ldexp(v, -20);  // tiny values: fp16-subnormal scales
      // Keys: channel c over the 32 tokens.
      std::vector<uint8_t> kb(keys->bytes_per_block());
      keys->encode(x.data(), kb.data());
      std::vector<float> kh(x.size());
      keys->decode(kb.data(), kh.data());
      const uint8_t* krows = kb.data() + layout::oscar_key_params_bytes(d);
      for (int c = 0; c < d; ++c) {
        std::vector<float> col(kG);
        for (int t = 0; t < kG; ++t) col[size_t(t)] = x[size_t(t) * d + c];
        const RefGroup r = ref_group(col);
        ASSERT_EQ(params_at(kb.data(), c).scale, r.scale) << "d " << d << " trial " << trial << " channel " << c;
        ASSERT_EQ(params_at(kb.data(), c).zero_dequant, r.zero) << "channel " << c;
        for (int t = 0; t < kG; ++t) {
          const uint8_t code = layout::unpack_code(krows + t * (d / 4), c, 2);
          ASSERT_EQ(code, r.codes[size_t(t)]) << "channel " << c << " token " << t;
          ASSERT_EQ(kh[size_t(t) * d + c], float(code) * fp16_to_f32(r.scale) + fp16_to_f32(r.zero));
        }
      }
      // Values: every token row, groups of 32 channels.
      for (int t = 0; t < kG; ++t) {
        std::vector<uint8_t> vb(values->bytes_per_block());
        values->encode(x.data() + size_t(t) * d, vb.data());
        std::vector<float> vh(static_cast<size_t>(d));
        values->decode(vb.data(), vh.data());
        for (int g = 0; g < d / kG; ++g) {
          const std::vector<float> grp(x.begin() + t * d + g * kG, x.begin() + t * d + (g + 1) * kG);
          const RefGroup r = ref_group(grp);
          ASSERT_EQ(params_at(vb.data(), g).scale, r.scale) << "token " << t << " group " << g;
          ASSERT_EQ(params_at(vb.data(), g).zero_dequant, r.zero) << "token " << t << " group " << g;
          for (int i = 0; i < kG; ++i) {
            const uint8_t code = layout::unpack_code(vb.data() + layout::oscar_value_params_bytes(d), g * kG + i, 2);
            ASSERT_EQ(code, r.codes[size_t(i)]) << "token " << t << " value " << g * kG + i;
            ASSERT_EQ(vh[size_t(g * kG + i)], float(code) * fp16_to_f32(r.scale) + fp16_to_f32(r.zero));
          }
        }
      }
    }
  }
}

// Uniform 2-bit rounding with an integer zero point: the grid is shifted by at most half a step, the codes round to
// nearest inside [mn, mx], so every value is within half a step Δ = scale of its dequantized value (plus the fp16
// rounding of the stored scale and zero); for N(0, 1) groups of 32 the NMSE stays below 2.25 / 9 (METHODS §1 budget
// at b = 2 with ranges of 32 normals, ~4.1 wide, ≈ 0.16).
TEST(OscarCodecs, DequantizationErrorWithinHalfAStepAndTheTwoBitBudget) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  const OscarKeyCodec keys(128);
  const OscarValueCodec values(128);
  std::vector<float> x(size_t(kG) * 128);
  for (auto& v : x) v = nd(rng);
  double se_k = 0, se_v = 0, ss = 0;
  std::vector<uint8_t> kb(keys.bytes_per_block()), vb(values.bytes_per_block());
  std::vector<float> kh(x.size()), vh(128);
  keys.encode(x.data(), kb.data());
  keys.decode(kb.data(), kh.data());
  for (int t = 0; t < kG; ++t) {
    values.encode(x.data() + t * 128, vb.data());
    values.decode(vb.data(), vh.data());
    for (int c = 0; c < 128; ++c) {
      const float xv = x[size_t(t) * 128 + c];
      const float step_k = fp16_to_f32(params_at(kb.data(), c).scale);
      const float step_v = fp16_to_f32(params_at(vb.data(), c / kG).scale);
      EXPECT_LE(std::abs(kh[size_t(t) * 128 + c] - xv), 0.5f * step_k * 1.01f + 1e-3f);
      EXPECT_LE(std::abs(vh[size_t(c)] - xv), 0.5f * step_v * 1.01f + 1e-3f);
      se_k += double(kh[size_t(t) * 128 + c] - xv) * (kh[size_t(t) * 128 + c] - xv);
      se_v += double(vh[size_t(c)] - xv) * (vh[size_t(c)] - xv);
      ss += double(xv) * xv;
    }
  }
  EXPECT_LT(se_k / ss, 0.25);
  EXPECT_LT(se_v / ss, 0.25);
  EXPECT_GT(se_k / ss, 0.01);  // it is a 2-bit code
}

TEST(OscarBytes, PerBlockAndPerTokenAsMethods) {
  const OscarKeyCodec k128(128), k64(64);
  const OscarValueCodec v128(128), v64(64);
  EXPECT_EQ(k128.bytes_per_block(), 1536u);  // 32 tokens: 4 d params + 32 d / 4 codes
  EXPECT_EQ(k128.tokens_per_block(), 32);
  EXPECT_EQ(v128.bytes_per_block(), 48u);  // 16 params + 32 codes
  EXPECT_EQ(k64.bytes_per_block(), 768u);
  EXPECT_EQ(v64.bytes_per_block(), 24u);
  EXPECT_DOUBLE_EQ(k128.bits_per_element(), 3.0);
  EXPECT_DOUBLE_EQ(v128.bits_per_element(), 3.0);
  // The cache: K 32 + 16 + 4 / n_kv, V 32 + 16 per (token, kv head): 96.5 B at n_kv = 8 (3.016 bits).
  const CacheConfig cfg = oscar_config(0, 0, 128, 64);
  for (int n_kv : {8, 2}) {
    const CacheLayout l = cache_layout(shaped(cfg, 3, n_kv, 128), 3, n_kv, 128);
    EXPECT_EQ(l.scale_region, 128 * 4);
    EXPECT_EQ(l.page_bytes, 3 * (int64_t(n_kv) * (4 * 1536 + 128 * 48) + 128 * 4));
    const CacheFootprint f = l.footprint(1 << 14);
    const double per_token_head = (48.0 + 4.0 / n_kv) + 48.0;
    EXPECT_DOUBLE_EQ(f.bytes_per_token_per_layer, n_kv * per_token_head);
    EXPECT_DOUBLE_EQ(f.quant_bits_per_element, 8.0 * per_token_head / 256.0);
  }
  EXPECT_DOUBLE_EQ(cache_layout(shaped(cfg, 1, 8, 128), 1, 8, 128).footprint(1 << 14).quant_bits_per_element, 3.015625);  // 96.5 B
  // Without the token scale the page has no scale region (the ablation: OScaR's codecs without ν).
  CacheConfig plain = cfg;
  plain.k.token_scale = false;
  EXPECT_EQ(cache_layout(shaped(plain, 1, 8, 128), 1, 8, 128).scale_region, 0);
  // Keys of 32-token blocks: pages a multiple of 32; values never take the token scale.
  EXPECT_THROW(cache_layout(shaped(oscar_config(0, 0, 48, 64), 1, 2, 128), 1, 2, 128), Error);
  CacheConfig bad = cfg;
  bad.v.token_scale = true;
  EXPECT_THROW(cache_layout(shaped(bad, 1, 2, 128), 1, 2, 128), Error);
}

TEST(OscarTable, TheRowDeclaresItsLayoutScaleAndTransform) {
  const CodecTraits& t = codec_traits("oscar_int2");
  EXPECT_EQ(t.id, CodecId::kOscarInt2);
  EXPECT_EQ(&t, &codec_traits(CodecId::kOscarInt2));
  EXPECT_TRUE(t.per_channel_keys && t.token_scale_keys && fixed_format(t));
  EXPECT_FALSE(t.takes_clip || t.fake_quant);
  EXPECT_EQ(t.transform, CodecTransform::kHadamard);
  const CodecSpec k = codec_spec("oscar_int2", true, 128, 0.f), v = codec_spec("oscar_int2", false, 128, 0.f);
  EXPECT_TRUE(k.per_channel && k.token_scale);
  EXPECT_FALSE(v.per_channel || v.token_scale);
  EXPECT_THROW(codec_spec("oscar_int2", true, 128, 0.9f), Error);  // no clip
  // kvq info --codecs: a key and a value row of 3 bits at each head_dim (ν is counted by the cache: OscarBytes),
  // on the GPU's decoded tiles at head_dim 128 and its CUDA-core path at 64.
  const std::vector<SupportRow> rows = support_matrix({64, 128});
  int found = 0;
  for (const SupportRow& r : rows) {
    if (r.codec != "oscar_int2") continue;
    ++found;
    EXPECT_TRUE(r.cpu);
    EXPECT_EQ(r.group, 0);  // --kv-group does not apply
    EXPECT_DOUBLE_EQ(r.bits, 3.0);
    EXPECT_DOUBLE_EQ(r.bytes_per_token, r.head_dim * 3 / 8.0);
    EXPECT_EQ(r.cuda, r.head_dim == 128 ? "decoded-tile" : "CUDA-core") << r.role << " d " << r.head_dim;
  }
  EXPECT_EQ(found, 4);  // k and v at 64 and 128
}

namespace {

// Appends n tokens of keys k and values v ([n, n_kv, d]) in chunks of `chunk`.
void fill(KvCache& cache, int seq, const std::vector<float>& k, const std::vector<float>& v, int n, int chunk) {
  const int row = cache.n_kv_heads() * cache.head_dim();
  for (int p = 0; p < n; p += chunk) {
    const int m = std::min(chunk, n - p);
    cache.reserve(seq, m);
    cache.append(seq, 0, p, m, k.data() + size_t(p) * row, v.data() + size_t(p) * row);
    cache.commit(seq, m);
  }
}

// ν of every quantized position of the query at t's view, from the runs' scale pointers (position -> ν).
std::vector<float> stored_scales(const KvCache& cache, int seq, int t) {
  std::vector<KvCache::Run> runs;
  cache.runs(seq, 0, 0, t, t, runs);
  std::vector<float> nu(size_t(t) + 1, NAN);
  for (const auto& r : runs) {
    if (r.kind != KvCache::RunKind::Quant) {
      EXPECT_EQ(r.scale, nullptr);
      continue;
    }
    EXPECT_NE(r.scale, nullptr);
    for (int i = 0; i < r.n; ++i) nu[size_t(r.pos0 + i)] = r.scale[i];
  }
  return nu;
}

}  // namespace

// Two kv heads of d = 64: token t's keys are 3 (t + 1) on channel 0 of head 0 and 4 (t + 1) on channel 1 of head 1,
// zero elsewhere, so ν_t = 5 (t + 1) (the norm over BOTH heads; one head alone would give 3 (t + 1) or 4 (t + 1)).
// Token 7's keys are all zero (ν = 0 -> 1) and token 9's hold a NaN (-> 1). The stored key blocks are the codec's
// encoding of the rows divided by ν.
TEST(OscarTokenScale, NuIsTheNormOverAllKvHeadsStoredOncePerTokenAndLayer) {
  const int n_kv = 2, d = 64, n = 70;
  KvCache cache(shaped(oscar_config(4, 0, 32, 16), 1, n_kv, d), 1, n_kv, d, n);
  std::vector<float> k(size_t(n) * n_kv * d, 0.f), v(k.size(), 0.25f);
  for (int t = 0; t < n; ++t) {
    k[(size_t(t) * n_kv + 0) * d + 0] = 3.f * float(t + 1);
    k[(size_t(t) * n_kv + 1) * d + 1] = 4.f * float(t + 1);
  }
  for (int h = 0; h < n_kv; ++h) std::fill_n(k.begin() + (size_t(7) * n_kv + h) * d, d, 0.f);
  k[(size_t(9) * n_kv + 1) * d + 3] = NAN;
  const int seq = cache.new_sequence();
  fill(cache, seq, k, v, n, 16);
  // Sinks [0, 4), blocks [4, 36) and [36, 68) quantized (no recent window), [68, 70) still in the ring.
  ASSERT_EQ(cache.quant_end(n - 1), 68);
  const std::vector<float> nu = stored_scales(cache, seq, n - 1);
  for (int t = 0; t < n; ++t) {
    if (t < 4 || t >= 68) {
      EXPECT_TRUE(std::isnan(nu[size_t(t)])) << "position " << t << " is not in the quantized region";
      continue;
    }
    const float want = t == 7 || t == 9 ? 1.f : 5.f * float(t + 1);  // 3-4-5, exact in fp32 (and in bf16 rows)
    EXPECT_EQ(nu[size_t(t)], want) << "position " << t;
  }
  // The first key block (positions 4 .. 35) of head 0 is the codec's encoding of the window rows divided by ν.
  std::vector<KvCache::Run> runs;
  cache.runs(seq, 0, 0, n - 1, n - 1, runs);
  const KvCache::Run* quant = nullptr;
  for (const auto& r : runs)
    if (r.kind == KvCache::RunKind::Quant && !quant) quant = &r;
  ASSERT_NE(quant, nullptr);
  ASSERT_EQ(quant->pos0, 4);
  std::vector<float> rows(size_t(kG) * d);
  for (int i = 0; i < kG; ++i)
    for (int c = 0; c < d; ++c) {
      const float x = bf16_to_f32(f32_to_bf16(k[(size_t(4 + i) * n_kv + 0) * d + c]));
      rows[size_t(i) * d + c] = x / nu[size_t(4 + i)];
    }
  std::vector<uint8_t> want(cache.k_codec().bytes_per_block());
  cache.k_codec().encode(rows.data(), want.data());
  EXPECT_EQ(std::memcmp(quant->k, want.data(), want.size()), 0);
  EXPECT_EQ(token_scale(0.f), 1.f);
  EXPECT_EQ(token_scale(NAN), 1.f);
  EXPECT_EQ(token_scale(-0.f), 1.f);
  EXPECT_EQ(token_scale(25.f), 5.f);
}

// With lossless rows (f32 codecs and f32 windows, the real cache and attention), a cache that divides the keys by ν
// and multiplies the scores by it gives the same attention as one that does not, to float rounding (scores of O(1):
// a few ulp each); and the stored rows really are divided (ν != 1).
TEST(OscarTokenScale, DividingAndMultiplyingBackLeavesLosslessAttentionUnchanged) {
  const int n_kv = 2, hq = 6, d = 64, n = 300, chunk = 50;
  for (auto [sink, recent] : {std::pair{0, 0}, {4, 32}}) {
    CacheConfig plain;
    plain.k.type = plain.v.type = plain.window = "f32";
    plain.sink = sink, plain.recent = recent, plain.page_tokens = 32, plain.max_chunk = chunk;
    CacheConfig scaled = plain;
    scaled.k.token_scale = true;
    KvCache a(plain, 1, n_kv, d, n), b(scaled, 1, n_kv, d, n);
    ASSERT_EQ(b.layout().scale_region, 32 * 4);
    std::mt19937 rng(17);
    std::normal_distribution<float> nd(0.f, 1.f);
    const auto normal = [&](size_t m, float sd) {
      std::vector<float> x(m);
      for (auto& e : x) e = sd * nd(rng);
      return x;
    };
    ThreadPool pool(2);
    const int sa = a.new_sequence(), sb = b.new_sequence();
    double worst = 0;
    for (int p = 0; p < n; p += chunk) {
      const auto k = normal(size_t(chunk) * n_kv * d, 1.f), v = normal(size_t(chunk) * n_kv * d, 1.f);
      const auto q = normal(size_t(chunk) * hq * d, 1.5f / std::sqrt(float(d)));
      for (KvCache* c : {&a, &b}) {
        const int s = c == &a ? sa : sb;
        c->reserve(s, chunk);
        c->append(s, 0, p, chunk, k.data(), v.data());
        c->commit(s, chunk);
      }
      std::vector<float> oa(q.size()), ob(q.size());
      cache_attention(a, sa, 0, p, chunk, q.data(), oa.data(), AttentionShape{hq, n_kv, d}, pool);
      cache_attention(b, sb, 0, p, chunk, q.data(), ob.data(), AttentionShape{hq, n_kv, d}, pool);
      for (size_t i = 0; i < oa.size(); ++i) worst = std::max(worst, double(std::abs(oa[i] - ob[i])));
    }
    EXPECT_LE(worst, 1e-6) << "sink " << sink << " recent " << recent;
    // Teeth: the token-scaled cache stores k / ν with ν far from 1 (norms of 2 x 64 values of N(0, 1): ~11).
    const std::vector<float> nu = stored_scales(b, sb, n - 1);
    EXPECT_GT(nu[size_t(sink)], 5.f);
    std::vector<KvCache::Run> ra, rb;
    a.runs(sa, 0, 0, n - 1, n - 1, ra);
    b.runs(sb, 0, 0, n - 1, n - 1, rb);
    const size_t qa = sink > 0 ? 1 : 0;  // the first Quant run
    ASSERT_EQ(ra[qa].kind, KvCache::RunKind::Quant);
    const float* ka = reinterpret_cast<const float*>(ra[qa].k);
    const float* kb = reinterpret_cast<const float*>(rb[qa].k);
    for (int c = 0; c < d; ++c) EXPECT_EQ(kb[c], ka[c] / nu[size_t(sink)]) << "channel " << c;
  }
}

// The cache's view (stored rows decoded and multiplied by the stored ν) equals the attention reference's rows
// (attention/attention_ref.h) bit for bit, over chunks and windows, including a sink that does not align the key
// groups to multiples of 32 and key groups that are not yet full (read exactly from the window).
TEST(OscarCache, ViewRowsTimesNuEqualTheReferenceBitForBit) {
  const int n_kv = 2, d = 64;
  for (auto [sink, recent] : {std::pair{0, 0}, {4, 16}, {64, 256}})
    for (int chunk : {7, 300}) {
      const int n = sink + recent + 200;
      const CacheConfig cfg = shaped(oscar_config(sink, recent, 64, chunk), 1, n_kv, d);
      KvCache cache(cfg, 1, n_kv, d, n);
      ReferenceKv ref(cfg, n_kv, d);
      ASSERT_EQ(cache.block_tokens(), 32);
      std::mt19937 rng{uint32_t(sink + recent + chunk)};
      const int seq = cache.new_sequence();
      for (int p = 0; p < n; p += chunk) {
        const int m = std::min(chunk, n - p);
        const auto k = rows_of(rng, size_t(m) * n_kv * d, d, 2.f), v = rows_of(rng, size_t(m) * n_kv * d, d);
        cache.reserve(seq, m);
        cache.append(seq, 0, p, m, k.data(), v.data());
        cache.commit(seq, m);
        ref.append(m, k.data(), v.data());
        const int t = p + m - 1;
        ASSERT_EQ(cache.quant_end(t), ref.quant_end(t));
        // A group is demoted only whole: [S0, qe) is a whole number of 32-token blocks.
        ASSERT_EQ((cache.quant_end(t) - sink) % 32, 0);
        for (int h = 0; h < n_kv; ++h) {
          std::vector<KvCache::Run> runs;
          cache.runs(seq, 0, h, t, t, runs);
          for (const auto& r : runs) {
            const bool quant = r.kind == KvCache::RunKind::Quant;
            const KvCodec& kc = quant ? cache.k_codec() : cache.window_codec();
            const KvCodec& vc = quant ? cache.v_codec() : cache.window_codec();
            std::vector<float> kr(size_t(kc.tokens_per_block()) * d), vr(static_cast<size_t>(d));
            for (int i = 0; i < r.n; ++i) {
              const int pos = r.pos0 + i;
              if (i % kc.tokens_per_block() == 0)
                kc.decode(r.k + size_t(i / kc.tokens_per_block()) * kc.bytes_per_block(), kr.data());
              vc.decode(r.v + size_t(i) * vc.bytes_per_block(), vr.data());
              const float* krow = kr.data() + size_t(i % kc.tokens_per_block()) * d;
              for (int c = 0; c < d; ++c) {
                const float key = quant ? krow[c] * r.scale[i] : krow[c];
                ASSERT_EQ(key, ref.key(t, pos, h)[c]) << "sink " << sink << " chunk " << chunk << " pos " << pos;
                ASSERT_EQ(vr[size_t(c)], ref.value(t, pos, h)[c]) << "pos " << pos;
              }
            }
          }
        }
      }
    }
}

// OScaR as shipped (METHODS §5.4): no sinks, no recent window, a demotion block of 256, so that a query at t reads
// positions below floor((t + 1) / 256) · 256 through the codecs and the rest (the newest (t + 1) mod 256, OScaR's FP16
// residual) exactly. Each view row is checked against an expectation built without B = 256: the bf16 row itself for
// the residual, and for a quantized position the codec round trip of the reference at the codecs' own block (B = 32:
// the same 32-token key groups, ν per token, whatever B). Then the attention of every query of each chunk against the
// reference at B = 256, over chunks that straddle the 256-token boundaries, on pages of 128 (a block spans two).
TEST(OscarCache, DemotionBlockOf256ReadsTheCodecsBelowFloorOfTPlusOneOver256AndTheRestExactly) {
  const int n_kv = 2, hq = 4, d = 64, n = 700;
  ThreadPool pool(2);
  for (int chunk : {100, 256, 37}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    CacheConfig cfg = shaped(oscar_config(0, 0, 128, chunk), 1, n_kv, d);
    cfg.demote_block = 256;
    CacheConfig own = cfg;
    own.demote_block = 0;
    KvCache cache(cfg, 1, n_kv, d, n);
    ReferenceKv ref(cfg, n_kv, d), ref32(own, n_kv, d);
    ASSERT_EQ(cache.block_tokens(), 256);
    ASSERT_EQ(ref32.block_tokens(), 32);
    std::mt19937 rng{uint32_t(chunk)};
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> all_k, all_v;  // [n][n_kv][d] as appended
    const int seq = cache.new_sequence();
    int64_t quantized_rows = 0, residual_rows = 0, differs_from_own_block = 0;
    double worst = 0;
    for (int p = 0; p < n; p += chunk) {
      const int m = std::min(chunk, n - p);
      // Gaussian rows with a per-channel key offset (no outliers: on heavy tails the fast kernels' int16 rounding on
      // AVX-512 VNNI reaches ~1e-5 NMSE at any B, which would hide nothing here but exceed the 1e-6 budget)
      std::vector<float> k(size_t(m) * n_kv * d), v(k.size());
      for (size_t i = 0; i < k.size(); ++i) k[i] = nd(rng) + 2.f * float(int(i % size_t(d)) % 5 - 2), v[i] = nd(rng);
      all_k.insert(all_k.end(), k.begin(), k.end());
      all_v.insert(all_v.end(), v.begin(), v.end());
      cache.reserve(seq, m);
      cache.append(seq, 0, p, m, k.data(), v.data());
      cache.commit(seq, m);
      ref.append(m, k.data(), v.data());
      ref32.append(m, k.data(), v.data());
      // The view rows of queries at the chunk's ends, its middle and either side of each 256-token boundary in it.
      std::vector<int> ts = {p, p + m / 2, p + m - 1};
      for (int b = 255; b < n; b += 256)
        if (b >= p && b < p + m) ts.insert(ts.end(), {b - 1, b, std::min(b + 1, p + m - 1)});
      for (int t : ts) {
        if (t < p) continue;
        const int qe = (t + 1) / 256 * 256;
        ASSERT_EQ(cache.quant_end(t), qe) << "t " << t;
        for (int h = 0; h < n_kv; ++h) {
          std::vector<KvCache::Run> runs;
          cache.runs(seq, 0, h, t, t, runs);
          int covered = 0;
          for (const auto& r : runs) {
            const bool quant = r.kind == KvCache::RunKind::Quant;
            ASSERT_EQ(quant, r.pos0 < qe) << "t " << t << " run at " << r.pos0;
            const KvCodec& kc = quant ? cache.k_codec() : cache.window_codec();
            const KvCodec& vc = quant ? cache.v_codec() : cache.window_codec();
            std::vector<float> kr(size_t(kc.tokens_per_block()) * d), vr(static_cast<size_t>(d));
            for (int i = 0; i < r.n && r.pos0 + i <= t; ++i) {
              const int pos = r.pos0 + i;
              ASSERT_EQ(pos, covered++) << "t " << t;
              if (i % kc.tokens_per_block() == 0)
                kc.decode(r.k + size_t(i / kc.tokens_per_block()) * kc.bytes_per_block(), kr.data());
              vc.decode(r.v + size_t(i) * vc.bytes_per_block(), vr.data());
              const float* krow = kr.data() + size_t(i % kc.tokens_per_block()) * d;
              const size_t at = (size_t(pos) * n_kv + h) * d;
              bool own_quantized = false;  // at B = 32 this position would be read through the codecs already
              for (int c = 0; c < d; ++c) {
                const float key = quant ? krow[c] * r.scale[i] : krow[c];
                if (quant) {
                  // ref32 at t reads pos quantized (pos < qe(t) <= qe32(t)): the 32-token groups' round trip
                  ASSERT_EQ(key, ref32.key(t, pos, h)[c]) << "t " << t << " pos " << pos << " c " << c;
                  ASSERT_EQ(vr[size_t(c)], ref32.value(t, pos, h)[c]) << "t " << t << " pos " << pos;
                } else {
                  ASSERT_EQ(key, bf16_to_f32(f32_to_bf16(all_k[at + size_t(c)]))) << "t " << t << " pos " << pos;
                  ASSERT_EQ(vr[size_t(c)], bf16_to_f32(f32_to_bf16(all_v[at + size_t(c)]))) << "pos " << pos;
                  own_quantized = own_quantized || ref32.key(t, pos, h)[c] != key;
                }
              }
              quantized_rows += quant;
              residual_rows += !quant;
              differs_from_own_block += own_quantized;
            }
          }
          ASSERT_EQ(covered, t + 1) << "t " << t << ": the view covers [0, t]";
        }
      }
      // Every query of the chunk, through the fast attention, against the reference at B = 256.
      std::vector<float> q(size_t(m) * hq * d), out(q.size());
      for (auto& x : q) x = 2.f * nd(rng) / std::sqrt(float(d));
      cache_attention(cache, seq, 0, p, m, q.data(), out.data(), AttentionShape{hq, n_kv, d}, pool);
      std::vector<double> expect(size_t(hq) * d);
      for (int i = 0; i < m; ++i) {
        ref.attend(p + i, q.data() + size_t(i) * hq * d, hq, expect.data());
        double num = 0, den = 0;
        for (size_t j = 0; j < expect.size(); ++j) {
          const double e = out[size_t(i) * hq * d + j] - expect[j];
          num += e * e, den += expect[j] * expect[j];
        }
        worst = std::max(worst, num / den);
      }
    }
    EXPECT_LE(worst, 1e-6);
    // Teeth: both regions were read, and the residual really is exact where B = 32 would have quantized it.
    EXPECT_GT(quantized_rows, 0);
    EXPECT_GT(residual_rows, 0);
    EXPECT_GT(differs_from_own_block, 0);
  }
}

// End to end on models/ref (Qwen3, 2 kv heads, head_dim 128): OScaR with its Hadamard transform and no windows
// degrades perplexity against bf16 (the cache is really read), by less than plain int2 does.
TEST(OscarPerplexity, ReadsTheCacheAndDegradesLessThanInt2WithoutWindows) {
  const std::unique_ptr<Model> model = Model::load(std::string(KVQ_SOURCE_DIR) + "/models/ref", 2);
  const Tokenizer tok = Tokenizer::load(std::string(KVQ_SOURCE_DIR) + "/models/ref/tokenizer.json");
  std::ifstream f(std::string(KVQ_SOURCE_DIR) + "/data/eval/linux.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<int32_t> ids = tok.encode(ss.str().substr(0, 8000));
  ids.resize(std::min<size_t>(ids.size(), 256));
  ASSERT_EQ(ids.size(), 256u);
  const ModelConfig& mc = model->config();
  CacheConfig bf16;
  bf16.k.type = bf16.v.type = "bf16";
  bf16.sink = bf16.recent = 0;
  CacheConfig oscar = oscar_config(0, 0, 128, 256);
  oscar.transform = std::make_shared<KvTransform>(hadamard_transform(mc.n_layers, mc.n_kv_heads, mc.head_dim));
  CacheConfig int2 = bf16;
  int2.k = codec_spec("int2", true, 128, 0.f), int2.v = codec_spec("int2", false, 128, 0.f);
  const double p_bf16 = perplexity(*model, bf16, ids, 256, 1).ppl();
  const double p_oscar = perplexity(*model, oscar, ids, 256, 1).ppl();
  const double p_int2 = perplexity(*model, int2, ids, 256, 1).ppl();
  std::printf("ppl models/ref linux 256, no windows: bf16 %.4f oscar_int2 %.4f int2 %.4f\n", p_bf16, p_oscar, p_int2);
  EXPECT_GT(p_oscar / p_bf16, 1.005);
  EXPECT_LT(p_oscar, p_int2);
}
