#include "codecs/int/codec_int.h"

#include <cstring>
#include <utility>

#include "codecs/group_quant.h"
#include "codecs/layout.h"
#include "common/error.h"

namespace kvq {

namespace {
RowFormat int_format(int bits) {
  return bits == 2 ? RowFormat::kInt2 : bits == 4 ? RowFormat::kInt4 : RowFormat::kInt8;
}
}  // namespace

IntCodec::IntCodec(std::string name, int head_dim, int group, int bits, float clip, SimdLevel level)
    : name_(std::move(name)), d_(head_dim), group_(group), bits_(bits), clip_(clip),
      kernels_(row_kernels(int_format(bits), level)) {
  KVQ_CHECK(bits == 2 || bits == 4 || bits == 8, "IntCodec: bits {} (supported: 2, 4, 8)", bits);
  KVQ_CHECK(d_ % 32 == 0 && d_ > 0 && d_ <= 256 && group_ >= 32 && group_ % 32 == 0 && d_ % group_ == 0,
            "IntCodec: head_dim {} group {}", d_, group_);
}

size_t IntCodec::bytes_per_block() const { return size_t(layout::int_row_bytes(d_, group_, bits_)); }

void IntCodec::encode(const float* x, uint8_t* block) const {
  uint8_t codes[256];
  for (int g = 0; g < d_ / group_; ++g) {
    const GroupQuant gq = quantize_group(x + g * group_, group_, bits_, clip_, codes + g * group_);
    const layout::GroupParams gp{gq.scale, gq.zero};
    std::memcpy(block + 4 * g, &gp, 4);
  }
  layout::pack_codes(codes, d_, bits_, block + layout::int_row_params_bytes(d_, group_));
}

void IntCodec::decode(const uint8_t* block, float* x) const {
  const uint8_t* packed = block + layout::int_row_params_bytes(d_, group_);
  for (int g = 0; g < d_ / group_; ++g) {
    layout::GroupParams gp;
    std::memcpy(&gp, block + 4 * g, 4);
    for (int c = g * group_; c < (g + 1) * group_; ++c)
      x[c] = dequant_value(layout::unpack_code(packed, c, bits_), gp.scale, gp.zero);
  }
}

RowsView IntCodec::rows(const uint8_t* blocks, int n_tokens) const {
  RowsView r;
  r.rows = blocks;
  r.row_stride = bytes_per_block();
  r.codes_offset = layout::int_row_params_bytes(d_, group_);
  r.d = d_;
  r.group = group_;
  r.grouped = true;
  r.n_rows = n_tokens;
  return r;
}

void IntCodec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: scores over n_q={} n_tokens={}", name_, n_q, n_tokens);
  kernels_.scores(rows(blocks, n_tokens), q, n_q, s, size_t(n_tokens));
}

void IntCodec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: accumulate over n_q={} n_tokens={}", name_, n_q, n_tokens);
  kernels_.accumulate(rows(blocks, n_tokens), p, size_t(n_tokens), n_q, acc);
}

}  // namespace kvq
