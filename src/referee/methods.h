// The referee's method table: one row per method (docs/guide/methods.md §5, §7) declares everything the referee does
// with it — its caches, its rotation, what it is calibrated and tuned on, whether windows change it, what it is judged
// against, whether the quick subset has it, its note for the report, its camp and how the camp ships it (the as-shipped
// protocol's path). The plan, the rotation and clip stores, the run records and the reports read the row; none of them
// branches on a method's name or cache type. A new method is a new row in referee/methods.cpp (and, for a new kind of
// rotation, a row of referee_rotations()). The window settings the rows run at are declared here too.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "kv/cache.h"

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
  bool key_widths = false;  // PN-Mix: the calibration is the key codec's pair widths (codecs/pnmix/pnmix_file.h, a file
                            // under OUT/rotations/ like a rotation's), not a transform
  bool tensor_scales = false;  // vLLM's FP8: the calibration is each layer's per-tensor k_scale / v_scale
                               // (codecs/fp8/fp8_scales.h, a file under OUT/rotations/), not a transform
};

// Every rotation kind the referee knows.
const std::vector<RefereeRotation>& referee_rotations();
// The row named `name`; kvq::Error naming the known ones.
const RefereeRotation& referee_rotation(const std::string& name);

// The two protocols every camp is run under (METHODS §5): "common" — decode-faithful, the referee's window settings,
// no layer skipped, clips tuned where the format has one, llama.cpp's attn_rot off so that its rows are its formats
// alone — and "as-shipped" — the camp's own windows, layer skip, attn_rot and prompt semantics, every row (bf16
// included) scoring the second half of each window after a prompt of its first half.
enum class RefereeProtocol { Common, AsShipped };
std::string protocol_name(RefereeProtocol p);  // "common" | "as-shipped"
// "common,as-shipped" -> both, in that order; kvq::Error naming an unknown or repeated protocol.
std::vector<RefereeProtocol> parse_referee_protocols(const std::string& list);

// The prompt policies of the as-shipped protocol (what happens at the prompt boundary; eval's prompt scoring):
inline constexpr const char* kPromptDecodeFaithful = "decode-faithful";  // every query reads the cache as decode would
inline constexpr const char* kPromptExact = "exact-prompt";   // the prompt attends to exact K/V (TurboQuant's first
                                                              // prefill chunk, OScaR)
inline constexpr const char* kPromptQuantizeAfter = "quantize-after-prompt";  // the prompt is quantized once after
                                                                              // prefill, later tokens stay 16-bit
                                                                              // (NexusQuant)
inline constexpr const char* kPromptEvict = "evict";  // eviction rows (METHODS §5.8), under both protocols: sinks,
                                                      // recent window and the top prompt tokens kept after the prompt

// The prompt of an eviction row's windows, as a fraction of each (both protocols): the eviction is decided after the
// first 15/16 and the last 1/16 is scored. Every token after the prompt is kept (bf16) inside the budget, which must
// also hold the windows, so the scored continuation must be short: at int2's bytes with 64/256 windows it fits from
// ctx 576 on (int2 at 2048 stores 563 BF16 tokens' bytes: 320 window tokens, 128 after the prompt, 115 chosen). Every
// referee run records its NLL over the same last 1/16 (EvalConfig::tail_fraction), so the eviction row is paired with
// every other run on the targets it scored.
inline constexpr double kEvictPromptFraction = 0.9375;

// How a camp ships its method: the path of its "as shipped" row (METHODS §5).
struct ShippedPath {
  bool defined = false;                     // false: the row has no as-shipped run (kvq's own rows)
  RefereeWindows windows{0, 0};             // the camp's own sink/recent windows
  int demote_block = 0;                     // tokens demoted at once (CacheConfig::demote_block; 0: the codecs' block)
  std::string skip_layers = "";             // layers kept in BF16, --kv-skip-layers form ("0,1,-2,-1"; "": none)
  std::string prompt = kPromptDecodeFaithful;  // its prompt policy
  std::string note = "";                    // how kvq's as-shipped row differs from the camp's own path ("": not)
};

