// vLLM's per-tensor FP8 scales (codecs/fp8/fp8_scales.h, --kv-scales, kvq calibrate --method fp8-scales): the codec at
// a scale s stores fp8(x / s) and reads fp8⁻¹(code) · s at every SIMD level; the cache gives each layer its own k_scale
// and v_scale and refuses what the scales do not fit; scales files round-trip and refuse corrupt, foreign or misfit
// files; calibration on models/ref finds the maxima an f32 cache stores. The GPU's bytes and attention against these:
// test_gpu_cache.cpp (GpuCache.Fp8PerTensorScales...).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention/attention.h"
#include "calib/fp8_scales.h"
#include "codecs/codec.h"
#include "codecs/fp8/fp8_scales.h"
#include "common/error.h"
#include "common/half.h"
#include "common/thread_pool.h"
#include "kv/cache.h"
#include "model/safetensors.h"
#include "rotation/rotation_file.h"
#include "simd/simd.h"
#include "test_helpers.h"
#include "tokenizer/tokenizer.h"

using namespace kvq;
using test::gaussian;
using test::error_of;

namespace {

const std::string kSrc = KVQ_SOURCE_DIR;

std::string tmp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string("kvq_test_fp8_scales_") + name)).string();
}

std::shared_ptr<const Fp8Scales> scales_of(fp8::Format f, std::vector<float> k_amax, std::vector<float> v_amax) {
  return std::make_shared<const Fp8Scales>(Fp8Scales::from_amax(f, std::move(k_amax), std::move(v_amax)));
}

uint8_t code_of(fp8::Format f, float x) { return f == fp8::Format::kE4m3 ? fp8::f32_to_e4m3(x) : fp8::f32_to_e5m2(x); }
float value_of(fp8::Format f, uint8_t b) { return f == fp8::Format::kE4m3 ? fp8::e4m3_to_f32(b) : fp8::e5m2_to_f32(b); }

}  // namespace

// code = fp8(x / s) by hand (the division, then the saturating cast), decode = fp8⁻¹(code) · s; scores and accumulate
// at every level against the scalar reference (decode, then plain loops).
TEST(Fp8Scales, TheCodecStoresFp8OfXOverSAndReadsCodesTimesSAtEveryLevel) {
  for (const char* type : {"fp8e4m3", "fp8e5m2"}) {
    const fp8::Format f = std::string(type) == "fp8e4m3" ? fp8::Format::kE4m3 : fp8::Format::kE5m2;
    for (float s : {0.0123f, 1.f, 7.25f}) {
      constexpr int d = 128, n = 40, n_q = 4;
      std::vector<float> x = gaussian(size_t(n) * d, 3, 2.f);
      x[7] = 1e6f * s, x[9] = -1e6f * s;  // beyond the range at this scale: saturated
      for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAvx512Vnni}) {
        if (!simd_level_supported(level)) continue;
        const auto codec = make_codec_at({.type = type, .head_dim = d, .tensor_scale = s}, level);
        ASSERT_EQ(codec->bytes_per_block(), size_t(d));
        std::vector<uint8_t> rows(size_t(n) * d);
        for (int t = 0; t < n; ++t) codec->encode(x.data() + size_t(t) * d, rows.data() + size_t(t) * d);
        for (size_t i = 0; i < x.size(); ++i)
          ASSERT_EQ(rows[i], code_of(f, x[i] / s)) << type << " s " << s << " " << i;
        EXPECT_EQ(rows[7], f == fp8::Format::kE4m3 ? 0x7e : 0x7b) << "saturated at the top of the range";
        std::vector<float> back(d);
        codec->decode(rows.data(), back.data());
        for (int c = 0; c < d; ++c) ASSERT_EQ(back[size_t(c)], value_of(f, rows[size_t(c)]) * s);
        const std::vector<float> q = gaussian(size_t(n_q) * d, 4), p = gaussian(size_t(n_q) * n, 5);
        std::vector<float> sc(size_t(n_q) * n), ref(sc.size()), acc(size_t(n_q) * d, 0.f), acc_ref(acc);
        codec->scores(q.data(), n_q, rows.data(), n, sc.data());
        codec->scores_ref(q.data(), n_q, rows.data(), n, ref.data());
        codec->accumulate(p.data(), n_q, rows.data(), n, acc.data());
        codec->accumulate_ref(p.data(), n_q, rows.data(), n, acc_ref.data());
        const float big = 2e6f * s * s;  // the saturated values' share of a score
        for (size_t i = 0; i < sc.size(); ++i)
          ASSERT_NEAR(sc[i], ref[i], 1e-5f * (big + std::fabs(ref[i]))) << type << " " << simd_level_name(level);
        for (size_t i = 0; i < acc.size(); ++i)
          ASSERT_NEAR(acc[i], acc_ref[i], 1e-5f * (big / s + std::fabs(acc_ref[i])))
              << type << " " << simd_level_name(level);
      }
    }
  }
}

