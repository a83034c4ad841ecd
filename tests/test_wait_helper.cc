// Wait helpers (chi::WaitHelper): a thread spinning in Future::Wait runs every installed
// helper, up to four at once, one that gives up is no spinner by the time its give-up
// hooks run, Future::IsComplete runs the poll hooks, and removing a helper waits for the
// threads running it. No
// runtime is involved: the tests complete their tasks themselves. How the shm transport
// uses a helper to deliver answers is checked in test_shm_transport.cc.
#include <doctest/doctest.h>

#include <atomic>  // the waiter's report
#include <chrono>  // deadlines and hold times
#include <thread>  // spinning threads
#include <vector>  // the spinners

#include <chi/chi.h>
#include <chi/mods/demo/demo_client.h>  // CustomTask, the task the tests complete

using chi::u32;
using chi::u64;
using Clock = std::chrono::steady_clock;

namespace {
/** A wait helper for the tests below: counts its runs and completes one task. */
struct CountingHelper {
  chi::Atomic<u32> runs;
  chi::Atomic<u32> inside;           ///< runs in progress
  chi::Atomic<u64> to_complete{0};   ///< a Task* to complete on the next run
  u64 hold_ns = 0;                   ///< how long each run lasts

  static void Run(void *ctx) {
    auto *h = static_cast<CountingHelper *>(ctx);
    h->inside.FetchAdd(1, chi::MemOrder::kSeqCst);
    h->runs.FetchAdd(1, chi::MemOrder::kSeqCst);
    if (u64 t = h->to_complete.Exchange(0, chi::MemOrder::kAcqRel)) {
      chi::CompleteTask(reinterpret_cast<chi::Task *>(t));
    }
    const auto until = Clock::now() + std::chrono::nanoseconds(h->hold_ns);
    while (Clock::now() < until) chi::CpuRelax();
    h->inside.FetchSub(1, chi::MemOrder::kSeqCst);
  }
};

/** A task only the test completes (never sent anywhere). */
chi::Future<chimaera::demo::CustomTask> LocalTask() {
  return chi::Future<chimaera::demo::CustomTask>(
      chi::NewTask<chimaera::demo::CustomTask>(chi::TaskBuffer("x", 1)));
}
}  // namespace

TEST_CASE("a thread spinning in Future::Wait runs every installed wait helper, up to four") {
  CountingHelper counting;
  chi::WaitHelper helper(&CountingHelper::Run, &counting);
  REQUIRE(chi::WaitHelper::Install(&helper));
  CountingHelper other_counting;  // a second owner (a GPU client beside a transport)
  chi::WaitHelper other(&CountingHelper::Run, &other_counting);
  REQUIRE(chi::WaitHelper::Install(&other));

  // Nobody but the first helper completes this task: Wait returns only because it ran.
  auto f = LocalTask();
  counting.to_complete.Store(reinterpret_cast<u64>(f.get()), chi::MemOrder::kRelease);
  CHECK(f.Wait(10));
  CHECK(counting.runs.Load() >= 1);
  // The second helper completes the next one (the first has nothing to complete).
  auto g = LocalTask();
  other_counting.to_complete.Store(reinterpret_cast<u64>(g.get()), chi::MemOrder::kRelease);
  CHECK(g.Wait(10));
  CHECK(other_counting.runs.Load() >= 1);

  // Four slots: two more fit, a fifth does not.
  CountingHelper spare_counting;
  chi::WaitHelper spare1(&CountingHelper::Run, &spare_counting);
  chi::WaitHelper spare2(&CountingHelper::Run, &spare_counting);
  chi::WaitHelper spare3(&CountingHelper::Run, &spare_counting);
  REQUIRE(chi::WaitHelper::Install(&spare1));
  REQUIRE(chi::WaitHelper::Install(&spare2));
  CHECK_FALSE(chi::WaitHelper::Install(&spare3));
  chi::WaitHelper::Remove(&spare3);  // not installed: changes nothing
  chi::WaitHelper::Remove(&spare1);
  chi::WaitHelper::Remove(&spare2);

  chi::WaitHelper::Remove(&other);  // the first keeps running
  auto k = LocalTask();
  counting.to_complete.Store(reinterpret_cast<u64>(k.get()), chi::MemOrder::kRelease);
  CHECK(k.Wait(10));

  chi::WaitHelper::Remove(&helper);
  const u32 runs = counting.runs.Load();
  auto h = LocalTask();
  counting.to_complete.Store(reinterpret_cast<u64>(h.get()), chi::MemOrder::kRelease);
  CHECK_FALSE(h.Wait(0.01f));  // no helper any more, so nothing completes it
  CHECK(counting.runs.Load() == runs);
  chi::CompleteTask(h.get());
  CHECK(h.Wait(1));
  REQUIRE(chi::WaitHelper::Install(&other));  // the slots are free again
  chi::WaitHelper::Remove(&other);
}

namespace {
/** A helper whose gave_up hook records how many threads Spinners() counts as it runs. */
struct GiveUpProbe {
  chi::Atomic<u32> gave_up;
  chi::Atomic<u32> spinners_seen{~0u};

  static void Run(void *) {}
  static void GaveUp(void *ctx) {
    auto *p = static_cast<GiveUpProbe *>(ctx);
    p->spinners_seen.Store(chi::WaitHelper::Spinners(), chi::MemOrder::kSeqCst);
    p->gave_up.FetchAdd(1, chi::MemOrder::kSeqCst);
  }
};
}  // namespace

