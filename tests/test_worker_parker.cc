// A runtime worker that sleeps through a WorkerParker, as the ZeroMQ network worker does
// (in poll() on its sockets, where a futex would never hear a request): it sleeps once
// idle, wakes for its input, for Wake() from another thread and for a stop request.
#include <doctest/doctest.h>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "chi/runtime/work_orchestrator.h"

namespace {

using chi::Atomic;
using chi::MemOrder;
using chi::u32;
using chi::u64;

/** Reads an eventfd's counter (0 when it was not readable). */
u64 Drain(int fd) {
  u64 v = 0;
  return read(fd, &v, sizeof(v)) == static_cast<ssize_t>(sizeof(v)) ? v : 0;
}

/** Adds n to an eventfd's counter. */
void Post(int fd, u64 n) { CHECK(write(fd, &n, sizeof(n)) == static_cast<ssize_t>(sizeof(n))); }

/**
 * A poller whose input is an eventfd (a stand-in for a socket's fd), and the parker that
 * sleeps on it and on a doorbell eventfd that Interrupt writes.
 */
class FdPoller final : public chi::WorkerPoller, public chi::WorkerParker {
 public:
  FdPoller()
      : input_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
        bell_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~FdPoller() {
    close(input_);
    close(bell_);
  }

  void BeginPolling(u32) override {}
  bool Poll() override {
    const u64 v = Drain(input_);
    if (v == 0) return false;
    taken_.FetchAdd(v, MemOrder::kRelaxed);
    return true;
  }
  bool EndPolling(u32) override { return false; }

  void Sleep(u64 timeout_ns) override {
    pollfd fds[2] = {{input_, POLLIN, 0}, {bell_, POLLIN, 0}};
    const int ms = timeout_ns == 0 ? -1 : static_cast<int>((timeout_ns + 999999) / 1000000);
    asleep_.Store(1, MemOrder::kSeqCst);
    sleeps_.FetchAdd(1, MemOrder::kSeqCst);
    const int rc = poll(fds, 2, ms);
    asleep_.Store(0, MemOrder::kSeqCst);
    if (rc > 0 && (fds[1].revents & POLLIN) != 0) Drain(bell_);
  }
  void Interrupt() override {
    interrupts_.FetchAdd(1, MemOrder::kRelaxed);
    Post(bell_, 1);
  }

  int input_;
  int bell_;
  Atomic<u32> asleep_;       ///< 1 while inside poll()
  Atomic<u64> sleeps_;       ///< Sleep calls
  Atomic<u64> interrupts_;   ///< Interrupt calls
  Atomic<u64> taken_;        ///< input the worker's passes took
};

/** Polls `done` every millisecond for up to 10 s; true once it holds. */
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 10000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return done();
}

}  // namespace

TEST_CASE("a worker with a parker sleeps through it and wakes for input, Wake and stop") {
  FdPoller p;
  REQUIRE(p.input_ >= 0);
  REQUIRE(p.bell_ >= 0);
  chi::Worker w(0, chi::WorkerRole::kNetwork, nullptr, nullptr, 0, 64 * 1024);
  w.ReplacePoller(nullptr, &p);
  w.SetParker(&p, 20000);  // 20 us of idle polling, then Sleep
  w.Start();

  // Idle: it sleeps in the parker (the worker's own futex is never waited on).
  REQUIRE(Eventually([&] { return p.asleep_.Load(MemOrder::kSeqCst) != 0; }));

  // Input on the fd it sleeps on wakes it; its next pass takes the input.
  for (u64 i = 1; i <= 5; ++i) {
    REQUIRE(Eventually([&] { return p.asleep_.Load(MemOrder::kSeqCst) != 0; }));
    Post(p.input_, 1);
    CHECK(Eventually([&] { return p.taken_.Load(MemOrder::kRelaxed) == i; }));
  }
  CHECK(p.sleeps_.Load(MemOrder::kSeqCst) >= 5);

  // Wake() from another thread (a fiber's resume, a lane push) interrupts the sleep.
  REQUIRE(Eventually([&] { return p.asleep_.Load(MemOrder::kSeqCst) != 0; }));
  const u64 sleeps = p.sleeps_.Load(MemOrder::kSeqCst);
  w.Wake();
  CHECK(p.interrupts_.Load(MemOrder::kRelaxed) >= 1);
  // It returned from that sleep, polled its idle spin, and went back to sleep.
  CHECK(Eventually([&] { return p.sleeps_.Load(MemOrder::kSeqCst) > sleeps; }));

  // A stop request interrupts the sleep too: Join returns (a missed wake would hang here).
  REQUIRE(Eventually([&] { return p.asleep_.Load(MemOrder::kSeqCst) != 0; }));
  w.RequestStop();
  w.Join();
  CHECK(p.asleep_.Load(MemOrder::kSeqCst) == 0);
  CHECK(p.taken_.Load(MemOrder::kRelaxed) == 5);
}
