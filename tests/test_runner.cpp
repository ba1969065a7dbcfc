// The device-independent Runner interface on the CPU path (model/runner.h): a step over several sequences gives
// the same logits as running each sequence alone, All / Last rows and argmax are laid out as documented, and
// malformed steps are refused before any work.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "common/error.h"
#include "model/runner.h"

using namespace kvq;

namespace {

Model& ref_model() {
  static std::unique_ptr<Model> m = Model::load(std::string(KVQ_SOURCE_DIR) + "/models/ref", 2);
  return *m;
}

CacheConfig small_cache() {
  CacheConfig c;
  c.max_chunk = 16;
  return c;
}

}  // namespace

TEST(CpuRunner, BatchedStepEqualsEachSequenceAloneWithAllAndLastRows) {
  Model& m = ref_model();
  const int V = m.config().vocab_size;
  const std::vector<int32_t> a = {11, 200, 37, 4000, 5}, b = {900, 17};
  // Alone: each sequence in its own runner, all rows.
  std::vector<float> la(a.size() * V), lb(b.size() * V);
  {
    CpuRunner r(m, small_cache(), 32);
    r.forward(r.new_sequence(), a.data(), int(a.size()), la.data(), true);
  }
  {
    CpuRunner r(m, small_cache(), 32);
    r.forward(r.new_sequence(), b.data(), int(b.size()), lb.data(), true);
  }
  // Together: one step of both, ids concatenated.
  std::vector<int32_t> ids = a;
  ids.insert(ids.end(), b.begin(), b.end());
  CpuRunner r(m, small_cache(), 32, 2);
  const int sa = r.new_sequence(), sb = r.new_sequence();
  std::vector<float> all(ids.size() * V);
  std::vector<int32_t> am(ids.size(), -1);
  r.forward({sa, sb}, {int(a.size()), int(b.size())}, ids.data(), LogitRows::All, all.data(), am.data());
  EXPECT_EQ(r.length(sa), int(a.size()));
  EXPECT_EQ(r.length(sb), int(b.size()));
  for (size_t i = 0; i < la.size(); ++i) ASSERT_EQ(all[i], la[i]) << "sequence a, logit " << i;
  for (size_t i = 0; i < lb.size(); ++i) ASSERT_EQ(all[la.size() + i], lb[i]) << "sequence b, logit " << i;
  for (size_t row = 0; row < ids.size(); ++row) EXPECT_EQ(am[row], argmax_row(all.data() + row * V, V));

  // Last rows: one decode token each; row b of the output is sequence b's.
  const std::vector<int32_t> next = {am[a.size() - 1], am[ids.size() - 1]};
  std::vector<float> last(2 * size_t(V));
  std::vector<int32_t> am2(2, -1);
  r.forward({sb, sa}, {1, 1}, std::vector<int32_t>{next[1], next[0]}.data(), LogitRows::Last, last.data(), am2.data());
  CpuRunner alone(m, small_cache(), 32);  // the same two forwards (a GEMM, then a GEMV) for sequence a alone
  const int s1 = alone.new_sequence();
  std::vector<float> want(a.size() * V);
  alone.forward(s1, a.data(), int(a.size()), want.data(), true);
  alone.forward(s1, &next[0], 1, want.data(), false);
  for (int i = 0; i < V; ++i) ASSERT_EQ(last[size_t(V) + i], want[size_t(i)]) << "logit " << i;
  EXPECT_EQ(am2[1], argmax_row(want.data(), V));
}

