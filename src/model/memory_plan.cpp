#include "model/memory_plan.h"

#include <algorithm>

#include <fmt/format.h>

#include "kv/page_pool.h"
#include "kv/transform.h"
#include "model/linear.h"
#include "model/weights.h"

namespace kvq {

namespace {

constexpr size_t kF32 = sizeof(float);
constexpr size_t kPinnedStagingBytes = size_t(2) * (size_t(32) << 20);  // cuda/gpu_model.cpp's PinnedStaging
constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;                // cuda/blas.h

// The CPU model's buffers for one chunk of n rows (model/model.h: x, h, q, k, v, att, gate, up), the logits of the
// chunk (the runner's or the caller's [n, vocab]) and the widened tile of the largest matrix (model/linear.h).
size_t cpu_activations(const ModelConfig& c, int n) {
  const size_t N = size_t(n), H = size_t(c.hidden_size), I = size_t(c.intermediate_size);
  const size_t qd = size_t(c.n_heads) * c.head_dim, kvd = size_t(c.n_kv_heads) * c.head_dim;
  size_t largest = size_t(c.vocab_size) * H;
  largest = std::max({largest, qd * H, I * H});
  const size_t tile = std::min(largest, Linear::kTileFloats);
  return N * (2 * H + 2 * qd + 2 * kvd + 2 * I + size_t(c.vocab_size)) * kF32 + tile * kF32;
}

// GpuModel's step buffers for R rows (cuda/gpu_model.cpp, Impl::activation_plan) and cuBLAS's workspace.
size_t gpu_activations(const ModelConfig& c, int rows, int n_seqs, bool fp32_gemm) {
  const size_t R = size_t(rows), H = size_t(c.hidden_size), I = size_t(c.intermediate_size);
  const size_t qd = size_t(c.n_heads) * c.head_dim, kvd = size_t(c.n_kv_heads) * c.head_dim;
  size_t b = R * (2 * H + (qd + 2 * kvd) + 2 * qd + 2 * kvd + 2 * I + size_t(c.vocab_size)) * kF32;
  b += R * 4 * sizeof(int32_t) + size_t(n_seqs) * sizeof(int32_t);  // ids, pos, argmax, finite; last rows
  b += fp32_gemm ? R * I * kF32 : R * std::max({H, I, qd}) * sizeof(uint16_t);
  return b + kBlasWorkspaceBytes;
}

}  // namespace

MemoryPlan memory_plan(const PlanInputs& in) {
  const ModelConfig& c = in.model;
  MemoryPlan p;
  p.device = in.device;
  size_t matrix_params = 0, vector_params = 0;
  for (const TensorSpec& t : model_tensors(c)) (t.matrix() ? matrix_params : vector_params) += t.numel();
  p.matrix_bytes = in.dummy ? matrix_params * 2 : in.matrix_bytes;
  p.weight_dtype = in.dummy ? "bf16" : in.matrix_dtype;
  p.vector_bytes = vector_params * kF32;
  // The fold copies W_V and W_O in the checkpoint's dtype (at its average bytes a value); not for dummy weights
  // generated on the device, which have no host copy to fold.
  const KvTransform* t = in.cache.transform.get();
  if (t && !t->r_v.empty() && !(in.dummy && in.device == PlanDevice::kCuda)) {
    const size_t H = size_t(c.hidden_size), qd = size_t(c.n_heads) * c.head_dim;
    const size_t kvd = size_t(c.n_kv_heads) * c.head_dim;
    p.fold_bytes = size_t(c.n_layers) * (kvd * H + H * qd) * p.matrix_bytes / matrix_params;
  }
  const CacheLayout layout = cache_layout(in.cache, c.n_layers, c.n_kv_heads, c.head_dim);
  const PagePool::Size size = PagePool::for_sequences(layout, in.ctx, in.max_seqs);
  p.kv_window_bytes = size_t(size.n_slots) * size_t(layout.window_pages()) * size_t(layout.page_bytes);
  p.kv_pool_bytes = PagePool::bytes_of(layout, size);
  if (in.device == PlanDevice::kCpu) {
    // A checkpoint's matrices are read where they lie (page cache); dummy ones are the process's own.
    p.activation_bytes = cpu_activations(c, in.cache.max_chunk);
    p.page_cache_bytes = in.dummy ? 0 : p.matrix_bytes;
    p.host_bytes = (in.dummy ? p.matrix_bytes : 0) + p.vector_bytes + p.kv_pool_bytes + p.activation_bytes +
                   p.fold_bytes;
    return p;
  }
  // The device holds the weights in the GEMM precision; a checkpoint's pages pass through the host once (pinned
  // staging, released tensor by tensor); dummy weights are generated on the device.
  p.device_weight_bytes = matrix_params * (in.gpu_gemm_fp32 ? kF32 : 2) + p.vector_bytes;
  p.activation_bytes = gpu_activations(c, std::max(in.cache.max_chunk, in.max_seqs), in.max_seqs, in.gpu_gemm_fp32);
  p.device_bytes = p.device_weight_bytes + p.kv_pool_bytes + p.activation_bytes;
  p.page_cache_bytes = in.dummy ? 0 : p.matrix_bytes;
  p.host_bytes = (in.dummy ? 0 : kPinnedStagingBytes) + p.vector_bytes + p.fold_bytes;
  return p;
}

std::string format_bytes(double b) {
  const double kib = 1024.0, mib = kib * 1024, gib = mib * 1024;
  if (b >= gib) return fmt::format("{:.2f} GiB", b / gib);
  if (b >= mib) return fmt::format("{:.1f} MiB", b / mib);
  if (b >= kib) return fmt::format("{:.0f} KiB", b / kib);
  return fmt::format("{:.0f} B", b);
}

}  // namespace kvq
