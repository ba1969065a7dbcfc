// Device codecs of NexusQuant (codecs/nexus/codec_nexus.h; rows: nexus_format.h; nearest points:
// codecs/nexus/e8_lattice.h, shared with the host so that the GPU stores the CPU's bytes): nexusquant's int8 rows and
// e8_2's 2-bit rows, keys stored without RoPE (PRE_ROPE: both referee rows; the cache's CacheGeometry::k_rope holds the
// cos / sin of every position). Interface: cache_device.cuh (DeviceCodecOf). Neither takes --kv-group or a clip: the
// group and clip arguments are unused.
//
// A row stores a lattice point p in the Hadamard domain and its fp16 scale s: x̂ = (p · s) · H, keys then RoPE'd at
// their position. value / values4 give ŷ = p · s (kHadamardRows); a whole row goes back through H together:
// finish_lanes (a row of 128 values over L lanes: the decoded tiles' keys over 4, the sums of P' · ŷ that their
// values leave over the warp, since Σ P' · ŷ · H = (Σ P' · ŷ) · H; rope_lanes re-applies RoPE to keys) and
// finish_channel (a block of D threads, one a channel: the reference twin), with the CPU's operations in the CPU's
// order (rotation/hadamard.cpp's butterflies stage by stage, then the 1/√d scale; rotation/rope.cpp's rope_row), so
// the GPU decodes the CPU's floats. The demotion (encode_row_at) undoes RoPE, transforms and rounds as
// NexusCodec::encode does.
#pragma once

#include "codecs/nexus/e8_lattice.h"
#include "codecs/nexus/nexus_format.h"
#include "cuda/cache_device.cuh"

namespace kvq::cuda::dev {

// 1/√d as rotation/hadamard.cpp's fwht_rows computes it in float.
template <int D>
__device__ __forceinline__ float hadamard_norm() {
  return exact::div(1.f, exact::sqrt(float(D)));
}

// One butterfly of rotation/hadamard.cpp: (a, b) <- (a + b, a - b).
__device__ __forceinline__ void butterfly(float& a, float& b) {
  const float x = a, y = b;
  a = exact::add(x, y);
  b = exact::sub(x, y);
}

template <int D, NexusFormat F, E8Rule R, bool PRE_ROPE>
struct NexusRows {
  static_assert(D >= 32 && (D & (D - 1)) == 0, "a Hadamard of a power of two");
  static constexpr bool kKeyBlocks = false;   // per-token rows
  static constexpr bool kHadamardRows = true;  // value / values4 give the Hadamard domain's p · s (finish_*)
  static constexpr bool kPreRope = PRE_ROPE;   // keys stored without RoPE: rope_lanes / finish_channel re-apply it
  static constexpr float kE8_2Top = 1.5f;      // e8_2's top level, in units of d
  static constexpr int kHalf = D / 2;

  static __device__ __forceinline__ float scale(const uint8_t* r) {
    return fp16_to_f32(*reinterpret_cast<const uint16_t*>(r));
  }
  // The lattice coordinate of code `code` (NexusCodec::points).
  static __device__ __forceinline__ float point(uint32_t code) {
    if constexpr (F == NexusFormat::kInt8) return 0.5f * float(int8_t(uint8_t(code)));
    else return float(code) - kE8_2Top;
  }

  // ŷ_c = p_c · s (the Hadamard domain).
  static __device__ __forceinline__ float value(const void* p, int /*row*/, int /*group*/, int c) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    const uint8_t* codes = r + kNexusCodesOffset;
    const uint32_t code = F == NexusFormat::kInt8 ? codes[c] : layout::unpack_code(codes, c, 2);
    return exact::mul(point(code), scale(r));
  }

  // ŷ of channels c0 .. c0 + 3 (c0 a multiple of 4): 4 consecutive bytes (int8 codes; e8_2: of their unit, at one
  // shift), read as two 16-bit words (rows are 2-byte aligned: 130 / 34 bytes back to back).
  static __device__ __forceinline__ void values4(const void* p, int /*row*/, int /*group*/, int c0, float out[4]) {
    const uint8_t* r = static_cast<const uint8_t*>(p);
    const int at = kNexusCodesOffset + (F == NexusFormat::kInt8 ? c0 : layout::code_byte(c0, 2));
    const uint16_t* h = reinterpret_cast<const uint16_t*>(r + at);
    const uint32_t w = uint32_t(h[0]) | uint32_t(h[1]) << 16;
    const int shift = F == NexusFormat::kInt8 ? 0 : layout::code_shift(c0, 2);
    const uint32_t mask = F == NexusFormat::kInt8 ? 0xffu : 3u;
    const float s = scale(r);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = exact::mul(point((w >> (8 * i + shift)) & mask), s);
  }

