// Tensor-core decode attention over each row's whole view in one launch: the QUANTIZED region [S0, qe(t)) in splits,
// for int2 rows of one 128-value group (d = 128) and bf16 rows of any d that is a multiple of 16 (keys and values
// chosen independently; templated on d: kernel instances at the d of the instance rows, gpu_instances.h), and the BF16
// sink and recent windows in n_win more blocks per (row, kv head) with the same tile code on bf16 rows, into n_win
// more partial slots. The last of a (row, kv head)'s blocks to finish (or the merge kernel of decode_attention.cu,
// without a.arrivals) combines every slot exactly (log-sum-exp), so the result is one softmax over the whole view.
//
// Grid (row, kv head, n_splits + n_win); 4 warps; a warp takes tiles of 16 positions (a tile never crosses a page: splits
// start at S0 + k·split_tokens and pages hold a multiple of 16 rows). mma.sync with the GQA group on the N side
// (g <= 8 query heads, padded with zero queries), so nothing is padded to 64 rows:
//   scores   S[pos][h] = Σ_d K[pos][d] · Q[d][h]       A = 16 positions x dims of codes, B = dims x heads
//   values   O^T[d][h] += Σ_pos V^T[d][pos] · P'[pos][h]  A = 16 dims x 16 positions of codes, B = the tile's P'
// Column n of the B operands is head n / 2 + 4 (n % 2), so a lane's C columns 2tid, 2tid + 1 are heads tid and
// tid + 4 (its head slots): for g <= 4 (HS = 1) a lane's second slot is padding that the softmax skips.
// int2 keys, g <= 4: m16n8k32 on u8 codes x s8 queries, exact in integers. A key code word masked to field f in place
// holds the u8 values c·4^f (one LOP3 per four codes), so each field has an mma of its own, summed as
// Σ_f 4^(3-f) acc_f; q·log2(e) is split into two s8 terms, q ≈ step · (hi + lo/128) with step = max|q| / 127 (about
// 15 significant bits of the largest element), in the two columns of each head:
//   s = scale_k · (step · 2^-13 · (128 · S_hi + S_lo) − zero_k · Σ q),  S_x = 64 Σ_d code_d · x_d
// int2 values (and int2 keys for g > 4) become f16 exactly in one LOP3 per pair: a code field masked in place is the
// f16 subnormal c·4^k·2^-24 (codes_sub2; tensor cores take f16 subnormals at full precision and every product is
// exact in f32), in m16n8k16 mma whose field factor 4^k·2^-24 leaves the inner loop with scale and zero (keys take
// q·4^-k rounded to f16):
//   s = scale_k · (2^24 · Σ code·4^k·2^-24 · q·4^-k − zero_k · Σ q)                  (key k-steps of field k)
//   O = 2^24·4^-k · Σ_pos P'·code·4^k·2^-24 − Σ_pos P'·zero_v,  P' = p · scale_v    (value m-tiles of field k)
// A lane reads whole 32-bit code words of each row and the fragments take the dims those words hold: keys in an order
// that the query B fragments share, values in an order that the write-back undoes. P' is rounded to f16 for int2
// rows (relative 2^-11), q and P' to bf16 for bf16 rows (as FlashAttention does), but for the windows' rows to bf16
// hi + lo pairs (see attend_block); products accumulate in f32. The int2 words of a warp's next tile are loaded while
// it computes the current one (TileWords: a software pipeline in registers, so each tile's DRAM latency hides behind
// the previous tile's math). bf16 rows of the quantized region (the bf16 / bf16 instance) are copied into a per-warp
// ring of three tiles in shared memory instead, two tiles ahead, and ldmatrix reads their fragments (StagedTile).
// P' goes from the scores' C fragments to the value mma's B fragment by two movmatrix transposes, in registers.
// Decoded tiles (the kDecodedTile rows: every other format at d = 128): a warp decodes each tile of 16 positions through
// the row's device codecs into one stage of the same layout, rounded to f16, and the staged tile code computes it on
// f16 mma with q and P' rounded to f16 (decode_tile); the windows are the bf16 windows as above, or for a row with int8
// windows (KV4-RL) tiles decoded the same way (decode_window_tile).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/cache_device.cuh"
#include "cuda/codecs.cuh"
#include "cuda/key_tile.cuh"
#include "cuda/mma.cuh"

namespace kvq::cuda {

namespace {

using namespace tc;  // mma, mma_u8s8, pack2, round16, exp2_ftz, codes_sub2, kLog2e, kLn2, kTwo24, params_*

constexpr int kWarps = 4;
constexpr int kTile = 16;

// The 8x8 16-bit matrix whose row gid, columns 2tid and 2tid + 1 this lane holds (low half first), transposed: the
// lane then holds its column gid, rows 2tid and 2tid + 1.
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

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

// A tile's row sizes, fixed at compile time: the kernel takes int2 rows of one 128-value group (d = 128) and bf16 rows
// of D values only (its instance rows in gpu_instances.h; mma_kernel checks them).
constexpr int kInt2Dim = 128;                                           // d of the int2 rows
constexpr int kInt2Row = layout::int_row_bytes(kInt2Dim, kInt2Dim, 2);  // 36: word 0 = (scale, zero), words 1 .. 8
template <int D>
constexpr int bf16_row = layout::bf16_row_bytes(D);  // 256 at d = 128
template <bool Q, int D>
constexpr int row_bytes = Q ? kInt2Row : bf16_row<D>;

// bf16 rows of the quantized region (the bf16 / bf16 instance) go through shared memory at d = 64 and 128: each warp
// keeps a ring of kStages tiles, filled by 16-byte cp.async, so kStages - 1 tiles are in flight while it computes one,
// and read by ldmatrix. A side (K or V) of a tile is 16 rows of 2d bytes; 16-byte chunk c of row r sits at chunk
// c ^ (r % 8), so the 8 rows of every ldmatrix matrix hit 8 different bank groups (rows of whole groups of 8 chunks:
// d a multiple of 64). At d = 96 (12 chunks a row) and 256 (a ring of 196 KB) the rows are read from global memory as
// the windows' are. Three tiles a ring (2 x 98 KB of shared memory per SM on the H200 at d = 128), two where a block
// holds at most 99 KB (tc::kSmemSmall: sm_86, sm_89); the host reads the loaded code's count (loaded_stages).
constexpr int kStages = kSmemSmall ? 2 : 3;
__device__ int g_ring_stages = kStages;
template <int D>
constexpr bool stages_bf16 = D % 64 == 0 && D <= 128;
template <int D>
constexpr int tile_side = kTile * bf16_row<D>;  // 4096 at d = 128
template <int D>
constexpr int stage_bytes = 2 * tile_side<D>;   // K, then V
template <int D>
constexpr int warp_ring = kStages * stage_bytes<D>;
// The instance's dynamic shared memory for rings of `stages` tiles (the host's count of the loaded code).
template <bool KQ, bool VQ, int D>
constexpr int ring_bytes(int stages) {
  return !KQ && !VQ && stages_bf16<D> ? kWarps * stages * stage_bytes<D> : 0;
}

template <int D>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * bf16_row<D> + ((chunk ^ (row & 7)) << 4);
}

// Decoded tiles' raw ring: a warp copies the stored bytes of its tiles kRawStages - 1 ahead (16-byte cp.async: every
// offset of a tile's rows in a page is a multiple of 16, as pages hold a multiple of 16 rows), so that a tile's DRAM
// latency hides behind the previous tile's work; decode_tile reads them from there. A stage holds a tile's key side
// (its 16 per-token key rows, or what its rows read of their key block: cuda/key_tile.cuh) and its 16 value rows.
constexpr int kRawStages = 2;
template <class K>
KVQ_HD inline int raw_stage_bytes(const CacheGeometry& g) {
  if constexpr (K::kKeyBlocks) {
    static_assert(dev::GathersKeyTile<K>, "key blocks come through the raw ring");
    return K::kTileBytes + kTile * g.v_row;
  } else {
    return kTile * (g.k_row + g.v_row);
  }
}

// A staged tile: its K and V sides in the warp's ring.
struct StagedTile {
  const uint8_t* k;
  const uint8_t* v;
};

// The codecs of a decoded-tile row (gpu_instances.h): K, V, W the device codecs of its keys, values and window rows
// (codecs.cuh: RowKeys, RowValues, RowWindows).
template <class K, class V, class W>
struct Decoded {
  using Keys = K;
  using Values = V;
  using Windows = W;
};
// What a window block of a kernel instance decodes: nothing for bf16 windows (the bf16 window code), and for a
// decoded-tile row's int8 windows (KV4-RL) their rows, K and V alike, as decoded tiles.
template <class Dec, int D>
struct WindowTilesOf {
  using type = void;
};
template <class K, class V, class W, int D>
  requires(!std::is_same_v<W, dev::Bf16Rows<D>>)
struct WindowTilesOf<Decoded<K, V, W>, D> {
  using type = Decoded<W, W, W>;
};

// The lane's reader of a key tile copy (cuda/key_tile.cuh) for key blocks, nothing for per-token rows.
struct NoKeyTile {
  __device__ NoKeyTile(const uint8_t*, int, int) {}
};
template <class K>
struct KeyTileOf {
  using type = NoKeyTile;
};
template <dev::GathersKeyTile K>
struct KeyTileOf<K> {
  using type = typename K::KeyTile;
};

// Two floats as f16x2 (lo in the low half), rounded to nearest and saturated to ±65504, NaN staying NaN: one cvt.
__device__ __forceinline__ uint32_t f16x2_sat(float lo, float hi) {
  uint32_t h;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(h) : "f"(hi), "f"(lo));
  return h;
}

