// Tensor-core prefill attention (FlashAttention-2 style), decode-faithful: the query at position t sees position s
// exactly (a bf16 sink or recent-window row) when s < S0 or qe(t) <= s <= t, through the codec's rows when
// S0 <= s < qe(t), and not at all when s > t, the same view as the per-row decode kernels (cache_device.cuh
// view_row), so a chunk's outputs are what decoding its rows one by one gives, up to operand rounding.
//
// Grid (query tile, kv head, KV split). A query tile is kPrefillTileRows = 64 rows (position, head) of one chunk and
// the GQA group of one kv head, rows i * g + h; 4 warps take 16 rows each (mma M). Its key positions are walked in
// three ranges, each in key tiles of kPrefillKeys = 64 positions copied into shared memory by the whole block with
// cp.async, two tiles in flight (tile i + 1 is copied while tile i is computed; one stage for the windows' tiles of a
// kernel with int2 keys, whose f16 queries take the room):
//   quant  [S0, qe(t1))                the codec's page rows      valid: s < qe(t)
//   sink   [0, min(S0, t1 + 1))        bf16 sink rows             valid: s <= t
//   ring   [max(S0, qe(t0)), t1 + 1)   bf16 recent-window rows    valid: qe(t) <= s <= t
// (t0, t1: the tile's first and last position). Every (t, s) with s <= t is valid in exactly one range; the ranges
// overlap only on [qe(t0), qe(t1)), where each row takes its own side of qe(t). A tile where every row takes every
// key (known from t0, t1, qe(t0), qe(t1)) runs without a mask; only tiles that a window edge or the causal diagonal
// crosses compute the per-element predicate. Block z takes the positions [z S, (z + 1) S) of every range, S =
// split_tokens; the merge kernel (decode_attention.cu) combines the splits exactly.
//
// Per key tile: S = Q K^T (mma m16n8k16, queries on M, keys on N), an online softmax per row in base 2 (log2 e
// folded into q), O += P V (P from the score C fragments straight into A fragments). bf16 rows go through ldmatrix
// (V with .trans); int2 rows stay in shared memory as stored (36 bytes: the (scale, zero) word, 8 code words) and
// their codes become the B fragments in registers, as f16 subnormals c·4^k·2^-24 in one LOP3 per pair (codes_sub2):
//   keys    a lane takes code words tid, tid + 4 of key gid of each n-tile; a k-step is one code field of a word, so
//           its 16 dims are those the word's bytes hold at that field, and the f16 queries are stored in that dim
//           order, times 4^-k (exact), as the decode kernel takes them;
//   values  n-tile dt holds dims 8dt .. 8dt + 7 (lane gid: dim 8dt + gid = byte gid % 4 of word 2(dt / 4) + gid / 4,
//           field dt % 4); one byte permute puts the byte of two positions side by side. Accumulator n-tile dt is in
//           units of 4^(dt % 4)·2^-24 while the quantized range is walked, which is why that range comes first: its
//           end rescales O to the windows' units, exactly (powers of two).
// The operands are rounded as the decode kernel rounds them (decode_attention_mma.cu), so both paths carry the same
// error: the windows' bf16 rows (the cache's exact part) take q and P as bf16 hi + lo pairs (16 significant bits,
// one more mma each); bf16 rows of the quantized region take q and P rounded to bf16 (as FlashAttention does); int2
// rows take q·4^-k and P' in f16, with scale and zero outside the mma:
//   s = scale_k 2^24 (Σ code q - zero_k Σ q 2^-24)          O = Σ P' code - Σ P' zero_v,  P' = p scale_v
// Templated on the head dim D (a multiple of 16; int2 rows: 128): at D = 256 the queries and one key tile take 135 KB
// of shared memory, so its ranges walk one stage each and a block has an SM to itself.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "cuda/cache_device.cuh"
#include "cuda/codecs.cuh"
#include "cuda/mma.cuh"

