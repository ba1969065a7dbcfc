// Device codecs of Kitty (codecs/kitty/codec_kitty.h; format: codecs/kitty/kitty_format.h, per-element maths:
// codecs/min_scale_quant.h, shared with the host so that the GPU stores the CPU's bytes): key blocks of 128 tokens per
// channel with the N_BOOST channels of largest mean |k| at 4 bits (KittyKeyBlocks), and per-token 2-bit value rows
// (KittyValueRows). Interface: cache_device.cuh (DeviceCodecOf). Neither takes --kv-group or a clip: the group and clip
// arguments are unused.
#pragma once

#include "codecs/group_quant.cuh"  // GroupParamsF (the key-block demotion's signature)
#include "codecs/kitty/kitty_format.h"
#include "cuda/cache_device.cuh"
#include "cuda/key_tile.cuh"

namespace kvq::cuda::dev {

// x̂ = code · scale + min from a stored MinScale word (fp16 scale in the low half, fp16 min in the high half).
__device__ __forceinline__ float kitty_value(int code, uint32_t params) {
  return min_scale_value(float(code), fp16_to_f32(uint16_t(params)), fp16_to_f32(uint16_t(params >> 16)));
}

template <int D, int N_BOOST>
struct KittyKeyBlocks {
  static_assert(D % layout::kUnitValues == 0 && N_BOOST < D, "channels in units of 32, some of them not boosted");
  static constexpr bool kKeyBlocks = true;  // per-channel blocks of 128 tokens
  static constexpr int kMaxBlockTokens = layout::kKittyBlockTokens;
  static constexpr int kT = layout::kKittyBlockTokens;
  static constexpr int kPlane = layout::kKittyPlaneBytes;  // one channel's 128 codes
  static constexpr int kHigh = layout::kitty_high_offset(D);
  static constexpr int kSlot = layout::kitty_slot_offset(D, N_BOOST);
  static constexpr int kParams = layout::kitty_params_offset(D, N_BOOST);

  // Value c of token `row` of a key block: the low plane's code, plus the high plane's << 2 for a boosted channel.
  static __device__ __forceinline__ float value(const void* block, int row, int /*group*/, int c) {
    const uint8_t* b = static_cast<const uint8_t*>(block);
    const int slot = b[kSlot + c];
    int code = layout::unpack_code(b + c * kPlane, row, 2);
    if (slot < N_BOOST) code |= layout::unpack_code(b + kHigh + slot * kPlane, row, 2) << 2;
    return kitty_value(code, reinterpret_cast<const uint32_t*>(b + kParams)[c]);
  }

  static __device__ __forceinline__ void values4(const void* block, int row, int /*group*/, int c0, float out[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = value(block, row, 0, c0 + i);
  }

  // A decoded tile's copy (cuda/key_tile.cuh): its 16 tokens lie in one 32-token unit of every plane row, so the copy
  // is that unit's 8-byte word of each plane row (the D low ones, then the N_BOOST high ones: plane row i's at 8 i),
  // then the channel map and the parameters as stored (contiguous in the block): 1,920 bytes at d = 128, 25%, where
  // the block is 5,760.
  static constexpr int kTileMap = (8 * (D + N_BOOST) + 15) / 16 * 16;
  static constexpr int kTileBytes = kTileMap + 5 * D;
  static __device__ __forceinline__ void fetch_tile(const uint8_t* block, int row0, uint8_t* dst, int lane) {
    static_assert(kHigh == D * kPlane && kParams == kSlot + D && kSlot % 16 == 0, "plane rows, then map and params");
    const uint8_t* words = block + 8 * (row0 / layout::kUnitValues);
    for (int i = lane; i < D + N_BOOST; i += 32) tc::cp_async_8(dst + 8 * i, words + i * kPlane, true);
    for (int i = lane; i < 5 * D / 16; i += 32) tc::cp_async_16(dst + kTileMap + 16 * i, block + kSlot + 16 * i, true);
  }
  struct KeyTile {
    uint2 low[4], high[4];  // the unit's words of channels c0 .. c0 + 3 (high: zero for a channel not boosted)
    float scale[4], mn[4];
    int t0;  // the tile's first token in its unit
    __device__ __forceinline__ KeyTile(const uint8_t* tile, int row0, int c0) {
      const uint32_t map = *reinterpret_cast<const uint32_t*>(tile + kTileMap + c0);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int slot = (map >> (8 * i)) & 0xff;
        low[i] = *reinterpret_cast<const uint2*>(tile + 8 * (c0 + i));
        high[i] = slot < N_BOOST ? *reinterpret_cast<const uint2*>(tile + 8 * (D + slot)) : make_uint2(0u, 0u);
        const uint32_t p = *reinterpret_cast<const uint32_t*>(tile + kTileMap + D + 4 * (c0 + i));
        scale[i] = fp16_to_f32(uint16_t(p)), mn[i] = fp16_to_f32(uint16_t(p >> 16));
      }
      t0 = row0 % layout::kUnitValues;
    }
    // Token t of a unit: byte t % 8 of the word, bits 2 (t / 8) (layout.h).
    __device__ __forceinline__ void values4(int r, float out[4]) const {
      const int t = t0 + r, shift = 8 * (t % 4) + 2 * (t / 8);
      const bool upper = t % 8 >= 4;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t lo = upper ? low[i].y : low[i].x, hi = upper ? high[i].y : high[i].x;
        const int code = int(((lo >> shift) & 3u) | ((hi >> shift) & 3u) << 2);
        out[i] = min_scale_value(float(code), scale[i], mn[i]);
      }
    }
  };

