// KV codecs: stored codes bit-exact vs quantize_group, dequantization error within the bit-width budget,
// degenerate groups, fast scores/accumulate vs the scalar references at every SIMD level, bits accounting,
// and make_codec's errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codecs/codec.h"
#include "codecs/group_quant.h"
#include "codecs/layout.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "common/half.h"
#include "simd/simd.h"
#include "test_helpers.h"

using namespace kvq;

namespace kvq {
// gtest prints a failing parameter with this instead of its bytes.
void PrintTo(const CodecSpec& s, std::ostream* os) {
  *os << s.type << " head_dim " << s.head_dim << " group " << s.group << " clip " << s.clip
      << (s.per_channel ? " per_channel" : "");
}
}  // namespace kvq

namespace {

enum class Dist { kGaussian, kStudentT3, kOutliers };

// n values: N(0,1); Student-t with 3 degrees of freedom; or N(0,1) with 1% of values ×20.
std::vector<float> sample(Dist dist, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::student_t_distribution<float> student(3.f);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  std::vector<float> x(n);
  for (auto& v : x) {
    if (dist == Dist::kStudentT3) {
      v = student(rng);
    } else {
      v = normal(rng);
      if (dist == Dist::kOutliers && u01(rng) < 0.01f) v *= 20.f;
    }
  }
  return x;
}

std::vector<float> uniform(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (auto& v : x) v = u(rng);
  return x;
}

int spec_bits(const CodecSpec& s) { return codec_traits(s.type).code_bits; }

std::string spec_name(const CodecSpec& s) {
  std::string n = s.type + "_d" + std::to_string(s.head_dim);
  if (codec_traits(s.type).grouped) n += "_G" + std::to_string(s.group);
  if (s.per_channel) n += "_keys";
  if (s.clip < 1.f) n += "_clip" + std::to_string(int(std::lround(s.clip * 100)));
  return n;
}

CodecSpec spec(std::string type, int d, int group, float clip = 1.f, bool per_channel = false) {
  CodecSpec s;
  s.type = std::move(type);
  s.head_dim = d;
  s.group = group;
  s.clip = clip;
  s.per_channel = per_channel;
  return test::with_test_widths(s, 1, 1);  // PN-Mix keys: a test table of widths
}

// Encode n_blocks blocks of `x` ([n_blocks · tokens_per_block, d]) back to back.
std::vector<uint8_t> encode_all(const KvCodec& codec, const std::vector<float>& x, int n_blocks) {
  const int d = codec.head_dim(), tpb = codec.tokens_per_block();
  std::vector<uint8_t> blocks(size_t(n_blocks) * codec.bytes_per_block());
  for (int b = 0; b < n_blocks; ++b)
    codec.encode(&x[size_t(b) * tpb * d], &blocks[size_t(b) * codec.bytes_per_block()]);
  return blocks;
}

std::vector<float> decode_all(const KvCodec& codec, const std::vector<uint8_t>& blocks, int n_blocks) {
  const int d = codec.head_dim(), tpb = codec.tokens_per_block();
  std::vector<float> x(size_t(n_blocks) * tpb * d);
  for (int b = 0; b < n_blocks; ++b)
    codec.decode(&blocks[size_t(b) * codec.bytes_per_block()], &x[size_t(b) * tpb * d]);
  return x;
}

// Every quantized codec of the codec table at every group (KIVI: its per-channel keys too), then awkward shapes.
std::vector<CodecSpec> quantized_specs() {
  std::vector<CodecSpec> v;
  for (const CodecTraits& t : codec_table())
    for (int g : kGroups) {
      if (!t.grouped) continue;
      v.push_back(spec(std::string(t.name), 128, g));
      if (t.per_channel_keys) v.push_back(spec(std::string(t.name), 128, g, 1.f, true));
    }
  v.push_back(spec("int2", 128, 128, 0.96f));
  v.push_back(spec("int2", 128, 32, 0.92f));
  v.push_back(spec("int4", 256, 128, 0.96f));
  v.push_back(spec("int2", 96, 32));
  v.push_back(spec("int8", 64, 64, 0.96f));
  v.push_back(spec("kivi2", 64, 32, 1.f, true));
  v.push_back(spec("kivi4", 256, 128, 1.f, true));
  return v;
}

// The quantized specs, and every codec of the table without --kv-group groups (unquantized rows, and the formats
// with their own groups: OScaR, keys too) at several head_dims (the powers of two for a codec that needs one).
std::vector<CodecSpec> all_specs() {
  std::vector<CodecSpec> v = quantized_specs();
  for (const CodecTraits& t : codec_table())
    if (!t.grouped)
      for (int d : {64, 96, 128, 256}) {
        if (t.pow2_head_dim && (d & (d - 1)) != 0) continue;
        v.push_back(spec(std::string(t.name), d, 128));
        if (t.per_channel_keys) v.push_back(spec(std::string(t.name), d, 128, 1.f, true));
      }
  // The unquantized rows take head dims of 32 k + 16 (a scalar tail after the row kernels' units): 80 is StableLM's.
  for (const CodecTraits& t : codec_table())
    if (t.head_dim_unit == 16)
      for (int d : {16, 48, 80, 112}) v.push_back(spec(std::string(t.name), d, 128));
  return v;
}

// One row's stored GroupParams.
layout::GroupParams params_at(const uint8_t* base, int g) {
  layout::GroupParams gp;
  std::memcpy(&gp, base + 4 * g, 4);
  return gp;
}

class QuantizedCodec : public ::testing::TestWithParam<CodecSpec> {};
class AnyCodec : public ::testing::TestWithParam<CodecSpec> {};
class PlainMinMaxCodec : public ::testing::TestWithParam<CodecSpec> {};  // clip 1: the NMSE budget's premise

std::vector<CodecSpec> plain_min_max_specs() {
  std::vector<CodecSpec> v;
  for (const CodecSpec& s : quantized_specs())
    if (s.clip == 1.f) v.push_back(s);
  return v;
}

}  // namespace