namespace kvq::cuda {

namespace {

using namespace tc;

constexpr int kWarps = kPrefillTileRows / 16;
constexpr int kRows = kPrefillTileRows;
constexpr int kKeys = kPrefillKeys;
// Shared row pitch (16-bit elements) of D-value rows: 2 D + 16 bytes (272 at d = 128), so ldmatrix's 8 rows hit 8 bank
// groups (for every multiple of 16: consecutive rows 16 · odd bytes apart modulo 128).
template <int D>
constexpr int kPitch = D + 8;
constexpr int kInt2Dim = 128;  // d of the int2 rows (one 128-value group)
constexpr int kRawWords = 1 + kInt2Dim / 16;  // an int2 row of one group: (scale, zero), then 8 code words
constexpr int kRawPitch = 20;  // shared pitch of int2 rows (words): the key and value fragment reads are conflict-free
static_assert(kWarps == 4 && kKeys % 16 == 0, "4 warps of 16 query rows; key tiles of whole mma k-steps");
static_assert(kWarps * 32 == 2 * kKeys, "a tile's int2 rows are copied one row per thread, keys then values");
static_assert(layout::int_row_bytes(kInt2Dim, kInt2Dim, 2) == 4 * kRawWords,
              "an int2 row of one group: (scale, zero), 8 code words");

enum class Range { kSink, kQuant, kRing };

// A block's shared memory (dynamic): the queries (Smem), for int2 keys their f16 copy (QRows), then the key tiles'
// region, which holds the stages of the range being walked (the ranges are walked one after the other).
template <int D>
struct Smem {
  uint16_t qb[kRows][kPitch<D>];  // the tile's queries · log2 e rounded to bf16 (hi)
  uint16_t ql[kRows][kPitch<D>];  // the rest, q - hi, rounded to bf16 (lo; the windows' rows)
  float qsum[kRows];              // int2 keys: Σ_d of the f16 queries' row (the zero term)
};
template <int D>
using QRows = uint16_t[kRows][kPitch<D>];  // int2 keys: the queries · log2 e · 4^-k in f16, in the keys' dim order
template <int D>
using Bf16Rows = uint16_t[kKeys][kPitch<D>];  // one side of a key tile: bf16 rows
using Int2Rows = uint32_t[kKeys][kRawPitch];  // one side of a key tile: int2 rows as stored (words 0 .. 8)
template <bool Q, int D>
using Side = std::conditional_t<Q, Int2Rows, Bf16Rows<D>>;
template <bool KQ, bool VQ, int D>  // KQ / VQ: the keys / values are int2 rows
struct Tile {
  Side<KQ, D> k;
  Side<VQ, D> v;
};
template <int D>
using WindowTile = Tile<false, false, D>;  // the sink and ring ranges, and the quantized region of bf16 rows

// Stages per range: two, but one for the windows' tiles beside int2 keys' f16 queries (two would leave one block an
// SM), and one for every range at d = 256 (one block an SM either way) and where a block holds at most 99 KB
// (small: tc::kSmemSmall, sm_86 and sm_89; the host reads the loaded code's value, smem_limits). The region's
// size is the larger need: 87 / 98 / 105 / 105 KB for int2/int2, int2/bf16, bf16/int2, bf16/bf16 (K/V) at d = 128
// (two blocks an SM), 135 KB at d = 256 (one); 85 / 95 / 78 / 68 KB at d = 128 on the small GPUs, where d = 256 does
// not fit (those prefill row by row).
template <int D>
constexpr int quant_stages(bool small) {
  return D > 128 || small ? 1 : 2;
}
template <bool KQ, int D>
constexpr int window_stages(bool small) {
  return KQ || D > 128 || small ? 1 : 2;
}
__device__ int g_small_smem = kSmemSmall;  // the loaded code's layout (smem_limits)
template <bool KQ, int D>
constexpr size_t region_offset = sizeof(Smem<D>) + (KQ ? sizeof(QRows<D>) : 0);
template <bool KQ, bool VQ, int D>
constexpr size_t smem_bytes(bool small) {
  return region_offset<KQ, D> + std::max(window_stages<KQ, D>(small) * sizeof(WindowTile<D>),
                                         quant_stages<D>(small) * sizeof(Tile<KQ, VQ, D>));
}
// Blocks an SM the instance is laid out for (228 KB, 1 KB reserved per block), which its launch bounds ask for.
template <int D>
constexpr int kBlocksPerSm = D > 128 ? 1 : 2;
template <bool KQ, bool VQ, int D>
constexpr bool fits_smem() {
  static_assert(sizeof(Smem<D>) % 16 == 0 && sizeof(QRows<D>) % 16 == 0 && sizeof(Int2Rows) % 16 == 0 &&
                    sizeof(Bf16Rows<D>) % 16 == 0,
                "the f16 queries, every tile and every side start 16-byte aligned");
  return smem_bytes<KQ, VQ, D>(false) <= (228 / kBlocksPerSm<D> - 1) * 1024 &&
         (D > 128 || smem_bytes<KQ, VQ, D>(true) <= 99 * 1024);
}

// One side (K: kv = 0, V: kv = 1) of a key tile, positions [s0, s0 + nv) of range R, into dst as cp.async copies (in
// the caller's commit group: in shared memory after its wait and a barrier); rows nv .. kKeys - 1 are zero (their
// scores are masked; zero rows and (scale, zero) words keep P V finite). bf16 rows: thread = (row, 16-byte chunk);
// int2 rows: the 64 threads [64 kv, 64 kv + 64) take one row each, word by word (rows are 36 bytes apart).
template <Range R, int D>
__device__ __forceinline__ void load_side(const CacheGeometry& geo, int seq, int layer, int kv, int head, int s0,
                                          int nv, Bf16Rows<D>& dst) {
  for (int i = threadIdx.x; i < kKeys * (D / 8); i += blockDim.x) {
    const int r = i / (D / 8), c = i % (D / 8);
    const int s = s0 + (r < nv ? r : 0);  // a row past nv copies nothing from position s0's row (mapped)
    const void* row = R == Range::kSink   ? static_cast<const void*>(dev::sink_row(geo, seq, layer, kv, head, s))
                      : R == Range::kRing ? static_cast<const void*>(dev::ring_row(geo, seq, layer, kv, head, s))
                                          : static_cast<const void*>(dev::page_row(geo, seq, layer, kv, head, s));
    cp_async_16(&dst[r][8 * c], static_cast<const uint4*>(row) + c, r < nv);  // bf16 rows: 16-byte aligned
  }
}
template <Range R, int D>
__device__ __forceinline__ void load_side(const CacheGeometry& geo, int seq, int layer, int kv, int head, int s0,
                                          int nv, Int2Rows& dst) {
  static_assert(R == Range::kQuant, "int2 rows are the quantized region's");
  const int r = int(threadIdx.x) - kv * kKeys;
  if (r < 0 || r >= kKeys) return;
  const uint8_t* row = dev::page_row(geo, seq, layer, kv, head, s0 + (r < nv ? r : 0));
#pragma unroll
  for (int w = 0; w < kRawWords; ++w) cp_async_4(&dst[r][w], row + 4 * w, r < nv);
}

// A warp's state over its 16 query rows: this lane's rows gid (j = 0) and gid + 8 (j = 1).
template <int D>
struct RowState {
  float o[D / 8][4];  // O in the C layout: n-tile dt = dims 8dt .., [row gid: 2tid, 2tid+1 | row gid+8: the same]
  float m[2];          // the softmax bound (base 2): >= every score so far, -inf before any valid key
  float l[2];          // this lane's share of the running sum (its keys), summed over the quad at the end
  float zsum[2];       // int2 values: this lane's share of Σ P' zero_v
  int t[2];            // positions of the rows
  int qe[2];           // qe(t)
};

// The dim that slot c (0 .. 15) of k-step kc of the int2 keys' fragments holds: k-step kc = 4wi + k takes field k
// of code words tid + 4wi, its bytes 0, 2 in slots 2tid, 2tid + 1 and bytes 1, 3 in slots 2tid + 8, 2tid + 9
// (word j holds values 32 (j / 2) + 4 (j % 2) + byte + 8 field: layout.h).
__device__ __forceinline__ int int2_key_dim(int kc, int c) {
  const int tid = (c % 8) / 2, byte = (c % 2) * 2 + c / 8;
  return 32 * (2 * (kc / 4) + tid / 2) + 4 * (tid % 2) + byte + 8 * (kc % 4);
}

// One key tile of range R at positions s0 .. (valid below hi), KI / VI: keys / values are int2 rows (f16 operands),
// else bf16 rows (hi + lo operands for the windows' rows). masked: compute the per-element predicate (a window edge
// or the diagonal crosses the tile), else every key is valid for every row. qh: the int2 keys' f16 queries.
template <Range R, bool KI, bool VI, int D>
__device__ __forceinline__ void attend_tile(const Smem<D>& sh, const QRows<D>* qh, const Tile<KI, VI, D>& kv, int s0,
                                            int hi, bool masked, RowState<D>& st) {
  static_assert(!(KI || VI) || D == kInt2Dim, "int2 rows of one 128-value group");
  constexpr bool kWin = R != Range::kQuant;  // the windows' exact rows: hi + lo operands
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;

  // ---- S = Q K^T: 8 n-tiles of 8 keys x 8 k-steps of 16 dims
  float s[kKeys / 8][4];
#pragma unroll
  for (int nt = 0; nt < kKeys / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
  const uint16_t(*q)[kPitch<D>] = KI ? *qh : sh.qb;
  // A fragments of Q: matrix lane / 8 holds rows + 8 (lane / 8 % 2), cols + 8 (lane / 16)
  const int qrow = 16 * warp + 8 * ((lane >> 3) & 1) + (lane & 7);
  if constexpr (KI) {
    uint32_t w[kKeys / 8][2];  // code words tid, tid + 4 of key 8nt + gid
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt)
      w[nt][0] = kv.k[8 * nt + gid][1 + tid], w[nt][1] = kv.k[8 * nt + gid][5 + tid];
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
      uint32_t a[4];
      ldmatrix_x4(a, &q[qrow][16 * kc + 8 * (lane >> 4)]);
#pragma unroll
      for (int nt = 0; nt < kKeys / 8; ++nt) {
        const uint32_t x = w[nt][kc / 4];
        const uint32_t b[2] = {codes_sub2(x, kc % 4), codes_sub2(x >> 8, kc % 4)};
        mma_f16(s[nt], a, b);
      }
    }
    // s = scale_k 2^24 (Σ code q 2^-24 - zero_k Σ q 2^-24)
    const float qs[2] = {sh.qsum[16 * warp + gid] / kTwo24, sh.qsum[16 * warp + gid + 8] / kTwo24};
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t p = kv.k[8 * nt + 2 * tid + e][0];
        const float scale = params_scale(p) * kTwo24, zero = params_zero(p);
        s[nt][e] = scale * (s[nt][e] - zero * qs[0]);
        s[nt][2 + e] = scale * (s[nt][2 + e] - zero * qs[1]);
      }
  } else {
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
      const int qcol = 16 * kc + 8 * (lane >> 4);
      uint32_t a[4], alo[4];
      ldmatrix_x4(a, &q[qrow][qcol]);
      if constexpr (kWin) ldmatrix_x4(alo, &sh.ql[qrow][qcol]);
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        uint32_t b[4];  // b0, b1 of n-tile 2np, then of 2np + 1
        ldmatrix_x4(b, &kv.k[8 * (2 * np + (lane >> 4)) + (lane & 7)][16 * kc + 8 * ((lane >> 3) & 1)]);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        mma_bf16(s[2 * np], a, b0);
        mma_bf16(s[2 * np + 1], a, b1);
        if constexpr (kWin) {
          mma_bf16(s[2 * np], alo, b0);
          mma_bf16(s[2 * np + 1], alo, b1);
        }
      }
    }
  }
  if (masked) {
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int pos = s0 + 8 * nt + 2 * tid + (e & 1), t = st.t[e >> 1], qe = st.qe[e >> 1];
        bool ok = pos < hi && pos <= t;
        if constexpr (R == Range::kQuant) ok = ok && pos < qe;
        if constexpr (R == Range::kRing) ok = ok && pos >= qe;
        if (!ok) s[nt][e] = -INFINITY;
      }
  }

  // ---- online softmax per row (base 2) against a lazily raised bound m >= every score so far, as the decode kernel
  // does: when a score exceeds m, m moves to kLazyMax above the row's largest score, so p = 2^(s - m) <= 1/2 and
  // most tiles skip the quad's max reduction and the rescale of O. Any m gives the same softmax in exact arithmetic.
  // A row with no valid key yet keeps m = -inf and p = 0.
  constexpr float kLazyMax = 1.f;  // log2(2)
  float mx[2];
  bool raise = false;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    mx[j] = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) mx[j] = fmaxf(mx[j], fmaxf(s[nt][2 * j], s[nt][2 * j + 1]));
    raise = raise || mx[j] > st.m[j];
  }
  if (__any_sync(0xffffffffu, raise)) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float r = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
      r = fmaxf(r, __shfl_xor_sync(0xffffffffu, r, 2));  // the row's largest score of the tile (its quad)
      const float m_new = fmaxf(st.m[j], r + kLazyMax);
      // 0 while m was -inf; 1 where m stays, also at -inf (a row with no valid key yet, raised by another row of
      // the warp: 2^(-inf - -inf) would be NaN)
      const float corr = m_new == st.m[j] ? 1.f : exp2_ftz(st.m[j] - m_new);
      st.m[j] = m_new;
      st.l[j] *= corr, st.zsum[j] *= corr;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) st.o[dt][2 * j] *= corr, st.o[dt][2 * j + 1] *= corr;
    }
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float m_use = st.m[j] == -INFINITY ? 0.f : st.m[j];
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
      s[nt][2 * j] = exp2_ftz(s[nt][2 * j] - m_use);
      s[nt][2 * j + 1] = exp2_ftz(s[nt][2 * j + 1] - m_use);
      st.l[j] += s[nt][2 * j] + s[nt][2 * j + 1];
    }
  }

  // ---- O += P V: k-step kk = keys 16kk .. (n-tiles 2kk, 2kk + 1 of S), 16 n-tiles of 8 dims
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    // A: rows gid / gid + 8 (a0 / a1) x keys 16kk + 2tid, +1, and keys + 8 (a2 / a3)
    uint32_t a[4];
    [[maybe_unused]] uint32_t alo[4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float* p = s[2 * kk + half];
      float x[4] = {p[0], p[1], p[2], p[3]};
      if constexpr (VI) {  // P' = p scale_v; the zero term takes P' unrounded
        const int key = 16 * kk + 8 * half + 2 * tid;
        const uint32_t p0 = kv.v[key][0], p1 = kv.v[key + 1][0];
        const float w0 = params_scale(p0), w1 = params_scale(p1), z0 = params_zero(p0), z1 = params_zero(p1);
        x[0] *= w0, x[1] *= w1, x[2] *= w0, x[3] *= w1;
        st.zsum[0] += x[0] * z0 + x[1] * z1;
        st.zsum[1] += x[2] * z0 + x[3] * z1;
      }
      a[2 * half] = pack2<VI>(x[0], x[1]);
      a[2 * half + 1] = pack2<VI>(x[2], x[3]);
      if constexpr (kWin) {  // the rounding error of the bf16 hi as a second bf16 term
        alo[2 * half] = pack2<false>(x[0] - round16<false>(x[0]), x[1] - round16<false>(x[1]));
        alo[2 * half + 1] = pack2<false>(x[2] - round16<false>(x[2]), x[3] - round16<false>(x[3]));
      }
    }
    if constexpr (VI) {
      // B of n-tile dt = 4u + k: keys 16kk + 2tid, +1 (b0) and + 8, + 9 (b1), dim 8dt + gid = byte gid % 4 of code word
      // 2u + gid / 4 at field k; the byte of two keys side by side (bytes 0 and 2), then one LOP3 per field
      const int key = 16 * kk + 2 * tid;
      const uint32_t sel = 0x0400u + 0x0101u * uint32_t(gid % 4);
#pragma unroll
      for (int u = 0; u < D / 32; ++u) {
        const int word = 1 + 2 * u + gid / 4;
        const uint32_t x01 = __byte_perm(kv.v[key][word], kv.v[key + 1][word], sel);
        const uint32_t x89 = __byte_perm(kv.v[key + 8][word], kv.v[key + 9][word], sel);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t b[2] = {codes_sub2(x01, k), codes_sub2(x89, k)};
          mma_f16(st.o[4 * u + k], a, b);
        }
      }
    } else {
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];  // b0, b1 of dim n-tile 2dp, then of 2dp + 1 (matrix lane / 8: keys + 8 (lane / 8 % 2))
        ldmatrix_x4_trans(b, &kv.v[16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7)][8 * (2 * dp + (lane >> 4))]);
        const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
        mma_bf16(st.o[2 * dp], a, b0);
        mma_bf16(st.o[2 * dp + 1], a, b1);
        if constexpr (kWin) {
          mma_bf16(st.o[2 * dp], alo, b0);
          mma_bf16(st.o[2 * dp + 1], alo, b1);
        }
      }
    }
  }
}

