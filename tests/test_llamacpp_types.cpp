// llama.cpp's KV cache types (f16, q8_0, q5_0, q4_1, q4_0, iq4_nl): blocks worked by hand from llama.cpp's reference
// algorithm (docs/research/llamacpp-kv.md §2), including its ties and iq4_nl's (absent) scale search; bytes per block;
// NMSE budgets on Gaussian and heavy-tailed rows; degenerate rows; and the golden test: kvq's encode reproduces, byte
// for byte, what llama.cpp's own quantize_row_*_ref wrote for the same inputs (tests/golden/llamacpp_kv_blocks.*),
// and its decode the floats of llama.cpp's dequantize_row_*. Fast scores / accumulate against their scalar twins at
// every SIMD level: the table-driven AnyCodec tests of test_codecs.cpp, which take these rows from the codec table.
// Then llama.cpp's KV rotation (attn_rot): when it is on, and its matrices.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codecs/codec.h"
#include "codecs/llamacpp/attn_rot.h"
#include "codecs/llamacpp/llamacpp_blocks.h"
#include "codecs/registry.h"
#include "common/error.h"
#include "common/half.h"
#include "model/safetensors.h"
#include "rotation/hadamard.h"
#include "rotation/rotation_file.h"

using namespace kvq;
using namespace kvq::llamacpp;

namespace {

std::unique_ptr<KvCodec> codec(const std::string& type, int d) {
  CodecSpec s;
  s.type = type;
  s.head_dim = d;
  return make_codec(s);
}

// One 32-value block through the codec of that type (head_dim 32: a row is one block).
std::vector<uint8_t> encode_block(const std::string& type, const std::vector<float>& x) {
  const auto c = codec(type, 32);
  std::vector<uint8_t> out(c->bytes_per_block());
  c->encode(x.data(), out.data());
  return out;
}

std::vector<float> decode_block(const std::string& type, const std::vector<uint8_t>& block) {
  std::vector<float> x(32);
  codec(type, 32)->decode(block.data(), x.data());
  return x;
}

uint16_t u16_at(const std::vector<uint8_t>& b, int at) { return uint16_t(b[size_t(at)] | b[size_t(at) + 1] << 8); }

// Nibble codes of a block packed by halves, starting at byte `at`.
std::vector<int> nibbles(const std::vector<uint8_t>& b, int at) {
  std::vector<int> c(32);
  for (int j = 0; j < 16; ++j) c[size_t(j)] = b[size_t(at + j)] & 15, c[size_t(j) + 16] = b[size_t(at + j)] >> 4;
  return c;
}

const char* const kBlockTypes[] = {"q8_0", "q5_0", "q4_1", "q4_0", "iq4_nl"};

}  // namespace

TEST(LlamaCppTypes, BlockStructsAndBytesPerBlockAreLlamaCpps) {
  EXPECT_EQ(sizeof(BlockQ8_0), 34u);
  EXPECT_EQ(sizeof(BlockQ5_0), 22u);
  EXPECT_EQ(sizeof(BlockQ4_1), 20u);
  EXPECT_EQ(sizeof(BlockQ4_0), 18u);
  EXPECT_EQ(sizeof(BlockIq4Nl), 18u);
  struct Want { const char* type; size_t bytes_d128; double bits; };
  for (const Want& w : {Want{"f16", 256, 16.0}, Want{"q8_0", 4 * 34, 8.5}, Want{"q5_0", 4 * 22, 5.5},
                        Want{"q4_1", 4 * 20, 5.0}, Want{"q4_0", 4 * 18, 4.5}, Want{"iq4_nl", 4 * 18, 4.5}}) {
    const auto c = codec(w.type, 128);
    EXPECT_EQ(c->name(), w.type);
    EXPECT_EQ(c->tokens_per_block(), 1);
    EXPECT_EQ(c->bytes_per_block(), w.bytes_d128) << w.type;
    EXPECT_DOUBLE_EQ(c->bits_per_element(), w.bits) << w.type;
    EXPECT_EQ(codec(w.type, 64)->bytes_per_block(), w.bytes_d128 / 2) << w.type;
  }
  EXPECT_EQ(codec_spec("fp16", true, 128, 0.f).type, "f16");
  EXPECT_THROW(codec_spec("q4_0", true, 128, 0.9f), Error);  // llama.cpp's types take no clip
}