// The K side of a decoded tile of codebook keys (TurboQuant's: dev::ReadsCodebook; D = 128, a lane holding channels
// 4 lane .. 4 lane + 3 of every row), 8 rows at a time: value c of a row is factor · centroid[idx_c]. With the norm
// correction the factor needs the row's sum of squares over the warp. A butterfly per row took 5 shuffles a row; a
// reduce-scatter takes 9 for 8 rows: at xor 16, 8 and 4 each lane keeps the half of its rows whose partials its partner
// sends it, so that after xor 2 and 1 lane l holds row l / 4's sum — each row's sum of the same pairs in the same tree
// as the butterfly's, so the same float — and every lane takes the 8 rows' factors from lanes 4r (8 more).
template <class K, int D>
__device__ __forceinline__ void decode_codebook_keys(const CacheGeometry& geo, const float* codebook,
                                                     const uint8_t* keys, int nv, uint8_t* dst, int lane) {
  static_assert(D == 128, "a lane holds 4 channels of every row");
  const int c0 = 4 * lane;
#pragma unroll
  for (int r0 = 0; r0 < kTile; r0 += 8) {
    float k[8][4], ss[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      K::centroids4(keys + (r0 + r) * geo.k_row, codebook, c0, k[r]);
      ss[r] = k[r][0] * k[r][0];
#pragma unroll
      for (int e = 1; e < 4; ++e) ss[r] = fmaf(k[r][e], k[r][e], ss[r]);
    }
    [[maybe_unused]] float f = 0.f;  // lane l: the factor of row r0 + l / 4
    if constexpr (K::kNormCorrected) {
#pragma unroll
      for (int n = 4; n >= 1; n >>= 1) {  // xor 16, 8, 4: the lane's partials of 8 rows -> 4 -> 2 -> 1
        const bool upper = lane & (4 * n);
#pragma unroll
        for (int j = 0; j < n; ++j) {
          const float keep = upper ? ss[j + n] : ss[j], give = upper ? ss[j] : ss[j + n];
          ss[j] = keep + __shfl_xor_sync(0xffffffffu, give, 4 * n);
        }
      }
      ss[0] += __shfl_xor_sync(0xffffffffu, ss[0], 2);
      ss[0] += __shfl_xor_sync(0xffffffffu, ss[0], 1);
      f = K::factor(keys + (r0 + lane / 4) * geo.k_row, ss[0]);
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const float fr = K::kNormCorrected ? __shfl_sync(0xffffffffu, f, 4 * r)
                                         : K::factor(keys + (r0 + r) * geo.k_row, 0.f);
      const float* x = k[r];
      *reinterpret_cast<uint2*>(dst + swizzled<D>(r0 + r, c0 / 8) + 2 * (c0 % 8)) =
          r0 + r < nv ? make_uint2(f16x2_sat(x[0] * fr, x[1] * fr), f16x2_sat(x[2] * fr, x[3] * fr))
                      : make_uint2(0u, 0u);
    }
  }
}

// The K side of a decoded tile of Hadamard-domain keys (NexusQuant's: dev::hadamard_rows; D = 128), a row over
// kHadamardLanes lanes: they decode its ŷ by values4 and take it back through the Hadamard (finish_lanes) and RoPE at
// its position for keys stored without it (rope_lanes) together, 32 / kHadamardLanes rows a pass. Where a lane held 4
// values of every row, the Hadamard's shuffles were 384 a lane and tile; 4 lanes a row take 128 (2 lanes: 64, but 64
// values a lane spill registers).
constexpr int kHadamardLanes = 4;
template <class K, int D>
__device__ __forceinline__ void decode_hadamard_keys(const CacheGeometry& geo, const uint8_t* keys, int nv, int p0,
                                                     uint8_t* dst, int lane) {
  constexpr int L = kHadamardLanes, kValues = D / L;
  const int q = lane % L;
#pragma unroll
  for (int r = lane / L; r < kTile; r += 32 / L) {
    const uint8_t* row = keys + r * geo.k_row;
    float x[kValues];
#pragma unroll
    for (int j = 0; j < kValues; j += 4) K::values4(row, 0, geo.k_group, K::template lane_channel<L>(q, j), x + j);
    const bool in = r < nv;
    K::template finish_lanes<L>(x, q);
    if (const float* angles = in ? dev::rope_angles_of<K, D>(geo, p0 + r) : nullptr)
      K::template rope_lanes<L>(x, q, angles);
#pragma unroll
    for (int j = 0; j < kValues; j += 8)  // 16-byte chunks of 8 channels
      *reinterpret_cast<uint4*>(dst + swizzled<D>(r, K::template lane_channel<L>(q, j) / 8)) =
          in ? make_uint4(f16x2_sat(x[j], x[j + 1]), f16x2_sat(x[j + 2], x[j + 3]), f16x2_sat(x[j + 4], x[j + 5]),
                          f16x2_sat(x[j + 6], x[j + 7]))
             : make_uint4(0u, 0u, 0u, 0u);
  }
}