// One method of the referee: a row of referee_methods().
struct RefereeMethod {
  std::string label = "";              // "optr(oscar)": --methods, run keys, every table of the reports
  std::string key_type = "";           // cache type of the keys: a codec table name (bf16, int2, kivi2, tq4nc, ...)
  std::string value_type = "";         // cache type of the values (kivi2: per token; its keys per channel)
  std::string window_type = "bf16";    // codec of the sink/recent windows (CacheConfig::window)
  std::string rotation = "";           // a referee_rotations() name: none | quarot | oscar | optr
  std::string base = "";               // a learned rotation's starting rotation: quarot | oscar; else ""
  std::string objective = "";          // a learned rotation's objective: post-wo | joint | pre-wo | recon; else ""
  std::string pnmix_score = "";        // PN-Mix widths' pair importance: product | energy (calib/pnmix.h); else ""
  double pnmix_key_bits = 2.0;         // PN-Mix: the average code bits per key element its widths are given
  bool tunes_clips = false;            // --clip-grid tunes its (key, value) clips on held-out text (METHODS §7)
  std::string clips_from = "";         // the row whose tuned clips it takes ("": its own; OptR: its base's, the
                                       // grid its rotation is learned for)
  bool windows_matter = true;          // sink/recent windows change it: one run per window setting; false: one
                                       // run, its windows reading "any" (bf16)
  std::string baseline = "";           // the row it is judged against besides bf16 (paired tables; "": bf16 only)
  bool leakage = false;                // the method of the leakage row (calibrated on an eval file; one row)
  bool quick = false;                  // in the --quick subset (make demo, CI)
  std::string note = "";               // its line in results.json "notes" ("": none)
  std::string camp = "kvq";            // whose method: kvq | KIVI | TurboQuant (vLLM) | NexusQuant | OScaR | Kitty |
                                       // llama.cpp | KV4-RL | LORE-KV (AnDPro-style) (the claims table and the
                                       // report's labels)
  std::string equal_bytes = "";        // an eviction row (METHODS §5.8, prompt policy evict, kv/evict.h): the row
                                       // whose stored bytes at each ctx, at the same windows, are its budget
                                       // (method_equal_bytes_bits); "": not an eviction row
  bool kvq_extension = false;          // a camp's format at a setting the camp does not ship (labelled so)
  ShippedPath shipped{};               // its as-shipped path (the as-shipped protocol runs the rows that have one)

  const RefereeRotation& rotation_kind() const { return referee_rotation(rotation); }
  bool needs_calibration() const { return rotation_kind().calibrated; }
  // results.json method.type: the cache type, "K/V" when keys and values differ.
  std::string type() const { return key_type == value_type ? key_type : key_type + "/" + value_type; }
  bool evicts() const { return !equal_bytes.empty(); }
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
// kvq::codec_spec, the codec table's default clips and key layout (codecs/registry.h). The group is the caller's.
CodecSpec method_codec_spec(const std::string& type, bool is_key);

// The cache of a method at a window setting: its codecs at `group` (formats with their own groups ignore it), its
// window codec and the windows; under the as-shipped protocol the row's own windows (w is ignored), demotion block and
// skipped layers.
// The transform is method_transform's.
CacheConfig method_cache(const RefereeMethod& m, const RefereeWindows& w, int group,
                         RefereeProtocol protocol = RefereeProtocol::Common);
// Whether llama.cpp's KV rotation (attn_rot), which its cache types imply, is on for m under `protocol`: on as
// shipped (llama.cpp's default), off on the common protocol; false for rows whose codecs do not imply it.
bool method_attn_rot(const RefereeMethod& m, RefereeProtocol protocol);
// The transform the cache's codecs imply (TurboQuant's key Hadamard, OScaR's, llama.cpp's attn_rot when
// method_attn_rot), built for the model's shape; null when none.
std::shared_ptr<const KvTransform> method_transform(const RefereeMethod& m, RefereeProtocol protocol,
                                                    const CacheConfig& cache, int n_layers, int n_kv_heads,
                                                    int head_dim);
// The prompt policy of m's runs under `protocol` (common: decode-faithful, but evict for an eviction row).
std::string method_prompt_policy(const RefereeMethod& m, RefereeProtocol protocol);

// An eviction row's budget at context ctx: the effective bits its paired row (m.equal_bytes) stores at ctx with the
// windows w (its cache on the common protocol at `group`, for the model's KV shape) — bytes counted as for every row
// (CacheLayout::footprint), so the eviction row stores them too at ctx and lands in that row's equal-bit band.
double method_equal_bytes_bits(const RefereeMethod& m, const RefereeWindows& w, int group, int ctx, int n_layers,
                               int n_kv_heads, int head_dim);
// c's budget for an eviction row at ctx (c.evict_bits = method_equal_bytes_bits, c.evict_ctx = ctx: the cache of a
// ctx-token window stores the paired row's bytes); nothing for the other rows.
void set_equal_bytes_budget(CacheConfig& c, const RefereeMethod& m, const RefereeWindows& w, int group, int ctx,
                            int n_layers, int n_kv_heads, int head_dim);

}  // namespace kvq