TEST(Fp8Scales, APerTensorScaleIsVllmsFp8RowsOnlyAndFiniteAndPositive) {
  EXPECT_NE(error_of([] { make_codec({.type = "int2", .head_dim = 128, .tensor_scale = 0.5f}); })
                .find("a per-tensor scale is for vLLM's fp8 / fp8_e5m2 caches only"),
            std::string::npos);
  EXPECT_THROW(make_codec({.type = "fp8_per_token_head", .head_dim = 128, .tensor_scale = 0.5f}), Error);
  for (float s : {0.f, -1.f, NAN, INFINITY})
    EXPECT_NE(error_of([&] { make_codec({.type = "fp8e4m3", .head_dim = 128, .tensor_scale = s}); })
                  .find("per-tensor scale"),
              std::string::npos)
        << s;
}

// Two layers with their own scales: every stored row of layer l is fp8(x / s_l) of what was appended, and attention
// reads fp8⁻¹(code) · s_l (a plain softmax over the decoded rows, by hand).
TEST(Fp8Scales, TheCacheStoresAndReadsEachLayerAtItsOwnScales) {
  constexpr int L = 2, H = 2, d = 128, G = 2, n = 300;
  CacheConfig cfg;
  cfg.k = {.type = "fp8e4m3", .head_dim = d};
  cfg.v = {.type = "fp8e4m3", .head_dim = d};
  cfg.sink = 0, cfg.recent = 0;
  cfg.kv_scales = scales_of(fp8::Format::kE4m3, {3.1f, 900.f}, {0.02f, 40.f});
  KvCache cache(cfg, L, H, d, n + 1);
  EXPECT_NE(cfg.describe().find(" scales=calibrated"), std::string::npos) << cfg.describe();
  ThreadPool pool(1);
  const int seq = cache.new_sequence();
  cache.reserve(seq, n);
  std::vector<std::vector<float>> ks, vs;
  for (int l = 0; l < L; ++l) {
    ks.push_back(gaussian(size_t(n) * H * d, 10 + l, l ? 200.f : 1.f));
    vs.push_back(gaussian(size_t(n) * H * d, 20 + l, l ? 9.f : 0.005f));
    cache.append(seq, l, 0, n, ks[size_t(l)].data(), vs[size_t(l)].data());
  }
  cache.commit(seq, n);
  for (int l = 0; l < L; ++l) {
    const float sk = cfg.kv_scales->k_scale[size_t(l)], sv = cfg.kv_scales->v_scale[size_t(l)];
    EXPECT_EQ(sk, (l ? 900.f : 3.1f) / 448.f);
    std::vector<KvCache::Run> runs;
    for (int h = 0; h < H; ++h) {
      cache.runs(seq, l, h, n - 1, n - 1, runs);
      int covered = 0;
      for (const auto& r : runs) {  // one run a page
        ASSERT_EQ(r.kind, KvCache::RunKind::Quant);
        for (int j = 0; j < r.n; ++j)
          for (int c = 0; c < d; ++c) {
            const int t = r.pos0 + j;
            const size_t i = (size_t(t) * H + h) * d + c;
            // demotion encodes the row the recent window held (bf16)
            const float kb = bf16_to_f32(f32_to_bf16(ks[size_t(l)][i])), vb = bf16_to_f32(f32_to_bf16(vs[size_t(l)][i]));
            ASSERT_EQ(r.k[size_t(j) * d + c], fp8::f32_to_e4m3(kb / sk)) << l << " " << h << " " << t;
            ASSERT_EQ(r.v[size_t(j) * d + c], fp8::f32_to_e4m3(vb / sv)) << l << " " << h << " " << t;
          }
        covered += r.n;
      }
      EXPECT_EQ(covered, n);
    }
    // One query per head at the last position against a softmax over fp8⁻¹(code) · s, in double.
    const std::vector<float> q = gaussian(size_t(H) * G * d, 30 + l, 0.01f);
    std::vector<float> out(q.size());
    std::vector<float> q1 = q;
    cache_attention(cache, seq, l, n - 1, 1, q1.data(), out.data(), AttentionShape{H * G, H, d}, pool);
    for (int h = 0; h < H; ++h) {
      cache.runs(seq, l, h, n - 1, n - 1, runs);
      std::vector<const uint8_t*> krow(n), vrow(n);  // each position's stored rows
      for (const auto& r : runs)
        for (int j = 0; j < r.n; ++j)
          krow[size_t(r.pos0 + j)] = r.k + size_t(j) * d, vrow[size_t(r.pos0 + j)] = r.v + size_t(j) * d;
      for (int j = 0; j < G; ++j) {
        const float* qh = q.data() + size_t(h * G + j) * d;
        std::vector<double> s(n), o(d, 0.0);
        double m = -INFINITY, sum = 0;
        for (int t = 0; t < n; ++t) {
          double dot = 0;
          for (int c = 0; c < d; ++c) dot += double(qh[c]) * fp8::e4m3_to_f32(krow[size_t(t)][c]) * sk;
          s[size_t(t)] = dot, m = std::max(m, dot);
        }
        for (int t = 0; t < n; ++t) {
          const double w = std::exp(s[size_t(t)] - m);
          sum += w;
          for (int c = 0; c < d; ++c) o[size_t(c)] += w * fp8::e4m3_to_f32(vrow[size_t(t)][c]) * sv;
        }
        for (int c = 0; c < d; ++c) {
          const double want = o[size_t(c)] / sum;
          ASSERT_NEAR(out[size_t(h * G + j) * d + c], want, 1e-4 * (l ? 9.0 : 0.005)) << l << " " << h << " " << c;
        }
      }
    }
  }
}

