// The levels of one llama.cpp block (codecs/llamacpp/llamacpp_blocks.h) as two vectors of 16 int8, values 0-15 in lo
// and 16-31 in hi, with SSE4.1 / SSSE3 instructions: the shared first step of the AVX2 and AVX-512 block<Fmt>() of
// simd/simd_avx2.cpp and simd/simd_avx512.cpp, which include this fragment after their target pragma (inside their
// anonymous namespace). Every level fits int8: q8_0 [-127, 127], q5_0 [-16, 15], q4_1 [0, 15], q4_0 [-8, 7], iq4_nl's
// table. No #includes here.

template <RowFormat Fmt>
inline void block_levels_i8(const uint8_t* p, __m128i& lo, __m128i& hi) {
  if constexpr (Fmt == RowFormat::kQ8_0) {
    lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
    hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 18));
  } else {
    constexpr int kCodes = Fmt == RowFormat::kQ5_0 ? 6 : Fmt == RowFormat::kQ4_1 ? 4 : 2;  // bytes before qs
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kCodes));
    const __m128i m = _mm_set1_epi8(0x0f);
    lo = _mm_and_si128(x, m);  // packed by halves: byte j holds values j and j + 16
    hi = _mm_and_si128(_mm_srli_epi16(x, 4), m);
    if constexpr (Fmt == RowFormat::kQ4_0) {
      lo = _mm_sub_epi8(lo, _mm_set1_epi8(8));
      hi = _mm_sub_epi8(hi, _mm_set1_epi8(8));
    } else if constexpr (Fmt == RowFormat::kIq4Nl) {
      const __m128i table = _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
      lo = _mm_shuffle_epi8(table, lo);
      hi = _mm_shuffle_epi8(table, hi);
    } else if constexpr (Fmt == RowFormat::kQ5_0) {
      // Bit j of qh to 0x10 in byte j: spread qh's bytes 0-1 (values 0-15) and 2-3 (16-31) over 8 lanes each,
      // keep one bit per lane, compare.
      uint32_t qh;
      std::memcpy(&qh, p + 2, 4);
      const __m128i bits = _mm_set1_epi32(int(qh));
      const __m128i lane_bit = _mm_set1_epi64x(int64_t(0x8040201008040201ull));
      const auto fifth = [&](__m128i spread) {
        const __m128i b = _mm_and_si128(_mm_shuffle_epi8(bits, spread), lane_bit);
        return _mm_and_si128(_mm_cmpeq_epi8(b, lane_bit), _mm_set1_epi8(0x10));
      };
      lo = _mm_sub_epi8(_mm_or_si128(lo, fifth(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1))),
                        _mm_set1_epi8(16));
      hi = _mm_sub_epi8(_mm_or_si128(hi, fifth(_mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3))),
                        _mm_set1_epi8(16));
    }
  }
}
