#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/mapped_file.h"

namespace kvq {
namespace {

using json = nlohmann::json;

[[noreturn]] void config_fail(std::string_view where, const std::string& msg) {
  throw Error(fmt::format("{}: {}", where, msg), std::string(where));
}

// j[key] when present and not null.
const json* field(const json& j, const char* key) {
  const auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}

std::optional<int> opt_int(const json& j, const char* key, std::string_view where) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) config_fail(where, fmt::format("\"{}\" must be an integer, got {}", key, v->dump()));
  const int64_t x = v->get<int64_t>();
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) {
    config_fail(where, fmt::format("\"{}\" = {} is out of range", key, x));
  }
  return int(x);
}

int req_int(const json& j, const char* key, std::string_view where) {
  const std::optional<int> v = opt_int(j, key, where);
  if (!v) config_fail(where, fmt::format("missing required field \"{}\"", key));
  return *v;
}

std::optional<double> opt_double(const json& j, const char* key, std::string_view where) {
  const json* v = field(j, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) config_fail(where, fmt::format("\"{}\" must be a number, got {}", key, v->dump()));
  return v->get<double>();
}

double req_double(const json& j, const char* key, std::string_view where) {
  const std::optional<double> v = opt_double(j, key, where);
  if (!v) config_fail(where, fmt::format("missing required field \"{}\"", key));
  return *v;
}

bool opt_bool(const json& j, const char* key, bool fallback, std::string_view where) {
  const json* v = field(j, key);
  if (!v) return fallback;
  if (!v->is_boolean()) config_fail(where, fmt::format("\"{}\" must be true or false, got {}", key, v->dump()));
  return v->get<bool>();
}

std::string opt_string(const json& j, const char* key, std::string_view where) {
  const json* v = field(j, key);
  if (!v) return {};
  if (!v->is_string()) config_fail(where, fmt::format("\"{}\" must be a string, got {}", key, v->dump()));
  return v->get<std::string>();
}

// Reads the scaling part of "rope_scaling" (or transformers-5 "rope_parameters") into rope.
void parse_rope_scaling(const json& s, const char* key, RopeConfig& rope, std::string_view where) {
  if (!s.is_object()) config_fail(where, fmt::format("\"{}\" must be an object, got {}", key, s.dump()));
  std::string type = opt_string(s, "rope_type", where);
  if (type.empty()) type = opt_string(s, "type", where);
  if (type.empty()) config_fail(where, fmt::format("\"{}\" has no \"rope_type\"", key));
  if (const std::optional<double> partial = opt_double(s, "partial_rotary_factor", where); partial && *partial != 1.0)
    config_fail(where, fmt::format("unsupported \"{}\".partial_rotary_factor {} (RoPE on part of each head; "
                                   "supported: 1)", key, *partial));
  if (type == "default") return;
  if (type != "llama3") {
    config_fail(where, fmt::format("unsupported rope type '{}' in \"{}\" (supported: default, llama3)", type, key));
  }
  rope.type = type;
  rope.factor = req_double(s, "factor", where);
  rope.low_freq_factor = req_double(s, "low_freq_factor", where);
  rope.high_freq_factor = req_double(s, "high_freq_factor", where);
  rope.original_max_position = req_int(s, "original_max_position_embeddings", where);
  if (!(rope.factor > 0) || !(rope.low_freq_factor > 0) || !(rope.high_freq_factor > rope.low_freq_factor) ||
      rope.original_max_position <= 0) {
    config_fail(where, fmt::format("invalid llama3 rope scaling: factor {}, low_freq_factor {}, high_freq_factor {}, "
                                   "original_max_position_embeddings {} (need all > 0 and high > low)",
                                   rope.factor, rope.low_freq_factor, rope.high_freq_factor,
                                   rope.original_max_position));
  }
}