TEST(Layout, UnitPackingPutsValueJPlus8KInByteJBitsTwoK) {
  uint8_t codes[64], packed[16];
  for (int v = 0; v < 64; ++v) codes[v] = uint8_t((v * 7 + 1) & 3);
  layout::pack_codes(codes, 64, 2, packed);
  for (int u = 0; u < 2; ++u)
    for (int j = 0; j < 8; ++j) {
      uint8_t want = 0;
      for (int k = 0; k < 4; ++k) want |= uint8_t(codes[32 * u + j + 8 * k] << (2 * k));
      EXPECT_EQ(packed[8 * u + j], want) << "unit " << u << " byte " << j;
    }
  for (int v = 0; v < 64; ++v) EXPECT_EQ(layout::unpack_code(packed, v, 2), codes[v]);
  uint8_t codes4[32], packed4[16];
  for (int v = 0; v < 32; ++v) codes4[v] = uint8_t((v * 5 + 3) & 15);
  layout::pack_codes(codes4, 32, 4, packed4);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(packed4[j], uint8_t(codes4[j] | (codes4[j + 16] << 4)));
}

TEST(Codecs, BitsPerElementFollowTheStoredBytes) {
  EXPECT_DOUBLE_EQ(make_codec(spec("int2", 128, 128))->bits_per_element(), 2.25);
  EXPECT_DOUBLE_EQ(make_codec(spec("int2", 128, 64))->bits_per_element(), 2.5);
  EXPECT_DOUBLE_EQ(make_codec(spec("int2", 128, 32))->bits_per_element(), 3.0);
  EXPECT_DOUBLE_EQ(make_codec(spec("int4", 128, 128))->bits_per_element(), 4.25);
  EXPECT_DOUBLE_EQ(make_codec(spec("int8", 128, 128))->bits_per_element(), 8.25);
  EXPECT_DOUBLE_EQ(make_codec(spec("kivi2", 128, 128, 1.f, true))->bits_per_element(), 2.25);
  EXPECT_DOUBLE_EQ(make_codec(spec("kivi2", 128, 32, 1.f, true))->bits_per_element(), 3.0);
  EXPECT_DOUBLE_EQ(make_codec(spec("kivi4", 128, 64, 1.f, true))->bits_per_element(), 4.5);
  EXPECT_DOUBLE_EQ(make_codec(spec("kivi2", 128, 128))->bits_per_element(), 2.25);  // values: per-token rows
  EXPECT_DOUBLE_EQ(make_codec(spec("bf16", 128, 128))->bits_per_element(), 16.0);
  EXPECT_EQ(make_codec(spec("int2", 128, 128))->bytes_per_block(), 36u);
  EXPECT_EQ(make_codec(spec("kivi2", 128, 128, 1.f, true))->tokens_per_block(), 128);
  EXPECT_EQ(make_codec(spec("kivi2", 128, 128))->name(), "kivi2");
}

