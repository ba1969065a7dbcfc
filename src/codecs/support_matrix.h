// The support matrix: every codec of the codec table × head_dim × group, with the bytes and bits it really stores
// (from the codec's own block size) and where it runs. `kvq info --codecs` prints it; README's matrix is that output.
#pragma once

#include <string>
#include <vector>

#include "codecs/codec.h"

namespace kvq {

struct SupportRow {
  std::string codec;     // codec table name
  std::string role;      // "k,v" (same layout for keys and values), "k" / "v" where they differ (KIVI), "k" for a
                         // keys-only codec (TurboQuant's codebook keys)
  int head_dim;          // d
  int group;             // G (values per group; KIVI keys: tokens per block); 0 = ungrouped
  double bytes_per_token;  // bytes stored per (token, kv head): block bytes / tokens per block
  double bits;           // bits per element stored (scales and zeros included); 0 for a per_head row (PN-Mix keys),
                         // whose bytes are its calibration file's
  bool cpu;              // the CPU codec takes it
  std::string cuda;      // GPU attention path with this codec for keys and values, or else of the first GPU row that
                         // stores it on one side (TurboQuant's keys and values), "" = not on the GPU
};

// head_dims: the shapes to list (real models use 64, 80, 96, 128 and 256).
std::vector<SupportRow> support_matrix(const std::vector<int>& head_dims = {64, 80, 96, 128, 256});
std::string format_support_matrix(const std::vector<SupportRow>& rows);

// The --kv-cache-dtype presets (codecs/registry.h) at each head_dim: their codecs and window codec, the bytes both
// codecs store (the quantized region; windows are counted by kvq info at a context), the transform they imply and
// where they run.
struct PresetRow {
  std::string preset;      // preset name
  std::string k, v;        // key and value codecs
  std::string window;      // codec of the sink / recent windows (bf16; KV4-RL: int8)
  bool kvq_extension;      // kvq's own preset, not a published one
  int head_dim;            // d
  double bytes_per_token;  // K + V bytes per (token, kv head)
  double bits;             // bits per element, K and V together
  std::string transform;   // the transform the codecs imply ("none", "hadamard_k")
  bool cpu;                // the CPU codecs take it
  std::string cuda;        // GPU attention path of the pair, "" = not on the GPU
};
std::vector<PresetRow> preset_matrix(const std::vector<int>& head_dims = {64, 80, 96, 128, 256});
std::string format_preset_matrix(const std::vector<PresetRow>& rows);

// docs/guide/codecs.md: the codec table (names, what a block stores, flags and transforms), the support matrix, the
// presets and the GPU's compiled instances as one markdown page (`kvq info --codecs --markdown`; a test holds the
// committed page to this output).
std::string support_markdown();

}  // namespace kvq
