// A poller's rescue thread (poller_rescue.h) against a stand-in poller: it serves the
// input only while the worker is awake and has stopped polling, never while it polls or
// sleeps on its input, passes again at once while input may wait, stops when asked, and a
// forked child's copy, once it forgot the parent's thread, starts one of its own.
// The end-to-end cases (a spinning task on the ZeroMQ network worker, on the GPU worker)
// are in test_cross_process.cc and tests/gpu/test_gpu_runtime.cu.
#include <doctest/doctest.h>

#include <sys/wait.h>  // waitpid of the forked child
#include <unistd.h>    // fork, alarm, _exit

#include <chrono>
#include <thread>

#include "chi/core/atomic.h"                  // the stand-in's counters
#include "chi/runtime/poller_rescue.h"
#include "poll_until.h"

namespace {

using chi::Atomic;
using chi::MemOrder;
using chi::u32;
using chi::u64;

/** A poller worker whose state the test sets, and what the rescue thread asked of it. */
class FakePoller : public chi::RescuablePoller {
 public:
  /** Polling: every look sees a new poll count. Otherwise the count stands still. */
  Atomic<u32> polling;
  Atomic<u32> sleeping;
  Atomic<u32> passes;
  Atomic<u32> awaits;
  /** RescuePass reports requests left waiting for this many more passes. */
  Atomic<u32> passes_with_more;

  u64 WorkerPolls() const override {
    if (polling.Load(MemOrder::kRelaxed) == 0) return 7;
    return polls_.FetchAdd(1, MemOrder::kRelaxed) + 8;
  }
  bool WorkerSleeping() const override { return sleeping.Load(MemOrder::kRelaxed) != 0; }
  bool RescuePass() override {
    passes.FetchAdd(1, MemOrder::kRelaxed);
    u32 more = passes_with_more.Load(MemOrder::kRelaxed);
    if (more == 0) return false;
    passes_with_more.Store(more - 1, MemOrder::kRelaxed);
    return true;
  }
  void AwaitInput(int timeout_ms) override {
    awaits.FetchAdd(1, MemOrder::kRelaxed);
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
  }

 private:
  mutable Atomic<u64> polls_;
};

/** Sleeps through `looks` of the rescue thread's looks while the worker is awake. */
void SleepLooks(u32 looks) { std::this_thread::sleep_for(looks * chi::PollerRescue::kLook); }

}  // namespace

TEST_CASE("a poller worker that keeps polling is never rescued") {
  FakePoller poller;
  poller.polling.Store(1, MemOrder::kRelaxed);
  chi::PollerRescue rescue;
  rescue.Start(&poller, "chi-test-rescue");
  SleepLooks(10);
  rescue.Stop();
  CHECK(poller.passes.Load(MemOrder::kRelaxed) == 0);
}

TEST_CASE("a poller worker asleep on its input is idle, not stuck") {
  FakePoller poller;
  poller.sleeping.Store(1, MemOrder::kRelaxed);  // its poll count stands still meanwhile
  chi::PollerRescue rescue;
  rescue.Start(&poller, "chi-test-rescue");
  std::this_thread::sleep_for(3 * chi::PollerRescue::kIdleLook);
  rescue.Stop();
  CHECK(poller.passes.Load(MemOrder::kRelaxed) == 0);
}

TEST_CASE("an awake poller worker that stopped polling is served until it polls again") {
  FakePoller poller;
  chi::PollerRescue rescue;
  rescue.Start(&poller, "chi-test-rescue");
  // Stuck: awake, the poll count standing still. Passes come, each followed by a wait for
  // input.
  REQUIRE(chi_test::PollUntil([&] { return poller.passes.Load(MemOrder::kRelaxed) >= 3; }, 10));
  CHECK(poller.awaits.Load(MemOrder::kRelaxed) >= 2);
  // A pass that leaves requests waiting is followed by another at once, with no sleep:
  // of the passes after this point, the five that leave requests have no sleep after them
  // (one sleep more may fall on each side of the two snapshots; with a sleep after every
  // pass there would be at least passes - 2).
  const u32 awaits = poller.awaits.Load(MemOrder::kRelaxed);
  const u32 passes = poller.passes.Load(MemOrder::kRelaxed);
  poller.passes_with_more.Store(5, MemOrder::kRelaxed);
  REQUIRE(chi_test::PollUntil(
      [&] { return poller.passes.Load(MemOrder::kRelaxed) >= passes + 7; }, 10));
  const u32 passed = poller.passes.Load(MemOrder::kRelaxed) - passes;
  const u32 awaited = poller.awaits.Load(MemOrder::kRelaxed) - awaits;
  CHECK(poller.passes_with_more.Load(MemOrder::kRelaxed) == 0);
  CHECK(awaited + 3 <= passed);
  // It polls again: the passes stop (one in progress may still finish).
  poller.polling.Store(1, MemOrder::kRelaxed);
  SleepLooks(3);
  const u32 settled = poller.passes.Load(MemOrder::kRelaxed);
  SleepLooks(10);
  CHECK(poller.passes.Load(MemOrder::kRelaxed) == settled);
  // Stuck again: served again.
  poller.polling.Store(0, MemOrder::kRelaxed);
  REQUIRE(chi_test::PollUntil(
      [&] { return poller.passes.Load(MemOrder::kRelaxed) > settled; }, 10));
  rescue.Stop();
  const u32 stopped = poller.passes.Load(MemOrder::kRelaxed);
  SleepLooks(3);
  CHECK(poller.passes.Load(MemOrder::kRelaxed) == stopped);  // nothing after Stop returned
}

TEST_CASE("stopping a rescue thread that never started, or twice, is harmless") {
  chi::PollerRescue idle;
  idle.Stop();
  FakePoller poller;
  poller.polling.Store(1, MemOrder::kRelaxed);
  chi::PollerRescue rescue;
  rescue.Start(&poller, "chi-test-rescue");
  rescue.Start(&poller, "chi-test-rescue");  // already running: no second thread
  rescue.Stop();
  rescue.Stop();
  rescue.Start(&poller, "chi-test-rescue");  // a stopped one starts again
  SleepLooks(2);
  rescue.Stop();
  CHECK(poller.passes.Load(MemOrder::kRelaxed) == 0);
}

TEST_CASE("a forked child forgets its parent's rescue thread and can start its own") {
  FakePoller poller;
  poller.polling.Store(1, MemOrder::kRelaxed);
  chi::PollerRescue rescue;
  rescue.Start(&poller, "chi-test-rescue");
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(20);  // a hang (on a lock the parent's thread held at the fork) ends as a failure
    // The parent's thread does not run here: its handle is kept unjoined, the lock made fresh.
    rescue.ForgetAfterFork();
    rescue.Stop();  // nothing to stop
#if defined(__SANITIZE_THREAD__)
    // TSan refuses threads started in a child of a multi-threaded process ("starting new
    // threads after multi-threaded fork is not supported"): the new thread runs in the other
    // builds only (ci, asan).
    _exit(0);
#endif
    FakePoller mine;
    rescue.Start(&mine, "chi-test-rescue");  // stuck from the start: served
    const bool served = chi_test::PollUntil(
        [&] { return mine.passes.Load(MemOrder::kRelaxed) > 0; }, 10);
    rescue.Stop();
    _exit(served ? 0 : 1);
  }
  REQUIRE(pid > 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  rescue.Stop();  // the parent's own thread is still its to join
  CHECK(poller.passes.Load(MemOrder::kRelaxed) == 0);
}