// Decoded tiles: the warp writes a tile's 16 rows into `dst` as a staged 16-bit tile (K side, then V side, swizzled
// rows), which the staged tile code then reads; rows from nv on are zeros. Value row r is at values + r · v_row, key
// row r at keys + r · k_row, or for key blocks row krow0 + r of their block, whose tile copy is at keys (the tile's
// raw bytes in the warp's raw ring in shared memory: see attend_block). The rows are decoded in f32 by the device
// codecs' values4 and rounded to f16 (2^-11 relative; q and P' are rounded to f16 too), saturated at ±65504 so that a
// value beyond f16's range cannot become inf (NaN stays NaN).
// Lane l always takes the chunk of 4 values c0 = 4 (l % (D / 4)), of rows l / (D / 4) + (32 / (D / 4)) k, so whatever
// depends only on the channels (a group's index, KIVI's per-channel parameters' offsets) is computed once. Key blocks
// (KIVI, OScaR, Kitty) are read from their tile copies by a KeyTile a lane makes once (its channels' parameters):
// blocks of >= 32 positions start at multiples of 16, so a tile lies in one. OScaR's keys are multiplied by their ν
// (nu: the tile's first row's), FP8 rows by the layer's per-tensor scale, and TurboQuant's codebook keys
// (decode_codebook_keys) and NexusQuant's (decode_hadamard_keys) are decoded by a pass of their own before the
// values. NexusQuant's values stay in the Hadamard domain (ŷ), and the block's sums of P' · ŷ go through the Hadamard
// once at the end (attend_block), since it is linear: 16 rows' transforms a tile become g rows' a block. ktable: the
// head's table of a key codec that reads one (dev::key_table: TurboQuant's codebook, PN-Mix's widths), else null.
template <class K, class V, int D>
__device__ __forceinline__ void decode_tile(const CacheGeometry& geo, const void* ktable, const uint8_t* keys,
                                            int krow0, const uint8_t* values, int nv, int p0, const float* nu,
                                            uint8_t* dst, int lane) {
  constexpr int kChunks = D / 4, kRowsPerPass = 32 / kChunks;
  static_assert(kChunks <= 32 && 32 % kChunks == 0, "a pass of the warp holds whole rows");
  const int c0 = 4 * (lane % kChunks);
  constexpr bool kKeysApart = dev::ReadsCodebook<K> || dev::hadamard_rows<K>();  // a pass of their own
  static_assert(!kKeysApart || (!dev::token_scaled<K>() && !dev::tensor_scaled<K>()), "scaled apart keys");
  if constexpr (dev::ReadsCodebook<K>)
    decode_codebook_keys<K, D>(geo, static_cast<const float*>(ktable), keys, nv, dst, lane);
  if constexpr (dev::hadamard_rows<K>()) decode_hadamard_keys<K, D>(geo, keys, nv, p0, dst, lane);
  [[maybe_unused]] const typename KeyTileOf<K>::type key_tile(keys, krow0, c0);
#pragma unroll 4
  for (int r = lane / kChunks; r < kTile; r += kRowsPerPass) {
    float k[4], v[4];  // both decoded before either is stored: the stores may alias the raw rows for the compiler
    if constexpr (!kKeysApart) {
      if constexpr (K::kKeyBlocks) key_tile.values4(r, k);
      else if constexpr (dev::ReadsTable<K>)
        K::values4(keys + r * geo.k_row, static_cast<const typename K::Table*>(ktable), c0, k);
      else K::values4(keys + r * geo.k_row, 0, geo.k_group, c0, k);
      if constexpr (dev::token_scaled<K>()) {
#pragma unroll
        for (int e = 0; e < 4; ++e) k[e] *= nu[r];
      }
      if constexpr (dev::tensor_scaled<K>()) {
#pragma unroll
        for (int e = 0; e < 4; ++e) k[e] *= geo.k_scale;
      }
    }
    V::values4(values + r * geo.v_row, 0, geo.v_group, c0, v);  // NexusQuant's: ŷ
    if constexpr (dev::tensor_scaled<V>()) {
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] *= geo.v_scale;
    }
    const bool in = r < nv;
    const int at = swizzled<D>(r, c0 / 8) + 2 * (c0 % 8);
    if constexpr (!kKeysApart)
      *reinterpret_cast<uint2*>(dst + at) =
          in ? make_uint2(f16x2_sat(k[0], k[1]), f16x2_sat(k[2], k[3])) : make_uint2(0u, 0u);
    *reinterpret_cast<uint2*>(dst + tile_side<D> + at) =
        in ? make_uint2(f16x2_sat(v[0], v[1]), f16x2_sat(v[2], v[3])) : make_uint2(0u, 0u);
  }
}

// A tile of the windows' rows that are not bf16 (KV4-RL's int8 rows: W), decoded as decode_tile decodes a tile: row r
// < nv of K / V at row(0, r) / row(1, r) (sink and ring rows lie apart, so they are read from global memory where they
// are: a window block has a few tiles), f16 into `dst` as a staged tile; rows from nv on are zeros and are not read.
template <class W, int D, class Row>
__device__ __forceinline__ void decode_window_tile(const CacheGeometry& geo, Row row, int nv, uint8_t* dst, int lane) {
  constexpr int kChunks = D / 4, kRowsPerPass = 32 / kChunks;
  const int c0 = 4 * (lane % kChunks);
#pragma unroll 4
  for (int r = lane / kChunks; r < kTile; r += kRowsPerPass) {
    float k[4] = {0.f, 0.f, 0.f, 0.f}, v[4] = {0.f, 0.f, 0.f, 0.f};
    if (r < nv) {
      W::values4(row(0, r), 0, geo.window_group, c0, k);
      W::values4(row(1, r), 0, geo.window_group, c0, v);
    }
    const int at = swizzled<D>(r, c0 / 8) + 2 * (c0 % 8);
    *reinterpret_cast<uint2*>(dst + at) = make_uint2(f16x2_sat(k[0], k[1]), f16x2_sat(k[2], k[3]));
    *reinterpret_cast<uint2*>(dst + tile_side<D> + at) = make_uint2(f16x2_sat(v[0], v[1]), f16x2_sat(v[2], v[3]));
  }
}

// What a lane reads of one tile's int2 rows, loaded one tile ahead of its use. Lane (gid, tid) takes positions
// ra = gid, rb = gid + 8 for the scores and r0, r1, r8, r9 = 2tid, 2tid + 1, 2tid + 8, 2tid + 9 for the values.
// Every row of a tile lies in its page, so the rows past a partial last tile are read too (masked, or P' = 0).
struct TileWords {
  uint32_t kp[2];     // keys: (scale, zero) of ra, rb
  uint32_t kw[2][2];  // keys: code words tid and tid + 4 (code bytes 4tid .. and 16 + 4tid ..) of ra, rb
  uint32_t vp[2];     // values: (scale, zero) of ra, rb
  uint32_t vw[4];     // values: code word gid (code bytes 4gid ..) of r0, r1, r8, r9
};

// Byte offsets from a tile's first int2 row to the words of TileWords, fixed for the block, so that locating a tile
// is one base address and every load adds a constant.
struct LaneOffsets {
  uint32_t params;  // word 0 of row gid
  uint32_t kcode;   // key code word tid of row gid
  uint32_t vcode;   // value code word gid of row 2tid
  __device__ LaneOffsets(int gid, int tid)
      : params(uint32_t(gid * kInt2Row)),
        kcode(uint32_t(gid * kInt2Row + 4 + 4 * tid)),
        vcode(uint32_t(2 * tid * kInt2Row + 4 + 4 * gid)) {}
};

// Where a tile of 16 positions is stored: its pool page and the page row of its first position.
struct TileAt {
  int page;  // pool page (page-table entry)
  int row;   // (position - S0) % P
};

