#include "engine/scheduler.h"

#include <algorithm>

#include "common/error.h"

namespace kvq {

Scheduler::Scheduler(Runner& runner, SchedulerConfig cfg) : runner_(runner), cfg_(cfg) {
  const int chunk = runner.cache_config().max_chunk;
  if (cfg_.max_seqs == 0) cfg_.max_seqs = runner.max_seqs();
  KVQ_CHECK(cfg_.max_seqs >= 1 && cfg_.max_seqs <= runner.max_seqs(),
            "scheduler: {} running sequences at most, the runner holds 1 .. {}", cfg_.max_seqs, runner.max_seqs());
  if (cfg_.token_budget == 0)
    cfg_.token_budget = std::min(runner.max_rows(), std::max(runner.step_rows(), chunk + cfg_.max_seqs));
  KVQ_CHECK(cfg_.token_budget >= cfg_.max_seqs && cfg_.token_budget <= runner.max_rows(),
            "scheduler: a token budget of {} per step must hold one token of each of {} sequences and at most the "
            "runner's {} rows",
            cfg_.token_budget, cfg_.max_seqs, runner.max_rows());
  KVQ_CHECK(runner.page_pool().n_live() == 0, "scheduler: the runner already has {} live sequences",
            runner.page_pool().n_live());
}

Scheduler::~Scheduler() {
  for (auto& e : running_) release(*e);
}

Scheduler::Id Scheduler::add(std::unique_ptr<Generation> g) {
  KVQ_CHECK(g && !g->finished(), "scheduler: a finished request");
  KVQ_CHECK(g->max_cache_length() <= runner_.max_ctx(),
            "context overflow: a prompt of {} tokens + {} to generate exceed the cache's context of {} tokens",
            g->prompt_tokens(), g->params().max_tokens, runner_.max_ctx());
  const Id id = next_id_++;
  waiting_.push_back(std::make_unique<Entry>(Entry{id, std::move(g), -1}));
  return id;
}

void Scheduler::cancel(Id id) {
  auto take = [&](auto& list) {
    auto it = std::find_if(list.begin(), list.end(), [&](const auto& e) { return e->id == id; });
    if (it == list.end()) return false;
    release(**it);
    (*it)->gen->finish(FinishReason::Cancelled);
    cancelled_.push_back(std::move(*it));
    list.erase(it);
    return true;
  };
  if (!take(running_)) take(waiting_);
}

const Generation* Scheduler::find(Id id) const {
  for (const auto& e : running_)
    if (e->id == id) return e->gen.get();
  for (const auto& e : waiting_)
    if (e->id == id) return e->gen.get();
  return nullptr;
}

void Scheduler::release(Entry& e) {
  if (e.seq >= 0) runner_.free_sequence(e.seq);
  e.seq = -1;
}

Scheduler::Update Scheduler::update_of(Entry& e) {
  return {e.id, e.gen->take_output(), e.gen->prompt_tokens(), e.gen->generated_tokens()};
}

int Scheduler::pages_needed(const std::vector<Item>& items) const {
  const PagePool& pool = runner_.page_pool();
  int pages = 0;
  for (const Item& it : items) pages += pool.pages_short(it.e->seq, runner_.length(it.e->seq) + it.n);
  return pages;
}

void Scheduler::admit(StepInfo& info) {
  if (blocked_) return;  // first come, first served: admitted requests waiting for the budget go first
  const PagePool& pool = runner_.page_pool();
  auto room = [&](const Generation& g) { return std::min(g.known() + 1, runner_.max_ctx()); };
  int reserved = 0;  // pages the running requests still take to hold their known tokens and the next one
  for (const auto& e : running_) reserved += pool.pages_short(e->seq, room(*e->gen));
  while (!waiting_.empty() && int(running_.size()) < cfg_.max_seqs && pool.n_live() < pool.n_slots()) {
    Entry& w = *waiting_.front();
    const int need = pool.layout().pages_for(room(*w.gen));
    if (need + reserved > pool.free_pages()) break;
    reserved += need;
    w.seq = runner_.new_sequence();
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    ++info.admitted;
  }
}

std::vector<Scheduler::Item> Scheduler::plan_step(bool& blocked) {
  const int chunk = runner_.cache_config().max_chunk;
  std::vector<Item> items;
  int left = cfg_.token_budget;
  const bool prefill_only =
      cfg_.policy == SchedulerConfig::kPrefillFirst &&
      std::any_of(running_.begin(), running_.end(), [](const auto& e) { return !e->gen->decoding(); });
  // Decode tokens first: one each (the budget holds max_seqs of them).
  for (auto& e : running_) {
    if (e->gen->next_chunk(chunk) != 1 || (prefill_only && e->gen->decoding())) continue;
    items.push_back({e.get(), 1});
    --left;
  }
  // Then prefill (and replayed) chunks in admission order.
  bool chunk_taken = false;
  for (auto& e : running_) {
    const int n = e->gen->next_chunk(chunk);
    if (n == 1) continue;
    if (n <= left) {
      items.push_back({e.get(), n});
    } else if (!e->gen->chunk_fixed() && !chunk_taken && left > 0) {
      items.push_back({e.get(), left});  // the step's first chunk, cut to the budget (never a replayed one)
    } else {
      blocked = true;
      continue;
    }
    left -= items.back().n;
    chunk_taken = true;
  }
  return items;
}

void Scheduler::preempt_newest(std::vector<Item>& items) {
  KVQ_CHECK(running_.size() > 1, "scheduler: the page pool ({} pages) does not hold one request's next step",
            runner_.page_pool().n_pages());
  std::unique_ptr<Entry> e = std::move(running_.back());
  running_.pop_back();
  items.erase(std::remove_if(items.begin(), items.end(), [&](const Item& it) { return it.e == e.get(); }),
              items.end());
  release(*e);
  e->gen->preempt();
  ++preemptions_;
  // Back in the queue in arrival order (ids grow with arrival): ahead of every request that came after it.
  auto pos = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) { return w->id > e->id; });
  waiting_.insert(pos, std::move(e));
}

