// The stored rows of NexusQuant's codecs (codecs/nexus/codec_nexus.h), shared by the host codec and the device's
// (codec_nexus.cuh).
#pragma once

#include <stdint.h>

#include "common/half.h"

namespace kvq {

inline constexpr int kNexusLevels = 4;  // L: lattice coordinates in [-L/2, L/2]

enum class NexusFormat : uint8_t { kInt8, kE8_2 };

// The stored blocks, for fixed head_dim D (the codec reads them at the offsets below for any power-of-two d).
template <int D>
struct NexusRow {
  fp16_t scale;     // fp16(s), s = max|y| / (L/2)
  int8_t code[D];   // 2 · p, value order
};
template <int D>
struct E8_2Row {
  fp16_t scale;          // fp16(d), d = max|y| / 2
  uint8_t codes[D / 4];  // 2-bit c = p + 1.5, codecs/layout.h units
};
inline constexpr int kNexusCodesOffset = 2;  // both rows: the scale, then the codes
constexpr int nexus_row_bytes(NexusFormat f, int d) {
  return kNexusCodesOffset + (f == NexusFormat::kInt8 ? d : d / 4);
}
static_assert(sizeof(NexusRow<128>) == 130 && nexus_row_bytes(NexusFormat::kInt8, 128) == 130, "nexusquant: 8.125 b");
static_assert(sizeof(NexusRow<64>) == 66 && nexus_row_bytes(NexusFormat::kInt8, 64) == 66, "nexusquant d=64");
static_assert(sizeof(E8_2Row<128>) == 34 && nexus_row_bytes(NexusFormat::kE8_2, 128) == 34, "e8_2: 2.125 b");
static_assert(sizeof(E8_2Row<64>) == 18 && nexus_row_bytes(NexusFormat::kE8_2, 64) == 18, "e8_2 d=64: 2.25 b");

}  // namespace kvq