TEST(Fp8Scales, TheCacheRefusesScalesThatDoNotFitIt) {
  constexpr int d = 128;
  CacheConfig cfg;
  cfg.k = {.type = "fp8e4m3", .head_dim = d};
  cfg.v = {.type = "fp8e4m3", .head_dim = d};
  cfg.kv_scales = scales_of(fp8::Format::kE4m3, {1.f, 2.f}, {1.f, 2.f});
  EXPECT_NO_THROW(KvCache(cfg, 2, 1, d, 64));
  EXPECT_NE(error_of([&] { KvCache(cfg, 3, 1, d, 64); }).find("for 2 layers, the cache has 3"), std::string::npos);
  CacheConfig other = cfg;
  other.v = {.type = "int2", .head_dim = d, .group = 128};
  EXPECT_NE(error_of([&] { KvCache(other, 2, 1, d, 64); }).find("are for an e4m3 cache on both sides"),
            std::string::npos);
  other = cfg;
  other.k.type = other.v.type = "fp8e5m2";
  EXPECT_NE(error_of([&] { KvCache(other, 2, 1, d, 64); }).find("not k=fp8e5m2 v=fp8e5m2"), std::string::npos);
  other = cfg;
  other.transform = std::make_shared<KvTransform>(hadamard_transform(2, 1, d));
  EXPECT_NE(error_of([&] { KvCache(other, 2, 1, d, 64); }).find("would change their range"), std::string::npos);
}

