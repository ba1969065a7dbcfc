// Device codec of llama.cpp's block rows (codecs/llamacpp/codec_llamacpp.h; blocks: codecs/llamacpp/llamacpp_blocks.h,
// shared with the host, so that the GPU stores the CPU's bytes): a row of one (token, kv head) is D / 32 blocks back
// to back, each an fp16 scale d and its codes — q8_0: 32 int8, x̂ = d·q; q5_0: a 32-bit high-bit word and 16 bytes of
// nibbles, x̂ = d·(q − 16); q4_1: an fp16 min m then 16 bytes, x̂ = d·q + m; q4_0: 16 bytes packed by halves,
// x̂ = d·(q − 8); iq4_nl: as q4_0's, x̂ = d·T[q]. Interface: cache_device.cuh (DeviceCodecOf). Ungrouped: the group
// and clip arguments are unused.
//
// Rows are 34 (q8_0), 22 (q5_0), 20 (q4_1) or 18 (q4_0, iq4_nl) bytes per 32 values, so rows are 8-, 4- or 2-byte
// aligned (pages of a multiple of 8 rows, cache_geometry), and the blocks inside only 2-byte aligned: the scoring lane
// loads its row (up to 4 blocks at a time) in the widest words the alignment allows and takes the fields out of
// registers (the byte offsets are compile-time constants after unrolling); values4 reads 16-bit words.
#pragma once

#include <type_traits>

#include "codecs/llamacpp/llamacpp_blocks.h"
#include "cuda/cache_device.cuh"

namespace kvq::cuda::dev {

template <class Block, int D>
struct LlamaCppRows {
  static constexpr bool kQ8 = std::is_same_v<Block, llamacpp::BlockQ8_0>;
  static constexpr bool kQ5 = std::is_same_v<Block, llamacpp::BlockQ5_0>;
  static constexpr bool kQ41 = std::is_same_v<Block, llamacpp::BlockQ4_1>;
  static constexpr bool kIq4 = std::is_same_v<Block, llamacpp::BlockIq4Nl>;
  static_assert(kQ8 || kQ5 || kQ41 || kIq4 || std::is_same_v<Block, llamacpp::BlockQ4_0>, "llama.cpp's block types");
  static_assert(D % llamacpp::kBlockValues == 0 && D / llamacpp::kBlockValues <= 32, "whole blocks, one per lane");
  static constexpr bool kKeyBlocks = false;  // per-token rows
  static constexpr int kBlocks = D / llamacpp::kBlockValues;
  static constexpr int kBlockBytes = int(sizeof(Block));
  static constexpr int kRowBytes = kBlocks * kBlockBytes;
  // Byte offsets inside a block: the codes (q8_0's int8, the others' nibbles) and q5_0's high-bit word.
  static constexpr int kCodesAt = kQ5 ? 6 : kQ41 ? 4 : 2;
  static constexpr int kHighBitsAt = 2;
  // The scoring lane holds up to 4 blocks at a time (a row of d = 128) as 32-bit words, loaded in the widest words the
  // rows' alignment allows (rows follow each other from an 8-byte aligned region).
  static constexpr int kPartBlocks = kBlocks < 4 ? kBlocks : 4;
  static_assert(kBlocks % kPartBlocks == 0, "whole parts");
  static constexpr int kPartBytes = kPartBlocks * kBlockBytes;
  static constexpr int kWords = (kPartBytes + 3) / 4;
  static constexpr int kAlign = kRowBytes % 8 == 0 ? 8 : kRowBytes % 4 == 0 ? 4 : 2;  // bytes, of rows and parts

  // Bytes [0, kPartBytes) of p into w (w[i] = bytes 4i .. 4i + 3; the tail of a last half word is zero).
  static __device__ __forceinline__ void load_part(const uint8_t* p, uint32_t (&w)[kWords]) {
    if constexpr (kAlign == 8) {
      const uint2* r = reinterpret_cast<const uint2*>(p);
#pragma unroll
      for (int i = 0; i < kWords / 2; ++i) {
        const uint2 x = r[i];
        w[2 * i] = x.x, w[2 * i + 1] = x.y;
      }
    } else if constexpr (kAlign == 4) {
      const uint32_t* r = reinterpret_cast<const uint32_t*>(p);
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = r[i];
    } else {
      const uint16_t* r = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
      for (int i = 0; i < kWords; ++i)
        w[i] = uint32_t(r[2 * i]) | (2 * i + 1 < kPartBytes / 2 ? uint32_t(r[2 * i + 1]) << 16 : 0u);
    }
  }
  static_assert(kAlign < 8 || (kWords % 2 == 0 && kPartBytes % 8 == 0), "8-byte loads of whole parts");

