// Tensor-core decode attention over the QUANTIZED region [S0, qe(t)) of each row's view, for int2 rows of one
// 128-value group and bf16 rows (keys and values chosen independently). The BF16 sink and recent windows are
// attended by the CUDA-core kernel (decode_attention.cu) into one more partial slot, and the merge kernel combines
// every slot exactly (log-sum-exp), so the result is one softmax over the whole view.
//
// Grid (row, kv head, split); 4 warps; a warp takes tiles of 16 positions (a tile never crosses a page: splits
// start at S0 + k·split_tokens and pages hold a multiple of 16 rows). mma.sync m16n8k16 with the GQA group on the
// N side (g <= 8 query heads, padded with zero queries to 8), so nothing is padded to 64 rows:
//   scores   S[pos][h] = Σ_d K[pos][d] · Q[d][h]       A = 16 positions x 16 dims of codes, B = 16 dims x 8 heads
//   values   O^T[d][h] += Σ_pos V^T[d][pos] · P'[pos][h]  A = 16 dims x 16 positions of codes, B = the tile's P'
// int2 codes become f16 exactly with the magic-number trick ((0x6400 | c) as f16 is 1024 + c, minus 1024), two
// codes per register from one 16-bit load; scale and zero stay out of the inner loop:
//   s = scale_k · (Σ code·q − zero_k · Σ q)     O = Σ_pos P'·code − Σ_pos P'·zero_v,  P' = p · scale_v
// q and P' are rounded to f16 for int2 rows (relative 2^-11) and to bf16 for bf16 rows (as FlashAttention does);
// products accumulate in f32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/cache_device.cuh"

namespace kvq::cuda {

namespace {

constexpr int kD = kHeadDim;
constexpr int kWarps = 4;
constexpr int kTile = 16;

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// Two 16-bit elements (lo = first) of the operand type.
template <bool F16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (F16) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}
template <bool F16>
__device__ __forceinline__ float round16(float x) {
  if constexpr (F16) return __half2float(__float2half_rn(x)); else return __bfloat162float(__float2bfloat16_rn(x));
}

// Codes at bit shift s of the two bytes of w (bits 0-7 and 8-15) as an f16 pair, exactly.
__device__ __forceinline__ uint32_t codes_f16x2(uint32_t w, int s) {
  uint32_t x = __byte_perm((w >> s) & 0x0303u, 0u, 0x4140) | 0x64006400u;  // f16 pair (1024 + c0, 1024 + c1)
  __half2 h = *reinterpret_cast<__half2*>(&x);
  h = __hsub2(h, __half2(__ushort_as_half(0x6400), __ushort_as_half(0x6400)));
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ float params_scale(uint32_t p) { return __half2float(__ushort_as_half(uint16_t(p))); }
__device__ __forceinline__ float params_zero(uint32_t p) { return __half2float(__ushort_as_half(uint16_t(p >> 16))); }

// Sum over the 8 lanes of a quad column (lanes with the same lane % 4).
__device__ __forceinline__ float col_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  return v + __shfl_xor_sync(0xffffffffu, v, 16);
}
__device__ __forceinline__ float col_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
}