  // A row of D = 128 values over L lanes (lanes L r .. L r + L - 1 hold row r, q = lane % L): x[j], from values4, is
  // channel lane_channel<L>(q, j) — a run of min(8, D / L) channels in the lane, the next log2 L bits of the channel
  // the lane's, the rest the lane's again. The decoded tiles' keys take L = 4 (kHadamardLanes); the sums of P' · ŷ
  // that their values leave, L = 32 (a warp holding a row, 4 channels a lane; Σ P' · ŷ · H = (Σ P' · ŷ) · H).
  template <int L>
  static constexpr int kRun = D / L < 8 ? D / L : 8;
  template <int L>
  static __device__ __forceinline__ int lane_channel(int q, int j) {
    return j % kRun<L> + kRun<L> * q + kRun<L> * L * (j / kRun<L>);
  }
  // x̂ = ŷ · H / √d of the row over L lanes: the butterflies in the CPU's stages and operand order (h below the run in
  // the lane, up to run · L across the lanes by xor, the rest in the lane), then 1/√d: log2 L · D / L shuffles a lane
  // and row. Every lane of the L calls it.
  template <int L>
  static __device__ __forceinline__ void finish_lanes(float (&x)[D / L], int q) {
    static_assert(D == 128 && L >= 2 && L <= 32 && (L & (L - 1)) == 0, "a row of 128 values over 2 .. 32 lanes");
    constexpr int kValues = D / L, kIn = kRun<L>;
#pragma unroll
    for (int h = 1; h < D; h <<= 1) {
      if (h >= kIn && h < kIn * L) {  // across the lanes
        const int m = h / kIn;
#pragma unroll
        for (int j = 0; j < kValues; ++j) {
          const float o = __shfl_xor_sync(0xffffffffu, x[j], m);
          x[j] = (q & m) ? exact::sub(o, x[j]) : exact::add(x[j], o);
        }
      } else {
        const int l = h < kIn ? h : h / L;  // the stage's bit of j
#pragma unroll
        for (int j = 0; j < kValues; ++j)
          if (!(j & l)) butterfly(x[j], x[j + l]);
      }
    }
    const float s = hadamard_norm<D>();
#pragma unroll
    for (int j = 0; j < kValues; ++j) x[j] = exact::mul(x[j], s);
  }
  // RoPE at `angles` (the key's position) on the row finish_lanes left, for keys stored without it: the pairs
  // (f, f + 64) are the lane's when its runs and lanes span at most half the row.
  template <int L>
  static __device__ __forceinline__ void rope_lanes(float (&x)[D / L], int q, const float* angles) {
    static_assert(kRun<L> * L <= kHalf, "RoPE's pairs (f, f + d/2) in the lane");
    constexpr int kPair = kHalf / L;  // j + kPair: channel f + 64
#pragma unroll
    for (int j = 0; j < kPair; j += 4) {
      const int f = lane_channel<L>(q, j);  // 4 consecutive channels, 16-byte aligned
      const float4 c = __ldg(reinterpret_cast<const float4*>(angles + f));
      const float4 n = __ldg(reinterpret_cast<const float4*>(angles + kHalf + f));
      const float cv[4] = {c.x, c.y, c.z, c.w}, sv[4] = {n.x, n.y, n.z, n.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float a = x[j + e], b = x[j + e + kPair];
        x[j + e] = rope_value(a, b, cv[e], sv[e], false);
        x[j + e + kPair] = rope_value(a, b, cv[e], sv[e], true);
      }
    }
  }

  // Channel c of the decoded row, by a block of D threads (thread c holds ŷ_c = y): the butterflies stage by stage in
  // `scratch` (D floats of shared memory), the 1/√d scale, RoPE at `angles` (null: none). Every thread of the block
  // calls it; scratch is free again when it returns.
  static __device__ __forceinline__ float finish_channel(float y, int c, float* scratch, const float* angles) {
    scratch[c] = y;
    for (int h = 1; h < D; h *= 2) {
      __syncthreads();
      if (c < D / 2) {
        const int j = (c / h) * 2 * h + c % h;
        butterfly(scratch[j], scratch[j + h]);
      }
    }
    __syncthreads();
    const float s = hadamard_norm<D>();
    const float x = exact::mul(scratch[c], s);
    float out = x;
    if (angles != nullptr) {
      const bool second = c >= kHalf;
      const float o = exact::mul(scratch[c ^ kHalf], s);
      const int f = c % kHalf;
      out = rope_value(second ? o : x, second ? x : o, angles[f], angles[kHalf + f], second);
    }
    __syncthreads();
    return out;
  }

