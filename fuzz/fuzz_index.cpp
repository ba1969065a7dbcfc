// libFuzzer target: model.safetensors.index.json of a sharded checkpoint (model/safetensors.h). Any input must either
// parse into a non-empty weight map of plain shard file names (no directory part, no '..') or raise kvq::Error;
// anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/error.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto map = kvq::parse_safetensors_index(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    if (map.empty()) std::abort();
    for (const auto& [name, file] : map)
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
          file.find('\\') != std::string::npos || file.find('\0') != std::string::npos)
        std::abort();
  } catch (const kvq::Error&) {
  }
  return 0;
}
