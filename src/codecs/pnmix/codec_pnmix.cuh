// Device codec of PN-Mix keys (codecs/pnmix/codec_pnmix.h; row and table: codecs/pnmix/pnmix_format.h): per-token rows
// of fp16 (scale, zero) per width slot, then one bit stream of 1-4-bit codes, each head with widths of its own. The
// kernels pass the head's layout::PnmixHeadTable (KvCodec::device_table, dev::key_table) in place of the group and
// clip arguments: decoding reads a channel's code where the table says; demotion quantizes each width group with the
// §1 quantizer of the int rows (codecs/group_quant.cuh, the CPU's float operations), so both devices store the same
// bytes. Rows are byte-aligned (4 · slots + B · d / 8 bytes), so every field is read a byte at a time.
#pragma once

#include "codecs/group_quant.cuh"
#include "codecs/pnmix/pnmix_format.h"
#include "cuda/cache_device.cuh"

namespace kvq::cuda::dev {

template <int D>
struct PnmixKeyRows {
  static_assert(D % layout::kUnitValues == 0 && D <= kPnmixMaxHeadDim, "pnmix rows: d a multiple of 32 up to 256");
  static constexpr bool kKeyBlocks = false;  // per-token rows
  using Table = layout::PnmixHeadTable;      // reads CacheGeometry::k_table (dev::key_table)
  static constexpr int kTableBytes = int(sizeof(Table));

  // The fp16 scale and zero of width slot j of a row, as floats.
  static __device__ __forceinline__ float2 params(const uint8_t* r, int j) {
    const uint8_t* b = r + 4 * j;
    return make_float2(fp16_to_f32(uint16_t(b[0] | b[1] << 8)), fp16_to_f32(uint16_t(b[2] | b[3] << 8)));
  }
  // Value of the channel whose table entry is e: (code - zero) · scale of its slot (the host's dequant_value).
  static __device__ __forceinline__ float decode(const uint8_t* r, uint32_t e) {
    const float2 sz = params(r, layout::pnmix_code_slot(e));
    const uint32_t code = layout::pnmix_code_at(r, layout::pnmix_code_bit(e), layout::pnmix_code_width(e));
    return dequant(float(code), sz.x, sz.y);
  }

  // Value c of a row (the reference twin).
  static __device__ __forceinline__ float value(const void* p, const Table* t, int c) {
    return decode(static_cast<const uint8_t*>(p), __ldg(t->code_of + c));
  }

  // Values c0 .. c0 + 3 (decoded tiles).
  static __device__ __forceinline__ void values4(const void* p, const Table* t, int c0, float out[4]) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    const uint4 e = __ldg(reinterpret_cast<const uint4*>(t->code_of + c0));
    out[0] = decode(r, e.x), out[1] = decode(r, e.y), out[2] = decode(r, e.z), out[3] = decode(r, e.w);
  }

  // Scores of one row against the g <= GQ queries qs[h][:]: per width slot, in stream order, Σ q · code and Σ q over
  // its channels, then s[h] += scale · (Σ q code - zero · Σ q), so that scale and zero leave the inner loop (as the
  // int rows' score). The table's entries are the same for every lane (one broadcast load each).
  template <int GQ>
  static __device__ __forceinline__ void score(const void* p, const Table* t, const float (*qs)[D], int g, float* s) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
#pragma unroll
    for (int j = 0; j < kPnmixMaxBits; ++j) {
      const int w = __ldg(&t->slot[j].bits);
      if (w == 0) break;
      const int n = __ldg(&t->slot[j].n), first = __ldg(&t->slot[j].first), bit = __ldg(&t->slot[j].bit);
      float acc[GQ], qg[GQ];
#pragma unroll
      for (int h = 0; h < GQ; ++h) acc[h] = 0.f, qg[h] = 0.f;
      for (int i = 0; i < n; ++i) {
        const int c = __ldg(t->channel + first + i);
        const float code = float(layout::pnmix_code_at(r, bit + i * w, w));
#pragma unroll
        for (int h = 0; h < GQ; ++h)
          if (h < g) acc[h] = fmaf(qs[h][c], code, acc[h]), qg[h] += qs[h][c];
      }
      const float2 sz = params(r, j);
#pragma unroll
      for (int h = 0; h < GQ; ++h)
        if (h < g) s[h] = fmaf(sz.x, acc[h] - sz.y * qg[h], s[h]);
    }
  }

  // Demotion of one bf16 ring row src into the page row dst by the warp (lane = threadIdx.x), the host's
  // PnmixKeyCodec::encode: the row gathered in stream order (each width group's channels ascending, widths
  // ascending), each group quantized at its width with its clip index (quantize_group_warp: the CPU's order statistic
  // and float operations), the slots' parameters (zero for a slot this head leaves unused, as the host's memset), then
  // the codes' bit stream a byte per lane.
  static __device__ __forceinline__ void encode_row(const uint16_t* src, uint8_t* dst, const Table* t,
                                                    RowScratch<D>& sh) {
    const int lane = threadIdx.x;
    for (int i = lane; i < D; i += 32) sh.x[i] = bf16_to_f32(src[__ldg(t->channel + i)]);
    __syncwarp();
    const int slots = __ldg(&t->slots);
#pragma unroll
    for (int j = 0; j < kPnmixMaxBits; ++j) {
      if (j >= slots) break;
      const Table::Slot sl = t->slot[j];
      uint16_t scale = 0, zero = 0;  // every lane's copy of the group's parameters
      const float* x = sh.x + sl.first;
      uint8_t* codes = sh.codes + sl.first;
      switch (sl.bits) {
        case 1: quantize_group_warp<1>(x, sl.n, sl.clip_index, codes, &scale, &zero, &sh.thr); break;
        case 2: quantize_group_warp<2>(x, sl.n, sl.clip_index, codes, &scale, &zero, &sh.thr); break;
        case 3: quantize_group_warp<3>(x, sl.n, sl.clip_index, codes, &scale, &zero, &sh.thr); break;
        case 4: quantize_group_warp<4>(x, sl.n, sl.clip_index, codes, &scale, &zero, &sh.thr); break;
        default: break;  // an unused slot: zero parameters
      }
      __syncwarp();  // the group's codes, and sh.thr free for the next group
      if (lane < 4) dst[4 * j + lane] = uint8_t((lane < 2 ? scale : zero) >> (8 * (lane % 2)));
    }
    const int base = 32 * slots, n_bytes = (__ldg(&t->code_bits) + 7) / 8;
    for (int k = lane; k < n_bytes; k += 32) {
      uint32_t byte = 0;
      for (int b = 0; b < 8; ++b) {
        const int at = base + 8 * k + b;  // the row's bit
        for (int j = 0; j < slots; ++j) {
          const Table::Slot& sl = t->slot[j];
          const int off = at - sl.bit;
          if (sl.bits == 0 || off < 0 || off >= sl.n * sl.bits) continue;
          byte |= ((uint32_t(sh.codes[sl.first + off / sl.bits]) >> (off % sl.bits)) & 1u) << b;
          break;
        }
      }
      dst[4 * slots + k] = uint8_t(byte);
    }
    __syncwarp();
  }
};

template <>
struct DeviceCodecOf<CodecId::kPnmix> {
  template <int D>
  using type = PnmixKeyRows<D>;
};

}  // namespace kvq::cuda::dev