TEST(Fp8Scales, FilesRoundTripAndRefuseCorruptForeignAndMisfitFiles) {
  const std::string path = tmp_path("roundtrip.safetensors"), bad = tmp_path("bad.safetensors");
  const Fp8Scales want = Fp8Scales::from_amax(fp8::Format::kE5m2, {5.f, 0.f, 1e3f}, {2.f, 3.f, 4.f});
  EXPECT_EQ(want.k_scale[1], fp8::kMinScale) << "a layer of zeros takes the least scale";
  save_fp8_scales(path, want, {{"model_fingerprint", "abc123"}, {"calib_sha256", "feed"}});
  const Fp8Scales got = load_fp8_scales(path);
  EXPECT_EQ(got.format, fp8::Format::kE5m2);
  EXPECT_EQ(got.k_scale, want.k_scale);
  EXPECT_EQ(got.v_scale, want.v_scale);
  EXPECT_EQ(got.k_amax, want.k_amax);
  EXPECT_EQ(got.meta["calib_sha256"], "feed");
  EXPECT_EQ(got.path, path);
  EXPECT_NO_THROW(check_fp8_scales_fit(got, "abc123", 3));
  EXPECT_NO_THROW(check_fp8_scales_fit(got, "", 3)) << "dummy weights take any file of their layer count";
  EXPECT_NE(error_of([&] { check_fp8_scales_fit(got, "zzz", 3); }).find("another model"), std::string::npos);
  EXPECT_NE(error_of([&] { check_fp8_scales_fit(got, "abc123", 4); }).find("for 3 layers, this model has 4"),
            std::string::npos);
  const std::string golden = kSrc + "/tests/golden/golden.safetensors";
  EXPECT_NE(error_of([&] { load_fp8_scales(golden); }).find("not a kvq FP8 scales file"), std::string::npos);
  // A scale that is not its amax / fmax is refused as corrupt.
  std::vector<OwnedTensor> t;
  for (const char* name : {"k_amax", "v_amax", "k_scale", "v_scale"})
    t.push_back(OwnedTensor::from_f32(name, DType::F32, {3}, std::string(name) == "v_scale"
                                                                  ? std::vector<float>{1.f, 1.f, 1.f}
                                                                  : std::string(name)[2] == 'a'
                                                                        ? std::vector<float>{5.f, 0.f, 1e3f}
                                                                        : want.k_scale));
  const nlohmann::json meta = {{"method", "fp8-scales"}, {"format", "e5m2"}, {"n_layers", 3}};
  write_safetensors(bad, t, {{"kvq_fp8_scales", meta.dump()}});
  EXPECT_NE(error_of([&] { load_fp8_scales(bad); }).find("corrupt"), std::string::npos);
  // Truncated at any length, or any byte changed: one kvq::Error, or the same scales.
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  const auto write = [&](const std::vector<uint8_t>& b) {
    std::ofstream(bad, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), long(b.size()));
  };
  for (size_t n = 0; n < bytes.size(); n += 5) {
    write(std::vector<uint8_t>(bytes.begin(), bytes.begin() + long(n)));
    EXPECT_THROW(load_fp8_scales(bad), Error) << "truncated to " << n;
  }
  int refused = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::vector<uint8_t> b = bytes;
    b[i] ^= 0x5a;
    write(b);
    try {
      const Fp8Scales f = load_fp8_scales(bad);
      EXPECT_EQ(f.k_scale, want.k_scale) << "byte " << i;
      EXPECT_EQ(f.v_scale, want.v_scale) << "byte " << i;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, int(bytes.size()) / 2);
  std::filesystem::remove(path);
  std::filesystem::remove(bad);
}