// KQ / VQ: keys / values are int2 rows of one 128-value group (else bf16 rows).
template <bool KQ, bool VQ>
__global__ void __launch_bounds__(kWarps * 32) quant_attention_mma_kernel(CacheGeometry geo, AttentionLaunch a) {
  const int row = blockIdx.x, head = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
  const int g = a.n_heads / geo.n_kv;
  const RowDesc rd = a.rows[row];
  const int qe = quant_end(geo, rd.pos);
  const int lo = geo.sink + split * a.split_tokens, hi = min(qe, lo + a.split_tokens);
  const int64_t part = (int64_t(row) * geo.n_kv + head) * a.n_slots + split;

  __shared__ float w_acc[kWarps][kMaxGroupHeads][kD];
  __shared__ float w_m[kWarps][kMaxGroupHeads], w_l[kWarps][kMaxGroupHeads];
  __shared__ uint16_t p_tile[kWarps][kTile][8];  // the tile's P' (operand type) per position and head

  // B fragments of the queries (dims 16kc + {2tid, 2tid+1} and + 8, head gid), zero for heads >= g.
  const float* q = a.q_work + (int64_t(row) * a.n_heads + head * g) * kD;
  uint32_t qb[kD / 16][2];
  float qpart = 0.f;  // Σ of this lane's rounded q values of head gid
#pragma unroll
  for (int kc = 0; kc < kD / 16; ++kc) {
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (gid < g) {
      const float* qh = q + int64_t(gid) * kD + 16 * kc + 2 * tid;
      v[0] = qh[0], v[1] = qh[1], v[2] = qh[8], v[3] = qh[9];
    }
    qb[kc][0] = pack2<KQ>(v[0], v[1]);
    qb[kc][1] = pack2<KQ>(v[2], v[3]);
#pragma unroll
    for (int i = 0; i < 4; ++i) qpart += round16<KQ>(v[i]);
  }
  qpart += __shfl_xor_sync(0xffffffffu, qpart, 1);
  qpart += __shfl_xor_sync(0xffffffffu, qpart, 2);  // Σ q of head gid in every lane of quad gid
  const float qsum[2] = {__shfl_sync(0xffffffffu, qpart, 4 * (2 * tid)), __shfl_sync(0xffffffffu, qpart, 4 * (2 * tid + 1))};

  // State of heads 2tid, 2tid + 1 (entries >= g are padding and are dropped at the end).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, zsum[2] = {0.f, 0.f};
  float acc[kD / 16][4];  // O^T in the C layout: [m-tile][(dim gid, 2tid), (gid, 2tid+1), (gid+8, 2tid), (gid+8, 2tid+1)]
#pragma unroll
  for (int mt = 0; mt < kD / 16; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;

  for (int p0 = lo + warp * kTile; p0 < hi; p0 += kWarps * kTile) {
    const uint8_t* kbase = dev::page_row(geo, rd.seq, a.layer, 0, head, p0);
    const uint8_t* vbase = dev::page_row(geo, rd.seq, a.layer, 1, head, p0);
    const int nvalid = min(kTile, hi - p0);
    const int ra = min(gid, nvalid - 1), rb = min(gid + 8, nvalid - 1);  // clamped rows (masked below)

    // ---- scores of positions p0 + gid (c[0], c[1]) and p0 + gid + 8 (c[2], c[3]) for heads 2tid, 2tid + 1
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (KQ) {
      const uint8_t* rowa = kbase + int64_t(ra) * geo.k_row;
      const uint8_t* rowb = kbase + int64_t(rb) * geo.k_row;
#pragma unroll
      for (int u = 0; u < kD / 32; ++u) {
        const uint32_t wa = *reinterpret_cast<const uint16_t*>(rowa + 4 + 8 * u + 2 * tid);
        const uint32_t wb = *reinterpret_cast<const uint16_t*>(rowb + 4 + 8 * u + 2 * tid);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint32_t af[4] = {codes_f16x2(wa, 4 * half), codes_f16x2(wb, 4 * half), codes_f16x2(wa, 4 * half + 2),
                                  codes_f16x2(wb, 4 * half + 2)};
          mma_f16(s, af, qb[2 * u + half]);
        }
      }
      const uint32_t pa = *reinterpret_cast<const uint32_t*>(rowa), pb = *reinterpret_cast<const uint32_t*>(rowb);
      const float sa = params_scale(pa), za = params_zero(pa), sb = params_scale(pb), zb = params_zero(pb);
      s[0] = sa * (s[0] - za * qsum[0]);
      s[1] = sa * (s[1] - za * qsum[1]);
      s[2] = sb * (s[2] - zb * qsum[0]);
      s[3] = sb * (s[3] - zb * qsum[1]);
    } else {
      const uint16_t* rowa = reinterpret_cast<const uint16_t*>(kbase + int64_t(ra) * geo.k_row);
      const uint16_t* rowb = reinterpret_cast<const uint16_t*>(kbase + int64_t(rb) * geo.k_row);
#pragma unroll
      for (int kc = 0; kc < kD / 16; ++kc) {
        const int c = 16 * kc + 2 * tid;
        const uint32_t af[4] = {*reinterpret_cast<const uint32_t*>(rowa + c), *reinterpret_cast<const uint32_t*>(rowb + c),
                                *reinterpret_cast<const uint32_t*>(rowa + c + 8),
                                *reinterpret_cast<const uint32_t*>(rowb + c + 8)};
        mma_bf16(s, af, qb[kc]);
      }
    }
    if (gid >= nvalid) s[0] = s[1] = -INFINITY;
    if (gid + 8 >= nvalid) s[2] = s[3] = -INFINITY;

    // ---- online softmax per head (position 0 of the tile is always valid, so the max is finite)
    float pw[4], corr[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float m_new = fmaxf(m[j], col_max(fmaxf(s[j], s[2 + j])));
      corr[j] = __expf(m[j] - m_new);
      pw[j] = __expf(s[j] - m_new);
      pw[2 + j] = __expf(s[2 + j] - m_new);
      l[j] = l[j] * corr[j] + col_sum(pw[j] + pw[2 + j]);
      m[j] = m_new;
      zsum[j] *= corr[j];
    }
#pragma unroll
    for (int mt = 0; mt < kD / 16; ++mt) {
      acc[mt][0] *= corr[0], acc[mt][1] *= corr[1];
      acc[mt][2] *= corr[0], acc[mt][3] *= corr[1];
    }

    // ---- P' = p · scale_v into shared memory (the B operand of the value mma), and the zero term
    {
      float wa = 1.f, wb = 1.f, za = 0.f, zb = 0.f;
      if constexpr (VQ) {
        const uint32_t pa = *reinterpret_cast<const uint32_t*>(vbase + int64_t(ra) * geo.v_row);
        const uint32_t pb = *reinterpret_cast<const uint32_t*>(vbase + int64_t(rb) * geo.v_row);
        wa = params_scale(pa), za = params_zero(pa), wb = params_scale(pb), zb = params_zero(pb);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float xa = round16<VQ>(pw[j] * wa), xb = round16<VQ>(pw[2 + j] * wb);
        zsum[j] += xa * za + xb * zb;
        const uint32_t pair = pack2<VQ>(xa, xb);
        p_tile[warp][gid][2 * tid + j] = uint16_t(pair);
        p_tile[warp][gid + 8][2 * tid + j] = uint16_t(pair >> 16);
      }
    }
    __syncwarp();
    uint32_t pb_frag[2];  // positions {2tid, 2tid+1} and {2tid+8, 2tid+9}, head gid
    pb_frag[0] = uint32_t(p_tile[warp][2 * tid][gid]) | uint32_t(p_tile[warp][2 * tid + 1][gid]) << 16;
    pb_frag[1] = uint32_t(p_tile[warp][2 * tid + 8][gid]) | uint32_t(p_tile[warp][2 * tid + 9][gid]) << 16;
    __syncwarp();

    // ---- values: O^T[d][h] += Σ_pos V^T[d][pos] P'[pos][h]
    const int r0 = min(2 * tid, nvalid - 1), r1 = min(2 * tid + 1, nvalid - 1);
    const int r8 = min(2 * tid + 8, nvalid - 1), r9 = min(2 * tid + 9, nvalid - 1);
    if constexpr (VQ) {
      const uint8_t* c0 = vbase + int64_t(r0) * geo.v_row + 4 + gid;
      const uint8_t* c1 = vbase + int64_t(r1) * geo.v_row + 4 + gid;
      const uint8_t* c8 = vbase + int64_t(r8) * geo.v_row + 4 + gid;
      const uint8_t* c9 = vbase + int64_t(r9) * geo.v_row + 4 + gid;
#pragma unroll
      for (int u = 0; u < kD / 32; ++u) {
        const uint32_t x01 = uint32_t(c0[8 * u]) | uint32_t(c1[8 * u]) << 8;
        const uint32_t x89 = uint32_t(c8[8 * u]) | uint32_t(c9[8 * u]) << 8;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint32_t af[4] = {codes_f16x2(x01, 4 * half), codes_f16x2(x01, 4 * half + 2), codes_f16x2(x89, 4 * half),
                                  codes_f16x2(x89, 4 * half + 2)};
          mma_f16(acc[2 * u + half], af, pb_frag);
        }
      }
    } else {
      const uint16_t* v0 = reinterpret_cast<const uint16_t*>(vbase + int64_t(r0) * geo.v_row) + gid;
      const uint16_t* v1 = reinterpret_cast<const uint16_t*>(vbase + int64_t(r1) * geo.v_row) + gid;
      const uint16_t* v8 = reinterpret_cast<const uint16_t*>(vbase + int64_t(r8) * geo.v_row) + gid;
      const uint16_t* v9 = reinterpret_cast<const uint16_t*>(vbase + int64_t(r9) * geo.v_row) + gid;
#pragma unroll
      for (int mt = 0; mt < kD / 16; ++mt) {
        const int c = 16 * mt;
        const uint32_t af[4] = {uint32_t(v0[c]) | uint32_t(v1[c]) << 16, uint32_t(v0[c + 8]) | uint32_t(v1[c + 8]) << 16,
                                uint32_t(v8[c]) | uint32_t(v9[c]) << 16, uint32_t(v8[c + 8]) | uint32_t(v9[c + 8]) << 16};
        mma_bf16(acc[mt], af, pb_frag);
      }
    }
  }

  // ---- this warp's state to shared memory (zero term subtracted), then the block's merge into the split's slot