TEST_P(QuantizedCodec, StoredCodesAndParamsEqualQuantizeGroupBitForBit) {
  const CodecSpec s = GetParam();
  const auto codec = make_codec(s);
  const int d = s.head_dim, bits = spec_bits(s), tpb = codec->tokens_per_block();
  for (Dist dist : {Dist::kGaussian, Dist::kOutliers}) {
    const int n_blocks = 3;
    const std::vector<float> x = sample(dist, size_t(n_blocks) * tpb * d, 11);
    const std::vector<uint8_t> blocks = encode_all(*codec, x, n_blocks);
    const std::vector<float> xh = decode_all(*codec, blocks, n_blocks);
    for (int b = 0; b < n_blocks; ++b) {
      const uint8_t* block = &blocks[size_t(b) * codec->bytes_per_block()];
      const float* xb = &x[size_t(b) * tpb * d];
      const float* xhb = &xh[size_t(b) * tpb * d];
      if (!s.per_channel) {  // one row, d / G groups
        const uint8_t* packed = block + layout::int_row_params_bytes(d, s.group);
        for (int g = 0; g < d / s.group; ++g) {
          uint8_t want[256];
          const GroupQuant gq = quantize_group(xb + g * s.group, s.group, bits, s.clip, want);
          const layout::GroupParams gp = params_at(block, g);
          ASSERT_EQ(gp.scale, gq.scale) << "group " << g;
          ASSERT_EQ(gp.zero, gq.zero) << "group " << g;
          for (int c = g * s.group; c < (g + 1) * s.group; ++c) {
            ASSERT_EQ(layout::unpack_code(packed, c, bits), want[c - g * s.group]) << "value " << c;
            ASSERT_EQ(xhb[c], dequant_value(want[c - g * s.group], gq.scale, gq.zero)) << "value " << c;
          }
        }
      } else {  // G tokens, one group per channel
        const uint8_t* rows = block + layout::kivi_key_params_bytes(d);
        for (int c = 0; c < d; ++c) {
          float col[128];
          uint8_t want[128];
          for (int t = 0; t < tpb; ++t) col[t] = xb[size_t(t) * d + c];
          const GroupQuant gq = quantize_group(col, tpb, bits, s.clip, want);
          const layout::GroupParams gp = params_at(block, c);
          ASSERT_EQ(gp.scale, gq.scale) << "channel " << c;
          ASSERT_EQ(gp.zero, gq.zero) << "channel " << c;
          for (int t = 0; t < tpb; ++t) {
            ASSERT_EQ(layout::unpack_code(rows + size_t(t) * layout::packed_bytes(d, bits), c, bits), want[t]);
            ASSERT_EQ(xhb[size_t(t) * d + c], dequant_value(want[t], gq.scale, gq.zero));
          }
        }
      }
    }
  }
}

