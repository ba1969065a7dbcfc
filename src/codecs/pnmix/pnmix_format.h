// The PN-Mix key row and its per-head decoding table (codecs/pnmix/codec_pnmix.h), shared by the host codec and the
// device's (codec_pnmix.cuh). Plain C++, includable from .cu files.
#pragma once

#include <stdint.h>

#include "codecs/layout.h"

namespace kvq {

constexpr int kPnmixMinBits = 1, kPnmixMaxBits = 4;  // a pair's width
constexpr int kPnmixMaxHeadDim = 256;

namespace layout {

// One PN-Mix key row: fp16 scale/zero of each width slot, then CODE_BITS bits of codes (B·d).
template <int CODE_BITS, int SLOTS>
struct PnmixRow {
  GroupParams params[SLOTS];          // per width present, widths ascending
  uint8_t codes[(CODE_BITS + 7) / 8];  // bit stream, widths ascending, channels ascending, LSB first
};
KVQ_HD constexpr int pnmix_row_bytes(int code_bits, int slots) { return 4 * slots + (code_bits + 7) / 8; }
static_assert(sizeof(PnmixRow<256, 4>) == 48 && pnmix_row_bytes(256, 4) == 48, "pnmix d=128 B=2, 4 widths: 3.0 b");
static_assert(sizeof(PnmixRow<256, 3>) == 44 && pnmix_row_bytes(256, 3) == 44, "pnmix d=128 B=2, 3 widths: 2.75 b");
static_assert(sizeof(PnmixRow<128, 1>) == 20 && pnmix_row_bytes(128, 1) == 20, "pnmix d=128 B=1: int1, 1.25 b");
static_assert(sizeof(PnmixRow<512, 1>) == 68 && pnmix_row_bytes(512, 1) == 68, "pnmix d=128 B=4: int4's 68 B");

// How the rows of one (layer, kv head) are read and written: its widths laid out for a device that decodes a channel
// at a time and demotes a width group at a time (KvCodec::device_table of PnmixKeyCodec, the GPU's CacheGeometry::
// k_table; never stored in the cache). Built from the head's widths alone, so both devices read the same rows.
struct alignas(16) PnmixHeadTable {
  // channel c: its code's bit in the row | its width << 16 | its slot << 24 (first: a lane reads 4 channels' at once)
  uint32_t code_of[kPnmixMaxHeadDim];
  struct Slot {
    int16_t bits;        // w, 1 .. 4; 0: an unused slot (a head with fewer widths than the cache's slots)
    int16_t n;           // channels of width w
    int16_t first;       // the first of them in `channel` (stream order)
    int16_t clip_index;  // the clip's quantile index over them, min(floor(clip n), n - 1); -1: max |x| (clip >= 1)
    int32_t bit;         // their first code's bit in the row, from the row's first byte (past the parameters)
  };
  Slot slot[kPnmixMaxBits];
  int32_t slots;      // the cache's width slots (every head's rows store this many parameter pairs)
  int32_t code_bits;  // B · d: the codes' bits
  uint16_t channel[kPnmixMaxHeadDim];  // stream order: code i is channel channel[i] (i < d)
};
static_assert(sizeof(PnmixHeadTable) % 16 == 0, "every head's table 16-byte aligned in the uploaded array");
KVQ_HD constexpr int pnmix_code_bit(uint32_t code_of) { return int(code_of & 0xffffu); }
KVQ_HD constexpr int pnmix_code_width(uint32_t code_of) { return int((code_of >> 16) & 0xffu); }
KVQ_HD constexpr int pnmix_code_slot(uint32_t code_of) { return int(code_of >> 24); }

// The w-bit code at bit `at` of a row (least significant bit first): a second byte is read only when the code
// crosses into it, so a read never passes the row's last byte.
KVQ_HD inline uint32_t pnmix_code_at(const uint8_t* row, int at, int w) {
  const int byte = at >> 3, shift = at & 7;
  uint32_t v = uint32_t(row[byte]) >> shift;
  if (shift + w > 8) v |= uint32_t(row[byte + 1]) << (8 - shift);
  return v & ((1u << w) - 1u);
}

}  // namespace layout

}  // namespace kvq
