// Rotation files: save/load round trip, validation, and refusal of files made for another model or cache grid.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "common/thread_pool.h"
#include "model/safetensors.h"
#include "rotation/rotation_file.h"
#include "test_helpers.h"

using namespace kvq;

namespace {

KvTransform random_transform(int L, int H, int d, unsigned seed) {
  std::mt19937 rng(seed);
  KvTransform t;
  t.n_layers = L, t.n_kv_heads = H, t.head_dim = d, t.name = "optr";
  for (int m = 0; m < L * H; ++m) {
    auto rk = test::random_orthogonal(d, rng), rv = test::random_orthogonal(d, rng);
    t.r_k.insert(t.r_k.end(), rk.begin(), rk.end());
    t.r_v.insert(t.r_v.end(), rv.begin(), rv.end());
  }
  std::normal_distribution<float> g;
  t.key_mean.resize(size_t(L) * H * d);
  for (auto& x : t.key_mean) x = g(rng);
  return t;
}

std::string tmp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string("kvq_test_") + name)).string();
}

CacheConfig int2_cache() {
  CacheConfig c;
  c.k = {.type = "int2", .head_dim = 32, .group = 32, .clip = 0.96f};
  c.v = {.type = "int2", .head_dim = 32, .group = 32, .clip = 0.92f};
  c.sink = 64, c.recent = 256;
  return c;
}

nlohmann::json optr_meta() {
  return {{"method", "optr"}, {"model_fingerprint", "abc123"},
          {"cache", {{"type_k", "int2"}, {"type_v", "int2"}, {"group", 32}, {"clip_k", 0.96}, {"clip_v", 0.92},
                     {"sink", 64}, {"recent", 256}}}};
}

}  // namespace

TEST(RotationFile, SaveLoadRoundTripsMatricesMeansAndMetadata) {
  const KvTransform t = random_transform(3, 2, 32, 7);
  const std::string path = tmp_path("roundtrip.safetensors");
  save_rotation_file(path, t, optr_meta());
  const RotationFile f = load_rotation_file(path);
  EXPECT_EQ(f.transform.r_k, t.r_k);
  EXPECT_EQ(f.transform.r_v, t.r_v);
  EXPECT_EQ(f.transform.key_mean, t.key_mean);
  EXPECT_EQ(f.transform.name, "optr");
  EXPECT_EQ(f.meta["n_layers"], 3);
  EXPECT_NO_THROW(check_rotation_fits(f, "abc123", 3, 2, 32, int2_cache()));
  std::filesystem::remove(path);
}