// q4_0 by hand. m = x0 = 4 (the first largest magnitude, positive) gives d = m / −8 = −0.5, id = −2, and the code of
// x is min(15, trunc(−2x + 8.5)); x̂ = −0.5·(code − 8).
//   x = 4     -> 0.5  -> code 0  -> x̂ =  4     (m itself, exact)
//   x = 1.25  -> 6.0  -> code 6  -> x̂ =  1.0   a tie between 1.0 and 1.5: code space rounds half up, so with d < 0
//   x = −1.25 -> 11.0 -> code 11 -> x̂ = −1.5   value-space ties go away from m's sign (down here)
//   x = −4    -> 16.5 -> 16 -> clamped to 15 -> x̂ = −3.5   (the far side saturates at 7·|d|)
//   x = 0.3   -> 7.9  -> code 7  -> x̂ =  0.5;   x = 0 -> 8.5 -> code 8 -> x̂ = 0
//   x = −4 at index 20 as well: only the FIRST largest magnitude sets m (a later equal one does not replace it).
TEST(LlamaCppTypes, Q4_0HandWorkedBlockRoundsHalfUpInCodeSpaceAndSaturatesTheFarSide) {
  std::vector<float> x(32, 0.f);
  x[0] = 4.f, x[1] = 1.25f, x[2] = -1.25f, x[3] = -4.f, x[4] = 0.3f, x[20] = -4.f;
  const std::vector<uint8_t> b = encode_block("q4_0", x);
  ASSERT_EQ(b.size(), 18u);
  EXPECT_EQ(u16_at(b, 0), 0xB800);  // fp16(−0.5)
  std::vector<int> want(32, 8);
  want[0] = 0, want[1] = 6, want[2] = 11, want[3] = 15, want[4] = 7, want[20] = 15;
  EXPECT_EQ(nibbles(b, 2), want);
  EXPECT_EQ(b[2], 0x80);  // byte 0: value 0 in the low nibble (code 0), value 16 in the high one (code 8)
  EXPECT_EQ(b[6], 0xF7);  // byte 4: value 4 (code 7), value 20 (code 15)
  const std::vector<float> xh = decode_block("q4_0", b);
  const float expect[] = {4.f, 1.f, -1.5f, -3.5f, 0.5f};
  for (int j = 0; j < 5; ++j) EXPECT_EQ(xh[size_t(j)], expect[j]) << j;
  EXPECT_EQ(xh[20], -3.5f);
  // The same block with −4 first: m = −4, d = +0.5, so −4 is exact and +4 saturates at 3.5; ties now go up.
  std::swap(x[0], x[3]);
  const std::vector<float> yh = decode_block("q4_0", encode_block("q4_0", x));
  EXPECT_EQ(yh[0], -4.f);
  EXPECT_EQ(yh[3], 3.5f);
  EXPECT_EQ(yh[1], 1.5f);    // 1.25·2 + 8.5 = 11 -> code 11 -> 0.5·3
  EXPECT_EQ(yh[2], -1.0f);   // −2.5 + 8.5 = 6 -> code 6 -> 0.5·(−2)
}

// q5_0 by hand: the same rule with 16. m = x0 = −8 gives d = 0.5, id = 2, code = min(31, trunc(2x + 16.5)).
//   x = −8 -> 0.5 -> 0;  x = 7.75 -> 32 -> clamped to 31 (x̂ = 7.5);  x = 1.25 -> 19 -> x̂ = 1.5 (tie, half up);
//   x = −1.25 -> 14 -> x̂ = −1.0.  Codes >= 16 set their bit in qh: bit j of the little-endian uint32 for value j.
TEST(LlamaCppTypes, Q5_0HandWorkedBlockPutsTheFifthBitOfValueJAtBitJOfQh) {
  std::vector<float> x(32, 0.f);
  x[0] = -8.f, x[1] = 7.75f, x[2] = 1.25f, x[3] = -1.25f, x[17] = 3.f;
  const std::vector<uint8_t> b = encode_block("q5_0", x);
  ASSERT_EQ(b.size(), 22u);
  EXPECT_EQ(u16_at(b, 0), 0x3800);  // fp16(0.5)
  // codes: 0, 31, 19, 14, 16 elsewhere, 22 at 17 (2·3 + 16.5 = 22.5)
  uint32_t qh = 0;
  std::vector<int> code(32, 16);
  code[0] = 0, code[1] = 31, code[2] = 19, code[3] = 14, code[17] = 22;
  for (int j = 0; j < 32; ++j) qh |= uint32_t(code[size_t(j)] >> 4) << j;
  EXPECT_EQ(qh, 0xFFFFFFF6u);  // every code >= 16 but values 0 and 3
  uint32_t got;
  std::memcpy(&got, &b[2], 4);
  EXPECT_EQ(got, qh);
  std::vector<int> low(32);
  for (int j = 0; j < 32; ++j) low[size_t(j)] = code[size_t(j)] & 15;
  EXPECT_EQ(nibbles(b, 6), low);
  const std::vector<float> xh = decode_block("q5_0", b);
  EXPECT_EQ(xh[0], -8.f);
  EXPECT_EQ(xh[1], 7.5f);
  EXPECT_EQ(xh[2], 1.5f);
  EXPECT_EQ(xh[3], -1.0f);
  EXPECT_EQ(xh[17], 3.f);
  EXPECT_EQ(xh[5], 0.f);
}

