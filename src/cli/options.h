// Command-line options shared by the kvq subcommands: the model, threads and the KV-cache configuration.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kv/cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace kvq::cli {

struct ModelOptions {
  std::string dir;   // -m: Hugging Face checkpoint directory
  int threads = 0;   // -t: worker threads (0: all cores)
};

struct CacheOptions {
  std::string type_k = "bf16", type_v = "bf16";  // -ctk / -ctv
  std::string type_both;                         // --kv-cache-dtype (sets both)
  int group = 128;                               // --kv-group
  float clip_k = 0.96f, clip_v = 0.92f;          // --kv-clip-k / --kv-clip-v
  int sink = 64, recent = 256;                   // --kv-sink / --kv-recent
  int page = 128;                                // --kv-page
  int chunk = 512;                               // -b: prefill chunk (tokens per forward)
  CacheConfig config() const;                    // validated later by KvCache / make_codec
};

void add_model_options(CLI::App* cmd, ModelOptions& o);
void add_cache_options(CLI::App* cmd, CacheOptions& o);

struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
Loaded load(const ModelOptions& o);

// Context length to use: ctx if > 0 (checked against the model's maximum), else the model's maximum.
int resolve_ctx(const Model& m, int ctx);

// Rewrites llama.cpp-style multi-letter short flags (-ctk, -ctv) to their long names for CLI11.
std::vector<std::string> expand_aliases(int argc, char** argv);

// One line on stderr: what the cache holds and its memory.
void log_cache(const KvCache& cache, const char* what);

}  // namespace kvq::cli