RopeConfig parse_rope(const json& j, std::string_view where) {
  RopeConfig rope;
  const std::optional<double> top_theta = opt_double(j, "rope_theta", where);
  if (const json* params = field(j, "rope_parameters")) {  // transformers >= 5
    if (!params->is_object()) config_fail(where, "\"rope_parameters\" must be an object");
    const std::optional<double> theta = opt_double(*params, "rope_theta", where);
    if (theta && top_theta && *theta != *top_theta) {
      config_fail(where, fmt::format("\"rope_theta\" {} disagrees with rope_parameters.rope_theta {}", *top_theta,
                                     *theta));
    }
    rope.theta = theta ? *theta : top_theta.value_or(10000.0);
    parse_rope_scaling(*params, "rope_parameters", rope, where);
  } else {
    rope.theta = top_theta.value_or(10000.0);  // the transformers default for all three families
    if (const json* s = field(j, "rope_scaling")) parse_rope_scaling(*s, "rope_scaling", rope, where);
  }
  if (!(rope.theta > 0) || !std::isfinite(rope.theta)) {
    config_fail(where, fmt::format("rope_theta {} must be > 0", rope.theta));
  }
  return rope;
}

// What the supported families can switch on that kvq does not run: refused, naming the field, rather than running a
// different model.
void refuse_unsupported_features(const json& j, std::string_view where) {
  if (const json* q = field(j, "quantization_config")) {
    const std::string method = q->is_object() && q->contains("quant_method") ? q->at("quant_method").dump() : "?";
    config_fail(where, fmt::format("\"quantization_config\" (quant_method {}): quantized checkpoints are not "
                                   "supported; kvq reads F32, F16 and BF16 weights", method));
  }
  for (const char* moe : {"num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok",
                          "moe_intermediate_size"}) {
    const json* v = field(j, moe);
    if (v && !(v->is_number() && v->get<double>() == 0))
      config_fail(where, fmt::format("\"{}\" = {}: mixture-of-experts layers are not supported", moe, v->dump()));
  }
  if (const std::optional<double> partial = opt_double(j, "partial_rotary_factor", where); partial && *partial != 1.0)
    config_fail(where, fmt::format("unsupported partial_rotary_factor {} (RoPE on part of each head; supported: 1)",
                                   *partial));
  for (const char* cap : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (const json* v = field(j, cap))
      config_fail(where, fmt::format("\"{}\" = {}: logit soft-capping is not supported", cap, v->dump()));
}

// The window of each layer (ModelConfig::layer_window): the window size the family reads ("sliding_window": always for
// Mistral, only with "use_sliding_window" for Qwen2 / Qwen3; Llama has none; absent: transformers' default 4096, null:
// none), on the layers "layer_types" names "sliding_attention", or by default every layer (Mistral) or those from
// "max_window_layers" on (Qwen2 / Qwen3), as transformers' configuration classes derive layer_types.
std::vector<int> parse_layer_windows(const json& j, const ModelConfig& c, std::string_view where) {
  if (c.arch == Arch::Llama) return {};
  const bool qwen = c.arch == Arch::Qwen2 || c.arch == Arch::Qwen3;
  std::vector<bool> slides(size_t(c.n_layers), !qwen);
  if (const json* types = field(j, "layer_types")) {
    if (!types->is_array() || types->size() != size_t(c.n_layers))
      config_fail(where, fmt::format("\"layer_types\" must be an array of num_hidden_layers = {} strings, got {}",
                                     c.n_layers, types->dump()));
    for (size_t l = 0; l < types->size(); ++l) {
      const json& t = (*types)[l];
      if (t == "full_attention" || t == "sliding_attention") {
        slides[l] = t == "sliding_attention";
        continue;
      }
      config_fail(where, fmt::format("unsupported \"layer_types\"[{}] = {} (supported: \"full_attention\", "
                                     "\"sliding_attention\")", l, t.dump()));
    }
  } else if (qwen) {
    const int first = opt_int(j, "max_window_layers", where).value_or(28);  // transformers' default
    for (int l = std::max(first, 0); l < c.n_layers; ++l) slides[size_t(l)] = true;
  }
  if (qwen && !opt_bool(j, "use_sliding_window", false, where)) return {};
  constexpr int kDefaultWindow = 4096;  // MistralConfig's, Qwen2Config's and Qwen3Config's default sliding_window
  const std::optional<int> size = j.contains("sliding_window") ? opt_int(j, "sliding_window", where) : kDefaultWindow;
  if (size && *size <= 0) config_fail(where, fmt::format("\"sliding_window\" = {} must be positive", *size));
  const int window = size.value_or(0);
  if (window == 0 || std::find(slides.begin(), slides.end(), true) == slides.end()) return {};
  std::vector<int> out(size_t(c.n_layers), 0);
  for (size_t l = 0; l < out.size(); ++l) out[l] = slides[l] ? window : 0;
  return out;
}

}  // namespace