// The maxima calibration finds: layer 0's are those of the keys and values an f32 cache stores for the same chunks (read
// back from its rows: what the model hands a cache; later layers' depend on the bf16 cache calibration attends with),
// every layer's those of the model's taps over a bf16 cache, and each scale maps its maximum to the top code.
TEST(Fp8Scales, CalibrationFindsTheMaximaTheModelHandsTheCache) {
  auto model = Model::load(kSrc + "/models/ref", 2);
  const ModelConfig& mc = model->config();
  std::ifstream f(kSrc + "/data/calib/linux.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<int32_t> ids = Tokenizer::load(kSrc + "/models/ref/tokenizer.json").encode(ss.str().substr(0, 20000));
  CalibrateConfig cfg;
  cfg.method = "fp8-scales";
  cfg.chunk = 256;
  cfg.tokens = 512;
  ASSERT_GE(ids.size(), 512u);
  const Fp8Calibration c = calibrate_fp8_scales(*model, ids, cfg, fp8::Format::kE4m3);
  EXPECT_EQ(c.chunks, 2);
  ASSERT_EQ(c.scales.n_layers(), mc.n_layers);

  struct MaxTap final : Model::LayerTap {  // the largest |k|, |v| of each layer, in double
    std::vector<double> k, v;
    size_t row = 0;
    void on_qkv(int layer, int, int n, const float*, const float* kp, const float* vp) override {
      for (size_t i = 0; i < size_t(n) * row; ++i) {
        k[size_t(layer)] = std::max(k[size_t(layer)], std::abs(double(kp[i])));
        v[size_t(layer)] = std::max(v[size_t(layer)], std::abs(double(vp[i])));
      }
    }
  } tap;
  tap.k.assign(size_t(mc.n_layers), 0.0), tap.v = tap.k, tap.row = size_t(mc.n_kv_heads) * mc.head_dim;
  CacheConfig f32, bf16;
  f32.k = {.type = "f32", .head_dim = mc.head_dim};
  f32.v = {.type = "f32", .head_dim = mc.head_dim};
  f32.sink = 0, f32.recent = 0, f32.max_chunk = 256, f32.window = "f32";  // every row as handed over
  bf16.max_chunk = 256;
  KvCache exact(f32, mc.n_layers, mc.n_kv_heads, mc.head_dim, 256), cache(bf16, mc.n_layers, mc.n_kv_heads,
                                                                           mc.head_dim, 256);
  float kmax0 = 0.f, vmax0 = 0.f;
  std::vector<float> logits(size_t(mc.vocab_size));
  for (int chunk = 0; chunk < 2; ++chunk) {
    int seq = exact.new_sequence();
    model->forward(exact, seq, ids.data() + chunk * 256, 256, logits.data(), false);
    std::vector<KvCache::Run> runs;
    for (int h = 0; h < mc.n_kv_heads; ++h) {
      exact.runs(seq, 0, h, 255, 255, runs);
      for (const auto& r : runs)
        for (int i = 0; i < r.n * mc.head_dim; ++i) {
          kmax0 = std::max(kmax0, std::fabs(reinterpret_cast<const float*>(r.k)[i]));
          vmax0 = std::max(vmax0, std::fabs(reinterpret_cast<const float*>(r.v)[i]));
        }
    }
    exact.free_sequence(seq);
    model->set_tap(&tap);
    seq = cache.new_sequence();
    model->forward(cache, seq, ids.data() + chunk * 256, 256, logits.data(), false);
    cache.free_sequence(seq);
    model->set_tap(nullptr);
  }
  EXPECT_EQ(c.scales.k_amax[0], kmax0);
  EXPECT_EQ(c.scales.v_amax[0], vmax0);
  for (int l = 0; l < mc.n_layers; ++l) {
    EXPECT_EQ(double(c.scales.k_amax[size_t(l)]), tap.k[size_t(l)]) << "layer " << l;
    EXPECT_EQ(double(c.scales.v_amax[size_t(l)]), tap.v[size_t(l)]) << "layer " << l;
    EXPECT_GT(c.scales.k_amax[size_t(l)], 0.f);
    EXPECT_EQ(c.scales.k_scale[size_t(l)], c.scales.k_amax[size_t(l)] / 448.f);
    EXPECT_EQ(fp8::f32_to_e4m3(c.scales.k_amax[size_t(l)] / c.scales.k_scale[size_t(l)]), 0x7e)
        << "the maximum is the top code";
  }
}
