// The GPU cache's compiled kernel instances: ONE table of (key codec, value codec, attention path, head dims) rows,
// and the GPU support predicate read from it. Plain C++ without CUDA, so host code (kvq_core included: `kvq info
// --codecs`) and the .cu files share it.
//
// Every row compiles, for its (K, V) pair and each head_dim d it lists: the demotion kernel (kv_append.cu; KIVI keys:
// also the key-block kernel), the attention kernel of its path — the tensor-core kernel (decode_attention_mma.cu:
// int2 rows of one 128-value group or bf16 rows; with the prefill kernel, prefill_attention.cu) or the CUDA-core
// kernel (decode_attention.cu; at d = 128 4 instances for kEvery rows: GQA groups 1, 2, 4 and any g <= 8; else the
// one for any g <= 8) — and the reference twin (decode_attention_ref.cu). Every kernel is templated on d; the .cu
// files expand the table into their one dispatch point (cuda/codecs.cuh: with_instance), so a new combination is one
// row here (or one more d in a row), and its codecs are the device codec types of cuda/codecs.cuh.
//
// Rows name codecs by the blocks they store: keys are per-token rows, or per-channel key blocks for a codec with
// per_channel_keys (KIVI, OScaR); values are per-token rows. The per-token rows of a KIVI type (its values, or keys
// without per_channel) are the int rows of its bits (codecs/registry.cpp builds them as an IntCodec), so a
// kivi2 value spec runs under a row whose values are int2; OScaR's values are its own rows (a format with its own
// groups, fixed_format). The first row that fits a cache runs it: tensor-core rows come first.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>

#include "codecs/codec_id.h"
#include "codecs/registry.h"  // codec_traits, find_codec
#include "cuda/gpu_kernels.h"  // kMaxHeadDim, kPrefillMinRows
#include "kv/cache.h"          // CacheConfig, CodecSpec

