// Device codecs of OScaR (oscar_int2; format, quantizer and ν: codecs/oscar/oscar_format.h; CPU twins:
// codecs/oscar/codec_oscar.h):
//   OscarKeyBlocks  layout::OscarKeyBlock<D>: 32 tokens, fp16 (scale, -z·scale) per channel, then 32
//                   token-major rows of packed 2-bit codes. Token-scaled: the rows encoded are the window rows divided
//                   by ν of their position (the cache's token-scale region), and scores are multiplied back by ν.
//   OscarValueRows  layout::OscarValueRow<D>: one token, fp16 (scale, -z·scale) per 32 channels, then codes.
// Every float operation of the quantizer is codecs/oscar/oscar_format.h's (exact::, never contracted), in the CPU
// codecs' order, so the stored pages are byte-identical to the CPU's. Interface: cache_device.cuh (DeviceCodecOf).
#pragma once

#include "codecs/group_quant.cuh"  // warp_argmin / warp_argmax
#include "codecs/oscar/oscar_format.h"
#include "cuda/cache_device.cuh"
#include "cuda/key_tile.cuh"

namespace kvq::cuda::dev {

namespace oscar {
constexpr int kTokens = layout::kOscarGroup;  // tokens per key block, channels per value group
constexpr int kBits = layout::kOscarBits;
template <int D>
constexpr int kRowCodes = layout::packed_bytes(D, kBits);  // bytes of one token's packed codes of D channels

// The value of code bits `code` with the fp16 (scale, zero_dequant) pair packed in one word (scale low).
__device__ __forceinline__ float dequant_word(uint32_t code, uint32_t params) {
  return oscar_dequant(code, uint16_t(params), uint16_t(params >> 16));
}
}  // namespace oscar

template <int D>
struct OscarKeyBlocks {
  static_assert(D % oscar::kTokens == 0, "code rows pack units of 32 channels");
  static constexpr bool kKeyBlocks = true;    // per-channel blocks of 32 tokens
  static constexpr int kMaxBlockTokens = oscar::kTokens;
  static constexpr bool kTokenScaled = true;  // scores ν · q·k̂

  // Value c of row `row` of a key block: code · scale_c + zero_dequant_c.
  static __device__ __forceinline__ float value(const void* block, int row, int /*group*/, int c) {
    const uint8_t* b = static_cast<const uint8_t*>(block);
    const uint8_t* codes = b + layout::oscar_key_params_bytes(D) + row * oscar::kRowCodes<D>;
    return oscar::dequant_word(layout::unpack_code(codes, c, oscar::kBits),
                               reinterpret_cast<const uint32_t*>(b)[c]);
  }

  // Four consecutive values c0 .. c0 + 3 (c0 a multiple of 4) of row `row`: one word of codes (layout.h: the four sit
  // in consecutive bytes of their unit at the same shift), one parameter word per channel.
  static __device__ __forceinline__ void values4(const void* block, int row, int /*group*/, int c0, float out[4]) {
    const uint8_t* b = static_cast<const uint8_t*>(block);
    const uint32_t* params = reinterpret_cast<const uint32_t*>(b);
    constexpr int ub = layout::unit_bytes(oscar::kBits);
    const int vv = c0 % layout::kUnitValues;
    const uint32_t w = *reinterpret_cast<const uint32_t*>(b + layout::oscar_key_params_bytes(D) +
                                                          row * oscar::kRowCodes<D> + (c0 / layout::kUnitValues) * ub +
                                                          vv % ub);
    const int shift = oscar::kBits * (vv / ub);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = oscar::dequant_word((w >> (8 * i + shift)) & 3u, params[c0 + i]);
  }

  // A decoded tile's copy (cuda/key_tile.cuh): the block's parameters and the tile's 16 code rows.
  using Tile = ParamRowsTile<D, oscar::kBits>;
  static_assert(Tile::kRow == oscar::kRowCodes<D>, "the block's code rows");
  static_assert(layout::oscar_key_params_bytes(D) == 4 * D, "a parameter word a channel");
  static constexpr int kTileBytes = Tile::kBytes;
  static __device__ __forceinline__ void fetch_tile(const uint8_t* block, int row0, uint8_t* dst, int lane) {
    Tile::fetch(block, row0, dst, lane);
  }
  struct KeyTile {
    typename Tile::Lane lane;
    __device__ __forceinline__ KeyTile(const uint8_t* tile, int /*row0*/, int c0) : lane(tile, c0) {}
    __device__ __forceinline__ void values4(int r, float out[4]) const {
      const uint32_t w = lane.codes4(r);
#pragma unroll
      for (int i = 0; i < 4; ++i) out[i] = oscar::dequant_word((w >> (8 * i)) & 3u, lane.params[i]);
    }
  };

  // Scores of row `row` against the g <= GQ queries qs[h][:] (before ν, which the kernels multiply on): the row
  // decoded 4 channels at a time, then s[h] += q_h · k̂.
  template <int GQ>
  static __device__ __forceinline__ void score(const void* block, int row, int /*group*/,
                                               const float (*qs)[D], const float (*/*qsum*/)[D / 32],
                                               int g, float* s) {
    score_by_values4<OscarKeyBlocks, D, GQ>(block, row, 0, qs, g, s);
  }

