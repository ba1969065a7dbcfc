// Device codecs of 16-bit rows of D values (codecs/half/codec_bf16.h; layout::Bf16Row<D>, 2 D bytes): bf16 rows (the
// sink and recent windows of every cache, and bf16 keys / values in the quantized region) and f16 rows (llama.cpp's
// default cache type: each bf16 ring value rounded to fp16 by common/half.h's f32_to_fp16, the host's operation).
// Interface: cache_device.cuh (DeviceCodecOf).
#pragma once

#include "cuda/cache_device.cuh"

namespace kvq::cuda::dev {

template <bool F16, int D>
struct HalfRows {
  static_assert(D % 8 == 0, "16-bit rows of whole 16-byte words");
  static constexpr bool kKeyBlocks = false;  // per-token rows

  // The values of the low and high halves of a 32-bit word of the row.
  static __device__ __forceinline__ float lo(uint32_t w) {
    return F16 ? __half2float(__ushort_as_half(uint16_t(w))) : __uint_as_float(w << 16);
  }
  static __device__ __forceinline__ float hi(uint32_t w) {
    return F16 ? __half2float(__ushort_as_half(uint16_t(w >> 16))) : __uint_as_float(w & 0xffff0000u);
  }

  // Value c of a row (row, group: unused).
  static __device__ __forceinline__ float value(const void* p, int /*row*/, int /*group*/, int c) {
    const uint16_t h = static_cast<const uint16_t*>(p)[c];
    return F16 ? fp16_to_f32(h) : bf16_to_f32(h);
  }

  // Values c0 .. c0 + 3 (c0 a multiple of 4): one 8-byte load.
  static __device__ __forceinline__ void values4(const void* p, int /*row*/, int /*group*/, int c0, float out[4]) {
    const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p) + c0);  // 8-byte aligned
    out[0] = lo(w.x);
    out[1] = hi(w.x);
    out[2] = lo(w.y);
    out[3] = hi(w.y);
  }

  // Scores of one row against the g <= GQ queries qs[h][:]: s[h] += q_h · k. The row, up to 128 values at a time
  // (16 loads of 16 bytes: bf16 rows start at multiples of 16 bytes, as cache_geometry lays them out), is loaded
  // before any use, so one DRAM round trip serves it rather than one per 4 values (two for D = 256: 128 more
  // registers would cost the kernel its blocks per SM).
  template <int GQ>
  static __device__ __forceinline__ void score(const void* p, int /*row*/, int /*group*/, const float (*qs)[D],
                                               const float (*/*qsum*/)[D / 32], int g, float* s) {
    constexpr int kPart = D > 128 ? 128 : D;  // values loaded at once
    static_assert(D % kPart == 0, "whole parts");
    const uint4* r = static_cast<const uint4*>(p);
#pragma unroll
    for (int c0 = 0; c0 < D; c0 += kPart) {
      uint4 w[kPart / 8];
#pragma unroll
      for (int i = 0; i < kPart / 8; ++i) w[i] = r[c0 / 8 + i];
#pragma unroll
      for (int i = 0; i < kPart / 8; ++i) {
        const uint32_t x[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int c = c0 + 8 * i + 2 * j;
          const float a = lo(x[j]), b = hi(x[j]);
#pragma unroll
          for (int h = 0; h < GQ; ++h)
            if (h < g) s[h] = fmaf(qs[h][c + 1], b, fmaf(qs[h][c], a, s[h]));
        }
      }
    }
  }

  // Demotion of one bf16 ring row src into the page row dst by the warp (lane = threadIdx.x): bf16, a plain copy; f16,
  // each value rounded to fp16.
  static __device__ __forceinline__ void encode_row(const uint16_t* src, uint8_t* dst, int /*group*/,
                                                    int /*clip_index*/, RowScratch<D>& /*sh*/) {
    const int lane = threadIdx.x;
    if constexpr (F16) {
      uint16_t* d16 = reinterpret_cast<uint16_t*>(dst);
      for (int i = lane; i < D; i += 32) d16[i] = f32_to_fp16(bf16_to_f32(src[i]));
    } else {
      const uint32_t* s32 = reinterpret_cast<const uint32_t*>(src);
      uint32_t* d32 = reinterpret_cast<uint32_t*>(dst);
      for (int i = lane; i < D / 2; i += 32) d32[i] = s32[i];
    }
  }
};
template <int D>
using Bf16Rows = HalfRows<false, D>;

template <>
struct DeviceCodecOf<CodecId::kBf16> {
  template <int D>
  using type = Bf16Rows<D>;
};
template <>
struct DeviceCodecOf<CodecId::kF16> {
  template <int D>
  using type = HalfRows<true, D>;
};

}  // namespace kvq::cuda::dev
