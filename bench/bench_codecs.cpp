// Micro-benchmark of the codecs' decode-attention primitives: scores (over K blocks) + accumulate (over
// V blocks) for one kv head, d = 128, a GQA group of n_q = 4 queries, 32K tokens, on one core. Keys and values are
// one codec, or a TurboQuant preset's pair.
// The K/V regions are cycled through `copies` distinct buffers (> last-level cache for every codec) so
// the blocks stream from DRAM as they would in a real multi-layer cache.
// Prints per run: block bytes read, GB/s of block bytes, ns per token (scores + accumulate, all n_q).
// The incache/ cases time the same primitives as attention calls them (src/attention/attention.cpp) on a 4096-token
// region that stays in cache, in pieces of 128 rows, for 64 query rows (a prefill tile: rows64) and for 1, 2 and 4 (a
// decode step's GQA group: rows1, rows2, and rows4 for 32 query heads over 8 kv heads, Llama 3 8B's and Qwen3-8B's);
// they print GFLOP/s (2 flops per multiply-add, scores and accumulate).
//   build/kvq_bench_codecs [--benchmark_filter=int2]
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "codecs/codec.h"
#include "simd/simd.h"

namespace {

constexpr int kD = 128, kTokens = 32768, kNq = 4;

struct Case {
  kvq::CodecSpec spec;      // keys (and values, unless value_spec names a type)
  kvq::SimdLevel level;
  kvq::CodecSpec value_spec{.type = ""};  // values of another codec (TurboQuant: key and value codecs differ)
};

void BM_ScoresAccumulate(benchmark::State& state, Case c) {
  if (!kvq::simd_level_supported(c.level)) {
    state.SkipWithError("SIMD level not supported on this CPU");
    return;
  }
  const auto codec = kvq::make_codec_at(c.spec, c.level);
  const auto vcodec = kvq::make_codec_at(c.value_spec.type.empty() ? c.spec : c.value_spec, c.level);
  const size_t bytes = size_t(kTokens / codec->tokens_per_block()) * codec->bytes_per_block();
  const size_t vbytes = size_t(kTokens / vcodec->tokens_per_block()) * vcodec->bytes_per_block();
  // enough copies that K+V of all copies exceed 256 MiB (at least 2)
  const int copies = int(std::max<size_t>(2, (size_t(256) << 20) / (bytes + vbytes) + 1));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](const kvq::KvCodec& cd, size_t n_bytes) {
    std::vector<float> rows(size_t(cd.tokens_per_block()) * kD);
    std::vector<uint8_t> one(n_bytes);
    for (size_t b = 0; b < n_bytes / cd.bytes_per_block(); ++b) {
      for (auto& x : rows) x = normal(rng);
      cd.encode(rows.data(), &one[b * cd.bytes_per_block()]);
    }
    return one;
  };
  std::vector<std::vector<uint8_t>> k(size_t(copies), fill(*codec, bytes)), v(size_t(copies), fill(*vcodec, vbytes));
  std::vector<float> q(size_t(kNq) * kD), s(size_t(kNq) * kTokens), acc(size_t(kNq) * kD, 0.f);
  for (auto& x : q) x = normal(rng);
  int i = 0;
  for (auto _ : state) {
    codec->scores(q.data(), kNq, k[size_t(i)].data(), kTokens, s.data());
    // s stands in for the softmax weights (values do not change the cost)
    vcodec->accumulate(s.data(), kNq, v[size_t(i)].data(), kTokens, acc.data());
    benchmark::DoNotOptimize(acc.data());
    i = (i + 1) % copies;
  }
  const double it = double(state.iterations());
  state.counters["block_bytes_read"] = double(bytes + vbytes);
  state.counters["GB/s"] = benchmark::Counter(it * double(bytes + vbytes), benchmark::Counter::kIsRate);
  state.counters["ns/token"] = benchmark::Counter(it * kTokens * 1e-9, benchmark::Counter::kIsRate |
                                                                           benchmark::Counter::kInvert);
  state.SetLabel(std::string(codec->name()) + (c.value_spec.type.empty() ? "" : "/" + std::string(vcodec->name())) +
                 " G" + std::to_string(c.spec.group) + " " + kvq::simd_level_name(c.level) + " copies " +
                 std::to_string(copies));
}