// KQ / VQ: the quantized region's keys / values are int2 rows of one 128-value group, else bf16 rows of D values.
template <bool KQ, bool VQ, int D>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm<D>) prefill_attention_kernel(CacheGeometry geo,
                                                                                         AttentionLaunch a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem<D>& sh = *reinterpret_cast<Smem<D>*>(smem_raw);
  [[maybe_unused]] QRows<D>* qh = reinterpret_cast<QRows<D>*>(smem_raw + sizeof(Smem<D>));  // KQ only
  unsigned char* region = smem_raw + region_offset<KQ, D>;
  const PrefillTile tile = a.tiles[blockIdx.x];
  const int head = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
  const int g = a.n_heads / geo.n_kv;
  const int n_flat = tile.n * g;                            // rows of the chunk x heads
  const int n_here = min(kRows, n_flat - tile.r0);          // rows of this tile
  const int t0 = tile.pos0 + tile.r0 / g, t1 = tile.pos0 + (tile.r0 + n_here - 1) / g;
  const int qe0 = view_quant_end(geo, tile.seq, t0), qe1 = view_quant_end(geo, tile.seq, t1);

  // ---- the tile's queries · log2 e: bf16 hi + lo, and for int2 keys f16 · 4^-k in their dim order, with Σ_d of
  // the f16 values (rows past the chunk: zero)
  auto q_at = [&](int r) -> const float* {
    const int fr = tile.r0 + r, pi = fr / g, h = fr % g;
    return a.q_work + (int64_t(tile.lrow0 + pi) * a.n_heads + head * g + h) * D;
  };
  for (int i = threadIdx.x; i < kRows * (D / 4); i += blockDim.x) {
    const int r = i / (D / 4), c = 4 * (i % (D / 4));
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < n_here) {
      x = *reinterpret_cast<const float4*>(q_at(r) + c);
      x.x *= kLog2e, x.y *= kLog2e, x.z *= kLog2e, x.w *= kLog2e;
    }
    const float4 lo = make_float4(x.x - round16<false>(x.x), x.y - round16<false>(x.y), x.z - round16<false>(x.z),
                                  x.w - round16<false>(x.w));
    *reinterpret_cast<uint2*>(&sh.qb[r][c]) = make_uint2(pack2<false>(x.x, x.y), pack2<false>(x.z, x.w));
    *reinterpret_cast<uint2*>(&sh.ql[r][c]) = make_uint2(pack2<false>(lo.x, lo.y), pack2<false>(lo.z, lo.w));
  }
  if constexpr (KQ) {
    for (int i = threadIdx.x; i < kRows * D; i += blockDim.x) {
      const int r = i / D, c = i % D, kc = c / 16, d = int2_key_dim(kc, c % 16);
      const float x = r < n_here ? q_at(r)[d] * kLog2e : 0.f;
      (*qh)[r][c] = __half_as_ushort(__float2half_rn(x / float(1 << (2 * (kc % 4)))));
    }
    if (threadIdx.x < kRows) {
      float sum = 0.f;
      if (int(threadIdx.x) < n_here) {
        const float* qr = q_at(threadIdx.x);
        for (int d = 0; d < D; ++d) sum += round16<true>(qr[d] * kLog2e);
      }
      sh.qsum[threadIdx.x] = sum;
    }
  }

  RowState<D> st;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) st.o[dt][0] = st.o[dt][1] = st.o[dt][2] = st.o[dt][3] = 0.f;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int r = min(16 * warp + gid + 8 * j, n_here - 1);  // rows past the chunk act as the last row (not written)
    st.t[j] = tile.pos0 + (tile.r0 + r) / g;
    st.qe[j] = view_quant_end(geo, tile.seq, st.t[j]);
    st.m[j] = -INFINITY, st.l[j] = 0.f, st.zsum[j] = 0.f;
  }

  // ---- the three ranges, clipped to this block's split, in key tiles. Two stages: tile i + 1's copies are issued
  // into the other stage before tile i is computed (that stage was last read by tile i - 1, before its closing
  // barrier); one stage: each tile is copied after the previous one's reads.
  const int z0 = split * a.split_tokens, z1 = z0 + a.split_tokens;
  auto walk = [&](auto range, int lo, int hi) {
    constexpr Range R = decltype(range)::value;
    constexpr bool KI = R == Range::kQuant && KQ, VI = R == Range::kQuant && VQ;
    constexpr int S = R == Range::kQuant ? quant_stages<D>(kSmemSmall) : window_stages<KQ, D>(kSmemSmall);
    using T = Tile<KI, VI, D>;
    T* stage = reinterpret_cast<T*>(region);
    lo = max(lo, z0), hi = min(hi, z1);
    if (lo >= hi) return;
    auto load = [&](T& t, int s0) {
      const int nv = min(kKeys, hi - s0);
      load_side<R, D>(geo, tile.seq, a.layer, 0, head, s0, nv, t.k);
      load_side<R, D>(geo, tile.seq, a.layer, 1, head, s0, nv, t.v);
    };
    __syncthreads();  // the region is free: the previous range's reads (and the queries' writes) are done
    load(stage[0], lo);
    cp_async_commit();
    for (int i = 0, s0 = lo; s0 < hi; ++i, s0 += kKeys) {
      if constexpr (S == 1) {
        if (i > 0) {
          __syncthreads();  // the previous tile's reads are done
          load(stage[0], s0);
        }
      } else if (s0 + kKeys < hi) {
        load(stage[(i + 1) % S], s0 + kKeys);
      }
      cp_async_commit();
      cp_async_wait<S - 1>();  // tile i's copies have landed (tile i + 1's may still be in flight)
      __syncthreads();         // ... for every thread
      const int nv = min(kKeys, hi - s0);
      // every row takes every key of the tile: no mask
      const bool full = nv == kKeys && (R == Range::kSink    ? s0 + kKeys - 1 <= t0
                                        : R == Range::kQuant ? s0 + kKeys <= qe0
                                                             : s0 >= qe1 && s0 + kKeys - 1 <= t0);
      attend_tile<R, KI, VI, D>(sh, qh, stage[i % S], s0, hi, !full, st);
      if constexpr (S > 1) __syncthreads();  // this stage's reads are done before tile i + 2 is issued into it
    }
  };
  walk(std::integral_constant<Range, Range::kQuant>{}, geo.sink, qe1);
  if constexpr (VQ) {  // O's n-tile dt from units of 4^(dt % 4)·2^-24 (the int2 values' codes) to the windows' units
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[dt][e] *= kTwo24 / float(1 << (2 * (dt % 4)));
  }
  walk(std::integral_constant<Range, Range::kSink>{}, 0, min(geo.sink, t1 + 1));
  walk(std::integral_constant<Range, Range::kRing>{}, max(geo.sink, qe0), t1 + 1);

  // ---- this split's partial of every row of the tile (m back to base e; an empty split: m = -inf, l = 0, acc = 0)
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
      st.l[j] += __shfl_xor_sync(0xffffffffu, st.l[j], x);
      st.zsum[j] += __shfl_xor_sync(0xffffffffu, st.zsum[j], x);
    }
    const int r = 16 * warp + gid + 8 * j;
    if (r >= n_here) continue;
    const int fr = tile.r0 + r, pi = fr / g, h = fr % g;
    const int64_t part = (int64_t(tile.lrow0 + pi) * geo.n_kv + head) * a.n_slots + split;
    float* acc = a.part_acc + (part * g + h) * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<float2*>(acc + 8 * dt + 2 * tid) =
          make_float2(st.o[dt][2 * j] - st.zsum[j], st.o[dt][2 * j + 1] - st.zsum[j]);
    if (tid == 0) {
      a.part_ml[(part * g + h) * 2] = st.m[j] == -INFINITY ? -INFINITY : st.m[j] * kLn2;
      a.part_ml[(part * g + h) * 2 + 1] = st.l[j];
    }
  }
}

