// Append and demotion kernels of the GPU cache.
//   append: per (row, kv head, K/V): centre (keys), rotate by R_K / R_V (double accumulation in the CPU's order, so
//           the rows are bit-identical to kv/transform.cpp), round to bf16 into the sink or the recent ring.
//   demote: per (position, kv head, K/V), one warp: bf16 ring row -> the group quantizer of kv/group_quant.cpp
//           with the same float operations (no fast math, no contraction) -> layout::IntRow in its page.
//   demote KIVI keys: per (block of G positions, kv head), one thread per channel: the same quantizer over the
//           channel's G bf16 ring values (the CPU's serial loop order) -> layout::KiviKeyBlock in its page.
#include <cuda_runtime.h>

#include "cuda/cache_device.cuh"

namespace kvq::cuda {

namespace {

constexpr int kD = kHeadDim;

__global__ void append_rows_kernel(CacheGeometry g, int layer, const RowDesc* rows, const float* k, const float* v,
                                   TransformPtrs t) {
  const int row = blockIdx.x, head = blockIdx.y, kv = blockIdx.z, c = threadIdx.x;
  const RowDesc rd = rows[row];
  __shared__ float xs[kD];
  const float* src = (kv ? v : k) + (int64_t(row) * g.n_kv + head) * kD;
  float x = src[c];
  const int64_t lh = int64_t(layer) * g.n_kv + head;
  if (kv == 0 && t.key_mean) x = __fsub_rn(x, t.key_mean[lh * kD + c]);
  const float* R = kv ? t.r_v : t.r_k;
  if (R) {
    xs[c] = x;
    __syncthreads();
    const float* Rl = R + lh * kD * kD;
    double acc = 0.0;
    for (int a = 0; a < kD; ++a) acc = __dadd_rn(acc, __dmul_rn(double(xs[a]), double(Rl[a * kD + c])));
    x = float(acc);
  }
  uint16_t* dst = rd.pos < g.sink ? const_cast<uint16_t*>(dev::sink_row(g, rd.seq, layer, kv, head, rd.pos))
                                  : dev::ring_row(g, rd.seq, layer, kv, head, rd.pos);
  dst[c] = dev::f32_to_bf16(x);
}

// Warp-wide (value, index) minimum / maximum with the CPU's tie rule (the first index wins).
__device__ __forceinline__ void warp_argmin(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov < v || (ov == v && oi < i)) v = ov, i = oi;
  }
}
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
  }
}

__device__ __forceinline__ float clampf(float x, float lo, float hi) { return x < lo ? lo : (hi < x ? hi : x); }

// One group x[0, n) (n = G, a multiple of 32) quantized by the warp; codes[i] one per byte; returns params.
__device__ void quantize_group_warp(const float* x, int n, int bits, int clip_index, uint8_t* codes,
                                    uint16_t* scale_out, uint16_t* zero_out, float* thr_slot) {
  const int lane = threadIdx.x & 31;
  // Clip threshold: |x| sorted ascending at clip_index (the k-th smallest, by counting), or max |x|.
  if (clip_index < 0) {
    float m = 0.f;
    for (int i = lane; i < n; i += 32) m = fmaxf(m, fabsf(x[i]));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) *thr_slot = m;
  } else {
    for (int i = lane; i < n; i += 32) {
      const float a = fabsf(x[i]);
      int less = 0, leq = 0;
      for (int j = 0; j < n; ++j) {
        const float b = fabsf(x[j]);
        less += b < a;
        leq += b <= a;
      }
      if (less <= clip_index && clip_index < leq) *thr_slot = a;  // ties write the same value
    }
  }
  __syncwarp();
  const float thr = *thr_slot;
  float lo = INFINITY, hi = -INFINITY;
  int ilo = n, ihi = n;
  for (int i = lane; i < n; i += 32) {
    const float v = clampf(x[i], -thr, thr);
    if (v < lo) lo = v, ilo = i;
    if (v > hi) hi = v, ihi = i;
  }
  warp_argmin(lo, ilo);
  warp_argmax(hi, ihi);
  const float levels = float((1 << bits) - 1);
  const float scale = dev::fp16_to_f32(dev::f32_to_fp16(__fdiv_rn(__fsub_rn(hi, lo), levels)));
  if (!(hi > lo) || !(scale > 0.f) || !isfinite(scale)) {
    *scale_out = dev::f32_to_fp16(fabsf(lo));
    *zero_out = dev::f32_to_fp16(lo < 0.f ? 1.f : (lo > 0.f ? -1.f : 0.f));
    for (int i = lane; i < n; i += 32) codes[i] = 0;
    return;
  }
  *scale_out = dev::f32_to_fp16(scale);
  const uint16_t zbits = dev::f32_to_fp16(__fdiv_rn(-lo, scale));
  *zero_out = zbits;
  const float zero = dev::fp16_to_f32(zbits);
  for (int i = lane; i < n; i += 32) {
    const float v = clampf(x[i], -thr, thr);
    const float c = floorf(__fadd_rn(__fadd_rn(__fdiv_rn(v, scale), zero), 0.5f));
    codes[i] = uint8_t(clampf(c, 0.f, levels));
  }
}