__device__ __forceinline__ uint32_t word_at(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Loads the int2 parts (KQ keys, VQ values) of the tile whose first K / V rows are kbase / vbase.
template <bool KQ, bool VQ>
__device__ __forceinline__ TileWords load_tile(const uint8_t* kbase, const uint8_t* vbase, const LaneOffsets& o) {
  constexpr int r8 = 8 * kInt2Row;  // from row r to row r + 8
  TileWords t{};
  if constexpr (KQ) {
    const uint8_t *p = kbase + o.params, *c = kbase + o.kcode;
    t.kp[0] = word_at(p), t.kp[1] = word_at(p + r8);
    t.kw[0][0] = word_at(c), t.kw[0][1] = word_at(c + 16);
    t.kw[1][0] = word_at(c + r8), t.kw[1][1] = word_at(c + r8 + 16);
  }
  if constexpr (VQ) {
    const uint8_t *p = vbase + o.params, *c = vbase + o.vcode;
    t.vp[0] = word_at(p), t.vp[1] = word_at(p + r8);
    t.vw[0] = word_at(c), t.vw[1] = word_at(c + kInt2Row);
    t.vw[2] = word_at(c + r8), t.vw[3] = word_at(c + r8 + kInt2Row);
  }
  return t;
}

// The dim of value fragment row gid (+ 1 for row gid + 8) of m-tile mt when values are int2: lane gid holds code word
// gid of its rows (values j + 8k of unit gid / 2, j = 4(gid % 2) + byte), and m-tile mt = 2k + h takes bytes 2h, 2h + 1
// at field k (see the value mma).
__device__ __forceinline__ int int2_value_dim(int mt, int gid) {
  return 32 * (gid / 2) + 4 * (gid % 2) + 8 * (mt / 2) + 2 * (mt % 2);
}

// A block's shared memory: its warps' online-softmax states, merged at the end.
template <int D>
struct BlockShared {
  float acc[kWarps][kMaxGroupHeads][D];                    // unnormalised outputs, zero term subtracted
  float m[kWarps][kMaxGroupHeads], l[kWarps][kMaxGroupHeads];  // running max and sum
};

// The dim of byte b (0 .. 3), field f (bits 2f, 2f + 1) of int2 code word w (0 .. 7) of a 128-value row
// (layout.h: byte j of 8-byte unit u holds values 32u + j + 8f).
__device__ __forceinline__ int int2_code_dim(int w, int b, int f) { return 32 * (w / 2) + 4 * (w % 2) + b + 8 * f; }

// One block (row, kv head, z). WIN = false: split z of the quantized region, KQ / VQ: keys / values are int2 rows of
// one 128-value group (else bf16 rows). WIN = true (KQ = VQ = false; z >= n_splits): window block z - n_splits of the
// sink and recent rows of the view (bf16 rows; with Dec, int8 rows decoded as tiles). Both write the partial of slot
// z. HS: head slots per lane, 1 for GQA groups g <= 4, 2 for g <= 8; slot j of lane (gid, tid) is head tid + 4j. D: the
// head dim (int2 rows: 128).
template <bool KQ, bool VQ, bool WIN, int HS, int D, class Dec = void>
__device__ __forceinline__ void attend_block(const CacheGeometry& geo, const AttentionLaunch& a, BlockShared<D>& sh) {
  static_assert(D % 16 == 0, "whole mma k-steps and m-tiles of 16 dims");
  static_assert(!(KQ || VQ) || D == kInt2Dim, "int2 rows of one 128-value group");
  constexpr bool kDecoded = !std::is_void_v<Dec>;
  static_assert(!kDecoded || (!KQ && !VQ && stages_bf16<D>), "decoded tiles are staged tiles (of f16 rows)");
  constexpr bool kWinBf16 = WIN && !kDecoded;  // bf16 window rows: q and P' as bf16 hi + lo pairs
  constexpr int kBf16Row = bf16_row<D>;
  const int row = blockIdx.x, head = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
  const int g = a.n_heads / geo.n_kv;
  const RowDesc rd = a.rows[row];
  const int qe = view_quant_end(geo, rd.seq, rd.pos);
  const int lo = geo.sink + split * a.split_tokens, hi = min(qe, lo + a.split_tokens);
  const int64_t part = (int64_t(row) * geo.n_kv + head) * a.n_slots + split;

  // B fragments of the queries (zero for heads >= g). Column n of the key mma is head n / 2 + 4 (n % 2), so the C
  // fragment's columns 2tid, 2tid + 1 are the lane's slots 0, 1 (heads tid, tid + 4), and the value mma's B columns
  // (P' transposed) the same heads. Scores are kept in base 2: q carries log2(e).
  // bf16 keys: k-step kc takes dims 16kc + {2tid, 2tid+1} (b0) and + 8 (b1). The windows are the cache's exact part:
  // there q and P' also carry their bf16 rounding error as a second bf16 term (hi + lo, 16 significant bits; one more
  // mma each), as close to f32 as the CUDA-core path they replace.
  // int2 keys with one head slot (g <= 4) take u8 x s8 mma (m16n8k32, kI8): A is a code word masked to one field in
  // place (bytes c·4^f), so field f has an mma of its own; column n is head n / 2, its integer q term hi (n even) or
  // lo (n odd): q ≈ step · (hi + lo / 128), hi = round(q / step) with step = max|q| / 127, lo the rounded rest
  // (|lo| <= 64). Its k index 4tid + i (b0) is byte i of code word tid, 16 + 4tid + i (b1) byte i of word tid + 4
  // (int2_code_dim). With two head slots, an m16n8k16 f16 mma per field takes the codes as f16 subnormals c·4^f·2^-24
  // (codes_sub2, one LOP3 per pair) and q·4^-f rounded to f16: k-step kc = 4r + f takes code word tid + 4r of each
  // row, slots 2tid, 2tid + 1, 2tid + 8, 2tid + 9 = its bytes 0, 2, 1, 3. (The u8 path for two slots, one n-tile
  // each, was 18% slower at g = 8 on the H200: 8 mma per tile, and no room in 128 registers for the loop unrolled
  // by 2.)
  constexpr bool kI8 = KQ && HS == 1;
  const float* q = a.q_work + (int64_t(row) * a.n_heads + head * g) * D;
  [[maybe_unused]] uint32_t qb[kI8 ? 1 : D / 16][2], qlo[kWinBf16 ? D / 16 : 1][2];
  [[maybe_unused]] uint32_t qk[4][2];  // kI8: [field][b0, b1]
  // int2 keys: the score of a row (scale s, zero z) is s · (kstep · S − z · ksum[j]) for slot j, S the integer sum of
  // the u8 path (kstep = step · 2^-13), or s · (2^24 S − z · ksum[j]) for the f16 path's sum S; ksum = Σ q
  [[maybe_unused]] float kstep = 0.f, ksum[HS];
  if constexpr (kI8) {
    const int h = gid / 2;
    // q·log2(e) of head h at field f of code byte i of word tid + 4r (read twice: for the range, then the terms)
    auto qv = [&](int f, int r, int i) {
      return h < g ? q[int64_t(h) * D + int2_code_dim(tid + 4 * r, i, f)] * kLog2e : 0.f;
    };
    float amax = 0.f, sum = 0.f;
#pragma unroll
    for (int f = 0; f < 4; ++f)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(qv(f, r, i))), sum += qv(f, r, i);
    // the quad (lanes 4gid .. 4gid + 3) holds all 128 dims of head h
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float step = amax > 0.f ? amax / 127.f : 1.f, inv = 1.f / step;
#pragma unroll
    for (int f = 0; f < 4; ++f)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        uint32_t word = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float x = qv(f, r, i), qh = rintf(x * inv);
          const int term = gid % 2 == 0 ? int(qh) : __float2int_rn((x - qh * step) * (128.f * inv));
          word |= (uint32_t(term) & 0xffu) << (8 * i);
        }
        qk[f][r] = word;
      }
    // this lane's slot is head tid, whose terms quad 2tid holds
    kstep = __shfl_sync(0xffffffffu, step, 8 * tid) * (1.f / 8192.f);
    ksum[0] = __shfl_sync(0xffffffffu, sum, 8 * tid);
  } else {
    const int h = gid / 2 + 4 * (gid % 2);
    float sum = 0.f;  // int2 keys: Σ of this lane's q terms, unscaled (the quad holds all 128 dims of head h)
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
      int d[4];
      if constexpr (KQ) {
        const int w = tid + 4 * (kc / 4), f = kc % 4;
        d[0] = int2_code_dim(w, 0, f), d[1] = int2_code_dim(w, 2, f);
        d[2] = int2_code_dim(w, 1, f), d[3] = int2_code_dim(w, 3, f);
      } else {
        const int base = 16 * kc + 2 * tid;
        d[0] = base, d[1] = base + 1, d[2] = base + 8, d[3] = base + 9;
      }
      const float field = KQ ? 1.f / float(1 << (2 * (kc % 4))) : 1.f;  // exact: a power of two
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      if (h < g)
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = q[int64_t(h) * D + d[i]] * kLog2e * field;
      qb[kc][0] = pack2<KQ || kDecoded>(v[0], v[1]);
      qb[kc][1] = pack2<KQ || kDecoded>(v[2], v[3]);
      if constexpr (KQ)
#pragma unroll
        for (int i = 0; i < 4; ++i) sum += round16<true>(v[i]) / field;
      if constexpr (kWinBf16) {
        qlo[kc][0] = pack2<false>(v[0] - round16<false>(v[0]), v[1] - round16<false>(v[1]));
        qlo[kc][1] = pack2<false>(v[2] - round16<false>(v[2]), v[3] - round16<false>(v[3]));
      }
    }
    if constexpr (KQ) {
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
#pragma unroll
      for (int j = 0; j < HS; ++j) ksum[j] = __shfl_sync(0xffffffffu, sum, 4 * (2 * tid + j));  // head tid + 4j
    }
  }

  // State of slots j < HS, heads tid + 4j (heads >= g are padding and are dropped at the end); l and zsum are this
  // lane's share (its positions), summed over the quad column at the end.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, zsum[2] = {0.f, 0.f};
  // O^T in the C layout: [m-tile][(row gid, slot 0), (gid, slot 1), (gid+8, slot 0), (gid+8, slot 1)]; row r of
  // m-tile mt is dim 16mt + r for bf16 values, int2_value_dim for int2 values. With HS = 1, slot 1 stays zero.
  float acc[D / 16][4];
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;

  // One tile of 16 positions, nvalid >= 1 of them in range: int2 rows from the words w (KQ / VQ), bf16 rows r = 0 .. 15
  // at krow(r) / vrow(r) (const uint16_t*) otherwise. Partial (std::true_type: the last tile of a range, rows >= nvalid
  // masked) or full (std::false_type: nvalid = 16) is a compile-time choice, so full tiles carry no masking code.
  auto attend_tile = [&](auto partial_tag, int nvalid, const TileWords& w, auto krow, auto vrow) {
    constexpr bool partial = decltype(partial_tag)::value;
    [[maybe_unused]] constexpr bool kStaged = std::is_same_v<std::decay_t<decltype(krow)>, StagedTile>;  // the ring
    [[maybe_unused]] const int nv = partial ? nvalid : kTile;  // rows in range

    // ---- scores of positions p0 + gid (s[j]) and p0 + gid + 8 (s[2 + j]) for slots j < HS
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (kI8) {
      // field f of code words tid, tid + 4 of rows ra, rb in place: u8 c·4^f. One mma per field from zero;
      // Σ_f 4^(3-f) acc_f = 64 Σ code·q_term in each column, and the hi and lo columns (c0, c1 / c2, c3) give
      // S = 128 · hi + lo, exact in 32 bits (|S| < 2^29).
      uint32_t af[4][4];
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        const uint32_t mask = 0x03030303u << (2 * f);
        af[f][0] = w.kw[0][0] & mask, af[f][1] = w.kw[1][0] & mask;
        af[f][2] = w.kw[0][1] & mask, af[f][3] = w.kw[1][1] & mask;
      }
      const float sa = params_scale(w.kp[0]), za = params_zero(w.kp[0]);
      const float sb = params_scale(w.kp[1]), zb = params_zero(w.kp[1]);
      int c[4][4];
#pragma unroll
      for (int f = 0; f < 4; ++f) mma_u8s8(c[f], af[f], qk[f]);
      int t[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) t[r] = 4 * (4 * (4 * c[0][r] + c[1][r]) + c[2][r]) + c[3][r];
      s[0] = sa * (kstep * float(128 * t[0] + t[1]) - za * ksum[0]);
      s[2] = sb * (kstep * float(128 * t[2] + t[3]) - zb * ksum[0]);
    } else if constexpr (KQ) {
      // k-step 4r + f: A = field f of code word tid + 4r of rows ra, rb; bytes 0, 2 (slots 2tid, 2tid + 1) and,
      // shifted down by 8, bytes 1, 3 (slots 2tid + 8, 2tid + 9)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t wa = w.kw[0][r], wb = w.kw[1][r];
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          const uint32_t af[4] = {codes_sub2(wa, f), codes_sub2(wb, f), codes_sub2(wa >> 8, f), codes_sub2(wb >> 8, f)};
          mma_f16(s, af, qb[4 * r + f]);
        }
      }
      const float sa = params_scale(w.kp[0]), za = params_zero(w.kp[0]);
      const float sb = params_scale(w.kp[1]), zb = params_zero(w.kp[1]);
