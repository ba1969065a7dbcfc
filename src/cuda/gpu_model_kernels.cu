// Kernels of the GPU forward pass (launchers declared in gpu_model_kernels.h). fp32 arithmetic in the order the
// CPU model (model/model.cpp) uses, so the two differ only by GEMM rounding and libm ulps.
#include "cuda/gpu_model_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace kvq::cuda::kernels {

namespace {

constexpr int kThreads = 256;  // threads per block of every kernel here

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Blocks for a grid-stride loop over n elements (capped: the loop covers the rest).
unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

int launched() { return int(cudaGetLastError()); }

__device__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

template <class T>
__device__ float load_weight(const T* p, int64_t i);
template <>
__device__ float load_weight<uint16_t>(const uint16_t* p, int64_t i) { return bf16_bits_to_float(p[i]); }
template <>
__device__ float load_weight<float>(const float* p, int64_t i) { return p[i]; }

template <class T>
__global__ void embed_gather_kernel(const T* table, const int32_t* ids, int rows, int dim, float* x) {
  const int64_t n = int64_t(rows) * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / dim, c = i % dim;
    x[i] = load_weight(table, int64_t(ids[r]) * dim + c);
  }
}

// Sum of v over the block (whole warps, at most 1024 threads), returned to every thread.
__device__ double block_sum(double v) {
  __shared__ double part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  double s = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w) s += part[w];
  __syncthreads();  // part[] may be reused by the next call
  return s;
}

__device__ __forceinline__ void store(RowsOut out, int64_t i, float v) {
  if (out.bf16) out.bf16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  else out.f32[i] = v;
}

// out[row] = w * x[row] / sqrt(mean(x[row]^2) + eps) for the block's row; res: x += res first. out.f32 may alias x or
// res: a thread writes out[c] only for the c it read before the block's sum.
template <int kPer>  // values a thread holds: dims up to kThreads · kPer
__global__ void rms_norm_kernel(float* x, const float* res, int dim, const float* w, float eps, RowsOut out) {
  const int64_t base = int64_t(blockIdx.x) * dim;
  float* xr = x + base;
  // The thread's values c = threadIdx.x + i kThreads and their weights in registers, every load issued before the
  // first store (out may alias x or res, so a load after a store would wait for it).
  float v[kPer], wv[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = threadIdx.x + i * kThreads;
    v[i] = c < dim ? xr[c] + (res ? res[base + c] : 0.f) : 0.f;
    wv[i] = c < dim ? w[c] : 0.f;
  }
  double ss = 0;  // double, as the CPU model sums
#pragma unroll
  for (int i = 0; i < kPer; ++i) ss += double(v[i]) * v[i];
  ss = block_sum(ss);
  const float inv = 1.f / sqrtf(float(ss / dim) + eps);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = threadIdx.x + i * kThreads;
    if (c >= dim) continue;
    if (res) xr[c] = v[i];
    store(out, base + c, wv[i] * (v[i] * inv));
  }
}
static_assert(kNormMaxDim == 32 * kThreads, "rms_norm_kernel<32> holds the widest row");

// One block of d threads, rounded up to whole warps, per (row, head) of the fused q/k/v GEMM's output; heads [0, hq)
// are q, [hq, hq + hk) k, the rest v. Threads c >= d (d = 80) only take part in the block's sum and barrier.
__global__ void qkv_finish_kernel(const float* qkv, QkvParams p, float* q, float* k, float* v) {
  const int r = blockIdx.x, j = blockIdx.y, c = threadIdx.x, d = p.d;
  const bool in = c < d;
  const int width = (p.hq + 2 * p.hk) * d;
  float x = in ? qkv[int64_t(r) * width + j * d + c] : 0.f;
  if (p.bias && in) x += p.bias[j * d + c];
  float* dst = j < p.hq ? q + (int64_t(r) * p.hq + j) * d
                        : j < p.hq + p.hk ? k + (int64_t(r) * p.hk + j - p.hq) * d
                                          : v + (int64_t(r) * p.hk + j - p.hq - p.hk) * d;
  if (j >= p.hq + p.hk) {  // values: bias only
    if (in) dst[c] = x;
    return;
  }
  if (p.q_norm) {
    const double ss = block_sum(double(x) * x);  // every thread of the block takes part (x = 0 past d)
    const float inv = 1.f / sqrtf(float(ss / d) + p.eps);
    if (in) x = (j < p.hq ? p.q_norm : p.k_norm)[c] * (x * inv);
  }
  __shared__ float row[kQkvMaxDim];
  if (in) row[c] = x;
  __syncthreads();
  if (!in) return;
  const int half = d / 2, f = c % half;
  const float angle = float(p.pos[r]) * p.inv_freq[f];
  double sn, cs;
  sincos(double(angle), &sn, &cs);
  const float cf = float(cs), sf = float(sn);
  const float a = row[f], b = row[f + half];
  dst[c] = c < half ? a * cf - b * sf : b * cf + a * sf;
}

