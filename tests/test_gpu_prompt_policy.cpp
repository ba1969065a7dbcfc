// The prompt policies on the GPU cache (cuda/gpu_cache.h): exact-prompt and quantize-after-prompt against the CPU
// cache's (kv/cache.h), step by step through the twin harness: the prompt's queries read the prompt's exact rows (the
// GPU's bf16 twin, the CPU's exact store), the rows are stored through the codecs as a decode-faithful cache stores them,
// and after end_prompt queries read the cache as stored (exact-prompt) or the pages the prompt filled and every later
// row exactly (quantize-after-prompt). The camps that ship them: TurboQuant (no windows, its skipped layers, the
// Hadamard of its keys) and OScaR (no windows, a demotion block of 256) exact-prompt, NexusQuant (no windows, keys
// stored without RoPE) quantize-after-prompt; and int2 with kvq's windows under both. Then evict (LORE-KV's camp,
// bf16 rows): the tokens it keeps and what it reads; and what the GPU refuses of it.
#ifdef KVQ_HAVE_CUDA

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codecs/registry.h"
#include "common/error.h"
#include "cuda/gpu_instances.h"
#include "gpu_twin.h"
#include "kv/evict.h"
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
    EXPECT_FALSE(tw.gpu.step_off_signature());
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
    EXPECT_FALSE(tw.gpu.step_off_signature());
    // ... and each alone still runs: sequence 1's prompt reads its exact rows, sequence 0 its view.
    tw.step({1}, {60}, rng, Data::HeavyTailed, true, kPromptBudget, "sequence 1's prompt");
    tw.step({0}, {1}, rng, Data::Gaussian, true, p.decode_budget, "sequence 0 after the prompt");
    std::printf("[ gpu    ] %s: worst NMSE vs CPU %.3g over %lld stored rows\n", p.name, tw.worst_nmse,
                (long long)total);
  }
}

// The rows of sequence b after its eviction, its prompt of `prompt` tokens reduced to `kept`: the GPU's slots against
// the CPU's exact run (the kept prompt rows in position order, then every later row: the same bf16 bytes, so the same
// tokens kept). Returns the rows that differ.
int64_t evicted_row_mismatches(const Twin& tw, int b, int prompt, int kept) {
  const int cs = tw.cpu_ids[size_t(b)], gs = tw.gpu_ids[size_t(b)], len = tw.cpu.length(cs);
  const int n = kept + (len - prompt);  // slots
  std::vector<KvCache::Run> runs;
  int64_t bad = 0;
  for (int l = 0; l < Twin::kLayers; ++l)
    for (int h = 0; h < Twin::kKv; ++h) {
      tw.cpu.runs(cs, l, h, len - 1, len - 1, runs);
      EXPECT_EQ(runs.size(), 1u);
      const KvCache::Run& r = runs.front();
      EXPECT_EQ(r.kind, KvCache::RunKind::Exact);
      EXPECT_GE(r.n, n);  // (a query at P - 1 is given the exact store's slots up to P - 1)
      for (int kv = 0; kv < 2; ++kv) {
        const size_t rb = (kv ? r.v_codec : r.k_codec)->bytes_per_block();
        const std::vector<uint8_t> g = tw.gpu.download_rows(gs, l, h, kv == 1, 0, n);  // slots
        EXPECT_EQ(g.size(), size_t(n) * rb);
        for (int i = 0; i < n; ++i)
          bad += g.size() < (i + 1) * rb || std::memcmp(g.data() + i * rb, (kv ? r.v : r.k) + i * rb, rb) != 0;
      }
    }
  return bad;
}

