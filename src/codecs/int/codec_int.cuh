// Device codec of per-token int rows of D values (codecs/int/codec_int.h; layout::IntRow: fp16 (scale, zero) per group
// of G values, then the packed BITS-bit codes): int8 / int4 / int2, and the values (and per-token keys) of KIVI. G is a
// run-time value (32, 64, 128 dividing D: the instance table's groups). Interface: cache_device.cuh (DeviceCodecOf).
#pragma once

#include "codecs/group_quant.cuh"
#include "cuda/cache_device.cuh"

namespace kvq::cuda::dev {

template <int BITS, int D>
struct IntRows {
  static_assert(BITS == 2 || BITS == 4 || BITS == 8, "int rows of 2, 4 or 8 bits");
  static_assert(D % layout::kUnitValues == 0, "int rows pack units of 32 values");
  static constexpr bool kKeyBlocks = false;  // per-token rows

  // Value c of a row with group G (row: unused).
  static __device__ __forceinline__ float value(const void* p, int /*row*/, int group, int c) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    const uint16_t* params = reinterpret_cast<const uint16_t*>(r);  // 4-byte aligned rows (sizes: multiples of 4)
    const int gi = c / group;
    const float scale = fp16_to_f32(params[2 * gi]), zero = fp16_to_f32(params[2 * gi + 1]);
    const uint8_t* codes = r + layout::int_row_params_bytes(D, group);
    const int code = (codes[layout::code_byte(c, BITS)] >> layout::code_shift(c, BITS)) & ((1 << BITS) - 1);
    return dequant(float(code), scale, zero);
  }

  // Values c0 .. c0 + 3 (c0 a multiple of 4) of a row with group G.
  static __device__ __forceinline__ void values4(const void* p, int /*row*/, int group, int c0, float out[4]) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    const uint16_t* params = reinterpret_cast<const uint16_t*>(r);
    const int gi = c0 / group;  // the 4 values share a group (G is a multiple of 32)
    const float scale = fp16_to_f32(params[2 * gi]), zero = fp16_to_f32(params[2 * gi + 1]);
    // Values c0 .. c0 + 3 sit in 4 consecutive bytes of their unit at the same shift (layout.h): one aligned word.
    const int ub = layout::unit_bytes(BITS), vv = c0 % layout::kUnitValues;
    const uint32_t w = *reinterpret_cast<const uint32_t*>(r + layout::int_row_params_bytes(D, group) +
                                                          (c0 / layout::kUnitValues) * ub + vv % ub);
    const int shift = BITS * (vv / ub), mask = (1 << BITS) - 1;
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = dequant(float((w >> (8 * i + shift)) & mask), scale, zero);
  }

  // Scores of one row against the g <= GQ queries qs[h][:]: s[h] += q_h · k̂. int2 / int4: per unit of 32 values,
  // Σ code · q accumulated, then scale · (Σ code q - zero · Σ q) with qsum[h][unit] = Σ q over the unit, so scale and
  // zero leave the inner loop. int8: the row's values, 4 at a time, then q · k.
  template <int GQ>
  static __device__ __forceinline__ void score(const void* p, int /*row*/, int group, const float (*qs)[D],
                                               const float (*qsum)[D / 32], int g, float* s) {
    if constexpr (BITS == 8) {
      score_by_values4<IntRows, D, GQ>(p, 0, group, qs, g, s);
    } else {
      constexpr int ub = layout::unit_bytes(BITS), words = ub / 4, mask = (1 << BITS) - 1;
      const uint8_t* r = static_cast<const uint8_t*>(p);
      const uint16_t* params = reinterpret_cast<const uint16_t*>(r);
      const uint32_t* codes = reinterpret_cast<const uint32_t*>(r + layout::int_row_params_bytes(D, group));
#pragma unroll
      for (int u = 0; u < D / 32; ++u) {
        uint32_t w[words];
#pragma unroll
        for (int i = 0; i < words; ++i) w[i] = codes[u * words + i];
        const int gi = u * 32 / group;
        const float scale = fp16_to_f32(params[2 * gi]), zero = fp16_to_f32(params[2 * gi + 1]);
        float acc[GQ];
#pragma unroll
        for (int h = 0; h < GQ; ++h) acc[h] = 0.f;
#pragma unroll
        for (int v = 0; v < 32; ++v) {
          const int jj = v % ub, k = v / ub;
          const float code = float((w[jj / 4] >> (8 * (jj % 4) + BITS * k)) & mask);
#pragma unroll
          for (int h = 0; h < GQ; ++h)
            if (h < g) acc[h] = fmaf(qs[h][u * 32 + v], code, acc[h]);
        }
#pragma unroll
        for (int h = 0; h < GQ; ++h)
          if (h < g) s[h] = fmaf(scale, acc[h] - zero * qsum[h][u], s[h]);
      }
    }
  }

  // Demotion of one bf16 ring row src into the page row dst (layout::IntRow, group G) by one warp: the group quantizer
  // of codecs/group_quant.cpp with the same float operations, per group.
  static __device__ __forceinline__ void encode_row(const uint16_t* src, uint8_t* dst, int group, int clip_index,
                                                    RowScratch<D>& sh) {
    for (int i = threadIdx.x & 31; i < D; i += 32) sh.x[i] = bf16_to_f32(src[i]);
    __syncwarp();
    encode_x(dst, group, clip_index, sh);
  }

  // The same from the row's floats in sh.x (written and visible to the warp): int8 windows (KV4-RL) encode the row as
  // appended, not its bf16 rounding (KvCache::append_rows).
  static __device__ __forceinline__ void encode_x(uint8_t* dst, int group, int clip_index, RowScratch<D>& sh) {
    const int lane = threadIdx.x & 31;
    const int G = group;
    for (int gi = 0; gi < D / G; ++gi) {
      quantize_group_warp<BITS>(sh.x + gi * G, G, clip_index, sh.codes + gi * G, &sh.params[2 * gi],
                                &sh.params[2 * gi + 1], &sh.thr);
      __syncwarp();
    }
    // Params (fp16 scale, zero per group), then the packed codes: byte j of unit u holds values u 32 + j % (4b) +
    // 4b k, k < 8 / b, at bits b k (layout.h).
    uint16_t* p16 = reinterpret_cast<uint16_t*>(dst);
    for (int i = lane; i < 2 * (D / G); i += 32) p16[i] = sh.params[i];
    uint8_t* packed = dst + layout::int_row_params_bytes(D, G);
    const int ub = layout::unit_bytes(BITS), n_bytes = layout::packed_bytes(D, BITS);
    for (int j = lane; j < n_bytes; j += 32) {
      const int u = j / ub, jj = j % ub;
      uint32_t b = 0;
      for (int k = 0; k < 8 / BITS; ++k)
        b |= uint32_t(sh.codes[u * layout::kUnitValues + jj + ub * k]) << (BITS * k);
      packed[j] = uint8_t(b);
    }
  }
};

template <>
struct DeviceCodecOf<CodecId::kInt8> {
  template <int D>
  using type = IntRows<8, D>;
};
template <>
struct DeviceCodecOf<CodecId::kInt4> {
  template <int D>
  using type = IntRows<4, D>;
};
template <>
struct DeviceCodecOf<CodecId::kInt2> {
  template <int D>
  using type = IntRows<2, D>;
};

}  // namespace kvq::cuda::dev