__global__ void swiglu_kernel(const float* gu, int rows, int I, RowsOut out) {
  const int64_t n = int64_t(rows) * I;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / I, c = i % I;
    const float g = gu[r * 2 * I + c];
    store(out, i, g / (1.f + expf(-g)) * gu[r * 2 * I + I + c]);
  }
}

__global__ void residual_add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

__global__ void to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(x[i]);
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int count, int dim, float* out) {
  const int64_t n = int64_t(count) * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i / dim, c = i % dim;
    out[i] = x[int64_t(rows[j]) * dim + c];
  }
}

// The row scans (argmax, finite): one block of kScanThreads per row, each thread kScanUnroll loads in flight (float4
// when the row allows), visiting its elements in increasing order: a decode step has a few rows of ~10^5 logits,
// so one load at a time per thread would leave the scan at the memory latency.
constexpr int kScanThreads = 1024, kScanUnroll = 4;

template <class F>
__device__ __forceinline__ void scan_row(const float* xr, int cols, F&& f) {
  if (cols % 4 == 0) {  // rows start 16-byte aligned
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const int n4 = cols / 4;
    for (int j0 = threadIdx.x; j0 < n4; j0 += kScanUnroll * kScanThreads) {
      float4 v[kScanUnroll];
#pragma unroll
      for (int u = 0; u < kScanUnroll; ++u) {
        const int j = j0 + u * kScanThreads;
        v[u] = j < n4 ? x4[j] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < kScanUnroll; ++u) {
        const int j = j0 + u * kScanThreads;
        if (j >= n4) break;
        f(4 * j, v[u].x), f(4 * j + 1, v[u].y), f(4 * j + 2, v[u].z), f(4 * j + 3, v[u].w);
      }
    }
  } else {
    for (int c0 = threadIdx.x; c0 < cols; c0 += kScanUnroll * kScanThreads) {
      float v[kScanUnroll];
#pragma unroll
      for (int u = 0; u < kScanUnroll; ++u) v[u] = c0 + u * kScanThreads < cols ? xr[c0 + u * kScanThreads] : 0.f;
#pragma unroll
      for (int u = 0; u < kScanUnroll; ++u)
        if (c0 + u * kScanThreads < cols) f(c0 + u * kScanThreads, v[u]);
    }
  }
}

