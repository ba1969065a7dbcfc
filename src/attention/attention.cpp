#include "attention/attention.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "simd/simd.h"

namespace kvq {

namespace {

constexpr int kTileRows = 64;     // query rows (queries × GQA group) per work item
constexpr int kPieceTokens = 128; // cached rows scored at once

// A piece of one run: rows [pos0, pos0 + n) read through one codec pair (the run's).
struct Piece {
  KvCache::RunKind kind;
  int pos0, n;
  const uint8_t* k;
  const uint8_t* v;
  const float* scale;  // token-scaled keys: ν of each row, multiplied onto its scores; else null
  const KvCodec* kc;
  const KvCodec* vc;
  const int* pos;  // Exact pieces after an eviction: the position of each row; else null (row i at pos0 + i)
};

void cut_pieces(const KvCache& cache, const std::vector<KvCache::Run>& runs, std::vector<Piece>& out) {
  out.clear();
  for (const auto& run : runs) {
    const bool quant = run.kind == KvCache::RunKind::Quant;
    const KvCodec &kc = *run.k_codec, &vc = *run.v_codec;
    // Quantized pieces must start on codec blocks; kPieceTokens is a multiple of every supported block.
    const int step = quant ? std::max(kPieceTokens, cache.codec_block_tokens()) : kPieceTokens;
    for (int off = 0; off < run.n; off += step) {
      const int n = std::min(step, run.n - off);
      out.push_back({run.kind, run.pos0 + off, n,
                     run.k + size_t(off / kc.tokens_per_block()) * kc.bytes_per_block(),
                     run.v + size_t(off / vc.tokens_per_block()) * vc.bytes_per_block(),
                     run.scale ? run.scale + off : nullptr, &kc, &vc, run.positions ? run.positions + off : nullptr});
    }
  }
}

// Positions [lo, hi) of a piece of this kind that the query at position t reads (decode-faithful view).
inline void valid_range(const KvCache& cache, KvCache::RunKind kind, int t, int& lo, int& hi) {
  if (kind == KvCache::RunKind::Sink) {
    lo = 0, hi = t + 1;
  } else if (kind == KvCache::RunKind::Quant) {
    lo = cache.config().sink, hi = cache.quant_end(t);
  } else {
    lo = cache.quant_end(t), hi = t + 1;
  }
}

// Rows [lo, hi) of a piece, relative to its first row, that the query at position t reads: its kind's view, and for
// the exact store every row at a position <= t; with a sliding window (window > 0) only positions > t - window.
inline void piece_rows(const KvCache& cache, const Piece& pc, int t, int window, int& lo, int& hi) {
  if (pc.kind == KvCache::RunKind::Exact) {
    lo = 0;
    hi = pc.pos ? int(std::upper_bound(pc.pos, pc.pos + pc.n, t) - pc.pos) : std::clamp(t + 1 - pc.pos0, 0, pc.n);
  } else {
    valid_range(cache, pc.kind, t, lo, hi);
    lo = std::clamp(lo - pc.pos0, 0, pc.n);
    hi = std::clamp(hi - pc.pos0, lo, pc.n);
  }
  if (window > 0) {
    const int first = t - window + 1;  // the oldest position the query reads
    const int skip = pc.pos ? int(std::lower_bound(pc.pos, pc.pos + pc.n, first) - pc.pos) : first - pc.pos0;
    lo = std::clamp(skip, lo, hi);
  }
}

// Asks for the first bytes of the next piece's K and V blocks (into L2) while the current one is computed: the rows
// stream from DRAM, and a piece starts a new page region the hardware prefetchers have not seen yet; the kernels'
// own prefetch (kPrefetchRows ahead) takes over from there. A whole piece is a whole int2 piece (4.6 KB a side) but
// 32 KB a side of bf16 rows, whose prefetches stall on the fill buffers: capped at 8 KB a side, bf16 attention at 32K
// (2 threads) went from 10.7-11.3 to 9.7-10.0 ms a step at AVX2 and from 9.8-10.1 to 9.1-9.3 at AVX-512 VNNI, int2
// unchanged (docs/results/cpu.md).
constexpr size_t kPiecePrefetchBytes = 8192;
inline void prefetch_piece(const Piece& pc) {
  const KvCodec &kc = *pc.kc, &vc = *pc.vc;
  const size_t kb = std::min(kPiecePrefetchBytes, size_t(pc.n) / kc.tokens_per_block() * kc.bytes_per_block());
  const size_t vb = std::min(kPiecePrefetchBytes, size_t(pc.n) / vc.tokens_per_block() * vc.bytes_per_block());
  for (size_t b = 0; b < kb; b += 64) __builtin_prefetch(pc.k + b, 0, 2);
  for (size_t b = 0; b < vb; b += 64) __builtin_prefetch(pc.v + b, 0, 2);
}

// One job's share of the loop: (query tile, kv head) pairs × KV splits, items numbered from first.
struct JobItems {
  int base_items, splits;
  int64_t first;
  int64_t items() const { return int64_t(base_items) * splits; }
};

// Attend rows of one tile over some pieces; state accumulates (online softmax).
void attend_pieces(const KvCache& cache, const Piece* pieces, int n_pieces, const float* q_rows, int rows,
                   int group, int t_first, int window, SoftmaxState& st, std::vector<float>& s) {
  const SoftmaxKernels sk = softmax_kernels(cache.config().simd);
  const int d = cache.head_dim();
  s.resize(size_t(rows) * kPieceTokens * 2);
  for (int pi = 0; pi < n_pieces; ++pi) {
    const Piece& pc = pieces[pi];
    const KvCodec &kc = *pc.kc, &vc = *pc.vc;
    // Skip pieces no row of the tile reads (e.g. recent rows past every query's window).
    bool any = false;
    for (int r = 0; r < rows && !any; r += group) {
      int lo, hi;
      piece_rows(cache, pc, t_first + r / group, window, lo, hi);
      any = lo < hi;
    }
    if (!any) continue;
    if (pi + 1 < n_pieces) prefetch_piece(pieces[pi + 1]);
    const int n = pc.n;
    kc.scores_at(q_rows, rows, pc.k, pc.pos0, n, s.data());
    if (pc.scale)  // token-scaled keys (METHODS §5.4): ν_t · q·k̂_t
      for (int r = 0; r < rows; ++r)
        for (int t = 0; t < n; ++t) s[size_t(r) * n + t] *= pc.scale[t];
    for (int r = 0; r < rows; ++r) {
      int lo, hi;
      piece_rows(cache, pc, t_first + r / group, window, lo, hi);
      float* sr = s.data() + size_t(r) * n;
      const float mx = hi > lo ? sk.max(sr + lo, hi - lo) : -INFINITY;
      if (!(mx > -INFINITY)) {
        std::fill(sr, sr + n, 0.f);
        continue;
      }
      const float m_new = std::max(st.m[size_t(r)], mx);
      const float corr = std::exp(st.m[size_t(r)] - m_new);  // exp(-inf) = 0 on the first piece
      std::fill(sr, sr + lo, 0.f);
      const float sum = sk.exp_sum(sr + lo, hi - lo, m_new);
      std::fill(sr + hi, sr + n, 0.f);
      st.l[size_t(r)] = st.l[size_t(r)] * corr + sum;
      st.m[size_t(r)] = m_new;
      if (corr != 1.f) {
        float* a = st.acc.data() + size_t(r) * d;
        for (int c = 0; c < d; ++c) a[c] *= corr;
      }
    }
    vc.accumulate(s.data(), rows, pc.v, n, st.acc.data());
  }
}

}  // namespace

void SoftmaxState::reset(int rows, int d) {
  m.assign(size_t(rows), -INFINITY);
  l.assign(size_t(rows), 0.f);
  acc.assign(size_t(rows) * d, 0.f);
}

void SoftmaxState::merge(const SoftmaxState& o, int d) {
  for (size_t r = 0; r < m.size(); ++r) {
    if (!(o.m[r] > -INFINITY)) continue;
    const float mx = std::max(m[r], o.m[r]);
    const float a = std::exp(m[r] - mx), b = std::exp(o.m[r] - mx);
    l[r] = l[r] * a + o.l[r] * b;
    m[r] = mx;
    for (int c = 0; c < d; ++c) acc[r * d + c] = acc[r * d + c] * a + o.acc[r * d + c] * b;
  }
}

void cache_attention(const KvCache& cache, std::span<const AttentionJob> jobs, int layer, const AttentionShape& shape,
                     ThreadPool& pool) {
  const int d = shape.head_dim, n_kv = shape.n_kv_heads, hq = shape.n_heads;
  KVQ_CHECK(d == cache.head_dim() && n_kv == cache.n_kv_heads() && hq % n_kv == 0,
            "attention: shape (heads {}, kv heads {}, d {}) does not match the cache (kv heads {}, d {})", hq, n_kv,
            d, cache.n_kv_heads(), cache.head_dim());
  const int g = hq / n_kv;
  const int tile_q = std::max(1, kTileRows / g);  // queries per tile
  // Enough items a job that the threads stay balanced when other processes share the cores (decode: 8 kv heads on 2
  // threads -> 2 KV splits per head); each split costs one partial state and one merge. Decided per job, never from
  // the batch, so that a sequence's bits do not depend on what runs beside it.
  const int want = 8 * pool.size();
  std::vector<JobItems> plan(jobs.size());
  int64_t total = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int n_tiles = (jobs[j].n + tile_q - 1) / tile_q;
    const int base_items = n_tiles * n_kv;
    const int splits =
        pool.size() == 1 || base_items == 0 || base_items >= want ? 1 : (want + base_items - 1) / base_items;
    plan[j] = {base_items, splits, total};
    total += plan[j].items();
  }

