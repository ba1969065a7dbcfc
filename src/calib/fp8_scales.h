// vLLM's per-tensor FP8 scales from calibration text (kvq calibrate --method fp8-scales; the file and the rule:
// codecs/fp8/fp8_scales.h): the largest |value| of each layer's keys (post-RoPE, as the cache receives them) and of its
// values over the calibration chunks, then s = amax / fmax.
#pragma once

#include <cstdint>
#include <vector>

#include "calib/calibrate.h"
#include "codecs/fp8/fp8_scales.h"
#include "model/model.h"

namespace kvq {

struct Fp8Calibration {
  Fp8Scales scales;
  int tokens_used = 0, chunks = 0;
  double capture_seconds = 0;
};

// The scales of every layer for format from the calibration ids (cfg: method fp8-scales, tokens, chunk).
Fp8Calibration calibrate_fp8_scales(Model& model, const std::vector<int32_t>& ids, const CalibrateConfig& cfg,
                                    fp8::Format format, const CalibrateProgress& progress = {});

}  // namespace kvq
