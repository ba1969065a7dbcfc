// SHA-256 (FIPS 180-4), streaming. Used to fingerprint checkpoints so rotation files can be matched to models.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvq {

class Sha256 {
 public:
  Sha256();
  // Feeds n bytes; may be called any number of times with pieces of any size.
  void update(const void* data, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // Pads, finishes and returns the 32-byte digest; the object must not be updated afterwards.
  std::array<uint8_t, 32> digest();
  // digest() as 64 lowercase hex characters.
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);  // one 64-byte block into state_

  std::array<uint32_t, 8> state_;   // running hash H0..H7
  std::array<uint8_t, 64> buffer_;  // partial block not yet compressed
  size_t buffered_ = 0;             // bytes used in buffer_, < 64
  uint64_t total_bytes_ = 0;        // message length so far in bytes
  bool finished_ = false;           // digest() has been called
};

// One-shot helper: hex SHA-256 of a byte string.
std::string sha256_hex(std::string_view data);

}  // namespace kvq
