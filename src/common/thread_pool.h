// A fixed pool of worker threads for data-parallel loops. One pool per engine (no global state); the
// calling thread takes part in the work, so a pool of n threads runs n-way parallel.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvq {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 0: all hardware threads
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Runs fn(i, thread_index) for i in [0, n), dynamically load-balanced; returns when all are done.
  // The first exception thrown by fn is rethrown here.
  void parallel_for(int64_t n, const std::function<void(int64_t i, int thread)>& fn);

 private:
  void worker_loop(int thread);
  void run_items(int thread);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int)>* job_ = nullptr;  // current loop body
  int64_t n_items_ = 0;                                      // items in the current loop
  int64_t next_ = 0;                                         // next item to hand out (under mu_)
  int busy_ = 0;                                             // workers still inside the current loop
  uint64_t generation_ = 0;                                  // bumps once per parallel_for
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace kvq
