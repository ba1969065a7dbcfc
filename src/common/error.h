// kvq::Error — the one error channel of the library.
// Library code throws it with what went wrong, where (file:line or the input it concerns) and, where one
// exists, a hint for the user. The CLI catches it, prints one line, and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace kvq {

class Error : public std::runtime_error {
 public:
  Error(std::string what, std::string where = {}, std::string hint = {});

  const std::string& where() const { return where_; }
  const std::string& hint() const { return hint_; }
  // One line for the user: "what (where) — hint".
  std::string message() const;

 private:
  std::string where_;
  std::string hint_;
};

// The device is lost: an error that leaves it unusable for every later call (CUDA's sticky errors: an illegal address,
// a launch failure, an uncorrectable ECC error, ...; cuda/runtime.cpp). Whoever serves requests stops admitting work
// and reports itself unhealthy (kvq serve: /health 503) instead of failing every later step.
class DeviceLost : public Error {
 public:
  using Error::Error;
};

}  // namespace kvq

#define KVQ_STR2(x) #x
#define KVQ_STR(x) KVQ_STR2(x)
#define KVQ_WHERE (__FILE__ ":" KVQ_STR(__LINE__))

// KVQ_CHECK(cond, "format {}", args...): throw kvq::Error with the formatted message when cond is false.
#define KVQ_CHECK(cond, ...)                                          \
  do {                                                                \
    if (!(cond)) throw ::kvq::Error(fmt::format(__VA_ARGS__), KVQ_WHERE); \
  } while (0)

// KVQ_FAIL("format {}", args...): throw unconditionally.
#define KVQ_FAIL(...) throw ::kvq::Error(fmt::format(__VA_ARGS__), KVQ_WHERE)
