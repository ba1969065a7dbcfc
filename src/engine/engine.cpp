#include "engine/engine.h"

#include "common/error.h"

namespace kvq {

namespace {
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
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

void RequestStream::deliver(GenerationOutput&& o, int generated) {
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
  }
  cv_.notify_all();
}

Engine::Engine(Runner& runner, EngineConfig cfg) : runner_(runner), cfg_(cfg), sched_(runner, cfg.scheduler) {
  KVQ_CHECK(cfg_.max_queue >= 0, "--max-queue {} must be >= 0", cfg_.max_queue);
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
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_ || stop_) return Submit::Closed;
  if (in_flight_ >= sched_.config().max_seqs + cfg_.max_queue) return Submit::QueueFull;
  stream = std::make_shared<RequestStream>();
  stream->arrival_ = Clock::now();
  stream->prompt_tokens_ = g->prompt_tokens();
  inbox_.push_back({std::move(g), stream});
  ++in_flight_;
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

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(stats_mu_);
  return stats_;
}

void Engine::loop() {
  for (;;) {
    std::vector<Pending> in;
    bool stopping;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || poke_ || !inbox_.empty() || !sched_.idle(); });
      stopping = stop_;
      in.swap(inbox_);
      poke_ = false;
    }
    for (Pending& p : in) {
      try {
        active_[sched_.add(std::move(p.gen))] = p.stream;
      } catch (const Error& e) {  // the caller checks the context first; this is the scheduler's own check
        GenerationOutput o;
        o.finish = FinishReason::Error;
        o.error = e.message();
        p.stream->deliver(std::move(o), 0);
        {
          std::lock_guard<std::mutex> lk(stats_mu_);
          ++stats_.finished_error;
        }
        std::lock_guard<std::mutex> lk(mu_);
        --in_flight_;
      }
    }
    for (auto& [id, s] : active_)
      if (stopping || s->cancel_) sched_.cancel(id);
    StepInfo info;
    std::vector<Scheduler::Update> updates = sched_.step(stopping ? nullptr : &info);
    for (Scheduler::Update& u : updates) deliver(u);
    {
      std::lock_guard<std::mutex> lk(stats_mu_);
      stats_.steps += info.seqs > 0;
    }
    publish();
    if (stopping && active_.empty()) return;
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
        default: ++stats_.finished_error; break;
      }
    }
  }
  s.deliver(std::move(u.output), u.generated_tokens);
  if (done) {
    active_.erase(it);
    std::lock_guard<std::mutex> lk(mu_);
    --in_flight_;
  }
}

void Engine::publish() {
  const PagePool& pool = runner_.page_pool();
  int inbox;
  {
    std::lock_guard<std::mutex> lk(mu_);
    inbox = int(inbox_.size());
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
}

}  // namespace kvq