// q4_1 by hand: min −1, max 2 give d = 3/15 = 0.2f and id = 1/0.2f = 5 exactly; code = min(15, trunc(5(x + 1) + 0.5)).
// The codes come from the UNROUNDED d, the decode uses fp16(0.2) = 0.199951171875 (0x3266) and fp16(−1) (0xBC00):
//   x = 2 -> 15 -> 15·0.199951171875 − 1 = 1.999267578125;  x = 0.5 -> 8.0 -> 8 -> 0.599609375;
//   x = 0.3 -> 0.3f + 1 = 1.29999995 (f32), ·5 = 6.5 (f32), + 0.5 = 7.0 -> 7 -> 0.399658203125;  x = −1 -> 0 -> −1.
TEST(LlamaCppTypes, Q4_1HandWorkedBlockCodesFromTheF32ScaleAndDecodesWithTheFp16One) {
  std::vector<float> x(32, 0.f);
  x[0] = -1.f, x[1] = 2.f, x[2] = 0.5f, x[3] = 0.3f;
  const std::vector<uint8_t> b = encode_block("q4_1", x);
  ASSERT_EQ(b.size(), 20u);
  EXPECT_EQ(u16_at(b, 0), 0x3266);
  EXPECT_EQ(u16_at(b, 2), 0xBC00);
  const std::vector<int> c = nibbles(b, 4);
  EXPECT_EQ(c[0], 0);
  EXPECT_EQ(c[1], 15);
  EXPECT_EQ(c[2], 8);
  EXPECT_EQ(c[3], 7);
  EXPECT_EQ(c[4], 5);  // x = 0: 5·1 + 0.5 = 5.5 -> 5
  const std::vector<float> xh = decode_block("q4_1", b);
  EXPECT_EQ(xh[0], -1.f);
  EXPECT_EQ(xh[1], 1.999267578125f);
  EXPECT_EQ(xh[2], 0.599609375f);
  EXPECT_EQ(xh[3], 0.399658203125f);
}

// q8_0 by hand: amax = 127 gives d = 1 and id = 1; code = roundf(x), ties away from zero (not to even):
//   2.5 -> 3, −2.5 -> −3, 3.5 -> 4, 0.49 -> 0, −127 keeps its sign. A block of amax 0.5 gives d = 0.5/127 in fp16.
TEST(LlamaCppTypes, Q8_0HandWorkedBlockRoundsTiesAwayFromZero) {
  std::vector<float> x(32, 0.f);
  x[0] = -127.f, x[1] = 2.5f, x[2] = -2.5f, x[3] = 3.5f, x[4] = 0.49f, x[5] = 126.5f;
  const std::vector<uint8_t> b = encode_block("q8_0", x);
  ASSERT_EQ(b.size(), 34u);
  EXPECT_EQ(u16_at(b, 0), 0x3C00);  // fp16(1)
  const int8_t want[] = {-127, 3, -3, 4, 0, 127};
  for (int j = 0; j < 6; ++j) EXPECT_EQ(int8_t(b[size_t(2 + j)]), want[j]) << j;
  std::vector<float> y(32, 0.f);
  y[9] = 0.5f;
  EXPECT_EQ(u16_at(encode_block("q8_0", y), 0), f32_to_fp16(0.5f / 127.f));
}

