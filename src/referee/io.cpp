// The referee's file and text helpers (referee/io.h).
#include "referee/io.h"

#include <cctype>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <zlib.h>

#include "common/error.h"

namespace kvq {

namespace fs = std::filesystem;

std::string referee_read_text(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  KVQ_CHECK(f, "cannot open {} '{}'", what, path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void referee_write_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    KVQ_CHECK(f, "cannot write '{}'", tmp);
    f << text;
    KVQ_CHECK(f.good(), "cannot write '{}'", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  KVQ_CHECK(!ec, "cannot rename '{}' to '{}': {}", tmp, path, ec.message());
}

std::string referee_slug(const std::string& s) {
  std::string out;
  for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

std::string referee_fmt_seconds(double s) {
  if (s < 0) return "?";
  const long t = long(s + 0.5);
  return t >= 3600 ? fmt::format("{}h{:02}m", t / 3600, t / 60 % 60) : fmt::format("{}m{:02}s", t / 60, t % 60);
}

std::string referee_utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string referee_read_maybe_gz(const std::string& path, const char* what) {
  std::string bytes = referee_read_text(path, what);
  if (bytes.size() < 2 || uint8_t(bytes[0]) != 0x1f || uint8_t(bytes[1]) != 0x8b) return bytes;
  z_stream z{};
  KVQ_CHECK(inflateInit2(&z, 15 + 32) == Z_OK, "cannot inflate {} '{}': zlib init", what, path);  // gzip header
  z.next_in = reinterpret_cast<Bytef*>(bytes.data());
  z.avail_in = uInt(bytes.size());
  std::string out;
  char buf[1 << 16];
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof(buf);
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof(buf) - z.avail_out);
    if (rc == Z_BUF_ERROR && z.avail_in == 0) break;  // input ended before the stream did
  }
  const std::string why = rc == Z_BUF_ERROR ? std::string("the stream ends early")
                          : z.msg           ? std::string(z.msg)
                                            : "zlib error " + std::to_string(rc);
  inflateEnd(&z);
  KVQ_CHECK(rc == Z_STREAM_END, "{} '{}' is a truncated or corrupt gzip file ({})", what, path, why);
  return out;
}

}  // namespace kvq