  // Byte i / the 16-bit field at even byte i of a part held as 32-bit words w (i a compile-time constant after
  // unrolling: the shifts resolve statically; an even i never straddles two words).
  static __device__ __forceinline__ uint32_t byte_at(const uint32_t (&w)[kWords], int i) {
    return (w[i / 4] >> (8 * (i % 4))) & 0xffu;
  }
  static __device__ __forceinline__ uint16_t half_at(const uint32_t (&w)[kWords], int i) {
    return uint16_t(w[i / 4] >> (8 * (i % 4)));
  }
  // iq4_nl's table T as two little-endian words of int8, T[0..7] and T[8..15] (a lookup in registers, not local
  // memory).
  static constexpr uint64_t iq4nl_word(int half) {
    uint64_t w = 0;
    for (int i = 0; i < 8; ++i) w |= uint64_t(uint8_t(int8_t(llamacpp::iq4nl_value(8 * half + i)))) << (8 * i);
    return w;
  }
  static __device__ __forceinline__ int iq4nl_level(uint32_t q) {
    constexpr uint64_t kLo = iq4nl_word(0), kHi = iq4nl_word(1);
    return int(int8_t(((q < 8 ? kLo : kHi) >> (8 * (q & 7u))) & 0xffu));
  }
  // The level of a 4-bit code q, or of q5_0's 5-bit one (x̂ = d·level, + m for q4_1).
  static __device__ __forceinline__ int level_of(uint32_t q) {
    if constexpr (kIq4) {
      return iq4nl_level(q);
    } else if constexpr (kQ5) {
      return int(q) - 16;
    } else if constexpr (kQ41) {
      return int(q);
    } else {
      return int(q) - 8;
    }
  }
  // The level of value j of a block starting at byte `at` of a part held in w.
  static __device__ __forceinline__ int level_at(const uint32_t (&w)[kWords], int at, int j) {
    if constexpr (kQ8) {
      return int(int8_t(byte_at(w, at + kCodesAt + j)));
    } else {
      uint32_t q = (byte_at(w, at + kCodesAt + j % 16) >> (j < 16 ? 0 : 4)) & 0xfu;
      if constexpr (kQ5) {
        const uint32_t qh = uint32_t(half_at(w, at + kHighBitsAt)) | uint32_t(half_at(w, at + kHighBitsAt + 2)) << 16;
        q |= ((qh >> j) & 1u) << 4;
      }
      return level_of(q);
    }
  }

  // Value c of a row (row, group: unused): the host's dequantizer, llamacpp::value (the reference twin's decode).
  static __device__ __forceinline__ float value(const void* p, int /*row*/, int /*group*/, int c) {
    const Block* b = static_cast<const Block*>(p);  // 2-byte aligned blocks, as the struct's fp16 field needs
    return llamacpp::value(b[c / llamacpp::kBlockValues], c % llamacpp::kBlockValues);
  }

  // Values c0 .. c0 + 3 (c0 a multiple of 4, so one block's): its d (and m) and two 16-bit loads of the codes (q8_0: 4
  // bytes; the others: the 4 bytes holding them in their low (c0 % 32 < 16) or high nibbles; q5_0 also its high-bit
  // word). x̂ = d·level (+ m) as value() rounds it.
  static __device__ __forceinline__ void values4(const void* p, int /*row*/, int /*group*/, int c0, float out[4]) {
    const uint8_t* blk = static_cast<const uint8_t*>(p) + (c0 / 32) * kBlockBytes;
    const int j = c0 % 32;
    const uint16_t* f = reinterpret_cast<const uint16_t*>(blk);  // 2-byte aligned blocks
    const float d = fp16_to_f32(f[0]);
    const uint16_t* h = reinterpret_cast<const uint16_t*>(blk + kCodesAt + (kQ8 ? j : j % 16));  // even offsets
    const uint32_t w = uint32_t(h[0]) | uint32_t(h[1]) << 16;
    uint32_t qh = 0;
    if constexpr (kQ5) qh = (uint32_t(f[1]) | uint32_t(f[2]) << 16) >> j;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int level;
      if constexpr (kQ8) {
        level = int(int8_t(w >> (8 * i)));
      } else {
        level = level_of(((w >> (8 * i + (j < 16 ? 0 : 4))) & 0xfu) | (kQ5 ? ((qh >> i) & 1u) << 4 : 0u));
      }
      out[i] = exact::mul(float(level), d);
      if constexpr (kQ41) out[i] = exact::add(out[i], fp16_to_f32(f[1]));
    }
  }

