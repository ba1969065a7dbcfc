// Device codecs of TurboQuant (codecs/turboquant/codec_turboquant.h; formats and per-element maths:
// codecs/turboquant/turboquant.h, shared with the host so that the GPU stores the CPU's bytes): codebook keys
// (TqKeyRow<d, b>: codes, fp16 n) with or without the norm correction, and uniform values (TqValueRow<d, b>: codes,
// fp16 s, fp16 mn). Interface: cache_device.cuh (DeviceCodecOf); the keys read the cache's codebook
// (CacheGeometry::k_table: 2^b centroids, then 2^b - 1 midpoints, fp32, every head the same), so they name its Table
// and say kCodebook, and take it in place of the group and clip arguments.
//
// Rows are only 2-byte aligned (66 / 50 / 34-byte key rows back to back), so codes are read in 16-bit words. Every
// width packs code i at bits [b·i, b·i + b) of the row's little-endian bit string (codecs/turboquant/turboquant.h).
#pragma once

#include "codecs/group_quant.cuh"  // warp_argmin / warp_argmax: the CPU's first-index tie rule
#include "codecs/turboquant/turboquant.h"
#include "cuda/cache_device.cuh"

namespace kvq::cuda::dev {

// The codes of a row as 32-bit words of its bit string: w[i] = bytes 4i .. 4i + 3 (WORDS = d·b / 32).
template <int WORDS>
__device__ __forceinline__ void load_code_words(const uint8_t* codes, uint32_t (&w)[WORDS]) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(codes);  // 2-byte aligned rows
#pragma unroll
  for (int i = 0; i < WORDS; ++i) w[i] = uint32_t(h[2 * i]) | uint32_t(h[2 * i + 1]) << 16;
}
// Code c of BITS bits from the words (c a compile-time constant after unrolling: the shifts are resolved statically).
template <int BITS, int WORDS>
__device__ __forceinline__ int code_at(const uint32_t (&w)[WORDS], int c) {
  const int bit = BITS * c, word = bit / 32, shift = bit % 32;
  uint32_t v = w[word] >> shift;
  if (shift + BITS > 32) v |= w[word + 1] << (32 - shift);  // b = 3: a code across two words
  return int(v & ((1u << BITS) - 1u));
}
// Code c of a packed row, read byte-wise (the reference paths). The row goes on past its codes (n, or s and mn), so
// the second byte is always the row's.
template <int BITS>
__device__ __forceinline__ int code_of(const uint8_t* codes, int c) {
  const int bit = BITS * c;
  const uint32_t v = uint32_t(codes[bit / 8]) | uint32_t(codes[bit / 8 + 1]) << 8;
  return int((v >> (bit % 8)) & ((1u << BITS) - 1u));
}

// Codes c0 .. c0 + 3 of a packed row (c0 a multiple of 4), code i at bits [BITS i, BITS i + BITS) of the result:
// bits [BITS c0, BITS c0 + 4 BITS) of the row in one 8-bit (BITS = 2) or 16-bit load (4: an even byte; 3: 12 bits at
// bit 12 (c0 / 4), bytes bit / 8 and the next shifted by 0 or 4).
template <int BITS>
__device__ __forceinline__ uint32_t codes4(const uint8_t* r, int c0) {
  const int bit = BITS * c0;
  if constexpr (BITS == 2) {
    return r[bit / 8];
  } else if constexpr (BITS == 4) {
    return *reinterpret_cast<const uint16_t*>(r + bit / 8);  // rows are 2-byte aligned
  } else {
    return (uint32_t(r[bit / 8]) | uint32_t(r[bit / 8 + 1]) << 8) >> (bit % 8);
  }
}

template <int BITS, bool NC, int D>
struct TqKeyRows {
  static_assert(BITS == 2 || BITS == 3 || BITS == 4, "TurboQuant keys of 2, 3 or 4 bits");
  static constexpr bool kKeyBlocks = false;  // per-token rows
  using Table = float;                       // reads CacheGeometry::k_table (dev::key_table)
  static constexpr int kTableBytes = int(sizeof(float)) * ((2 << BITS) - 1);  // centroids | midpoints
  static constexpr bool kCodebook = true;
  static constexpr bool kNormCorrected = NC;  // factor() divides by the norm of the row's centroids
  static constexpr int kCodeBytes = tq::codes_bytes(D, BITS);
  static constexpr int kWords = kCodeBytes / 4;

