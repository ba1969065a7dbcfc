// Device codec of KIVI key blocks of D channels (codecs/kivi/codec_kivi.h; layout::KiviKeyBlock: fp16 (scale, zero) per
// channel over G tokens, then G token-major rows of packed BITS-bit codes): kivi2 / kivi4 keys with per_channel. G is a
// run-time value (32, 64, 128 <= kMaxKiviG). KIVI values are per-token int rows (codec_int.cuh). Interface:
// cache_device.cuh.
#pragma once

#include "codecs/group_quant.cuh"
#include "cuda/cache_device.cuh"
#include "cuda/key_tile.cuh"

namespace kvq::cuda::dev {

constexpr int kMaxKiviG = 128;  // largest G of KIVI key blocks (codecs/kivi/codec_kivi.cpp)

template <int BITS, int D>
struct KiviKeyBlocks {
  static_assert(BITS == 2 || BITS == 4, "KIVI keys of 2 or 4 bits");
  static_assert(D % layout::kUnitValues == 0, "code rows pack units of 32 channels");
  static constexpr bool kKeyBlocks = true;  // per-channel blocks of G tokens
  static constexpr int kMaxBlockTokens = kMaxKiviG;

  // Value c of row `row` of a key block: (code - zero_c) · scale_c.
  static __device__ __forceinline__ float value(const void* block, int row, int /*group*/, int c) {
    const uint8_t* b = static_cast<const uint8_t*>(block);
    const uint16_t* params = reinterpret_cast<const uint16_t*>(b);  // GroupParams[d]: scale, zero of channel c
    const float scale = fp16_to_f32(params[2 * c]), zero = fp16_to_f32(params[2 * c + 1]);
    const uint8_t* codes = b + layout::kivi_key_params_bytes(D) + row * layout::packed_bytes(D, BITS);
    const int code = (codes[layout::code_byte(c, BITS)] >> layout::code_shift(c, BITS)) & ((1 << BITS) - 1);
    return dequant(float(code), scale, zero);
  }

  // Four consecutive values c0 .. c0 + 3 (c0 a multiple of 4) of row `row` of a key block.
  static __device__ __forceinline__ void values4(const void* block, int row, int /*group*/, int c0, float out[4]) {
    const uint8_t* b = static_cast<const uint8_t*>(block);
    const uint32_t* params = reinterpret_cast<const uint32_t*>(b);  // one word per channel: scale (low), zero (high)
    // As IntRows::values4: values c0 .. c0 + 3 sit in 4 consecutive bytes of their unit at the same shift.
    const int ub = layout::unit_bytes(BITS), vv = c0 % layout::kUnitValues;
    const uint32_t w = *reinterpret_cast<const uint32_t*>(b + layout::kivi_key_params_bytes(D) +
                                                          row * layout::packed_bytes(D, BITS) +
                                                          (c0 / layout::kUnitValues) * ub + vv % ub);
    const int shift = BITS * (vv / ub), mask = (1 << BITS) - 1;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t p = params[c0 + i];
      const float scale = fp16_to_f32(uint16_t(p)), zero = fp16_to_f32(uint16_t(p >> 16));
      out[i] = dequant(float((w >> (8 * i + shift)) & mask), scale, zero);
    }
  }

  // A decoded tile's copy (cuda/key_tile.cuh): the block's parameters and the tile's 16 code rows.
  using Tile = ParamRowsTile<D, BITS>;
  static_assert(layout::kivi_key_params_bytes(D) == 4 * D, "a parameter word a channel");
  static constexpr int kTileBytes = Tile::kBytes;
  static __device__ __forceinline__ void fetch_tile(const uint8_t* block, int row0, uint8_t* dst, int lane) {
    Tile::fetch(block, row0, dst, lane);
  }
  struct KeyTile {
    typename Tile::Lane lane;
    float scale[4], zero[4];
    __device__ __forceinline__ KeyTile(const uint8_t* tile, int /*row0*/, int c0) : lane(tile, c0) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        scale[i] = fp16_to_f32(uint16_t(lane.params[i])), zero[i] = fp16_to_f32(uint16_t(lane.params[i] >> 16));
    }
    __device__ __forceinline__ void values4(int r, float out[4]) const {
      const uint32_t w = lane.codes4(r);
#pragma unroll
      for (int i = 0; i < 4; ++i) out[i] = dequant(float((w >> (8 * i)) & ((1u << BITS) - 1)), scale[i], zero[i]);
    }
  };

  // Scores of row `row` of a key block against the g <= GQ queries qs[h][:]: the row decoded per channel,
  // (code - zero_c) scale_c, 4 at a time, then s[h] += q_h · k.
  template <int GQ>
  static __device__ __forceinline__ void score(const void* block, int row, int /*group*/,
                                               const float (*qs)[D], const float (*/*qsum*/)[D / 32],
                                               int g, float* s) {
    score_by_values4<KiviKeyBlocks, D, GQ>(block, row, 0, qs, g, s);
  }

  // Demotion of one key block by D threads (c = threadIdx.x = channel): xs holds the block's G bf16 ring rows
  // [token][channel]; thread c quantizes channel c over the G tokens (the CPU's serial loop order), then the block's
  // threads pack the token-major code rows into dst (layout::KiviKeyBlock). params: shared scratch [D].
  static __device__ __forceinline__ void encode_block(const uint16_t (*xs)[D], int G, int clip_index,
                                                      GroupParamsF* params, uint8_t* dst) {
    const int c = threadIdx.x;
    const auto x = [&](int t) { return bf16_to_f32(xs[t][c]); };
    const GroupParamsF q = quantize_params_serial<BITS>(x, G, clip_index);
    params[c] = q;
    // GroupParams[d]: fp16 scale (low half), zero (high half) of channel c.
    reinterpret_cast<uint32_t*>(dst)[c] = uint32_t(q.scale_bits) | (uint32_t(q.zero_bits) << 16);
    __syncthreads();
    // Codes: row t (token) packed as layout.h: byte j of unit u holds channels u 32 + j % (4b) + 4b k, k < 8 / b.
    uint8_t* rows = dst + layout::kivi_key_params_bytes(D);
    const int ub = layout::unit_bytes(BITS), row_bytes = layout::packed_bytes(D, BITS);
    for (int i = c; i < G * row_bytes; i += D) {
      const int t = i / row_bytes, j = i % row_bytes, u = j / ub, jj = j % ub;
      uint32_t b = 0;
      for (int k = 0; k < 8 / BITS; ++k) {
        const int ch = u * layout::kUnitValues + jj + ub * k;
        b |= quantize_value<BITS>(bf16_to_f32(xs[t][ch]), params[ch]) << (BITS * k);
      }
      rows[i] = uint8_t(b);
    }
  }
};

template <>
struct DeviceCodecOf<CodecId::kKivi2> {
  template <int D>
  using type = KiviKeyBlocks<2, D>;
};
template <>
struct DeviceCodecOf<CodecId::kKivi4> {
  template <int D>
  using type = KiviKeyBlocks<4, D>;
};

}  // namespace kvq::cuda::dev
