// The scheduler on a thread of its own, for the server: requests come in from any thread (submit), their updates go
// back through one RequestStream each, and a stream can be cancelled (a client that went away) at any time; the
// engine frees its sequence before its next step. The engine thread is the only one that touches the scheduler and
// the runner.
//
// Admission to the queue: at most max_seqs running + max_queue waiting requests are in flight; submit() refuses more
// (QueueFull), everything once close() was called (Closed, for the drain on SIGTERM), and everything once the device
// is lost (Unavailable).
//
// Failures never end the engine thread. An exception from a step's forward ends that step's requests with
// FinishReason::Error and its message (Scheduler::step); one from elsewhere in the step (admission, preemption, a
// bad_alloc) ends every running request the same way (Scheduler::fail); the engine goes on with the queue. A lost
// device (DeviceLost, from a step or anywhere else) ends every request in flight with FinishReason::Error, refuses
// every later submit and turns health() false with the reason: the server answers /health with 503.
//
// Timeouts (EngineConfig): a request that waits in the queue longer than queue_timeout without being admitted ends
// with FinishReason::QueueTimeout; one in flight longer than request_timeout (arrival to its last token) ends with
// FinishReason::Deadline. The engine checks them before every step and at least every kTick when idle.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
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
  // Waits up to timeout for output (0: does not wait); moves everything pending into out (text appended, tokens
  // appended, the finish once it has finished). Returns false when nothing came.
  bool wait(GenerationOutput& out, std::chrono::milliseconds timeout);
  bool finished() const;
  int prompt_tokens() const { return prompt_tokens_; }
  int generated_tokens() const;  // so far
  int cached_tokens() const;     // prompt tokens taken from the prefix cache
  Clock::time_point arrival() const { return arrival_; }
  // Called on the engine thread after each update is delivered (a front end that waits on events, not on wait());
  // called once at once when output is already pending. Must not block; set once, before or after output arrives.
  void on_update(std::function<void()> notify);

 private:
  friend class Engine;
  void deliver(GenerationOutput&& o, int generated, int cached = 0);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  GenerationOutput pending_;
  bool finished_ = false;
  int generated_ = 0;
  int cached_ = 0;
  int prompt_tokens_ = 0;
  std::function<void()> notify_;
  Clock::time_point arrival_, last_token_;
  Clock::time_point queue_deadline_ = Clock::time_point::max();  // not admitted by then: QueueTimeout
  Clock::time_point deadline_ = Clock::time_point::max();        // not finished by then: Deadline
  bool first_token_seen_ = false;
  std::atomic<bool> cancel_{false};
};

struct EngineConfig {
  SchedulerConfig scheduler;
  int max_queue = 64;              // waiting requests at most, beyond the running ones
  double queue_timeout_s = 0;      // > 0: a request not admitted after this many seconds ends (QueueTimeout)
  double request_timeout_s = 0;    // > 0: a request not finished this many seconds after arrival ends (Deadline)
  void validate() const;           // kvq::Error on negative or non-finite values
};

// What /metrics reports; a snapshot taken after every step.
struct EngineStats {
  int running = 0, waiting = 0;                  // requests
  int64_t prompt_tokens = 0, generated_tokens = 0;  // totals of finished and running requests
  int64_t finished_stop = 0, finished_length = 0, finished_cancelled = 0, finished_error = 0;
  int64_t finished_queue_timeout = 0, finished_deadline = 0;
  int64_t step_failures = 0;                     // steps that threw (their requests ended with an error)
  int64_t preemptions = 0, steps = 0;
  bool healthy = true;                           // false once the device is lost
  PrefixCacheStats prefix;                       // the runner's prefix cache
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

  enum class Submit { Queued, QueueFull, Closed, Unavailable };
  // Queues a request (its max_cache_length must fit the runner's context: checked by the caller). stream: set when
  // Queued.
  Submit submit(std::unique_ptr<Generation> g, std::shared_ptr<RequestStream>& stream);
  // n choices of one prompt (Scheduler::add_group: one prefill, the others forked from it): one stream each, in
  // order. They count as n requests in flight. n must be at most the scheduler's running requests (the caller checks).
  Submit submit_group(std::vector<std::unique_ptr<Generation>> gens,
                      std::vector<std::shared_ptr<RequestStream>>& streams);
  void cancel(RequestStream& s);
  // Refuse every later submit(); what is in flight goes on.
  void close();
  int in_flight() const;  // submitted and not finished
  // Whether the engine can serve (false once the device is lost); reason: why not.
  bool healthy(std::string* reason = nullptr) const;
  EngineStats stats() const;
  const SchedulerConfig& scheduler_config() const { return sched_.config(); }
  const EngineConfig& config() const { return cfg_; }
  int max_queue() const { return cfg_.max_queue; }

  static constexpr auto kTick = std::chrono::milliseconds(50);  // idle re-check of the timeouts

 private:
  struct Pending {  // one request, or the choices of one prompt
    std::vector<std::unique_ptr<Generation>> gens;
    std::vector<std::shared_ptr<RequestStream>> streams;
  };
  void loop();
  void step_once(bool stopping);
  void expire(Clock::time_point now);
  void lose_device(const std::string& why);
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
  bool lost_ = false;        // the device is lost: nothing runs any more
  std::string lost_reason_;

  mutable std::mutex stats_mu_;
  EngineStats stats_;
  std::thread thread_;
};

}  // namespace kvq
