// libFuzzer target: FP8 scales files (kvq calibrate --method fp8-scales, --kv-scales FILE: codecs/fp8/fp8_scales.h),
// through the loader's own entry point on a file. Any input must either load into scales of the layer count its
// metadata states (each one its amax / fmax, finite and positive) or raise kvq::Error; anything else is a bug.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "codecs/fp8/fp8_scales.h"
#include "common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/kvq_fuzz_fp8_scales_" + std::to_string(::getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  try {
    const kvq::Fp8Scales s = kvq::load_fp8_scales(path);
    const size_t n = size_t(s.n_layers());
    if (n == 0 || s.v_scale.size() != n || s.k_amax.size() != n || s.v_amax.size() != n) std::abort();
    for (size_t l = 0; l < n; ++l)
      if (!(s.k_scale[l] > 0.f) || !(s.v_scale[l] > 0.f) || !std::isfinite(s.k_scale[l])) std::abort();
  } catch (const kvq::Error&) {
  }
  return 0;
}
