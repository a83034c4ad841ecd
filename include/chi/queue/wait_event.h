// WaitEvent: how a blocked ring end parks on a futex and how the other end wakes it.
// Used by SpscRing, MpscRing and CopySpace; lives inside their shared regions, so a
// waiter in one process is woken by a notifier in another.
// Invariant (no lost wake-ups): the notifier publishes its state change with a seq_cst
// store and then reads waiters_; the waiter bumps waiters_ and then re-reads the state
// with seq_cst loads, so at least one of the two sees the other.
#pragma once

#include <sched.h>  // sched_yield while a peer finishes a half-done operation
#include <time.h>   // clock_gettime(CLOCK_MONOTONIC) for deadlines

#include <climits>  // INT_MAX: wake every parked waiter

#include "chi/core/atomic.h"  // chi::Atomic, chi::CpuRelax
#include "chi/core/futex.h"   // chi::FutexWait / FutexWake (shared, cross-process)
#include "chi/core/macros.h"  // CHI_CROSS_FUN, CHI_IS_GPU
#include "chi/core/types.h"   // u32, u64

namespace chi {

/** An absolute CLOCK_MONOTONIC time in ns meaning "wait forever". */
inline constexpr u64 kNoDeadline = ~0ull;

/** How long a blocking ring operation spins before it parks on the futex. */
inline constexpr u64 kSpinBeforeParkNs = 20000;

/**
 * Most CpuRelax() calls between two attempts of a producer waiting for room. Each attempt
 * reads a line the consumer writes as it drains (its head, or the slot it frees); backing
 * off leaves that line with the consumer. Consumers poll on every spin: latency matters.
 */
inline constexpr u32 kFullRingBackoff = 16;

/**
 * Order of the store that makes a ring's state change visible. On the host it is seq_cst
 * because it is one half of the Dekker pair with WaitEvent::Wait; the device never parks
 * or wakes, so release suffices there.
 */
inline constexpr MemOrder kPublishOrder = CHI_IS_GPU ? MemOrder::kRelease : MemOrder::kSeqCst;

/** Current CLOCK_MONOTONIC time in nanoseconds (host only). */
inline u64 MonotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<u64>(ts.tv_sec) * 1000000000ull + static_cast<u64>(ts.tv_nsec);
}

/** Turns a relative timeout (0 = forever) into an absolute deadline for the calls below. */
inline u64 DeadlineAfter(u64 timeout_ns) {
  if (timeout_ns == 0) return kNoDeadline;
  u64 now = MonotonicNs();
  return timeout_ns > kNoDeadline - now ? kNoDeadline : now + timeout_ns;
}

/** What one WaitEvent::Wait call ended with. */
enum class WaitResult : u32 {
  kReady,     ///< the condition already held; the caller did not sleep
  kWoken,     ///< slept and was woken (or woke spuriously): re-check
  kTimedOut,  ///< the deadline passed
};

/**
 * Counters kept by the waiting side of a ring, placed on a cache line that side already
 * writes, so counting never disturbs the line the notifier reads.
 */
class WaitStats {
 public:
  /** Counts one operation that found its ring full or empty (slow path only). */
  CHI_CROSS_FUN void CountStall() {
    // relaxed: a statistic, read only by tests and monitors.
    stalls_.FetchAdd(1, MemOrder::kRelaxed);
  }
  /** Counts one futex sleep. */
  CHI_CROSS_FUN void CountPark() {
    // relaxed: a statistic, read only by tests and monitors.
    parks_.FetchAdd(1, MemOrder::kRelaxed);
  }
  /** How many operations had to wait (spin or park) so far. */
  CHI_CROSS_FUN u64 Stalls() const { return stalls_.Load(MemOrder::kRelaxed); }
  /** How many times a waiter actually slept on the futex so far. */
  CHI_CROSS_FUN u64 Parks() const { return parks_.Load(MemOrder::kRelaxed); }

 private:
  Atomic<u64> stalls_;
  Atomic<u64> parks_;
};

/**
 * An event count on one 32-bit futex word plus a waiter counter, placed in shared memory
 * (zero-initialised by its owner's constructor: no waiters, epoch 0). Notify() costs one
 * load of a line that is only written when someone parks; Wait() parks only after
 * announcing itself and re-checking the condition, so a notification cannot slip between.
 */
