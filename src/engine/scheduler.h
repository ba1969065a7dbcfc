// Continuous batching over Runner::forward: the one request loop of kvq run, bench decode and kvq serve.
//
// Each step() is one forward over the running requests: every decoding request's next token, then prefill chunks in
// admission order, within a token budget (rows per step). A prefill chunk is at most the cache's chunk size and is
// cut to fit only when it would be the step's first chunk, so while the budget holds a whole chunk beside every
// decode token (the CPU default) a request's chunks do not depend on the load. A replayed chunk (recompute after a
// preemption, engine/generation.h) is never cut.
//
// Admission (first come, first served): a waiting request is admitted while a sequence slot is free and the page
// pool, after the pages the running requests still need to hold their known tokens + 1, holds its windows' pages (in
// a row: PagePool::can_open) and pages for its own known tokens + 1 (the pool's own arithmetic:
// PagePool::pages_short, CacheLayout::sequence_pages). Requests grow as they
// decode; when the next step needs more pages than are free, the newest running request is preempted: its sequence
// is freed and it goes back to the front of the queue, to be recomputed. No request is dropped: the pool holds one
// sequence of the full context (PagePool::for_budget), and a request is accepted only when its cache fits that
// context.
//
// n > 1 choices of one prompt (add_group): the group is admitted as one request that needs n slots and n times the
// pages; its first generation (the leader) is prefilled, and where its prompt ends the others are forked from its
// sequence (Runner::fork_sequence: the cache copied, no prefill of their own) and choose their first token from the
// same logits, each with its own sampler; then each runs (and is preempted, replaying the leader's chunks as its own)
// as a request of its own. A choice that finds no free slot or pages at the fork waits in the queue to be recomputed
// like a preempted request: the same tokens. Cancelling the leader before the fork requeues the others as a group.
//
// Policy kPrefillFirst (bench decode): a step holds only prefill chunks while any request is prefilling, so every
// sequence reaches its context before the decode steps run, all together.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <memory>
#include <optional>
#include <vector>

#include "engine/generation.h"
#include "common/thread_pool.h"
#include "model/runner.h"

namespace kvq {

struct SchedulerConfig {
  enum Policy { kMixed, kPrefillFirst };
  int max_seqs = 0;      // running requests at most (0: the runner's max_seqs)
  int token_budget = 0;  // rows per step (0: min(runner max_rows, max(runner step_rows, max_chunk + max_seqs)));
                         // >= max_chunk and max_seqs
  Policy policy = kMixed;
  // Prefix caching (kv/prefix_cache.h): the scheduler enables it on the runner, attaches the longest cached prefix of
  // each admitted prompt to its new sequence and stores a prompt's state after each of its chunks that ends at a
  // multiple of the chunk size. Off for kvq run and bench decode; kvq serve: on unless --no-prefix-cache.
  bool prefix_cache = false;
  // Sampled requests whose choice needs only a row's top_k largest logits (model/sampler.h: top_candidates) or its
  // Gumbel draw (sampling at a temperature alone: draws_by_gumbel) get that from a runner that keeps the logits
  // (Runner::top_logits, gumbel_argmax: the GPU) instead of the whole row. The same tokens either way; off (kvq serve
  // --host-sampling): every sampled row is copied and sampled on the host, for comparison.
  bool device_sampling = true;
};

// What one step did.
struct StepInfo {
  int rows = 0;          // tokens fed (Σ n)
  int decode_rows = 0;   // of which one-token decode steps
  int seqs = 0;          // sequences in the step
  int preempted = 0;     // requests preempted before it
  int admitted = 0;      // requests admitted before it
  bool failed = false;   // the forward threw: every request of the step finished with FinishReason::Error
  bool device_lost = false;  // ... and it was DeviceLost: the runner cannot run another step
  std::string failure;       // what the forward threw
};

class Scheduler {
 public:
  using Id = uint64_t;
  // The runner must outlive the scheduler; the scheduler owns its sequences (none may be live when it starts).
  Scheduler(Runner& runner, SchedulerConfig cfg = {});
  ~Scheduler();

  const SchedulerConfig& config() const { return cfg_; }
  Runner& runner() { return runner_; }

  // Queues a request. Throws kvq::Error when its cache would outgrow the runner's context
  // (Generation::max_cache_length).
  Id add(std::unique_ptr<Generation> g);
  // Queues n >= 1 choices of one prompt (the same prompt; each its own sampler and seed), see the header comment.
  // Returns their ids in order. Throws as add() does, and when n exceeds the running requests at most.
  std::vector<Id> add_group(std::vector<std::unique_ptr<Generation>> gens);
  // Ends a request now (running: its sequence is freed; waiting: removed) with reason (Cancelled, QueueTimeout,
  // Deadline, Error: message). Its final update comes from the next step(). Unknown or finished ids are ignored.
  void cancel(Id id, FinishReason reason = FinishReason::Cancelled, std::string message = {});
  // Whether id waits in the queue and was never admitted (a preempted request waits again, but was admitted).
  bool never_admitted(Id id) const;


