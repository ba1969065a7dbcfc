// What running a model will take in memory, worked out before anything is loaded (kvq info -m DIR [--device cuda]
// [-c N] [-np S]): from config.json, the checkpoint's safetensors headers (the weights' dtypes; or bf16 for
// --dummy-weights and configs without weights), the cache configuration, the context and the sequences.
//
//   weights      the matrices as stored (bf16 / f16 / f32) and the norms and biases in fp32. On the CPU the
//                matrices are read in place from the checkpoint's mapping: page cache, shared and evictable, not the
//                process's own memory (dummy weights are generated into its own memory). On the GPU they live in
//                device memory in the GEMM precision; the host stages them through two pinned 32 MiB buffers and
//                drops each tensor's mapped pages once it is uploaded.
//   KV pool      the pages of max_seqs sequences of ctx tokens (PagePool::for_sequences), windows included
//   windows      the part of the pool the sinks and recent rings of max_seqs sequences take while they run
//   value fold   the copies of W_V / W_O with the cache's value rotation folded in (model/value_fold.h), in the host
//                memory of the process, when the cache has one: run, serve and bench decode fold it by default
//   activations  CPU: one prefill chunk's buffers (model/model.h), the logits of a chunk, the GEMM tile scratch
//                (model/linear.h); GPU: the step buffers of max(chunk, max_seqs) rows (cuda/gpu_model.cpp's activation
//                plan at its smallest step) and cuBLAS's workspace.
#pragma once

#include <cstddef>
#include <string>

#include "kv/cache.h"
#include "model/config.h"

namespace kvq {

enum class PlanDevice { kCpu, kCuda };

struct MemoryPlan {
  PlanDevice device = PlanDevice::kCpu;
  std::string weight_dtype;       // the matrices': "BF16", "F16", "F32", "mixed"; "bf16" for dummy weights
  size_t matrix_bytes = 0;        // the linear weights and the embedding as stored
  size_t vector_bytes = 0;        // norms and biases in fp32
  size_t device_weight_bytes = 0; // cuda: the weights on the device (matrices in the GEMM precision, vectors fp32)
  size_t kv_pool_bytes = 0;       // pages, windows included
  size_t kv_window_bytes = 0;     // of which the windows of max_seqs sequences (sinks + rings)
  size_t activation_bytes = 0;    // see the header comment
  size_t fold_bytes = 0;          // the value fold's W_V / W_O copies (host), or 0
  size_t host_bytes = 0;          // the process's own host memory (page cache of mapped weights not included)
  size_t page_cache_bytes = 0;    // mapped weights read in place (cpu), or read once and released (cuda)
  size_t device_bytes = 0;        // cuda: weights + KV pool + windows + activations; cpu: 0
};

struct PlanInputs {
  ModelConfig model;
  CacheConfig cache;
  int ctx = 0;           // tokens per sequence
  int max_seqs = 1;      // sequences (-np)
  PlanDevice device = PlanDevice::kCpu;
  bool gpu_gemm_fp32 = false;  // --gpu-gemm fp32: the device keeps fp32 matrices
  // The checkpoint's matrices: their bytes as stored and their dtype name, from its headers. dummy: none; bf16
  // weights generated where the model runs (--dummy-weights, or a config without weights).
  bool dummy = false;
  size_t matrix_bytes = 0;
  std::string matrix_dtype{};
};

MemoryPlan memory_plan(const PlanInputs& in);

// "1.5 GiB", "37.6 MiB", "512 KiB", "12 B"
std::string format_bytes(double bytes);

}  // namespace kvq