// A decode step of many sequences (one attention loop over all their items, the output layer's rows together) gives
// each sequence the logits of its step alone, bit for bit, with an int2 body, windows and contexts of several pages.
TEST(CpuRunner, ADecodeStepOfManySequencesIsEachSequenceAloneBitForBitWithAnInt2Cache) {
  Model& m = ref_model();
  const int V = m.config().vocab_size;
  CacheConfig c;
  for (CodecSpec* s : {&c.k, &c.v}) s->type = "int2", s->group = 128;
  c.sink = 4, c.recent = 16, c.page_tokens = 16, c.max_chunk = 32;
  const std::vector<int> lengths = {40, 97, 18, 150, 64, 33, 120, 71, 200};  // 9 x 2 kv heads: more
  // (sequence, head) pairs than the 16 items a lone decode splits into, so a split chosen from the batch would show
  const int n_seq = int(lengths.size());
  const auto prompt = [](int s, int i) { return int32_t((s * 131 + i * 17) % 4000 + 1); };
  CpuRunner together(m, c, 256, n_seq), alone(m, c, 256, n_seq);
  std::vector<int> st, sa;
  for (int s = 0; s < n_seq; ++s) {
    st.push_back(together.new_sequence()), sa.push_back(alone.new_sequence());
    for (int p = 0; p < lengths[size_t(s)]; p += 32) {
      const int n = std::min(32, lengths[size_t(s)] - p);
      std::vector<int32_t> ids(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) ids[size_t(i)] = prompt(s, p + i);
      together.forward({st.back()}, {n}, ids.data(), LogitRows::None, nullptr, nullptr);
      alone.forward({sa.back()}, {n}, ids.data(), LogitRows::None, nullptr, nullptr);
    }
  }
  std::vector<int32_t> next(static_cast<size_t>(n_seq));
  for (int s = 0; s < n_seq; ++s) next[size_t(s)] = prompt(s, 999);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> all(size_t(n_seq) * V);
    std::vector<int32_t> am(static_cast<size_t>(n_seq));
    together.forward(st, std::vector<int>(size_t(n_seq), 1), next.data(), LogitRows::Last, all.data(), am.data());
    for (int s = 0; s < n_seq; ++s) {
      std::vector<float> one(static_cast<size_t>(V));
      int32_t a1 = -1;
      alone.forward({sa[size_t(s)]}, {1}, &next[size_t(s)], LogitRows::Last, one.data(), &a1);
      for (int i = 0; i < V; ++i)
        ASSERT_EQ(all[size_t(s) * V + i], one[size_t(i)]) << "step " << step << ", sequence " << s << ", logit " << i;
      EXPECT_EQ(am[size_t(s)], a1);
      next[size_t(s)] = a1;
    }
  }
}

TEST(CpuRunner, RefusesMalformedStepsBeforeAnyWork) {
  Model& m = ref_model();
  CpuRunner r(m, small_cache(), 32, 2);
  const int s = r.new_sequence();
  std::vector<int32_t> ids(40, 1);
  EXPECT_THROW(r.forward({s}, {17}, ids.data(), LogitRows::None, nullptr, nullptr), Error);     // > chunk
  EXPECT_THROW(r.forward({s}, {0}, ids.data(), LogitRows::None, nullptr, nullptr), Error);      // empty
  EXPECT_THROW(r.forward({s, s}, {1, 1}, ids.data(), LogitRows::None, nullptr, nullptr), Error);  // twice
  EXPECT_THROW(r.forward({s}, {1, 1}, ids.data(), LogitRows::None, nullptr, nullptr), Error);     // shapes
  EXPECT_EQ(r.length(s), 0);
  r.forward({s}, {3}, ids.data(), LogitRows::None, nullptr, nullptr);
  EXPECT_EQ(r.length(s), 3);
}

