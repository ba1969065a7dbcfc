// PN-Mix (docs/guide/methods.md §5.7): the greedy allocation (budget, the rule on hand-worked cases, the pair scores on a
// synthetic case), the key codec (stored bytes and decode against a scalar reference, bits from stored bytes, one
// codec per head in the cache, the map in the footprint) and the calibration file (round trip, refusals, truncation
// and corruption).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention/attention_ref.h"
#include "calib/pnmix.h"
#include "codecs/group_quant.h"
#include "codecs/int/codec_int.h"
#include "codecs/pnmix/codec_pnmix.h"
#include "codecs/pnmix/pnmix_file.h"
#include "common/error.h"
#include "cuda/gpu_instances.h"
#include "kv/cache.h"
#include "kv/codec_rope.h"
#include "rotation/rotation_file.h"
#include "test_helpers.h"

using namespace kvq;
using test::gaussian;

namespace {

using test::error_of;

int sum_bits(const std::vector<uint8_t>& b) {
  int s = 0;
  for (uint8_t x : b) s += 2 * x;
  return s;
}

}  // namespace

// --- The allocation.

TEST(PnmixAllocation, SpendsExactlyTheBudgetWithEveryPairInOneToFourBits) {
  const std::vector<float> s = gaussian(64, 3);
  std::vector<float> scores(64);
  for (int i = 0; i < 64; ++i) scores[size_t(i)] = std::fabs(s[size_t(i)]) * float(1 + i % 5);
  for (double budget : {1.0, 1.5, 2.0, 2.0 + 1.0 / 64, 2.5, 3.0, 3.75, 4.0}) {
    const int code_bits = pnmix_code_bits(budget, 128);
    EXPECT_EQ(code_bits, int(std::lround(budget * 128)));
    const std::vector<uint8_t> b = allocate_pair_bits(scores.data(), 64, code_bits);
    EXPECT_EQ(sum_bits(b), code_bits) << budget;
    for (uint8_t x : b) EXPECT_TRUE(x >= 1 && x <= 4) << budget;
  }
  // B = 1 and B = 4 leave no choice.
  EXPECT_EQ(allocate_pair_bits(scores.data(), 64, 128), std::vector<uint8_t>(64, 1));
  EXPECT_EQ(allocate_pair_bits(scores.data(), 64, 512), std::vector<uint8_t>(64, 4));
}