  // One state per item, their buffers kept between calls; the caller's thread's (a lambda names a thread_local as
  // the running thread's own, hence the reference).
  thread_local std::vector<SoftmaxState> callers_states;
  std::vector<SoftmaxState>& states = callers_states;
  if (states.size() < size_t(total)) states.resize(size_t(total));
  pool.parallel_for(total, [&](int64_t item, int) {
    const size_t j = size_t(std::upper_bound(plan.begin(), plan.end(), item,
                                             [](int64_t i, const JobItems& p) { return i < p.first; }) -
                            plan.begin()) - 1;
    const AttentionJob& job = jobs[j];
    const int splits = plan[j].splits;
    const int64_t local = item - plan[j].first;
    const int split = int(local % splits);
    const int tile = int(local / splits / n_kv), h = int(local / splits % n_kv);
    const int i0 = tile * tile_q, nq = std::min(tile_q, job.n - i0);
    const int rows = nq * g, t_first = job.pos0 + i0, t_last = t_first + nq - 1;
    thread_local std::vector<KvCache::Run> runs;
    thread_local std::vector<Piece> pieces;
    thread_local std::vector<float> q_rows, scratch;
    cache.runs(job.seq, layer, h, t_first, t_last, runs);
    cut_pieces(cache, runs, pieces);
    q_rows.resize(size_t(rows) * d);
    for (int i = 0; i < nq; ++i)
      for (int jj = 0; jj < g; ++jj)
        std::copy_n(job.q + (size_t(i0 + i) * hq + h * g + jj) * d, d, q_rows.data() + (size_t(i) * g + jj) * d);
    const int np = int(pieces.size());
    const int p_begin = int(int64_t(np) * split / splits), p_end = int(int64_t(np) * (split + 1) / splits);
    SoftmaxState& st = states[size_t(item)];
    st.reset(rows, d);
    attend_pieces(cache, pieces.data() + p_begin, p_end - p_begin, q_rows.data(), rows, g, t_first,
                  cache.config().attn_window_of(layer), st, scratch);
  });