TEST(RotationFile, RefusesAnotherModelOrCacheGrid) {
  const std::string path = tmp_path("mismatch.safetensors");
  save_rotation_file(path, random_transform(2, 2, 32, 3), optr_meta());
  const RotationFile f = load_rotation_file(path);
  auto message = [&](const std::string& fp, int L, const CacheConfig& c) {
    try {
      check_rotation_fits(f, fp, L, 2, 32, c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("zzz999", 2, int2_cache()).find("another model"), std::string::npos);
  EXPECT_NE(message("abc123", 4, int2_cache()).find("4 × 2 × 32"), std::string::npos);
  CacheConfig other = int2_cache();
  other.recent = 128;
  EXPECT_NE(message("abc123", 2, other).find("--kv-recent"), std::string::npos);
  other = int2_cache();
  other.k.type = "int4";
  EXPECT_NE(message("abc123", 2, other).find("cache type k"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(RotationFile, RefusesNonOrthogonalMatricesAndForeignFiles) {
  KvTransform t = random_transform(1, 1, 32, 5);
  t.r_v[3] += 0.1f;
  const std::string path = tmp_path("nonortho.safetensors");
  save_rotation_file(path, t, {{"method", "optr"}});
  try {
    load_rotation_file(path);
    FAIL() << "accepted a non-orthogonal R_V";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not orthogonal"), std::string::npos) << e.what();
  }
  const std::string golden = std::string(KVQ_SOURCE_DIR) + "/tests/golden/golden.safetensors";
  try {
    load_rotation_file(golden);
    FAIL() << "accepted a file that is not a rotation file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a kvq rotation file"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

// Metadata that states huge sizes (found by fuzz/fuzz_rotation.cpp's kind of input) is refused for the tensors it
// lacks before the loader allocates what those sizes would take (here 4000 x 4000 x 1024^2 floats).
TEST(RotationFile, StatedSizesWithoutTheirTensorsAreRefusedBeforeAnyAllocation) {
  const std::string path = tmp_path("huge.safetensors");
  const nlohmann::json meta = {{"method", "optr"}, {"n_layers", 4000}, {"n_kv_heads", 4000}, {"head_dim", 1024}};
  write_safetensors(path, {OwnedTensor::from_f32("layers.0.r_k", DType::F32, {2, 2}, {1, 0, 0, 1})},
                    {{"kvq_rotation", meta.dump()}});
  try {
    load_rotation_file(path);
    FAIL() << "accepted a file without its tensors";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor layers.0.r_k has shape 2x2, expected [4000, 1024, 1024]"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
}

TEST(RotationFile, HadamardTransformIsOrthogonalAndSymmetric) {
  const KvTransform t = hadamard_transform(2, 2, 128);
  ASSERT_EQ(t.r_k.size(), size_t(2 * 2 * 128 * 128));
  const float* h = t.r_k.data();
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 128; ++j) {
      double dot = 0;
      for (int c = 0; c < 128; ++c) dot += double(h[i * 128 + c]) * h[j * 128 + c];
      ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-6);
      ASSERT_EQ(h[i * 128 + j], h[j * 128 + i]);
    }
  EXPECT_EQ(t.r_v, t.r_k);
}

// bench decode's --rotation random: orthogonal R_K and R_V per (layer, kv head) and key means, the same for the same
// seed, and what a rotation file holds (it saves and loads as one).
TEST(RotationFile, RandomRotationTransformIsOrthogonalSeededAndShapedLikeAFile) {
  const int L = 2, H = 3, d = 64;
  const KvTransform t = random_rotation_transform(L, H, d, 5);
  ASSERT_EQ(t.r_k.size(), size_t(L * H * d * d));
  ASSERT_EQ(t.r_v.size(), t.r_k.size());
  ASSERT_EQ(t.key_mean.size(), size_t(L * H * d));
  EXPECT_EQ(t.k_hadamard, 0);
  EXPECT_EQ(t.v_hadamard, 0);
  EXPECT_EQ(t.name, "random (timing only)");
  for (const std::vector<float>* r : {&t.r_k, &t.r_v})
    for (int m = 0; m < L * H; ++m) {
      const float* R = r->data() + size_t(m) * d * d;
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) {
          double dot = 0;
          for (int c = 0; c < d; ++c) dot += double(R[i * d + c]) * R[j * d + c];
          ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-6) << "matrix " << m << " rows " << i << ", " << j;
        }
    }
  EXPECT_NE(std::vector<float>(t.r_k.begin(), t.r_k.begin() + d * d),
            std::vector<float>(t.r_k.begin() + d * d, t.r_k.begin() + 2 * d * d));
  EXPECT_NE(t.key_mean, std::vector<float>(t.key_mean.size(), 0.f));
  const KvTransform again = random_rotation_transform(L, H, d, 5), other = random_rotation_transform(L, H, d, 6);
  EXPECT_EQ(again.r_k, t.r_k);
  EXPECT_EQ(again.r_v, t.r_v);
  EXPECT_EQ(again.key_mean, t.key_mean);
  EXPECT_NE(other.r_k, t.r_k);
  // what a rotation file holds: it saves and loads as one
  const std::string path = tmp_path("random.safetensors");
  save_rotation_file(path, t, optr_meta());
  const RotationFile f = load_rotation_file(path);
  EXPECT_EQ(f.transform.r_k, t.r_k);
  EXPECT_EQ(f.transform.key_mean, t.key_mean);
  std::filesystem::remove(path);
}

// The transform's rotations equal the plain loop they must match bit for bit (and the GPU's append kernel does
// too): x · R and x · R^T, each column a double sum over a = 0 .. d-1 in order, rounded to float once. At every SIMD
// level this machine runs, on one thread and spread over a pool: head_dim 64 .. 512 take the vector kernels, 40 the
// AVX2 kernel and AVX-512's scalar loop, 36 the scalar loop at every level; 3 tokens are a decode-sized call (blocks
// of rows with tails), 37 a prefill chunk spread over items.
TEST(RotationFile, TransformRotationsEqualTheDoubleLoopBitForBitAtEverySimdLevel) {
  ThreadPool pool(2);
  for (int d : {36, 40, 64, 80, 96, 128, 256, 512}) {
    const int L = 2, H = 2, n_heads = 4;
    const KvTransform t = random_transform(L, H, d, 11u + d);
    std::mt19937 rng(d);
    std::normal_distribution<float> g;
    auto reference = [&](const std::vector<float>& R, int layer, int n, int heads, std::vector<float> x,
                         bool transpose) {
      const int group = heads / H;
      for (int r = 0; r < n * heads; ++r) {
        const float* m = R.data() + (size_t(layer) * H + (r % heads) / group) * d * d;
        float* row = x.data() + size_t(r) * d;
        std::vector<float> out(d);
        for (int b = 0; b < d; ++b) {
          double acc = 0.0;
          for (int a = 0; a < d; ++a) acc += double(row[a]) * double(transpose ? m[b * d + a] : m[a * d + b]);
          out[b] = float(acc);
        }
        std::copy(out.begin(), out.end(), row);
      }
      return x;
    };
    for (int n : {3, 37})
      for (int layer = 0; layer < L; ++layer) {
        std::vector<float> q(size_t(n) * n_heads * d), v(size_t(n) * H * d);
        for (auto& x : q) x = g(rng);
        for (auto& x : v) x = g(rng);
        const std::vector<float> want_q = reference(t.r_k, layer, n, n_heads, q, false),
                                 want_o = reference(t.r_v, layer, n, n_heads, q, true),
                                 want_v = reference(t.r_v, layer, n, H, v, false);
        for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAvx512Vnni})
          for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
            if (!simd_level_supported(level)) continue;
            const TransformExec x{level, p};
            const std::string what = fmt::format("head_dim {}, {} tokens, {}, {}", d, n, simd_level_name(level),
                                                 p ? "pool" : "one thread");
            std::vector<float> got = q;
            t.queries(layer, n, n_heads, got.data(), x);
            EXPECT_EQ(got, want_q) << "queries, " << what;
            got = q;
            t.outputs(layer, n, n_heads, got.data(), x);
            EXPECT_EQ(got, want_o) << "outputs, " << what;
            got = v;
            t.values(layer, n, got.data(), x);
            EXPECT_EQ(got, want_v) << "values, " << what;
            // A layer's inputs at once (keys centred and rotated with their queries) as one by one.
            std::vector<float> k1 = v, k2 = v, v2 = v, q2 = q;
            t.keys(layer, n, k1.data(), TransformExec{SimdLevel::kScalar, nullptr});
            t.inputs(layer, n, k2.data(), v2.data(), n_heads, q2.data(), x);
            EXPECT_EQ(k2, k1) << "inputs: keys, " << what;
            EXPECT_EQ(v2, want_v) << "inputs: values, " << what;
            EXPECT_EQ(q2, want_q) << "inputs: queries, " << what;
          }
      }
  }
}