// Thread 0 writes to *out the index of the block's largest value, the lowest index on ties, from each thread's best
// and its index (cols: none; 0 when no thread has one).
template <class T>
__device__ __forceinline__ void block_argmax(T best, int idx, int cols, int32_t* out) {
  __shared__ T sv[kScanThreads];
  __shared__ int si[kScanThreads];
  sv[threadIdx.x] = best;
  si[threadIdx.x] = idx;
  __syncthreads();
  for (int s = kScanThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const T ov = sv[threadIdx.x + s];
      const int oi = si[threadIdx.x + s];
      const bool take = oi != cols && (si[threadIdx.x] == cols || ov > sv[threadIdx.x] ||
                                       (ov == sv[threadIdx.x] && oi < si[threadIdx.x]));
      if (take) sv[threadIdx.x] = ov, si[threadIdx.x] = oi;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = si[0] == cols ? 0 : si[0];
}

__global__ void __launch_bounds__(kScanThreads) argmax_rows_kernel(const float* x, int cols, int32_t* out) {
  const float* xr = x + int64_t(blockIdx.x) * cols;
  float best = -INFINITY;
  int idx = cols;  // "none yet"
  scan_row(xr, cols, [&](int c, float v) {  // increasing c: the first of equal values is kept
    if (idx == cols || v > best) best = v, idx = c;
  });
  block_argmax(best, idx, cols, out + blockIdx.x);
}

__global__ void __launch_bounds__(kScanThreads) finite_rows_kernel(const float* x, int cols, int32_t* out) {
  const float* xr = x + int64_t(blockIdx.x) * cols;
  double bad = 0;
  scan_row(xr, cols, [&](int, float v) { bad += isfinite(v) ? 0.0 : 1.0; });
  bad = block_sum(bad);
  if (threadIdx.x == 0) out[blockIdx.x] = bad == 0 ? 1 : 0;
}


// The sampler's order (model/sampler.h: larger logit first, lower id on ties) as one 64-bit key that grows with the
// rank: the logit's bits made monotone (-0 taken as +0, equal to it there) above the complement of the id.
__device__ __forceinline__ uint64_t rank_key(float v, int id) {
  uint32_t u = __float_as_uint(v == 0.f ? 0.f : v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (uint64_t(u) << 32) | uint64_t(~uint32_t(id));
}

// The k largest keys of a row by radix selection, a byte at a time from the top: pass p counts the keys whose bytes
// above p equal the prefix chosen so far into 256 bins, and the bin holding the k-th largest extends the prefix. It
// stops once that bin is taken whole; then exactly the k keys >= the prefix (its lower bytes zero) are the k largest,
// gathered and sorted in shared memory (bitonic, descending). Same-bin increments of a warp are counted once
// (__match_any_sync): most logits share their top bytes.
__global__ void __launch_bounds__(kScanThreads) top_k_rows_kernel(const float* x, int cols, int k, int32_t* ids,
                                                                   float* vals) {
  const float* xr = x + int64_t(blockIdx.x) * cols;
  __shared__ int hist[256];
  __shared__ uint64_t chosen;
  __shared__ int still_needed, whole_bin, gathered;
  __shared__ uint64_t keys[kMaxSortedTopK];
  uint64_t prefix = 0;
  int need = k;
  for (int shift = 56;; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    const uint64_t high = shift == 56 ? 0 : ~uint64_t(0) << (shift + 8);
    scan_row(xr, cols, [&](int c, float v) {
      const uint64_t key = rank_key(v, c);
      const int bin = (key & high) == prefix ? int((key >> shift) & 255) : -1;
      const unsigned peers = __match_any_sync(__activemask(), bin);
      if (bin >= 0 && __ffs(peers) - 1 == int(threadIdx.x & 31)) atomicAdd(&hist[bin], __popc(peers));
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      int b = 255, above = 0;
      while (above + hist[b] < need) above += hist[b--];  // the prefix holds >= need keys: b stays >= 0
      chosen = prefix | uint64_t(b) << shift;
      still_needed = need - above;
      whole_bin = hist[b] == need - above;  // at shift 0 always: the keys are distinct
      gathered = 0;
    }
    __syncthreads();
    prefix = chosen, need = still_needed;
    if (whole_bin) break;
  }
  scan_row(xr, cols, [&](int c, float v) {
    const uint64_t key = rank_key(v, c);
    if (key >= prefix) keys[atomicAdd(&gathered, 1)] = key;
  });
  int n2 = 1;
  while (n2 < k) n2 <<= 1;
  for (int i = k + int(threadIdx.x); i < n2; i += blockDim.x) keys[i] = 0;  // below every key
  __syncthreads();
  for (int size = 2; size <= n2; size <<= 1)
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n2; i += blockDim.x) {
        const int j = i ^ stride;
        if (j <= i) continue;
        const uint64_t a = keys[i], b = keys[j];
        if ((i & size) == 0 ? a < b : a > b) keys[i] = b, keys[j] = a;  // the last merge: every pair descending
      }
      __syncthreads();
    }
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    const int id = int(~uint32_t(keys[i]));
    ids[int64_t(blockIdx.x) * k + i] = id;
    vals[int64_t(blockIdx.x) * k + i] = xr[id];
  }
}