#pragma unroll
      for (int j = 0; j < HS; ++j) {
        s[j] = sa * (kTwo24 * s[j] - za * ksum[j]);
        s[2 + j] = sb * (kTwo24 * s[2 + j] - zb * ksum[j]);
      }
    } else if constexpr (kStaged) {
      // bf16 rows from the ring, or a decoded tile's f16 rows (rows past nvalid are zero): matrix j = lane / 8 of the
      // x4 load is rows 8 (j % 2) .. + 7 at dims 16kc + 8 (j / 2) .., the A fragment's a0 .. a3
      const uint8_t* base = krow.k + (lane & 7) * kBf16Row + ((lane >> 3) & 1) * 8 * kBf16Row;
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) {
        uint32_t af[4];
        ldmatrix_x4(af, base + (((2 * kc + (lane >> 4)) ^ (lane & 7)) << 4));
        mma<kDecoded>(s, af, qb[kc]);
      }
    } else {
      // bf16 rows: clamped to the last valid one (window rows past it may not exist)
      const uint16_t *rowa = krow(min(gid, nv - 1)), *rowb = krow(min(gid + 8, nv - 1));
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) {
        const int c = 16 * kc + 2 * tid;
        const uint32_t af[4] = {*reinterpret_cast<const uint32_t*>(rowa + c), *reinterpret_cast<const uint32_t*>(rowb + c),
                                *reinterpret_cast<const uint32_t*>(rowa + c + 8),
                                *reinterpret_cast<const uint32_t*>(rowb + c + 8)};
        mma_bf16(s, af, qb[kc]);
        if constexpr (kWinBf16) mma_bf16(s, af, qlo[kc]);
      }
    }
    if constexpr (partial) {
      if (gid >= nv) s[0] = s[1] = -INFINITY;
      if (gid + 8 >= nv) s[2] = s[3] = -INFINITY;
    }

    // ---- online softmax per head (base 2) against a lazily raised bound m >= every score so far: when a score
    // exceeds m, m moves to kLazyMax above the head's largest score, so p = 2^(s - m) <= 1 and most tiles skip the max
    // reduction and the rescale. The result is the same softmax (any m works in exact arithmetic). Position 0 of a
    // tile is always valid, so the first tile raises m from -inf to a finite value.
    constexpr float kLazyMax = 1.f;  // log2(2)
    bool raise = false;
#pragma unroll
    for (int j = 0; j < HS; ++j) raise = raise || fmaxf(s[j], s[2 + j]) > m[j];
    if (__any_sync(0xffffffffu, raise)) {
#pragma unroll
      for (int j = 0; j < HS; ++j) {
        const float m_new = fmaxf(m[j], col_max(fmaxf(s[j], s[2 + j])) + kLazyMax);
        const float corr = exp2_ftz(m[j] - m_new);
        m[j] = m_new, l[j] *= corr, zsum[j] *= corr;
#pragma unroll
        for (int mt = 0; mt < D / 16; ++mt) acc[mt][j] *= corr, acc[mt][2 + j] *= corr;
      }
    }
    float pw[4] = {0.f, 0.f, 0.f, 0.f};  // with HS = 1, slot 1 (padding) keeps p = 0
