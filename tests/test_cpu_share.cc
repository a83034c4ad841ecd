// Two threads that spin for each other must not share one CPU (cpu_share.h): each end
// records where it runs, sees whether the other runs on its CPU, and a runtime thread
// that keeps finding its peer there moves to another CPU, no sooner and no more often
// than CpuUnstacker's limits allow, and stays free to run anywhere afterwards.
#include <doctest/doctest.h>

#include <sched.h>

#include <thread>

#include "chi/core/cpu_share.h"

namespace {

using chi::Atomic;
using chi::CpuUnstacker;
using chi::u32;
using chi::u64;

/** The calling thread's affinity mask. */
cpu_set_t Affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  return set;
}

/** Restores the calling thread's affinity when the test case ends. */
class AffinityGuard {
 public:
  AffinityGuard() : saved_(Affinity()) {}
  ~AffinityGuard() { sched_setaffinity(0, sizeof(saved_), &saved_); }
  AffinityGuard(const AffinityGuard &) = delete;
  AffinityGuard &operator=(const AffinityGuard &) = delete;
  const cpu_set_t &Saved() const { return saved_; }

 private:
  cpu_set_t saved_;
};

/** Pins the calling thread to `cpu`; false when it may not run there (offline, not allowed). */
bool PinTo(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return sched_setaffinity(0, sizeof(one), &one) == 0;
}

/** Pins the calling thread to the CPU it runs on now; returns that CPU. */
int PinHere() {
  const int cpu = sched_getcpu();
  REQUIRE(cpu >= 0);
  REQUIRE(PinTo(cpu));
  REQUIRE(sched_getcpu() == cpu);
  return cpu;
}

/** False, saying so, when this thread may not set its CPU affinity (some sandboxes). */
bool CanPin(const AffinityGuard &guard) {
  if (sched_setaffinity(0, sizeof(cpu_set_t), &guard.Saved()) == 0) return true;
  MESSAGE("skipped: sched_setaffinity is not permitted here");
  return false;
}

/** False, saying so, when the thread cannot move: one CPU only, or no affinity changes. */
bool MayMove(const AffinityGuard &guard) {
  if (!CanPin(guard)) return false;
  if (CPU_COUNT(&guard.Saved()) >= 2) return true;
  MESSAGE("skipped: this thread may run on one CPU only, so it has nowhere to move");
  return false;
}

// A start time past kMoveIntervalNs: a fresh unstacker has never moved (last move at 0).
constexpr u64 kT0 = 1000000000ull;

}  // namespace

TEST_CASE("CpuTag names the CPU the thread is on, on every CPU it may run on, in any thread") {
  AffinityGuard guard;
  if (!CanPin(guard)) return;
  auto check_every_cpu = [&] {
    int checked = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &guard.Saved())) continue;
      if (!PinTo(cpu)) continue;  // offline meanwhile
      // CHECK, not REQUIRE: this also runs on a second thread, where a throw would abort.
      CHECK(sched_getcpu() == cpu);
      CHECK(chi::CpuTag() == static_cast<u32>(cpu) + 1);  // the move is seen at once
      ++checked;
    }
    sched_setaffinity(0, sizeof(cpu_set_t), &guard.Saved());
    return checked;
  };
  CHECK(check_every_cpu() >= 1);
  int in_thread = 0;  // a new thread has its own rseq area (or none: the fallback)
  std::thread t([&] { in_thread = check_every_cpu(); });
  t.join();
  CHECK(in_thread >= 1);
}

TEST_CASE("NoteCpu records the CPU and ShareCpu sees the other end there") {
  AffinityGuard guard;
  if (!CanPin(guard)) return;
  const int cpu = PinHere();
  Atomic<u32> mine;
  Atomic<u32> other;
  CHECK_FALSE(chi::ShareCpu(other));  // 0: nobody recorded a CPU yet
  chi::NoteCpu(mine);
  CHECK(mine.Load(chi::MemOrder::kRelaxed) == static_cast<u32>(cpu) + 1);
  CHECK(chi::ShareCpu(mine));  // the same CPU as ours
  other.Store(static_cast<u32>(cpu) + 2, chi::MemOrder::kRelaxed);
  CHECK_FALSE(chi::ShareCpu(other));  // another CPU
}

TEST_CASE("a thread stacked with its peer moves off the CPU once, after kMoveAfterNs") {
  AffinityGuard guard;
  if (!MayMove(guard)) return;
  CpuUnstacker u;
  CHECK_FALSE(u.Stacked(kT0));
  CHECK_FALSE(u.Stacked(kT0 + CpuUnstacker::kMoveAfterNs - 1));  // not long enough yet
  const int before = sched_getcpu();
  REQUIRE(u.Stacked(kT0 + CpuUnstacker::kMoveAfterNs));
  CHECK(sched_getcpu() != before);
  cpu_set_t after = Affinity();
  CHECK(CPU_EQUAL(&after, &guard.Saved()));  // free to go anywhere again

  // Stacked again at once: no second move within kMoveIntervalNs of the first.
  const u64 t1 = kT0 + CpuUnstacker::kMoveAfterNs;
  CHECK_FALSE(u.Stacked(t1 + 1));
  CHECK_FALSE(u.Stacked(t1 + 1 + CpuUnstacker::kMoveAfterNs));
  // Past the interval, and stacked for kMoveAfterNs since the last sighting began: moves.
  const u64 t2 = t1 + CpuUnstacker::kMoveIntervalNs;
  CHECK(u.Stacked(t2));
}

TEST_CASE("a sighting apart restarts the stacking clock") {
  AffinityGuard guard;
  if (!MayMove(guard)) return;
  CpuUnstacker u;
  CHECK_FALSE(u.Stacked(kT0));
  u.Apart();
  // kMoveAfterNs after the first sighting: the stacking only begins again here.
  CHECK_FALSE(u.Stacked(kT0 + CpuUnstacker::kMoveAfterNs));
  CHECK_FALSE(u.Stacked(kT0 + 2 * CpuUnstacker::kMoveAfterNs - 1));
  CHECK(u.Stacked(kT0 + 2 * CpuUnstacker::kMoveAfterNs));
}

TEST_CASE("a thread that may run on one CPU only is never moved") {
  AffinityGuard guard;
  if (!CanPin(guard)) return;
  PinHere();
  CpuUnstacker u;
  CHECK_FALSE(u.Stacked(kT0));
  CHECK_FALSE(u.Stacked(kT0 + CpuUnstacker::kMoveAfterNs));  // nowhere to go
  cpu_set_t after = Affinity();
  CHECK(CPU_COUNT(&after) == 1);  // its mask is left as it was
}
