// Device codec of bf16 rows of D values (codecs/half/codec_bf16.h; layout::Bf16Row<D>, 2 D bytes): the sink and recent
// windows of every cache, and bf16 keys / values in the quantized region. Interface: cache_device.cuh (DeviceCodecOf).
#pragma once

#include "cuda/cache_device.cuh"

namespace kvq::cuda::dev {

template <int D>
struct Bf16Rows {
  static_assert(D % 8 == 0, "bf16 rows of whole 16-byte words");
  static constexpr bool kKeyBlocks = false;  // per-token rows

  // Value c of a row (row, group: unused).
  static __device__ __forceinline__ float value(const void* p, int /*row*/, int /*group*/, int c) {
    return bf16_to_f32(static_cast<const uint16_t*>(p)[c]);
  }

  // Values c0 .. c0 + 3 (c0 a multiple of 4): one 8-byte load.
  static __device__ __forceinline__ void values4(const void* p, int /*row*/, int /*group*/, int c0, float out[4]) {
    const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p) + c0);  // 8-byte aligned
    out[0] = __uint_as_float(w.x << 16);
    out[1] = __uint_as_float(w.x & 0xffff0000u);
    out[2] = __uint_as_float(w.y << 16);
    out[3] = __uint_as_float(w.y & 0xffff0000u);
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
          const float lo = __uint_as_float(x[j] << 16), hi = __uint_as_float(x[j] & 0xffff0000u);
#pragma unroll
          for (int h = 0; h < GQ; ++h)
            if (h < g) s[h] = fmaf(qs[h][c + 1], hi, fmaf(qs[h][c], lo, s[h]));
        }
      }
    }
  }

  // Demotion of one bf16 ring row src into the page row dst by the warp (lane = threadIdx.x): a plain copy.
  static __device__ __forceinline__ void encode_row(const uint16_t* src, uint8_t* dst, int /*group*/,
                                                    int /*clip_index*/, RowScratch<D>& /*sh*/) {
    const int lane = threadIdx.x;
    const uint32_t* s32 = reinterpret_cast<const uint32_t*>(src);
    uint32_t* d32 = reinterpret_cast<uint32_t*>(dst);
    for (int i = lane; i < D / 2; i += 32) d32[i] = s32[i];
  }
};

template <>
struct DeviceCodecOf<CodecId::kBf16> {
  template <int D>
  using type = Bf16Rows<D>;
};

}  // namespace kvq::cuda::dev
