// Device codec of vLLM's FP8 rows (codecs/fp8/codec_fp8.h; formats and per-row maths: codecs/fp8/fp8.h, shared with
// the host, so that the GPU stores the CPU's bytes): e4m3 or e5m2 codes at scale 1.0 (Fp8Row<D>: D bytes, 8-byte
// aligned rows), or e4m3 codes then an fp32 scale per row (Fp8ScaledRow<D>: D + 4 bytes, 4-byte aligned).
// Interface: cache_device.cuh (DeviceCodecOf). Ungrouped: the group and clip arguments are unused.
//
// The scoring lane widens its codes through fp16, where both formats are exact: an e5m2 byte is the top byte of the
// fp16 of its value (inf and NaN included); an e4m3 byte b is the fp16 with bits sign | (b & 0x7f) << 7 times 2^8
// (subnormals included), except its NaN 0x7f / 0xff, selected apart. value() is the host's conversion (the twin).
#pragma once

#include "codecs/fp8/fp8.h"
#include "cuda/cache_device.cuh"

namespace kvq::cuda::dev {

template <fp8::Format F, bool kScaled, int D>
struct Fp8Rows {
  static_assert(D % 32 == 0, "fp8 rows: head_dim a multiple of 32");
  static_assert(!kScaled || F == fp8::Format::kE4m3, "per-row scales are e4m3's");
  static constexpr bool kKeyBlocks = false;  // per-token rows
  // Rows without scales of their own take the layer's per-tensor scale (cache_device.cuh: tensor_scaled): the kernels
  // multiply what value / values4 / score return by it, and demotion runs encode_row_scaled.
  static constexpr bool kTensorScaled = !kScaled;

  static __device__ __forceinline__ float scale(const uint8_t* r) {
    if constexpr (kScaled) {
      return *reinterpret_cast<const float*>(r + D);
    } else {
      return 1.f;
    }
  }
  // The value of code byte b (any of the 4 bytes of w at shift 8 i; the header comment's fp16 widening).
  static __device__ __forceinline__ float widen(uint32_t w, int i) {
    const uint32_t b = (w >> (8 * i)) & 0xffu;
    if constexpr (F == fp8::Format::kE5m2) {
      return __half2float(__ushort_as_half(uint16_t(b << 8)));
    } else {
      const float x = __half2float(__ushort_as_half(uint16_t((b & 0x80u) << 8 | (b & 0x7fu) << 7))) * 256.f;
      return (b & 0x7fu) == 0x7fu ? __int_as_float(0x7fc00000) : x;
    }
  }

  // Value c of a row (row, group: unused): the host's decode, fp8⁻¹(code) (· s).
  static __device__ __forceinline__ float value(const void* p, int /*row*/, int /*group*/, int c) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    const float x = fp8::decode<F>(r[c]);
    return kScaled ? exact::mul(x, scale(r)) : x;
  }

  // Values c0 .. c0 + 3 (c0 a multiple of 4): one 32-bit load.
  static __device__ __forceinline__ void values4(const void* p, int /*row*/, int /*group*/, int c0, float out[4]) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    const uint32_t w = *reinterpret_cast<const uint32_t*>(r + c0);
    const float s = scale(r);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = kScaled ? exact::mul(widen(w, i), s) : widen(w, i);
  }

  // Scores of one row against the g <= GQ queries qs[h][:]: s[h] += s_row · Σ_c q_h[c] x_c (s_row: 1 unscaled), the
  // row loaded in the widest words its alignment allows (4 or 8 bytes) before any use: one DRAM round trip serves it.
  template <int GQ>
  static __device__ __forceinline__ void score(const void* p, int /*row*/, int /*group*/, const float (*qs)[D],
                                               const float (*/*qsum*/)[D / 32], int g, float* s) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    constexpr int kWords = D / 4;
    uint32_t w[kWords];
    if constexpr (kScaled) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = reinterpret_cast<const uint32_t*>(r)[i];
    } else {
#pragma unroll
      for (int i = 0; i < kWords / 2; ++i) {
        const uint2 x = reinterpret_cast<const uint2*>(r)[i];
        w[2 * i] = x.x, w[2 * i + 1] = x.y;
      }
    }
    float acc[GQ];
#pragma unroll
    for (int h = 0; h < GQ; ++h) acc[h] = 0.f;
#pragma unroll
    for (int c = 0; c < D; ++c) {
      const float x = widen(w[c / 4], c % 4);
#pragma unroll
      for (int h = 0; h < GQ; ++h)
        if (h < g) acc[h] = fmaf(qs[h][c], x, acc[h]);
    }
    const float f = scale(r);
#pragma unroll
    for (int h = 0; h < GQ; ++h)
      if (h < g) s[h] = fmaf(f, acc[h], s[h]);
  }

  // Demotion of one bf16 ring row src into the page row dst by the warp (lane = threadIdx.x) at the per-tensor scale s:
  // code_i = fp8(x_i / s), the host's division (at s = 1: x_i).
  static __device__ __forceinline__ void encode_row_scaled(const uint16_t* src, uint8_t* dst, float s) {
    static_assert(!kScaled, "rows with scales of their own");
    for (int i = threadIdx.x; i < D; i += 32) dst[i] = fp8::encode<F>(exact::div(bf16_to_f32(src[i]), s));
    __syncwarp();
  }

  // Demotion of one bf16 ring row src into the page row dst by the warp (lane = threadIdx.x), with the host's float
  // operations: unscaled, each value's code; scaled, absmax by the warp (max: any order), s and 1 / s, the codes of
  // x · (1 / s), then s.
  static __device__ __forceinline__ void encode_row(const uint16_t* src, uint8_t* dst, int /*group*/,
                                                    int /*clip_index*/, RowScratch<D>& /*sh*/) {
    const int lane = threadIdx.x;
    if constexpr (!kScaled) {
      for (int i = lane; i < D; i += 32) dst[i] = fp8::encode<F>(bf16_to_f32(src[i]));
    } else {
      float absmax = 0.f;
      for (int i = lane; i < D; i += 32) absmax = fmaxf(absmax, fabsf(bf16_to_f32(src[i])));
      for (int o = 16; o > 0; o >>= 1) absmax = fmaxf(absmax, __shfl_xor_sync(0xffffffffu, absmax, o));
      const float s = fp8::token_head_scale(absmax), inv = fp8::inverse_scale(s);
      for (int i = lane; i < D; i += 32) dst[i] = fp8::f32_to_e4m3(exact::mul(bf16_to_f32(src[i]), inv));
      if (lane == 0) *reinterpret_cast<float*>(dst + D) = s;
    }
    __syncwarp();
  }
};

template <>
struct DeviceCodecOf<CodecId::kFp8e4m3> {
  template <int D>
  using type = Fp8Rows<fp8::Format::kE4m3, false, D>;
};
template <>
struct DeviceCodecOf<CodecId::kFp8e5m2> {
  template <int D>
  using type = Fp8Rows<fp8::Format::kE5m2, false, D>;
};
template <>
struct DeviceCodecOf<CodecId::kFp8PerTokenHead> {
  template <int D>
  using type = Fp8Rows<fp8::Format::kE4m3, true, D>;
};

}  // namespace kvq::cuda::dev