  static __device__ __forceinline__ float norm(const uint8_t* r) {
    return fp16_to_f32(*reinterpret_cast<const uint16_t*>(r + kCodeBytes));
  }

  // Value c of a row (the reference twin): n · centroid[idx_c] (norm-corrected: / ||c||, the row's centroid vector).
  static __device__ __forceinline__ float value(const void* p, const float* codebook, int c) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    float x = codebook[code_of<BITS>(r, c)];
    if constexpr (NC) {
      float ss = 0.f;
      for (int i = 0; i < D; ++i) {
        const float ci = codebook[code_of<BITS>(r, i)];
        ss = fmaf(ci, ci, ss);
      }
      x = x / tq::centroid_norm(ss);
    }
    return norm(r) * x;
  }

  // Scores of one row against the g <= GQ queries qs[h][:]: s[h] += f · Σ_c q_h[c] centroid[idx_c], f = n (/ ||c||),
  // the centroids through the L1 cache (one line: 2^b floats), the row's codes in registers.
  template <int GQ>
  static __device__ __forceinline__ void score(const void* p, const float* codebook, const float (*qs)[D], int g,
                                               float* s) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    uint32_t w[kWords];
    load_code_words(r, w);
    float acc[GQ], ss = 0.f;
#pragma unroll
    for (int h = 0; h < GQ; ++h) acc[h] = 0.f;
#pragma unroll
    for (int c = 0; c < D; ++c) {
      const float x = __ldg(codebook + code_at<BITS>(w, c));
      if constexpr (NC) ss = fmaf(x, x, ss);
#pragma unroll
      for (int h = 0; h < GQ; ++h)
        if (h < g) acc[h] = fmaf(qs[h][c], x, acc[h]);
    }
    const float f = factor(r, ss);
#pragma unroll
    for (int h = 0; h < GQ; ++h)
      if (h < g) s[h] = fmaf(f, acc[h], s[h]);
  }

  // Decoded tiles (decode_attention_mma.cu), where the lanes of a row hold 4 values each: the centroids of codes
  // c0 .. c0 + 3, and the row's factor from ss, the sum of squares of all its D centroids: value c = factor ·
  // centroid[idx_c], factor = n (/ ||c|| with the norm correction).
  static __device__ __forceinline__ void centroids4(const void* p, const float* codebook, int c0, float out[4]) {
    const uint32_t v = codes4<BITS>(static_cast<const uint8_t*>(p), c0);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __ldg(codebook + ((v >> (BITS * i)) & ((1u << BITS) - 1u)));
  }
  static __device__ __forceinline__ float factor(const void* p, float ss) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    return NC ? norm(r) / tq::centroid_norm(ss) : norm(r);
  }

  // Demotion of one bf16 ring row src into the page row dst by the warp (lane = threadIdx.x), with the host's float
  // operations: n from the lanes' partial sums of squares and the xor butterfly (= codecs/turboquant/turboquant.h's
  // canonical order), x_i = y_i / (n + 1e-8), the bucket among the midpoints, the packed bytes, n as fp16.
  static __device__ __forceinline__ void encode_row(const uint16_t* src, uint8_t* dst, const float* codebook,
                                                    RowScratch<D>& sh) {
    const int lane = threadIdx.x;
    float part = 0.f;
    for (int i = lane; i < D; i += 32) {
      const float y = bf16_to_f32(src[i]);
      sh.x[i] = y;
      part = exact::add(part, exact::mul(y, y));
    }
    for (int o = 16; o > 0; o >>= 1) part = exact::add(part, __shfl_xor_sync(0xffffffffu, part, o));
    const float n = tq::sqrt_rn(part), den = tq::key_denominator(n);
    const float* midpoints = codebook + (1 << BITS);
    for (int i = lane; i < D; i += 32)
      sh.codes[i] = tq::bucket(exact::div(sh.x[i], den), midpoints, (1 << BITS) - 1);
    __syncwarp();
    for (int j = lane; j < kCodeBytes; j += 32) dst[j] = tq::pack_byte(sh.codes, j, BITS);
    if (lane == 0) *reinterpret_cast<uint16_t*>(dst + kCodeBytes) = f32_to_fp16(n);
    __syncwarp();  // sh is reused by the next row
  }
};