// evict (bf16 rows, a quarter of the prompt's bytes kept): the prompt reads its rows, end_prompt keeps the tokens the
// CPU cache keeps (scored on the GPU from the prompt's last 32 queries, compacted into slots) and later queries read
// the kept rows and everything after the prompt, as the CPU's exact store; a prompt may share a step with a sequence
// after its own.
TEST(GpuPromptPolicy, EvictKeepsTheCpuCachesTokensAndReadsThemAsItDoes) {
  REQUIRE_GPU();
  CacheConfig cfg = policy_config({"bf16 16/64 evict", PromptPolicy::kEvict, "bf16", "bf16", 16, 64, 0, {}, 0});
  cfg.evict_bits = 4;
  ASSERT_EQ(cuda::gpu_unsupported(cfg, kD), "");
  std::mt19937 rng(43);
  Twin tw(cfg, 1400, 2, KvTransform{});
  for (int pos = 0; pos < 700; pos += 256)  // sequence 0's prompt in chunks
    tw.step({0}, {std::min(256, 700 - pos)}, rng, Data::HeavyTailed, true, kPromptBudget, "prompt");
  tw.gpu.begin_step({tw.gpu_ids[0]}, {1});  // a step of an evict prompt observes its queries: no graph
  EXPECT_TRUE(tw.gpu.step_off_signature());
  tw.gpu.abort_step();
  tw.cpu.end_prompt(tw.cpu_ids[0]);
  tw.gpu.end_prompt(tw.gpu_ids[0]);
  EXPECT_EQ(tw.gpu.length(tw.gpu_ids[0]), 700) << "positions, not slots";
  ASSERT_EQ(evict_budget(4, 16, 700), 175) << "floor(4 / 16 x 700) prompt tokens";
  EXPECT_EQ(evicted_row_mismatches(tw, 0, 700, 175), 0) << "the CPU's kept tokens, in position order";
  // After the prompt: decode steps and chunks read the kept rows and every later one; sequence 1's prompt (400
  // tokens, 100 kept) runs in the same steps.
  tw.step({0}, {1}, rng, Data::Gaussian, true, kPromptBudget, "decode after the eviction");
  tw.step({0, 1}, {100, 256}, rng, Data::Gaussian, true, kPromptBudget, "a chunk beside another prompt");
  tw.step({1, 0}, {144, 1}, rng, Data::Gaussian, true, kPromptBudget, "the other prompt's end beside a decode");
  tw.cpu.end_prompt(tw.cpu_ids[1]);
  tw.gpu.end_prompt(tw.gpu_ids[1]);
  tw.step({0, 1}, {256, 1}, rng, Data::Gaussian, true, kPromptBudget, "both after their evictions");
  tw.step({0}, {256}, rng, Data::Gaussian, true, kPromptBudget, "a chunk to position 1314");
  EXPECT_EQ(tw.gpu.length(tw.gpu_ids[0]), tw.cpu.length(tw.cpu_ids[0]));
  EXPECT_EQ(tw.gpu.length(tw.gpu_ids[1]), 401);
  EXPECT_EQ(evicted_row_mismatches(tw, 1, 400, 100), 0) << "sequence 1, observed beside sequence 0";
  EXPECT_EQ(evicted_row_mismatches(tw, 0, 700, 175), 0) << "sequence 0's kept and later rows";
  const int len = tw.gpu.length(tw.gpu_ids[0]);
  EXPECT_DOUBLE_EQ(tw.gpu.footprint(len, 700).bits_per_element, tw.cpu.footprint(len, 700).bits_per_element);
  // the context counts positions: 100 more tokens overflow the 1400 at position 1314, though 789 slots are held
  EXPECT_THROW(tw.gpu.begin_step({tw.gpu_ids[0]}, {100}), Error);
  std::printf("[ gpu    ] bf16 evict 16/64 b4: 175 of 700 prompt tokens kept, as the CPU's; worst NMSE vs CPU %.3g\n",
              tw.worst_nmse);
}

// What the GPU refuses of evict: a sliding window (the kept slots are not positions), quantized rows (the CPU's
// message: evict keeps tokens unquantized).
TEST(GpuPromptPolicy, EvictRefusesSlidingWindowsAndQuantizedRows) {
  CacheConfig c = policy_config({"bf16 evict", PromptPolicy::kEvict, "bf16", "bf16", 64, 256, 0, {}, 0});
  c.evict_bits = 4;
  CacheConfig slides = c;
  slides.attn_window = {0, 512};
  const std::string why = cuda::gpu_unsupported(slides, kD);
  EXPECT_NE(why.find("evict"), std::string::npos) << why;
  EXPECT_NE(why.find("--device cpu"), std::string::npos) << why;
  EXPECT_THROW(cuda::GpuKvCache(slides, Twin::kLayers, Twin::kKv, kD, 512, 1), Error);
  CacheConfig int2 = policy_config({"int2 evict", PromptPolicy::kEvict, "int2", "int2", 64, 256, 0, {}, 0});
  int2.evict_bits = 4;
  try {
    cuda::GpuKvCache(int2, Twin::kLayers, Twin::kKv, kD, 512, 1);
    ADD_FAILURE() << "an evict cache of int2 rows was built";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unquantized"), std::string::npos) << e.what();
  }
}

}  // namespace

#endif  // KVQ_HAVE_CUDA
