// Writes a real-size checkpoint of random weights to disk, for measuring the load path users take (issue 39):
//   kvq_dummy_checkpoint SHAPE_DIR OUT_DIR [--shard-gib 2]
// SHAPE_DIR holds a config.json (models/shapes/qwen3-8b); OUT_DIR gets that config.json, bf16 shards
// model-0000i-of-0000n.safetensors of at most --shard-gib GiB each (written by model/safetensors.h's writer, one shard
// in memory at a time) and model.safetensors.index.json, as the Hub lays out a sharded checkpoint. No tokenizer: bench
// decode feeds token ids. The values are those of --dummy-weights (model/dummy_weights.h, the same seed 0), so
// `kvq bench decode -m OUT_DIR` runs the very weights `-m SHAPE_DIR --dummy-weights` generates: timing only.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/half.h"
#include "model/config.h"
#include "model/dummy_weights.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace {

constexpr uint64_t kSeed = 0;  // cli/options.cpp's kDummyWeightsSeed

// The tensor's bf16 values, generated on every core.
kvq::OwnedTensor make_tensor(const kvq::TensorSpec& spec, float std) {
  kvq::OwnedTensor t;
  t.name = spec.name;
  t.dtype = kvq::DType::BF16;
  t.shape = spec.shape;
  const size_t n = spec.numel();
  t.bytes.resize(2 * n);
  uint16_t* out = reinterpret_cast<uint16_t*>(t.bytes.data());
  const unsigned n_threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (unsigned k = 0; k < n_threads; ++k)
    threads.emplace_back([&, k] {
      for (size_t i = n * k / n_threads; i < n * (k + 1) / n_threads; ++i)
        out[i] = kvq::f32_to_bf16(kvq::dummy_value(spec.init, std, kSeed, spec.stream(), i));
    });
  for (auto& th : threads) th.join();
  return t;
}

int run(int argc, char** argv) {
  KVQ_CHECK(argc == 3 || (argc == 5 && std::strcmp(argv[3], "--shard-gib") == 0),
            "usage: kvq_dummy_checkpoint SHAPE_DIR OUT_DIR [--shard-gib 2]");
  const std::string shape_dir = argv[1], out_dir = argv[2];
  const double shard_gib = argc == 5 ? std::atof(argv[4]) : 2.0;
  KVQ_CHECK(shard_gib > 0, "--shard-gib {}: a positive size", argv[4]);
  const kvq::ModelConfig cfg = kvq::ModelConfig::load(shape_dir + "/config.json");
  const std::vector<kvq::TensorSpec> table = kvq::model_tensors(cfg);

  // Shards: the table's order, a new shard when the next tensor would pass the size.
  const size_t max_bytes = size_t(shard_gib * double(1ull << 30));
  std::vector<std::vector<const kvq::TensorSpec*>> shards(1);
  size_t bytes = 0, total = 0;
  for (const kvq::TensorSpec& s : table) {
    const size_t b = 2 * s.numel();
    if (bytes > 0 && bytes + b > max_bytes) shards.emplace_back(), bytes = 0;
    shards.back().push_back(&s);
    bytes += b, total += b;
  }

  std::filesystem::create_directories(out_dir);
  std::filesystem::copy_file(shape_dir + "/config.json", out_dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  nlohmann::json map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    std::vector<kvq::OwnedTensor> tensors;
    for (const kvq::TensorSpec* s : shards[i]) {
      tensors.push_back(make_tensor(*s, cfg.initializer_range));
      map[s->name] = file;
    }
    kvq::write_safetensors(out_dir + "/" + file, tensors, {{"format", "pt"}});
    std::fprintf(stderr, "kvq_dummy_checkpoint: %s: %zu tensors\n", file.c_str(), tensors.size());
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  std::ofstream(out_dir + "/model.safetensors.index.json") << index.dump(2) << "\n";
  std::printf("%s: %zu parameters, %.2f GB of bf16 in %zu shards (the --dummy-weights values, seed %llu)\n",
              out_dir.c_str(), kvq::model_params(cfg), double(total) / 1e9, shards.size(),
              static_cast<unsigned long long>(kSeed));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvq_dummy_checkpoint: error: %s\n", e.what());
    return 1;
  }
}
