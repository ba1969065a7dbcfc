// The typed identity of a KV-cache codec: one value per row of the codec table (codecs/registry.h), in the
// table's order. Its own plain header so that the GPU instance table (cuda/gpu_instances.h) and the kernels'
// geometry (cuda/gpu_kernels.h) name codecs without the registry's host types.
#pragma once

#include <stdint.h>

namespace kvq {

enum class CodecId : uint8_t {
  kF32, kBf16, kInt8, kInt4, kInt2, kKivi2, kKivi4,
  kNexusquant, kNexusquantStrict, kE8_2, kE8_2Strict, kE8_2PostRope,  // NexusQuant (codecs/nexus/codec_nexus.h)
  kOscarInt2,                                                         // OScaR (codecs/oscar/codec_oscar.h)
  kKitty2, kKitty2At20,                                               // Kitty (codecs/kitty/codec_kitty.h)
  // TurboQuant (codecs/turboquant/codec_turboquant.h): codebook keys, norm-corrected codebook keys, uniform values
  kTq2, kTq3, kTq4, kTq2nc, kTq3nc, kTq4nc, kTqv2, kTqv3, kTqv4,
  kFp8e4m3, kFp8e5m2, kFp8PerTokenHead,  // vLLM's FP8 caches (codecs/fp8/codec_fp8.h)
  // llama.cpp's cache types (codecs/half/codec_bf16.h, codecs/llamacpp/codec_llamacpp.h)
  kF16, kQ8_0, kQ5_0, kQ4_1, kQ4_0, kIq4Nl,
  kPnmix,                                     // PN-Mix keys (codecs/pnmix/codec_pnmix.h)
};

}  // namespace kvq
