// libFuzzer target: rotation files (kvq calibrate's output, --rotation FILE: rotation/rotation_file.h), through the
// loader's own entry point on a file. Any input must either load into a transform of the sizes its metadata states,
// with orthogonal matrices and finite key means, or raise kvq::Error; anything else (a crash, an allocation the file
// cannot back, another exception type) is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "rotation/rotation_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/kvq_fuzz_rotation_" + std::to_string(::getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  try {
    const kvq::RotationFile r = kvq::load_rotation_file(path);
    const kvq::KvTransform& t = r.transform;
    const size_t mats = size_t(t.n_layers) * t.n_kv_heads * t.head_dim * t.head_dim;
    if (t.r_k.size() != mats || t.r_v.size() != mats) std::abort();
    if (!t.key_mean.empty() && t.key_mean.size() != size_t(t.n_layers) * t.n_kv_heads * t.head_dim) std::abort();
  } catch (const kvq::Error&) {
  }
  return 0;
}
