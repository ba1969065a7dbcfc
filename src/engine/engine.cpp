#include "engine/engine.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace kvq {

namespace {
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// now + s seconds, or never for s <= 0.
Clock::time_point after(Clock::time_point now, double s) {
  return s > 0 ? now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s))
               : Clock::time_point::max();
}

std::string what_of(const std::exception& e) {
  if (const Error* k = dynamic_cast<const Error*>(&e)) return k->message();
  return e.what();
}
}  // namespace

bool RequestStream::wait(GenerationOutput& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  auto ready = [&] {
    return !pending_.text.empty() || !pending_.tokens.empty() || pending_.finish != FinishReason::None;
  };
  if (!cv_.wait_for(lk, timeout, ready)) return false;
  out.text += pending_.text;
  out.tokens.insert(out.tokens.end(), pending_.tokens.begin(), pending_.tokens.end());
  if (pending_.finish != FinishReason::None) out.finish = pending_.finish, out.error = pending_.error;
  pending_ = {};
  return true;
}

bool RequestStream::finished() const {
  std::lock_guard<std::mutex> lk(mu_);
  return finished_;
}

int RequestStream::generated_tokens() const {
  std::lock_guard<std::mutex> lk(mu_);
  return generated_;
}

int RequestStream::cached_tokens() const {
  std::lock_guard<std::mutex> lk(mu_);
  return cached_;
}

void RequestStream::on_update(std::function<void()> notify) {
  bool pending;
  {
    std::lock_guard<std::mutex> lk(mu_);
    notify_ = notify;
    pending = !pending_.text.empty() || !pending_.tokens.empty() || pending_.finish != FinishReason::None;
  }
  if (pending) notify();
}

void RequestStream::deliver(GenerationOutput&& o, int generated, int cached) {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lk(mu_);
    pending_.text += o.text;
    pending_.tokens.insert(pending_.tokens.end(), o.tokens.begin(), o.tokens.end());
    if (o.finish != FinishReason::None) {
      pending_.finish = o.finish;
      pending_.error = std::move(o.error);
      finished_ = true;
    }
    generated_ = generated;
    cached_ = std::max(cached_, cached);
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) notify();
}

void EngineConfig::validate() const {
  KVQ_CHECK(max_queue >= 0, "--max-queue {} must be >= 0", max_queue);
  KVQ_CHECK(std::isfinite(queue_timeout_s) && queue_timeout_s >= 0,
            "--queue-timeout {} must be >= 0 seconds (0: none)", queue_timeout_s);
  KVQ_CHECK(std::isfinite(request_timeout_s) && request_timeout_s >= 0,
            "--request-timeout {} must be >= 0 seconds (0: none)", request_timeout_s);
}

Engine::Engine(Runner& runner, EngineConfig cfg) : runner_(runner), cfg_(cfg), sched_(runner, cfg.scheduler) {
  cfg_.validate();
  publish();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Engine::Submit Engine::submit(std::unique_ptr<Generation> g, std::shared_ptr<RequestStream>& stream) {
  std::vector<std::unique_ptr<Generation>> gens;
  gens.push_back(std::move(g));
  std::vector<std::shared_ptr<RequestStream>> streams;
  const Submit s = submit_group(std::move(gens), streams);
  if (s == Submit::Queued) stream = streams[0];
  return s;
}

Engine::Submit Engine::submit_group(std::vector<std::unique_ptr<Generation>> gens,
                                    std::vector<std::shared_ptr<RequestStream>>& streams) {
  KVQ_CHECK(!gens.empty(), "engine: a submit of no request");
  std::lock_guard<std::mutex> lk(mu_);
  if (lost_) return Submit::Unavailable;
  if (closed_ || stop_) return Submit::Closed;
  const int n = int(gens.size());
  if (in_flight_ + n > sched_.config().max_seqs + cfg_.max_queue) return Submit::QueueFull;
  const Clock::time_point now = Clock::now();
  streams.clear();
  for (const auto& g : gens) {
    auto stream = std::make_shared<RequestStream>();
    stream->arrival_ = now;
    stream->queue_deadline_ = after(now, cfg_.queue_timeout_s);
    stream->deadline_ = after(now, cfg_.request_timeout_s);
    stream->prompt_tokens_ = g->prompt_tokens();
    streams.push_back(std::move(stream));
  }
  inbox_.push_back({std::move(gens), streams});
  in_flight_ += n;
  cv_.notify_all();
  return Submit::Queued;
}

void Engine::cancel(RequestStream& s) {
  s.cancel_ = true;
  {
    std::lock_guard<std::mutex> lk(mu_);
    poke_ = true;
  }
  cv_.notify_all();
}

void Engine::close() {
  std::lock_guard<std::mutex> lk(mu_);
  closed_ = true;
}

int Engine::in_flight() const {
  std::lock_guard<std::mutex> lk(mu_);
  return in_flight_;
}

bool Engine::healthy(std::string* reason) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (reason) *reason = lost_reason_;
  return !lost_;
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(stats_mu_);
  return stats_;
}