TEST(PnmixAllocation, BudgetsOutsideOneToFourOrNotReachableAreRefusedByName) {
  EXPECT_NE(error_of([] { pnmix_code_bits(0.5, 128); }).find("[1, 4]"), std::string::npos);
  EXPECT_NE(error_of([] { pnmix_code_bits(4.5, 128); }).find("[1, 4]"), std::string::npos);
  EXPECT_NE(error_of([] { pnmix_code_bits(NAN, 128); }).find("[1, 4]"), std::string::npos);
  const std::string msg = error_of([] { pnmix_code_bits(2.3, 128); });
  EXPECT_NE(msg.find("not reachable"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2.29688 or 2.3125"), std::string::npos) << msg;  // 1 + 83/64 and 1 + 84/64
  EXPECT_EQ(pnmix_code_bits(2.3125, 128), 296);
}

// s = (16, 4, 1, 0), d = 8 (4 pairs), B = 2: 16 code bits, 4 steps from (1, 1, 1, 1). Gains s·4^-b:
//   step 1: (4, 1, 0.25, 0)       -> pair 0 (b0 = 2)
//   step 2: (1, 1, 0.25, 0)       -> tie, the lower index: pair 0 (b0 = 3)
//   step 3: (0.25, 1, 0.25, 0)    -> pair 1 (b1 = 2)
//   step 4: (0.25, 0.25, 0.25, 0) -> tie: pair 0 (b0 = 4)
// giving (4, 2, 1, 1).
TEST(PnmixAllocation, GreedyRuleOnAHandWorkedExample) {
  const float s[4] = {16.f, 4.f, 1.f, 0.f};
  EXPECT_EQ(allocate_pair_bits(s, 4, 16), (std::vector<uint8_t>{4, 2, 1, 1}));
  // From (4, 2, 1, 1): gains (-, 4/16 = 0.25, 1/4 = 0.25, 0) -> tie, pair 1 (b1 = 3); then (-, 0.0625, 0.25, 0) ->
  // pair 2 (b2 = 2).
  EXPECT_EQ(allocate_pair_bits(s, 4, 20), (std::vector<uint8_t>{4, 3, 2, 1}));
  // A pair at 4 bits takes no more, however large its score: the rest go by score.
  const float big[3] = {1e6f, 2.f, 1.f};
  EXPECT_EQ(allocate_pair_bits(big, 3, 2 * 8), (std::vector<uint8_t>{4, 2, 2}));  // after (4,1,1): 2/4 > 1/4, then 2/16 < 1/4
  // Scores equal: the lowest indices first.
  const float flat[4] = {1.f, 1.f, 1.f, 1.f};
  EXPECT_EQ(allocate_pair_bits(flat, 4, 12), (std::vector<uint8_t>{2, 2, 1, 1}));
}

// A synthetic head (d = 16: 8 pairs, 2 query heads on 1 kv head) whose pair norms are constant: pair i of every key
// has norm a_i, of every query c_i (split between the pair's two channels differently on each token, as RoPE would).
// The product score is a_i c_i, the energy (a_i² + c_i²) / 2: pair 1 (q 1, k 2: product 2) beats pair 0 (q 6,
// k 1/6: product 1) for the product, and loses to it for the energy (18.01 against 2.5).
TEST(PnmixAllocation, FavoursPairsWithLargerProductsOnASyntheticHead) {
  const int d = 16, half = 8, hq = 2, n = 6;
  const double a[half] = {1.0 / 6, 2, 1, 0.5, 3, 1, 0.1, 1};  // key pair norms
  const double c[half] = {6, 1, 0.6, 0.5, 2, 0.3, 0.1, 0};     // query pair norms
  std::vector<float> q(size_t(n) * hq * d), k(size_t(n) * d);
  for (int t = 0; t < n; ++t) {
    const double angle = 0.7 * t;  // the pair's split between its channels varies with the token
    for (int i = 0; i < half; ++i) {
      k[size_t(t) * d + i] = float(a[i] * std::cos(angle)), k[size_t(t) * d + i + half] = float(a[i] * std::sin(angle));
      for (int j = 0; j < hq; ++j) {
        q[(size_t(t) * hq + j) * d + i] = float(c[i] * std::sin(angle + j));
        q[(size_t(t) * hq + j) * d + i + half] = float(c[i] * std::cos(angle + j));
      }
    }
  }
  PairNormStats stats(1, 1, hq, d);
  stats.add(0, n, q.data(), k.data());
  EXPECT_EQ(stats.k_rows[0], n);
  EXPECT_EQ(stats.q_rows[0], n * hq);
  const std::vector<float> prod = stats.scores(PairScore::kProduct), energy = stats.scores(PairScore::kEnergy);
  for (int i = 0; i < half; ++i) {
    EXPECT_NEAR(prod[size_t(i)], a[i] * c[i], 1e-6 * (1 + a[i] * c[i])) << i;
    EXPECT_NEAR(energy[size_t(i)], (a[i] * a[i] + c[i] * c[i]) / 2, 1e-6 * (1 + a[i] * a[i] + c[i] * c[i])) << i;
  }
  // Products (1, 2, 0.6, 0.25, 6, 0.3, 0.01, 0), B = 2: 8 steps from all ones; gains s·4^-b pick, by hand,
  // pair 4 (1.5), 1 (0.5), 4 (0.375), 0 (0.25), 2 (0.15), 1 (0.125), 4 (0.094), 5 (0.075).
  const std::vector<uint8_t> bp = allocate_pair_bits(prod.data(), half, 2 * d);
  EXPECT_EQ(bp, (std::vector<uint8_t>{2, 3, 2, 1, 4, 2, 1, 1}));
  // Energies (18.01, 2.5, 0.68, 0.25, 6.5, 0.545, 0.01, 0.5): pair 0 (4.5), 4 (1.63), 0 (1.13), 1 (0.625), 4 (0.41),
  // 0 (0.28, now full), 2 (0.17), 1 (0.156).
  const std::vector<uint8_t> be = allocate_pair_bits(energy.data(), half, 2 * d);
  EXPECT_EQ(be, (std::vector<uint8_t>{4, 3, 2, 1, 3, 1, 1, 1}));
  EXPECT_GT(bp[1], bp[0]);  // the product favours the pair that carries q·k
  EXPECT_GT(be[0], be[1]);  // the energy favours the loud query pair whose key is quiet
}

// --- The codec.

namespace {

// The scalar reference of a row: each width group gathered in ascending channel order, quantize_group at its width,
// dequantized; and the bytes: params by slot, then the codes as an LSB-first bit stream.
struct RefRow {
  std::vector<float> xhat;
  std::vector<uint8_t> bytes;
};
RefRow reference_row(const float* x, const uint8_t* pair_bits, int d, int n_slots, float clip) {
  RefRow r{std::vector<float>(size_t(d)), {}};
  std::vector<uint8_t> params, bitstream;  // bitstream: one entry per bit
  for (int w = 1; w <= 4; ++w) {
    std::vector<int> ch;
    for (int c = 0; c < d; ++c)
      if (pair_bits[c % (d / 2)] == w) ch.push_back(c);
    if (ch.empty()) continue;
    std::vector<float> vals;
    for (int c : ch) vals.push_back(x[c]);
    std::vector<uint8_t> codes(ch.size());
    const GroupQuant g = quantize_group(vals.data(), int(vals.size()), w, clip, codes.data());
    for (size_t i = 0; i < ch.size(); ++i) {
      r.xhat[size_t(ch[i])] = dequant_value(codes[i], g.scale, g.zero);
      for (int b = 0; b < w; ++b) bitstream.push_back((codes[i] >> b) & 1);
    }
    for (uint16_t v : {g.scale, g.zero}) params.push_back(uint8_t(v & 0xff)), params.push_back(uint8_t(v >> 8));
  }
  params.resize(size_t(4 * n_slots), 0);
  r.bytes = params;
  r.bytes.resize(params.size() + (bitstream.size() + 7) / 8, 0);
  for (size_t i = 0; i < bitstream.size(); ++i) r.bytes[params.size() + i / 8] |= uint8_t(bitstream[i] << (i % 8));
  return r;
}

CodecSpec pnmix_spec(std::shared_ptr<const PairBitTable> t, int layer, int head, float clip = 0.96f) {
  CodecSpec s = codec_spec("pnmix", true, 128, clip);
  s.head_dim = t->head_dim;
  s.pair_bits = std::move(t);
  s.layer = layer, s.kv_head = head;
  return s;
}

}  // namespace

TEST(PnmixCodec, StoredBytesAndDecodeEqualTheScalarReferenceForEveryHead) {
  for (int d : {32, 128, 256}) {
    const auto table = test::pnmix_widths(2, 3, d);
    for (int m = 0; m < 6; ++m) {
      const auto codec = make_codec(pnmix_spec(table, m / 3, m % 3));
      const std::vector<float> x = gaussian(size_t(d), uint32_t(d + m), 2.f);
      std::vector<uint8_t> block(codec->bytes_per_block(), 0xAB);
      codec->encode(x.data(), block.data());
      const RefRow ref = reference_row(x.data(), table->head(m / 3, m % 3), d, table->slots(), 0.96f);
      EXPECT_EQ(block, ref.bytes) << "d " << d << " head " << m;
      std::vector<float> y(static_cast<size_t>(d));
      codec->decode(block.data(), y.data());
      for (int c = 0; c < d; ++c) ASSERT_EQ(y[size_t(c)], ref.xhat[size_t(c)]) << "d " << d << " head " << m << " c " << c;
    }
  }
}

// The table the GPU reads a head's rows with (KvCodec::device_table, layout::PnmixHeadTable), read here as the device
// codec reads it (codec_pnmix.cuh): each channel's code where code_of says, with its slot's parameters, is decode()'s
// value; each slot's codes, in `channel` order from its first bit, are the stored stream; its clip index is
// quantize_group's order statistic. With a head of fewer widths than the cache's slots and clips 0.96 and 1.
TEST(PnmixCodec, DeviceTableReadsAndRepacksEveryHeadsRowsAsTheCodecStoresThem) {
  for (int d : {64, 128, 256}) {
    auto table = std::make_shared<PairBitTable>(*test::pnmix_widths(2, 2, d));
    std::fill_n(table->bits.begin() + 3 * (d / 2), d / 2, uint8_t(2));  // layer 1, head 1: one width (3 unused slots)
    for (float clip : {0.96f, 1.0f})
      for (int m = 0; m < 4; ++m) {
        const auto codec = make_codec(pnmix_spec(table, m / 2, m % 2, clip));
        const std::vector<uint8_t> bytes = codec->device_table();
        ASSERT_EQ(bytes.size(), sizeof(layout::PnmixHeadTable));
        layout::PnmixHeadTable t;
        std::memcpy(&t, bytes.data(), sizeof(t));
        EXPECT_EQ(t.slots, table->slots());
        EXPECT_EQ(t.code_bits, table->code_bits());
        const std::vector<float> x = gaussian(size_t(d), uint32_t(7 * d + m), 2.f);
        std::vector<uint8_t> row(codec->bytes_per_block());
        codec->encode(x.data(), row.data());
        std::vector<float> y(static_cast<size_t>(d));
        codec->decode(row.data(), y.data());
        for (int c = 0; c < d; ++c) {
          const uint32_t e = t.code_of[c];
          const int slot = layout::pnmix_code_slot(e);
          ASSERT_EQ(layout::pnmix_code_width(e), table->head(m / 2, m % 2)[c % (d / 2)]) << "d " << d << " c " << c;
          fp16_t sz[2];
          std::memcpy(sz, row.data() + 4 * slot, 4);
          const uint32_t code =
              layout::pnmix_code_at(row.data(), layout::pnmix_code_bit(e), layout::pnmix_code_width(e));
          ASSERT_EQ(dequant_value(uint8_t(code), sz[0], sz[1]), y[size_t(c)])
              << "d " << d << " head " << m << " c " << c;
        }
        std::vector<uint8_t> stream(row.size() - size_t(4 * t.slots), 0);
        int seen = 0, used = 0;
        for (const layout::PnmixHeadTable::Slot& sl : t.slot) {
          if (sl.bits == 0) continue;
          ++used;
          std::vector<float> vals;
          for (int i = 0; i < sl.n; ++i) {
            const int c = t.channel[sl.first + i];
            vals.push_back(x[size_t(c)]);
            const uint32_t code = layout::pnmix_code_at(row.data(), t.code_of[c] & 0xffffu, sl.bits);
            for (int b = 0; b < sl.bits; ++b) {
              const int at = sl.bit - 32 * t.slots + i * sl.bits + b;
              stream[size_t(at / 8)] |= uint8_t(((code >> b) & 1u) << (at % 8));
            }
          }
          std::vector<uint8_t> codes(vals.size());
          const GroupQuant q = quantize_group(vals.data(), sl.n, sl.bits, clip, codes.data());
          std::vector<float> sorted;
          for (float v : vals) sorted.push_back(std::fabs(v));
          std::sort(sorted.begin(), sorted.end());
          EXPECT_EQ(sl.clip_index < 0 ? sorted.back() : sorted[size_t(sl.clip_index)], q.thr) << "d " << d;
          EXPECT_EQ(sl.clip_index < 0, clip >= 1.0f);
          seen += sl.n;
        }
        EXPECT_EQ(seen, d);
        EXPECT_EQ(used, m == 3 ? 1 : 4);
        EXPECT_TRUE(std::equal(stream.begin(), stream.end(), row.begin() + 4 * t.slots)) << "d " << d << " head " << m;
      }
  }
}

// The scores without decoding (PnmixKeyCodec::scores) against the scalar reference (decode, then the dot), for every
// head's widths, 1-8 queries and odd token counts: the float summation order alone differs. Head 2 spends the same
// bits in groups that at d = 64 start off byte boundaries (2 and 3 bits) and end in partial runs of 8 codes (every
// width): of every 16 pairs 5 take 1 bit, 3 take 3, 1 takes 4 and 7 take 2.
TEST(PnmixCodec, ScoresEqualTheScalarReferenceButForTheSummationOrder) {
  for (int d : {64, 128, 256}) {
    auto table = std::make_shared<PairBitTable>(*test::pnmix_widths(1, 3, d));
    std::fill_n(table->bits.begin() + d / 2, d / 2, uint8_t(2));  // head 1: one width
    for (int i = 0; i < d / 2; ++i) {  // head 2
      const int j = i % 16;
      table->bits[size_t(d + i)] = uint8_t(j < 5 ? 1 : j < 8 ? 3 : j < 9 ? 4 : 2);
    }
    for (int h = 0; h < 3; ++h) {
      const auto codec = make_codec(pnmix_spec(table, 0, h));
      const int n_tokens = 37;
      const std::vector<float> x = gaussian(size_t(n_tokens) * d, uint32_t(d + h), 2.f);
      std::vector<uint8_t> blocks(size_t(n_tokens) * codec->bytes_per_block());
      for (int t = 0; t < n_tokens; ++t)
        codec->encode(x.data() + size_t(t) * d, blocks.data() + size_t(t) * codec->bytes_per_block());
      for (int n_q : {1, 4, 8}) {
        const std::vector<float> q = gaussian(size_t(n_q) * d, uint32_t(5 + n_q));
        std::vector<float> ref(size_t(n_q) * n_tokens), fast(ref.size(), NAN);
        codec->scores_ref(q.data(), n_q, blocks.data(), n_tokens, ref.data());
        codec->scores(q.data(), n_q, blocks.data(), n_tokens, fast.data());
        for (int i = 0; i < n_q; ++i) {
          double bound = 0;  // Σ |q| · max |x̂|: a few ulps of it cover any summation order
          std::vector<float> y(static_cast<size_t>(d));
          for (int t = 0; t < n_tokens; ++t) {
            codec->decode(blocks.data() + size_t(t) * codec->bytes_per_block(), y.data());
            double b = 0;
            for (int c = 0; c < d; ++c) b += std::fabs(q[size_t(i) * d + c]) * std::fabs(y[size_t(c)]);
            bound = std::max(bound, b);
          }
          for (int t = 0; t < n_tokens; ++t)
            ASSERT_NEAR(fast[size_t(i) * n_tokens + t], ref[size_t(i) * n_tokens + t], 2e-6 * bound)
                << "d " << d << " head " << h << " n_q " << n_q << " query " << i << " token " << t;
        }
      }
    }
  }
}

TEST(PnmixCodec, BitsAreCountedFromTheStoredBytes) {
  const auto four = test::pnmix_widths(1, 2, 128);  // B = 2, all four widths: 4 slots
  const auto codec = make_codec(pnmix_spec(four, 0, 1));
  EXPECT_EQ(codec->bytes_per_block(), 48u);  // layout::PnmixRow<256, 4>
  EXPECT_DOUBLE_EQ(codec->bits_per_element(), 3.0);
  EXPECT_EQ(codec->metadata_bytes(), 64u);  // the map: one byte per pair, once
  // Every head at widths 1 and 3 only (B = 2): two slots, 8 + 32 bytes.
  auto two = std::make_shared<PairBitTable>(*four);
  for (size_t i = 0; i < two->bits.size(); ++i) two->bits[i] = i % 2 ? 3 : 1;
  EXPECT_EQ(make_codec(pnmix_spec(two, 0, 0))->bytes_per_block(), 40u);
  // One head with three widths, the other with two: every head stores the most (3 slots), the same bytes.
  for (int i = 0; i < 64; i += 4) two->bits[size_t(i)] = 2, two->bits[size_t(i + 1)] = 2;
  EXPECT_EQ(two->slots(), 3);
  EXPECT_EQ(make_codec(pnmix_spec(two, 0, 0))->bytes_per_block(), 44u);
  EXPECT_EQ(make_codec(pnmix_spec(two, 0, 1))->bytes_per_block(), 44u);
  // B = 4: every pair at 4 bits, one group of d values in channel order: int4's bytes and, decoded, int4's values.
  auto all4 = std::make_shared<PairBitTable>(*four);
  std::fill(all4->bits.begin(), all4->bits.end(), uint8_t(4));
  const auto p4 = make_codec(pnmix_spec(all4, 0, 0, 0.96f));
  const IntCodec int4("int4", 128, 128, 4, 0.96f);
  EXPECT_EQ(p4->bytes_per_block(), int4.bytes_per_block());
  const std::vector<float> x = gaussian(128, 11);
  std::vector<uint8_t> a(p4->bytes_per_block()), b(a.size());
  p4->encode(x.data(), a.data());
  int4.encode(x.data(), b.data());
  std::vector<float> ya(128), yb(128);
  p4->decode(a.data(), ya.data());
  int4.decode(b.data(), yb.data());
  EXPECT_EQ(ya, yb);
  EXPECT_EQ(std::vector<uint8_t>(a.begin(), a.begin() + 4), std::vector<uint8_t>(b.begin(), b.begin() + 4));
}

TEST(PnmixCodec, WithoutWidthsOrWithAnotherShapeOrAKeyTransformItIsRefusedByName) {
  CodecSpec s = codec_spec("pnmix", true, 128, 0.f);
  EXPECT_NE(error_of([&] { make_codec(s); }).find("-ctk pnmix --pnmix FILE"), std::string::npos);
  s.pair_bits = test::pnmix_widths(1, 2, 64);
  EXPECT_NE(error_of([&] { make_codec(s); }).find("head_dim 64"), std::string::npos);
  CacheConfig c;
  c.k = pnmix_spec(test::pnmix_widths(2, 2, 128), 0, 0);
  c.v = codec_spec("int2", false, 128, 0.f);
  EXPECT_NE(error_of([&] { KvCache cache(c, 3, 2, 128, 64); }).find("are for 2 layers × 2 kv heads"),
            std::string::npos);
  c.transform = std::make_shared<KvTransform>(hadamard_transform(2, 2, 128));
  EXPECT_NE(error_of([&] { KvCache cache(c, 2, 2, 128, 64); }).find("key side of the KV transform"),
            std::string::npos);
  CacheConfig values = c;
  values.transform = nullptr;
  values.v = values.k;
  EXPECT_NE(error_of([&] { KvCache cache(values, 2, 2, 128, 64); }).find("stores keys only"), std::string::npos);
  // The GPU runs pnmix keys with int2 values (tests/test_gpu_cache.cpp's twins); other values are refused, naming the
  // pair, and so is head_dim 256 (not compiled).
  c.transform = nullptr;
  EXPECT_EQ(cuda::gpu_unsupported(c, 128), "");
  CacheConfig int4 = c;
  int4.v = codec_spec("int4", false, 128, 0.f);
  const std::string gpu = cuda::gpu_unsupported(int4, 128);
  EXPECT_NE(gpu.find("keys pnmix with values int4/g128"), std::string::npos) << gpu;
  CacheConfig d256 = c;
  d256.k = pnmix_spec(test::pnmix_widths(2, 2, 256), 0, 0);
  d256.v.head_dim = 256;
  EXPECT_NE(cuda::gpu_unsupported(d256, 256).find("no compiled GPU instance"), std::string::npos);
}

// In the cache each (layer, kv head) stores its rows with its own widths, the runs carry that head's codec, the pages
// hold exactly its encode of the row, and attention matches the scalar reference; the footprint counts the map once.
TEST(PnmixCodec, TheCacheStoresEachHeadWithItsOwnWidths) {
  const int L = 2, H = 2, d = 128, n = 40;
  CacheConfig c;
  c.k = pnmix_spec(test::pnmix_widths(L, H, d), 0, 0);
  c.v = codec_spec("int2", false, 128, 0.f);
  c.sink = 4, c.recent = 8, c.page_tokens = 16, c.max_chunk = 64;
  KvCache cache(c, L, H, d, n);
  const int seq = cache.new_sequence();
  const std::vector<float> k = gaussian(size_t(n) * H * d, 5), v = gaussian(size_t(n) * H * d, 6);
  cache.reserve(seq, n);
  for (int l = 0; l < L; ++l) cache.append(seq, l, 0, n, k.data(), v.data());
  cache.commit(seq, n);
  std::vector<KvCache::Run> runs;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const auto own = make_key_codec(c, d, 0, l, h);
      cache.runs(seq, l, h, n - 1, n - 1, runs);
      int checked = 0;
      for (const KvCache::Run& r : runs) {
        if (r.kind != KvCache::RunKind::Quant) continue;
        EXPECT_EQ(r.k_codec, &cache.k_codec(l, h));
        for (int i = 0; i < r.n; ++i, ++checked) {
          std::vector<float> row(static_cast<size_t>(d));
          for (int ch = 0; ch < d; ++ch)  // the value the BF16 window held
            row[size_t(ch)] = bf16_to_f32(f32_to_bf16(k[(size_t(r.pos0 + i) * H + h) * d + ch]));
          std::vector<uint8_t> want(own->bytes_per_block());
          own->encode(row.data(), want.data());
          EXPECT_EQ(0, std::memcmp(want.data(), r.k + size_t(i) * want.size(), want.size())) << l << h << i;
        }
      }
      EXPECT_EQ(checked, n - c.sink - c.recent);
    }
  // Heads really differ: the same row through head (0, 0) and head (0, 1) gives different codes.
  const std::vector<float> x = gaussian(size_t(d), 9);
  std::vector<uint8_t> a(cache.k_codec(0, 0).bytes_per_block()), b(a.size());
  cache.k_codec(0, 0).encode(x.data(), a.data());
  cache.k_codec(0, 1).encode(x.data(), b.data());
  EXPECT_NE(a, b);
  // Footprint at n tokens: windows bf16, K 48 + V 36 B per (token, head), the map 64 B per (layer, head) once.
  const int nq = n - c.sink - c.recent;
  const double per_layer = (c.sink + c.recent) * 2.0 * H * 256 + nq * H * (48.0 + 36.0) + H * 64.0;
  EXPECT_NEAR(cache.footprint(n).bits_per_element, 8.0 * per_layer / (double(n) * 2 * H * d), 1e-12);
  EXPECT_NEAR(cache.footprint(n).quant_bits_per_element, 8.0 * (48.0 + 36.0) / (2 * d), 1e-12);
}

// --- The calibration file.

namespace {

std::string tmp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string("kvq_test_pnmix_") + name)).string();
}

