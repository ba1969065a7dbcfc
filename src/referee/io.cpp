// The referee's file and text helpers (referee/io.h).
#include "referee/io.h"

#include <cctype>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

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

}  // namespace kvq
