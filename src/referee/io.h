// Small file and text helpers of the referee (its plan, stores and results): whole-file reads, atomic writes,
// file-name-safe labels, durations and UTC timestamps.
#pragma once

#include <string>

namespace kvq {

// The bytes of `path`; kvq::Error "cannot open <what> '<path>'".
std::string referee_read_text(const std::string& path, const char* what);
// Writes through a temporary file and a rename, so an interrupted referee never leaves half a json behind.
void referee_write_atomic(const std::string& path, const std::string& text);
// "optr(oscar)" -> "optr_oscar": file-name safe.
std::string referee_slug(const std::string& s);
// 83.4 -> "1m23s", 4000 -> "1h06m", negative -> "?".
std::string referee_fmt_seconds(double s);
// "2026-12-01T09:00:00Z".
std::string referee_utc_now();
// The text of `path`, inflated when it is gzip-compressed (by its magic bytes); kvq::Error naming the file when it
// cannot be read or is a truncated or corrupt gzip stream.
std::string referee_read_maybe_gz(const std::string& path, const char* what);

}  // namespace kvq