  struct Update {
    Id id;
    GenerationOutput output;  // output.finish != None: the request is gone
    int prompt_tokens;
    int generated_tokens;
    int cached_tokens;  // prompt tokens taken from the prefix cache
  };
  // One forward (when anything is runnable) and the updates of every request it touched; finished requests are
  // removed. Any exception from the forward finishes every request of the step with FinishReason::Error and its
  // message (StepInfo::failed; DeviceLost: device_lost too); the scheduler goes on. An exception outside the forward
  // (admission, preemption) propagates: the caller ends the running requests with fail_running().
  std::vector<Update> step(StepInfo* info = nullptr);
  // Ends every running request with FinishReason::Error and message, freeing their sequences (their state is unknown
  // after a step that threw outside the forward); with waiting = true the queued ones too. Returns their final
  // updates and those of requests cancelled since the last step.
  std::vector<Update> fail(const std::string& message, bool waiting = false);

  bool idle() const { return running_.empty() && waiting_.empty() && cancelled_.empty(); }
  int n_running() const;  // requests admitted (choices waiting for their fork included)
  int n_waiting() const;
  int64_t preemptions() const { return preemptions_; }
  const Generation* find(Id id) const;

 private:
  struct Entry {
    Id id;
    std::unique_ptr<Generation> gen;
    int seq = -1;           // runner sequence while running
    bool admitted = false;  // was admitted once (a preempted request waits again)
    std::vector<std::unique_ptr<Entry>> followers;  // the other choices of its prompt, until they are forked
  };
  struct Item {  // one sequence of a step
    Entry* e;
    int n;
  };
  void admit(StepInfo& info);
  std::vector<Item> plan_step(bool& blocked);
  int pages_needed(const std::vector<Item>& items) const;
  void preempt_newest(std::vector<Item>& items);
  void release(Entry& e);
  void attach_prefix(Entry& e);   // a new sequence: the longest cached prefix of its prompt (prefix caching)
  void store_prefix(Entry& e, int fed_before);  // after a forward: a chunk that ended at a multiple of the chunk
  static std::unique_ptr<Entry> make_entry(Id id, std::unique_ptr<Generation> g);
  // After the forward that fed the leader's whole prompt: forks its followers and lets each choose its first token
  // from the leader's row (its logits, top logits or argmax; not its Gumbel draw or mass); their updates go to out.
  void fork_followers(Entry& leader, const RowLogits& row, std::vector<Update>& out);
  // The tokens of the step's choices into chosen_[b] (step() empties it first; Generation::choose: each changes only its
  // own sampler), from row_of(b), item b's RowLogits of row_values logits a choice reads (the vocabulary, or the
  // largest top_k): in parallel when there is enough of that work (sampling a row of a large vocabulary on the host
  // takes milliseconds, the top_p path at 151,936 logits, more than a GPU's decode step at dozens of sequences); a
  // choice whose row's largest logits do not decide it is made again from its row (Runner::row_logits).
  static constexpr size_t kParallelChoiceWork = size_t(1) << 15;  // choices x logits each reads
  template <class RowOf>
  void choose_tokens(const std::vector<Item>& items, int row_values, const RowOf& row_of);
  int group_size(const Entry& e) const { return 1 + int(e.followers.size()); }
  static Update update_of(Entry& e);

  Runner& runner_;
  SchedulerConfig cfg_;
  Id next_id_ = 1;
  std::vector<std::unique_ptr<Entry>> running_;  // admission order (oldest first)
  std::deque<std::unique_ptr<Entry>> waiting_;   // arrival order (a preempted request goes back in its place)
  std::vector<std::unique_ptr<Entry>> cancelled_;  // cancelled since the last step, their updates not given yet
  bool blocked_ = false;        // a running request could not be scheduled last step: hold admissions
  int64_t preemptions_ = 0;
  std::vector<int> seqs_, n_;   // step buffers
  std::vector<int32_t> ids_, argmax_, top_ids_, drawn_;
  std::vector<float> logits_, top_vals_;
  std::vector<gumbel::Draw> draws_;
  std::vector<std::optional<GeneratedToken>> chosen_;  // [items] choose_tokens' tokens
  std::vector<smath::MassQuery> mass_queries_;
  std::vector<smath::RowMass> masses_;
  std::vector<float> rows_;  // rows of logits fetched after the step (choose_tokens)
  std::unique_ptr<ThreadPool> choice_pool_;           // its threads, made when first needed
};

}  // namespace kvq
