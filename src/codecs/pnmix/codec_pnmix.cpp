#include "codecs/pnmix/codec_pnmix.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "codecs/group_quant.h"
#include "common/error.h"

namespace kvq {

namespace {

// The bit stream of a row's codes: code of w bits at bit `at`, least significant bit first.
void put_code(uint8_t* stream, int at, int w, uint8_t code) {
  for (int b = 0; b < w; ++b, ++at)
    if ((code >> b) & 1) stream[at / 8] |= uint8_t(1u << (at % 8));
}
uint8_t get_code(const uint8_t* stream, int at, int w) {
  uint8_t code = 0;
  for (int b = 0; b < w; ++b, ++at) code |= uint8_t(((stream[at / 8] >> (at % 8)) & 1u) << b);
  return code;
}

// The codes of width W (1, 2 or 4: 8 / W whole codes a byte) of every byte value, as floats.
template <int W>
struct ByteCodes {
  static constexpr int kPerByte = 8 / W;
  float code[256][kPerByte];
  constexpr ByteCodes() : code{} {
    for (int b = 0; b < 256; ++b)
      for (int k = 0; k < kPerByte; ++k) code[b][k] = float((b >> (W * k)) & ((1 << W) - 1));
  }
};
template <int W>
constexpr ByteCodes<W> kByteCodes{};

// n codes of W bits from bit `at` of the stream (zero-padded: 8-byte reads stay inside), each times scale, into y.
// Eight codes (8W <= 32 bits) come from one 8-byte read shifted to the group's bit: at widths 1, 2 and 4 its W bytes
// as floats from a table (kByteCodes), at width 3 by shifts of constants; the tail a code a read.
template <int W>
void codes_scaled(const uint8_t* stream, int at, int n, float scale, float* y) {
  constexpr uint64_t kMask = (uint64_t(1) << W) - 1;
  int i = 0;
  for (; i + 8 <= n; i += 8, at += 8 * W) {
    uint64_t w;
    std::memcpy(&w, stream + at / 8, 8);
    w >>= at % 8;
    if constexpr (8 % W == 0) {
      constexpr int kPer = 8 / W;
      for (int b = 0; b < W; ++b) {
        const float* c = kByteCodes<W>.code[(w >> (8 * b)) & 0xff];
        for (int k = 0; k < kPer; ++k) y[i + kPer * b + k] = c[k] * scale;
      }
    } else {
      for (int k = 0; k < 8; ++k) y[i + k] = float((w >> (W * k)) & kMask) * scale;
    }
  }
  for (; i < n; ++i, at += W) {
    uint64_t w;
    std::memcpy(&w, stream + at / 8, 8);
    y[i] = float((w >> (at % 8)) & kMask) * scale;
  }
}
using CodesScaledFn = void (*)(const uint8_t*, int, int, float, float*);
constexpr CodesScaledFn kCodesScaled[kPnmixMaxBits + 1] = {nullptr, codes_scaled<1>, codes_scaled<2>, codes_scaled<3>,
                                                          codes_scaled<4>};
static_assert(kPnmixMinBits == 1 && kPnmixMaxBits == 4, "kCodesScaled has a function of each width");

// Widths present in one head's pairs (bit w set for width w).
unsigned widths_used(const uint8_t* bits, int pairs) {
  unsigned used = 0;
  for (int i = 0; i < pairs; ++i) used |= 1u << bits[i];
  return used;
}

int widths_sum(const std::vector<uint8_t>& bits) {
  int s = 0;
  for (uint8_t b : bits) s += b;
  return s;
}

int popcount(unsigned x) {
  int n = 0;
  for (; x; x &= x - 1) ++n;
  return n;
}

}  // namespace

int PairBitTable::code_bits() const {
  int sum = 0;
  for (int i = 0; i < pairs(); ++i) sum += 2 * bits[size_t(i)];
  return sum;
}

int PairBitTable::slots() const {
  int most = 0;
  for (int l = 0; l < n_layers; ++l)
    for (int h = 0; h < n_kv_heads; ++h) most = std::max(most, popcount(widths_used(head(l, h), pairs())));
  return most;
}

void PairBitTable::validate() const {
  KVQ_CHECK(n_layers > 0 && n_kv_heads > 0 && head_dim > 0 && head_dim % 32 == 0 && head_dim <= 256,
            "pnmix widths: {} layers × {} kv heads × head_dim {} (head_dim a multiple of 32 up to 256)", n_layers,
            n_kv_heads, head_dim);
  KVQ_CHECK(bits.size() == size_t(n_layers) * n_kv_heads * pairs(),
            "pnmix widths: {} entries for {} layers × {} kv heads × {} pairs", bits.size(), n_layers, n_kv_heads,
            pairs());
  for (uint8_t b : bits)
    KVQ_CHECK(b >= kPnmixMinBits && b <= kPnmixMaxBits, "pnmix widths: a pair has {} bits (supported: {} to {})",
              int(b), kPnmixMinBits, kPnmixMaxBits);
  const int total = code_bits();
  for (int l = 0; l < n_layers; ++l)
    for (int h = 0; h < n_kv_heads; ++h) {
      int sum = 0;
      for (int i = 0; i < pairs(); ++i) sum += 2 * head(l, h)[i];
      KVQ_CHECK(sum == total, "pnmix widths: layer {} kv head {} stores {} code bits per row, layer 0 head 0 {} "
                "(every head spends the same budget)", l, h, sum, total);
    }
}

PnmixKeyCodec::PnmixKeyCodec(const uint8_t* pair_bits, int head_dim, int n_slots, float clip)
    : d_(head_dim), n_slots_(n_slots), code_bits_(0), clip_(clip), pair_bits_(pair_bits, pair_bits + head_dim / 2) {
  const int half = d_ / 2;
  for (int w = kPnmixMinBits; w <= kPnmixMaxBits; ++w) {
    WidthGroup g{w, {}};
    for (int c = 0; c < d_; ++c)
      if (pair_bits_[size_t(c % half)] == w) g.channels.push_back(c);
    code_bits_ += w * int(g.channels.size());
    if (!g.channels.empty()) groups_.push_back(std::move(g));
  }
  KVQ_CHECK(int(groups_.size()) <= n_slots_ && code_bits_ == 2 * int(widths_sum(pair_bits_)),
            "PnmixKeyCodec: {} widths present in {} slots, or widths outside {}..{}", groups_.size(), n_slots_,
            kPnmixMinBits, kPnmixMaxBits);
}

void PnmixKeyCodec::encode(const float* x, uint8_t* block) const {
  std::memset(block, 0, bytes_per_block());
  uint8_t* stream = block + 4 * n_slots_;
  float vals[256];
  uint8_t codes[256];
  int at = 0;
  for (size_t j = 0; j < groups_.size(); ++j) {
    const WidthGroup& g = groups_[j];
    const int n = int(g.channels.size());
    for (int i = 0; i < n; ++i) vals[i] = x[g.channels[size_t(i)]];
    const GroupQuant gq = quantize_group(vals, n, g.bits, clip_, codes);
    const layout::GroupParams gp{gq.scale, gq.zero};
    std::memcpy(block + 4 * j, &gp, 4);
    for (int i = 0; i < n; ++i, at += g.bits) put_code(stream, at, g.bits, codes[i]);
  }
}

void PnmixKeyCodec::decode(const uint8_t* block, float* x) const {
  const uint8_t* stream = block + 4 * n_slots_;
  int at = 0;
  for (size_t j = 0; j < groups_.size(); ++j) {
    const WidthGroup& g = groups_[j];
    layout::GroupParams gp;
    std::memcpy(&gp, block + 4 * j, 4);
    for (int c : g.channels) {
      x[c] = dequant_value(get_code(stream, at, g.bits), gp.scale, gp.zero);
      at += g.bits;
    }
  }
}

void PnmixKeyCodec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  const size_t row_bytes = bytes_per_block(), slots = groups_.size();
  // q in stream order; Σ q per group (the calling thread's buffers, kept: attention calls this for every piece)
  thread_local std::vector<float> qs, qsum;
  qs.resize(size_t(n_q) * d_);
  qsum.assign(size_t(n_q) * slots, 0.f);
  for (int i = 0; i < n_q; ++i) {
    int k = 0;
    for (size_t j = 0; j < slots; ++j)
      for (int c : groups_[j].channels) {
        const float x = q[size_t(i) * d_ + c];
        qs[size_t(i) * d_ + k++] = x;
        qsum[size_t(i) * slots + j] += x;
      }
  }
  float y[kPnmixMaxHeadDim];                       // the row's codes in stream order, each times its group's scale
  float shift[kPnmixMaxBits];                      // each group's scale · zero
  uint8_t stream[kPnmixMaxHeadDim / 2 + 8] = {};  // the row's codes, then zeros: 8-byte reads stay inside
  const size_t stream_bytes = row_bytes - size_t(4 * n_slots_);
  for (int t = 0; t < n_tokens; ++t) {
    const uint8_t* row = blocks + size_t(t) * row_bytes;
    std::memcpy(stream, row + 4 * n_slots_, stream_bytes);
    // each group's codes from 8-byte reads (layout::pnmix_code_at's byte reads, a branch a code, made `bench attention
    // -ctk pnmix -ctv int2` at 8K 25-30% slower on an AVX2 EPYC), eight a read at the group's constant width
    int at = 0, k = 0;
    for (size_t j = 0; j < slots; ++j) {
      const WidthGroup& g = groups_[j];
      layout::GroupParams gp;
      std::memcpy(&gp, row + 4 * j, 4);
      const float scale = fp16_to_f32(gp.scale);
      shift[j] = scale * fp16_to_f32(gp.zero);
      const int n = int(g.channels.size());
      kCodesScaled[g.bits](stream, at, n, scale, y + k);
      at += n * g.bits, k += n;
    }
    for (int i = 0; i < n_q; ++i) {
      const float* qi = qs.data() + size_t(i) * d_;
      float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f, a4 = 0.f, a5 = 0.f, a6 = 0.f, a7 = 0.f;  // d: a multiple of 32
      for (int c = 0; c < d_; c += 8) {
        a0 += qi[c] * y[c], a1 += qi[c + 1] * y[c + 1], a2 += qi[c + 2] * y[c + 2], a3 += qi[c + 3] * y[c + 3];
        a4 += qi[c + 4] * y[c + 4], a5 += qi[c + 5] * y[c + 5], a6 += qi[c + 6] * y[c + 6], a7 += qi[c + 7] * y[c + 7];
      }
      float bias = 0.f;  // Σ_j scale_j · zero_j · Σ q over group j
      for (size_t j = 0; j < slots; ++j) bias += shift[j] * qsum[size_t(i) * slots + j];
      s[size_t(i) * n_tokens + t] = (((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))) - bias;
    }
  }
}

