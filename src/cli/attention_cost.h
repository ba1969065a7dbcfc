// The referee's cost column (RefereeConfig::cost_probe): kvq bench attention's measurement of one decode step of a
// row's cache at a fixed shape, on the device the referee evaluates on.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kv/cache.h"
#include "simd/simd.h"

namespace kvq::cli {

struct CostShape {
  int batch = 8, ctx = 32768;  // sequences of one decode query each, tokens in each sequence's cache
  int q_heads = 32, kv_heads = 8, head_dim = 128;
  int iters = 10;              // timed steps (median)
  std::string text() const;    // "8 x 32768, q32/kv8/d128"
};

// "BxN" (e.g. 8x32768) -> the shape; throws kvq::Error naming the form.
CostShape parse_cost_shape(const std::string& s);

// A probe on device "cpu" (threads, simd: the kernels' level) or "cuda": for a cache config (codecs, windows), the
// transform its codecs imply added, {"shape", "device", "attention_us", "bytes_read", "read_probe_gbps",
// "fraction_of_read_probe"} at shape, and the same at model_shape (the evaluated model's heads at the referee's
// context) under "model_shape" when given ({"shape", "unsupported"} when the device refuses it there). The read probe
// is measured once, at the first call. Throws kvq::Error for a cache the device does not run at shape.
std::function<nlohmann::json(const CacheConfig&)> attention_cost_probe(const std::string& device,
                                                                        const CostShape& shape,
                                                                        const std::optional<CostShape>& model_shape,
                                                                        int threads, SimdLevel simd);

}  // namespace kvq::cli