// Whether the code this GPU loaded lays its tiles out for 99 KB blocks (g_small_smem), and the shared memory a block
// may opt into on the current device: read once (not inside a stream capture: GpuKvCache's constructor asks first,
// through attention_prefill_supported).
struct SmemLimits {
  bool small = false;   // g_small_smem
  int optin = 0;        // bytes (0: no device)
};
const SmemLimits& smem_limits() {
  static const SmemLimits limits = [] {
    SmemLimits l;
    int small = 0, dev = 0;
    if (cudaMemcpyFromSymbol(&small, g_small_smem, sizeof(small)) != cudaSuccess ||
        cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&l.optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      cudaGetLastError();  // no device: the launches report it
      return SmemLimits{};
    }
    l.small = small != 0;
    return l;
  }();
  return limits;
}

// The kernel instance of the cache's tensor-core instance row and its dynamic shared memory (null for a CUDA-core
// row or no row, and where the instance's tiles need more shared memory than a block of this GPU holds: d = 256 on
// sm_86 / sm_89, which prefill row by row).
using PrefillKernelFn = void (*)(CacheGeometry, AttentionLaunch);
struct PrefillKernel {
  PrefillKernelFn fn = nullptr;
  int smem = 0;  // bytes of dynamic shared memory
};
PrefillKernel prefill_kernel(const CacheGeometry& g) {
  PrefillKernel k;
  const SmemLimits& limits = smem_limits();
  with_instance(g.instance, g.head_dim, [&](auto row, auto dim) {
    constexpr GpuInstance r = kGpuInstances[decltype(row)::value];
    constexpr int D = decltype(dim)::value;
    if constexpr (gpu_prefill_kernel(r)) {
      constexpr auto takes = [](CodecId id) { return id == CodecId::kInt2 || id == CodecId::kBf16; };
      static_assert(takes(r.k) && takes(r.v), "the prefill kernel takes int2 and bf16 rows");
      static_assert((r.k != CodecId::kInt2 && r.v != CodecId::kInt2) || (r.groups == kG128 && D == kInt2Dim),
                    "the prefill kernel takes int2 rows of one 128-value group");
      constexpr bool KQ = r.k == CodecId::kInt2, VQ = r.v == CodecId::kInt2;
      static_assert(fits_smem<KQ, VQ, D>(), "the instance's shared memory fits its blocks per SM");
      const int smem = int(smem_bytes<KQ, VQ, D>(limits.small));
      if (limits.optin == 0 || smem <= limits.optin) k = {prefill_attention_kernel<KQ, VQ, D>, smem};
    }
  });
  return k;
}