  for (size_t j = 0; j < jobs.size(); ++j) {
    const AttentionJob& job = jobs[j];
    const int splits = plan[j].splits;
    for (int base = 0; base < plan[j].base_items; ++base) {
      const size_t first = size_t(plan[j].first + int64_t(base) * splits);  // the pair's splits: first, first + 1, ..
      SoftmaxState& st = states[first];
      for (int sp = 1; sp < splits; ++sp) st.merge(states[first + size_t(sp)], d);
      const int tile = base / n_kv, h = base % n_kv;
      const int i0 = tile * tile_q, nq = std::min(tile_q, job.n - i0);
      for (int i = 0; i < nq; ++i)
        for (int jj = 0; jj < g; ++jj) {
          const size_t r = size_t(i) * g + jj;
          const float inv = 1.f / st.l[r];
          float* o = job.out + (size_t(i0 + i) * hq + h * g + jj) * d;
          for (int c = 0; c < d; ++c) o[c] = st.acc[r * d + c] * inv;
        }
    }
  }
}

void cache_attention(const KvCache& cache, int seq, int layer, int pos0, int n, const float* q, float* out,
                     const AttentionShape& shape, ThreadPool& pool) {
  const AttentionJob job{seq, pos0, n, q, out};
  cache_attention(cache, std::span<const AttentionJob>(&job, 1), layer, shape, pool);
}

void append_and_attend(KvCache& cache, std::span<const AppendJob> jobs, int layer, const AttentionShape& shape,
                       ThreadPool& pool) {
  const CacheLayout& layout = cache.layout();
  const size_t kv_row = size_t(shape.n_kv_heads) * shape.head_dim, q_row = size_t(shape.n_heads) * shape.head_dim;
  int rounds = 0;
  for (const AppendJob& j : jobs) rounds = std::max(rounds, layout.rounds(j.n));
  std::vector<AttentionJob> round;
  for (int r = 0; r < rounds; ++r) {
    round.clear();
    for (const AppendJob& j : jobs) {
      const auto [a, e] = layout.round_rows(j.n, r);
      if (a >= e) continue;
      cache.append(j.seq, layer, j.pos0 + a, e - a, j.k + size_t(a) * kv_row, j.v + size_t(a) * kv_row);
      round.push_back({j.seq, j.pos0 + a, e - a, j.q + size_t(a) * q_row, j.out + size_t(a) * q_row});
    }
    cache_attention(cache, round, layer, shape, pool);
  }
}

void append_and_attend(KvCache& cache, int seq, int layer, int pos0, int n, const float* k, const float* v,
                       const float* q, float* out, const AttentionShape& shape, ThreadPool& pool) {
  const AppendJob job{seq, pos0, n, k, v, q, out};
  append_and_attend(cache, std::span<const AppendJob>(&job, 1), layer, shape, pool);
}

}  // namespace kvq
