// The typed identity of a KV-cache codec: one value per row of the codec table (kv/codec_registry.h), in the
// table's order. Its own plain header so that the GPU instance table (cuda/gpu_instances.h) and the kernels'
// geometry (cuda/gpu_kernels.h) name codecs without the registry's host types.
#pragma once

#include <stdint.h>

namespace kvq {

enum class CodecId : uint8_t {
  kF32, kBf16, kInt8, kInt4, kInt2, kKivi2, kKivi4,
  kF16, kQ8_0, kQ5_0, kQ4_1, kQ4_0, kIq4Nl,  // llama.cpp's cache types (kv/codec_f16.h, kv/codec_llamacpp.h)
};

}  // namespace kvq
