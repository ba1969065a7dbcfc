// libFuzzer target: PN-Mix width files (kvq calibrate --method pnmix, --pnmix FILE: codecs/pnmix/pnmix_file.h),
// through the loader's own entry point on a file. Any input must either load into a width table of the sizes its
// metadata states (every head's widths the allocation of its stored scores) or raise kvq::Error; anything else is a
// bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "codecs/pnmix/pnmix_file.h"
#include "common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/kvq_fuzz_pnmix_" + std::to_string(::getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  try {
    const kvq::PnmixFile p = kvq::load_pnmix_file(path);
    const kvq::PairBitTable& t = p.table;
    if (t.bits.size() != size_t(t.n_layers) * t.n_kv_heads * t.pairs()) std::abort();
    if (p.scores.size() != t.bits.size()) std::abort();
  } catch (const kvq::Error&) {
  }
  return 0;
}
