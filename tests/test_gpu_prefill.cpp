// The tensor-core prefill kernel (cuda/prefill_attention.cu) against the per-row path it replaces (every chunk row
// on the decode kernels, GpuKvCache::set_prefill_rows(0)): two GPU caches of one config fed identical rows and
// queries, attention outputs compared by NMSE, on awkward chunk lengths, window edges inside the key and query
// tiles (sinks not a multiple of 16, W = 0), GQA groups 1 .. 8, chunks onto an existing context, several sequences in
// one step (with decode rows beside them), and its KV splits; and against the CPU cache once; bf16 at head dims 64, 96
// and 256 (GpuPrefillHeadDims). Every test checks that the prefill kernel really ran (prefill_kernel_calls). Skipped
// without a GPU.
#ifdef KVQ_HAVE_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention/attention.h"
#include "common/thread_pool.h"
#include "cuda/gpu_cache.h"
#include "cuda/gpu_instances.h"
#include "cuda/gpu_kernels.h"
#include "cuda/runtime.h"
#include "kv/cache.h"
#include "simd/simd.h"

using namespace kvq;

#define REQUIRE_GPU() \
  if (!kvq::cuda::available()) GTEST_SKIP() << kvq::cuda::unavailable_reason()

namespace {

constexpr int kD = 128;

// Keys k_type, values v_type ("bf16" or "int2" of one 128-value group, with the CLI's default clips), head_dim d.
CacheConfig config(const std::string& k_type, const std::string& v_type, int sink, int recent, int chunk, int d = kD) {
  CacheConfig c;
  c.k.type = k_type, c.v.type = v_type;
  c.k.group = c.v.group = 128;
  c.k.head_dim = c.v.head_dim = d;
  c.k.clip = k_type == "bf16" ? 1.0f : 0.96f;
  c.v.clip = v_type == "bf16" ? 1.0f : 0.92f;
  c.sink = sink;
  c.recent = recent;
  c.page_tokens = 128;
  c.max_chunk = chunk;
  return c;
}

// NMSE budget of prefill vs per-row outputs. Both paths round their operands the same way (decode_attention_mma.cu:
// windows in bf16 hi + lo, bf16 rows' q and P to bf16, int2 rows' q and P' to f16), each against its own softmax
// bound, so they differ by about twice one path's rounding: the budgets of the decode kernel against its reference
// twin (tests/test_gpu_cache.cpp operand_budget), 1e-4 with a bf16 quantized side, 1e-5 for int2 on both sides.
double budget(const CacheConfig& c) { return c.k.type == "bf16" || c.v.type == "bf16" ? 1e-4 : 1e-5; }

// [n, heads, d]: heavy-tailed N(0, 1) scale mixture plus a per-channel offset (as tests/test_gpu_cache.cpp).
std::vector<float> random_rows(std::mt19937& rng, int n, int heads, float scale = 1.f, int d = kD) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(n) * heads * d);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = scale * (nd(rng) * std::exp(0.6f * nd(rng)) + 0.5f * float(int(i % d) % 7 - 3));
  return x;
}

double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = double(got[i]) - double(want[i]);
    num += e * e;
    den += double(want[i]) * double(want[i]);
  }
  return den > 0 ? num / den : num;
}

struct Dev {  // a device copy of a host vector of floats
  cuda::DeviceBuffer buf;
  explicit Dev(const std::vector<float>& h) : buf(h.size() * sizeof(float)) {
    buf.upload(h.data(), h.size() * sizeof(float));
  }
  float* get() const { return buf.as<float>(); }
};

// Two GPU caches of one config: `fast` with the prefill kernel for sequences of >= fast_rows rows, `rows` with every
// chunk row by row on the decode kernels. One layer; n_kv kv heads, g query heads each; head_dim d.
struct Pair {
  CacheConfig cfg;
  int n_kv, n_heads, d;
  cuda::GpuKvCache fast, rows;
  std::vector<int> fast_ids, row_ids;
  double worst = 0;

  Pair(const CacheConfig& c, int kv, int g, int max_ctx, int n_seqs, int fast_rows = 1, int head_dim = kD)
      : cfg(c), n_kv(kv), n_heads(kv * g), d(head_dim), fast(c, 1, kv, d, max_ctx, n_seqs),
        rows(c, 1, kv, d, max_ctx, n_seqs) {
    fast.set_prefill_rows(fast_rows);
    rows.set_prefill_rows(0);
    for (int i = 0; i < n_seqs; ++i) fast_ids.push_back(fast.new_sequence()), row_ids.push_back(rows.new_sequence());
  }