  // Scores of token `row` of a key block against the g <= GQ queries qs[h][:]: the row decoded 4 channels at a time,
  // then s[h] += q_h · k̂.
  template <int GQ>
  static __device__ __forceinline__ void score(const void* block, int row, int /*group*/, const float (*qs)[D],
                                               const float (*/*qsum*/)[D / 32], int g, float* s) {
    score_by_values4<KittyKeyBlocks, D, GQ>(block, row, 0, qs, g, s);
  }

  // Demotion of one key block by D threads (c = threadIdx.x = channel), the host's KittyKeyCodec::encode: xs holds the
  // block's 128 bf16 ring rows [token][channel]. Thread c sums |x| over the tokens in double (the host's order), the
  // channels rank by that score (descending, ties to the lower channel; a NaN score last), then thread c quantizes its
  // channel over the tokens at 4 bits (boosted) or 2 (min / max in token order, as quantize_min_scale) and writes its
  // plane rows, its slot and its (scale, min).
  static __device__ __forceinline__ void encode_block(const uint16_t (*xs)[D], int /*G*/, int /*clip_index*/,
                                                      GroupParamsF* /*params*/, uint8_t* dst) {
    __shared__ double score_of[D];
    const int c = threadIdx.x;
    const auto x = [&](int t) { return bf16_to_f32(xs[t][c]); };
    double sc = 0.0;
    for (int t = 0; t < kT; ++t) sc += fabs(double(x(t)));
    sc = isnan(sc) ? -INFINITY : sc / kT;
    score_of[c] = sc;
    __syncthreads();
    int rank = 0;
    for (int o = 0; o < D; ++o) rank += score_of[o] > sc || (score_of[o] == sc && o < c);
    const int slot = rank < N_BOOST ? rank : N_BOOST;
    dst[kSlot + c] = uint8_t(slot);

    float mn = x(0), mx = x(0);
    for (int t = 1; t < kT; ++t) {
      const float v = x(t);
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
    }
    const int bits = slot < N_BOOST ? 4 : 2;
    const float step = min_scale_step(mn, mx, bits, kKittyEps);
    reinterpret_cast<uint32_t*>(dst + kParams)[c] = uint32_t(f32_to_fp16(step)) | uint32_t(f32_to_fp16(mn)) << 16;
    // Plane rows as layout.h packs 128 values: byte j of unit u holds tokens 32 u + j % 8 + 8 k at bits 2 k.
    uint8_t* low = dst + c * kPlane;
    uint8_t* high = slot < N_BOOST ? dst + kHigh + slot * kPlane : nullptr;
    for (int j = 0; j < kPlane; ++j) {
      const int u = j / 8, jj = j % 8;
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t code = min_scale_code(x(u * layout::kUnitValues + jj + 8 * k), mn, step, bits);
        lo |= (code & 3u) << (2 * k);
        hi |= (code >> 2) << (2 * k);
      }
      low[j] = uint8_t(lo);
      if (high) high[j] = uint8_t(hi);
    }
  }
};

template <int D>
struct KittyValueRows {
  static_assert(D % layout::kUnitValues == 0, "values in units of 32");
  static constexpr bool kKeyBlocks = false;  // per-token rows

  // The row's MinScale word, then its codes (layout.h's int2 packing): rows of 4 + D / 4 bytes, 4-byte aligned.
  static __device__ __forceinline__ uint32_t params(const uint8_t* r) { return *reinterpret_cast<const uint32_t*>(r); }

