// PN-Mix calibration files (kvq calibrate --method pnmix; read by --pnmix FILE): the width of every RoPE pair of every
// (layer, kv head) of one model, as a safetensors file (the rotation files' machinery, rotation/rotation_file.h).
//
// Tensors, per layer i:
//   layers.{i}.pair_bits   U8  [n_kv_heads, d/2]  width of pair j (channels j, j + d/2), 1..4 bits
//   layers.{i}.pair_score  F32 [n_kv_heads, d/2]  the importance the widths were allocated from (calib/pnmix.h)
// Metadata "__metadata__": {"kvq_pnmix": JSON} with method "pnmix", score (product | energy), key_bits (the average B)
// and code_bits (B·d), the model fingerprint, calibration data file, sha256, tokens and chunk, n_layers, n_kv_heads,
// head_dim, kvq_version.
// Loading checks the structure, the shapes, every width in 1..4, finite non-negative scores, and that every head's
// widths are exactly the greedy allocation of its stored scores at code_bits: a changed width, score or budget is
// refused as corrupt (a change that leaves the allocation as it was changes nothing that is used).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "codecs/pnmix/codec_pnmix.h"

namespace kvq {

struct PnmixFile {
  PairBitTable table;         // the widths, named "pnmix(<score>)"
  std::vector<float> scores;  // [n_layers][n_kv_heads][d/2]
  nlohmann::json meta;        // the "kvq_pnmix" metadata object
};

// Writes the widths, their scores and meta (meta gains method, score-independent sizes, code_bits, key_bits,
// kvq_version; it should carry score, model_fingerprint and the calibration data's sha256).
void save_pnmix_file(const std::string& path, const PairBitTable& table, const std::vector<float>& scores,
                     nlohmann::json meta);

// Reads and validates a PN-Mix file (see above); one kvq::Error naming the file and what is wrong.
PnmixFile load_pnmix_file(const std::string& path);

// Refuses (kvq::Error) a file calibrated for another model (fingerprint), or for another shape (layers, kv heads,
// head_dim), each by name.
void check_pnmix_fits(const PnmixFile& f, const std::string& model_fingerprint, int n_layers, int n_kv_heads,
                      int head_dim);

}  // namespace kvq
