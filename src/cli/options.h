// Command-line options shared by the kvq subcommands: the model, threads and the KV-cache configuration.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "kv/cache.h"
#include "model/model.h"
#include "model/runner.h"
#include "tokenizer/tokenizer.h"

namespace kvq::cli {

struct ModelOptions {
  std::string dir;   // -m: Hugging Face checkpoint directory
  int threads = 0;   // -t: worker threads (0: all cores)
  std::string device = "cpu";     // --device: cpu | cuda (run, ppl, bench decode, eval, referee)
  std::string gpu_gemm = "bf16";  // --gpu-gemm: bf16 | fp32 GEMM inputs on the GPU
  std::string cuda_graphs = "on";  // --cuda-graphs: on | off, decode steps replayed as CUDA graphs
  bool dummy_weights = false;     // --dummy-weights: random weights of config.json's shapes (timing only)
  std::string simd;               // --simd: the CPU kernels' level ("": the best this CPU has)
  bool fold_values = false;       // --fold-values on (run, serve, bench decode): a value rotation folded into
                                  // W_V / W_O (model/value_fold.h); the fidelity commands never fold
};

struct CacheOptions {
  std::string type_k = "bf16", type_v = "bf16";  // -ctk / -ctv
  std::string type_both;                         // --kv-cache-dtype (sets both)
  int group = 0;                                 // --kv-group (0: not given: default_group(head_dim))
  float clip_k = -1, clip_v = -1;                // --kv-clip-k / --kv-clip-v (-1: the type's default)
  int sink = 64, recent = 256;                   // --kv-sink / --kv-recent
  std::string window_type;                       // --kv-window-type: bf16 | int8 ("": bf16, a preset's, f32 for f32)
  int page = 128;                                // --kv-page
  int demote_block = 0;                          // --kv-demote-block: CacheConfig::demote_block (0: the codecs' block)
  int chunk = 512;                               // -b: prefill chunk (tokens per forward)
  std::string rotation = "none";                 // --rotation: none | hadamard | FILE (bench decode: | random)
  bool random_rotation = false;                  // whether --rotation random is taken (bench decode: timing only)
  std::string pnmix;                             // --pnmix FILE: the key widths of -ctk pnmix (kvq calibrate
                                                 // --method pnmix), checked against the model by plan()
  std::string kv_scales;                         // --kv-scales FILE: vLLM's per-tensor FP8 scales (kvq calibrate
                                                 // --method fp8-scales), checked against the model by plan()
  std::string attn_rot;                          // --attn-rot: auto | off; "" (not given): auto, or off when the
                                                 // environment has llama.cpp's LLAMA_ATTN_ROT_DISABLE (atoi != 0)
  double kv_budget_gib = 0;                      // --kv-budget-gib: bytes of the page pool + windows (0: default)
  std::string skip_layers;                       // --kv-skip-layers: e.g. "0,1,-2,-1" ("": none)
  std::string prompt_policy = "decode-faithful";  // --prompt-policy (ppl, eval): CacheConfig::prompt_policy
  double evict_bits = 0;                         // --evict-bits: CacheConfig::evict_bits (evict only)
  int evict_ctx = 0;                             // --evict-ctx: CacheConfig::evict_ctx (evict only; 0: the prompt's end)
  // The cache of these flags for a model of head_dim (the default group: the largest of 128, 64, 32 dividing it);
  // validated later by KvCache / make_codec.
  CacheConfig config(int head_dim) const;
  // Whether the group was not given and a grouped codec takes the default one (plan() logs it).
  bool default_group_used() const;
};

// The prompt of each scored window (ppl, eval): --prompt-tokens P, or --prompt-fraction F (P = floor(F · ctx)).
struct PromptLength {
  int tokens = 0;
  double fraction = 0;
};

void add_model_options(CLI::App* cmd, ModelOptions& o);
// --simd LEVEL (the CPU kernels' instruction set) into `level`; a verb that loads no model through ModelOptions
// (bench attention, referee) takes it this way.
void add_simd_option(CLI::App* cmd, std::string& level);  // -m, -t, --dummy-weights
// --dummy-weights alone, for a command with its own -m (referee), so that it refuses them by name.
void add_dummy_weights_option(CLI::App* cmd, ModelOptions& o);
void add_cache_options(CLI::App* cmd, CacheOptions& o);
// --prompt-policy, --evict-bits, --evict-ctx, --prompt-tokens and --prompt-fraction, for the commands that score
// windows with a prompt (ppl, eval): the cache's prefill semantics and where each window's prompt ends.
void add_prompt_options(CLI::App* cmd, CacheOptions& c, PromptLength& p);
// --kv-budget-gib, for the commands whose runner's cache it sizes (run, ppl, bench decode).
void add_kv_budget_option(CLI::App* cmd, CacheOptions& o);
// --device, --gpu-gemm and --cuda-graphs, for the commands that run through a Runner (run, ppl, bench decode, eval,
// referee).
void add_device_options(CLI::App* cmd, ModelOptions& o);
// --fold-values on|off (default on): run, serve and bench decode fold a value rotation into the weights.
void add_fold_values_option(CLI::App* cmd, ModelOptions& o);

// What a command will run, validated before any weights are read: config.json, the context length (ctx_request,
// or the model's maximum when 0) and the KV-cache configuration (codecs, group, page size).
struct Plan {
  ModelConfig model;
  int ctx = 0;
  CacheConfig cache;  // with its KV transform (--rotation), null: none
  size_t kv_budget_bytes = 0;  // --kv-budget-gib: the runner's pool + windows (0: max_seqs x max_ctx on the CPU,
                               // a share of the free memory on the GPU; cuda::GpuModel)
  int default_group = 0;       // the group a grouped codec took without --kv-group (logged when the model loads), or 0
};
// beyond_trained_ctx (bench only): allow contexts past max_position_embeddings; the timing is real, the tokens are not.
Plan plan(const ModelOptions& m, const CacheOptions& c, int ctx_request, bool beyond_trained_ctx = false);

Tokenizer load_tokenizer(const ModelOptions& o);
// Loads the weights (logs one line: parameters, threads, load time; and the default --kv-group the plan took, if any).
// Refuses --dummy-weights (ModelSource takes them).
std::unique_ptr<Model> load_model(const ModelOptions& o, const Plan& p);

// --dummy-weights are for timing only: the commands that need a checkpoint's weights (run, ppl, eval, referee,
// calibrate) call this first and refuse them with one line naming the command.
void require_checkpoint(const ModelOptions& o, std::string_view command);

// The weights a command's runners read (bench decode): a host Model — a checkpoint's weights, or --dummy-weights
// --device cpu generated in host memory — or, for --dummy-weights --device cuda, none on the host: each GpuModel
// generates them in device memory (model/dummy_weights.h: the same values for the same seed).
struct ModelSource {
  ModelConfig config;
  std::unique_ptr<Model> host;  // null: dummy weights generated on the device
  bool dummy = false;           // random weights: timing only
  uint64_t seed = 0;            // the dummy weights' seed
  double load_seconds() const { return host ? host->load_seconds() : 0.0; }
  int threads() const { return host ? host->pool().size() : 0; }
};
// Loads or generates the weights as above; logs one line (dummy weights: "... timing only").
ModelSource load_model_source(const ModelOptions& o, const Plan& p);

// The one dispatch point between devices: a CpuRunner over model, or (--device cuda) a GpuModel built from its
// weights, with the plan's cache for max_seqs sequences of up to max_ctx tokens (its pool sized by the plan's
// kv_budget_bytes). model must outlive a CpuRunner.
std::unique_ptr<Runner> make_runner(Model& model, const ModelOptions& o, const Plan& p, int max_ctx, int max_seqs = 1);
// The same over a ModelSource: its host model, or a GpuModel generating dummy weights on the device. max_seqs 0: as
// many sequences of max_ctx tokens as the KV budget holds (CpuRunner / GpuModel; the CPU needs --kv-budget-gib).
std::unique_ptr<Runner> make_runner(ModelSource& model, const ModelOptions& o, const Plan& p, int max_ctx,
                                    int max_seqs = 1);
// --device cpu, or cuda with a device present and a valid --gpu-gemm; one kvq::Error line otherwise.
void check_device_available(const ModelOptions& o);
// What the GPU runs, checked without a device: no sliding windows, and (CUDA builds) a cache of the instance table.
void check_gpu_cache(const CacheConfig& cache, int head_dim);
// The same dispatch for evaluation passes (kvq eval / referee): each call builds a runner of the given cache (and
// its KV transform) on o.device. Checks the device (not the cache) once here; each cache when its runner is built.
RunnerFactory make_runner_factory(Model& model, const ModelOptions& o);
// One line on stderr: the runner's device and what its cache holds: pages, windows, MiB, tokens.
void log_runner(const Runner& r, const char* what);

// Rewrites llama.cpp-style multi-letter short flags (-ctk, -ctv, -np) to their long names for CLI11.
std::vector<std::string> expand_aliases(int argc, char** argv);

// One line on stderr: what the cache holds and its memory.
void log_cache(const KvCache& cache, const char* what);

}  // namespace kvq::cli
