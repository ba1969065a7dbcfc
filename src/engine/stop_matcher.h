// Stop strings over streamed text: releases text as soon as it cannot be the start of a stop string, holds back the
// longest tail that still could be, and cuts the output where the first stop string begins (OpenAI semantics: the
// stop string is not returned). Text goes in as complete UTF-8 (StreamDecoder); a held-back tail always starts at a
// character boundary because it is a prefix of a stop string.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvq {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops = {});  // empty strings are ignored

  // Appends text; returns the part that can be released now. Once a stop string appears, stopped() is true, the text
  // before it has been released and every later push returns "".
  std::string push(std::string_view text);
  // End of generation: the held-back tail (it holds no complete stop string).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not released yet: no stop string in it, every byte may start one
  bool stopped_ = false;
};

}  // namespace kvq
