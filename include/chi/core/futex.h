// Parking on a 32-bit word, shared across processes (host only).
// Uses the non-private futex so a waiter in one process is woken by a store in
// another; C++20 atomic::wait is process-private in libstdc++ and cannot do this.
#pragma once

#include <linux/futex.h>  // FUTEX_WAIT, FUTEX_WAKE
#include <sys/syscall.h>  // SYS_futex
#include <unistd.h>       // syscall

#include <cerrno>  // errno
#include <ctime>   // timespec

#include "chi/core/types.h"  // u32, u64

namespace chi {

/**
 * Sleeps while *addr == expected, at most timeout_ns (0 = no limit).
 * Returns false only on timeout; spurious wake-ups return true, so callers re-check.
 */
inline bool FutexWait(u32 *addr, u32 expected, u64 timeout_ns = 0) {
  timespec ts{};
  timespec *tsp = nullptr;
  if (timeout_ns != 0) {
    ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000ull);
    ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000ull);
    tsp = &ts;
  }
  long rc = syscall(SYS_futex, addr, FUTEX_WAIT, expected, tsp, nullptr, 0);
  return !(rc == -1 && errno == ETIMEDOUT);
}

/**
 * FutexWake calls of this thread that woke someone. A spinning waiter asks whether it
 * just woke a thread (TakeWokeAnother), which the kernel often places on the waker's CPU.
 */
inline thread_local u32 tls_futex_wakes = 0;

/** Wakes up to `count` waiters parked on addr, in any process. Returns how many woke. */
inline int FutexWake(u32 *addr, int count = 1) {
  const int woke =
      static_cast<int>(syscall(SYS_futex, addr, FUTEX_WAKE, count, nullptr, nullptr, 0));
  if (woke > 0) ++tls_futex_wakes;
  return woke;
}

/** True when this thread's FutexWake calls woke someone since its previous call of this. */
inline bool TakeWokeAnother() {
  thread_local u32 seen = 0;
  const bool woke = tls_futex_wakes != seen;
  seen = tls_futex_wakes;
  return woke;
}

}  // namespace chi