// A calibration of 3 layers × 2 kv heads at d = 32 from random scores, written to path.
PnmixFile write_test_file(const std::string& path) {
  std::vector<float> scores = gaussian(3 * 2 * 16, 21);
  for (auto& s : scores) s = s * s;
  PnmixFile f;
  f.scores = scores;
  f.table = allocate_table(scores, 3, 2, 32, pnmix_code_bits(2.0, 32), PairScore::kEnergy);
  save_pnmix_file(path, f.table, scores,
                  {{"score", "energy"}, {"model_fingerprint", "abc123"}, {"calib_sha256", "feed"}});
  return f;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), long(b.size()));
}

}  // namespace

TEST(PnmixFile, RoundTripsWidthsScoresAndMetadata) {
  const std::string path = tmp_path("roundtrip.safetensors");
  const PnmixFile want = write_test_file(path);
  const PnmixFile f = load_pnmix_file(path);
  EXPECT_EQ(f.table.bits, want.table.bits);
  EXPECT_EQ(f.scores, want.scores);
  EXPECT_EQ(f.table.name, "pnmix(energy)");
  EXPECT_EQ(f.meta["calib_sha256"], "feed");
  EXPECT_EQ(f.meta["code_bits"], 64);
  EXPECT_EQ(f.meta["key_bits"], 2.0);
  EXPECT_NO_THROW(check_pnmix_fits(f, "abc123", 3, 2, 32));
  std::filesystem::remove(path);
}

