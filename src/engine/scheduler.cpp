#include "engine/scheduler.h"

#include <algorithm>
#include <thread>

#include "common/error.h"
#include "common/thread_pool.h"

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
  if (cfg_.prefix_cache && !runner.prefix_stats().enabled) runner.enable_prefix_cache();
}

std::unique_ptr<Scheduler::Entry> Scheduler::make_entry(Id id, std::unique_ptr<Generation> g) {
  auto e = std::make_unique<Entry>();
  e->id = id;
  e->gen = std::move(g);
  return e;
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
  waiting_.push_back(make_entry(id, std::move(g)));
  return id;
}

std::vector<Scheduler::Id> Scheduler::add_group(std::vector<std::unique_ptr<Generation>> gens) {
  KVQ_CHECK(!gens.empty() && int(gens.size()) <= cfg_.max_seqs,
            "scheduler: {} choices of one prompt, at most the {} requests that run at once", gens.size(),
            cfg_.max_seqs);
  std::vector<Id> ids{add(std::move(gens[0]))};
  Entry& leader = *waiting_.back();
  for (size_t i = 1; i < gens.size(); ++i) {
    KVQ_CHECK(gens[i] && !gens[i]->finished() && gens[i]->fed() == 0, "scheduler: a finished or started choice");
    KVQ_CHECK(gens[i]->prompt_tokens() == leader.gen->prompt_tokens() &&
                  std::equal(gens[i]->ids(), gens[i]->ids() + gens[i]->prompt_tokens(), leader.gen->ids()),
              "scheduler: the choices of a group must share one prompt");
    KVQ_CHECK(gens[i]->max_cache_length() <= runner_.max_ctx(),
              "context overflow: a prompt of {} tokens + {} to generate exceed the cache's context of {} tokens",
              gens[i]->prompt_tokens(), gens[i]->params().max_tokens, runner_.max_ctx());
    ids.push_back(next_id_++);
    leader.followers.push_back(make_entry(ids.back(), std::move(gens[i])));
  }
  return ids;
}

int Scheduler::n_running() const {
  int n = 0;
  for (const auto& e : running_) n += group_size(*e);
  return n;
}

int Scheduler::n_waiting() const {
  int n = 0;
  for (const auto& e : waiting_) n += group_size(*e);
  return n;
}

void Scheduler::cancel(Id id, FinishReason reason, std::string message) {
  auto end = [&](std::unique_ptr<Entry> e) {
    release(*e);
    e->gen->finish(reason, message);
    cancelled_.push_back(std::move(e));
  };
  auto take = [&](auto& list, bool waiting) {
    for (auto it = list.begin(); it != list.end(); ++it) {
      Entry& e = **it;
      if (e.id == id) {
        std::unique_ptr<Entry> gone = std::move(*it);
        list.erase(it);
        if (!gone->followers.empty()) {  // the others of its prompt go on, as a group of their own
          std::unique_ptr<Entry> next = std::move(gone->followers.front());
          for (size_t i = 1; i < gone->followers.size(); ++i) next->followers.push_back(std::move(gone->followers[i]));
          gone->followers.clear();
          next->admitted = waiting ? false : true;
          auto pos = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) { return w->id > next->id; });
          waiting_.insert(pos, std::move(next));
        }
        end(std::move(gone));
        return true;
      }
      for (auto f = e.followers.begin(); f != e.followers.end(); ++f)
        if ((*f)->id == id) {
          std::unique_ptr<Entry> gone = std::move(*f);
          e.followers.erase(f);
          end(std::move(gone));
          return true;
        }
    }
    return false;
  };
  if (!take(running_, false)) take(waiting_, true);
}

bool Scheduler::never_admitted(Id id) const {
  for (const auto& e : waiting_) {
    if (e->id == id) return !e->admitted;
    for (const auto& f : e->followers)
      if (f->id == id) return !e->admitted;
  }
  return false;
}