std::vector<Scheduler::Update> Scheduler::step(StepInfo* info_out) {
  StepInfo info;
  std::vector<Update> updates;
  for (auto& e : cancelled_) updates.push_back(update_of(*e));
  cancelled_.clear();
  admit(info);
  bool blocked = false;
  std::vector<Item> items = plan_step(blocked);
  while (!items.empty() && pages_needed(items) > runner_.page_pool().free_pages()) {
    preempt_newest(items);
    ++info.preempted;
  }
  blocked_ = blocked;
  if (info_out) *info_out = info;
  if (items.empty()) return updates;

  // One forward: ids of every item concatenated; the last row's logits (or argmax) where a chunk predicts.
  seqs_.clear(), n_.clear(), ids_.clear();
  bool predict = false, want_logits = false;
  for (const Item& it : items) {
    seqs_.push_back(it.e->seq);
    n_.push_back(it.n);
    ids_.insert(ids_.end(), it.e->gen->ids(), it.e->gen->ids() + it.n);
    if (it.e->gen->predicts(it.n)) predict = true, want_logits |= it.e->gen->needs_logits();
    info.rows += it.n;
    info.decode_rows += it.n == 1;
  }
  info.seqs = int(items.size());
  if (info_out) *info_out = info;
  const int V = runner_.config().vocab_size;
  argmax_.resize(items.size());
  if (want_logits) logits_.resize(items.size() * size_t(V));
  try {
    runner_.forward(seqs_, n_, ids_.data(), predict ? LogitRows::Last : LogitRows::None,
                    want_logits ? logits_.data() : nullptr, predict ? argmax_.data() : nullptr);
  } catch (const Error& err) {
    // Which of the step's sequences hold what is unknown now: every request of the step ends with the error.
    for (const Item& it : items) it.e->gen->finish(FinishReason::Error, err.message());
  }
  for (size_t b = 0; b < items.size(); ++b) {
    Generation& g = *items[b].e->gen;
    if (g.finished()) continue;
    const bool predicts = g.predicts(items[b].n);
    g.fed_chunk(items[b].n);
    if (predicts) g.accept(want_logits ? logits_.data() + b * size_t(V) : nullptr, V, argmax_[b]);
  }
  for (const Item& it : items) {
    Update u = update_of(*it.e);
    if (u.output.finish != FinishReason::None || !u.output.tokens.empty() || !u.output.text.empty())
      updates.push_back(std::move(u));
  }
  // Finished requests leave (their sequences are freed).
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->gen->finished()) {
      release(**it);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return updates;
}

}  // namespace kvq