__global__ void demote_rows_kernel(CacheGeometry g, int layer, const RowDesc* items) {
  const int head = blockIdx.y, kv = blockIdx.z, lane = threadIdx.x;
  const RowDesc it = items[blockIdx.x];
  __shared__ float x[kD];
  __shared__ uint8_t codes[kD];
  __shared__ uint16_t params[2 * (kD / 32)];
  __shared__ float thr_slot;
  if (kv == 0 && kivi_keys(g)) return;  // KIVI key blocks: demote_kivi_keys_kernel
  const uint16_t* src = dev::ring_row(g, it.seq, layer, kv, head, it.pos);
  uint8_t* dst = dev::page_row(g, it.seq, layer, kv, head, it.pos);
  const int bits = kv ? g.v_bits : g.k_bits;
  if (bits == kBf16Bits) {  // bf16 quantized region: a plain copy of the row
    const uint32_t* s32 = reinterpret_cast<const uint32_t*>(src);
    uint32_t* d32 = reinterpret_cast<uint32_t*>(dst);
    for (int i = lane; i < kD / 2; i += 32) d32[i] = s32[i];
    return;
  }
  for (int i = lane; i < kD; i += 32) x[i] = dev::bf16_to_f32(src[i]);
  __syncwarp();
  const int G = kv ? g.v_group : g.k_group, clip_index = kv ? g.v_clip_index : g.k_clip_index;
  for (int gi = 0; gi < kD / G; ++gi) {
    quantize_group_warp(x + gi * G, G, bits, clip_index, codes + gi * G, &params[2 * gi], &params[2 * gi + 1],
                        &thr_slot);
    __syncwarp();
  }
  // Params (fp16 scale, zero per group), then the packed codes: byte j of unit u holds values u 32 + j % (4b) +
  // 4b k, k < 8 / b, at bits b k (layout.h).
  uint16_t* p16 = reinterpret_cast<uint16_t*>(dst);
  for (int i = lane; i < 2 * (kD / G); i += 32) p16[i] = params[i];
  uint8_t* packed = dst + layout::int_row_params_bytes(kD, G);
  const int ub = layout::unit_bytes(bits), n_bytes = layout::packed_bytes(kD, bits);
  for (int j = lane; j < n_bytes; j += 32) {
    const int u = j / ub, jj = j % ub;
    uint32_t b = 0;
    for (int k = 0; k < 8 / bits; ++k) b |= uint32_t(codes[u * layout::kUnitValues + jj + ub * k]) << (bits * k);
    packed[j] = uint8_t(b);
  }
}

// Quantizer parameters of one group, the float operations of kv/group_quant.cpp.
struct GroupParamsF {
  float thr;         // clip threshold
  float scale;       // fp16-rounded scale (as a float); unused when degenerate
  float zero;        // fp16-rounded zero (as a float)
  bool degenerate;   // every code is 0
  uint16_t scale_bits, zero_bits;  // as stored
};

// The group quantizer of kv/group_quant.cpp over G values x(0 .. n-1), serially by one thread, in the CPU's loop
// order. X: a functor i -> float.
template <class X>
__device__ GroupParamsF quantize_params_serial(const X& x, int n, int bits, int clip_index) {
  GroupParamsF q{};
  if (clip_index < 0) {
    float m = 0.f;
    for (int i = 0; i < n; ++i) m = fmaxf(m, fabsf(x(i)));
    q.thr = m;
  } else {  // the clip_index-th smallest |x| (nth_element), by counting
    for (int i = 0; i < n; ++i) {
      const float a = fabsf(x(i));
      int less = 0, leq = 0;
      for (int j = 0; j < n; ++j) {
        const float b = fabsf(x(j));
        less += b < a;
        leq += b <= a;
      }
      if (less <= clip_index && clip_index < leq) {
        q.thr = a;
        break;
      }
    }
  }
  float lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < n; ++i) {
    const float v = clampf(x(i), -q.thr, q.thr);
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  const float levels = float((1 << bits) - 1);
  const float scale = dev::fp16_to_f32(dev::f32_to_fp16(__fdiv_rn(__fsub_rn(hi, lo), levels)));
  if (!(hi > lo) || !(scale > 0.f) || !isfinite(scale)) {
    q.degenerate = true;
    q.scale_bits = dev::f32_to_fp16(fabsf(lo));
    q.zero_bits = dev::f32_to_fp16(lo < 0.f ? 1.f : (lo > 0.f ? -1.f : 0.f));
    return q;
  }
  q.scale = scale;
  q.scale_bits = dev::f32_to_fp16(scale);
  q.zero_bits = dev::f32_to_fp16(__fdiv_rn(-lo, scale));
  q.zero = dev::fp16_to_f32(q.zero_bits);
  return q;
}