std::vector<uint8_t> PnmixKeyCodec::device_table() const {
  layout::PnmixHeadTable t{};
  t.slots = n_slots_, t.code_bits = code_bits_;
  int i = 0, at = 32 * n_slots_;
  for (size_t j = 0; j < groups_.size(); ++j) {
    const WidthGroup& g = groups_[j];
    const int n = int(g.channels.size());
    const int clip_index = clip_quantile_index(clip_, n);
    t.slot[j] = {.bits = int16_t(g.bits), .n = int16_t(n), .first = int16_t(i), .clip_index = int16_t(clip_index),
                 .bit = at};
    for (int c : g.channels) {
      t.channel[i++] = uint16_t(c);
      t.code_of[c] = uint32_t(at) | uint32_t(g.bits) << 16 | uint32_t(j) << 24;
      at += g.bits;
    }
  }
  std::vector<uint8_t> bytes(sizeof(t));
  std::memcpy(bytes.data(), &t, sizeof(t));
  return bytes;
}

std::unique_ptr<KvCodec> make_pnmix_key_codec(const CodecSpec& s) {
  KVQ_CHECK(s.pair_bits, "pnmix needs its calibrated widths: it is a key type, -ctk pnmix --pnmix FILE (from kvq "
            "calibrate --method pnmix)");
  const PairBitTable& t = *s.pair_bits;
  t.validate();
  KVQ_CHECK(t.head_dim == s.head_dim, "pnmix widths '{}' are for head_dim {}, the cache has {}", t.name, t.head_dim,
            s.head_dim);
  KVQ_CHECK(s.layer >= 0 && s.layer < t.n_layers && s.kv_head >= 0 && s.kv_head < t.n_kv_heads,
            "pnmix widths '{}' are for {} layers × {} kv heads, the cache asks for layer {} kv head {}", t.name,
            t.n_layers, t.n_kv_heads, s.layer, s.kv_head);
  KVQ_CHECK(std::isfinite(s.clip) && s.clip > 0.f && s.clip <= 1.f, "pnmix keys: clip {} must be in (0, 1]", s.clip);
  return std::make_unique<PnmixKeyCodec>(t.head(s.layer, s.kv_head), t.head_dim, t.slots(), s.clip);
}

}  // namespace kvq