// Raises the instance's dynamic shared memory limit past the 48 KB default (cheap; every launch does it).
int allow_smem(const PrefillKernel& k) {
  return cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem);
}

}  // namespace

bool attention_prefill_supported(const CacheGeometry& g) { return prefill_kernel(g).fn != nullptr; }

int launch_attention_prefill(const CacheGeometry& g, const AttentionLaunch& a_in, const TransformPtrs& t,
                             const float* d_q, float* d_out, void* stream) {
  if (a_in.n_rows <= 0) return cudaSuccess;
  const PrefillKernel kernel = prefill_kernel(g);
  if (!kernel.fn) return cudaErrorInvalidValue;  // not a tensor-core row: the cache keeps the per-row path
  AttentionLaunch a = a_in;
  a.n_slots = a.n_splits;
  int e = launch_prepare_queries(g, a, t, d_q, stream);
  if (e != cudaSuccess) return e;
  if ((e = allow_smem(kernel)) != cudaSuccess) return e;
  const dim3 grid(unsigned(a.n_tiles), unsigned(g.n_kv), unsigned(a.n_splits));
  kernel.fn<<<grid, kWarps * 32, size_t(kernel.smem), static_cast<cudaStream_t>(stream)>>>(g, a);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  return launch_merge_partials(g, a, t, d_out, stream);
}

int attention_prefill_blocks_per_sm(const CacheGeometry& g, int* blocks) {
  const PrefillKernel kernel = prefill_kernel(g);
  if (!kernel.fn) return cudaErrorInvalidValue;
  if (const int e = allow_smem(kernel); e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel.fn, kWarps * 32, size_t(kernel.smem));
}

}  // namespace kvq::cuda