// iq4_nl by hand. m = x0 = −127 gives d0 = m / −127 = 1 (the KV write's direction: m lands on T[0] = −127), so the
// first-pass code of x is its nearest table entry: x = 100 sits between 89 and 113 (midpoint 101) -> 89; x = 7 is the
// midpoint of 1 and 13 and goes UP to 13; x = −4.5 (midpoint of −10 and 1) goes up to 1; x = 0 -> 1 (T has no zero).
// The refit: d = S1/S2 with S1 = Σ x²·T·x = 127⁴ + 100²·89·100 + 7²·13·7 + 4.5²·1·(−4.5),
// S2 = Σ x²·T² = 127⁴ + 100²·89² + 7²·13² + 4.5²·1, i.e. d = 1.0288...; stored fp16(d) = 1.029296875 (0x3C1E).
// No scale search runs on the KV write (ggml's ntry = −1) and the codes are NOT re-assigned with the refitted d:
// −4.5 / d = −4.37 would still give 1 here, but x = 7.1 / d = 6.9 would give 1 where the first pass gave 13.
TEST(LlamaCppTypes, Iq4NlHandWorkedBlockKeepsTheFirstPassCodesAndRefitsTheScaleOnce) {
  std::vector<float> x(32, 0.f);
  x[0] = -127.f, x[1] = 100.f, x[2] = 7.f, x[3] = -4.5f, x[4] = 7.1f;
  const std::vector<uint8_t> b = encode_block("iq4_nl", x);
  ASSERT_EQ(b.size(), 18u);
  const std::vector<int> c = nibbles(b, 2);
  EXPECT_EQ(c[0], 0);   // −127
  EXPECT_EQ(c[1], 14);  // 89
  EXPECT_EQ(c[2], 9);   // 13: the midpoint goes to the upper entry
  EXPECT_EQ(c[3], 8);   // 1
  EXPECT_EQ(c[4], 9);   // 7.1 -> 13, kept although 7.1 / d is nearer 1
  EXPECT_EQ(c[5], 8);   // 0 -> 1
  double s1 = 0, s2 = 0;
  const double T[] = {-127, 89, 13, 1, 13};
  for (int j = 0; j < 5; ++j) s1 += double(x[j]) * x[j] * T[j] * x[j], s2 += double(x[j]) * x[j] * T[j] * T[j];
  EXPECT_NEAR(s1 / s2, 1.0288, 1e-4);
  EXPECT_EQ(u16_at(b, 0), f32_to_fp16(float(s1 / s2)));
  EXPECT_EQ(u16_at(b, 0), 0x3C1E);
  const std::vector<float> xh = decode_block("iq4_nl", b);
  EXPECT_EQ(xh[0], -127.f * 1.029296875f);
  EXPECT_EQ(xh[5], 1.029296875f);  // zeros next to an outlier decode to d·T[8] = d: iq4_nl has no zero level
  // m positive: d0 = m / −127 < 0, so m still lands on −127 and the table's long end is on m's side.
  for (float& v : x) v = -v;
  const std::vector<int> cn = nibbles(encode_block("iq4_nl", x), 2);
  EXPECT_EQ(cn[0], 0);
  EXPECT_EQ(cn[1], 14);
}

// Degenerate rows: zeros, constants, one outlier among zeros.
TEST(LlamaCppTypes, DegenerateRowsDecodeAsLlamaCppDoes) {
  const std::vector<float> zero(32, 0.f);
  for (const char* t : kBlockTypes) {
    const std::vector<float> xh = decode_block(t, encode_block(t, zero));
    for (float v : xh) ASSERT_EQ(v, 0.f) << t;
  }
  // A zero block's codes: d = 0, id = 0, so q4_0 stores 8 (trunc 8.5), q5_0 16, q4_1 and q8_0 0; iq4_nl stops early
  // (max < 1e-15) and kvq stores 0 where ggml leaves scratch.
  EXPECT_EQ(nibbles(encode_block("q4_0", zero), 2), std::vector<int>(32, 8));
  EXPECT_EQ(nibbles(encode_block("q4_1", zero), 4), std::vector<int>(32, 0));
  EXPECT_EQ(nibbles(encode_block("iq4_nl", zero), 2), std::vector<int>(32, 0));
  // Constants: q4_0 / q5_0 put c on code 0 with d = −c/8 (−c/16), exact when that is an fp16; q4_1 has d = 0 and
  // stores c in m (exact when c is an fp16); q8_0 and iq4_nl decode to c within the fp16 rounding of c/127.
  for (float c : {0.375f, -2.5f, 1024.f}) {
    const std::vector<float> x(32, c);
    for (const char* t : {"q4_0", "q5_0", "q4_1"}) {
      const std::vector<float> xh = decode_block(t, encode_block(t, x));
      for (float v : xh) ASSERT_EQ(v, c) << t << " constant " << c;
    }
    for (const char* t : {"q8_0", "iq4_nl"}) {
      const std::vector<float> xh = decode_block(t, encode_block(t, x));
      for (float v : xh) ASSERT_NEAR(v, c, std::fabs(c) * 1.0e-3) << t << " constant " << c;
    }
  }
  // One outlier among zeros: the zeros stay exact but in iq4_nl (no zero level: they become d·1), the outlier is
  // exact in q4_0 / q5_0 (it is m) and within the fp16 rounding of its scale elsewhere.
  std::vector<float> x(32, 0.f);
  x[10] = 100.f;
  for (const char* t : kBlockTypes) {
    const std::vector<float> xh = decode_block(t, encode_block(t, x));
    const bool iq4 = std::string(t) == "iq4_nl";
    for (int j = 0; j < 32; ++j) {
      if (j == 10) {
        EXPECT_NEAR(xh[size_t(j)], 100.f, 0.05f) << t;
      } else if (iq4) {
        ASSERT_NEAR(xh[size_t(j)], -100.f / 127.f, 1e-3f) << t;  // d = 100 / −127: zeros decode to d·T[8] = d
      } else {
        ASSERT_EQ(xh[size_t(j)], 0.f) << t << " " << j;
      }
    }
  }
  EXPECT_EQ(decode_block("q4_0", encode_block("q4_0", x))[10], 100.f);
  EXPECT_EQ(decode_block("q5_0", encode_block("q5_0", x))[10], 100.f);
}