  // One step on both caches: sequence index idx[b] appends n[b] rows. Returns the NMSE of the outputs (every row)
  // and checks it against the budget; what names the step in failure messages.
  double step(const std::vector<int>& idx, const std::vector<int>& n, std::mt19937& rng, const std::string& what) {
    int total = 0;
    for (int x : n) total += x;
    const auto k = random_rows(rng, total, n_kv, 1.f, d), v = random_rows(rng, total, n_kv, 1.f, d);
    const auto q = random_rows(rng, total, n_heads, 0.7f, d);
    Dev dk(k), dv(v), dq(q), d_fast(q), d_rows(q);
    std::vector<float> got(q.size()), want(q.size());
    const int64_t calls = fast.prefill_kernel_calls();
    for (auto [c, ids, out] : {std::tuple{&fast, &fast_ids, &d_fast}, std::tuple{&rows, &row_ids, &d_rows}}) {
      std::vector<int> seqs;
      for (int b : idx) seqs.push_back((*ids)[size_t(b)]);
      c->begin_step(seqs, n);
      c->append_and_attend(0, dk.get(), dv.get(), dq.get(), n_heads, out->get());
      c->commit_step();
    }
    cuda::sync("prefill test step");
    d_fast.buf.download(got.data(), got.size() * sizeof(float));
    d_rows.buf.download(want.data(), want.size() * sizeof(float));
    EXPECT_EQ(fast.prefill_kernel_calls(), calls + 1) << what << ": the prefill kernel did not run";
    EXPECT_EQ(rows.prefill_kernel_calls(), 0) << what << ": the per-row cache ran the prefill kernel";
    for (size_t i = 0; i < got.size(); ++i)
      if (!std::isfinite(got[i])) {
        ADD_FAILURE() << what << ": non-finite prefill output at row " << i / (size_t(n_heads) * d) << " head "
                      << i / d % n_heads;
        return INFINITY;
      }
    const double e = nmse(got, want);
    worst = std::max(worst, e);
    if (e >= budget(cfg)) {  // name the worst row, to tell a mask bug (some rows) from rounding (all rows)
      size_t worst_row = 0;
      double worst_row_e = -1;
      const size_t row_floats = size_t(n_heads) * d;
      for (size_t r = 0; r < size_t(total); ++r) {
        const std::vector<float> a(got.begin() + r * row_floats, got.begin() + (r + 1) * row_floats);
        const std::vector<float> b(want.begin() + r * row_floats, want.begin() + (r + 1) * row_floats);
        if (const double x = nmse(a, b); x > worst_row_e) worst_row_e = x, worst_row = r;
      }
      ADD_FAILURE() << what << ": NMSE " << e << " >= budget " << budget(cfg) << "; worst step row " << worst_row
                    << " (NMSE " << worst_row_e << ")";
    }
    return e;
  }
};

std::string name(const CacheConfig& c) {
  return "k=" + c.k.type + " v=" + c.v.type + " sink " + std::to_string(c.sink) + " recent " +
         std::to_string(c.recent);
}

using Case = std::tuple<std::string, std::string, std::pair<int, int>>;  // keys, values, (sink, recent)

class GpuPrefill : public ::testing::TestWithParam<Case> {};

// One chunk per sequence from an empty cache, at lengths around the 16-row mma and 64-row tile edges and past the
// windows (pages demoted inside the chunk: rows of one query tile then see different quantized regions).
TEST_P(GpuPrefill, OneChunkEqualsThePerRowPathAtAwkwardLengths) {
  REQUIRE_GPU();
  const auto& [kt, vt, win] = GetParam();
  const CacheConfig cfg = config(kt, vt, win.first, win.second, 1500);
  const std::vector<int> lengths = {1, 15, 17, 64, 100, 300, 1000, 1500};
  Pair p(cfg, 2, 4, 1600, int(lengths.size()));
  std::mt19937 rng(7 + win.first);
  for (size_t i = 0; i < lengths.size(); ++i)
    p.step({int(i)}, {lengths[i]}, rng, name(cfg) + " chunk of " + std::to_string(lengths[i]));
  std::printf("[ gpu    ] prefill vs per-row, %s: worst NMSE %.3g\n", name(cfg).c_str(), p.worst);
}

