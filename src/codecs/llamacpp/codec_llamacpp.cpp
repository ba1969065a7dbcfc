#include "codecs/llamacpp/codec_llamacpp.h"

#include <cstring>

#include "codecs/llamacpp/llamacpp_blocks.h"
#include "common/error.h"

namespace kvq {

struct LlamaCppCodec::Format {
  CodecId id;
  std::string_view name;
  RowFormat row;
  size_t block_bytes;
  void (*quantize)(const float* x, uint8_t* block);  // 32 values -> one block
  void (*dequantize)(const uint8_t* block, float* x);
};

namespace {

template <class Block>
void quantize_block(const float* x, uint8_t* out) {
  Block b;
  llamacpp::quantize(x, b);
  std::memcpy(out, &b, sizeof b);
}

template <class Block>
void dequantize_block(const uint8_t* in, float* x) {
  Block b;
  std::memcpy(&b, in, sizeof b);
  for (int j = 0; j < llamacpp::kBlockValues; ++j) x[j] = llamacpp::value(b, j);
}

template <class Block>
constexpr LlamaCppCodec::Format format(CodecId id, std::string_view name, RowFormat row) {
  return {id, name, row, sizeof(Block), quantize_block<Block>, dequantize_block<Block>};
}

constexpr LlamaCppCodec::Format kFormats[] = {
    format<llamacpp::BlockQ8_0>(CodecId::kQ8_0, "q8_0", RowFormat::kQ8_0),
    format<llamacpp::BlockQ5_0>(CodecId::kQ5_0, "q5_0", RowFormat::kQ5_0),
    format<llamacpp::BlockQ4_1>(CodecId::kQ4_1, "q4_1", RowFormat::kQ4_1),
    format<llamacpp::BlockQ4_0>(CodecId::kQ4_0, "q4_0", RowFormat::kQ4_0),
    format<llamacpp::BlockIq4Nl>(CodecId::kIq4Nl, "iq4_nl", RowFormat::kIq4Nl),
};

const LlamaCppCodec::Format& format_of(CodecId id) {
  for (const auto& f : kFormats)
    if (f.id == id) return f;
  KVQ_FAIL("LlamaCppCodec: codec id {} is not a llama.cpp block type (q8_0, q5_0, q4_1, q4_0, iq4_nl)", int(id));
}

}  // namespace

LlamaCppCodec::LlamaCppCodec(CodecId id, int head_dim, SimdLevel level)
    : f_(&format_of(id)), d_(head_dim), kernels_(row_kernels(f_->row, level)) {
  KVQ_CHECK(d_ > 0 && d_ % llamacpp::kBlockValues == 0 && d_ <= 256, "{}: head_dim {}", f_->name, d_);
}

std::string_view LlamaCppCodec::name() const { return f_->name; }

size_t LlamaCppCodec::bytes_per_block() const { return size_t(d_ / llamacpp::kBlockValues) * f_->block_bytes; }

void LlamaCppCodec::encode(const float* x, uint8_t* block) const {
  for (int b = 0; b < d_ / llamacpp::kBlockValues; ++b)
    f_->quantize(x + b * llamacpp::kBlockValues, block + size_t(b) * f_->block_bytes);
}

void LlamaCppCodec::decode(const uint8_t* block, float* x) const {
  for (int b = 0; b < d_ / llamacpp::kBlockValues; ++b)
    f_->dequantize(block + size_t(b) * f_->block_bytes, x + b * llamacpp::kBlockValues);
}

RowsView LlamaCppCodec::rows(const uint8_t* blocks, int n_tokens) const {
  RowsView r;
  r.rows = blocks;
  r.row_stride = bytes_per_block();
  r.d = d_;
  r.group = llamacpp::kBlockValues;
  r.n_rows = n_tokens;
  return r;
}

void LlamaCppCodec::scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: scores over n_q={} n_tokens={}", f_->name, n_q, n_tokens);
  kernels_.scores(rows(blocks, n_tokens), q, n_q, s, size_t(n_tokens));
}

void LlamaCppCodec::accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const {
  KVQ_CHECK(n_q >= 1 && n_tokens >= 0, "{}: accumulate over n_q={} n_tokens={}", f_->name, n_q, n_tokens);
  kernels_.accumulate(rows(blocks, n_tokens), p, size_t(n_tokens), n_q, acc);
}

}  // namespace kvq
