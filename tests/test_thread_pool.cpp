// ThreadPool: every item of every loop runs exactly once, on a valid thread index, across many short loops in a row
// (the decode step's pattern, where workers spin between loops) and across sleeps (loops further apart than the
// spin); the first exception reaches the caller and the pool keeps working after it.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kvq {
namespace {

void expect_each_item_once(ThreadPool& pool, int64_t n) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::atomic<int> bad_thread{0};
  pool.parallel_for(n, [&](int64_t i, int t) {
    hits[size_t(i)].fetch_add(1);
    if (t < 0 || t >= pool.size()) bad_thread.fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "item " << i << " of " << n;
  EXPECT_EQ(bad_thread.load(), 0);
}

TEST(ThreadPool, ManyShortLoopsInARowRunEveryItemOnce) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    ASSERT_EQ(pool.size(), threads);
    for (int rep = 0; rep < 2000; ++rep) expect_each_item_once(pool, 1 + rep % 37);
  }
}

TEST(ThreadPool, LoopsAfterTheWorkersSleptRunEveryItemOnce) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 20; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // longer than the spin: the workers sleep
    expect_each_item_once(pool, 100);
  }
}

TEST(ThreadPool, SumsMatchTheSerialLoop) {
  ThreadPool pool(4);
  std::vector<int64_t> partial(size_t(pool.size()), 0);
  pool.parallel_for(100000, [&](int64_t i, int t) { partial[size_t(t)] += i; });
  int64_t sum = 0;
  for (int64_t p : partial) sum += p;
  EXPECT_EQ(sum, int64_t(100000) * 99999 / 2);
}

TEST(ThreadPool, TheFirstExceptionReachesTheCallerAndThePoolKeepsWorking) {
  ThreadPool pool(3);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallel_for(1000,
                                 [&](int64_t i, int) {
                                   ran.fetch_add(1);
                                   if (i == 10) throw std::runtime_error("item 10");
                                 }),
               std::runtime_error);
  EXPECT_GE(ran.load(), 1);
  EXPECT_LE(ran.load(), 1000);
  for (int rep = 0; rep < 100; ++rep) expect_each_item_once(pool, 50);
}

}  // namespace
}  // namespace kvq