// NMSE budgets. The absmax types put the block's signed maximum m on the grid's long end: q4_0 has step Δ = |m|/8,
// q5_0 |m|/16, q8_0 |m|/127; q4_1 has Δ = (max − min)/15. Uniform rounding gives MSE Δ²/12. For N(0, 1) blocks of 32,
// E[m²] ≈ 5.7 (the mean square of the largest of 32 |N(0,1)|) and E[(max − min)²] ≈ 17.6, so NMSE ≈ 5.7/(64·12) =
// 0.0074 (q4_0), 0.0019 (q5_0), 3.0e-5 (q8_0), 17.6/(225·12) = 0.0065 (q4_1). Budgets: 1.3× that. iq4_nl spends its 16
// levels where a Gaussian has its mass (finer near zero): it must beat q4_0, which has the same bits. Heavy tails
// (Student-t, 3 degrees of freedom) are held to the uniform-rounding MSE of the scales actually stored, 1.3·mean(Δ²)/12
// (q4_0 / q5_0 saturate their far side at 7/8 |m| and 15/16 |m|: rare beside the rounding), and every element to
// Δ(1 + 2⁻⁶) (the far side of q4_0 / q5_0: up to one step, plus the fp16 rounding of d times the code) or Δ/2 + the
// fp16 rounding of d times the largest code (+ that of q4_1's m).
TEST(LlamaCppTypes, NmseWithinTheBitWidthBudgetOnGaussianAndHeavyTailedRows) {
  const int d = 128, n_rows = 512;
  struct Budget { const char* type; double gaussian_nmse; };
  const Budget budgets[] = {{"q8_0", 1.3 * 3.0e-5}, {"q5_0", 1.3 * 0.0019}, {"q4_1", 1.3 * 0.0065},
                            {"q4_0", 1.3 * 0.0074}, {"iq4_nl", 0.0}};
  double q4_0_gaussian = 0;
  for (int dist = 0; dist < 2; ++dist) {
    std::mt19937 rng(40 + dist);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::student_t_distribution<float> student(3.f);
    std::vector<float> x(size_t(n_rows) * d);
    for (float& v : x) v = dist == 0 ? normal(rng) : student(rng);
    for (const Budget& bt : budgets) {
      const std::string t = bt.type;
      const auto c = codec(t, d);
      std::vector<uint8_t> row(c->bytes_per_block());
      std::vector<float> xh(static_cast<size_t>(d));
      double se = 0, ss = 0, delta2 = 0;
      for (int r = 0; r < n_rows; ++r) {
        const float* xr = &x[size_t(r) * d];
        c->encode(xr, row.data());
        c->decode(row.data(), xh.data());
        const size_t bb = c->bytes_per_block() / (d / 32);
        for (int b = 0; b < d / 32; ++b) {
          uint16_t h;
          std::memcpy(&h, &row[b * bb], 2);
          const double sc = std::fabs(fp16_to_f32(h)), levels_max = t == "q8_0" ? 127 : 15;
          double m_round = 0;
          if (t == "q4_1") {
            std::memcpy(&h, &row[b * bb + 2], 2);
            m_round = std::fabs(fp16_to_f32(h)) / 2048;
          }
          delta2 += sc * sc;
          for (int j = b * 32; j < b * 32 + 32; ++j) {
            const double e = std::fabs(double(xr[j]) - xh[size_t(j)]);
            se += e * e, ss += double(xr[j]) * xr[j];
            if (t == "iq4_nl") continue;
            const double bound = (t == "q4_0" || t == "q5_0") ? sc * (1 + 1.0 / 64)
                                                              : sc * (0.5 + levels_max / 2048) * 1.001 + m_round;
            ASSERT_LE(e, bound + 1e-6) << t << " row " << r << " value " << j;
          }
        }
      }
      delta2 /= double(n_rows) * (d / 32);
      const double nmse = se / ss, mse = se / double(x.size());
      std::printf("%s %s: NMSE %.3g\n", t.c_str(), dist == 0 ? "gaussian" : "student-t3", nmse);
      if (dist == 0) {
        if (t == "q4_0") q4_0_gaussian = nmse;
        if (t == "iq4_nl") {
          EXPECT_LT(nmse, q4_0_gaussian) << "iq4_nl must beat q4_0 at the same 4.5 bits on Gaussian rows";
        } else {
          EXPECT_LE(nmse, bt.gaussian_nmse) << t;
        }
      } else if (t != "iq4_nl") {
        EXPECT_LE(mse, 1.3 * delta2 / 12) << t;
      }
      EXPECT_GT(nmse, 0.0) << t;
    }
  }
}