  static __device__ __forceinline__ float value(const void* p, int /*row*/, int /*group*/, int c) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    return kitty_value(layout::unpack_code(r + 4, c, 2), params(r));
  }

  // Values c0 .. c0 + 3 (c0 a multiple of 4): 4 consecutive bytes of their unit at the same shift, one aligned word.
  static __device__ __forceinline__ void values4(const void* p, int /*row*/, int /*group*/, int c0, float out[4]) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    const uint32_t w = *reinterpret_cast<const uint32_t*>(r + 4 + layout::code_byte(c0, 2));
    const int shift = layout::code_shift(c0, 2);
    const uint32_t ps = params(r);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = kitty_value(int((w >> (8 * i + shift)) & 3u), ps);
  }

  // Scores of one row against the g <= GQ queries qs[h][:]: s[h] += scale · Σ code · q_h + min · Σ q_h (qsum: Σ q per
  // unit of 32 values), the codes read a unit (two words) at a time.
  template <int GQ>
  static __device__ __forceinline__ void score(const void* p, int /*row*/, int /*group*/, const float (*qs)[D],
                                               const float (*qsum)[D / 32], int g, float* s) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    const uint32_t* codes = reinterpret_cast<const uint32_t*>(r + 4);
    float acc[GQ], qt[GQ];
#pragma unroll
    for (int h = 0; h < GQ; ++h) acc[h] = 0.f, qt[h] = 0.f;
#pragma unroll
    for (int u = 0; u < D / 32; ++u) {
      const uint32_t w[2] = {codes[2 * u], codes[2 * u + 1]};
#pragma unroll
      for (int v = 0; v < 32; ++v) {
        const int jj = v % 8, k = v / 8;
        const float code = float((w[jj / 4] >> (8 * (jj % 4) + 2 * k)) & 3u);
#pragma unroll
        for (int h = 0; h < GQ; ++h)
          if (h < g) acc[h] = fmaf(qs[h][u * 32 + v], code, acc[h]);
      }
#pragma unroll
      for (int h = 0; h < GQ; ++h)
        if (h < g) qt[h] += qsum[h][u];
    }
    const uint32_t ps = params(r);
    const float scale = fp16_to_f32(uint16_t(ps)), mn = fp16_to_f32(uint16_t(ps >> 16));
#pragma unroll
    for (int h = 0; h < GQ; ++h)
      if (h < g) s[h] = fmaf(scale, acc[h], fmaf(mn, qt[h], s[h]));
  }

  // Demotion of one bf16 ring row src into the page row dst by the warp (lane = threadIdx.x), the host's
  // KittyValueCodec::encode: lane 0 scans min and max in channel order (quantize_min_scale's comparisons), every lane
  // codes its channels, then the packed bytes and the (scale, min) word.
  static __device__ __forceinline__ void encode_row(const uint16_t* src, uint8_t* dst, int /*group*/,
                                                    int /*clip_index*/, RowScratch<D>& sh) {
    const int lane = threadIdx.x;
    for (int i = lane; i < D; i += 32) sh.x[i] = bf16_to_f32(src[i]);
    __syncwarp();
    float mn = sh.x[0], mx = sh.x[0];
    if (lane == 0)
      for (int i = 1; i < D; ++i) {
        const float v = sh.x[i];
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
      }
    mn = __shfl_sync(0xffffffffu, mn, 0);
    mx = __shfl_sync(0xffffffffu, mx, 0);
    const float step = min_scale_step(mn, mx, 2, kKittyEps);
    for (int i = lane; i < D; i += 32) sh.codes[i] = min_scale_code(sh.x[i], mn, step, 2);
    __syncwarp();
    uint8_t* packed = dst + 4;
    for (int j = lane; j < layout::packed_bytes(D, 2); j += 32) {
      const int u = j / 8, jj = j % 8;
      uint32_t b = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) b |= uint32_t(sh.codes[u * layout::kUnitValues + jj + 8 * k]) << (2 * k);
      packed[j] = uint8_t(b);
    }
    if (lane == 0) *reinterpret_cast<uint32_t*>(dst) = uint32_t(f32_to_fp16(step)) | uint32_t(f32_to_fp16(mn)) << 16;
    __syncwarp();  // sh is reused by the next row
  }
};

template <>
struct DeviceCodecOf<CodecId::kKitty2> {
  template <int D>
  using type = KittyKeyBlocks<D, kitty_boosted_channels(D, 25)>;  // keys (per_channel)
  template <int D>
  using values = KittyValueRows<D>;
};
template <>
struct DeviceCodecOf<CodecId::kKitty2At20> {
  template <int D>
  using type = KittyKeyBlocks<D, kitty_boosted_channels(D, 20)>;
  template <int D>
  using values = KittyValueRows<D>;
};

}  // namespace kvq::cuda::dev