// Budget. Uniform b-bit rounding of a group with range R has step Δ = R / (2^b - 1) and error variance
// Δ²/12. For N(0,1) groups of G <= 128 values the expected range is <= 2·2.6 = 5.2 (mean max of 128
// normals ≈ 2.6), so NMSE ≈ 5.2² / (12 (2^b - 1)²) = 2.25 / (2^b - 1)²: 0.25 (b=2), 0.010 (b=4),
// 3.5e-5 (b=8). Budget: 1.3× that (the empirical range fluctuates), i.e. 2.93 / (2^b - 1)², for clip 1.
// For any data and clip 1 the per-element error is at most Δ/2 (round to nearest inside [min, max]);
// heavy-tailed groups are held to MSE <= Δ²/4 per element, and to mean-square error <= 1.3 mean(Δ²)/12
// when b >= 4 (enough levels that the rounding error is uniform).
TEST_P(PlainMinMaxCodec, DequantNmseWithinBitWidthBudget) {
  const CodecSpec s = GetParam();
  const auto codec = make_codec(s);
  const int d = s.head_dim, bits = spec_bits(s), tpb = codec->tokens_per_block();
  const int n_blocks = std::max(1, 4096 / (tpb * d)) * 8;
  const double levels = double((1 << bits) - 1);
  for (Dist dist : {Dist::kGaussian, Dist::kStudentT3, Dist::kOutliers}) {
    const std::vector<float> x = sample(dist, size_t(n_blocks) * tpb * d, 5 + int(dist));
    const std::vector<uint8_t> blocks = encode_all(*codec, x, n_blocks);
    const std::vector<float> xh = decode_all(*codec, blocks, n_blocks);
    double se = 0, ss = 0, delta2 = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      se += double(x[i] - xh[i]) * (x[i] - xh[i]);
      ss += double(x[i]) * x[i];
    }
    // mean Δ² over values: every group's scale weighted by its number of values
    size_t n_groups = 0;
    for (int b = 0; b < n_blocks; ++b) {
      const uint8_t* block = &blocks[size_t(b) * codec->bytes_per_block()];
      const int ng = s.per_channel ? d : d / s.group;
      for (int g = 0; g < ng; ++g, ++n_groups) {
        const double sc = fp16_to_f32(params_at(block, g).scale);
        delta2 += sc * sc;
      }
    }
    delta2 /= double(n_groups);
    const double mse = se / double(x.size()), nmse = se / ss;
    SCOPED_TRACE("dist " + std::to_string(int(dist)) + " nmse " + std::to_string(nmse));
    if (dist == Dist::kGaussian) {
      EXPECT_LE(nmse, 2.93 / (levels * levels));
    }
    EXPECT_LE(mse, delta2 / 4 * 1.0001);
    if (bits >= 4) {
      EXPECT_LE(mse, 1.3 * delta2 / 12);
    }
    EXPECT_GT(nmse, 0.0);
  }
}

