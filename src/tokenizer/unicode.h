// UTF-8 and Unicode helpers for the tokenizer: UTF-8 scanning, the GPT-2 byte <-> unicode map of byte-level
// BPE, character classes (ICU), and NFC normalization (ICU).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvq::unicode {

// Length in bytes of the well-formed UTF-8 sequence starting at s[i] (1..4), or 0 when the bytes there are
// not a well-formed sequence (bad lead byte, bad or missing continuation, overlong form, surrogate, > U+10FFFF).
int utf8_seq_len(std::string_view s, size_t i);

// Decodes the well-formed sequence at s[i] of length n = utf8_seq_len(s, i) > 0.
char32_t utf8_decode(std::string_view s, size_t i, int n);

// Appends the UTF-8 encoding of code point cp (< 0x110000) to out.
void utf8_append(std::string& out, char32_t cp);

bool is_valid_utf8(std::string_view s);

// Number of bytes at the end of s that form an incomplete but still possibly valid UTF-8 sequence
// (a lead byte followed by fewer continuation bytes than it announces), 0..3. Bytes before that point
// can be emitted to a UTF-8 consumer; the tail must wait for more bytes.
size_t utf8_incomplete_tail(std::string_view s);

// The GPT-2 bytes_to_unicode table: byte b <-> one printable code point. Printable Latin-1 bytes
// ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves, the other 68 bytes to U+0100.. in byte order.
struct ByteLevelMap {
  std::array<char32_t, 256> byte_to_cp;  // (256,) code point each byte is written as in vocab strings
  std::array<std::string, 256> byte_to_utf8;  // (256,) the same code points, UTF-8 encoded
  // Code point -> byte, for cp < 0x144 (the table's range); -1 where cp is not in the table.
  std::array<int16_t, 0x144> cp_to_byte;
};
const ByteLevelMap& byte_level_map();

// Maps a vocab string written in the byte-level alphabet back to its raw bytes. Returns false (and leaves
// out unspecified) when a character of token is not in the alphabet or token is not valid UTF-8.
bool byte_level_decode(std::string_view token, std::string& out);

// Unicode White_Space (what Rust's char::is_whitespace and regex \s test).
bool is_whitespace(char32_t cp);
// Rust regex \w: Alphabetic, Mark, Decimal_Number, Connector_Punctuation or Join_Control.
bool is_word_char(char32_t cp);

// NFC of valid UTF-8 text (ICU). Text that is already NFC is returned unchanged.
std::string nfc(std::string_view text);

}  // namespace kvq::unicode
