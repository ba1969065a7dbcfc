#include "common/thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvq {

namespace {

// The spin loop's pause: x86's PAUSE, or a compiler barrier elsewhere.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  asm volatile("" ::: "memory");
#endif
}

// Spins until done() or `limit` has passed; true if done() came true.
template <class Done>
bool spin_until(Done done, std::chrono::microseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= until) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int t = 1; t < n_threads; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_items(int thread) {
  for (;;) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_items_ || failed_.load(std::memory_order_relaxed)) return;
    try {
      (*job_)(i, thread);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
      failed_ = true;
    }
  }
}

void ThreadPool::worker_loop(int thread) {
  uint64_t seen = 0;
  const auto changed = [&] {
    return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
  };
  for (;;) {
    if (!spin_until(changed, kSpin)) {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, changed);
    }
    if (stop_) return;
    seen = generation_.load(std::memory_order_acquire);
    run_items(thread);
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);  // the caller checks busy_ under mu_ before it sleeps
      done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  job_ = &fn;
  n_items_ = n;
  next_.store(0, std::memory_order_relaxed);
  busy_.store(int(workers_.size()), std::memory_order_relaxed);
  failed_.store(false, std::memory_order_relaxed);
  error_ = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);  // a worker checks generation_ under mu_ before it sleeps
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_items(0);
  const auto all_done = [&] { return busy_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(all_done, kSpin)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, all_done);
  }
  job_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

}  // namespace kvq