TEST_P(QuantizedCodec, DegenerateGroupsRoundTrip) {
  const CodecSpec s = GetParam();
  const auto codec = make_codec(s);
  const int d = s.head_dim, tpb = codec->tokens_per_block(), bits = spec_bits(s);
  const size_t n = size_t(tpb) * d;
  std::vector<uint8_t> block(codec->bytes_per_block());
  std::vector<float> xh(n);
  for (float c : {0.f, 0.375f, -2.5f, 1024.f}) {  // constant groups of fp16-representable values: exact
    const std::vector<float> x(n, c);
    codec->encode(x.data(), block.data());
    codec->decode(block.data(), xh.data());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(xh[i], c) << "constant " << c << " at " << i;
  }
  if (s.clip == 1.f) {  // one outlier among zeros: zeros stay exact, the outlier within half a step
    std::vector<float> x(n, 0.f);
    x[n / 3] = 100.f;
    codec->encode(x.data(), block.data());
    codec->decode(block.data(), xh.data());
    const float step = 100.f / float((1 << bits) - 1);
    for (size_t i = 0; i < n; ++i) {
      if (i == n / 3) {
        EXPECT_NEAR(xh[i], 100.f, step / 2 + 0.1f);
      } else {
        ASSERT_EQ(xh[i], 0.f) << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, QuantizedCodec, ::testing::ValuesIn(quantized_specs()),
                         [](const auto& info) { return spec_name(info.param); });
INSTANTIATE_TEST_SUITE_P(Specs, PlainMinMaxCodec, ::testing::ValuesIn(plain_min_max_specs()),
                         [](const auto& info) { return spec_name(info.param); });

TEST(Codecs, Bf16DecodeIsRoundToNearestEven) {
  const auto codec = make_codec(spec("bf16", 64, 128));
  const std::vector<float> x = sample(Dist::kStudentT3, 64, 3);
  std::vector<uint8_t> block(codec->bytes_per_block());
  std::vector<float> xh(64);
  codec->encode(x.data(), block.data());
  codec->decode(block.data(), xh.data());
  for (int c = 0; c < 64; ++c) EXPECT_EQ(xh[c], bf16_to_f32(f32_to_bf16(x[c])));
}

// Fast scores/accumulate at every SIMD level this CPU supports vs the scalar references built on decode.
// Both compute the same sum in a different order (the fast path folds scale and zero out of the inner
// loop), so they agree to float rounding: |fast - ref| <= 2e-6 · B, where B bounds the sum of the
// magnitudes of the terms: Σ_c |q_c| · 3·max|x| (|code·scale| <= range <= 2 max|x|, |zero·scale| <= max|x|).
// The VNNI level also rounds q (scores) and p·scale (accumulate) to int16: 1e-5 · B. For int2 rows of one
// 128-value group it rounds them to int8 (step = max|operand| / 127, so each rounded element is off by at most
// max / 254): the bound adds (max_c |q_c| / 254) · Σ_c |x̂_tc| for scores and (max_t |w_t| / 254) · Σ_t |code_tc −
// zero_t| for accumulate (w = p · scale), the exact worst case of that rounding.
TEST_P(AnyCodec, FastScoresAndAccumulateMatchScalarReferenceAtEverySimdLevel) {
  const CodecSpec s = GetParam();
  const int d = s.head_dim;
  const auto ref_codec = make_codec_at(s, SimdLevel::kScalar);
  const int tpb = ref_codec->tokens_per_block();
  std::vector<int> token_counts = {0, 1, 63, 64, 65, 257, 1000};
  if (tpb > 1) token_counts = {0, tpb, 2 * tpb, 3 * tpb, 9 * tpb};
  const int max_tokens = token_counts.back();
  const std::vector<float> x = sample(Dist::kOutliers, size_t(max_tokens) * d, 21);
  float max_abs = 0.f;
  for (float v : x) max_abs = std::max(max_abs, std::fabs(v));
  const std::vector<uint8_t> blocks = encode_all(*ref_codec, x, max_tokens / tpb);
  // x̂ and, for the int8 path's bound, |code − zero| = |x̂| / scale per token and channel.
  std::vector<float> xh(size_t(max_tokens) * d), code_minus_zero(size_t(max_tokens) * d, 0.f);
  for (int b = 0; b < max_tokens / tpb; ++b)
    ref_codec->decode(blocks.data() + size_t(b) * ref_codec->bytes_per_block(), xh.data() + size_t(b) * tpb * d);
  const bool int8_path = (s.type == "int2" || s.type == "kivi2") && !s.per_channel && s.group == d && d == 128;
  if (int8_path)
    for (int t = 0; t < max_tokens; ++t) {
      layout::GroupParams gp;
      std::memcpy(&gp, blocks.data() + size_t(t) * ref_codec->bytes_per_block(), sizeof gp);
      const float sc = fp16_to_f32(gp.scale);
      for (int c = 0; c < d; ++c)
        code_minus_zero[size_t(t) * d + c] = sc > 0.f ? std::fabs(xh[size_t(t) * d + c]) / sc : 0.f;
    }
  std::vector<double> x_abs_sum(size_t(max_tokens), 0.0);  // Σ_c |x̂_tc| per token
  for (int t = 0; t < max_tokens; ++t)
    for (int c = 0; c < d; ++c) x_abs_sum[size_t(t)] += std::fabs(xh[size_t(t) * d + c]);
  int checked_levels = 0;
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAvx512Vnni}) {
    if (!simd_level_supported(level)) continue;
    ++checked_levels;
    const auto codec = make_codec_at(s, level);
    // float levels: rounding order only (observed < 1e-6); VNNI and AVX2, whose int-row kernels (every codec that
    // reads packed codes through them) round q / weights to int16: observed < 4e-6
    const double rel_tol = simd_int8_operands(level) && s.type != "bf16" ? 1e-5 : 2e-6;
    // 17 and 33: more than one chunk of 16 queries, the decode-once tile path (a prefill tile of queries × GQA group)
    for (int n_q : {1, 2, 3, 4, 5, 8, 16, 17, 33}) {
      const std::vector<float> q = sample(Dist::kGaussian, size_t(n_q) * d, 100 + n_q);
      for (int n_tokens : token_counts) {
        SCOPED_TRACE(std::string(simd_level_name(level)) + " n_q " + std::to_string(n_q) + " n_tokens " +
                     std::to_string(n_tokens));
        std::vector<float> s_ref(size_t(n_q) * n_tokens), s_fast(size_t(n_q) * n_tokens, NAN);
        codec->scores_ref(q.data(), n_q, blocks.data(), n_tokens, s_ref.data());
        codec->scores(q.data(), n_q, blocks.data(), n_tokens, s_fast.data());
        const bool int8_here = int8_path && simd_int8_operands(level);
        for (int i = 0; i < n_q; ++i) {
          double qa = 0, qmax = 0;
          for (int c = 0; c < d; ++c) qa += std::fabs(q[size_t(i) * d + c]), qmax = std::max(qmax, double(std::fabs(q[size_t(i) * d + c])));
          const double bound = qa * 3.0 * max_abs;
          for (int t = 0; t < n_tokens; ++t) {
            const double tol = rel_tol * bound + (int8_here ? qmax / 254.0 * x_abs_sum[size_t(t)] : 0.0);
            const size_t k = size_t(i) * n_tokens + t;
            ASSERT_NEAR(s_fast[k], s_ref[k], tol) << "query " << i << " token " << t;
          }
        }
        const std::vector<float> p = uniform(size_t(n_q) * n_tokens, 7 + n_tokens, 0.f, 1.f);
        std::vector<double> cz(size_t(d), 0.0);  // Σ_t |code − zero| per channel, for the int8 path's bound
        if (int8_here)
          for (int t = 0; t < n_tokens; ++t)
            for (int c = 0; c < d; ++c) cz[size_t(c)] += code_minus_zero[size_t(t) * d + c];
        const std::vector<float> acc0 = sample(Dist::kGaussian, size_t(n_q) * d, 9);
        std::vector<float> acc_ref = acc0, acc_fast = acc0;
        codec->accumulate_ref(p.data(), n_q, blocks.data(), n_tokens, acc_ref.data());
        codec->accumulate(p.data(), n_q, blocks.data(), n_tokens, acc_fast.data());
        for (int i = 0; i < n_q; ++i) {
          double pa = 0, wmax = 0;
          for (int t = 0; t < n_tokens; ++t) {
            pa += std::fabs(p[size_t(i) * n_tokens + t]);
            if (int8_here) {
              layout::GroupParams gp;
              std::memcpy(&gp, blocks.data() + size_t(t) * ref_codec->bytes_per_block(), sizeof gp);
              wmax = std::max(wmax, double(std::fabs(p[size_t(i) * n_tokens + t] * fp16_to_f32(gp.scale))));
            }
          }
          const double bound = pa * 3.0 * max_abs + 10.0;
          for (int c = 0; c < d; ++c) {
            const double tol = rel_tol * bound + (int8_here ? wmax / 254.0 * cz[size_t(c)] : 0.0);
            const size_t k = size_t(i) * d + c;
            ASSERT_NEAR(acc_fast[k], acc_ref[k], tol) << "query " << i << " channel " << c;
          }
        }
      }
    }
  }
  EXPECT_GE(checked_levels, 1);
}

INSTANTIATE_TEST_SUITE_P(Specs, AnyCodec, ::testing::ValuesIn(all_specs()),
                         [](const auto& info) { return spec_name(info.param); });

TEST(Codecs, ThisMachineRunsBothSimdLevelsSoTheyAreTested) {
  // The development machine has AVX-512; elsewhere this only records which levels the kernel tests covered.
  if (!simd_level_supported(SimdLevel::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  EXPECT_TRUE(simd_level_supported(SimdLevel::kAvx2));
  EXPECT_TRUE(simd_level_supported(SimdLevel::kAvx512Vnni));
  EXPECT_EQ(best_simd_level(), SimdLevel::kAvx512Vnni);
}

TEST(MakeCodec, UnsupportedCombinationsNameTheComboAndWhatIsSupported) {
  struct Case {
    CodecSpec s;
    const char* must_mention;
  };
  const std::vector<Case> cases = {
      {spec("int3", 128, 128), "unknown type"},
      {spec("int2", 96, 64), "group must divide head_dim"},
      {spec("int2", 128, 16), "group must be 32, 64 or 128"},
      {spec("int4", 48, 32), "int4 needs head_dim a multiple of 32"},
      {spec("int2", 80, 32), "int2 needs head_dim a multiple of 32"},  // StableLM's 80: unquantized rows only
      {spec("q8_0", 80, 128), "q8_0 needs head_dim a multiple of 32"},
      {spec("bf16", 512, 128), "bf16 needs head_dim a multiple of 16 up to 256"},
      {spec("f16", 72, 128), "f16 needs head_dim a multiple of 16"},
      {spec("int2", 128, 128, 0.f), "clip"},
      {spec("int2", 128, 128, 1.5f), "clip"},
      {spec("int2", 128, 128, NAN), "clip"},
      {spec("int2", 128, 128, 1.f, true), "per_channel is only for kivi"},
      {spec("kivi2", 128, 256, 1.f, true), "group must be 32, 64 or 128"},
      {spec("nexusquant", 96, 128), "power-of-two head_dim"},
      {spec("e8_2", 160, 128), "power-of-two head_dim"},
  };
  for (const Case& c : cases) {
    try {
      make_codec(c.s);
      ADD_FAILURE() << "no error for " << spec_name(c.s);
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + c.s.type + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("head_dim " + std::to_string(c.s.head_dim)), std::string::npos) << msg;
      EXPECT_NE(msg.find("group " + std::to_string(c.s.group)), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.must_mention), std::string::npos) << msg;
      EXPECT_NE(msg.find("supported: f32, bf16, f16; int8, int4, int2"), std::string::npos) << msg;
      EXPECT_NE(msg.find("q8_0, q5_0, q4_1, q4_0, iq4_nl, pnmix (their own groups or blocks"), std::string::npos) << msg;
    }
  }
  // kivi keys: G tokens need not divide head_dim; kivi values do
  EXPECT_NO_THROW(make_codec(spec("kivi2", 96, 64, 1.f, true)));
  EXPECT_THROW(make_codec(spec("kivi2", 96, 64)), Error);
}

// The codec table: names and aliases resolve to their row, every row builds a CPU codec whose stored bits match
// the row's code bits (+ 32 / G for grouped codecs, + its per-row parameters; a format with its own fixed blocks
// stores its code bits plus less than one bit of metadata, its exact bytes tested in its own file: llama.cpp's in
// test_llamacpp_types.cpp), and the flags'
// defaults come from the row.
TEST(CodecTable, EveryRowBuildsItsCodecWithTheBitsItDeclares) {
  ASSERT_FALSE(codec_table().empty());
  for (const CodecTraits& t : codec_table()) {
    EXPECT_EQ(&codec_traits(t.id), &t) << t.name;
    EXPECT_EQ(find_codec(t.name), &t) << t.name;
    for (std::string_view a : t.aliases) EXPECT_EQ(find_codec(a), &t) << a;
    for (int g : kGroups) {
      const CodecSpec k = codec_spec(t.name, true, g, 0.f), v = codec_spec(t.name, false, g, 0.f);
      EXPECT_EQ(k.per_channel, t.per_channel_keys) << t.name;
      EXPECT_FALSE(v.per_channel) << t.name;
      EXPECT_EQ(k.token_scale, t.token_scale_keys) << t.name;
      EXPECT_FALSE(v.token_scale) << t.name;
      EXPECT_EQ(k.clip, t.default_clip_k) << t.name;
      EXPECT_EQ(v.clip, t.default_clip_v) << t.name;
      for (const CodecSpec& s : {test::with_test_widths(k, 1, 1), test::with_test_widths(v, 1, 1)}) {
        const auto codec = make_codec(s);
        EXPECT_EQ(codec->name(), t.name);
        const double want = t.code_bits + (t.grouped ? 32.0 / g : 0.0) + 8.0 * t.row_bytes / s.head_dim;
        if (fixed_format(t) && t.row_bytes == 0) {  // its own blocks: its own test holds its bytes to METHODS
          EXPECT_GE(codec->bits_per_element(), want) << t.name << (s.per_channel ? " keys" : "");  // (OScaR, Kitty)
          EXPECT_LT(codec->bits_per_element(), want + 1.1) << t.name << (s.per_channel ? " keys" : "");
        } else {
          EXPECT_DOUBLE_EQ(codec->bits_per_element(), want) << t.name << " G " << g << (s.per_channel ? " keys" : "");
        }
      }
    }
  }
  EXPECT_EQ(find_codec("int3"), nullptr);
  EXPECT_EQ(codec_spec("fp32", true, 128, 0.f).type, "f32");  // an alias is canonicalised
}

TEST(CodecTable, UnknownTypesAndClipsACodecIgnoresAreRefusedByName) {
  try {
    codec_traits("int3");
    ADD_FAILURE() << "no error for int3";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'int3'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(codec_names(", ")), std::string::npos) << msg;
  }
  EXPECT_THROW(codec_spec("kivi2", true, 128, 0.9f), Error);  // KIVI is plain min/max
  EXPECT_THROW(codec_spec("bf16", false, 128, 0.9f), Error);  // nothing to clip
  EXPECT_EQ(codec_spec("int2", true, 64, 0.9f).clip, 0.9f);
}

