// The prompt policies on the GPU cache (cuda/gpu_cache.h): exact-prompt and quantize-after-prompt against the CPU
// cache's (kv/cache.h), step by step through the twin harness: the prompt's queries read the prompt's exact rows (the
// GPU's bf16 twin, the CPU's exact store), the rows are stored through the codecs as a decode-faithful cache stores them,
// and after end_prompt queries read the cache as stored (exact-prompt) or the pages the prompt filled and every later
// row exactly (quantize-after-prompt). The camps that ship them: TurboQuant (no windows, its skipped layers, the
// Hadamard of its keys) and OScaR (no windows, a demotion block of 256) exact-prompt, NexusQuant (no windows, keys
// stored without RoPE) quantize-after-prompt; and int2 with kvq's windows under both. Then what the GPU refuses.
#ifdef KVQ_HAVE_CUDA

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "codecs/registry.h"
#include "common/error.h"
#include "cuda/gpu_instances.h"
#include "gpu_twin.h"
#include "rotation/rotation_file.h"
#include "test_helpers.h"

using namespace kvq;
using namespace kvq::gpu_test;

namespace {

struct PolicyCase {
  const char* name;
  PromptPolicy policy;
  const char *k, *v;
  int sink, recent, demote_block;
  std::vector<int> skip_layers;
  double decode_budget;  // NMSE of GPU vs CPU attention over the stored cache (the row budgets of
                         // tests/test_gpu_head_dims.cpp: int2 of one 128-value group 2e-3, the others 2e-6; a skipped
                         // layer's bf16 rows run on the tensor cores, q and P' rounded to bf16: 1e-4; decoded tiles:
                         // at least gpu_twin.h's decoded_tile_budget)
};

// A cache as the CLI builds the two codecs (default clips; per-channel keys where the codec has them), pages of 128,
// chunks of 256, the case's policy, with the transform the codecs imply (TurboQuant's keys: a Hadamard) and, for keys
// stored without RoPE (NexusQuant's), the RoPE frequencies.
CacheConfig policy_config(const PolicyCase& p) {
  CacheConfig c;
  c.k = codec_spec(p.k, true, 128, 0.f), c.v = codec_spec(p.v, false, 128, 0.f);
  c.k.head_dim = c.v.head_dim = kD;
  c.sink = p.sink, c.recent = p.recent, c.demote_block = p.demote_block;
  c.skip_layers = p.skip_layers;
  c.page_tokens = 128, c.max_chunk = 256;
  c.prompt_policy = p.policy;
  if (codec_traits(p.k).pre_rope_keys) c.key_rope = test::rope_inv_freq(kD, 1e6);
  c.transform = codec_transform(c, Twin::kLayers, Twin::kKv, kD);
  return c;
}

// The prompt's queries read bf16 rows on the GPU's tensor-core kernels (q and P' rounded to bf16: the bf16 budget of
// tests/test_gpu_cache.cpp at d = 128) and the CPU's exact store in float.
constexpr double kPromptBudget = 1e-4;

TEST(GpuPromptPolicy, ThePromptReadsItsExactRowsThenTheViewThePolicyKeepsAsTheCpuCacheDoes) {
  REQUIRE_GPU();
  constexpr PromptPolicy kExact = PromptPolicy::kExactPrompt, kFrozen = PromptPolicy::kQuantizeAfterPrompt;
  const PolicyCase cases[] = {
      {"int2 64/256 exact-prompt", kExact, "int2", "int2", 64, 256, 0, {}, 2e-3},
      {"turboquant_3bit_nc as shipped", kExact, "tq3nc", "tqv3", 0, 0, 0, {0}, 1e-4},  // layer 0: 9.9e-6 on an H100
      {"oscar_int2 as shipped", kExact, "oscar_int2", "oscar_int2", 0, 0, 256, {}, 2e-6},
      {"int2 64/256 quantize-after-prompt", kFrozen, "int2", "int2", 64, 256, 0, {}, 2e-3},
      {"nexusquant as shipped", kFrozen, "nexusquant", "nexusquant", 0, 0, 0, {}, 1e-4},
      {"e8_2 16/64 quantize-after-prompt", kFrozen, "e8_2", "e8_2", 16, 64, 0, {}, 1e-4},
  };
  for (const PolicyCase& p : cases) {
    SCOPED_TRACE(p.name);
    const CacheConfig cfg = policy_config(p);
    ASSERT_EQ(cuda::gpu_unsupported(cfg, kD), "");
    std::mt19937 rng(41);
    Twin tw(cfg, 1400, 2, cfg.transform ? *cfg.transform : KvTransform{});
    // Sequence 0's prompt, 700 tokens in chunks: every chunk's queries read the exact rows on both devices.
    for (int pos = 0; pos < 700; pos += 256) {
      const int n = std::min(256, 700 - pos);
      tw.step({0}, {n}, rng, Data::HeavyTailed, true, kPromptBudget, "prompt [" + std::to_string(pos) + ", +" +
              std::to_string(n) + ")");
    }
    // Sequence 1 opens its prompt; a step with sequence 0 still inside its own is one step of two prompts.
    tw.step({0, 1}, {5, 40}, rng, Data::HeavyTailed, true, kPromptBudget, "two prompts in one step");
    tw.cpu.end_prompt(tw.cpu_ids[0]);
    tw.gpu.end_prompt(tw.gpu_ids[0]);
    EXPECT_FALSE(tw.gpu.step_reads_exact());
    const int prompt = tw.gpu.length(tw.gpu_ids[0]);
    // After the prompt: decode steps and chunks read the view the policy keeps (quantize-after-prompt: past the
    // ring's W + B + 128 rows of a decode-faithful cache, 405 rows after the prompt).
    for (int i = 0; i < 3; ++i) tw.step({0}, {1}, rng, Data::Gaussian, true, p.decode_budget, "decode after the prompt");
    tw.step({0}, {100}, rng, Data::Gaussian, true, p.decode_budget, "a chunk after the prompt");
    tw.step({0}, {256}, rng, Data::Gaussian, true, p.decode_budget, "a second chunk after the prompt");
    tw.step({0}, {1}, rng, Data::Gaussian, true, p.decode_budget, "decode after the chunks");
    int64_t total = 0;
    EXPECT_EQ(tw.row_mismatches(0, &total), 0) << "the codecs store the rows the policy keeps";
    EXPECT_GT(total, 0);
    const int len = tw.gpu.length(tw.gpu_ids[0]);
    const CacheFootprint fc = tw.cpu.footprint(len, prompt), fg = tw.gpu.footprint(len, prompt);
    EXPECT_DOUBLE_EQ(fg.bits_per_element, fc.bits_per_element) << "the bits the policy keeps, counted alike";
    if (p.policy == kFrozen) {  // every row past qe(P - 1) at 16 bits
      EXPECT_GT(fg.bits_per_element, tw.gpu.footprint(len).bits_per_element);
    }
    // Sequence 1 is inside its prompt, sequence 0 after it: refused before anything changes.
    const int len0 = tw.gpu.length(tw.gpu_ids[0]);
    try {
      tw.gpu.begin_step({tw.gpu_ids[0], tw.gpu_ids[1]}, {1, 1});
      ADD_FAILURE() << "a step mixing sequences inside and after their prompts was accepted";
      tw.gpu.abort_step();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(prompt_policy_name(p.policy)), std::string::npos) << e.what();
    }
    EXPECT_EQ(tw.gpu.length(tw.gpu_ids[0]), len0);
    EXPECT_FALSE(tw.gpu.step_reads_exact());
    // ... and each alone still runs: sequence 1's prompt reads its exact rows, sequence 0 its view.
    tw.step({1}, {60}, rng, Data::HeavyTailed, true, kPromptBudget, "sequence 1's prompt");
    tw.step({0}, {1}, rng, Data::Gaussian, true, p.decode_budget, "sequence 0 after the prompt");
    std::printf("[ gpu    ] %s: worst NMSE vs CPU %.3g over %lld stored rows\n", p.name, tw.worst_nmse,
                (long long)total);
  }
}

// evict stays on the CPU: the predicate and the cache refuse it with one line naming the policy.
TEST(GpuPromptPolicy, EvictIsRefusedNamingThePolicy) {
  CacheConfig c = policy_config({"bf16 evict", PromptPolicy::kEvict, "bf16", "bf16", 64, 256, 0, {}, 0});
  c.evict_bits = 4;
  const std::string why = cuda::gpu_unsupported(c, kD);
  EXPECT_NE(why.find("evict"), std::string::npos) << why;
  EXPECT_NE(why.find("--device cpu"), std::string::npos) << why;
  EXPECT_THROW(cuda::GpuKvCache(c, Twin::kLayers, Twin::kKv, kD, 512, 1), Error);
}

}  // namespace

#endif  // KVQ_HAVE_CUDA