// Chunks onto an existing context (the view of every chunk row starts in pages written by earlier chunks), single
// decode rows between them, then two sequences of different lengths in one step.
TEST_P(GpuPrefill, ChunksOntoAContextAndTwoSequencesInOneStepEqualThePerRowPath) {
  REQUIRE_GPU();
  const auto& [kt, vt, win] = GetParam();
  const CacheConfig cfg = config(kt, vt, win.first, win.second, 512);
  Pair p(cfg, 2, 2, 4096, 2);
  std::mt19937 rng(11 + win.second);
  int len = 0;
  for (int n : {128, 128, 100, 17, 1, 1, 300, 512, 33, 512}) {
    p.step({0}, {n}, rng, name(cfg) + " chunk of " + std::to_string(n) + " at " + std::to_string(len));
    len += n;
  }
  p.step({1}, {70}, rng, name(cfg) + " sequence 1, first chunk");
  p.step({0, 1}, {300, 45}, rng, name(cfg) + " two sequences, 300 + 45 rows");
  p.step({1, 0}, {512, 7}, rng, name(cfg) + " two sequences, 512 + 7 rows");
  std::printf("[ gpu    ] prefill vs per-row over chunks, %s: worst NMSE %.3g\n", name(cfg).c_str(), p.worst);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto& [kt, vt, win] = info.param;
  return "k" + kt + "_v" + vt + "_s" + std::to_string(win.first) + "_w" + std::to_string(win.second);
}

// The windows of the GPU tests (64/256, 16/64, 0/0) and sinks that are no multiple of 16 (7/40, 17/100).
const std::vector<std::pair<int, int>> kWindows = {{64, 256}, {16, 64}, {0, 0}, {7, 40}, {17, 100}};