// The golden test: llama.cpp's own quantizers on 192 fixed blocks (Gaussian over 12 decades of scale, heavy tails,
// outlier channels, offset blocks, zeros, constants, ±max ties, exact half-step ties for every type, iq4_nl's table
// midpoints, a block under iq4_nl's 1e-15 cut, fp16-subnormal and fp16-overflowing scales), written by a program
// against ggml-base at the commit named in the file (tests/golden/llamacpp_kv_blocks.README.md).
namespace {
struct Golden {
  std::unique_ptr<SafeTensorsFile> f;
  Golden() : f(SafeTensorsFile::open(std::string(KVQ_SOURCE_DIR) + "/tests/golden/llamacpp_kv_blocks.safetensors")) {}
  const uint8_t* at(const std::string& name, int64_t rows, int64_t cols) const {
    const TensorInfo& t = f->at(name);
    EXPECT_EQ(t.shape, (std::vector<int64_t>{rows, cols})) << name;
    return f->data(t);
  }
};
}  // namespace

TEST(LlamaCppTypes, EncodeReproducesLlamaCppsGoldenBytesAndDecodeItsFloats) {
  const Golden g;
  const int64_t n = g.f->at("x").shape[0];
  ASSERT_GE(n, 192);
  EXPECT_EQ(g.f->metadata().at("llama.cpp"), "3f545beccee69d9975f466ec7e45fd9aacd8ba90");
  std::vector<float> x(size_t(n) * 32);
  std::memcpy(x.data(), g.at("x", n, 32), x.size() * 4);
  for (const char* type : kBlockTypes) {
    const std::string t = type;
    const auto c1 = codec(t, 32), c4 = codec(t, 128);  // one block per row; four (a head of 128)
    const size_t bb = c1->bytes_per_block();
    const uint8_t* want = g.at(t, n, int64_t(bb));
    const uint8_t* want_x = g.at(t + ".dequant", n, 32);
    std::vector<uint8_t> got(bb * size_t(n));
    int zero_scale = 0;
    for (int64_t b = 0; b < n; ++b) {
      uint8_t* gb = &got[size_t(b) * bb];
      c1->encode(&x[size_t(b) * 32], gb);
      const uint8_t* wb = want + size_t(b) * bb;
      // iq4_nl blocks under its 1e-15 cut: ggml stores d = 0 and leaves its codes as scratch; only d is defined.
      // (Blocks of ~1e-6 values also store d = 0, an fp16 underflow, but with real codes: those are compared.)
      float amax = 0.f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[size_t(b) * 32 + j]));
      const bool scratch = t == "iq4_nl" && amax < 1e-15f;
      zero_scale += scratch;
      ASSERT_EQ(std::memcmp(gb, wb, scratch ? 2 : bb), 0) << t << " block " << b;
      float xh[32];
      c1->decode(wb, xh);  // decode llama.cpp's bytes: the floats of its dequantize_row_*
      ASSERT_EQ(std::memcmp(xh, want_x + size_t(b) * 128, 128), 0) << t << " block " << b << " decode";
    }
    if (t == "iq4_nl") {
      EXPECT_EQ(zero_scale, 3);  // the zero, signed-zero and sub-1e-15 blocks
    }
    // Rows of four blocks: the same bytes back to back.
    std::vector<uint8_t> row(c4->bytes_per_block());
    for (int64_t r = 0; r + 4 <= n; r += 4) {
      c4->encode(&x[size_t(r) * 32], row.data());
      ASSERT_EQ(std::memcmp(row.data(), &got[size_t(r) * bb], row.size()), 0) << t << " row at block " << r;
    }
  }
}

