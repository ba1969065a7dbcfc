// libFuzzer target: config.json as the loader reads it (model/config.h). Any input must either parse into a config
// whose sizes the rest of kvq can take (every field it reads validated: positive sizes within their limits, heads
// divisible by kv heads, an even head_dim, finite positive RoPE frequencies, one window per layer or none), or raise
// kvq::Error; anything else (a crash, a sanitizer report, another exception type) is a bug.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "model/config.h"
#include "model/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const nlohmann::json::exception&) {
    return 0;  // ModelConfig::load reports this as "not valid JSON" (tests/malformed)
  }
  try {
    const kvq::ModelConfig c = kvq::ModelConfig::parse(j, "fuzz");
    if (c.n_layers <= 0 || c.hidden_size <= 0 || c.vocab_size <= 0 || c.intermediate_size <= 0) std::abort();
    if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0 || c.head_dim <= 0 || c.head_dim % 2 != 0) std::abort();
    if (!c.layer_window.empty() && c.layer_window.size() != size_t(c.n_layers)) std::abort();
    for (int w : c.layer_window)
      if (w < 0) std::abort();
    for (float f : c.rope_inv_freq())
      if (!(f > 0) || !std::isfinite(f)) std::abort();
    // What the loader does next with the sizes: the tensor table of the checkpoint.
    if (kvq::model_tensors(c).size() < size_t(c.n_layers)) std::abort();
    (void)kvq::model_params(c);
  } catch (const kvq::Error&) {
  }
  return 0;
}
