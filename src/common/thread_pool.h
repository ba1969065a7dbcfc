// A fixed pool of worker threads for data-parallel loops. One pool per engine (no global state); the
// calling thread takes part in the work, so a pool of n threads runs n-way parallel.
//
// A decode step runs dozens of short loops (a GEMV of a few hundred rows, one layer's attention) a few microseconds
// apart, so waking sleeping threads for each (a futex wake and a context switch, then another to report back) would
// cost as much as the work. Workers and the caller therefore spin for up to kSpin on the loop's atomics before they
// sleep on a condition variable; items are handed out by an atomic counter.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
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
  static constexpr std::chrono::microseconds kSpin{100};  // busy-wait before sleeping (workers and the caller)

  void worker_loop(int thread);
  void run_items(int thread);

  std::vector<std::thread> workers_;
  std::mutex mu_;  // guards error_ and the sleeps on wake_ / done_
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int)>* job_ = nullptr;  // current loop body (published by generation_)
  int64_t n_items_ = 0;                                      // items in the current loop (published by generation_)
  std::atomic<int64_t> next_{0};                             // next item to hand out
  std::atomic<int> busy_{0};                                 // workers still inside the current loop
  std::atomic<uint64_t> generation_{0};                      // bumps once per parallel_for, under mu_
  std::atomic<bool> stop_{false}, failed_{false};            // failed_: error_ is set, hand out no more items
  std::exception_ptr error_;
};

}  // namespace kvq