// Row r's Gumbel-max draw (model/gumbel.h): the index of the largest logit / T + noise, the lowest on ties; the scores
// are the host's bits.
__global__ void __launch_bounds__(kScanThreads) gumbel_argmax_rows_kernel(const float* x, int cols,
                                                                           const gumbel::Draw* draws, int32_t* out) {
  const float* xr = x + int64_t(blockIdx.x) * cols;
  const gumbel::Draw dr = draws[blockIdx.x];
  double best = -INFINITY;
  int idx = cols;  // "none yet"
  scan_row(xr, cols, [&](int c, float v) {  // increasing c: the first of equal scores is kept
    const double sc = gumbel::score(v, dr.temperature, dr.base, uint64_t(c));
    if (idx == cols || sc > best) best = sc, idx = c;
  });
  block_argmax(best, idx, cols, out + blockIdx.x);
}

// Row r's mass (model/sampling_math.h): its largest logit, then thread t sums the weights of block t of the row in
// order (sum_block(cols) logits a block) and counts those >= min_p, and thread 0 adds the blocks' sums in order: the
// host's bits.
__global__ void __launch_bounds__(kScanThreads) row_mass_kernel(const float* x, int cols,
                                                                 const smath::MassQuery* queries, smath::RowMass* out) {
  const float* xr = x + int64_t(blockIdx.x) * cols;
  const smath::MassQuery q = queries[blockIdx.x];
  float mx = -INFINITY;
  scan_row(xr, cols, [&](int, float v) { mx = fmaxf(mx, v); });
  __shared__ float smx[kScanThreads];
  __shared__ double parts[smath::kSumBlocks];
  __shared__ int64_t counts[smath::kSumBlocks];
  smx[threadIdx.x] = mx;
  __syncthreads();
  for (int s = kScanThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) smx[threadIdx.x] = fmaxf(smx[threadIdx.x], smx[threadIdx.x + s]);
    __syncthreads();
  }
  mx = smx[0];
  static_assert(kScanThreads == smath::kSumBlocks, "a thread a block of the sum");
  const int64_t block = smath::sum_block(cols), b0 = int64_t(threadIdx.x) * block;
  double part = 0;
  int64_t above = 0;
  for (int64_t i = b0; i < min(int64_t(cols), b0 + block); ++i) {
    const double p = smath::weight(xr[i], mx, q.temperature);
    part = smath::dadd(part, p);
    above += p >= q.min_p;
  }
  parts[threadIdx.x] = part;
  counts[threadIdx.x] = above;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    int64_t n = 0;
    for (int j = 0; j < smath::kSumBlocks && int64_t(j) * block < cols; ++j)
      total = smath::dadd(total, parts[j]), n += counts[j];
    out[blockIdx.x] = {total, n};
  }
}
}  // namespace

int embed_gather_bf16(const uint16_t* table, const int32_t* ids, int rows, int dim, float* x, void* stream) {
  embed_gather_kernel<<<grid_for(int64_t(rows) * dim), kThreads, 0, as_stream(stream)>>>(table, ids, rows, dim, x);
  return launched();
}

int embed_gather_f32(const float* table, const int32_t* ids, int rows, int dim, float* x, void* stream) {
  embed_gather_kernel<<<grid_for(int64_t(rows) * dim), kThreads, 0, as_stream(stream)>>>(table, ids, rows, dim, x);
  return launched();
}

namespace {

// The rms_norm_kernel instance of the narrowest register row that holds dim (cudaErrorInvalidValue past 8192).
int launch_rms_norm(float* x, const float* res, int rows, int dim, const float* w, float eps, RowsOut out,
                    cudaStream_t stream) {
  if (rows <= 0) return 0;
  if (dim < 1 || dim > kNormMaxDim) return int(cudaErrorInvalidValue);
  const unsigned grid = unsigned(rows);
  if (dim <= 4 * kThreads) rms_norm_kernel<4><<<grid, kThreads, 0, stream>>>(x, res, dim, w, eps, out);
  else if (dim <= 8 * kThreads) rms_norm_kernel<8><<<grid, kThreads, 0, stream>>>(x, res, dim, w, eps, out);
  else if (dim <= 16 * kThreads) rms_norm_kernel<16><<<grid, kThreads, 0, stream>>>(x, res, dim, w, eps, out);
  else rms_norm_kernel<32><<<grid, kThreads, 0, stream>>>(x, res, dim, w, eps, out);
  return launched();
}

}  // namespace

int rms_norm(const float* x, int rows, int dim, const float* w, float eps, RowsOut out, void* stream) {
  // x is only read without a residual
  return launch_rms_norm(const_cast<float*>(x), nullptr, rows, dim, w, eps, out, as_stream(stream));
}