std::string_view arch_name(Arch arch) {
  switch (arch) {
    case Arch::Qwen3: return "qwen3";
    case Arch::Qwen2: return "qwen2";
    case Arch::Llama: return "llama";
    case Arch::Mistral: return "mistral";
  }
  return "?";
}

ModelConfig ModelConfig::load(const std::string& path) {
  const std::string text = read_file_bytes(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    config_fail(path, fmt::format("not valid JSON: {}", e.what()));
  }
  return parse(j, path);
}

ModelConfig ModelConfig::parse(const json& j, std::string_view where) {
  if (!j.is_object()) config_fail(where, "config must be a JSON object");
  ModelConfig c;
  c.model_type = opt_string(j, "model_type", where);
  if (c.model_type.empty()) {
    config_fail(where, "missing required field \"model_type\" (supported: qwen3, qwen2, llama, mistral)");
  } else if (c.model_type == "qwen3") {
    c.arch = Arch::Qwen3;
  } else if (c.model_type == "qwen2") {
    c.arch = Arch::Qwen2;
  } else if (c.model_type == "llama") {
    c.arch = Arch::Llama;
  } else if (c.model_type == "mistral") {
    c.arch = Arch::Mistral;
  } else {
    config_fail(where, fmt::format("unsupported model_type '{}' (supported: qwen3, qwen2, llama, mistral)",
                                   c.model_type));
  }
  refuse_unsupported_features(j, where);

  c.vocab_size = req_int(j, "vocab_size", where);
  c.hidden_size = req_int(j, "hidden_size", where);
  c.intermediate_size = req_int(j, "intermediate_size", where);
  c.n_layers = req_int(j, "num_hidden_layers", where);
  c.n_heads = req_int(j, "num_attention_heads", where);
  c.max_ctx = req_int(j, "max_position_embeddings", where);
  const double eps = req_double(j, "rms_norm_eps", where);
  // Positive, and within limits far above any published model's (which keep a corrupt config from sizing tables of
  // billions of entries before the checkpoint is even opened).
  struct Limit {
    const char* name;
    int value, most;
  };
  for (const Limit& f : {Limit{"vocab_size", c.vocab_size, 1 << 24}, Limit{"hidden_size", c.hidden_size, 1 << 17},
                         Limit{"intermediate_size", c.intermediate_size, 1 << 20},
                         Limit{"num_hidden_layers", c.n_layers, 1024}, Limit{"num_attention_heads", c.n_heads, 1024},
                         Limit{"max_position_embeddings", c.max_ctx, 1 << 30}}) {
    if (f.value <= 0) config_fail(where, fmt::format("\"{}\" = {} must be positive", f.name, f.value));
    if (f.value > f.most)
      config_fail(where, fmt::format("\"{}\" = {} is implausibly large (at most {})", f.name, f.value, f.most));
  }
  c.n_kv_heads = opt_int(j, "num_key_value_heads", where).value_or(c.n_heads);
  if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0) {
    config_fail(where, fmt::format("num_attention_heads {} is not divisible by num_key_value_heads {}", c.n_heads,
                                   c.n_kv_heads));
  }
  if (const std::optional<int> hd = opt_int(j, "head_dim", where)) {
    c.head_dim = *hd;
  } else {
    if (c.hidden_size % c.n_heads != 0) {
      config_fail(where, fmt::format("no \"head_dim\" and hidden_size {} is not divisible by num_attention_heads {}",
                                     c.hidden_size, c.n_heads));
    }
    c.head_dim = c.hidden_size / c.n_heads;
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0 || c.head_dim > 4096) {
    config_fail(where, fmt::format("head_dim {} must be positive and even (RoPE rotates pairs), at most 4096",
                                   c.head_dim));
  }
  if (!(eps > 0) || !(eps < 1)) config_fail(where, fmt::format("rms_norm_eps {} must be in (0, 1)", eps));
  c.rms_eps = float(eps);
  c.rope = parse_rope(j, where);

  // Features these families can switch on that kvq does not implement: refuse rather than run a different model.
  const std::string act = opt_string(j, "hidden_act", where);
  if (!act.empty() && act != "silu") {
    config_fail(where, fmt::format("unsupported hidden_act '{}' (supported: silu)", act));
  }
  c.layer_window = parse_layer_windows(j, c, where);
  if (opt_bool(j, "mlp_bias", false, where)) config_fail(where, "mlp_bias=true is not supported");
  if (c.arch != Arch::Qwen2 && opt_bool(j, "attention_bias", false, where)) {
    config_fail(where, fmt::format("attention_bias=true is not supported for model_type {}", c.model_type));
  }
  c.qk_norm = c.arch == Arch::Qwen3;
  c.qkv_bias = c.arch == Arch::Qwen2;
  c.tie_embeddings = opt_bool(j, "tie_word_embeddings", false, where);

  if (const json* eos = field(j, "eos_token_id")) {
    const json list = eos->is_array() ? *eos : json::array({*eos});
    for (const json& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= c.vocab_size) {
        config_fail(where, fmt::format("eos_token_id {} must be an integer in [0, vocab_size {})", id.dump(),
                                       c.vocab_size));
      }
      c.eos_token_ids.push_back(id.get<int>());
    }
  }
  if (const std::optional<int> bos = opt_int(j, "bos_token_id", where)) {
    if (*bos < 0 || *bos >= c.vocab_size) {
      config_fail(where, fmt::format("bos_token_id {} must be in [0, vocab_size {})", *bos, c.vocab_size));
    }
    c.bos_token_id = *bos;
  }
  const double init_std = opt_double(j, "initializer_range", where).value_or(0.02);  // transformers' default
  if (!(init_std > 0) || !(init_std < 1)) {
    config_fail(where, fmt::format("initializer_range {} must be in (0, 1)", init_std));
  }
  c.initializer_range = float(init_std);
  c.name_or_path = opt_string(j, "_name_or_path", where);
  c.torch_dtype = opt_string(j, "torch_dtype", where);
  if (c.torch_dtype.empty()) c.torch_dtype = opt_string(j, "dtype", where);  // transformers >= 5
  return c;
}

