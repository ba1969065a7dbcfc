// The support matrix: every codec of the codec table × head_dim × group, with the bytes and bits it really stores
// (from the codec's own block size) and where it runs. `kvq info --codecs` prints it; README's matrix is that output.
#pragma once

#include <string>
#include <vector>

#include "kv/codec.h"

namespace kvq {

struct SupportRow {
  std::string codec;     // codec table name
  std::string role;      // "k,v" (same layout for keys and values), or "k" / "v" where they differ (KIVI)
  int head_dim;          // d
  int group;             // G (values per group; KIVI keys: tokens per block); 0 = ungrouped
  double bytes_per_token;  // bytes stored per (token, kv head): block bytes / tokens per block
  double bits;           // bits per element stored (scales and zeros included)
  bool cpu;              // the CPU codec takes it
  std::string cuda;      // GPU attention path with this codec for keys and values, "" = not on the GPU
};

// head_dims: the shapes to list (real models use 64 and 128).
std::vector<SupportRow> support_matrix(const std::vector<int>& head_dims = {64, 128});
std::string format_support_matrix(const std::vector<SupportRow>& rows);

}  // namespace kvq