std::vector<Scheduler::Update> Scheduler::fail(const std::string& message, bool waiting) {
  std::vector<Update> updates;
  for (auto& e : cancelled_) updates.push_back(update_of(*e));
  cancelled_.clear();
  auto end_all = [&](auto& list) {
    for (auto& e : list) {
      try {
        release(*e);
      } catch (const std::exception&) {  // a sequence the runner no longer knows: nothing left to free
        e->seq = -1;
      }
      e->gen->finish(FinishReason::Error, message);
      updates.push_back(update_of(*e));
      for (auto& f : e->followers) {
        f->gen->finish(FinishReason::Error, message);
        updates.push_back(update_of(*f));
      }
      e->followers.clear();
    }
    list.clear();
  };
  end_all(running_);
  if (waiting) end_all(waiting_);
  blocked_ = false;
  return updates;
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
  return {e.id, e.gen->take_output(), e.gen->prompt_tokens(), e.gen->generated_tokens(), e.gen->cached_tokens()};
}

void Scheduler::attach_prefix(Entry& e) {
  if (!cfg_.prefix_cache) return;
  Generation& g = *e.gen;
  const bool fresh = !g.chunk_fixed() && g.fed() == 0 && g.generated_tokens() == 0;
  const int chunk = runner_.cache_config().max_chunk;
  const int len = runner_.prefix_match(g.tokens(), g.prompt_tokens(), chunk);
  if (len > 0 && g.skip_prefix(len, chunk)) runner_.prefix_attach(e.seq, g.tokens(), len);
  if (fresh) runner_.prefix_count(g.cached_tokens(), g.prompt_tokens() - g.cached_tokens());
}

