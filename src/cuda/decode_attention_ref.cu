// The reference twin of the attention kernel (decode_attention.cu): same grid and partial format, written to be
// obviously correct rather than fast. One block of d threads (thread = channel) walks the split's positions one by one:
// decode the K row value of its channel (the key codec's value; KIVI keys: from the position's key block and row;
// NexusQuant's rows: all channels back through the Hadamard together), block-reduce q·k per query head (a tree over the
// next power of two, zero-padded past d), online softmax per head, accumulate p · v of its channel. Templated on the
// head dim and the codecs of the cache's instance row (gpu_instances.h), whatever the row's fast path.
#include <cuda_runtime.h>

#include "cuda/cache_device.cuh"
#include "cuda/codecs.cuh"

namespace kvq::cuda {

namespace {

// The smallest power of two >= d.
constexpr int pow2_ceil(int d) {
  int p = 1;
  while (p < d) p *= 2;
  return p;
}

template <class K, class V, class W, int D>
__global__ void attention_ref_kernel(CacheGeometry geo, AttentionLaunch a) {
  constexpr int kTree = pow2_ceil(D);  // the reduction's width; red[.][D, kTree) stays zero
  const int row = blockIdx.x, head = blockIdx.y, split = blockIdx.z, c = threadIdx.x;
  const int g = a.n_heads / geo.n_kv;
  const RowDesc rd = a.rows[row];
  const int t = rd.pos, qe = view_quant_end(geo, rd.seq, t);
  const int first = split * a.split_tokens, end = min(t + 1, first + a.split_tokens);
  const int begin = a.window > 0 ? max(first, t - a.window + 1) : first;  // a sliding window: (t - window, t]
  __shared__ float red[kMaxGroupHeads][kTree];
  [[maybe_unused]] __shared__ float hrow[D];  // a Hadamard row's butterflies (dev::hadamard_rows)
  if constexpr (kTree > D) {
    for (int i = c; i < kMaxGroupHeads * (kTree - D); i += D) red[i / (kTree - D)][D + i % (kTree - D)] = 0.f;
  }
  float q[kMaxGroupHeads], m[kMaxGroupHeads], l[kMaxGroupHeads], acc[kMaxGroupHeads];
  for (int h = 0; h < g; ++h) {
    q[h] = a.q_work[(int64_t(row) * a.n_heads + head * g + h) * D + c];
    m[h] = -INFINITY, l[h] = 0.f, acc[h] = 0.f;
  }
  for (int p = begin; p < end; ++p) {
    const dev::RowRef kr = dev::view_row(geo, rd.seq, a.layer, 0, head, p, qe);
    const dev::RowRef vr = dev::view_row(geo, rd.seq, a.layer, 1, head, p, qe);
    // a window row (bf16, or int8), or the key codec's row / KIVI key block; the value codec's row
    float kc;
    if (!kr.quant) kc = W::value(kr.ptr, 0, geo.window_group, c);
    else if constexpr (dev::ReadsTable<K>) kc = K::value(kr.ptr, dev::key_table<K>(geo, head), c);
    else kc = K::value(kr.ptr, kr.block_row, geo.k_group, c);
    float vc = vr.quant ? V::value(vr.ptr, 0, geo.v_group, c) : W::value(vr.ptr, 0, geo.window_group, c);
    if constexpr (dev::tensor_scaled<K>()) {  // vLLM's FP8: the host's decode fp8⁻¹(code) · s
      if (kr.quant) kc *= geo.k_scale;
    }
    if constexpr (dev::tensor_scaled<V>()) {
      if (vr.quant) vc *= geo.v_scale;
    }
    // NexusQuant's rows: back through their Hadamard (and RoPE) together, the block one row (kr.quant is the block's)
    if constexpr (dev::hadamard_rows<K>()) {
      if (kr.quant) kc = K::finish_channel(kc, c, hrow, dev::rope_angles_of<K, D>(geo, p));
    }
    if constexpr (dev::hadamard_rows<V>()) {
      if (vr.quant) vc = V::finish_channel(vc, c, hrow, nullptr);
    }
    for (int h = 0; h < g; ++h) red[h][c] = q[h] * kc;
    __syncthreads();
    for (int w = kTree / 2; w > 0; w >>= 1) {
      if (c < w)
        for (int h = 0; h < g; ++h) red[h][c] += red[h][c + w];
      __syncthreads();
    }
    float nu = 1.f;  // token-scaled keys (OScaR): scores ν_p · q·k̂ in the quantized region
    if constexpr (dev::token_scaled<K>()) {
      if (kr.quant) nu = *dev::token_scales(geo, rd.seq, a.layer, p);
    }
    for (int h = 0; h < g; ++h) {
      const float s = red[h][0] * nu;
      const float m_new = fmaxf(m[h], s);
      const float corr = expf(m[h] - m_new), pr = expf(s - m_new);
      l[h] = l[h] * corr + pr;
      acc[h] = acc[h] * corr + pr * vc;
      m[h] = m_new;
    }
    __syncthreads();  // red is rewritten by the next position
  }
  const int64_t part = (int64_t(row) * geo.n_kv + head) * a.n_slots + split;
  for (int h = 0; h < g; ++h) {
    a.part_acc[(part * g + h) * D + c] = acc[h];
    if (c == 0) {
      a.part_ml[(part * g + h) * 2] = m[h];
      a.part_ml[(part * g + h) * 2 + 1] = l[h];
    }
  }
}

}  // namespace

int launch_attention_ref(const CacheGeometry& g, const AttentionLaunch& a, void* stream) {
  int e = cudaErrorInvalidValue;  // no instance row: refused on the host (gpu_instances.h)
  with_instance(g.instance, g.head_dim, [&](auto row, auto dim) {
    constexpr int I = decltype(row)::value, D = decltype(dim)::value;
    attention_ref_kernel<RowKeys<I, D>, RowValues<I, D>, RowWindows<I, D>, D>
        <<<dim3(unsigned(a.n_rows), unsigned(g.n_kv), unsigned(a.n_splits)), D, 0, static_cast<cudaStream_t>(stream)>>>(
            g, a);
    e = cudaGetLastError();
  });
  return e;
}

}  // namespace kvq::cuda