TEST(LlamaCppTypes, F16RowsAreLlamaCppsFp16Bits) {
  const Golden g;
  const int64_t n = g.f->at("f16.x").shape[0];
  const auto c = codec("f16", 32);
  const uint8_t* x = g.at("f16.x", n, 32);
  const uint8_t* want = g.at("f16", n, 64);
  for (int64_t b = 0; b < n; ++b) {  // the last block: fp16 edges (65504, 65520 -> inf, subnormals, ties, -0)
    float xb[32];
    std::memcpy(xb, x + size_t(b) * 128, 128);
    uint8_t got[64];
    c->encode(xb, got);
    ASSERT_EQ(std::memcmp(got, want + size_t(b) * 64, 64), 0) << "block " << b;
  }
}

// llama.cpp's KV rotation (codecs/llamacpp/attn_rot.h; docs/research/llamacpp-kv.md §3.2, §3.4).
TEST(AttnRot, SizesAreLlamaCppsLargestPowerOfTwoForKeysAnd64ForValues) {
  EXPECT_EQ(attn_rot_k_size(64), 64);
  EXPECT_EQ(attn_rot_k_size(128), 128);
  EXPECT_EQ(attn_rot_k_size(256), 256);
  EXPECT_EQ(attn_rot_k_size(192), 64);
  EXPECT_EQ(attn_rot_k_size(320), 64);
  EXPECT_EQ(attn_rot_k_size(96), 0);
  EXPECT_EQ(attn_rot_k_size(32), 0);
}

TEST(AttnRot, OnForKeysAndValuesIndependentlyWhenTheirTypeIsALlamaCppBlockType) {
  auto cache = [](const char* k, const char* v) {
    CacheConfig c;
    c.k = codec_spec(k, true, 128, 0.f);
    c.v = codec_spec(v, false, 128, 0.f);
    return c;
  };
  struct Case { const char* k; const char* v; int d, n_k, n_v; };
  for (const Case& c : {Case{"q4_0", "q4_0", 128, 128, 64}, Case{"q8_0", "f16", 128, 128, 0},
                        Case{"f16", "iq4_nl", 128, 0, 64}, Case{"bf16", "q4_1", 64, 0, 64},
                        Case{"q5_0", "q5_0", 256, 256, 64}, Case{"q4_0", "q4_0", 192, 64, 64},
                        Case{"q4_0", "q4_0", 96, 0, 0}, Case{"f16", "f16", 128, 0, 0}, Case{"int4", "int4", 128, 0, 0},
                        Case{"q8_0", "int4", 128, 128, 0}}) {
    const AttnRot r = attn_rot_for(cache(c.k, c.v), c.d);
    EXPECT_EQ(r.n_k, c.n_k) << c.k << "/" << c.v << " d " << c.d;
    EXPECT_EQ(r.n_v, c.n_v) << c.k << "/" << c.v << " d " << c.d;
  }
  EXPECT_EQ(attn_rot_for(cache("q4_0", "q4_0"), 128).describe(), "k H_128, v H_64 (2 blocks per head)");
  EXPECT_EQ(attn_rot_for(cache("f16", "f16"), 128).describe(), "off");
}