// quantize_group is written with the per-element maths it shares with the GPU's demotion kernels
// (codecs/group_quant.h, KVQ_HD): it must store the same bits as the implementation it replaced, here verbatim, on
// random, heavy-tailed, clipped, constant, zero, signed-zero, tiny, huge and inf groups at every width.
namespace {

GroupQuant previous_quantize_group(const float* x, int n, int bits, float clip, uint8_t* codes) {
  GroupQuant q{};
  if (clip >= 1.0f) {
    float m = 0.f;
    for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
    q.thr = m;
  } else {
    const int k = std::min(int(std::floor(double(clip) * n)), n - 1);
    std::vector<float> a(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) a[size_t(i)] = std::fabs(x[i]);
    std::nth_element(a.begin(), a.begin() + k, a.end());
    q.thr = a[size_t(k)];
  }
  float lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < n; ++i) {
    const float v = std::clamp(x[i], -q.thr, q.thr);
    if (v < lo) lo = v, q.i_min = i;
    if (v > hi) hi = v, q.i_max = i;
  }
  const float levels = float((1 << bits) - 1);
  const float scale = fp16_to_f32(f32_to_fp16((hi - lo) / levels));
  if (!(hi > lo) || !(scale > 0.f) || !std::isfinite(scale)) {
    q.scale = f32_to_fp16(std::fabs(lo));
    q.zero = f32_to_fp16(lo < 0.f ? 1.f : (lo > 0.f ? -1.f : 0.f));
    std::fill(codes, codes + n, uint8_t(0));
    return q;
  }
  q.scale = f32_to_fp16(scale);
  q.zero = f32_to_fp16(-lo / scale);
  const float zero = fp16_to_f32(q.zero);
  for (int i = 0; i < n; ++i) {
    const float v = std::clamp(x[i], -q.thr, q.thr);
    const float c = std::floor(v / scale + zero + 0.5f);
    codes[i] = uint8_t(std::clamp(c, 0.f, levels));
  }
  return q;
}

}  // namespace