template <int BITS, int D>
struct TqValueRows {
  static_assert(BITS == 2 || BITS == 3 || BITS == 4, "TurboQuant values of 2, 3 or 4 bits");
  static constexpr bool kKeyBlocks = false;  // per-token rows
  static constexpr int kCodeBytes = tq::codes_bytes(D, BITS);

  // The stored fp16 s and mn as floats.
  static __device__ __forceinline__ void params(const uint8_t* r, float* s, float* mn) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(r + kCodeBytes);  // 4-byte aligned rows (36 / 52 / 68 B)
    *s = fp16_to_f32(p[0]), *mn = fp16_to_f32(p[1]);
  }

  // Value c of a row (row, group: unused): code · s + mn.
  static __device__ __forceinline__ float value(const void* p, int /*row*/, int /*group*/, int c) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    float s, mn;
    params(r, &s, &mn);
    return min_scale_value(float(code_of<BITS>(r, c)), s, mn);
  }

  // Values c0 .. c0 + 3 (c0 a multiple of 4): codes4, then code · s + mn.
  static __device__ __forceinline__ void values4(const void* p, int /*row*/, int /*group*/, int c0, float out[4]) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    float s, mn;
    params(r, &s, &mn);
    const uint32_t v = codes4<BITS>(r, c0);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = min_scale_value(float((v >> (BITS * i)) & ((1u << BITS) - 1u)), s, mn);
  }

  // Demotion of one bf16 ring row src into the page row dst by the warp: min and max with the CPU's first-index tie
  // rule (so ±0 ties store the same sign), s from the fp32 range, the codes with the fp32 s and mn, fp16 s and mn.
  static __device__ __forceinline__ void encode_row(const uint16_t* src, uint8_t* dst, int /*group*/,
                                                    int /*clip_index*/, RowScratch<D>& sh) {
    const int lane = threadIdx.x;
    float lo = INFINITY, hi = -INFINITY;
    int ilo = D, ihi = D;
    for (int i = lane; i < D; i += 32) {
      const float v = bf16_to_f32(src[i]);
      sh.x[i] = v;
      if (v < lo) lo = v, ilo = i;
      if (v > hi) hi = v, ihi = i;
    }
    warp_argmin(lo, ilo);
    warp_argmax(hi, ihi);
    const float s = tq::value_scale(lo, hi, BITS);
    __syncwarp();
    for (int i = lane; i < D; i += 32) sh.codes[i] = min_scale_code(sh.x[i], lo, s, BITS);
    __syncwarp();
    for (int j = lane; j < kCodeBytes; j += 32) dst[j] = tq::pack_byte(sh.codes, j, BITS);
    if (lane == 0) {
      uint16_t* p = reinterpret_cast<uint16_t*>(dst + kCodeBytes);
      p[0] = f32_to_fp16(s), p[1] = f32_to_fp16(lo);
    }
    __syncwarp();
  }
};

template <>
struct DeviceCodecOf<CodecId::kTq2nc> {
  template <int D>
  using type = TqKeyRows<2, true, D>;
};
template <>
struct DeviceCodecOf<CodecId::kTq3nc> {
  template <int D>
  using type = TqKeyRows<3, true, D>;
};
template <>
struct DeviceCodecOf<CodecId::kTq4nc> {
  template <int D>
  using type = TqKeyRows<4, true, D>;
};
template <>
struct DeviceCodecOf<CodecId::kTq2> {
  template <int D>
  using type = TqKeyRows<2, false, D>;
};
template <>
struct DeviceCodecOf<CodecId::kTq3> {
  template <int D>
  using type = TqKeyRows<3, false, D>;
};
template <>
struct DeviceCodecOf<CodecId::kTq4> {
  template <int D>
  using type = TqKeyRows<4, false, D>;
};
template <>
struct DeviceCodecOf<CodecId::kTqv2> {
  template <int D>
  using type = TqValueRows<2, D>;
};
template <>
struct DeviceCodecOf<CodecId::kTqv3> {
  template <int D>
  using type = TqValueRows<3, D>;
};
template <>
struct DeviceCodecOf<CodecId::kTqv4> {
  template <int D>
  using type = TqValueRows<4, D>;
};

}  // namespace kvq::cuda::dev
