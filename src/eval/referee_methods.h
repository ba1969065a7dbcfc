// The referee's method table: one row per method (docs/METHODS.md §5, §7) declares everything the referee does with it
// — its caches, its rotation, what it is calibrated and tuned on, whether windows change it, what it is judged
// against, whether the quick subset has it and its note for the report. The plan, the rotation and clip stores, the
// run records and the reports read the row; none of them branches on a method's name or cache type. A new method is
// a new row in referee_methods.cpp (and, for a new kind of rotation, a row of referee_rotations()). The window
// settings the rows run at are declared here too.
#pragma once

#include <string>
#include <vector>

#include "kv/cache.h"
#include "kv/codec.h"

namespace kvq {

struct ModelConfig;
struct KvTransform;

// One window setting of the referee's grid.
struct RefereeWindows {
  int sink = 64, recent = 256;  // S0 and W (tokens kept in the window codec, BF16)
  std::string label() const;    // "64/256"
};
// "64/256,0/0" -> windows; kvq::Error on anything but non-negative integer pairs or a repeat.
std::vector<RefereeWindows> parse_referee_windows(const std::string& list);

// A kind of key/value rotation the referee applies before the cache (one row each).
struct RefereeRotation {
  std::string name = "";    // "none" | "quarot" | "oscar" | "optr": RefereeMethod::rotation, calibrate's method
  bool calibrated = false;  // from --calib-data: a rotation file under OUT/rotations/
  bool learned = false;     // OptR-style: optimised from a base rotation with an objective, for the int2 grid
                            // (clips) and windows of its row, over calibration plus held-out chunks; else one file
                            // for every grid and window setting (OSCAR's statistics do not depend on them)
  KvTransform (*data_free)(const ModelConfig&) = nullptr;  // builds a data-free rotation (QuaRot); null: none, or
                                                           // calibrated
};

// Every rotation kind the referee knows.
const std::vector<RefereeRotation>& referee_rotations();
// The row named `name`; kvq::Error naming the known ones.
const RefereeRotation& referee_rotation(const std::string& name);

// One method of the referee: a row of referee_methods().
struct RefereeMethod {
  std::string label = "";              // "optr(oscar)": --methods, run keys, every table of the reports
  std::string key_type = "";           // cache type of the keys: bf16 | int8 | int4 | int2 | kivi2
  std::string value_type = "";         // cache type of the values (kivi2: per token; its keys per channel)
  std::string window_type = "bf16";    // codec of the sink/recent windows (CacheConfig::window)
  std::string rotation = "";           // a referee_rotations() name: none | quarot | oscar | optr
  std::string base = "";               // a learned rotation's starting rotation: quarot | oscar; else ""
  std::string objective = "";          // a learned rotation's objective: post-wo | joint | pre-wo | recon; else ""
  bool tunes_clips = false;            // --clip-grid tunes its (key, value) clips on held-out text (METHODS §7)
  std::string clips_from = "";         // the row whose tuned clips it takes ("": its own; OptR: its base's, the
                                       // grid its rotation is learned for)
  bool windows_matter = true;          // sink/recent windows change it: one run per window setting; false: one
                                       // run, its windows reading "any" (bf16)
  std::string baseline = "";           // the row it is judged against besides bf16 (paired tables; "": bf16 only)
  bool leakage = false;                // the method of the leakage row (calibrated on an eval file; one row)
  bool quick = false;                  // in the --quick subset (make demo, CI)
  std::string note = "";               // its line in results.json "notes" ("": none)

  const RefereeRotation& rotation_kind() const { return referee_rotation(rotation); }
  bool needs_calibration() const { return rotation_kind().calibrated; }
  // results.json method.type: the cache type, "K/V" when keys and values differ.
  std::string type() const { return key_type == value_type ? key_type : key_type + "/" + value_type; }
};

// Every method the referee knows, in report order.
const std::vector<RefereeMethod>& referee_methods();
// The row labelled `label`, or null.
const RefereeMethod* find_referee_method(const std::string& label);
// "bf16,int2+quarot" -> those methods; kvq::Error naming an unknown or repeated label.
std::vector<RefereeMethod> parse_referee_methods(const std::string& list);
// The --quick subset as a --methods list, in table order: "bf16,int8,int2,...".
std::string referee_quick_methods();

// The codec of a method's keys (is_key) or values from its cache type, exactly as the CLI's cache flags build it:
// kvq::codec_spec, the codec table's default clips and key layout (kv/codec_registry.h). The group is the caller's.
CodecSpec method_codec_spec(const std::string& type, bool is_key);

// The cache of a method at a window setting: its codecs at `group`, its window codec and the windows.
CacheConfig method_cache(const RefereeMethod& m, const RefereeWindows& w, int group);

}  // namespace kvq