int residual_rms_norm(float* x, const float* y, int rows, int dim, const float* w, float eps, RowsOut out,
                      void* stream) {
  return launch_rms_norm(x, y, rows, dim, w, eps, out, as_stream(stream));
}

int qkv_finish(const float* qkv, int rows, const QkvParams& p, float* q, float* k, float* v, void* stream) {
  if (rows <= 0) return 0;
  if (p.d < 2 || p.d > kQkvMaxDim || p.d % 2 != 0) return int(cudaErrorInvalidValue);  // a row in shared memory
  const unsigned threads = unsigned((p.d + 31) / 32 * 32);  // whole warps (block_sum)
  qkv_finish_kernel<<<dim3(unsigned(rows), unsigned(p.hq + 2 * p.hk)), threads, 0, as_stream(stream)>>>(qkv, p, q, k,
                                                                                                      v);
  return launched();
}

int swiglu(const float* gu, int rows, int I, RowsOut out, void* stream) {
  swiglu_kernel<<<grid_for(int64_t(rows) * I), kThreads, 0, as_stream(stream)>>>(gu, rows, I, out);
  return launched();
}

int residual_add(float* x, const float* y, int64_t n, void* stream) {
  residual_add_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(x, y, n);
  return launched();
}

int to_bf16(const float* x, int64_t n, uint16_t* out, void* stream) {
  to_bf16_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(x, n, reinterpret_cast<__nv_bfloat16*>(out));
  return launched();
}

int gather_rows(const float* x, const int32_t* rows, int count, int dim, float* out, void* stream) {
  gather_rows_kernel<<<grid_for(int64_t(count) * dim), kThreads, 0, as_stream(stream)>>>(x, rows, count, dim, out);
  return launched();
}

int argmax_rows(const float* x, int rows, int cols, int32_t* out, void* stream) {
  if (rows <= 0) return 0;
  argmax_rows_kernel<<<unsigned(rows), kScanThreads, 0, as_stream(stream)>>>(x, cols, out);
  return launched();
}

int top_k_rows(const float* x, int rows, int cols, int k, int32_t* ids, float* vals, void* stream) {
  if (rows <= 0) return 0;
  if (k < 1 || k > kMaxSortedTopK || k > cols) return int(cudaErrorInvalidValue);
  top_k_rows_kernel<<<unsigned(rows), kScanThreads, 0, as_stream(stream)>>>(x, cols, k, ids, vals);
  return launched();
}

int gumbel_argmax_rows(const float* x, int rows, int cols, const gumbel::Draw* draws, int32_t* out, void* stream) {
  if (rows <= 0) return 0;
  gumbel_argmax_rows_kernel<<<unsigned(rows), kScanThreads, 0, as_stream(stream)>>>(x, cols, draws, out);
  return launched();
}

int row_mass(const float* x, int rows, int cols, const smath::MassQuery* queries, smath::RowMass* out, void* stream) {
  if (rows <= 0) return 0;
  row_mass_kernel<<<unsigned(rows), kScanThreads, 0, as_stream(stream)>>>(x, cols, queries, out);
  return launched();
}

int finite_rows(const float* x, int rows, int cols, int32_t* out, void* stream) {
  if (rows <= 0) return 0;
  finite_rows_kernel<<<unsigned(rows), kScanThreads, 0, as_stream(stream)>>>(x, cols, out);
  return launched();
}

namespace {

__global__ void dummy_fill_kernel(RowsOut out, int64_t n, TensorInit init, float std, uint64_t seed,
                                  uint32_t rng_stream) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = dummy_value(init, std, seed, rng_stream, uint64_t(i));
    if (out.bf16)
      out.bf16[i] = f32_to_bf16(v);  // exact: v is a bf16 value
    else
      out.f32[i] = v;
  }
}

}  // namespace

int dummy_fill(RowsOut out, int64_t n, TensorInit init, float std, uint64_t seed, uint32_t rng_stream, void* stream) {
  if (n == 0) return int(cudaSuccess);
  dummy_fill_kernel<<<grid_for(n), kThreads, 0, as_stream(stream)>>>(out, n, init, std, seed, rng_stream);
  return launched();
}

}  // namespace kvq::cuda::kernels