void Scheduler::store_prefix(Entry& e, int fed_before) {
  const Generation& g = *e.gen;
  const int chunk = runner_.cache_config().max_chunk;
  if (!cfg_.prefix_cache || g.fed() > g.prompt_tokens() || g.fed() % chunk != 0 || g.fed() == fed_before) return;
  runner_.prefix_store(e.seq, g.tokens(), g.fed());
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
  int forks = 0;     // choices of running groups still to be forked: each will take a slot, windows and the leader's
                     // pages
  for (const auto& e : running_) {
    reserved += pool.pages_short(e->seq, room(*e->gen));
    forks += int(e->followers.size());
    reserved += int(e->followers.size()) * pool.layout().sequence_pages(room(*e->gen));
  }
  for (;;) {
    if (waiting_.empty()) break;
    Entry& w = *waiting_.front();
    const int n = group_size(w);
    if (int(running_.size()) + forks + n > cfg_.max_seqs || pool.n_live() + forks + n > pool.n_slots()) break;
    // Each sequence takes its windows' pages and its own (PagePool::can_open: the windows' pages in a row).
    const int need = n * pool.layout().sequence_pages(room(*w.gen));
    // A group larger than the pool admits alone with the leader's pages: choices that do not fit at the fork wait.
    const bool alone = running_.empty() && n > 1 && pool.layout().sequence_pages(room(*w.gen)) <= pool.free_pages();
    if ((need + reserved > pool.free_pages() && !alone) || !pool.can_open()) break;
    reserved += need - pool.layout().window_pages();  // the leader's windows leave the free pages at new_sequence
    forks += n - 1;
    w.seq = runner_.new_sequence();
    w.admitted = true;
    attach_prefix(w);
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

void Scheduler::fork_followers(Entry& leader, const RowLogits& row, std::vector<Update>& out) {
  const int V = runner_.config().vocab_size;
  std::vector<std::unique_ptr<Entry>> followers = std::move(leader.followers);
  leader.followers.clear();
  RowLogits shared = row;
  shared.gumbel = -1, shared.mass = nullptr;  // the leader's own draw and mass: a follower that needs them had the
                                              // step copy the whole row
  for (auto& f : followers) {
    f->gen->adopt_prefill(*leader.gen);
    f->gen->accept(shared, V);
    f->admitted = true;
    const Update first = update_of(*f);
    if (f->gen->finished()) {  // its first token ended it: it never needs a sequence
      out.push_back(first);
      continue;
    }
    out.push_back(first);
    const PagePool& pool = runner_.page_pool();
    if (pool.can_open() && pool.layout().window_pages() + pool.pages(leader.seq) <= pool.free_pages()) {
      f->seq = runner_.new_sequence();
      runner_.fork_sequence(leader.seq, f->seq);
      running_.push_back(std::move(f));
    } else {  // no room to fork now: recomputed from the queue like a preempted request (the same tokens)
      f->gen->preempt();
      ++preemptions_;
      auto pos = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) { return w->id > f->id; });
      waiting_.insert(pos, std::move(f));
    }
  }
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

template <class RowOf>
void Scheduler::choose_tokens(const std::vector<Item>& items, int row_values, const RowOf& row_of) {
  const int V = runner_.config().vocab_size;
  std::vector<size_t> choosing;  // the items whose chunk predicts and whose generation chooses a token now
  for (size_t b = 0; b < items.size(); ++b) {
    const Generation& g = *items[b].e->gen;
    if (g.predicts(items[b].n) && !g.finished() && g.generated_tokens() < g.params().max_tokens) choosing.push_back(b);
  }
  const auto choose_all = [&](int values, const auto& row) {  // values: logits a choice reads
    const auto one = [&](int64_t i, int) {
      const size_t b = choosing[size_t(i)];
      chosen_[b] = items[b].e->gen->choose(row(size_t(i), b), V);
    };
    if (choosing.size() >= 2 && choosing.size() * size_t(values) >= kParallelChoiceWork) {
      if (!choice_pool_)
        choice_pool_ = std::make_unique<ThreadPool>(std::min(16, int(std::thread::hardware_concurrency())));
      choice_pool_->parallel_for(int64_t(choosing.size()), one);
    } else {
      for (size_t i = 0; i < choosing.size(); ++i) one(int64_t(i), 0);
    }
  };
  choose_all(row_values, [&](size_t, size_t b) { return row_of(b); });
  // A nucleus past a row's largest logits: that draw again from the row itself (a flat distribution; every row of
  // random weights).
  std::erase_if(choosing, [&](size_t b) { return chosen_[b]->id >= 0; });
  if (choosing.empty()) return;
  rows_.resize(choosing.size() * size_t(V));
  for (size_t i = 0; i < choosing.size(); ++i) runner_.row_logits(int(choosing[i]), rows_.data() + i * size_t(V));
  choose_all(V, [&](size_t i, size_t b) {
    return RowLogits{.argmax = argmax_[b], .logits = rows_.data() + i * size_t(V)};
  });
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

  // One forward: ids of every item concatenated; the last row's logits (or argmax) where a chunk predicts. On a runner
  // that keeps the logits, a choice that needs only its row's largest (top_k sampling; top_p / min_p with the row's
  // mass) or its Gumbel draw (sampling at a temperature alone) gets that instead of the row: the step copies whole rows
  // only when one of its choices needs them (then every choice of the step reads its row), and a row whose nucleus
  // reaches past its largest logits alone.
  const int V = runner_.config().vocab_size;
  seqs_.clear(), n_.clear(), ids_.clear();
  bool predict = false, whole_rows = false, gumbel = false, mass = false;
  int top_k = 0;
  const bool device = cfg_.device_sampling;
  const auto wants = [&](const Generation& g, bool follower) {
    if (!g.needs_logits()) return;
    const int k = g.top_candidates(V);
    if (device && !follower && g.gumbel_draw(V) && runner_.gumbel_sampling())
      gumbel = true;  // one draw per row: a follower (n > 1) draws its own from the whole row
    else if (device && k > 0 && k <= runner_.max_top_logits() && !(follower && g.needs_row_mass(V)))
      top_k = std::max(top_k, k), mass |= g.needs_row_mass(V);  // the mass at the leader's own query
    else
      whole_rows = true;
  };
  for (const Item& it : items) {
    seqs_.push_back(it.e->seq);
    n_.push_back(it.n);
    ids_.insert(ids_.end(), it.e->gen->ids(), it.e->gen->ids() + it.n);
    if (it.e->gen->predicts(it.n)) {
      predict = true;
      wants(*it.e->gen, false);
      for (const auto& f : it.e->followers) wants(*f->gen, true);
    }
    info.rows += it.n;
    info.decode_rows += it.n == 1;
  }
  if (whole_rows) top_k = 0, gumbel = false, mass = false;
  info.seqs = int(items.size());
  if (info_out) *info_out = info;
  argmax_.resize(items.size());
  if (whole_rows) logits_.resize(items.size() * size_t(V));
  if (top_k > 0) top_ids_.resize(items.size() * size_t(top_k)), top_vals_.resize(items.size() * size_t(top_k));
  if (gumbel) {
    draws_.assign(items.size(), gumbel::Draw{0, 1.0});  // rows that draw otherwise: any draw, unread
    drawn_.resize(items.size());
    for (size_t b = 0; b < items.size(); ++b)
      if (items[b].e->gen->predicts(items[b].n) && items[b].e->gen->gumbel_draw(V))
        draws_[b] = items[b].e->gen->next_draw();
  }
  if (mass) {
    mass_queries_.assign(items.size(), smath::MassQuery{1.0, 0.0});  // rows that draw otherwise: any query, unread
    masses_.resize(items.size());
    for (size_t b = 0; b < items.size(); ++b)
      if (items[b].e->gen->predicts(items[b].n) && items[b].e->gen->needs_row_mass(V))
        mass_queries_[b] = items[b].e->gen->mass_query();
  }
  std::string failed;  // the step's error, when the forward (or a runner call for the choices) threw
  const auto fail_step = [&](const std::exception& err) {
    // Which of the step's sequences hold what is unknown now: every request of the step ends with the error (its
    // sequence is freed below), whatever threw: a kvq::Error, a lost device, bad_alloc.
    const Error* e = dynamic_cast<const Error*>(&err);
    const std::string what = e ? e->message() : fmt::format("the engine step failed: {}", err.what());
    for (const Item& it : items) it.e->gen->finish(FinishReason::Error, what);
    failed = what;
    info.failed = true;
    info.device_lost = dynamic_cast<const DeviceLost*>(&err) != nullptr;
    info.failure = what;
    if (info_out) *info_out = info;
  };
  try {
    runner_.forward(seqs_, n_, ids_.data(), predict ? LogitRows::Last : LogitRows::None,
                    whole_rows ? logits_.data() : nullptr, predict ? argmax_.data() : nullptr);
    if (top_k > 0) runner_.top_logits(top_k, top_ids_.data(), top_vals_.data());
    if (gumbel) runner_.gumbel_argmax(draws_.data(), drawn_.data());
    if (mass) runner_.row_mass(mass_queries_.data(), masses_.data());
  } catch (const std::exception& err) {
    fail_step(err);
  }
  const auto row_of = [&](size_t b) {
    RowLogits row{.argmax = argmax_[b]};
    if (whole_rows) row.logits = logits_.data() + b * size_t(V);
    if (top_k > 0)
      row.top_ids = top_ids_.data() + b * size_t(top_k), row.top_logits = top_vals_.data() + b * size_t(top_k),
      row.top_n = top_k;
    if (gumbel && items[b].e->gen->gumbel_draw(V)) row.gumbel = drawn_[b];
    if (mass && items[b].e->gen->needs_row_mass(V)) row.mass = &masses_[b];
    return row;
  };
  chosen_.assign(items.size(), std::nullopt);
  if (failed.empty()) {
    try {
      choose_tokens(items, whole_rows ? V : std::max(top_k, 1), row_of);
    } catch (const std::exception& err) {  // a row fetched for a wide nucleus, or a choice that threw
      chosen_.assign(items.size(), std::nullopt);
      fail_step(err);
    }
  }
  std::vector<Update> forked;  // the first tokens of choices forked in this step
  for (size_t b = 0; b < items.size(); ++b) {
    Entry& e = *items[b].e;
    Generation& g = *e.gen;
    if (g.finished()) {  // the step failed: the choices waiting for this leader's prefill end with it
      for (auto& f : e.followers) {
        f->gen->finish(FinishReason::Error, failed);
        forked.push_back(update_of(*f));
      }
      e.followers.clear();
      continue;
    }
    const bool predicts = g.predicts(items[b].n);
    const int fed_before = g.fed();
    g.fed_chunk(items[b].n);
    store_prefix(e, fed_before);
    const RowLogits row = row_of(b);
    if (predicts && !e.followers.empty()) fork_followers(e, row, forked);
    if (predicts && chosen_[b])
      g.take(std::move(*chosen_[b]));
    else if (predicts)
      g.accept(row, V);  // at max_tokens: it finishes
  }
  for (const Item& it : items) {
    Update u = update_of(*it.e);
    if (u.output.finish != FinishReason::None || !u.output.tokens.empty() || !u.output.text.empty())
      updates.push_back(std::move(u));
  }
  for (Update& u : forked) updates.push_back(std::move(u));
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
