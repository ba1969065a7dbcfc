// The scheduler on a thread of its own, for the server: requests come in from any thread (submit), their updates go
// back through one RequestStream each, and a stream can be cancelled (a client that went away) at any time; the
// engine frees its sequence before its next step. The engine thread is the only one that touches the scheduler and
// the runner.
//
// Admission to the queue: at most max_seqs running + max_queue waiting requests are in flight; submit() refuses more
// (QueueFull) and everything once close() was called (Closed, for the drain on SIGTERM).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/histogram.h"
#include "engine/scheduler.h"

namespace kvq {

using Clock = std::chrono::steady_clock;

class Engine;

// One request's updates, from the engine thread to whoever waits for them.
class RequestStream {
 public:
  // Waits up to timeout for output; moves everything pending into out (text appended, tokens appended, the finish
  // once it has finished). Returns false when nothing came.
  bool wait(GenerationOutput& out, std::chrono::milliseconds timeout);
  bool finished() const;
  int prompt_tokens() const { return prompt_tokens_; }
  int generated_tokens() const;  // so far
  Clock::time_point arrival() const { return arrival_; }

 private:
  friend class Engine;
  void deliver(GenerationOutput&& o, int generated);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  GenerationOutput pending_;
  bool finished_ = false;
  int generated_ = 0;
  int prompt_tokens_ = 0;
  Clock::time_point arrival_, last_token_;
  bool first_token_seen_ = false;
  std::atomic<bool> cancel_{false};
};

struct EngineConfig {
  SchedulerConfig scheduler;
  int max_queue = 64;  // waiting requests at most, beyond the running ones
};

// What /metrics reports; a snapshot taken after every step.
struct EngineStats {
  int running = 0, waiting = 0;                  // requests
  int64_t prompt_tokens = 0, generated_tokens = 0;  // totals of finished and running requests
  int64_t finished_stop = 0, finished_length = 0, finished_cancelled = 0, finished_error = 0;
  int64_t preemptions = 0, steps = 0;
  int pages_used = 0, pages_free = 0, slots_live = 0, slots = 0;
  size_t bytes_used = 0, bytes_free = 0, bytes_total = 0;  // the page pool's own accounting (pages + windows)
  Histogram ttft{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};             // seconds
  Histogram itl{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};        // seconds
  Histogram e2e{{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}};                        // seconds
};

class Engine {
 public:
  // The runner must outlive the engine. Starts the engine thread.
  Engine(Runner& runner, EngineConfig cfg);
  ~Engine();  // cancels whatever is left and joins the thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  enum class Submit { Queued, QueueFull, Closed };
  // Queues a request (its max_cache_length must fit the runner's context: checked by the caller). stream: set when
  // Queued.
  Submit submit(std::unique_ptr<Generation> g, std::shared_ptr<RequestStream>& stream);
  void cancel(RequestStream& s);
  // Refuse every later submit(); what is in flight goes on.
  void close();
  int in_flight() const;  // submitted and not finished
  EngineStats stats() const;
  const SchedulerConfig& scheduler_config() const { return sched_.config(); }
  int max_queue() const { return cfg_.max_queue; }

 private:
  struct Pending {
    std::unique_ptr<Generation> gen;
    std::shared_ptr<RequestStream> stream;
  };
  void loop();
  void deliver(Scheduler::Update& u);
  void publish();

  Runner& runner_;
  EngineConfig cfg_;
  Scheduler sched_;  // engine thread only
  std::map<Scheduler::Id, std::shared_ptr<RequestStream>> active_;  // engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> inbox_;
  int in_flight_ = 0;
  bool closed_ = false, stop_ = false, poke_ = false;

  mutable std::mutex stats_mu_;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace kvq