TEST(Codecs, SharedGroupQuantizerEqualsThePreviousOneBitForBit) {
  std::mt19937 rng(18);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::student_t_distribution<float> heavy(2.f);
  const float inf = INFINITY;
  int checked = 0;
  for (int n : {32, 64, 128})
    for (int trial = 0; trial < 60; ++trial) {
      std::vector<float> x(static_cast<size_t>(n));
      const float mag = std::pow(10.f, float(trial % 12) - 6.f);  // 1e-6 .. 1e5: fp16 subnormal scales to overflow
      for (float& v : x) v = (trial % 2 ? heavy(rng) : normal(rng)) * mag;
      switch (trial % 10) {
        case 3: std::fill(x.begin(), x.end(), 0.75f); break;       // constant
        case 4: std::fill(x.begin(), x.end(), -0.f); break;        // signed zeros
        case 5: std::fill(x.begin(), x.end(), 0.f), x[7] = 3.f; break;  // one outlier
        case 6: x[3] = inf; break;
        case 7: x[5] = NAN; break;                                   // a NaN (the threshold takes the selection)
        case 8: x[1] = 70000.f, x[2] = -70000.f; break;              // an fp16-overflowing range
        default: break;
      }
      for (int bits : {2, 4, 8})
        for (float clip : {1.0f, 0.99f, 0.96f, 0.92f, 0.9f, 0.5f}) {  // 0.5: past the small top-m path
          std::vector<uint8_t> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
          const GroupQuant a = quantize_group(x.data(), n, bits, clip, got.data());
          const GroupQuant b = previous_quantize_group(x.data(), n, bits, clip, want.data());
          ASSERT_EQ(a.scale, b.scale) << "n " << n << " trial " << trial << " bits " << bits << " clip " << clip;
          ASSERT_EQ(a.zero, b.zero) << "n " << n << " trial " << trial << " bits " << bits << " clip " << clip;
          ASSERT_EQ(std::memcmp(&a.thr, &b.thr, 4), 0);
          ASSERT_EQ(a.i_min, b.i_min);
          ASSERT_EQ(a.i_max, b.i_max);
          ASSERT_EQ(got, want) << "n " << n << " trial " << trial << " bits " << bits << " clip " << clip;
          for (int i = 0; i < n; ++i) {
            const float d = dequant_value(got[size_t(i)], a.scale, a.zero);
            const float e = (float(want[size_t(i)]) - fp16_to_f32(b.zero)) * fp16_to_f32(b.scale);
            ASSERT_EQ(std::memcmp(&d, &e, 4), 0);
          }
          ++checked;
        }
    }
  EXPECT_EQ(checked, 3 * 60 * 3 * 6);
}