#pragma unroll
    for (int j = 0; j < HS; ++j) {
      pw[j] = exp2_ftz(s[j] - m[j]);
      pw[2 + j] = exp2_ftz(s[2 + j] - m[j]);
      l[j] += pw[j] + pw[2 + j];
    }

    // ---- P' = p · scale_v (the B operand of the value mma; p <= 1, so P' <= scale_v stays inside f16), and the
    // zero term.
    uint32_t pb_frag[2];  // positions {2tid, 2tid+1} and {2tid+8, 2tid+9}, head gid / 2 + 4 (gid % 2)
    [[maybe_unused]] uint32_t pb_lo[2] = {};  // windows: the rounding error of pb_frag
    {
      [[maybe_unused]] float wa = 1.f, wb = 1.f, za = 0.f, zb = 0.f;
      if constexpr (VQ) {
        wa = params_scale(w.vp[0]), za = params_zero(w.vp[0]);
        wb = params_scale(w.vp[1]), zb = params_zero(w.vp[1]);
        if constexpr (partial) {  // rows past the range: p = 0, and their unwritten (scale, zero) must not make it NaN
          if (gid >= nv) wa = za = 0.f;
          if (gid + 8 >= nv) wb = zb = 0.f;
        }
      }
      // P' of (gid, slot 0), (gid, slot 1), (gid + 8, slot 0), (gid + 8, slot 1). The mma takes it rounded to f16;
      // the zero term takes it unrounded (the difference, 2^-12 of P' · zero, is below the f16 rounding of P' that
      // the code term already carries). bf16 rows: rounded here, as the windows' lo term is the rest (decoded tiles:
      // to f16).
      float x[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < HS; ++j) {
        if constexpr (VQ) {
          x[j] = pw[j] * wa, x[2 + j] = pw[2 + j] * wb;
          zsum[j] += x[j] * za + x[2 + j] * zb;
        } else {
          x[j] = round16<kDecoded>(pw[j]), x[2 + j] = round16<kDecoded>(pw[2 + j]);
        }
      }
      // the C fragment's rows 0-7 and 8-15 ([position][head]) transposed into the B fragment ([head][position])
      pb_frag[0] = transpose8x8(pack2<VQ || kDecoded>(x[0], x[1]));
      pb_frag[1] = transpose8x8(pack2<VQ || kDecoded>(x[2], x[3]));
      if constexpr (kWinBf16) {  // wa = wb = 1
        pb_lo[0] = transpose8x8(pack2<false>(pw[0] - x[0], pw[1] - x[1]));
        pb_lo[1] = transpose8x8(pack2<false>(pw[2] - x[2], pw[3] - x[3]));
      }
    }

    // ---- values: O^T[d][h] += Σ_pos V^T[d][pos] P'[pos][h]
    if constexpr (VQ) {
      // x01[b] / x89[b]: byte b of code word gid of rows r0 / r8 in byte 0 and of r1 / r9 in byte 2 (positions 2tid,
      // 2tid + 1 / 2tid + 8, 2tid + 9 side by side); m-tile 2k + h: A rows gid / gid + 8 = field k of bytes 2h / 2h + 1
      uint32_t x01[4], x89[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        x01[b] = __byte_perm(w.vw[0], w.vw[1], 0x0400u + 0x0101u * b);
        x89[b] = __byte_perm(w.vw[2], w.vw[3], 0x0400u + 0x0101u * b);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t af[4] = {codes_sub2(x01[2 * h], k), codes_sub2(x01[2 * h + 1], k),
                                  codes_sub2(x89[2 * h], k), codes_sub2(x89[2 * h + 1], k)};
          mma_f16(acc[2 * k + h], af, pb_frag);
        }
    } else if constexpr (kStaged) {
      // V^T fragments by transposing loads: matrix j = lane / 8 is positions 8 (j / 2) .. + 7 at dims
      // 16mt + 8 (j % 2) .. of the stored rows, i.e. a0 .. a3 of the m-tile's dims x the tile's positions
      const uint8_t* base = vrow.v + (lane & 7) * kBf16Row + (lane >> 4) * 8 * kBf16Row;
#pragma unroll
      for (int mt = 0; mt < D / 16; ++mt) {
        uint32_t af[4];
        ldmatrix_x4_trans(af, base + (((2 * mt + ((lane >> 3) & 1)) ^ (lane & 7)) << 4));
        mma<kDecoded>(acc[mt], af, pb_frag);
      }
    } else {
      const int r0 = min(2 * tid, nv - 1), r1 = min(2 * tid + 1, nv - 1);
      const int r8 = min(2 * tid + 8, nv - 1), r9 = min(2 * tid + 9, nv - 1);
      const uint16_t *v0 = vrow(r0) + gid, *v1 = vrow(r1) + gid, *v8 = vrow(r8) + gid, *v9 = vrow(r9) + gid;
#pragma unroll
      for (int mt = 0; mt < D / 16; ++mt) {
        const int c = 16 * mt;
        const uint32_t af[4] = {uint32_t(v0[c]) | uint32_t(v1[c]) << 16, uint32_t(v0[c + 8]) | uint32_t(v1[c + 8]) << 16,
                                uint32_t(v8[c]) | uint32_t(v9[c]) << 16, uint32_t(v8[c + 8]) | uint32_t(v9[c + 8]) << 16};
        mma_bf16(acc[mt], af, pb_frag);
        if constexpr (kWinBf16) mma_bf16(acc[mt], af, pb_lo);
      }
    }
  };

  // The split blocks' tiles: kStride positions apart per warp, located through the sequence's page table from page
  // 0's (layer, head) part.
  constexpr int kStride = kWarps * kTile;
  [[maybe_unused]] const int pt = geo.page_tokens;
  [[maybe_unused]] const int* table = geo.page_table + int64_t(rd.seq) * geo.pages_per_seq;
  [[maybe_unused]] const uint8_t* heads = geo.pool + geo.layer_offset + int64_t(head) * geo.head_bytes;
  if constexpr (WIN) {
    // The windows' positions in order, the sink [0, ns) then the recent window [rb, t], numbered i = 0 .. n - 1;
    // window block w = z - n_splits of n_win takes tiles of 16 of them, one per warp, n_win x 64 apart.
    const int ns = min(rd.pos + 1, geo.sink), rb = max(qe, geo.sink), n = ns + max(0, rd.pos + 1 - rb);
    for (int i0 = ((split - a.n_splits) * kWarps + warp) * kTile; i0 < n; i0 += a.n_win * kWarps * kTile) {
      auto row_at = [&](int kv, int r) -> const uint8_t* {  // K / V row r of the tile
        const int i = i0 + r;
        return i < ns ? dev::sink_row(geo, rd.seq, a.layer, kv, head, i)
                      : dev::ring_row(geo, rd.seq, a.layer, kv, head, rb + i - ns);
      };
      const int nv = min(kTile, n - i0);
      if constexpr (kDecoded) {
        // int8 rows: decoded into the warp's stage, then computed as a staged tile of f16 rows (as the splits' tiles)
        extern __shared__ __align__(16) uint8_t ring_smem[];
        uint8_t* stage = ring_smem + warp * stage_bytes<D>;
        __syncwarp();  // every lane has read the previous tile from the stage
        decode_window_tile<typename Dec::Windows, D>(geo, row_at, nv, stage, lane);
        __syncwarp();  // the tile is visible to the warp
        const StagedTile t{stage, stage + tile_side<D>};
        if (nv == kTile) attend_tile(std::false_type{}, kTile, TileWords{}, t, t);
        else attend_tile(std::true_type{}, nv, TileWords{}, t, t);
      } else {
        auto rows = [&](int kv) {
          return [&, kv](int r) { return reinterpret_cast<const uint16_t*>(row_at(kv, r)); };
        };
        if (nv == kTile) attend_tile(std::false_type{}, kTile, TileWords{}, rows(0), rows(1));
        else attend_tile(std::true_type{}, nv, TileWords{}, rows(0), rows(1));
      }
    }
  } else if constexpr (kDecoded) {
    // Decoded tiles: the stored bytes of the warp's tiles come through its raw ring (cp.async, kRawStages - 1 tiles
    // ahead: every iteration commits one group, empty past the range); the warp decodes each tile from there into its
    // one stage (decode_tile), then computes it as a staged tile of f16 rows.
    using K = typename Dec::Keys;
    extern __shared__ __align__(16) uint8_t ring_smem[];
    uint8_t* stage = ring_smem + warp * stage_bytes<D>;
    const int raw = raw_stage_bytes<K>(geo), kraw = raw - kTile * geo.v_row;
    const void* ktable = nullptr;  // the head's table of a key codec that reads one (dev::key_table)
    if constexpr (dev::ReadsTable<K>) ktable = dev::key_table<K>(geo, head);
    uint8_t* raws = ring_smem + kWarps * stage_bytes<D> + warp * kRawStages * raw;
    auto page_of = [&](int p) { return heads + int64_t(table[(p - geo.sink) / pt]) * geo.page_bytes; };
    auto fetch = [&](int p, int s) {  // tile p's key side and value rows into raw stage s
      if (p < hi) {
        const int j0 = (p - geo.sink) % pt;
        const uint8_t* hp = page_of(p);
        const uint8_t *kb = hp + j0 * geo.k_row, *vb = hp + geo.k_region + j0 * geo.v_row;
        uint8_t* dst = raws + s * raw;
        int off = 16 * lane;
        if constexpr (K::kKeyBlocks) {  // the tile's copy of its block, then the value rows
          K::fetch_tile(hp + (j0 / geo.k_block_tokens) * geo.k_block, j0 % geo.k_block_tokens, dst, lane);
          off += kraw;
        }
        for (; off < raw; off += 16 * 32) cp_async_16(dst + off, off < kraw ? kb + off : vb + (off - kraw), true);
      }
      cp_async_commit();
    };
    const int first = lo + warp * kTile;
#pragma unroll
    for (int i = 0; i < kRawStages - 1; ++i) fetch(first + i * kStride, i);
    int s = 0;
    for (int p0 = first; p0 < hi; p0 += kStride) {
      // every lane has decoded the previous tile from the raw stage that this copy overwrites (the __syncwarp after
      // decode_tile), and read the previous decoded stage (the one below)
      fetch(p0 + (kRawStages - 1) * kStride, s == 0 ? kRawStages - 1 : s - 1);
      const int j0 = (p0 - geo.sink) % pt, nv = min(kTile, hi - p0);
      [[maybe_unused]] const float* nu = nullptr;
      if constexpr (dev::token_scaled<K>()) nu = dev::token_scales(geo, rd.seq, a.layer, p0);
      const int krow0 = K::kKeyBlocks ? j0 % geo.k_block_tokens : 0;  // the tile's first row in its key block
      cp_async_wait<kRawStages - 1>();
      __syncwarp();  // tile p0's bytes are visible to the warp, and every lane has read the previous tile
      decode_tile<K, typename Dec::Values, D>(geo, ktable, raws + s * raw, krow0, raws + s * raw + kraw, nv, p0, nu,
                                              stage, lane);
      __syncwarp();  // the tile is visible to the warp
      const StagedTile t{stage, stage + tile_side<D>};
      if (nv == kTile) attend_tile(std::false_type{}, kTile, TileWords{}, t, t);
      else attend_tile(std::true_type{}, nv, TileWords{}, t, t);
      s = s + 1 == kRawStages ? 0 : s + 1;
    }
    cp_async_wait<0>();  // only empty groups are left; nothing lands after the rings are reused (sh)
  } else if constexpr (!KQ && !VQ && stages_bf16<D>) {
    // bf16 rows through the warp's ring: tiles t + 1 .. t + kStages - 1 are being copied while tile t is computed.
    // Every iteration commits one group (empty past the range), so waiting for all but the kStages - 1 newest
    // groups waits for tile t.
    constexpr int kTileSide = tile_side<D>, kStageBytes = stage_bytes<D>;
    constexpr int kChunks = kBf16Row / 16, kRowsPer = 32 / kChunks;  // 16-byte chunks a row; rows a warp copies
    extern __shared__ __align__(16) uint8_t ring_smem[];
    uint8_t* ring = ring_smem + warp * warp_ring<D>;
    auto stage_tile = [&](int p, int stage) {
      if (p < hi) {
        const int nv = min(kTile, hi - p), rel = p - geo.sink;
        const uint8_t* kb = heads + int64_t(table[rel / pt]) * geo.page_bytes + (rel % pt) * kBf16Row;
        const uint8_t* vb = kb + geo.k_region;
        uint8_t* dst = ring + stage * kStageBytes;
#pragma unroll
        // lane: chunk lane % kChunks of row kRowsPer i + lane / kChunks
        for (int i = 0; i < kTileSide / 16 / 32; ++i) {
          const int r = kRowsPer * i + lane / kChunks, c = lane % kChunks;
          cp_async_16(dst + swizzled<D>(r, c), kb + r * kBf16Row + 16 * c, r < nv);  // rows past the range: zeros
          cp_async_16(dst + kTileSide + swizzled<D>(r, c), vb + r * kBf16Row + 16 * c, r < nv);
        }
      }
      cp_async_commit();
    };
    const int first = lo + warp * kTile;
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) stage_tile(first + i * kStride, i);
    int stage = 0;
    for (int p0 = first; p0 < hi; p0 += kStride) {
      __syncwarp();  // every lane has read the stage that the next copy overwrites (tile t - 1's)
      stage_tile(p0 + (kStages - 1) * kStride, stage == 0 ? kStages - 1 : stage - 1);
      cp_async_wait<kStages - 1>();
      __syncwarp();  // every lane's copies of tile t are visible to the warp
      const StagedTile t{ring + stage * kStageBytes, ring + stage * kStageBytes + kTileSide};
      if (hi - p0 >= kTile) attend_tile(std::false_type{}, kTile, TileWords{}, t, t);
      else attend_tile(std::true_type{}, hi - p0, TileWords{}, t, t);
      stage = stage + 1 == kStages ? 0 : stage + 1;
    }
    cp_async_wait<0>();  // only empty groups are left; nothing lands after the block has gone
  } else {
    // Software pipeline: an iteration first issues the loads of the warp's next tile (and the page-table read of the
    // tile after it), then computes the current tile from the words loaded one iteration earlier. The last iteration
    // reloads its own tile (in bounds) instead of branching. Tiles are located without a division per tile: (qi, qj) =
    // page-table column and page row of the tile two ahead, advanced by kStride = si pages + sj rows (sj < P).
    const int si = kStride / pt, sj = kStride % pt;
    auto kbase = [&](TileAt at) { return heads + int64_t(at.page) * geo.page_bytes + at.row * row_bytes<KQ, D>; };
    auto vbase = [&](TileAt at) {
      return heads + int64_t(at.page) * geo.page_bytes + geo.k_region + at.row * row_bytes<VQ, D>;
    };
    const LaneOffsets lanes(gid, tid);
    auto advance = [&](int& qi, int& qj) {
      qi += si, qj += sj;
      if (qj >= pt) qj -= pt, ++qi;
    };
    int p0 = lo + warp * kTile;
    int qi = (p0 - geo.sink) / pt, qj = (p0 - geo.sink) % pt;  // tile p0 for now
    TileAt at0{}, at1{};  // tile p0 and the next tile (tile p0 again when there is none)
    TileWords cur{};
    if (p0 < hi) {
      at0 = {table[qi], qj};
      cur = load_tile<KQ, VQ>(kbase(at0), vbase(at0), lanes);
      advance(qi, qj);
      at1 = p0 + kStride < hi ? TileAt{table[qi], qj} : at0;
      advance(qi, qj);
    }
    // Unrolled by 2 for int2 values (the copies of cur / at0 / at1 become register renaming); the other instances
    // would exceed 128 registers (nvcc 13: 132 and 136) and lose a block per SM (__launch_bounds__ asks for 4).
    constexpr int kUnroll = VQ ? 2 : 1;
#pragma unroll kUnroll
    for (; p0 < hi; p0 += kStride) {
      const TileWords nxt = load_tile<KQ, VQ>(kbase(at1), vbase(at1), lanes);
      const TileAt at2 = p0 + 2 * kStride < hi ? TileAt{table[qi], qj} : at1;  // the tile after it
      advance(qi, qj);

      const uint8_t *kb = kbase(at0), *vb = vbase(at0);
      auto krow = [&](int r) { return reinterpret_cast<const uint16_t*>(kb + r * kBf16Row); };
      auto vrow = [&](int r) { return reinterpret_cast<const uint16_t*>(vb + r * kBf16Row); };
      if (hi - p0 >= kTile) attend_tile(std::false_type{}, kTile, cur, krow, vrow);
      else attend_tile(std::true_type{}, hi - p0, cur, krow, vrow);
      cur = nxt, at0 = at1, at1 = at2;
    }
  }

  // ---- this warp's state to shared memory (zero term subtracted), then the block's merge into the split's slot
  if constexpr (kDecoded) __syncthreads();  // sh overlays the warps' rings (quant_attention_mma_kernel): all done