class WaitEvent {
 public:
  /**
   * Wakes every parked waiter if there is one. Call it right after the seq_cst store
   * that made the awaited state true. On the device it does nothing: a GPU cannot
   * issue a futex wake, so host ends fed by a GPU must poll (TryPop/TryPush).
   */
  CHI_CROSS_FUN void Notify() {
#if !CHI_IS_GPU
    // seq_cst: second half of the notifier's Dekker pair (publish store, then this load).
    if (waiters_.Load(MemOrder::kSeqCst) == 0) return;
    // release: a waiter that reads the new epoch also sees the state change before it.
    epoch_.FetchAdd(1, MemOrder::kRelease);
    FutexWake(epoch_.Raw(), INT_MAX);
#endif
  }

  /**
   * Parks until woken, the deadline passes, or `ready()` (which must read the awaited
   * state with seq_cst loads) is already true. Parks at most once; callers loop.
   */
  template <typename Ready>
  WaitResult Wait(Ready ready, u64 deadline_ns, WaitStats &stats) {
    // seq_cst: first half of the waiter's Dekker pair (announce, then re-check state).
    waiters_.FetchAdd(1, MemOrder::kSeqCst);
    // acquire: if a notifier already bumped the epoch, ready() below sees its state.
    u32 epoch = epoch_.Load(MemOrder::kAcquire);
    WaitResult result = WaitResult::kWoken;
    if (ready()) {
      result = WaitResult::kReady;
    } else {
      u64 now = MonotonicNs();
      if (now >= deadline_ns) {
        result = WaitResult::kTimedOut;
      } else {
        stats.CountPark();
        // The kernel re-checks epoch_ == epoch atomically, so a Notify() that ran
        // after our load makes this return at once instead of sleeping.
        u64 left = deadline_ns == kNoDeadline ? 0 : deadline_ns - now;
        if (!FutexWait(epoch_.Raw(), epoch, left)) result = WaitResult::kTimedOut;
      }
    }
    // relaxed: dropping out only lets later notifiers skip the wake syscall.
    waiters_.FetchSub(1, MemOrder::kRelaxed);
    return result;
  }

  /** Threads (in any process) parked or about to park right now. */
  CHI_CROSS_FUN u32 Waiters() const { return waiters_.Load(MemOrder::kRelaxed); }

 private:
  Atomic<u32> epoch_;    ///< the futex word; bumped by every Notify that finds waiters
  Atomic<u32> waiters_;  ///< threads inside Wait(); Notify skips the syscall when 0
};

/**
 * Runs `try_op` until it succeeds or the deadline passes: first spinning for about
 * kSpinBeforeParkNs (up to `max_backoff` CpuRelax() calls between attempts, doubling),
 * then parking on `event` while `ready()` is false (host only). `ready()` says the
 * operation could now succeed; it must use seq_cst loads. Returns whether it succeeded.
 */
template <typename TryOp, typename Ready>
bool AwaitOp(WaitEvent &event, WaitStats &stats, TryOp try_op, Ready ready, u64 deadline_ns,
             u32 max_backoff = 1) {
  if (try_op()) return true;
  stats.CountStall();
  // The clock is first read after 64 attempts, so short waits never pay for it.
  u64 spin_end = 0;
  u32 backoff = 1;
  for (u32 i = 1;; ++i) {
    for (u32 r = 0; r < backoff; ++r) CpuRelax();
    if (backoff < max_backoff) backoff *= 2;
    if (try_op()) return true;
    if ((i & 63) != 0) continue;
    u64 now = MonotonicNs();
    if (spin_end == 0) {
      spin_end = now + kSpinBeforeParkNs < deadline_ns ? now + kSpinBeforeParkNs : deadline_ns;
    }
    if (now >= spin_end) break;
  }
  for (;;) {
    if (try_op()) return true;
    switch (event.Wait(ready, deadline_ns, stats)) {
      case WaitResult::kTimedOut:
        return try_op();
      case WaitResult::kReady:
        // The state says "go" but the operation failed: a peer is between the two
        // steps of its own operation (or won a race). Let it run instead of spinning.
        if (MonotonicNs() >= deadline_ns) return try_op();
        sched_yield();
        break;
      case WaitResult::kWoken:
        break;
    }
  }
}

}  // namespace chi