TEST(PnmixFile, RefusesAnotherModelAnotherShapeAndForeignFiles) {
  const std::string path = tmp_path("fits.safetensors");
  write_test_file(path);
  const PnmixFile f = load_pnmix_file(path);
  EXPECT_NE(error_of([&] { check_pnmix_fits(f, "zzz999", 3, 2, 32); }).find("another model"), std::string::npos);
  EXPECT_NE(error_of([&] { check_pnmix_fits(f, "abc123", 3, 2, 64); }).find("head_dim 32, this model has head_dim 64"),
            std::string::npos);
  EXPECT_NE(error_of([&] { check_pnmix_fits(f, "abc123", 4, 2, 32); }).find("3 layers × 2 kv heads"),
            std::string::npos);
  const std::string golden = std::string(KVQ_SOURCE_DIR) + "/tests/golden/golden.safetensors";
  EXPECT_NE(error_of([&] { load_pnmix_file(golden); }).find("not a kvq PN-Mix calibration file"), std::string::npos);
  std::filesystem::remove(path);
}

// Truncated at any length: one kvq::Error. Any byte changed: a kvq::Error, or a file whose widths are the original
// ones (a change that leaves the allocation as it was, e.g. in a score's low bits or the metadata's padding).
// Metadata that states huge sizes is refused for the tensors it lacks before the loader allocates them (4000 x 4000
// heads of 128 pairs: 2 GB of widths and 8 GB of scores).
TEST(PnmixFile, StatedSizesWithoutTheirTensorsAreRefusedBeforeAnyAllocation) {
  const std::string path = tmp_path("huge.safetensors");
  const nlohmann::json meta = {{"method", "pnmix"}, {"n_layers", 4000}, {"n_kv_heads", 4000}, {"head_dim", 256},
                               {"code_bits", 256}, {"score", "product"}};
  write_safetensors(path, {OwnedTensor{"layers.0.pair_bits", DType::U8, {1, 1}, {1}}},
                    {{"kvq_pnmix", meta.dump()}});
  try {
    load_pnmix_file(path);
    FAIL() << "accepted a file without its tensors";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor layers.0.pair_bits is U8 [1, 1], expected U8 [4000, 128]"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
}

TEST(PnmixFile, TruncatedOrCorruptFilesAreRefusedNeverMisread) {
  const std::string path = tmp_path("corrupt.safetensors"), bad = tmp_path("corrupt_bad.safetensors");
  const PnmixFile want = write_test_file(path);
  const std::vector<uint8_t> bytes = read_bytes(path);
  for (size_t n = 0; n < bytes.size(); n += (n < 64 ? 1 : 7)) {
    write_bytes(bad, std::vector<uint8_t>(bytes.begin(), bytes.begin() + long(n)));
    EXPECT_THROW(load_pnmix_file(bad), Error) << "truncated to " << n << " of " << bytes.size();
  }
  int refused = 0, harmless = 0;
  std::mt19937 rng(7);
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::vector<uint8_t> b = bytes;
    b[i] ^= uint8_t(1 + rng() % 255);
    write_bytes(bad, b);
    try {
      const PnmixFile f = load_pnmix_file(bad);
      EXPECT_EQ(f.table.bits, want.table.bits) << "byte " << i << " changed the widths unnoticed";
      ++harmless;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  // Every width byte is guarded: changing one alone is refused.
  const SafeTensorsHeader h = parse_safetensors_header(bytes.data(), bytes.size(), path);
  for (const TensorInfo& t : h.tensors) {
    if (t.dtype != DType::U8) continue;
    for (size_t i = t.begin; i < t.end; ++i) {
      std::vector<uint8_t> b = bytes;
      b[h.data_start + i] = uint8_t(b[h.data_start + i] == 2 ? 3 : 2);
      write_bytes(bad, b);
      EXPECT_THROW(load_pnmix_file(bad), Error) << t.name << " byte " << i - t.begin;
    }
  }
  std::printf("pnmix file, one byte changed at each of %zu offsets: %d refused, %d harmless\n", bytes.size(), refused,
              harmless);
  std::filesystem::remove(path);
  std::filesystem::remove(bad);
}
