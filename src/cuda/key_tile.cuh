// Key blocks through the decoded tiles' raw ring (decode_attention_mma.cu). A key-block device codec (kKeyBlocks:
// KIVI's, OScaR's and Kitty's keys) that defines the three members below has each tile of 16 of a block's rows copied
// into the warp's raw ring beside the tile's value rows, kRawStages - 1 tiles ahead, as per-token rows are, where it
// was read from global memory value by value:
//   kTileBytes                           bytes of a tile's copy (a multiple of 16)
//   fetch_tile(block, row0, dst, lane)   the warp's cp.async copies of what rows row0 .. row0 + 15 of the block read
//                                        (row0 a multiple of 16) into dst (16-byte aligned)
//   KeyTile(dst, row0, c0)               a lane's reader of channels c0 .. c0 + 3 (c0 a multiple of 4) of that copy,
//                                        their parameters read once: values4(r, out) gives what values4(block,
//                                        row0 + r, group, c0, out) gives, the same floats
#pragma once

#include <stdint.h>

#include "codecs/layout.h"
#include "cuda/mma.cuh"

namespace kvq::cuda::dev {

template <class C>
concept GathersKeyTile = requires { C::kTileBytes; typename C::KeyTile; };

// The copy of a tile of a block laid out as D parameter words, then token-major rows of D BITS-bit codes packed as
// layout.h packs them (KIVI's and OScaR's keys): the parameter words, then the tile's 16 rows.
template <int D, int BITS>
struct ParamRowsTile {
  static constexpr int kRow = layout::packed_bytes(D, BITS);
  static constexpr int kBytes = 4 * D + 16 * kRow;
  static __device__ __forceinline__ void fetch(const uint8_t* block, int row0, uint8_t* dst, int lane) {
    static_assert(4 * D % 16 == 0 && kRow % 16 == 0, "16-byte copies");
    for (int i = lane; i < 4 * D / 16; i += 32) tc::cp_async_16(dst + 16 * i, block + 16 * i, true);
    const uint8_t* rows = block + 4 * D + row0 * kRow;
    for (int i = lane; i < kRow; i += 32) tc::cp_async_16(dst + 4 * D + 16 * i, rows + 16 * i, true);
  }
  // A lane's channels c0 .. c0 + 3 (c0 a multiple of 4) of a copy: their parameter words, and each row's codes of
  // them as one word, channel c0 + i's in byte i (layout.h: four consecutive values share a shift).
  struct Lane {
    const uint8_t* codes;  // the word of the channels in the tile's first row
    int shift;
    uint32_t params[4];
    __device__ __forceinline__ Lane(const uint8_t* tile, int c0)
        : codes(tile + 4 * D + layout::code_byte(c0, BITS)), shift(layout::code_shift(c0, BITS)) {
      const uint4 p = *reinterpret_cast<const uint4*>(tile + 4 * c0);
      params[0] = p.x, params[1] = p.y, params[2] = p.z, params[3] = p.w;
    }
    __device__ __forceinline__ uint32_t codes4(int r) const {
      return *reinterpret_cast<const uint32_t*>(codes + r * kRow) >> shift;
    }
  };
};

}  // namespace kvq::cuda::dev