TEST_CASE("a caller that gives up spinning no longer counts as a spinner when its hooks run") {
  // The hook wakes the helper's owner (the shm receiver), which leaves answers to spinning
  // callers: were the caller that gave up still counted, it would nap while that caller parks.
  GiveUpProbe probe;
  chi::WaitHelper helper(&GiveUpProbe::Run, &probe, &GiveUpProbe::GaveUp);
  REQUIRE(chi::WaitHelper::Install(&helper));
  auto f = LocalTask();
  CHECK_FALSE(f.Wait(0.01f));  // nobody completes it: the spin phase ends, then the park
  CHECK(probe.gave_up.Load() >= 1);
  CHECK(probe.spinners_seen.Load() == 0);
  CHECK(chi::WaitHelper::Spinners() == 0);
  chi::WaitHelper::Remove(&helper);
  chi::CompleteTask(f.get());
  CHECK(f.Wait(1));
}

TEST_CASE("Future::IsComplete runs the helpers' poll hooks while its task is not complete") {
  // A thread that polls instead of waiting must deliver ready answers itself, as a spinning
  // one does: the shm receiver naps while callers deliver, and a polled answer waited for
  // the end of its nap (about 9 ms late in a throwaway measurement).
  CountingHelper polled;
  chi::WaitHelper polling(&CountingHelper::Run, &polled, nullptr, &CountingHelper::Run);
  REQUIRE(chi::WaitHelper::Install(&polling));
  // Only the poll hook completes this task, in the same IsComplete call that runs it.
  auto f = LocalTask();
  polled.to_complete.Store(reinterpret_cast<u64>(f.get()), chi::MemOrder::kRelease);
  CHECK(f.IsComplete());
  CHECK(polled.runs.Load() == 1);
  // A complete task runs nothing.
  CHECK(f.IsComplete());
  CHECK(polled.runs.Load() == 1);
  // Not complete, nothing to complete it: each poll runs the hook once and says false.
  auto g = LocalTask();
  CHECK_FALSE(g.IsComplete());
  CHECK_FALSE(g.IsComplete());
  CHECK(polled.runs.Load() == 3);
  chi::WaitHelper::Remove(&polling);
  CHECK_FALSE(g.IsComplete());  // a removed helper is not run
  CHECK(polled.runs.Load() == 3);
  // A helper without a poll hook is not run by a poll (only by a spin).
  CountingHelper spun;
  chi::WaitHelper spin_only(&CountingHelper::Run, &spun);
  REQUIRE(chi::WaitHelper::Install(&spin_only));
  CHECK_FALSE(g.IsComplete());
  CHECK(spun.runs.Load() == 0);
  chi::WaitHelper::Remove(&spin_only);
  chi::CompleteTask(g.get());
  CHECK(g.IsComplete());
}

TEST_CASE("removing a wait helper waits for the threads running it") {
  CountingHelper counting;
  counting.hold_ns = 200000;
  chi::WaitHelper helper(&CountingHelper::Run, &counting);
  REQUIRE(chi::WaitHelper::Install(&helper));
  chi::Atomic<u32> stop;
  std::vector<std::thread> spinners;
  for (int i = 0; i < 2; ++i) {
    spinners.emplace_back([&] {
      while (stop.Load(chi::MemOrder::kAcquire) == 0) chi::WaitHelper::Run();
    });
  }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (counting.runs.Load() < 4 && Clock::now() < deadline) std::this_thread::yield();
  REQUIRE(counting.runs.Load() >= 4);
  for (int round = 0; round < 20; ++round) {
    chi::WaitHelper::Remove(&helper);
    CHECK(counting.inside.Load() == 0);  // nobody is inside once Remove returns
    const u32 runs = counting.runs.Load();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(counting.runs.Load() == runs);  // and nobody starts again
    REQUIRE(chi::WaitHelper::Install(&helper));
    const u32 before = counting.runs.Load();
    while (counting.runs.Load() == before && Clock::now() < deadline) std::this_thread::yield();
  }
  chi::WaitHelper::Remove(&helper);
  stop.Store(1, chi::MemOrder::kRelease);
  for (auto &t : spinners) t.join();
  CHECK(counting.inside.Load() == 0);
}

TEST_CASE("FutexWake counts, per thread, only the calls that woke a waiter") {
  // Future::Wait yields the CPU early only right after its thread woke another: the count
  // must not move for a wake that found nobody, nor for wakes issued by other threads.
  alignas(4) u32 word = 0;
  const u32 before = chi::tls_futex_wakes;
  CHECK(chi::FutexWake(&word) == 0);
  CHECK(chi::tls_futex_wakes == before);
  std::atomic<u32> other_thread_wakes{~0u};
  std::thread waiter([&] {
    // acquire: pairs with the release store that lets it leave.
    while (__atomic_load_n(&word, __ATOMIC_ACQUIRE) == 0) chi::FutexWait(&word, 0);
    other_thread_wakes.store(chi::tls_futex_wakes);
  });
  int woke = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (woke == 0 && Clock::now() < deadline) {  // until the waiter has parked
    woke = chi::FutexWake(&word);
    if (woke == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(woke == 1);
  CHECK(chi::tls_futex_wakes == before + 1);  // the calls that found nobody did not count
  __atomic_store_n(&word, 1, __ATOMIC_RELEASE);
  u32 wakes = 1;
  while (other_thread_wakes.load() == ~0u) {  // it parked again, or is leaving
    wakes += chi::FutexWake(&word) > 0 ? 1 : 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  waiter.join();
  CHECK(chi::tls_futex_wakes == before + wakes);
  CHECK(other_thread_wakes.load() == 0);  // the waiter woke nobody: its own count stayed 0
  // What a spinning waiter asks: true once after wakes, then false until the next one.
  CHECK(chi::TakeWokeAnother());
  CHECK_FALSE(chi::TakeWokeAnother());
  CHECK(chi::FutexWake(&word) == 0);
  CHECK_FALSE(chi::TakeWokeAnother());
}
