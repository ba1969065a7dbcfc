// llama.cpp's KV cache types as kvq codecs: q8_0, q5_0, q4_1, q4_0, iq4_nl (docs/research/llamacpp-kv.md §2). A row of
// one (token, kv head) is d / 32 consecutive llama.cpp blocks (codecs/llamacpp/llamacpp_blocks.h): the very bytes that
// llama.cpp's cache holds for that head and token (its cache row is every kv head back to back, and with d a multiple
// of 32 no block straddles two heads). Block = one token; bits per element 8.5, 5.5, 5.0, 4.5, 4.5.
// scores()/accumulate() read the blocks in place (simd_blocks_impl.h); their scalar twins decode.
#pragma once

#include <string_view>

#include "codecs/codec.h"
#include "codecs/codec_id.h"
#include "simd/simd.h"

namespace kvq {

class LlamaCppCodec final : public KvCodec {
 public:
  struct Format;  // one llama.cpp type: name, row kernels, block bytes, quantizer, dequantizer

  // id: kQ8_0, kQ5_0, kQ4_1, kQ4_0 or kIq4Nl; head_dim a multiple of 32 (validated by make_codec).
  LlamaCppCodec(CodecId id, int head_dim, SimdLevel level = best_simd_level());

  std::string_view name() const override;
  int head_dim() const override { return d_; }
  int tokens_per_block() const override { return 1; }
  size_t bytes_per_block() const override;  // d / 32 llama.cpp blocks

  void encode(const float* x, uint8_t* block) const override;
  void decode(const uint8_t* block, float* x) const override;
  void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const override;
  void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const override;

 private:
  RowsView rows(const uint8_t* blocks, int n_tokens) const;

  const Format* f_;
  int d_;  // values per row
  RowKernels kernels_;
};

}  // namespace kvq