  // Scores of one row against the g <= GQ queries qs[h][:]: s[h] += Σ_b d_b (q_h,b · level_b) (+ m_b Σ q_h,b for q4_1,
  // qsum: Σ q over each block), the scale applied once per block and query as the CPU's block kernels do
  // (codecs/llamacpp/simd_blocks_impl.h). A part of up to 4 blocks (at d = 128 the whole row) is loaded before any
  // use, so one DRAM round trip serves it.
  template <int GQ>
  static __device__ __forceinline__ void score(const void* p, int /*row*/, int /*group*/, const float (*qs)[D],
                                               const float (*qsum)[D / 32], int g, float* s) {
#pragma unroll
    for (int b0 = 0; b0 < kBlocks; b0 += kPartBlocks) {
      uint32_t w[kWords];
      load_part(static_cast<const uint8_t*>(p) + b0 * kBlockBytes, w);
#pragma unroll
      for (int b = 0; b < kPartBlocks; ++b) {
        const int at = b * kBlockBytes;
        const float d = fp16_to_f32(half_at(w, at));
        float acc[GQ];
#pragma unroll
        for (int h = 0; h < GQ; ++h) acc[h] = 0.f;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const float x = float(level_at(w, at, j));
#pragma unroll
          for (int h = 0; h < GQ; ++h)
            if (h < g) acc[h] = fmaf(qs[h][(b0 + b) * 32 + j], x, acc[h]);
        }
#pragma unroll
        for (int h = 0; h < GQ; ++h)
          if (h < g) {
            s[h] = fmaf(d, acc[h], s[h]);
            if constexpr (kQ41) s[h] = fmaf(fp16_to_f32(half_at(w, at + 2)), qsum[h][b0 + b], s[h]);
          }
      }
    }
  }

  // Demotion of one bf16 ring row src into the page row dst by the warp (lane = threadIdx.x): the row as floats, then
  // lane b < kBlocks quantizes block b with the host's quantizer (llamacpp::quantize: the same IEEE operations,
  // common/hd.h), so the stored bytes are the CPU cache's.
  static __device__ __forceinline__ void encode_row(const uint16_t* src, uint8_t* dst, int /*group*/,
                                                    int /*clip_index*/, RowScratch<D>& sh) {
    const int lane = threadIdx.x;
    for (int i = lane; i < D; i += 32) sh.x[i] = bf16_to_f32(src[i]);
    __syncwarp();
    if (lane < kBlocks) {
      Block b;
      llamacpp::quantize(sh.x + lane * llamacpp::kBlockValues, b);
      reinterpret_cast<Block*>(dst)[lane] = b;
    }
    __syncwarp();  // sh is reused by the next row
  }
};

template <>
struct DeviceCodecOf<CodecId::kQ8_0> {
  template <int D>
  using type = LlamaCppRows<llamacpp::BlockQ8_0, D>;
};
template <>
struct DeviceCodecOf<CodecId::kQ4_0> {
  template <int D>
  using type = LlamaCppRows<llamacpp::BlockQ4_0, D>;
};
template <>
struct DeviceCodecOf<CodecId::kQ5_0> {
  template <int D>
  using type = LlamaCppRows<llamacpp::BlockQ5_0, D>;
};
template <>
struct DeviceCodecOf<CodecId::kQ4_1> {
  template <int D>
  using type = LlamaCppRows<llamacpp::BlockQ4_1, D>;
};
template <>
struct DeviceCodecOf<CodecId::kIq4Nl> {
  template <int D>
  using type = LlamaCppRows<llamacpp::BlockIq4Nl, D>;
};

}  // namespace kvq::cuda::dev