#pragma unroll
  for (int j = 0; j < HS; ++j) zsum[j] = col_sum(zsum[j]), l[j] = col_sum(l[j]);
#pragma unroll
  for (int j = 0; j < HS; ++j) {
    const int h = tid + 4 * j;
    if (h >= g) continue;
    if (gid == 0) sh.m[warp][h] = m[j] * kLn2, sh.l[warp][h] = l[j];  // m in base e for the merge
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      const int d0 = VQ ? int2_value_dim(mt, gid) : 16 * mt + gid, d1 = VQ ? d0 + 1 : d0 + 8;  // rows gid, gid + 8
      const float field = VQ ? kTwo24 / float(1 << (2 * (mt / 2))) : 1.f;  // m-tile mt = 2k + h holds field k
      sh.acc[warp][h][d0] = acc[mt][j] * field - zsum[j];
      sh.acc[warp][h][d1] = acc[mt][2 + j] * field - zsum[j];
    }
  }
  if constexpr (kDecoded) {
    using V = typename Dec::Values;
    if constexpr (dev::hadamard_rows<V>()) {  // NexusQuant's values were summed as ŷ: the warp's g rows through H once
      __syncwarp();
      for (int h = 0; h < g; ++h) {
        float* out = sh.acc[warp][h] + V::template lane_channel<32>(lane, 0);  // 4 channels a lane
        float v[4] = {out[0], out[1], out[2], out[3]};
        V::template finish_lanes<32>(v, lane);
#pragma unroll
        for (int e = 0; e < 4; ++e) out[e] = v[e];
      }
    }
  }
  __syncthreads();
  dev::write_block_partial<kWarps, D>(sh.m, sh.l, sh.acc, g, part, a);
}

