#include "codecs/kivi/codec_kivi.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "codecs/group_quant.h"
#include "codecs/layout.h"
#include "common/error.h"
#include "common/half.h"

namespace kvq {

KiviKeyCodec::KiviKeyCodec(int head_dim, int g_tokens, int bits, float clip, SimdLevel level)
    : d_(head_dim), g_(g_tokens), bits_(bits), clip_(clip),
      kernels_(row_kernels(bits == 2 ? RowFormat::kInt2 : RowFormat::kInt4, level)) {
  KVQ_CHECK(bits == 2 || bits == 4, "KiviKeyCodec: bits {} (supported: 2, 4)", bits);
  KVQ_CHECK(d_ % 32 == 0 && d_ > 0 && d_ <= 256 && g_ > 0 && g_ <= 128, "KiviKeyCodec: head_dim {} G {}", d_, g_);
}

size_t KiviKeyCodec::bytes_per_block() const { return size_t(layout::kivi_key_block_bytes(d_, g_, bits_)); }

void KiviKeyCodec::encode(const float* x, uint8_t* block) const {
  float col[128];
  uint8_t col_codes[128];
  std::vector<uint8_t> codes(size_t(g_) * d_);  // [token][channel], one code per byte
  for (int c = 0; c < d_; ++c) {
    for (int t = 0; t < g_; ++t) col[t] = x[size_t(t) * d_ + c];
    const GroupQuant gq = quantize_group(col, g_, bits_, clip_, col_codes);
    const layout::GroupParams gp{gq.scale, gq.zero};
    std::memcpy(block + 4 * c, &gp, 4);
    for (int t = 0; t < g_; ++t) codes[size_t(t) * d_ + c] = col_codes[t];
  }
  const int row_bytes = layout::packed_bytes(d_, bits_);
  uint8_t* rows = block + layout::kivi_key_params_bytes(d_);
  for (int t = 0; t < g_; ++t) layout::pack_codes(&codes[size_t(t) * d_], d_, bits_, rows + size_t(t) * row_bytes);
}

void KiviKeyCodec::decode(const uint8_t* block, float* x) const {
  const int row_bytes = layout::packed_bytes(d_, bits_);
  const uint8_t* rows = block + layout::kivi_key_params_bytes(d_);
  for (int c = 0; c < d_; ++c) {
    layout::GroupParams gp;
    std::memcpy(&gp, block + 4 * c, 4);
    for (int t = 0; t < g_; ++t)
      x[size_t(t) * d_ + c] = dequant_value(layout::unpack_code(rows + size_t(t) * row_bytes, c, bits_), gp.scale,
                                            gp.zero);
  }
}

namespace {
// Per-channel scale and zero of one block as floats.
void block_params(const uint8_t* block, int d, float* scale, float* zero) {
  for (int c = 0; c < d; ++c) {
    layout::GroupParams gp;
    std::memcpy(&gp, block + 4 * c, 4);
    scale[c] = fp16_to_f32(gp.scale);
    zero[c] = fp16_to_f32(gp.zero);
  }
}

// The g token rows of packed codes of one block (its per-channel params skipped), as the row kernels read them.
RowsView code_rows(const uint8_t* block, int d, int g, int bits) {
  RowsView r;
  r.rows = block + layout::kivi_key_params_bytes(d);
  r.row_stride = size_t(layout::packed_bytes(d, bits));
  r.d = d;
  r.group = d;
  r.n_rows = g;
  return r;
}
}  // namespace

void KiviKeyCodec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0 && n_tokens % g_ == 0, "kivi keys: scores over n_q={} n_tokens={} (G={})",
            n_q, n_tokens, g_);
  std::vector<float> qs(size_t(n_q) * d_), bias(static_cast<size_t>(n_q));
  float scale[256], zero[256];
  for (int b = 0; b < n_tokens / g_; ++b) {
    const uint8_t* block = blocks + size_t(b) * bytes_per_block();
    block_params(block, d_, scale, zero);
    for (int i = 0; i < n_q; ++i) {
      float z = 0.f;
      for (int c = 0; c < d_; ++c) {
        qs[size_t(i) * d_ + c] = q[size_t(i) * d_ + c] * scale[c];
        z += qs[size_t(i) * d_ + c] * zero[c];
      }
      bias[i] = z;
    }
    const RowsView r = code_rows(block, d_, g_, bits_);
    float* sb = s + size_t(b) * g_;
    kernels_.scores(r, qs.data(), n_q, sb, size_t(n_tokens));
    for (int i = 0; i < n_q; ++i)
      for (int t = 0; t < g_; ++t) sb[size_t(i) * n_tokens + t] -= bias[i];
  }
}

void KiviKeyCodec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0 && n_tokens % g_ == 0,
            "kivi keys: accumulate over n_q={} n_tokens={} (G={})", n_q, n_tokens, g_);
  std::vector<float> tmp(size_t(n_q) * d_);
  float scale[256], zero[256];
  for (int b = 0; b < n_tokens / g_; ++b) {
    const uint8_t* block = blocks + size_t(b) * bytes_per_block();
    block_params(block, d_, scale, zero);
    std::fill(tmp.begin(), tmp.end(), 0.f);
    const RowsView r = code_rows(block, d_, g_, bits_);
    const float* pb = p + size_t(b) * g_;
    kernels_.accumulate(r, pb, size_t(n_tokens), n_q, tmp.data());
    for (int i = 0; i < n_q; ++i) {
      float psum = 0.f;
      for (int t = 0; t < g_; ++t) psum += pb[size_t(i) * n_tokens + t];
      for (int c = 0; c < d_; ++c)
        acc[size_t(i) * d_ + c] += scale[c] * tmp[size_t(i) * d_ + c] - scale[c] * zero[c] * psum;
    }
  }
}

}  // namespace kvq