void BM_InCache(benchmark::State& state, Case c, int rows) {
  if (!kvq::simd_level_supported(c.level)) {
    state.SkipWithError("SIMD level not supported on this CPU");
    return;
  }
  const int kRows = rows;
  constexpr int kRegion = 4096, kPiece = 128;
  const auto codec = kvq::make_codec_at(c.spec, c.level);
  const int tpb = codec->tokens_per_block();
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(size_t(tpb) * kD);
  std::vector<uint8_t> blocks(size_t(kRegion / tpb) * codec->bytes_per_block());
  for (size_t b = 0; b < blocks.size() / codec->bytes_per_block(); ++b) {
    for (auto& v : x) v = normal(rng);
    codec->encode(x.data(), &blocks[b * codec->bytes_per_block()]);
  }
  std::vector<float> q(size_t(kRows) * kD), s(size_t(kRows) * kPiece), acc(size_t(kRows) * kD, 0.f);
  for (auto& v : q) v = normal(rng);
  const size_t piece_bytes = size_t(kPiece / tpb) * codec->bytes_per_block();
  for (auto _ : state) {
    for (int t0 = 0; t0 < kRegion; t0 += kPiece) {
      const uint8_t* piece = blocks.data() + size_t(t0 / kPiece) * piece_bytes;
      codec->scores(q.data(), kRows, piece, kPiece, s.data());
      codec->accumulate(s.data(), kRows, piece, kPiece, acc.data());
    }
    benchmark::DoNotOptimize(acc.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(double(state.iterations()) * 4.0 * kRows * kRegion * kD * 1e-9,
                                                 benchmark::Counter::kIsRate);
  state.SetLabel(std::string(codec->name()) + " " + kvq::simd_level_name(c.level) + ", " + std::to_string(rows) +
                 " query rows");
}

kvq::CodecSpec spec(const char* type, int group, bool per_channel = false) {
  kvq::CodecSpec s;
  s.type = type;
  s.head_dim = kD;
  s.group = group;
  s.per_channel = per_channel;
  return s;
}

void register_all() {
  using L = kvq::SimdLevel;
  const struct {
    const char* name;
    kvq::CodecSpec spec;
  } specs[] = {{"bf16", spec("bf16", 128)},          {"int8_G128", spec("int8", 128)},
               {"int4_G128", spec("int4", 128)},     {"int2_G128", spec("int2", 128)},
               {"int2_G32", spec("int2", 32)},       {"kivi2_keys_G128", spec("kivi2", 128, true)}};
  for (const auto& sp : specs)
    for (L level : {L::kAvx512Vnni, L::kAvx512, L::kAvx2, L::kScalar})
      benchmark::RegisterBenchmark((std::string(sp.name) + "/" + kvq::simd_level_name(level)).c_str(),
                                   BM_ScoresAccumulate, Case{sp.spec, level})
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.3);
  for (int rows : {64, 1, 2, 4})
    for (const char* type : {"bf16", "f16", "int2", "int4"})
      for (L level : {L::kAvx512Vnni, L::kAvx512, L::kAvx2, L::kScalar})
        benchmark::RegisterBenchmark(("incache/rows" + std::to_string(rows) + "/" + type + "/" +
                                      kvq::simd_level_name(level)).c_str(),
                                     BM_InCache, Case{spec(type, 128), level}, rows)
            ->Unit(benchmark::kMicrosecond)
            ->MinTime(0.3);
  // TurboQuant presets: codebook (or FP8) keys with uniform values (codecs/turboquant/codec_turboquant.h).
  const struct {
    const char* name;
    const char *k, *v;
  } pairs[] = {{"turboquant_3bit_nc", "tq3nc", "tqv3"}, {"turboquant_2bit", "tq2nc", "tqv2"},
               {"turboquant_k8v4", "fp8e4m3", "tqv4"}};
  for (const auto& pr : pairs)
    for (L level : {L::kAvx512, L::kAvx2, L::kScalar})
      benchmark::RegisterBenchmark((std::string(pr.name) + "/" + kvq::simd_level_name(level)).c_str(),
                                   BM_ScoresAccumulate, Case{spec(pr.k, 128), level, spec(pr.v, 128)})
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.3);
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