// Blocks per SM the kernel's registers are bounded for: 4 (128 registers) up to d = 128; 2 at d = 256, whose bf16
// windows hold 2 x 32 query and 64 output registers.
template <int D>
constexpr int min_blocks = D <= 128 ? 4 : 2;

// Grid (row, kv head, n_splits + n_win): blocks z < n_splits take the splits of the quantized region, blocks
// z >= n_splits the windows, so one launch covers the whole view. HS: head slots per lane (1: g <= 4, 2: g <= 8).
// Dec: the codecs of a decoded-tile row (KQ = VQ = false), void for the others.
// Decoded-tile instances keep the block's shared state in their dynamic shared memory, over the warps' stages and raw
// rings, which are done with by the time it is written (attend_block): 16 KB less a block, so that the rings fit
// beside four blocks an SM.
template <bool KQ, bool VQ, int HS, int D, class Dec = void>
__global__ void __launch_bounds__(kWarps * 32, min_blocks<D>) quant_attention_mma_kernel(CacheGeometry geo,
                                                                                         AttentionLaunch a) {
  auto run = [&](BlockShared<D>& sh) {
    if (blockIdx.z >= unsigned(a.n_splits))
      attend_block<false, false, true, HS, D, typename WindowTilesOf<Dec, D>::type>(geo, a, sh);
    else attend_block<KQ, VQ, false, HS, D, Dec>(geo, a, sh);
    if (a.arrivals) dev::merge_if_last<kWarps, D>(a, geo.n_kv, blockIdx.x, blockIdx.y, &sh.acc[0][0][0]);
  };
  if constexpr (std::is_void_v<Dec>) {
    __shared__ BlockShared<D> sh;
    run(sh);
  } else {
    static_assert(sizeof(BlockShared<D>) <= kWarps * stage_bytes<D>, "the block's state fits over the stages");
    extern __shared__ __align__(16) uint8_t ring_smem[];
    run(*reinterpret_cast<BlockShared<D>*>(ring_smem));
  }
}

// The ring stages of the code this GPU loaded (g_ring_stages), read once (not inside a stream capture: GpuKvCache's
// constructor asks first, through attention_mma_supported); the host pass's kStages where no device answers.
int loaded_stages() {
  static const int stages = [] {
    int s = kStages;
    if (cudaMemcpyFromSymbol(&s, g_ring_stages, sizeof(s)) != cudaSuccess) {
      cudaGetLastError();  // no device: the launches report it
      s = kStages;
    }
    return s;
  }();
  return stages;
}

}  // namespace

bool attention_mma_supported(const CacheGeometry& g) {
  loaded_stages();
  return g.instance >= 0 && g.instance < kGpuInstanceCount && kGpuInstances[g.instance].path != GpuPath::kCudaCore;
}

namespace {
// The kernel instance of the cache's tensor-core or decoded-tile instance row, head dim and GQA group g: KQ / VQ =
// keys / values are int2 rows of one 128-value group, else bf16 rows (or decoded tiles), HS = 1 head slot per lane
// for g <= 4, else 2 (fn null for a CUDA-core row or no row), and its dynamic shared memory.
struct MmaKernel {
  void (*fn)(CacheGeometry, AttentionLaunch) = nullptr;
  int smem = 0;  // bytes: the warps' rings of staged bf16 tiles (bf16 / bf16), else 0
};
MmaKernel mma_kernel(const CacheGeometry& g, int group) {
  MmaKernel k;
  with_instance(g.instance, g.head_dim, [&](auto row, auto dim) {
    constexpr GpuInstance r = kGpuInstances[decltype(row)::value];
    constexpr int D = decltype(dim)::value;
    if constexpr (r.path == GpuPath::kTensorCore) {
      constexpr auto takes = [](CodecId id) { return id == CodecId::kInt2 || id == CodecId::kBf16; };
      static_assert(takes(r.k) && takes(r.v), "the tensor-core kernel takes int2 and bf16 rows");
      static_assert((r.k != CodecId::kInt2 && r.v != CodecId::kInt2) || (r.groups == kG128 && D == kInt2Dim),
                    "the tensor-core kernel takes int2 rows of one 128-value group");
      static_assert(r.page_multiple % kTile == 0, "tensor-core tiles never cross a page");
      constexpr bool kq = r.k == CodecId::kInt2, vq = r.v == CodecId::kInt2;
      k = {group <= 4 ? quant_attention_mma_kernel<kq, vq, 1, D> : quant_attention_mma_kernel<kq, vq, 2, D>,
           ring_bytes<kq, vq, D>(loaded_stages())};
    } else if constexpr (r.path == GpuPath::kDecodedTile) {
      static_assert(stages_bf16<D>, "decoded tiles are staged bf16 tiles: d a multiple of 64 up to 128");
      static_assert(r.page_multiple % kTile == 0, "tensor-core tiles never cross a page");
      constexpr int I = decltype(row)::value;
      using Dec = Decoded<RowKeys<I, D>, RowValues<I, D>, RowWindows<I, D>>;
      k = {group <= 4 ? quant_attention_mma_kernel<false, false, 1, D, Dec>
                      : quant_attention_mma_kernel<false, false, 2, D, Dec>,
           kWarps * (stage_bytes<D> + kRawStages * raw_stage_bytes<RowKeys<I, D>>(g))};
    }
  });
  return k;
}

// Raises the instance's dynamic shared memory limit past the 48 KB default where it needs more (cheap; every launch
// does it, as the prefill kernel's).
int allow_smem(const MmaKernel& k) {
  return k.smem > 0 ? cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem) : cudaSuccess;
}
}  // namespace

int launch_attention_mma(const CacheGeometry& g, const AttentionLaunch& a, void* stream) {
  const MmaKernel kernel = mma_kernel(g, a.n_heads / g.n_kv);
  if (!kernel.fn) return cudaErrorInvalidValue;  // not a tensor-core row
  if (const int e = allow_smem(kernel); e != cudaSuccess) return e;
  const dim3 grid(unsigned(a.n_rows), unsigned(g.n_kv), unsigned(a.n_splits + a.n_win));  // + the windows' blocks
  kernel.fn<<<grid, kWarps * 32, size_t(kernel.smem), static_cast<cudaStream_t>(stream)>>>(g, a);
  return cudaGetLastError();
}

int attention_mma_blocks_per_sm(const CacheGeometry& g, int n_heads, int* blocks) {
  const MmaKernel kernel = mma_kernel(g, n_heads / g.n_kv);
  if (!kernel.fn) return cudaErrorInvalidValue;
  if (const int e = allow_smem(kernel); e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel.fn, kWarps * 32, size_t(kernel.smem));
}

}  // namespace kvq::cuda
