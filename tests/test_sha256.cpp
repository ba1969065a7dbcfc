// SHA-256 against the FIPS 180-2 / NIST example vectors, and streaming in pieces against one-shot hashing.
#include <string>

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/sha256.h"

using namespace kvq;

TEST(Sha256, MatchesFipsShortVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                       "mnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256, MatchesFipsMillionAVector) {
  const char* want = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), want);
  // The same message fed 1000 bytes at a time.
  Sha256 h;
  const std::string chunk(1000, 'a');
  for (int i = 0; i < 1000; ++i) h.update(chunk);
  EXPECT_EQ(h.hex_digest(), want);
}

TEST(Sha256, StreamingInUnevenPiecesEqualsOneShot) {
  // Lengths around the 55/56/64-byte padding boundaries, split at every awkward piece size.
  for (size_t len : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 1000}) {
    std::string msg(len, '\0');
    for (size_t i = 0; i < len; ++i) msg[i] = char((i * 131 + 7) & 0xff);
    const std::string want = sha256_hex(msg);
    for (size_t piece : {1, 3, 63, 64, 65, 200}) {
      Sha256 h;
      for (size_t at = 0; at < len; at += piece) h.update(msg.data() + at, std::min(piece, len - at));
      ASSERT_EQ(h.hex_digest(), want) << "len " << len << " piece " << piece;
    }
  }
}

TEST(Sha256, UpdateAfterDigestIsAnError) {
  Sha256 h;
  h.update("abc");
  h.digest();
  EXPECT_THROW(h.update("x"), Error);
}
