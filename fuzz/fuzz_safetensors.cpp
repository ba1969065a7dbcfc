// libFuzzer target: the safetensors header parser on arbitrary bytes. Any input must either parse into a header
// whose tensors all lie inside the data section without overlapping, or raise kvq::Error; anything else (a crash,
// a sanitizer report, another exception type) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/error.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kvq::SafeTensorsHeader h = kvq::parse_safetensors_header(data, size, "fuzz");
    size_t prev_end = 0;
    for (const kvq::TensorInfo& t : h.tensors) {  // sorted by begin: check the invariants the parser promises
      if (t.end > size - h.data_start || t.begin > t.end) std::abort();
      if (t.nbytes() > 0 && t.begin < prev_end) std::abort();
      if (size_t(t.numel()) * kvq::dtype_size(t.dtype) != t.nbytes()) std::abort();
      if (t.nbytes() > 0) prev_end = t.end;
    }
  } catch (const kvq::Error&) {
  }
  return 0;
}