// --kv-budget-gib on the CPU: the runner's pool is what the budget holds, its pool is the cache's, and a step that
// needs more pages than are free is refused with the pool's error before any work (the sequence keeps its length).
TEST(CpuRunner, KvBudgetSizesThePoolAndAnExhaustedStepIsRefusedBeforeWork) {
  Model& m = ref_model();
  CacheConfig c = small_cache();
  c.sink = 4, c.recent = 8, c.page_tokens = 16;
  const ModelConfig& mc = m.config();
  const CacheLayout l = cache_layout(c, mc.n_layers, mc.n_kv_heads, mc.head_dim);
  const int windows = 2 * l.window_pages();  // two sequences' windows, then 5 pages for their tokens
  CpuRunner r(m, c, 64, 2, size_t(windows + 5) * size_t(l.page_bytes));
  EXPECT_EQ(r.page_pool().n_slots(), 2);
  EXPECT_EQ(r.page_pool().n_pages(), windows + 5);
  EXPECT_EQ(r.cache_bytes(), r.page_pool().bytes());
  const int a = r.new_sequence(), b = r.new_sequence();
  const std::vector<int32_t> ids(64, 7);
  for (int i = 0; i < 64; i += 16) r.forward({a}, {16}, ids.data(), LogitRows::None, nullptr, nullptr);
  EXPECT_EQ(r.page_pool().pages(a), 4);  // 64 - 12 quantized positions
  r.forward({b}, {16}, ids.data(), LogitRows::None, nullptr, nullptr);
  r.forward({b}, {12}, ids.data(), LogitRows::None, nullptr, nullptr);  // 28: the last free page
  EXPECT_EQ(r.page_pool().free_pages(), 0);
  try {
    r.forward({b}, {16}, ids.data(), LogitRows::None, nullptr, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("page pool exhausted: sequence 1 needs 1 more page, 0 free of {}",
                                                     windows + 5)),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(r.length(b), 28);
  r.free_sequence(a);
  r.forward({b}, {16}, ids.data(), LogitRows::None, nullptr, nullptr);
  EXPECT_EQ(r.length(b), 44);
}

// bench decode --seqs max: a runner built with max_seqs 0 and a KV budget takes as many sequences as PagePool's
// arithmetic says the budget holds at max_ctx (windows and pages), admits exactly those, and refuses a budget that
// holds none with one clear error.
TEST(CpuRunner, SeqsMaxFillsTheKvBudgetWithWhatThePagePoolSaysFits) {
  Model& m = ref_model();
  CacheConfig c = small_cache();
  c.sink = 4, c.recent = 8, c.page_tokens = 16;
  const ModelConfig& mc = m.config();
  const CacheLayout l = cache_layout(c, mc.n_layers, mc.n_kv_heads, mc.head_dim);
  const int len = 40;
  for (double n : {1.0, 3.4}) {
    const size_t budget = size_t(n * double(l.sequence_bytes(len)));
    CpuRunner r(m, c, len, 0, budget);
    const int fit = PagePool::for_budget(l, len, 0, budget).n_slots;
    EXPECT_EQ(fit, int(n)) << "budget " << budget;
    EXPECT_EQ(r.max_seqs(), fit);
    EXPECT_EQ(r.page_pool().sequences_at(len), fit);
    EXPECT_LE(r.cache_bytes(), budget);
    // Every one of them reaches len tokens; the next is refused.
    std::vector<int> seqs;
    for (int s = 0; s < fit; ++s) seqs.push_back(r.new_sequence());
    const std::vector<int32_t> ids(size_t(16) * fit, 3);
    for (int done = 0; done < len;) {
      const int k = std::min(16, len - done);
      r.forward(seqs, std::vector<int>(size_t(fit), k), ids.data(), LogitRows::None, nullptr, nullptr);
      done += k;
    }
    for (int s : seqs) EXPECT_EQ(r.length(s), len);
    EXPECT_THROW(r.new_sequence(), Error);
  }
  try {
    CpuRunner r(m, c, len, 0, size_t(l.sequence_bytes(len) - 1));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("does not hold one sequence of {} tokens", len)),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(CpuRunner(m, c, len, 0, 0), Error);  // max_seqs 0 needs a budget
}

// The batched CPU decode (model/model.h: one weight read a step for every decode row): a step of 19 sequences, more
// than one 16-row pass of the row kernels, beside a prefill chunk of 20 rows, gives each sequence exactly the logits
// of its step alone.
TEST(CpuRunner, ManySequencesInOneStepGiveEachTheLogitsOfItsStepAlone) {
  Model& m = ref_model();
  const int V = m.config().vocab_size, n_dec = 19, chunk = 20;
  CacheConfig c = small_cache();
  c.max_chunk = 32;
  CpuRunner batch(m, c, 64, n_dec + 1);
  std::vector<int> seqs, n;
  std::vector<int32_t> ids;
  for (int s = 0; s < n_dec; ++s) {  // each decode sequence starts from a prompt of 2 tokens, then decodes one
    const int seq = batch.new_sequence();
    const std::vector<int32_t> prompt = {int32_t(3 + 7 * s), int32_t(50 + s)};
    batch.forward(seq, prompt.data(), 2, nullptr, false);
    seqs.push_back(seq), n.push_back(1), ids.push_back(int32_t(100 + 13 * s));
  }
  const int pre = batch.new_sequence();  // and a prefill chunk in the same step
  seqs.push_back(pre), n.push_back(chunk);
  for (int i = 0; i < chunk; ++i) ids.push_back(int32_t(500 + 31 * i));
  std::vector<float> last(seqs.size() * size_t(V));
  batch.forward(seqs, n, ids.data(), LogitRows::Last, last.data(), nullptr);
  for (int s = 0; s <= n_dec; ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    CpuRunner alone(m, c, 64);
    const int seq = alone.new_sequence();
    std::vector<float> want(static_cast<size_t>(V));
    if (s < n_dec) {
      const std::vector<int32_t> prompt = {int32_t(3 + 7 * s), int32_t(50 + s)};
      alone.forward(seq, prompt.data(), 2, nullptr, false);
      alone.forward(seq, &ids[size_t(s)], 1, want.data(), false);
    } else {
      alone.forward(seq, ids.data() + n_dec, chunk, want.data(), false);
    }
    int bad = 0;
    for (int i = 0; i < V; ++i) bad += last[size_t(s) * V + i] != want[size_t(i)];
    EXPECT_EQ(bad, 0);
  }
}