int ModelConfig::sliding_window() const {
  int w = 0;
  for (int x : layer_window) w = std::max(w, x);
  return w;
}

int64_t ModelConfig::n_params() const {
  const int64_t h = hidden_size, q = int64_t(n_heads) * head_dim, kv = int64_t(n_kv_heads) * head_dim;
  int64_t layer = h * q + 2 * h * kv + q * h  // q, k, v, o projections
                  + 3 * h * intermediate_size   // gate, up, down
                  + 2 * h;                      // input and post-attention norms
  if (qk_norm) layer += 2 * head_dim;
  if (qkv_bias) layer += q + 2 * kv;
  const int64_t embed = int64_t(vocab_size) * h;
  return embed * (tie_embeddings ? 1 : 2) + n_layers * layer + h;  // + the final norm
}

std::vector<float> ModelConfig::rope_inv_freq() const {
  // Mirrors transformers' float32 arithmetic: inv_freq = 1 / theta ** (arange(0, d, 2) / d).
  const int half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    const float exponent = float(2 * i) / float(head_dim);
    inv[size_t(i)] = 1.0f / std::pow(float(rope.theta), exponent);
  }
  if (rope.type != "llama3") return inv;

  // _compute_llama3_parameters: keep high frequencies, divide low ones by factor, blend in between.
  const float factor = float(rope.factor);
  const float low_freq_factor = float(rope.low_freq_factor);
  const float freq_factor_span = float(rope.high_freq_factor - rope.low_freq_factor);
  const float old_ctx = float(rope.original_max_position);
  const float low_freq_wavelen = float(double(rope.original_max_position) / rope.low_freq_factor);
  const float high_freq_wavelen = float(double(rope.original_max_position) / rope.high_freq_factor);
  const float two_pi = float(2.0 * M_PI);
  for (float& f : inv) {
    const float wavelen = (1.0f / f) * two_pi;
    float scaled = wavelen > low_freq_wavelen ? f / factor : f;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) {
      const float smooth = ((1.0f / wavelen) * old_ctx - low_freq_factor) / freq_factor_span;
      scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
    }
    f = scaled;
  }
  return inv;
}

}  // namespace kvq