  // Demotion of one key block by D threads (c = threadIdx.x = channel): xs holds the block's 32 bf16 ring
  // rows [token][channel], nu the ν of its 32 positions; thread c quantizes channel c of the rows divided by ν over
  // the 32 tokens in token order (the CPU's loop), then the threads pack the token-major code rows into dst.
  static __device__ __forceinline__ void encode_block(const uint16_t (*xs)[D], const float* nu, uint8_t* dst) {
    __shared__ uint8_t codes[oscar::kTokens][D];
    const int c = threadIdx.x;
    const auto x = [&](int t) { return exact::div(bf16_to_f32(xs[t][c]), nu[t]); };
    const OscarGroup q = oscar_group_of(x, oscar::kTokens);
    reinterpret_cast<uint32_t*>(dst)[c] = uint32_t(q.scale_bits) | (uint32_t(q.zero_bits) << 16);
    for (int t = 0; t < oscar::kTokens; ++t) codes[t][c] = oscar_code(x(t), q);
    __syncthreads();
    // Row t packed as layout.h: byte j of unit u holds channels u 32 + j % 8 + 8 k, k < 4, at bits 2 k.
    uint8_t* rows = dst + layout::oscar_key_params_bytes(D);
    constexpr int ub = layout::unit_bytes(oscar::kBits);
    for (int i = c; i < oscar::kTokens * oscar::kRowCodes<D>; i += D) {
      const int t = i / oscar::kRowCodes<D>, j = i % oscar::kRowCodes<D>, u = j / ub, jj = j % ub;
      uint32_t b = 0;
#pragma unroll
      for (int k = 0; k < 8 / oscar::kBits; ++k)
        b |= uint32_t(codes[t][u * layout::kUnitValues + jj + ub * k]) << (oscar::kBits * k);
      rows[i] = uint8_t(b);
    }
  }
};

template <int D>
struct OscarValueRows {
  static_assert(D % oscar::kTokens == 0, "groups of 32 channels");
  static constexpr bool kKeyBlocks = false;  // per-token rows

  // Value c of a row (row, group: unused; the groups are 32 channels).
  static __device__ __forceinline__ float value(const void* p, int /*row*/, int /*group*/, int c) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    const uint8_t* codes = r + layout::oscar_value_params_bytes(D);
    return oscar::dequant_word(layout::unpack_code(codes, c, oscar::kBits),
                               reinterpret_cast<const uint32_t*>(r)[c / oscar::kTokens]);
  }

  // Values c0 .. c0 + 3 (c0 a multiple of 4, inside one group): one word of codes, one parameter word.
  static __device__ __forceinline__ void values4(const void* p, int /*row*/, int /*group*/, int c0, float out[4]) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    const uint32_t params = reinterpret_cast<const uint32_t*>(r)[c0 / oscar::kTokens];
    constexpr int ub = layout::unit_bytes(oscar::kBits);
    const int vv = c0 % layout::kUnitValues;
    const uint32_t w = *reinterpret_cast<const uint32_t*>(r + layout::oscar_value_params_bytes(D) +
                                                          (c0 / layout::kUnitValues) * ub + vv % ub);
    const int shift = oscar::kBits * (vv / ub);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = oscar::dequant_word((w >> (8 * i + shift)) & 3u, params);
  }

  // Demotion of one bf16 ring row src into the page row dst by the warp (lane = threadIdx.x): per group of 32
  // channels, lane i holds channel i; min and max by warp reductions that keep the first index among equal values
  // (the CPU's `v < lo` scan in channel order), then codecs/oscar/oscar_format.h's parameters and codes.
  static __device__ __forceinline__ void encode_row(const uint16_t* src, uint8_t* dst, int /*group*/,
                                                    int /*clip_index*/, RowScratch<D>& sh) {
    const int lane = threadIdx.x;
    for (int gi = 0; gi < D / oscar::kTokens; ++gi) {
      const int c = gi * oscar::kTokens + lane;
      const float x = bf16_to_f32(src[c]);
      float lo = x, hi = x;
      int ilo = lane, ihi = lane;
      warp_argmin(lo, ilo);
      warp_argmax(hi, ihi);
      const OscarGroup q = oscar_group(lo, hi);
      sh.codes[c] = oscar_code(x, q);
      if (lane == 0) sh.params[2 * gi] = q.scale_bits, sh.params[2 * gi + 1] = q.zero_bits;
    }
    __syncwarp();
    uint16_t* p16 = reinterpret_cast<uint16_t*>(dst);
    if (lane < 2 * (D / oscar::kTokens)) p16[lane] = sh.params[lane];
    uint8_t* packed = dst + layout::oscar_value_params_bytes(D);
    constexpr int ub = layout::unit_bytes(oscar::kBits);
    for (int j = lane; j < oscar::kRowCodes<D>; j += 32) {
      const int u = j / ub, jj = j % ub;
      uint32_t b = 0;
#pragma unroll
      for (int k = 0; k < 8 / oscar::kBits; ++k)
        b |= uint32_t(sh.codes[u * layout::kUnitValues + jj + ub * k]) << (oscar::kBits * k);
      packed[j] = uint8_t(b);
    }
  }
};

template <>
struct DeviceCodecOf<CodecId::kOscarInt2> {
  template <int D>
  using type = OscarKeyBlocks<D>;  // keys (per_channel)
  template <int D>
  using values = OscarValueRows<D>;  // values
};

}  // namespace kvq::cuda::dev
