// StripedCounter (the per-task counts of pools and containers): the sum is exact while
// threads add on their own stripes, and when one thread subtracts what another added
// (a task acquired on the dispatching thread and released on its worker).
#include <doctest/doctest.h>

#include <chi/core/striped_counter.h>

#include <thread>
#include <vector>

TEST_CASE("a striped counter's sum is exact after many threads add and subtract") {
  chi::StripedCounter c;
  constexpr int kThreads = 8;
  constexpr chi::u64 kAdds = 100000;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&c] {
      for (chi::u64 k = 0; k < kAdds; ++k) c.Add(1);
    });
  }
  for (std::thread &t : threads) t.join();
  CHECK(c.Sum() == kThreads * kAdds);
  threads.clear();
  for (int i = 0; i < kThreads; ++i) {  // new threads: other stripes take the subtractions
    threads.emplace_back([&c] {
      for (chi::u64 k = 0; k < kAdds / 2; ++k) c.Sub(1, chi::MemOrder::kRelease);
    });
  }
  for (std::thread &t : threads) t.join();
  CHECK(c.Sum(chi::MemOrder::kAcquire) == kThreads * kAdds / 2);
}

TEST_CASE("a striped counter added on one thread and subtracted on another sums to zero") {
  chi::StripedCounter c;
  std::thread([&c] { c.Add(3); }).join();
  std::thread([&c] { c.Sub(2); }).join();
  std::thread([&c] { c.Sub(1); }).join();
  CHECK(c.Sum() == 0);  // single stripes wrapped below zero; their sum does not
}

TEST_CASE("striped counter stripes lie on separate cache lines") {
  CHECK(sizeof(chi::StripedCounter) == chi::StripedCounter::kStripes * chi::kCacheLine);
  CHECK(alignof(chi::StripedCounter) == chi::kCacheLine);
}
