// --dummy-weights on the GPU (cuda::DeviceDummyWeights, kernels::dummy_fill): the device generates the host's
// Weights::dummy values bit for bit (so they have its std and are finite), and a GpuModel whose weights were
// generated on the device computes exactly the logits of one uploaded from the host's dummy Model: every tensor is
// generated into the right place of the stacked device linears. Skipped where no CUDA device is available.
#ifdef KVQ_HAVE_CUDA

#include <cmath>

#include <gtest/gtest.h>

#include "common/half.h"
#include "cuda/gpu_model.h"
#include "cuda/gpu_model_kernels.h"
#include "cuda/runtime.h"
#include "model/runner.h"

using namespace kvq;

namespace {

const std::string kSrc = KVQ_SOURCE_DIR;

#define SKIP_WITHOUT_GPU() \
  if (!kvq::cuda::available()) GTEST_SKIP() << kvq::cuda::unavailable_reason()

}  // namespace

TEST(GpuDummyWeights, DeviceFillEqualsTheHostValuesBitForBitWithTheIntendedStd) {
  SKIP_WITHOUT_GPU();
  const size_t n = size_t(1) << 22;  // 4M values: the std's sampling error is 0.035%
  const float std = 0.02f;
  const uint64_t seed = 5;
  const uint32_t stream = 77;
  cuda::DeviceBuffer bf(n * sizeof(uint16_t)), f32(n * sizeof(float));
  cuda::check(cuda::kernels::dummy_fill({nullptr, bf.as<uint16_t>()}, int64_t(n), TensorInit::Normal, std, seed,
                                        stream, nullptr),
              "dummy_fill bf16");
  cuda::check(cuda::kernels::dummy_fill({f32.as<float>(), nullptr}, int64_t(n), TensorInit::Normal, std, seed, stream,
                                        nullptr),
              "dummy_fill f32");
  cuda::sync("dummy_fill");
  std::vector<uint16_t> bits(n);
  std::vector<float> vals(n);
  bf.download(bits.data(), bits.size() * sizeof(uint16_t));
  f32.download(vals.data(), vals.size() * sizeof(float));
  double s1 = 0, s2 = 0;
  for (size_t i = 0; i < n; ++i) {
    const float host = dummy_value(TensorInit::Normal, std, seed, stream, i);
    ASSERT_EQ(bits[i], f32_to_bf16(host)) << "bf16 value " << i;
    ASSERT_EQ(vals[i], host) << "fp32 value " << i;
    ASSERT_TRUE(std::isfinite(vals[i]));
    s1 += vals[i], s2 += double(vals[i]) * vals[i];
  }
  const double mean = s1 / double(n), sd = std::sqrt(s2 / double(n) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 5 * std / std::sqrt(double(n)));
  EXPECT_NEAR(sd, std, 5 * std / std::sqrt(2.0 * double(n)) + std * 1e-3);
  // Norm weights and biases.
  cuda::check(cuda::kernels::dummy_fill({f32.as<float>(), nullptr}, 1000, TensorInit::Ones, std, seed, stream, nullptr),
              "dummy_fill ones");
  cuda::sync("dummy_fill");
  f32.download(vals.data(), 1000 * sizeof(float));
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(vals[size_t(i)], 1.0f);
}

TEST(GpuDummyWeights, ModelGeneratedOnTheDeviceEqualsTheHostDummyModelUploaded) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = ModelConfig::load(kSrc + "/models/ref/config.json");
  const uint64_t seed = 11;
  auto host = Model::dummy(kSrc + "/models/ref", cfg, seed, 2);
  CacheConfig cc;
  cc.max_chunk = 64;
  for (cuda::GemmPrecision gemm : {cuda::GemmPrecision::Bf16, cuda::GemmPrecision::Fp32}) {
    cuda::GpuModel uploaded(*host, cc, 256, 1, gemm);
    cuda::GpuModel generated(cfg, cuda::DeviceDummyWeights{seed}, cc, 256, 1, gemm);
    EXPECT_EQ(generated.weight_bytes(), uploaded.weight_bytes());
    EXPECT_NE(generated.describe().find("dummy weights (timing only)"), std::string::npos) << generated.describe();
    const int V = cfg.vocab_size;
    std::vector<int32_t> ids(192);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 2654435761u) % uint32_t(V));
    std::vector<float> a(size_t(64) * V), b(a.size());
    const int sa = uploaded.new_sequence(), sb = generated.new_sequence();
    for (int p = 0; p < int(ids.size()); p += 64) {
      uploaded.forward(sa, ids.data() + p, 64, a.data(), true);
      generated.forward(sb, ids.data() + p, 64, b.data(), true);
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(std::isfinite(b[i])) << "chunk " << p << " logit " << i;
        ASSERT_EQ(a[i], b[i]) << "chunk " << p << " logit " << i << " (" << cuda::gemm_precision_name(gemm) << ")";
      }
    }
  }
}

#endif  // KVQ_HAVE_CUDA
