// Byte layouts of every KV-cache block: THE definition shared by the CPU codecs and (later) the CUDA kernels.
// Plain C++ (no STL), includable from .cu files. Sizes are constexpr helpers; the canonical instances carry
// static_asserts. All multi-byte fields are little-endian; fp16 / bf16 fields are raw bits (common/half.h).
//
// Packed codes (int2 / int4 / int8, b bits per value). A row of n values (n a multiple of 32) is cut into
// units of 32 consecutive values; unit u occupies unit_bytes(b) = 4·b bytes at byte offset u·4·b:
//   within a unit, byte j (0 <= j < 4·b) holds values j + (4·b)·k, k = 0 .. 8/b - 1, value k in bits [b·k, b·k + b).
//   int2: byte j of the 8-byte unit holds values j, j+8, j+16, j+24 (bits 0-1, 2-3, 4-5, 6-7)
//   int4: byte j of the 16-byte unit holds values j (low nibble) and j+16 (high nibble)
//   int8: byte j holds value j
// Unpacking a unit with SIMD is one broadcast + one per-lane variable shift + one mask (int2: broadcast the
// 8 bytes to four 64-bit lanes, shift lane k right by 2k, AND 0x03 -> 32 codes in value order).
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define KVQ_HD __host__ __device__
#else
#define KVQ_HD
#endif

namespace kvq::layout {

constexpr int kUnitValues = 32;  // values per packed unit

// fp16 scale and zero of one quantization group: x̂ = (code - zero) · scale (group_quant.h).
struct GroupParams {
  uint16_t scale;  // fp16 bits
  uint16_t zero;   // fp16 bits
};
static_assert(sizeof(GroupParams) == 4, "GroupParams is two fp16");

KVQ_HD constexpr int unit_bytes(int bits) { return 4 * bits; }
// Bytes of packed codes for n values (n a multiple of 32).
KVQ_HD constexpr int packed_bytes(int n, int bits) { return n / 8 * bits; }
// Byte (relative to the start of the packed codes) and bit shift of value v.
KVQ_HD constexpr int code_byte(int v, int bits) {
  return (v / kUnitValues) * unit_bytes(bits) + (v % kUnitValues) % unit_bytes(bits);
}
KVQ_HD constexpr int code_shift(int v, int bits) { return bits * ((v % kUnitValues) / unit_bytes(bits)); }

// --- bf16 row (codec "bf16"): one token, d values.  bytes = 2·d.
//   struct { uint16_t v[d]; }  bf16 bits, value order.
KVQ_HD constexpr int bf16_row_bytes(int d) { return 2 * d; }

// --- per-token int row (codecs int8 / int4 / int2, and kivi2 / kivi4 values): one token, d values in
// d/G groups of G consecutive values.  bytes = 4·(d/G) + d·b/8.
//   GroupParams params[d / G];      group g covers values [g·G, (g+1)·G)
//   uint8_t     codes[d · b / 8];   packed as above
KVQ_HD constexpr int int_row_params_bytes(int d, int group) { return 4 * (d / group); }
KVQ_HD constexpr int int_row_bytes(int d, int group, int bits) {
  return int_row_params_bytes(d, group) + packed_bytes(d, bits);
}

// --- KIVI key block (codecs kivi2 / kivi4 with per_channel): G tokens × d channels; channel c is one
// quantization group over the G tokens.  bytes = 4·d + G·d·b/8.
//   GroupParams params[d];          per channel
//   uint8_t     codes[G][d·b/8];    token-major rows, each packed as above (value index = channel)
KVQ_HD constexpr int kivi_key_params_bytes(int d) { return 4 * d; }
KVQ_HD constexpr int kivi_key_block_bytes(int d, int g_tokens, int bits) {
  return kivi_key_params_bytes(d) + g_tokens * packed_bytes(d, bits);
}

// The same layouts as structs, for fixed shapes (CUDA kernels templated on d, G, b use these).
template <int D, int G, int BITS>
struct IntRow {
  GroupParams params[D / G];     // per group of G values
  uint8_t codes[D * BITS / 8];   // packed codes
};
template <int D, int G, int BITS>
struct KiviKeyBlock {
  GroupParams params[D];         // per channel
  uint8_t codes[G][D * BITS / 8];  // [token][packed channels]
};
template <int D>
struct Bf16Row {
  uint16_t v[D];  // bf16 bits
};

static_assert(sizeof(IntRow<128, 128, 2>) == 36 && int_row_bytes(128, 128, 2) == 36, "int2 d=128 G=128: 2.25 b");
static_assert(sizeof(IntRow<128, 32, 2>) == 48 && int_row_bytes(128, 32, 2) == 48, "int2 d=128 G=32: 3 b");
static_assert(sizeof(IntRow<128, 128, 4>) == 68 && int_row_bytes(128, 128, 4) == 68, "int4 d=128: 4.25 b");
static_assert(sizeof(IntRow<128, 128, 8>) == 132 && int_row_bytes(128, 128, 8) == 132, "int8 d=128: 8.25 b");
static_assert(sizeof(KiviKeyBlock<128, 128, 2>) == 4608 && kivi_key_block_bytes(128, 128, 2) == 4608,
              "kivi2 keys d=128 G=128: 2.25 b");
static_assert(sizeof(KiviKeyBlock<128, 32, 2>) == 1536 && kivi_key_block_bytes(128, 32, 2) == 1536,
              "kivi2 keys d=128 G=32: 3 b");
static_assert(sizeof(Bf16Row<128>) == 256 && bf16_row_bytes(128) == 256, "bf16 d=128: 16 b");
static_assert(code_byte(40, 2) == 8 && code_shift(40, 2) == 2 && code_byte(63, 2) == 15 && code_shift(63, 2) == 6,
              "int2 unit packing");
static_assert(code_byte(17, 4) == 1 && code_shift(17, 4) == 4, "int4 unit packing");

// Pack n one-per-byte codes (each < 2^bits) into out[packed_bytes(n, bits)].
KVQ_HD inline void pack_codes(const uint8_t* codes, int n, int bits, uint8_t* out) {
  for (int i = 0; i < packed_bytes(n, bits); ++i) out[i] = 0;
  for (int v = 0; v < n; ++v) out[code_byte(v, bits)] |= uint8_t(codes[v] << code_shift(v, bits));
}

// Code of value v from packed codes.
KVQ_HD inline uint8_t unpack_code(const uint8_t* packed, int v, int bits) {
  return uint8_t((packed[code_byte(v, bits)] >> code_shift(v, bits)) & ((1 << bits) - 1));
}

}  // namespace kvq::layout
