// Append and demotion kernels of the GPU cache.
//   append: per (row, kv head, K/V): centre (keys), rotate by R_K / R_V (cuda/rotate.cuh: the CPU's operations, so
//           the rows are bit-identical to kv/transform.cpp), round to bf16 into the sink or the recent ring; with
//           int8 windows (KV4-RL) encode the int8 window row, and past the sinks the body row into the ring slot.
//   demote: per (position, kv head, K/V), one warp: bf16 ring row -> the codec's encode_row (int rows: the group
//           quantizer of codecs/group_quant.cpp with the same float operations, no fast math, no contraction;
//           bf16: a copy; NexusQuant's: encode_row_at, with the position's RoPE angles for its keys) -> its row in the
//           page; with int8 windows a copy of the body row encoded at append.
//   demote KIVI keys: per (block of G positions, kv head), one thread per channel: the codec's encode_block (the
//           same quantizer over the channel's G bf16 ring values, the CPU's serial loop order) -> its
//           layout::KiviKeyBlock in the page.
//   token scales (OScaR keys, before their blocks): per position, one warp: ν over the bf16 ring key rows of all
//           kv heads (codecs/oscar/oscar_format.h, the CPU's order) -> the page's token-scale region, which the key
//           blocks' encode_block then divides by.
// All are templated on the head dim D and the codecs of the cache's instance row (gpu_instances.h), chosen at
// with_instance.
#include <cuda_runtime.h>

#include "cuda/cache_device.cuh"
#include "cuda/codecs.cuh"
#include "cuda/rotate.cuh"