#pragma unroll
  for (int j = 0; j < 2; ++j) zsum[j] = col_sum(zsum[j]);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int h = 2 * tid + j;
    if (h >= g) continue;
    if (gid == 0) w_m[warp][h] = m[j], w_l[warp][h] = l[j];
#pragma unroll
    for (int mt = 0; mt < kD / 16; ++mt) {
      w_acc[warp][h][16 * mt + gid] = acc[mt][j] - zsum[j];
      w_acc[warp][h][16 * mt + gid + 8] = acc[mt][2 + j] - zsum[j];
    }
  }
  __syncthreads();
  dev::write_block_partial<kWarps>(w_m, w_l, w_acc, g, part, a);
}

}  // namespace

bool attention_mma_supported(const CacheGeometry& g) {
  if (kivi_keys(g)) return false;  // per-channel key blocks: the CUDA-core kernel
  const bool k_ok = g.k_bits == kBf16Bits || (g.k_bits == 2 && g.k_group == kD);
  const bool v_ok = g.v_bits == kBf16Bits || (g.v_bits == 2 && g.v_group == kD);
  return k_ok && v_ok && g.page_tokens % kTile == 0;
}

int launch_attention_mma(const CacheGeometry& g, const AttentionLaunch& a, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const dim3 grid(unsigned(a.n_rows), unsigned(g.n_kv), unsigned(a.n_splits));
  const bool kq = g.k_bits == 2, vq = g.v_bits == 2;
  if (kq && vq) quant_attention_mma_kernel<true, true><<<grid, kWarps * 32, 0, st>>>(g, a);
  else if (kq) quant_attention_mma_kernel<true, false><<<grid, kWarps * 32, 0, st>>>(g, a);
  else if (vq) quant_attention_mma_kernel<false, true><<<grid, kWarps * 32, 0, st>>>(g, a);
  else quant_attention_mma_kernel<false, false><<<grid, kWarps * 32, 0, st>>>(g, a);
  return cudaGetLastError();
}

}  // namespace kvq::cuda