void Engine::loop() {
  for (;;) {
    std::vector<Pending> in;
    bool stopping, lost;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, kTick, [&] { return stop_ || poke_ || !inbox_.empty() || (!sched_.idle() && !lost_); });
      stopping = stop_;
      lost = lost_;
      in.swap(inbox_);
      poke_ = false;
    }
    for (Pending& p : in) {
      try {
        KVQ_CHECK(!lost, "the device is lost: {}", lost_reason_);
        const std::vector<Scheduler::Id> ids = sched_.add_group(std::move(p.gens));
        for (size_t i = 0; i < ids.size(); ++i) active_[ids[i]] = p.streams[i];
      } catch (const std::exception& e) {  // the caller checks the context first; this is the scheduler's own check
        for (const auto& stream : p.streams) {
          GenerationOutput o;
          o.finish = FinishReason::Error;
          o.error = what_of(e);
          stream->deliver(std::move(o), 0);
        }
        {
          std::lock_guard<std::mutex> lk(stats_mu_);
          stats_.finished_error += int64_t(p.streams.size());
        }
        std::lock_guard<std::mutex> lk(mu_);
        in_flight_ -= int(p.streams.size());
      }
    }
    try {
      step_once(stopping);
    } catch (const DeviceLost& e) {
      lose_device(e.message());
    } catch (const std::exception& e) {
      // Outside the forward (admission, preemption, bookkeeping): the running requests' state is unknown. They end
      // with the error; the queue goes on.
      std::vector<Scheduler::Update> updates;
      try {
        updates = sched_.fail(fmt::format("the engine step failed: {}", what_of(e)));
      } catch (const std::exception& e2) {
        lose_device(fmt::format("the engine cannot recover from a failed step: {}", what_of(e2)));
      }
      {  // counted before the requests hear of it, as lose_device() marks the loss first
        std::lock_guard<std::mutex> lk(stats_mu_);
        ++stats_.step_failures;
      }
      for (Scheduler::Update& u : updates) deliver(u);
    }
    publish();
    if (stopping && active_.empty()) return;
  }
}

void Engine::step_once(bool stopping) {
  for (auto& [id, s] : active_)
    if (stopping || s->cancel_) sched_.cancel(id);
  expire(Clock::now());
  if (lost_) return;  // engine thread: lost_ is written only here
  StepInfo info;
  std::vector<Scheduler::Update> updates = sched_.step(stopping ? nullptr : &info);
  {
    std::lock_guard<std::mutex> lk(stats_mu_);
    stats_.steps += info.seqs > 0;
    stats_.step_failures += info.failed;
  }
  // A lost device is marked before anyone hears of it: a client told of the failure finds /health 503 and is refused.
  // lose_device() ends every request in flight, this step's too; their updates below find them gone.
  if (info.device_lost) lose_device(info.failure);
  for (Scheduler::Update& u : updates) deliver(u);
}