namespace kvq::cuda {

namespace {

// Channel c = threadIdx.x of the block's (row, kv head, K/V) (grid: row, kv head, K/V) as the cache stores it: the
// k / v row act_rows[row] (row when null), centred (keys) and rotated by R_K / R_V.
template <int D>
__device__ __forceinline__ float appended_channel(const CacheGeometry& g, int layer, const int* act_rows,
                                                  const float* k, const float* v, const TransformPtrs& t) {
  const int row = blockIdx.x, head = blockIdx.y, kv = blockIdx.z, c = threadIdx.x;
  const int64_t in_row = act_rows ? act_rows[row] : row;
  const float* src = (kv ? v : k) + (in_row * g.n_kv + head) * D;
  float x[1] = {src[c]};
  const int64_t lh = int64_t(layer) * g.n_kv + head;
  if (kv == 0 && t.key_mean) x[0] = __fsub_rn(x[0], t.key_mean[lh * D + c]);
  if (const float* R = kv ? t.r_v : t.r_k) {
    __shared__ double scratch[1][D];
    dev::rotate_rows<D>(x, R + lh * D * D, kv ? t.v_hadamard : t.k_hadamard, scratch);
  }
  return x[0];
}

// Grid (row, kv head, K/V), D threads: thread c takes channel c, rounded to bf16 into the sink or the recent ring.
template <int D>
__global__ void append_rows_kernel(CacheGeometry g, int layer, const RowDesc* rows, const int* act_rows, const float* k,
                                   const float* v, TransformPtrs t) {
  const int head = blockIdx.y, kv = blockIdx.z, c = threadIdx.x;
  const RowDesc rd = rows[blockIdx.x];
  const float x = appended_channel<D>(g, layer, act_rows, k, v, t);
  uint8_t* dst = rd.pos < g.sink ? dev::sink_row(g, rd.seq, layer, kv, head, rd.pos)
                                 : dev::ring_row(g, rd.seq, layer, kv, head, rd.pos);
  reinterpret_cast<uint16_t*>(dst)[c] = f32_to_bf16(x);
}

// The same for int8 windows (KV4-RL; D >= 64 threads, two warps or more): warp 0 encodes the window row from the
// channels as appended (KvCache::append_rows: the window codec takes the row itself), and past the sinks warp 1 the
// body row of K or V from their bf16 rounding into the ring slot's body rows (KvCache::encode_ring_body: what the
// demotion of a bf16 window row would encode), which demote_rows_kernel copies into the page.
template <class K, class V, int D>
__global__ void append_rows_int8_windows_kernel(CacheGeometry g, int layer, const RowDesc* rows, const int* act_rows,
                                                const float* k, const float* v, TransformPtrs t) {
  static_assert(D >= 64, "two warps");
  const int head = blockIdx.y, kv = blockIdx.z, c = threadIdx.x, warp = c / 32;
  const RowDesc rd = rows[blockIdx.x];
  const float x = appended_channel<D>(g, layer, act_rows, k, v, t);
  __shared__ dev::RowScratch<D> window, body;
  __shared__ uint16_t bf16_row[D];
  window.x[c] = x;
  bf16_row[c] = f32_to_bf16(x);
  __syncthreads();
  if (warp == 0) {
    uint8_t* dst = rd.pos < g.sink ? dev::sink_row(g, rd.seq, layer, kv, head, rd.pos)
                                   : dev::ring_row(g, rd.seq, layer, kv, head, rd.pos);
    dev::IntRows<8, D>::encode_x(dst, g.window_group, g.window_clip_index, window);
  } else if (warp == 1 && rd.pos >= g.sink) {
    uint8_t* dst = dev::ring_body_row(g, rd.seq, layer, kv, head, rd.pos);
    if (kv == 0) K::encode_row(bf16_row, dst, g.k_group, g.k_clip_index, body);
    else V::encode_row(bf16_row, dst, g.v_group, g.v_clip_index, body);
  }
}

// Grid (item, kv head, K/V), one warp: demotes the item's K row (unless K is a key-block codec:
// demote_key_blocks_kernel) or V row of D values with the codec K or V.
template <class K, class V, int D>
__global__ void demote_rows_kernel(CacheGeometry g, int layer, const RowDesc* items) {
  const int head = blockIdx.y, kv = blockIdx.z;
  const RowDesc it = items[blockIdx.x];
  __shared__ dev::RowScratch<D> sh;
  if constexpr (K::kKeyBlocks) {
    if (kv == 0) return;  // key blocks: demote_key_blocks_kernel
  }
  uint8_t* dst = dev::page_row(g, it.seq, layer, kv, head, it.pos);
  if (g.ring_body > 0) {  // int8 windows: the body row encoded at append (per-token rows: kv/cache_layout.h)
    const uint8_t* body = dev::ring_body_row(g, it.seq, layer, kv, head, it.pos);
    for (int i = threadIdx.x; i < (kv ? g.v_row : g.k_row); i += 32) dst[i] = body[i];
    return;
  }
  const uint16_t* src = reinterpret_cast<const uint16_t*>(dev::ring_row(g, it.seq, layer, kv, head, it.pos));
  if (kv == 0) {
    if constexpr (dev::ReadsTable<K>) K::encode_row(src, dst, dev::key_table<K>(g, head), sh);
    else if constexpr (dev::hadamard_rows<K>()) K::encode_row_at(src, dst, dev::rope_angles_of<K, D>(g, it.pos), sh);
    else if constexpr (dev::tensor_scaled<K>()) K::encode_row_scaled(src, dst, g.k_scale);
    else if constexpr (!K::kKeyBlocks) K::encode_row(src, dst, g.k_group, g.k_clip_index, sh);
  } else {
    if constexpr (dev::tensor_scaled<V>()) V::encode_row_scaled(src, dst, g.v_scale);
    else if constexpr (dev::hadamard_rows<V>()) V::encode_row_at(src, dst, nullptr, sh);
    else V::encode_row(src, dst, g.v_group, g.v_clip_index, sh);
  }
}

// Grid (item), one warp: ν of the item's position, the norm of its key rows over all kv heads of `layer`: per head
// (lanes in parallel) the sum of squares in channel order, then lane 0 adds the heads' sums in head order.
template <int D>
__global__ void demote_scales_kernel(CacheGeometry g, int layer, const RowDesc* items) {
  const RowDesc it = items[blockIdx.x];
  const int lane = threadIdx.x;
  __shared__ float head_sums[32];
  float total = 0.f;  // lane 0
  for (int h0 = 0; h0 < g.n_kv; h0 += 32) {
    if (h0 + lane < g.n_kv) {
      const uint16_t* row = reinterpret_cast<const uint16_t*>(dev::ring_row(g, it.seq, layer, 0, h0 + lane, it.pos));
      head_sums[lane] = token_sum_squares([&](int c) { return bf16_to_f32(row[c]); }, D);
    }
    __syncwarp();
    if (lane == 0)
      for (int i = 0; i < 32 && h0 + i < g.n_kv; ++i) total = exact::add(total, head_sums[i]);
    __syncwarp();
  }
  if (lane == 0) *dev::token_scales(g, it.seq, layer, it.pos) = token_scale(total);
}

// Grid (item, kv head), D threads: the K block that starts at the item's position (items at other positions
// return) demoted by the key-block codec K: its G bf16 ring rows gathered, then K::encode_block (token-scaled keys:
// with the block's ν, which demote_scales_kernel wrote).
template <class K, int D>
__global__ void __launch_bounds__(D) demote_key_blocks_kernel(CacheGeometry g, int layer, const RowDesc* items) {
  const int head = blockIdx.y, c = threadIdx.x;
  const RowDesc it = items[blockIdx.x];
  const int G = g.k_block_tokens;
  if ((it.pos - g.sink) % G != 0) return;  // not a block start (uniform across the block)
  __shared__ uint16_t xs[K::kMaxBlockTokens][D];  // the block's G bf16 key rows, [token][channel]
  for (int t = 0; t < G; ++t)
    xs[t][c] = reinterpret_cast<const uint16_t*>(dev::ring_row(g, it.seq, layer, 0, head, it.pos + t))[c];
  __syncthreads();
  uint8_t* dst = dev::kivi_block(g, it.seq, layer, head, it.pos);
  if constexpr (dev::token_scaled<K>()) {
    K::encode_block(xs, dev::token_scales(g, it.seq, layer, it.pos), dst);
  } else {
    __shared__ dev::GroupParamsF params[D];  // per channel
    K::encode_block(xs, G, g.k_clip_index, params, dst);
  }
}

}  // namespace

int launch_append_rows(const CacheGeometry& g, int layer, const RowDesc* d_rows, const int* d_act_rows, int n_rows,
                       const float* d_k, const float* d_v, const TransformPtrs& t, void* stream) {
  if (n_rows <= 0) return cudaSuccess;
  int e = cudaErrorInvalidValue;  // no instance: refused on the host (gpu_instances.h)
  with_instance(g.instance, g.head_dim, [&](auto row, auto dim) {
    constexpr int I = decltype(row)::value, D = decltype(dim)::value;
    const dim3 grid(unsigned(n_rows), unsigned(g.n_kv), 2);
    if constexpr (kGpuInstances[I].window == CodecId::kInt8)
      append_rows_int8_windows_kernel<RowKeys<I, D>, RowValues<I, D>, D>
          <<<grid, D, 0, static_cast<cudaStream_t>(stream)>>>(g, layer, d_rows, d_act_rows, d_k, d_v, t);
    else
      append_rows_kernel<D><<<grid, D, 0, static_cast<cudaStream_t>(stream)>>>(g, layer, d_rows, d_act_rows, d_k, d_v,
                                                                               t);
    e = cudaGetLastError();
  });
  return e;
}

int launch_demote_rows(const CacheGeometry& g, int layer, const RowDesc* d_items, int n_items, void* stream) {
  if (n_items <= 0) return cudaSuccess;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  int e = cudaErrorInvalidValue;  // no instance: refused on the host (gpu_instances.h)
  with_instance(g.instance, g.head_dim, [&](auto row, auto dim) {
    constexpr int I = decltype(row)::value, D = decltype(dim)::value;
    using K = RowKeys<I, D>;
    using V = RowValues<I, D>;
    demote_rows_kernel<K, V, D><<<dim3(unsigned(n_items), unsigned(g.n_kv), 2), 32, 0, st>>>(g, layer, d_items);
    e = cudaGetLastError();
    if constexpr (K::kKeyBlocks) {
      if (e != cudaSuccess) return;
      if (g.k_block_tokens > K::kMaxBlockTokens) {  // validated on the host
        e = cudaErrorInvalidValue;
        return;
      }
      if constexpr (dev::token_scaled<K>()) {  // ν of every demoted position first, then the blocks divide by it
        demote_scales_kernel<D><<<unsigned(n_items), 32, 0, st>>>(g, layer, d_items);
        e = cudaGetLastError();
        if (e != cudaSuccess) return;
      }
      demote_key_blocks_kernel<K, D><<<dim3(unsigned(n_items), unsigned(g.n_kv)), D, 0, st>>>(g, layer, d_items);
      e = cudaGetLastError();
    }
  });
  return e;
}

}  // namespace kvq::cuda