  // Demotion of one bf16 ring row by a warp, NexusCodec::encode (keys: RopeKeyCodec::encode_at first): RoPE undone at
  // `angles` (null: none), y = x · H / √d, s = max(max|y|, 1e-8) / (L/2), u = y / s, each 8-value group to its nearest
  // point, then the fp16 scale and the codes.
  static __device__ __forceinline__ void encode_row_at(const uint16_t* src, uint8_t* dst, const float* angles,
                                                       RowScratch<D>& sh) {
    const int lane = threadIdx.x;
    float* x = sh.x;
    for (int i = lane; i < D; i += 32) x[i] = bf16_to_f32(src[i]);
    __syncwarp();
    if (angles != nullptr) {  // rope_row(inverse): the angle's sine negated
      for (int f = lane; f < kHalf; f += 32) {
        const float a = x[f], b = x[f + kHalf], cs = angles[f], sn = -angles[kHalf + f];
        x[f] = exact::sub(exact::mul(a, cs), exact::mul(b, sn));
        x[f + kHalf] = exact::add(exact::mul(b, cs), exact::mul(a, sn));
      }
    }
    for (int h = 1; h < D; h *= 2) {
      __syncwarp();
      for (int i = lane; i < D / 2; i += 32) {
        const int j = (i / h) * 2 * h + i % h;
        butterfly(x[j], x[j + h]);
      }
    }
    __syncwarp();
    const float norm = hadamard_norm<D>();
    float amax = 0.f;
    for (int i = lane; i < D; i += 32) {
      x[i] = exact::mul(x[i], norm);
      amax = fmaxf(amax, fabsf(x[i]));
    }
    amax = warp_max(amax);
    const float s = exact::div(fmaxf(amax, 1e-8f), float(kNexusLevels / 2));
    for (int i = lane; i < D; i += 32) x[i] = exact::div(x[i], s);
    __syncwarp();
    for (int g = lane; g < D / kE8Dim; g += 32) {
      float p[kE8Dim];
      if constexpr (F == NexusFormat::kInt8) e8_nearest(x + g * kE8Dim, kNexusLevels / 2, R, p);
      else half_coset_nearest(x + g * kE8Dim, kE8_2Top, R == E8Rule::kStrict, p);
#pragma unroll
      for (int i = 0; i < kE8Dim; ++i)
        sh.codes[g * kE8Dim + i] = F == NexusFormat::kInt8 ? uint8_t(int8_t(2.f * p[i])) : uint8_t(p[i] + kE8_2Top);
    }
    __syncwarp();
    if (lane == 0) *reinterpret_cast<uint16_t*>(dst) = f32_to_fp16(fminf(s, 65504.f));
    uint8_t* codes = dst + kNexusCodesOffset;
    if constexpr (F == NexusFormat::kInt8) {
      for (int i = lane; i < D; i += 32) codes[i] = sh.codes[i];
    } else {  // byte j of unit u holds values 32 u + j + 8 k at bits 2 k (layout.h)
      for (int j = lane; j < D / 4; j += 32) {
        const int u = j / 8, jj = j % 8;
        uint32_t b = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) b |= uint32_t(sh.codes[u * layout::kUnitValues + jj + 8 * k]) << (2 * k);
        codes[j] = uint8_t(b);
      }
    }
  }

 private:
  // rope_row's pair (a = x[f], b = x[f + half]) at angle (cs, sn): x[f] (second: x[f + half]) after the rotation.
  static __device__ __forceinline__ float rope_value(float a, float b, float cs, float sn, bool second) {
    return second ? exact::add(exact::mul(b, cs), exact::mul(a, sn)) : exact::sub(exact::mul(a, cs), exact::mul(b, sn));
  }
};

template <>
struct DeviceCodecOf<CodecId::kNexusquant> {
  template <int D>
  using type = NexusRows<D, NexusFormat::kInt8, E8Rule::kShipped, true>;
};
template <>
struct DeviceCodecOf<CodecId::kE8_2> {
  template <int D>
  using type = NexusRows<D, NexusFormat::kE8_2, E8Rule::kShipped, true>;
};

}  // namespace kvq::cuda::dev
