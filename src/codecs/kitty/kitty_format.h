// The Kitty format (codecs/kitty/codec_kitty.h): the key block and value row layouts and the constants the host
// codecs and the device codec (codec_kitty.cuh) share. Plain C++ (constexpr helpers), includable from .cu files.
//
// Keys, per block of 128 consecutive tokens of one kv head (the page of Kitty's kernels; page_tokens must be a multiple
// of it): score_c = mean_t |k_{t,c}|; the n_boost channels of highest score are "boosted" to 4 bits, the others get 2;
// each channel is quantized over the block's 128 tokens by the min / scale grid (codecs/min_scale_quant.h, eps 1e-6).
// n_boost = floor(d · percent / 100): 25% (kitty_int2, Kitty's system: d / 4 = 32 of 128, 16 of 64) or 20%
// (kitty_int2_20, Kitty's accuracy runs: 25 of 128, 12 of 64 — Kitty's int(d · 0.2 + 1e-6)). Ranking (choice; Kitty's
// torch.topk leaves ties open): by score descending, equal scores by lower channel index first; a boosted channel's
// slot is its rank 0 .. n_boost - 1. Values: per token over all d channels, 2 bits, the same min / scale grid (fp16
// scale and min per token).
//
// Bytes per token at d = 128, 25%: K 32 (low plane) + 8 (high plane) + 1 (channel map) + 4 (scale, min) = 45, V 32 + 4
// = 36: 81 B, 2.53 bits per element. 20%: K 43.25 B.
#pragma once

#include <stdint.h>

#include "codecs/layout.h"
#include "codecs/min_scale_quant.h"

namespace kvq {

namespace layout {

constexpr int kKittyBlockTokens = 128;                   // tokens of one key block (Kitty's PAGE_SIZE)
constexpr int kKittyPlaneBytes = kKittyBlockTokens / 4;  // one channel's 128 two-bit codes

// Kitty key block: 128 tokens × D channels, N_BOOST of them boosted. A "plane row" is one channel's 128 codes in
// token order, packed as a 128-value row of layout.h (units of 32 values, int2), 32 bytes.
//   low[c]        the low 2 bits of channel c's codes (every channel)
//   high[j]       bits 3..2 of the codes of the channel in boosted slot j
//   slot[c]       channel map: slot 0 .. N_BOOST - 1 of a boosted channel, N_BOOST for the others
//   params[c]     fp16 scale and min of channel c over the block
// Channel c's code at token t: low | (boosted ? high[slot] << 2 : 0). Kitty's kernels pack each plane row 4
// consecutive tokens per byte and keep the (scale, min) pairs apart from the page; the bytes are the same.
template <int D, int N_BOOST>
struct KittyKeyBlock {
  uint8_t low[D][kKittyPlaneBytes];
  uint8_t high[N_BOOST][kKittyPlaneBytes];
  uint8_t slot[D];
  MinScale params[D];
};
constexpr int kitty_low_offset() { return 0; }
constexpr int kitty_high_offset(int d) { return d * kKittyPlaneBytes; }
constexpr int kitty_slot_offset(int d, int n_boost) { return (d + n_boost) * kKittyPlaneBytes; }
constexpr int kitty_params_offset(int d, int n_boost) { return kitty_slot_offset(d, n_boost) + d; }
constexpr int kitty_key_block_bytes(int d, int n_boost) { return kitty_params_offset(d, n_boost) + 4 * d; }

// Kitty value row: one token, D values: fp16 scale and min, then the D two-bit codes packed as layout.h.
template <int D>
struct KittyValueRow {
  MinScale params;
  uint8_t codes[D / 4];
};
constexpr int kitty_value_row_bytes(int d) { return 4 + packed_bytes(d, 2); }

static_assert(sizeof(KittyKeyBlock<128, 32>) == 5760 && kitty_key_block_bytes(128, 32) == 45 * 128,
              "kitty_int2 keys d=128: 45 B per token (2.8125 b)");
static_assert(sizeof(KittyKeyBlock<128, 25>) == 5536 && kitty_key_block_bytes(128, 25) == 5536,
              "kitty_int2_20 keys d=128: 43.25 B per token");
static_assert(sizeof(KittyKeyBlock<64, 16>) == 2880 && kitty_key_block_bytes(64, 16) == 2880,
              "kitty_int2 keys d=64: 22.5 B per token");
static_assert(sizeof(KittyKeyBlock<64, 12>) == 2752 && kitty_key_block_bytes(64, 12) == 2752,
              "kitty_int2_20 keys d=64: 21.5 B per token");
static_assert(sizeof(KittyValueRow<128>) == 36 && kitty_value_row_bytes(128) == 36, "kitty values d=128: 2.25 b");
static_assert(sizeof(KittyValueRow<64>) == 20 && kitty_value_row_bytes(64) == 20, "kitty values d=64: 2.5 b");

}  // namespace layout

constexpr float kKittyEps = 1e-6f;  // the least scale of a group (Kitty's kernels)

// n_boost = floor(head_dim · boost_percent / 100).
constexpr int kitty_boosted_channels(int head_dim, int boost_percent) { return head_dim * boost_percent / 100; }

}  // namespace kvq