namespace kvq::cuda {

enum class GpuPath : uint8_t {
  kTensorCore,   // decode_attention_mma.cu: mma.sync over tiles of 16 positions, windows in extra blocks
  kDecodedTile,  // the same kernel for any codec: each warp first decodes its tile's rows to f16 in shared memory
  kCudaCore,     // decode_attention.cu: one lane per position for scores, per 4 channels for values
};
// The paths in the order their rows come in the table (the first row that fits runs a cache).
inline constexpr GpuPath kGpuPaths[] = {GpuPath::kTensorCore, GpuPath::kDecodedTile, GpuPath::kCudaCore};

// Groups G a quantized side may take (per-token rows: values per scale/zero group; KIVI keys: tokens per block).
enum GpuGroups : uint8_t { kG32 = 1, kG64 = 2, kG128 = 4, kAnyGroup = kG32 | kG64 | kG128 };

// The GQA instances of a CUDA-core row's attention kernel (the tensor-core kernel takes any g <= 8 in one).
enum class GpuGqa : uint8_t {
  kEvery,    // at d = 128: g = 1, 2, 4 each compiled for its g (registers for g heads), any other g <= 8 generic: 4
             // kernels; at the other d the generic one (as kGeneric)
  kGeneric,  // one generic kernel for any g <= 8: the same results, more registers per thread: 1 kernel
};

// The head dims the kernels are compiled for, a bit each (a row's head_dims). d = 80 (StableLM, Phi-2) takes the bf16
// rows only: a quantized per-token side needs a group of 32, 64 or 128 that divides d, and none divides 80 (the CPU
// refuses those caches too).
inline constexpr int kGpuHeadDims[] = {64, 80, 96, 128, 256};
inline constexpr int kGpuHeadDimCount = int(sizeof(kGpuHeadDims) / sizeof(kGpuHeadDims[0]));
enum GpuHeadDims : uint8_t {
  kD64 = 1, kD80 = 2, kD96 = 4, kD128 = 8, kD256 = 16,
  kPow2Dims = kD64 | kD128 | kD256,  // codecs whose transform is a Hadamard of d (OScaR)
  kUpTo128 = kD64 | kD96 | kD128,    // KIVI key blocks (their demotion's shared memory); llama.cpp's (the budget)
  kPow2To128 = kD64 | kD128,         // TurboQuant (a Hadamard of d; not 256: the budget)
  kAllDims = kPow2Dims | kD96,       // every d a group of 32 divides: the grouped codecs' rows
  kEveryDim = kAllDims | kD80,       // bf16 rows
  kDecodedDims = kD128,              // decoded tiles: the timed head dim (the build budget)
};
// The bit of head_dim d (0: no compiled d).
constexpr uint8_t head_dim_bit(int d) {
  for (int j = 0; j < kGpuHeadDimCount; ++j)
    if (kGpuHeadDims[j] == d) return uint8_t(1u << j);
  return 0;
}
static_assert(head_dim_bit(64) == kD64 && head_dim_bit(80) == kD80 && head_dim_bit(96) == kD96 &&
                  head_dim_bit(128) == kD128 && head_dim_bit(256) == kD256 &&
                  kGpuHeadDims[kGpuHeadDimCount - 1] == kMaxHeadDim,
              "GpuHeadDims follows kGpuHeadDims");
// The d at which kEvery rows compile their per-g kernels (the timed shapes'); the others take the generic one.
inline constexpr int kEveryGqaHeadDim = 128;

struct GpuInstance {
  GpuPath path;
  CodecId k;           // key blocks: per-token rows, or per-channel key blocks of a per_channel_keys codec
  CodecId v;           // value rows (per token)
  CodecId window = CodecId::kBf16;  // sink / recent window rows: bf16, or int8 (KV4-RL, METHODS §5.6: per-token int8
                                    // rows at the values' group, plain min/max; the ring keeps each slot's body rows
                                    // too, kv/cache_layout.h, and demotion copies them). CUDA-core and
                                    // decoded-tile rows (whose window blocks decode them as tiles).
  uint8_t groups;      // GpuGroups every quantized side takes (a bf16 side has no groups)
  int page_multiple;   // page_tokens must be a multiple of this
  GpuGqa gqa;          // CUDA-core rows: which GQA instances are compiled (tensor-core rows: kGeneric)
  uint8_t head_dims;   // GpuHeadDims: the d this row is compiled for (a quantized per-token side also needs G | d)
};

// The compiled instances (bf16 sink / recent windows unless a row names int8 ones): the combinations the GPU tests run
// (tests/test_gpu_cache.cpp, test_gpu_model.cpp; tests/test_gpu_instances.cpp lists them), and a CUDA-core bf16 row
// for pages that tensor-core tiles do not fit. Three paths, in this order (the first row that fits a cache runs it):
//   tensor-core   int2 rows of one 128-value group and bf16 rows, fed to mma.sync from their codes or rows, and the
//                 prefill kernel
//   decoded-tile  every other format at d = 128, pages of a multiple of 16: the same kernel, whose warps decode each tile
//                 of 16 rows through the device codec (values4) to f16 in shared memory and run the staged tile code on
//                 it (decode only: a prompt's chunks attend row by row through it)
//   CUDA-core     every format at each d it allows, sliding windows and pages of 8: one lane per position
// bf16 at every d; int8, int4 and int2 at every d but 80 (no group divides it); the others at each d
// their format allows within the budget:
//   - int2 on tensor cores: d = 128 only (the kernels' lanes hold the 8 code words of one 128-value group; int2 at 64,
//     96 and 256 runs on the CUDA-core row, whatever its group);
//   - KIVI keys: not at 256 (the key-block demotion holds G x d bf16 in shared memory: 64 KB at G = 128, d = 256);
//   - TurboQuant and OScaR: powers of two (their Hadamard of d; a cache at 96 is refused on either device);
//   - PN-Mix keys: up to 128, with int2 values (the referee's rows; its widths come per head from a table);
//   - budget: at d = 256 a CUDA-core kernel unrolls 2048 multiply-adds a row for 8 heads and costs 6-16 s of ptxas
//     (128: 1-5 s), so 256 takes the formats a Gemma-sized model runs first (bf16, int8, int4, int2, OScaR), not the
//     TurboQuant, llama.cpp and mixed int4 / int2 pairs.
// Budget (build time on 2 cores): a CUDA-core row costs at d = 128 4 (kEvery) or 1 (kGeneric) attention kernels,
// at every other d 1, each ~1-3 s of ptxas at 64 and 96; every (row, d) also costs a reference twin and 1-2 demotion
// kernels (~0.3 s each, shared by rows of the same pair); a tensor-core (row, d) 2 attention kernels (GQA groups up to
// 4 and 8) and a prefill kernel, a decoded-tile row 2 attention kernels (its twin and demotion are its CUDA-core
// row's). docs/results/kernels/head-dims.md has the measured build times.
// clang-format off
namespace instance_table {  // the rows name enumerators without their enums' names
using enum GpuPath;
using enum GpuGqa;
using enum CodecId;
inline constexpr GpuInstance kGpuInstances[] = {
  {.path = kTensorCore, .k = kInt2,      .v = kInt2,      .groups = kG128,     .page_multiple = 16, .gqa = kGeneric,
   .head_dims = kD128},
  {.path = kTensorCore, .k = kInt2,      .v = kBf16,      .groups = kG128,     .page_multiple = 16, .gqa = kGeneric,
   .head_dims = kD128},
  {.path = kTensorCore, .k = kBf16,      .v = kInt2,      .groups = kG128,     .page_multiple = 16, .gqa = kGeneric,
   .head_dims = kD128},
  {.path = kTensorCore, .k = kBf16,      .v = kBf16,      .groups = kAnyGroup, .page_multiple = 16, .gqa = kGeneric,
   .head_dims = kEveryDim},
  // Decoded tiles (decode_attention_mma.cu, d = 128): the other families of the CUDA-core rows below, at the timed head
  // dim, for pages of a multiple of 16 (and the format's own block); sliding windows and pages of 8 take the CUDA-core
  // rows. turboquant_3bit_nc and turboquant_2bit too since the raw ring and the keys' reduce-scatter: 805 / 695 us on
  // decoded tiles against 1523 / 1434 on their CUDA-core rows (H100, 8 x 64K, one build; docs/results/h200.md).
  {.path = kDecodedTile, .k = kInt8,       .v = kInt8,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kInt4,       .v = kInt4,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kInt4,       .v = kInt4,       .window = kInt8, .groups = kAnyGroup, .page_multiple = 16,
   .gqa = kGeneric, .head_dims = kDecodedDims},  // KV4-RL: its int8 windows decoded as tiles too
  {.path = kDecodedTile, .k = kInt2,       .v = kInt2,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kKivi2,      .v = kInt2,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kKivi4,      .v = kInt4,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kInt4,       .v = kInt2,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kKivi2,      .v = kInt4,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kF16,        .v = kF16,        .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kOscarInt2,  .v = kOscarInt2,  .groups = kAnyGroup, .page_multiple = 32,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kKitty2,     .v = kKitty2,     .groups = kAnyGroup, .page_multiple = 128, .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kKitty2At20, .v = kKitty2At20, .groups = kAnyGroup, .page_multiple = 128, .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kTq3nc,      .v = kTqv3,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kTq2nc,      .v = kTqv2,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kTq4nc,      .v = kTqv4,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kTq3nc,      .v = kTqv4,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kTq2,        .v = kTqv2,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kTq3,        .v = kTqv3,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kTq4,        .v = kTqv4,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kFp8e4m3,    .v = kFp8e4m3,    .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kFp8e5m2,    .v = kFp8e5m2,    .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kFp8PerTokenHead, .v = kFp8PerTokenHead, .groups = kAnyGroup, .page_multiple = 16,
   .gqa = kGeneric, .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kFp8e4m3,    .v = kTqv4,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kQ8_0,       .v = kQ4_0,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kQ4_0,       .v = kQ4_0,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kQ8_0,       .v = kQ8_0,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kQ5_0,       .v = kQ5_0,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kQ4_1,       .v = kQ4_1,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kIq4Nl,      .v = kIq4Nl,      .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  // NexusQuant's int8 and 2-bit E8 rows (the referee's nexusquant and e8_2), on decoded tiles alone: a key row goes
  // back through its Hadamard and RoPE across the 4 lanes that hold it (values: once a block across the warp), which a
  // lane per position cannot do cheaply; sliding windows and pages of 8 stay on the CPU
  {.path = kDecodedTile, .k = kNexusquant, .v = kNexusquant, .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kE8_2,       .v = kE8_2,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kDecodedTile, .k = kPnmix,      .v = kInt2,       .groups = kAnyGroup, .page_multiple = 16,  .gqa = kGeneric,
   .head_dims = kDecodedDims},
  {.path = kCudaCore,   .k = kInt8,      .v = kInt8,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kEvery,
   .head_dims = kAllDims},
  {.path = kCudaCore,   .k = kInt4,      .v = kInt4,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kEvery,
   .head_dims = kAllDims},
  {.path = kCudaCore,   .k = kInt2,      .v = kInt2,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kEvery,
   .head_dims = kAllDims},
  {.path = kCudaCore,   .k = kKivi2,     .v = kInt2,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kEvery,
   .head_dims = kUpTo128},
  {.path = kCudaCore,   .k = kKivi4,     .v = kInt4,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kEvery,
   .head_dims = kUpTo128},
  {.path = kCudaCore,   .k = kInt4,      .v = kInt2,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kUpTo128},
  {.path = kCudaCore,   .k = kKivi2,     .v = kInt4,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kUpTo128},
  {.path = kCudaCore,   .k = kBf16,      .v = kBf16,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kEveryDim},
  // llama.cpp's default cache type (-ctk f16 -ctv f16; codec_bf16.cuh's f16 rows)
  {.path = kCudaCore,   .k = kF16,       .v = kF16,       .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kAllDims},
  // OScaR: token-scaled keys in 32-token blocks, values in 32-channel groups (no --kv-group: its own groups)
  {.path = kCudaCore,   .k = kOscarInt2, .v = kOscarInt2, .groups = kAnyGroup, .page_multiple = 32, .gqa = kEvery,
   .head_dims = kPow2Dims},
  // Kitty (codec_kitty.cuh; its own groups): key blocks of 128 tokens per channel, a quarter (a fifth) of the
  // channels at 4 bits, values per token at 2; up to d = 128 (the block demotion holds 128 x d bf16 in shared memory)
  {.path = kCudaCore,   .k = kKitty2,    .v = kKitty2,    .groups = kAnyGroup, .page_multiple = 128, .gqa = kGeneric,
   .head_dims = kUpTo128},
  {.path = kCudaCore,   .k = kKitty2At20, .v = kKitty2At20, .groups = kAnyGroup, .page_multiple = 128,
   .gqa = kGeneric, .head_dims = kUpTo128},
  // TurboQuant presets (codec_turboquant.cuh; ungrouped sides): turboquant_3bit_nc and turboquant_2bit with every GQA
  // instance (the timed pairs before decoded tiles took them at d = 128), turboquant_4bit_nc and turboquant_k3v4_nc
  // with the generic one
  {.path = kCudaCore,   .k = kTq3nc,     .v = kTqv3,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kEvery,
   .head_dims = kPow2To128},
  {.path = kCudaCore,   .k = kTq2nc,     .v = kTqv2,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kEvery,
   .head_dims = kPow2To128},
  {.path = kCudaCore,   .k = kTq4nc,     .v = kTqv4,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kPow2To128},
  {.path = kCudaCore,   .k = kTq3nc,     .v = kTqv4,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kPow2To128},
  // TurboQuant's keys without the norm correction (-ctk tq2 / tq3 / tq4), each with the values of its bits
  {.path = kCudaCore,   .k = kTq2,       .v = kTqv2,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kPow2To128},
  {.path = kCudaCore,   .k = kTq3,       .v = kTqv3,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kPow2To128},
  {.path = kCudaCore,   .k = kTq4,       .v = kTqv4,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kPow2To128},
  // vLLM's FP8 caches (codec_fp8.cuh; ungrouped): fp8 (e4m3, scale 1.0, the cache its users pick) at every d a group
  // of 32 divides, fp8_e5m2, fp8_per_token_head and turboquant_k8v4 (FP8 keys, 4-bit values) at 64 and 128
  {.path = kCudaCore,   .k = kFp8e4m3,   .v = kFp8e4m3,   .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kAllDims},
  {.path = kCudaCore,   .k = kFp8e5m2,   .v = kFp8e5m2,   .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kPow2To128},
  {.path = kCudaCore,   .k = kFp8PerTokenHead, .v = kFp8PerTokenHead, .groups = kAnyGroup, .page_multiple = 8,
   .gqa = kGeneric, .head_dims = kPow2To128},
  {.path = kCudaCore,   .k = kFp8e4m3,   .v = kTqv4,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kPow2To128},
  // llama.cpp's q8_0 and q4_0 (codec_llamacpp.cuh; blocks of 32 with an fp16 scale, ungrouped): -ctk q8_0 -ctv q4_0
  // (its common pair) and q4_0 with every GQA instance, q8_0 with the generic one
  {.path = kCudaCore,   .k = kQ8_0,      .v = kQ4_0,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kEvery,
   .head_dims = kUpTo128},
  {.path = kCudaCore,   .k = kQ4_0,      .v = kQ4_0,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kEvery,
   .head_dims = kUpTo128},
  {.path = kCudaCore,   .k = kQ8_0,      .v = kQ8_0,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kUpTo128},
  // llama.cpp's other block types (the referee's rows) with the generic one, at 64 and 128
  {.path = kCudaCore,   .k = kQ5_0,      .v = kQ5_0,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kPow2To128},
  {.path = kCudaCore,   .k = kQ4_1,      .v = kQ4_1,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kPow2To128},
  {.path = kCudaCore,   .k = kIq4Nl,     .v = kIq4Nl,     .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kPow2To128},
  // PN-Mix keys (codec_pnmix.cuh: 1-4 bits per RoPE pair, every head its own widths, read from its table) with the
  // int2 values the referee's pnmix rows store
  {.path = kCudaCore,   .k = kPnmix,     .v = kInt2,      .groups = kAnyGroup, .page_multiple = 8,  .gqa = kGeneric,
   .head_dims = kUpTo128},
  // KV4-RL (the referee's kv4rl, --kv-cache-dtype kv4rl): int4 rows with INT8 sink and recent windows
  {.path = kCudaCore,   .k = kInt4,      .v = kInt4,      .window = kInt8, .groups = kAnyGroup, .page_multiple = 8,
   .gqa = kGeneric, .head_dims = kAllDims},
};
}  // namespace instance_table
using instance_table::kGpuInstances;
// clang-format on
inline constexpr int kGpuInstanceCount = int(sizeof(kGpuInstances) / sizeof(kGpuInstances[0]));

inline const char* gpu_path_name(GpuPath p) {
  return p == GpuPath::kTensorCore ? "tensor-core" : p == GpuPath::kDecodedTile ? "decoded-tile" : "CUDA-core";
}

// Whether row r is compiled at head_dim d.
constexpr bool gpu_row_compiled(const GpuInstance& r, int d) { return (r.head_dims & head_dim_bit(d)) != 0; }
// Whether the CUDA-core row r at head_dim d compiles the per-g kernels of g = 1, 2, 4 (else only the generic one).
constexpr bool gpu_every_gqa(const GpuInstance& r, int d) { return r.gqa == GpuGqa::kEvery && d == kEveryGqaHeadDim; }

// Whether a row's prefill chunks can take the tensor-core prefill kernel (prefill_attention.cu: int2 rows of one
// 128-value group and bf16 rows, the tensor-core rows'); the others attend every chunk row by row with their decode
// kernel. GpuKvCache's attention dispatch reads it (with its set_prefill_rows threshold), and gpu_path_text names it.
constexpr bool gpu_prefill_kernel(const GpuInstance& r) { return r.path == GpuPath::kTensorCore; }

// --- The support predicate (host).

namespace gpu_detail {

inline bool takes_group(uint8_t groups, int g) {
  return (g == 32 && (groups & kG32)) || (g == 64 && (groups & kG64)) || (g == 128 && (groups & kG128));
}
inline std::string groups_text(uint8_t groups) {
  std::string s;
  for (int g : {32, 64, 128})
    if (takes_group(groups, g)) s += (s.empty() ? "g" : "/") + std::to_string(g);
  return s;
}
// "64, 96, 128 and 256": head dims (a GpuHeadDims mask) as the messages list them.
inline std::string head_dims_text(uint8_t dims) {
  std::string s;
  int left = 0;
  for (int d : kGpuHeadDims) left += (dims & head_dim_bit(d)) != 0;
  for (int d : kGpuHeadDims) {
    if (!(dims & head_dim_bit(d))) continue;
    --left;
    s += std::to_string(d) + (left > 1 ? ", " : left == 1 ? " and " : "");
  }
  return s;
}
// "int2/g64", "kivi2/g128 per channel", "bf16": a spec as the messages name it.
inline std::string spec_text(const CodecSpec& s) {
  const CodecTraits* t = find_codec(s.type);
  std::string out = s.type;
  if (t && t->grouped) out += "/g" + std::to_string(s.group);
  if (s.per_channel) out += " per channel";
  return out;
}
// One side of a row: "int2/g128", "kivi2/per-channel", "bf16".
inline std::string side_text(CodecId id, bool is_key, uint8_t groups) {
  const CodecTraits& t = codec_traits(id);
  std::string out(t.name);
  if (t.grouped && groups != kAnyGroup) out += "/" + groups_text(groups);
  if (is_key && t.per_channel_keys) out += "/per-channel";
  return out;
}

// A row's pair and windows: "k=int2/g128 v=int2/g128", "k=int4 v=int4 windows=int8".
inline std::string row_text(const GpuInstance& r) {
  return "k=" + side_text(r.k, true, r.groups) + " v=" + side_text(r.v, false, r.groups) +
         (r.window == CodecId::kBf16 ? "" : " windows=" + std::string(codec_traits(r.window).name));
}

// The codec whose blocks spec `s` stores on the GPU (keys: is_key), into *id; false with *why when it has none.
inline bool stored_codec(const CodecSpec& s, bool is_key, CodecId* id, std::string* why) {
  const char* side = is_key ? "key" : "value";
  const CodecTraits* t = find_codec(s.type);
  if (!t) {
    *why = std::string(side) + " type '" + s.type + "' is unknown";
    return false;
  }
  if (s.per_channel && !(is_key && t->per_channel_keys)) {
    *why = std::string(side) + " type " + spec_text(s) + " is not stored on the GPU (" +
           (is_key ? "only per-channel-key codecs take per_channel" : "values are per-token rows") + ")";
    return false;
  }
  if (is_key && fixed_format(*t) && s.per_channel != t->per_channel_keys) {
    *why = "key type " + spec_text(s) + " is not stored on the GPU (its keys are " +
           (t->per_channel_keys ? "per-channel blocks" : "per-token rows") + ")";
    return false;
  }
  if (s.token_scale != (is_key && t->token_scale_keys)) {
    *why = std::string(side) + " type " + spec_text(s) + (s.token_scale ? " with" : " without") +
           " a token scale is not stored on the GPU (it keeps the token scale of keys whose codec defines one)";
    return false;
  }
  if (t->grouped && !(std::isfinite(s.clip) && s.clip > 0.f && s.clip <= 1.f)) {
    *why = std::string(side) + " type " + spec_text(s) + " has clip " + std::to_string(s.clip) +
           " (must be in (0, 1])";
    return false;
  }
  *id = t->id;
  if (t->per_channel_keys && t->grouped && !s.per_channel) {  // per-token rows of a KIVI type: the int rows of its bits
    for (const CodecTraits& r : codec_table())
      if (r.grouped && !r.per_channel_keys && r.code_bits == t->code_bits) {
        *id = r.id;
        break;
      }
  }
  return true;
}

// Whether a side of codec id and group g fits row groups `groups` at head_dim d: ungrouped, or a group the row takes
// that divides d for per-token rows (per-channel key blocks group tokens).
inline bool side_fits(uint8_t groups, CodecId id, int g, int d) {
  const CodecTraits& t = codec_traits(id);
  return !t.grouped || (takes_group(groups, g) && (t.per_channel_keys || d % g == 0));
}
inline bool row_fits(const GpuInstance& r, CodecId k, int k_group, CodecId v, int v_group, int page_tokens, int d) {
  return r.k == k && r.v == v && gpu_row_compiled(r, d) && side_fits(r.groups, k, k_group, d) &&
         side_fits(r.groups, v, v_group, d) && page_tokens > 0 && page_tokens % r.page_multiple == 0;
}
// The head dims some row is compiled for.
constexpr uint8_t compiled_head_dims() {
  uint8_t dims = 0;
  for (const GpuInstance& r : kGpuInstances) dims |= r.head_dims;
  return dims;
}

// The first row that runs cfg at head_dim, or -1 with *why (when why is not null).
inline int select(const CacheConfig& cfg, int head_dim, std::string* why) {
  std::string w;
  CodecId k{}, v{};
  int found = -1;
  if (!(compiled_head_dims() & head_dim_bit(head_dim))) {
    w = "head_dim " + std::to_string(head_dim) + ": the GPU kernels take head_dim " +
        head_dims_text(compiled_head_dims());
  } else if (cfg.window != "bf16" && cfg.window != "int8") {
    w = "window type '" + cfg.window + "' (--kv-window-type): the GPU keeps bf16 or int8 windows";
  } else if (cfg.window == "int8" && !cfg.skip_layers.empty()) {
    w = "int8 windows (--kv-window-type int8) with --kv-skip-layers: not on the GPU (the CPU runs them: --device cpu)";
  } else if (cfg.window == "int8" && cfg.prompt_policy != PromptPolicy::kDecodeFaithful) {
    w = "int8 windows (--kv-window-type int8) with the prompt policy '" +
        std::string(prompt_policy_name(cfg.prompt_policy)) +
        "': the GPU runs them decode-faithful only (the CPU runs the rest: --device cpu)";
  } else if (stored_codec(cfg.k, true, &k, &w) && stored_codec(cfg.v, false, &v, &w)) {
    // sliding-window attention (Mistral) runs on the CUDA-core rows, whose splits start at the window's first position
    const bool slides = std::any_of(cfg.attn_window.begin(), cfg.attn_window.end(), [](int x) { return x > 0; });
    const CodecId win = cfg.window == "int8" ? CodecId::kInt8 : CodecId::kBf16;
    for (int i = 0; i < kGpuInstanceCount && found < 0; ++i)
      if (!(slides && kGpuInstances[i].path != GpuPath::kCudaCore) && kGpuInstances[i].window == win &&
          row_fits(kGpuInstances[i], k, cfg.k.group, v, cfg.v.group, cfg.page_tokens, head_dim))
        found = i;
    if (found < 0)
      w = "keys " + spec_text(cfg.k) + " with values " + spec_text(cfg.v) +
          (win == CodecId::kInt8 ? " and int8 windows" : "") + " on pages of " +
          std::to_string(cfg.page_tokens) + " tokens at head_dim " + std::to_string(head_dim) +
          (slides ? " with a sliding window (CUDA-core instances only)" : "") + ": no compiled GPU instance";
  }
  if (why) *why = found >= 0 ? std::string() : w;
  return found;
}

}  // namespace gpu_detail

// The compiled instances as one line, from the table: "the GPU runs head_dim 64, 96, 128 and 256, bf16 windows and
// keys / values tensor-core (pages a multiple of 16): k=int2/g128 v=int2/g128 (d 128), ..., k=bf16 v=bf16;
// decoded-tile (pages a multiple of 16): the CUDA-core pairs below at d 128 but k=bf16 v=bf16, ...; CUDA-core (pages a
// multiple of 8): k=int8 v=int8, ..., k=kitty_int2/per-channel v=kitty_int2 (d 64, 96 and 128; pages a multiple of
// 128), ... (groups ...)"; a row names its head dims unless it has them all, and its page multiple when it is larger
// than its path's.
inline std::string gpu_instances_text() {
  constexpr uint8_t all = gpu_detail::compiled_head_dims();
  std::string out = "the GPU runs head_dim " + gpu_detail::head_dims_text(all) +
                    ", bf16 windows (int8 where a row names them) and keys / values";
  const auto has_row = [](GpuPath p, const GpuInstance& of) {  // a row of path p for of's pair and windows
    return std::any_of(std::begin(kGpuInstances), std::end(kGpuInstances), [&](const GpuInstance& r) {
      return r.path == p && r.k == of.k && r.v == of.v && r.window == of.window;
    });
  };
  for (GpuPath p : kGpuPaths) {
    int page = 0;  // the path's page multiple: the least of its rows'
    uint8_t dims = 0;
    for (const GpuInstance& r : kGpuInstances)
      if (r.path == p) page = page == 0 ? r.page_multiple : std::min(page, r.page_multiple), dims |= r.head_dims;
    std::string rows;
    if (p == GpuPath::kDecodedTile && page > 0) {
      // decoded tiles run pairs the CUDA-core rows also run: named by the CUDA-core pairs at their head dims that
      // they leave out (the pair's own page multiple applies)
      std::string but;
      for (const GpuInstance& r : kGpuInstances)
        if (r.path == GpuPath::kCudaCore && (r.head_dims & dims) == dims && !has_row(p, r))
          but += (but.empty() ? "" : ", ") + gpu_detail::row_text(r);
      rows = "the CUDA-core pairs below at d " + gpu_detail::head_dims_text(dims) + (but.empty() ? "" : " but " + but);
    }
    for (const GpuInstance& r : kGpuInstances) {
      if (r.path != p || (p == GpuPath::kDecodedTile && has_row(GpuPath::kCudaCore, r))) continue;
      std::string notes = r.head_dims == all ? "" : "d " + gpu_detail::head_dims_text(r.head_dims);
      if (r.page_multiple != page)
        notes += (notes.empty() ? "" : "; ") + std::string("pages a multiple of ") + std::to_string(r.page_multiple);
      rows += std::string(rows.empty() ? "" : ", ") + gpu_detail::row_text(r) +
              (notes.empty() ? "" : " (" + notes + ")");
    }
    if (!rows.empty())
      out += std::string(p == GpuPath::kTensorCore ? " " : "; ") + gpu_path_name(p) + " (pages a multiple of " +
             std::to_string(page) + "): " + rows;
  }
  return out + " (groups " + gpu_detail::groups_text(kAnyGroup) +
         " dividing d unless named; per-channel keys over G tokens; kivi values are the int rows of their bits)";
}

// The row of kGpuInstances that runs cfg with head_dim, or -1 when none does.
inline int gpu_instance(const CacheConfig& cfg, int head_dim) { return gpu_detail::select(cfg, head_dim, nullptr); }

// "" when some row runs cfg with head_dim; else one line (a kvq::Error message) that names the combination, why it
// is refused, and what the GPU runs: "keys int8/g128 with values int4/g128 on pages of 128 tokens: no compiled GPU
// instance; the GPU runs ...".
inline std::string gpu_unsupported(const CacheConfig& cfg, int head_dim) {
  const bool slides = std::any_of(cfg.attn_window.begin(), cfg.attn_window.end(), [](int x) { return x > 0; });
  if (cfg.prompt_policy == PromptPolicy::kEvict && slides)  // kv/cache.h: the CPU cache masks kept slots by position
    return "prompt policy 'evict' with a sliding window is not supported on the GPU (its kept slots are not positions; "
           "the CPU cache runs it: --device cpu)";
  std::string why;
  if (gpu_detail::select(cfg, head_dim, &why) >= 0) return {};
  return why + "; " + gpu_instances_text();
}

// Which attention path runs cfg and why, for the startup log: "tensor-core attention (instance k=int2/g128
// v=int2/g128), prefill chunks of >= 16 rows on the tensor-core prefill kernel", or "CUDA-core attention (instance
// k=int4 v=int4; tensor cores take k=int2/g128 v=int2/g128, ...), prefill row by row".
inline std::string gpu_path_text(const CacheConfig& cfg, int head_dim) {
  const int i = gpu_instance(cfg, head_dim);
  if (i < 0) return "no GPU instance";
  const GpuInstance& r = kGpuInstances[i];
  std::string out = std::string(gpu_path_name(r.path)) + " attention (instance " + gpu_detail::row_text(r);
  if (r.path == GpuPath::kCudaCore) {
    std::string tc;
    for (const GpuInstance& t : kGpuInstances)
      if (t.path == GpuPath::kTensorCore && gpu_row_compiled(t, head_dim))
        tc += std::string(tc.empty() ? "" : ", ") + gpu_detail::row_text(t);
    out += "; tensor cores take " + tc + " at head_dim " + std::to_string(head_dim);
  }
  return out + ")" +
         (gpu_prefill_kernel(r) ? ", prefill chunks of >= " + std::to_string(kPrefillMinRows) +
                                      " rows on the tensor-core prefill kernel"
                                : std::string(", prefill row by row"));
}

// Whether some row stores spec s for keys or values (per_channel: keys) at the spec's head_dim, whatever the other
// side and the page size.
inline bool gpu_spec_stored(const CodecSpec& s) {
  std::string why;
  for (bool is_key : {true, false}) {
    CodecId id{};
    if ((s.per_channel && !is_key) || !gpu_detail::stored_codec(s, is_key, &id, &why)) continue;
    for (const GpuInstance& r : kGpuInstances)
      if ((is_key ? r.k : r.v) == id && gpu_row_compiled(r, s.head_dim) &&
          gpu_detail::side_fits(r.groups, id, s.group, s.head_dim))
        return true;
  }
  return false;
}

}  // namespace kvq::cuda
