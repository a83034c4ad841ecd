// The ZeroMQ server's rescue thread (zmq_server_rescue.h) against a stand-in server: it
// serves the sockets only while the network worker is awake and has stopped polling,
// never while it polls or sleeps on its sockets, passes again at once while requests may
// wait, and stops when asked. The end-to-end case (a spinning task on the network worker
// of a runtime) is in test_cross_process.cc.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "chi/core/atomic.h"                  // the stand-in's counters
#include "chi/transport/zmq_server_rescue.h"
#include "poll_until.h"

namespace {

using chi::Atomic;
using chi::MemOrder;
using chi::u32;
using chi::u64;

/** A network worker whose state the test sets, and what the rescue thread asked of it. */
class FakeServer : public chi::ZmqRescuable {
 public:
  /** Polling: every look sees a new poll count. Otherwise the count stands still. */
  Atomic<u32> polling;
  Atomic<u32> sleeping;
  Atomic<u32> passes;
  Atomic<u32> awaits;
  /** RescuePass reports requests left waiting for this many more passes. */
  Atomic<u32> passes_with_more;

  u64 NetworkPolls() const override {
    if (polling.Load(MemOrder::kRelaxed) == 0) return 7;
    return polls_.FetchAdd(1, MemOrder::kRelaxed) + 8;
  }
  bool NetworkSleeping() const override { return sleeping.Load(MemOrder::kRelaxed) != 0; }
  bool RescuePass() override {
    passes.FetchAdd(1, MemOrder::kRelaxed);
    u32 more = passes_with_more.Load(MemOrder::kRelaxed);
    if (more == 0) return false;
    passes_with_more.Store(more - 1, MemOrder::kRelaxed);
    return true;
  }
  void AwaitSockets(int timeout_ms) override {
    awaits.FetchAdd(1, MemOrder::kRelaxed);
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
  }

 private:
  mutable Atomic<u64> polls_;
};

/** Sleeps through `looks` of the rescue thread's looks while the worker is awake. */
void SleepLooks(u32 looks) { std::this_thread::sleep_for(looks * chi::ZmqRescue::kLook); }

}  // namespace

TEST_CASE("a network worker that keeps polling is never rescued") {
  FakeServer server;
  server.polling.Store(1, MemOrder::kRelaxed);
  chi::ZmqRescue rescue;
  rescue.Start(&server);
  SleepLooks(10);
  rescue.Stop();
  CHECK(server.passes.Load(MemOrder::kRelaxed) == 0);
}

TEST_CASE("a network worker asleep on its sockets is idle, not stuck") {
  FakeServer server;
  server.sleeping.Store(1, MemOrder::kRelaxed);  // its poll count stands still meanwhile
  chi::ZmqRescue rescue;
  rescue.Start(&server);
  std::this_thread::sleep_for(3 * chi::ZmqRescue::kIdleLook);
  rescue.Stop();
  CHECK(server.passes.Load(MemOrder::kRelaxed) == 0);
}

TEST_CASE("an awake network worker that stopped polling is served until it polls again") {
  FakeServer server;
  chi::ZmqRescue rescue;
  rescue.Start(&server);
  // Stuck: awake, the poll count standing still. Passes come, each followed by a sleep on
  // the sockets.
  REQUIRE(chi_test::PollUntil([&] { return server.passes.Load(MemOrder::kRelaxed) >= 3; }, 10));
  CHECK(server.awaits.Load(MemOrder::kRelaxed) >= 2);
  // A pass that leaves requests waiting is followed by another at once, with no sleep:
  // of the passes after this point, the five that leave requests have no sleep after them
  // (one sleep more may fall on each side of the two snapshots; with a sleep after every
  // pass there would be at least passes - 2).
  const u32 awaits = server.awaits.Load(MemOrder::kRelaxed);
  const u32 passes = server.passes.Load(MemOrder::kRelaxed);
  server.passes_with_more.Store(5, MemOrder::kRelaxed);
  REQUIRE(chi_test::PollUntil(
      [&] { return server.passes.Load(MemOrder::kRelaxed) >= passes + 7; }, 10));
  const u32 passed = server.passes.Load(MemOrder::kRelaxed) - passes;
  const u32 awaited = server.awaits.Load(MemOrder::kRelaxed) - awaits;
  CHECK(server.passes_with_more.Load(MemOrder::kRelaxed) == 0);
  CHECK(awaited + 3 <= passed);
  // It polls again: the passes stop (one in progress may still finish).
  server.polling.Store(1, MemOrder::kRelaxed);
  SleepLooks(3);
  const u32 settled = server.passes.Load(MemOrder::kRelaxed);
  SleepLooks(10);
  CHECK(server.passes.Load(MemOrder::kRelaxed) == settled);
  // Stuck again: served again.
  server.polling.Store(0, MemOrder::kRelaxed);
  REQUIRE(chi_test::PollUntil(
      [&] { return server.passes.Load(MemOrder::kRelaxed) > settled; }, 10));
  rescue.Stop();
  const u32 stopped = server.passes.Load(MemOrder::kRelaxed);
  SleepLooks(3);
  CHECK(server.passes.Load(MemOrder::kRelaxed) == stopped);  // nothing after Stop returned
}

TEST_CASE("stopping a rescue thread that never started, or twice, is harmless") {
  chi::ZmqRescue idle;
  idle.Stop();
  FakeServer server;
  server.polling.Store(1, MemOrder::kRelaxed);
  chi::ZmqRescue rescue;
  rescue.Start(&server);
  rescue.Start(&server);  // already running: no second thread
  rescue.Stop();
  rescue.Stop();
  rescue.Start(&server);  // a stopped one starts again
  SleepLooks(2);
  rescue.Stop();
  CHECK(server.passes.Load(MemOrder::kRelaxed) == 0);
}
