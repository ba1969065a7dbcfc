#include "common/error.h"

namespace kvq {

Error::Error(std::string what, std::string where, std::string hint)
    : std::runtime_error(std::move(what)), where_(std::move(where)), hint_(std::move(hint)) {}

std::string Error::message() const {
  std::string line = what();
  if (!hint_.empty()) line += " — " + hint_;
  return line;
}

}  // namespace kvq