// Code of value v under group parameters q (kv/group_quant.cpp).
__device__ __forceinline__ uint32_t quantize_value(float v, const GroupParamsF& q, int bits) {
  if (q.degenerate) return 0;
  const float levels = float((1 << bits) - 1);
  const float c = floorf(__fadd_rn(__fadd_rn(__fdiv_rn(clampf(v, -q.thr, q.thr), q.scale), q.zero), 0.5f));
  return uint32_t(clampf(c, 0.f, levels));
}

constexpr int kMaxKiviG = 128;  // largest G of KIVI key blocks (kv/codec_kivi.cpp)

// Grid (item, kv head), kD threads: thread c quantizes channel c of the block that starts at the item's position
// (items at other positions return), then the block's threads pack the token-major code rows.
__global__ void __launch_bounds__(kD) demote_kivi_keys_kernel(CacheGeometry g, int layer, const RowDesc* items) {
  const int head = blockIdx.y, c = threadIdx.x;
  const RowDesc it = items[blockIdx.x];
  const int G = g.k_block_tokens, bits = g.k_bits;
  if ((it.pos - g.sink) % G != 0) return;  // not a block start (uniform across the block)
  __shared__ uint16_t xs[kMaxKiviG][kD];   // the block's G bf16 key rows, [token][channel]
  __shared__ GroupParamsF params[kD];      // per channel
  for (int t = 0; t < G; ++t) xs[t][c] = dev::ring_row(g, it.seq, layer, 0, head, it.pos + t)[c];
  __syncthreads();
  const auto x = [&](int t) { return dev::bf16_to_f32(xs[t][c]); };
  const GroupParamsF q = quantize_params_serial(x, G, bits, g.k_clip_index);
  params[c] = q;
  uint8_t* dst = dev::kivi_block(g, it.seq, layer, head, it.pos);
  // GroupParams[d]: fp16 scale (low half), zero (high half) of channel c.
  reinterpret_cast<uint32_t*>(dst)[c] = uint32_t(q.scale_bits) | (uint32_t(q.zero_bits) << 16);
  __syncthreads();
  // Codes: row t (token) packed as layout.h: byte j of unit u holds channels u 32 + j % (4b) + 4b k, k < 8 / b.
  uint8_t* rows = dst + layout::kivi_key_params_bytes(kD);
  const int ub = layout::unit_bytes(bits), row_bytes = layout::packed_bytes(kD, bits);
  for (int i = c; i < G * row_bytes; i += kD) {
    const int t = i / row_bytes, j = i % row_bytes, u = j / ub, jj = j % ub;
    uint32_t b = 0;
    for (int k = 0; k < 8 / bits; ++k) {
      const int ch = u * layout::kUnitValues + jj + ub * k;
      b |= quantize_value(dev::bf16_to_f32(xs[t][ch]), params[ch], bits) << (bits * k);
    }
    rows[i] = uint8_t(b);
  }
}

}  // namespace

int launch_append_rows(const CacheGeometry& g, int layer, const RowDesc* d_rows, int n_rows, const float* d_k,
                       const float* d_v, const TransformPtrs& t, void* stream) {
  if (n_rows <= 0) return cudaSuccess;
  append_rows_kernel<<<dim3(unsigned(n_rows), unsigned(g.n_kv), 2), kD, 0, static_cast<cudaStream_t>(stream)>>>(
      g, layer, d_rows, d_k, d_v, t);
  return cudaGetLastError();
}

int launch_demote_rows(const CacheGeometry& g, int layer, const RowDesc* d_items, int n_items, void* stream) {
  if (n_items <= 0) return cudaSuccess;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  demote_rows_kernel<<<dim3(unsigned(n_items), unsigned(g.n_kv), 2), 32, 0, st>>>(g, layer, d_items);
  int e = cudaGetLastError();
  if (e != cudaSuccess || !kivi_keys(g)) return e;
  if (g.k_block_tokens > kMaxKiviG || g.k_bits == kBf16Bits) return cudaErrorInvalidValue;  // validated on the host
  demote_kivi_keys_kernel<<<dim3(unsigned(n_items), unsigned(g.n_kv)), kD, 0, st>>>(g, layer, d_items);
  return cudaGetLastError();
}

}  // namespace kvq::cuda
