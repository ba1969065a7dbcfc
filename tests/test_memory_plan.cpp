// The memory plan of kvq info (model/memory_plan.h): its parts equal what the loader and the cache really take —
// the checkpoint's matrix bytes, the KV cache's own allocation (pages + windows) — and the GPU plan of an 8B shape
// keeps the weights off the host.
#include <gtest/gtest.h>

#include "kv/cache.h"
#include "common/thread_pool.h"
#include "model/memory_plan.h"
#include "model/value_fold.h"
#include "model/weights.h"
#include "rotation/rotation_file.h"

using namespace kvq;

namespace {
const std::string kSrc = KVQ_SOURCE_DIR;
}  // namespace

TEST(MemoryPlan, CpuPlanOfTheReferenceModelIsWhatTheLoaderAndTheCacheTake) {
  const ModelConfig cfg = ModelConfig::load(kSrc + "/models/ref/config.json");
  const Checkpoint ck = Checkpoint::open(kSrc + "/models/ref");
  const Weights w = Weights::load(ck, cfg, 2);
  CacheConfig cc;
  cc.k.type = cc.v.type = "int2";
  cc.k.group = cc.v.group = 128;
  PlanInputs in{.model = cfg, .cache = cc, .ctx = 2048, .max_seqs = 3};
  in.matrix_bytes = w.matrix_bytes();
  in.matrix_dtype = "BF16";
  const MemoryPlan p = memory_plan(in);
  EXPECT_EQ(p.matrix_bytes, w.matrix_bytes());
  EXPECT_EQ(p.matrix_bytes, 2 * (model_params(cfg) - p.vector_bytes / 4));  // bf16 matrices, fp32 vectors
  EXPECT_EQ(p.page_cache_bytes, p.matrix_bytes);  // read in place: not the process's own
  const KvCache cache(cc, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 2048, 3);
  EXPECT_EQ(p.kv_pool_bytes, cache.bytes_allocated());
  EXPECT_LT(p.kv_window_bytes, p.kv_pool_bytes);
  EXPECT_EQ(p.host_bytes, p.vector_bytes + p.kv_pool_bytes + p.activation_bytes);
  EXPECT_EQ(p.device_bytes, 0u);
  EXPECT_EQ(p.fold_bytes, 0u);
  // A value rotation: run, serve and bench decode fold it, and the plan counts the copies the fold really makes.
  in.cache.transform = std::make_shared<KvTransform>(hadamard_transform(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim));
  const MemoryPlan folded = memory_plan(in);
  ThreadPool pool(2);
  EXPECT_EQ(folded.fold_bytes, fold_value_rotation(w, cfg, in.cache.transform, pool)->bytes);
  EXPECT_EQ(folded.host_bytes, p.host_bytes + folded.fold_bytes);
}

TEST(MemoryPlan, GpuPlanOfAnEightBillionShapeKeepsTheWeightsOffTheHost) {
  const ModelConfig cfg = ModelConfig::load(kSrc + "/models/shapes/qwen3-8b/config.json");
  size_t matrix_params = 0, vector_params = 0;
  for (const TensorSpec& t : model_tensors(cfg)) (t.matrix() ? matrix_params : vector_params) += t.numel();
  CacheConfig cc;
  PlanInputs in{.model = cfg, .cache = cc, .ctx = 8192, .max_seqs = 8, .device = PlanDevice::kCuda};
  in.matrix_bytes = 2 * matrix_params;  // a bf16 checkpoint
  in.matrix_dtype = "BF16";
  const MemoryPlan p = memory_plan(in);
  EXPECT_EQ(p.page_cache_bytes, 2 * matrix_params);  // read once from the mapping, released tensor by tensor
  EXPECT_EQ(p.device_weight_bytes, 2 * matrix_params + 4 * vector_params);
  EXPECT_EQ(p.host_bytes, (size_t(64) << 20) + 4 * vector_params);  // the pinned staging and the norms
  EXPECT_LT(p.host_bytes, size_t(100) << 20);
  EXPECT_EQ(p.device_bytes, p.device_weight_bytes + p.kv_pool_bytes + p.activation_bytes);
  in.gpu_gemm_fp32 = true;
  EXPECT_EQ(memory_plan(in).device_weight_bytes, 4 * matrix_params + 4 * vector_params);
  in.dummy = true;  // generated on the device: nothing staged
  EXPECT_EQ(memory_plan(in).host_bytes, 4 * vector_params);
}