void Engine::expire(Clock::time_point now) {
  for (auto& [id, s] : active_) {
    if (now >= s->deadline_)
      sched_.cancel(id, FinishReason::Deadline,
                    fmt::format("the request ran past its deadline of {:g} s (--request-timeout)",
                                cfg_.request_timeout_s));
    else if (now >= s->queue_deadline_ && sched_.never_admitted(id))
      sched_.cancel(id, FinishReason::QueueTimeout,
                    fmt::format("the request waited in the queue for {:g} s without being admitted (--queue-timeout)",
                                cfg_.queue_timeout_s));
  }
}

void Engine::lose_device(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!lost_) lost_reason_ = why;
    lost_ = true;
  }
  {  // before any request hears of the loss, so that what it reads next (/metrics) already says so
    std::lock_guard<std::mutex> lk(stats_mu_);
    stats_.healthy = false;
  }
  std::vector<Scheduler::Update> updates;
  try {
    updates = sched_.fail(fmt::format("the device is lost: {}", why), /*waiting=*/true);
  } catch (const std::exception&) {  // nothing more can be freed; the streams still get their end below
  }
  for (Scheduler::Update& u : updates) deliver(u);
  // Whatever is still active never gets an update from the scheduler again: end it here.
  for (auto it = active_.begin(); it != active_.end();) {
    Scheduler::Update u{it->first, {}, it->second->prompt_tokens(), it->second->generated_tokens(), 0};
    u.output.finish = FinishReason::Error;
    u.output.error = fmt::format("the device is lost: {}", why);
    ++it;  // deliver() erases the entry
    deliver(u);
  }
}

void Engine::deliver(Scheduler::Update& u) {
  auto it = active_.find(u.id);
  if (it == active_.end()) return;
  RequestStream& s = *it->second;
  const Clock::time_point now = Clock::now();
  const bool done = u.output.finish != FinishReason::None;
  {
    std::lock_guard<std::mutex> lk(stats_mu_);
    if (!u.output.tokens.empty()) {
      if (!s.first_token_seen_) {
        stats_.ttft.observe(seconds(now - s.arrival_));
        stats_.prompt_tokens += u.prompt_tokens;
        s.first_token_seen_ = true;
      } else {
        stats_.itl.observe(seconds(now - s.last_token_) / double(u.output.tokens.size()));
      }
      s.last_token_ = now;
      stats_.generated_tokens += int64_t(u.output.tokens.size());
    }
    if (done) {
      stats_.e2e.observe(seconds(now - s.arrival_));
      switch (u.output.finish) {
        case FinishReason::Stop: ++stats_.finished_stop; break;
        case FinishReason::Length: ++stats_.finished_length; break;
        case FinishReason::Cancelled: ++stats_.finished_cancelled; break;
        case FinishReason::QueueTimeout: ++stats_.finished_queue_timeout; break;
        case FinishReason::Deadline: ++stats_.finished_deadline; break;
        default: ++stats_.finished_error; break;
      }
    }
  }
  std::shared_ptr<RequestStream> keep = it->second;  // the stream outlives its entry while it is delivered to
  if (done) {
    active_.erase(it);
    {
      std::lock_guard<std::mutex> lk(mu_);
      --in_flight_;
    }
    publish();  // before the client hears of the end: what it reads next (/metrics) counts its request gone
  }
  keep->deliver(std::move(u.output), u.generated_tokens, u.cached_tokens);
}

void Engine::publish() {
  const PagePool& pool = runner_.page_pool();
  int inbox;
  {
    std::lock_guard<std::mutex> lk(mu_);
    inbox = 0;
    for (const Pending& p : inbox_) inbox += int(p.streams.size());
  }
  std::lock_guard<std::mutex> lk(stats_mu_);
  stats_.running = sched_.n_running();
  stats_.waiting = sched_.n_waiting() + inbox;
  stats_.preemptions = sched_.preemptions();
  stats_.pages_used = pool.used_pages();
  stats_.pages_free = pool.free_pages();
  stats_.slots_live = pool.n_live();
  stats_.slots = pool.n_slots();
  stats_.bytes_used = pool.used_bytes();
  stats_.bytes_free = pool.free_bytes();
  stats_.bytes_total = pool.bytes();
  stats_.prefix = runner_.prefix_stats();
}

}  // namespace kvq