// The codec table's transform column names it, and codec_transform (the one builder of implied transforms, which
// kvq's plan() calls) builds it as llama.cpp does: keys only for -ctk q8_0 -ctv f16, nothing at head_dim 96, and a
// pair whose other side implies another transform is refused.
TEST(AttnRot, IsTheTransformTheTableImpliesAndCodecTransformBuildsIt) {
  auto cache = [](const char* k, const char* v) {
    CacheConfig c;
    c.k = codec_spec(k, true, 128, 0.f);
    c.v = codec_spec(v, false, 128, 0.f);
    return c;
  };
  for (const char* t : {"q8_0", "q5_0", "q4_1", "q4_0", "iq4_nl"})
    EXPECT_EQ(codec_traits(t).transform, CodecTransform::kAttnRot) << t;
  EXPECT_EQ(codec_traits("f16").transform, CodecTransform::kNone);
  EXPECT_EQ(implied_transform(cache("f16", "q4_0").k, cache("f16", "q4_0").v), CodecTransform::kAttnRot);
  const auto both = codec_transform(cache("q4_0", "q4_0"), 2, 2, 128);
  ASSERT_NE(both, nullptr);
  EXPECT_EQ(both->name, "attn_rot");
  AttnRot rot;
  rot.head_dim = 128, rot.n_k = 128, rot.n_v = 64;
  EXPECT_EQ(both->r_k, attn_rot_transform(rot, 2, 2, 128).r_k);
  EXPECT_EQ(both->r_v, attn_rot_transform(rot, 2, 2, 128).r_v);
  const auto keys = codec_transform(cache("q8_0", "f16"), 2, 2, 128);
  ASSERT_NE(keys, nullptr);
  EXPECT_EQ(keys->name, "attn_rot_k");
  EXPECT_TRUE(keys->r_v.empty());
  EXPECT_EQ(codec_transform(cache("f16", "iq4_nl"), 2, 2, 64)->name, "attn_rot_v");
  EXPECT_EQ(codec_transform(cache("q4_0", "q4_0"), 2, 2, 96), nullptr);  // llama.cpp rotates nothing
  EXPECT_THROW(codec_transform(cache("tq4", "q4_0"), 2, 2, 128), Error);  // hadamard_k and attn_rot
}

// The matrices are llama.cpp's: H_n[i][j] = (−1)^popcount(i & j) / √n (ggml_gen_hadamard's doubling), the same for
// every layer and head, block-diagonal inside a head for V; applied to a row they equal the fast Walsh–Hadamard
// transform llama.cpp's CPU backend runs on each n-slice; and each is its own inverse, so outputs() undoes values().
TEST(AttnRot, TransformIsBlockDiagonalSylvesterHadamardEqualToTheFwhtAndSelfInverse) {
  const int L = 2, H = 2, d = 128;
  AttnRot rot;
  rot.head_dim = d, rot.n_k = 128, rot.n_v = 64;
  const KvTransform t = attn_rot_transform(rot, L, H, d);
  EXPECT_EQ(t.name, "attn_rot");
  EXPECT_TRUE(t.key_mean.empty());
  ASSERT_EQ(t.r_k.size(), size_t(L) * H * d * d);
  ASSERT_EQ(t.r_v.size(), size_t(L) * H * d * d);
  for (int m = 0; m < L * H; ++m)
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) {
        const float sk = (std::popcount(unsigned(i & j)) & 1) ? -1.f : 1.f;
        ASSERT_EQ(t.r_k[(size_t(m) * d + i) * d + j], float(sk / std::sqrt(128.0))) << i << "," << j;
        const bool same_block = i / 64 == j / 64;
        const float sv = (std::popcount(unsigned(i % 64 & j % 64)) & 1) ? -1.f : 1.f;
        ASSERT_EQ(t.r_v[(size_t(m) * d + i) * d + j], same_block ? float(sv / 8.0) : 0.f) << i << "," << j;
      }
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> k(size_t(3) * H * d), v(k.size());
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  std::vector<float> k_rot = k, v_rot = v, k_fwht = k, v_fwht = v;
  t.keys(1, 3, k_rot.data());
  t.values(1, 3, v_rot.data());
  fwht_rows(k_fwht.data(), 3 * H, 128);    // per head
  fwht_rows(v_fwht.data(), 3 * H * 2, 64);  // per 64-slice of a head
  for (size_t i = 0; i < k.size(); ++i) {
    ASSERT_NEAR(k_rot[i], k_fwht[i], 1e-5f) << i;
    ASSERT_NEAR(v_rot[i], v_fwht[i], 1e-5f) << i;
  }
  std::vector<float> back = v_rot;
  t.outputs(1, 3, H, back.data());  // n_heads = n_kv_heads here: each output row is its value row
  for (size_t i = 0; i < v.size(); ++i) ASSERT_NEAR(back[i], v[i], 1e-5f) << i;
  rot.n_v = 0;
  EXPECT_EQ(attn_rot_transform(rot, L, H, d).name, "attn_rot_k");
  EXPECT_TRUE(attn_rot_transform(rot, L, H, d).r_v.empty());
}
