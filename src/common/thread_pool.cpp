#include "common/thread_pool.h"

namespace kvq {

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
    int64_t i;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (next_ >= n_items_ || error_) return;
      i = next_++;
    }
    try {
      (*job_)(i, thread);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_items(thread);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    n_items_ = n;
    next_ = 0;
    busy_ = int(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  run_items(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return busy_ == 0; });
  job_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

}  // namespace kvq
