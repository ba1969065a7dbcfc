// vLLM's per-tensor FP8 scales (k_scale, v_scale of each attention layer) as a calibration file: kvq calibrate
// --method fp8-scales writes one, --kv-scales FILE reads it for an fp8 / fp8_e5m2 cache (codecs/fp8/fp8.h: code =
// fp8(x / s), x̂ = fp8⁻¹(code) · s, s the layer's k_scale for keys, v_scale for values; without a file s = 1.0, vLLM's
// default).
//
// The rule is the static per-tensor scheme FP8 checkpoints ship (llm-compressor / ModelOpt kv_cache_scheme): s = amax /
// fmax, amax the largest |value| of the layer's post-RoPE keys (values) over the calibration tokens and fmax the
// format's largest finite value (448 e4m3, 57344 e5m2), so the calibration's largest element maps to the top of the
// range. (vLLM's --calculate-kv-scales takes amax / 200 and amax / 100 from the first batch instead: more headroom,
// fewer mantissa bits in use.)
//
// A safetensors file (the rotation files' machinery):
//   k_amax, v_amax    F32 [n_layers]   the calibration maxima
//   k_scale, v_scale  F32 [n_layers]   amax / fmax, as the caches use them
// Metadata "__metadata__": {"kvq_fp8_scales": JSON} with method "fp8-scales", format (e4m3 | e5m2), n_layers, the model
// fingerprint, calibration data file, sha256 and tokens, kvq_version. Loading refuses a scale that is not finite and
// positive or not its amax / fmax (corrupt), and a file of another model or layer count (check_fp8_scales_fit).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "codecs/fp8/fp8.h"

namespace kvq {

struct Fp8Scales {
  fp8::Format format = fp8::Format::kE4m3;  // the format the scales were set for (its fmax)
  std::vector<float> k_amax, v_amax;        // [n_layers]
  std::vector<float> k_scale, v_scale;      // [n_layers]
  nlohmann::json meta;                      // the "kvq_fp8_scales" metadata object
  std::string path;                         // the file read (empty when made in memory)

  int n_layers() const { return int(k_scale.size()); }
  // Scales amax / fmax of format from the calibration maxima (a zero amax takes the smallest positive scale, so that
  // no division by zero is stored: such a layer's rows are all zero and stay so).
  static Fp8Scales from_amax(fp8::Format format, std::vector<float> k_amax, std::vector<float> v_amax);
};

// The largest finite value of a format (448, 57344) and its name ("e4m3", "e5m2").
float fp8_max(fp8::Format f);
const char* fp8_format_name(fp8::Format f);

void save_fp8_scales(const std::string& path, const Fp8Scales& s, nlohmann::json meta);
// Reads and validates a scales file (see above); one kvq::Error naming the file and what is wrong.
Fp8Scales load_fp8_scales(const std::string& path);
// Refuses (kvq::Error) a file of another model (fingerprint; a dummy-weights model has none and takes any file of its
// layer count) or another layer count.
void check_fp8_scales_fit(const Fp8Scales& s, const std::string& model_fingerprint, int n_layers);

}  // namespace kvq
