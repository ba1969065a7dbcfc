// KvCodec — the one interface every KV-cache storage format implements (bf16, int8, int4, int2, kivi, ...).
//
// A codec stores the rows of ONE kv head. Its unit is a block of `tokens_per_block()` tokens × head_dim
// values: 1 token for per-token codecs (bf16, intN), G tokens for per-channel key codecs (KIVI keys).
// Blocks are plain byte arrays of `bytes_per_block()` bytes, laid out back to back in cache pages:
//   page region of one (layer, kv head, K or V) = [blocks_per_page][bytes_per_block]
// Each codec documents its block struct (with a static_assert on its size) in its own file.
//
// Attention reads blocks directly through scores()/accumulate(); no dequantized copy of the cache is made.
// Every fast path has a scalar reference twin (encode_ref/decode_ref, scores_ref/accumulate_ref, built on
// decode) and tests hold them together by NMSE with a budget derived from the bit width.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvq {

struct PairBitTable;  // codecs/pnmix/codec_pnmix.h

// Which codec and its parameters; validated by make_codec(), which names what is supported on failure.
struct CodecSpec {
  std::string type = "bf16";  // a codec table name (codecs/registry.h): bf16, int8, int4, int2, kivi2, ...
  int head_dim = 128;         // d, values per row
  int group = 128;            // G: values per scale/zero group (per token) or tokens per group (KIVI keys)
  float clip = 1.0f;          // quantile clip ratio r (docs/guide/methods.md §1); 1.0 = plain min/max
  bool per_channel = false;   // KIVI keys: quantize each channel over G tokens instead of each token
  // Keys only, a cache property of the key spec (the codec never sees it): the cache divides each token's keys by
  // ν_t, their L2 norm over all kv heads of the layer, before encode(), stores ν once per (token, layer) and
  // multiplies the quantized region's scores by it (OScaR, METHODS §5.4; kv/cache.h). codec_spec sets it for the
  // rows that define it (token_scale_keys); any key codec takes it on the CPU.
  bool token_scale = false;
  // Codecs of one (layer, kv head) (the codec table's per_head rows: PN-Mix keys, METHODS §5.7): the calibrated
  // width of every RoPE pair of every layer and kv head (a calibration file, --pnmix), and the head this codec
  // stores. The cache builds one key codec per (layer, kv head) of such a row (make_key_codec); any other codec
  // ignores them.
  std::shared_ptr<const PairBitTable> pair_bits = nullptr;
  int layer = 0, kv_head = 0;
  // vLLM's per-tensor scale of an FP8 cache (fp8e4m3, fp8e5m2; codecs/fp8/fp8.h): codes are fp8(x / s), values
  // fp8⁻¹(code) · s. 1.0 is vLLM's default; the cache sets the layer's k_scale / v_scale from --kv-scales
  // (codecs/fp8/fp8_scales.h). make_codec refuses any other value for any other codec.
  float tensor_scale = 1.f;
};

class KvCodec {
 public:
  virtual ~KvCodec() = default;

  virtual std::string_view name() const = 0;
  virtual int head_dim() const = 0;
  virtual int tokens_per_block() const = 0;   // 1, or G for per-channel codecs
  virtual size_t bytes_per_block() const = 0; // bytes stored for tokens_per_block() rows
  // Bits per element actually stored (scales, zeros, norms included): 8 * bytes_per_block / (tokens * d).
  double bits_per_element() const {
    return 8.0 * double(bytes_per_block()) / double(tokens_per_block() * head_dim());
  }

  // Bytes the codec itself stores once, beside its blocks (PN-Mix's map of pair widths); counted once per (layer,
  // kv head) in the cache's footprint.
  virtual size_t metadata_bytes() const { return 0; }

  // Constants a block is decoded with that are not stored in it, the same for every block of the codec (TurboQuant's
  // codebook: its 2^b centroids, then its 2^b - 1 midpoints, fp32; PN-Mix's layout::PnmixHeadTable of its head);
  // empty for the rest. The GPU cache uploads every (layer, kv head)'s for its device codec (CacheGeometry::k_table),
  // so that both devices store the same codes. Fixed by the format or derived from the stored map, never counted as
  // stored bytes; the same size for every head of a spec.
  virtual std::vector<uint8_t> device_table() const { return {}; }

  // x: [tokens_per_block, d] floats -> one block. decode is the exact inverse map of the stored codes.
  virtual void encode(const float* x, uint8_t* block) const = 0;
  virtual void decode(const uint8_t* block, float* x) const = 0;
  // n_blocks consecutive blocks decoded into x: [n_blocks · tokens_per_block, d], each row as decode gives it (a
  // codec may decode several rows together: NexusCodec's Hadamard over 8 rows at a time).
  virtual void decode_rows(const uint8_t* blocks, int n_blocks, float* x) const;

  // Attention primitives over n_tokens consecutive rows stored in `blocks` (n_tokens is a multiple of
  // tokens_per_block; rows are numbered from the first token of the first block).
  //   scores:     s[i, t] = q[i, :] · k̂[t, :]               q: [n_q, d], s: [n_q, n_tokens] (row stride n_tokens)
  //   accumulate: acc[i, :] += Σ_t p[i, t] · v̂[t, :]         p: [n_q, n_tokens], acc: [n_q, d]
  // n_q is the GQA group (the query heads that share this kv head), so each row is read once per group.
  virtual void scores(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const;
  virtual void accumulate(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const;

  // Scalar references the fast paths are tested against (decode, then plain loops).
  void scores_ref(const float* q, int n_q, const uint8_t* blocks, int n_tokens, float* s) const;
  void accumulate_ref(const float* p, int n_q, const uint8_t* blocks, int n_tokens, float* acc) const;

  // The position seam. A positional codec needs the position of a block's first row (rows follow at pos0 + 1, ...):
  // a key codec that stores keys without RoPE removes it at each row's position before encoding and re-applies it
  // after decoding (kv/codec_rope.h; NexusQuant, docs/guide/methods.md §5.3). The cache calls encode_at when it demotes
  // a block and attention calls scores_at per piece, both with the block's position; for a codec that is not
  // positional they are the position-free calls above, and a positional codec refuses the position-free ones.
  // Values are never positional (accumulate has no position).
  virtual bool positional() const { return false; }
  virtual void encode_at(const float* x, int pos0, uint8_t* block) const { encode(x, block); }
  virtual void decode_at(const uint8_t* block, int pos0, float* x) const { decode(block, x); }
  virtual void scores_at(const float* q, int n_q, const uint8_t* blocks, int pos0, int n_tokens, float* s) const {
    scores(q, n_q, blocks, n_tokens, s);
  }
  // The scalar reference of scores_at: decode_at, then plain loops (scores_ref is this at pos0 = 0).
  void scores_ref_at(const float* q, int n_q, const uint8_t* blocks, int pos0, int n_tokens, float* s) const;
};

// The one dispatch point from a spec to a codec. Throws kvq::Error naming the unsupported combination
// (type × head_dim × group) and listing what is supported.
std::unique_ptr<KvCodec> make_codec(const CodecSpec& spec);

}  // namespace kvq