INSTANTIATE_TEST_SUITE_P(Bf16, GpuPrefill,
                         ::testing::Combine(::testing::Values("bf16"), ::testing::Values("bf16"),
                                            ::testing::ValuesIn(kWindows)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Int2, GpuPrefill,
                         ::testing::Combine(::testing::Values("int2"), ::testing::Values("int2"),
                                            ::testing::ValuesIn(kWindows)),
                         case_name);
// Keys and values chosen independently (the tensor-core instance rows).
INSTANTIATE_TEST_SUITE_P(Mixed, GpuPrefill,
                         ::testing::Values(Case{"int2", "bf16", {64, 256}}, Case{"int2", "bf16", {17, 100}},
                                           Case{"bf16", "int2", {64, 256}}, Case{"bf16", "int2", {17, 100}}),
                         case_name);

// GQA groups 1 .. 8 (3: a query tile ends inside a position's group of heads), 8 kv heads as the 8B shapes.
TEST(GpuPrefillGqa, EveryGroupEqualsThePerRowPath) {
  REQUIRE_GPU();
  for (const char* type : {"int2", "bf16"})
    for (int g : {1, 2, 3, 4, 8}) {
      const CacheConfig cfg = config(type, type, 17, 100, 512);
      Pair p(cfg, 8, g, 1200, 1);
      std::mt19937 rng(g);
      const std::string what = name(cfg) + " g " + std::to_string(g);
      p.step({0}, {300}, rng, what + " first chunk");
      p.step({0}, {333}, rng, what + " second chunk");
      std::printf("[ gpu    ] prefill vs per-row, %s: worst NMSE %.3g\n", what.c_str(), p.worst);
    }
}

// A step of decode rows and prefill chunks with the default threshold: the chunks take the prefill kernel, the single
// rows the decode kernels (a subset of the step's rows on each), outputs in the step's row order.
TEST(GpuPrefillDispatch, MixedStepSplitsRowsBetweenTheKernels) {
  REQUIRE_GPU();
  const CacheConfig cfg = config("int2", "int2", 64, 256, 512);
  Pair p(cfg, 2, 4, 2048, 4, cuda::kPrefillMinRows);
  std::mt19937 rng(3);
  p.step({0, 1, 2}, {400, 300, 500}, rng, "three chunks");
  p.step({3, 0, 1}, {200, 1, 1}, rng, "one chunk between decode rows");
  p.step({0, 3, 1, 2}, {1, 1, 300, 1}, rng, "decode rows around a chunk");
  p.step({0}, {cuda::kPrefillMinRows}, rng, "a chunk at the threshold");
  // below the threshold every row takes the decode kernels (no prefill call)
  const int64_t before = p.fast.prefill_kernel_calls();
  const int n_small = cuda::kPrefillMinRows - 13;  // 3 rows, and one decode row
  std::vector<float> k = random_rows(rng, n_small + 1, 2), v = k, q = random_rows(rng, n_small + 1, 8);
  Dev dk(k), dv(v), dq(q), out(q);
  p.fast.begin_step({p.fast_ids[0], p.fast_ids[1]}, {n_small, 1});
  p.fast.append_and_attend(0, dk.get(), dv.get(), dq.get(), 8, out.get());
  p.fast.commit_step();
  cuda::sync("below the threshold");
  EXPECT_EQ(p.fast.prefill_kernel_calls(), before) << "a chunk of " << n_small << " rows took the prefill kernel";
  std::printf("[ gpu    ] mixed steps, prefill vs per-row: worst NMSE %.3g\n", p.worst);
}

// The prefill kernel's KV splits: forced splits of 128 and 1024 positions against one split (the merge is exact; P is
// rounded against each split's running max).
TEST(GpuPrefillDispatch, SplitKvResultEqualsUnsplit) {
  REQUIRE_GPU();
  for (const char* type : {"int2", "bf16"}) {
    const CacheConfig cfg = config(type, type, 64, 256, 512);
    std::vector<std::vector<float>> outs;
    for (int split : {1 << 20, 128, 1024, 0}) {
      cuda::GpuKvCache c(cfg, 1, 2, kD, 4096, 1);
      c.set_prefill_rows(1);
      c.set_split_tokens(split);
      const int s = c.new_sequence();
      std::mt19937 rng(5);
      std::vector<float> last;
      for (int n : {512, 512, 512, 300}) {
        const auto k = random_rows(rng, n, 2), v = random_rows(rng, n, 2), q = random_rows(rng, n, 8, 0.7f);
        Dev dk(k), dv(v), dq(q), out(q);
        c.begin_step({s}, {n});
        c.append_and_attend(0, dk.get(), dv.get(), dq.get(), 8, out.get());
        c.commit_step();
        cuda::sync("split test");
        last.resize(q.size());
        out.buf.download(last.data(), last.size() * sizeof(float));
      }
      EXPECT_EQ(c.prefill_kernel_calls(), 4);
      outs.push_back(last);
    }
    for (size_t i = 1; i < outs.size(); ++i)
      EXPECT_LT(nmse(outs[i], outs[0]), 0.1 * budget(cfg)) << type << " split variant " << i;
  }
}

// Against the CPU cache + cache_attention (the reference semantics, kv/cache.h): a chunk of 700 rows onto a context
// of 900, 17/100 windows, head_dim d.
void chunk_matches_the_cpu_cache(const char* type, int d) {
  const CacheConfig cfg = config(type, type, 17, 100, 1024, d);
  constexpr int kKv = 2, kHeads = 8, kCtx = 2048;
  KvCache cpu(cfg, 1, kKv, d, kCtx, 1);
  cuda::GpuKvCache gpu(cfg, 1, kKv, d, kCtx, 1);
  gpu.set_prefill_rows(1);
  const int cs = cpu.new_sequence(), gs = gpu.new_sequence();
  ThreadPool pool(0);
  std::mt19937 rng(13);
  for (int n : {900, 700}) {
    const auto k = random_rows(rng, n, kKv, 1.f, d), v = random_rows(rng, n, kKv, 1.f, d);
    const auto q = random_rows(rng, n, kHeads, 0.7f, d);
    Dev dk(k), dv(v), dq(q), out(q);
    gpu.begin_step({gs}, {n});
    gpu.append_and_attend(0, dk.get(), dv.get(), dq.get(), kHeads, out.get());
    gpu.commit_step();
    cuda::sync("cpu comparison");
    std::vector<float> got(q.size()), want(q.size()), qs = q;
    out.buf.download(got.data(), got.size() * sizeof(float));
    const int pos0 = cpu.length(cs);
    cpu.reserve(cs, n);
    for (float& x : qs) x *= 1.f / std::sqrt(float(d));  // cache_attention takes pre-scaled queries
    append_and_attend(cpu, cs, 0, pos0, n, k.data(), v.data(), qs.data(), want.data(), AttentionShape{kHeads, kKv, d},
                      pool);
    cpu.commit(cs, n);
    // the CPU's own fast path rounds operands too (int2 of one group: to int8 on AVX2 and AVX-512 VNNI;
    // tests/test_gpu_cache.cpp)
    const bool int8_operands = std::string(type) == "int2" && simd_int8_operands(best_simd_level());
    const double b = int8_operands ? 2e-3 : budget(cfg);
    const double e = nmse(got, want);
    EXPECT_LT(e, b) << type << " d " << d << " chunk of " << n << " at " << pos0;
    std::printf("[ gpu    ] prefill vs CPU cache, d %d %s chunk of %d at %d: NMSE %.3g\n", d, type, n, pos0, e);
  }
  EXPECT_EQ(gpu.prefill_kernel_calls(), 2);
}

TEST(GpuPrefillDispatch, ChunkMatchesTheCpuCache) {
  REQUIRE_GPU();
  for (const char* type : {"int2", "bf16"}) chunk_matches_the_cpu_cache(type, kD);
}

// --- bf16 at head dims 64, 96 and 256: the prefill kernel of each d (at 256 one stage per range, a block an SM).

TEST(GpuPrefillHeadDimsCpu, ChunkMatchesTheCpuCacheAtEveryHeadDim) {
  REQUIRE_GPU();
  for (int d : {64, 96, 256}) chunk_matches_the_cpu_cache("bf16", d);
}

using DimCase = std::tuple<int, std::pair<int, int>>;  // head_dim, (sink, recent)
class GpuPrefillHeadDims : public ::testing::TestWithParam<DimCase> {};

// One chunk per sequence at lengths around the tile edges, chunks onto a context with decode rows between them, two
// sequences in one step, GQA groups 1, 3 and 8.
TEST_P(GpuPrefillHeadDims, ChunksEqualThePerRowPath) {
  REQUIRE_GPU();
  const auto& [d, win] = GetParam();
  const CacheConfig cfg = config("bf16", "bf16", win.first, win.second, 512, d);
  const std::string what = "d " + std::to_string(d) + " " + name(cfg);
  {
    const std::vector<int> lengths = {1, 17, 64, 300, 512};
    Pair p(cfg, 2, 4, 1600, int(lengths.size()), 1, d);
    std::mt19937 rng(7 + d + win.first);
    for (size_t i = 0; i < lengths.size(); ++i)
      p.step({int(i)}, {lengths[i]}, rng, what + " chunk of " + std::to_string(lengths[i]));
    Pair c(cfg, 2, 2, 4096, 2, 1, d);
    for (int n : {128, 100, 1, 300, 512, 33})
      c.step({0}, {n}, rng, what + " context chunk of " + std::to_string(n));
    c.step({1}, {70}, rng, what + " sequence 1");
    c.step({0, 1}, {300, 45}, rng, what + " two sequences");
    std::printf("[ gpu    ] prefill vs per-row, %s: worst NMSE %.3g, %.3g\n", what.c_str(), p.worst, c.worst);
  }
  for (int g : {1, 3, 8}) {
    Pair p(cfg, 8, g, 1200, 1, 1, d);
    std::mt19937 rng(g + d);
    p.step({0}, {300}, rng, what + " g " + std::to_string(g) + " first chunk");
    p.step({0}, {333}, rng, what + " g " + std::to_string(g) + " second chunk");
  }
}

std::string dim_case_name(const ::testing::TestParamInfo<DimCase>& info) {
  const auto& [d, win] = info.param;
  return "d" + std::to_string(d) + "_s" + std::to_string(win.first) + "_w" + std::to_string(win.second);
}

INSTANTIATE_TEST_SUITE_P(Bf16, GpuPrefillHeadDims,
                         ::testing::Combine(::testing::Values(64, 96, 256),
                                            ::testing::Values(std::pair{64, 256}, std::pair{0, 0}, std::pair{17, 100})),
                         dim_case_name);

// Codecs without the prefill kernel keep the per-row path, whatever the threshold, and the log line says so.
TEST(GpuPrefillDispatch, OtherCodecsKeepThePerRowPathAndTheLogNamesIt) {
  REQUIRE_GPU();
  CacheConfig cfg = config("int2", "int2", 64, 256, 512);
  cfg.k.type = cfg.v.type = "int4";
  cuda::GpuKvCache c(cfg, 1, 2, kD, 1024, 1);
  c.set_prefill_rows(1);
  const int s = c.new_sequence();
  std::mt19937 rng(1);
  const auto k = random_rows(rng, 200, 2), q = random_rows(rng, 200, 8);
  Dev dk(k), dq(q), out(q);
  c.begin_step({s}, {200});
  c.append_and_attend(0, dk.get(), dk.get(), dq.get(), 8, out.get());
  c.commit_step();
  cuda::sync("int4 prefill");
  EXPECT_EQ(c.prefill_kernel_calls(), 0);
  EXPECT_NE(cuda::gpu_path_text(cfg, kD).find("prefill row by row"), std::string::npos) << cuda::gpu_path_text(cfg, kD);
  EXPECT_NE(cuda::gpu_path_text(config("int2", "bf16", 64, 256, 512), kD).find("prefill kernel"), std::string::npos);
}

}  // namespace

#endif  // KVQ_HAVE_CUDA
