// Forking while another thread is inside a process-wide lock: the child (only the forking
// thread survives) must still be able to take that lock. Used by the tests of the
// allocators that guard shared state with a mutex and take it around fork.
#pragma once

#include <unistd.h>  // fork, _exit

#include <atomic>
#include <thread>

#include "child_process.h"  // WaitChild, kChildTimedOut

namespace chi_test {

/** What ForkWhileBusy saw of its children. */
struct ForkOutcome {
  int hung = 0;    ///< children that did not exit within the timeout (killed)
  int failed = 0;  ///< children that exited with another code than 0
};

/**
 * Forks up to `forks` times while a thread runs `busy()` in a loop (taking the lock often);
 * each child runs `child()` and exits with what it returns. Stops at the first hung child:
 * each costs the 10 s timeout.
 */
template <typename Busy, typename Child>
ForkOutcome ForkWhileBusy(int forks, Busy busy, Child child) {
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    while (!stop.load(std::memory_order_relaxed)) busy();
  });
  ForkOutcome out;
  for (int i = 0; i < forks && out.hung == 0; ++i) {
    const pid_t pid = fork();
    if (pid == 0) _exit(child());
    if (pid < 0) {
      ++out.failed;
      continue;
    }
    const int rc = WaitChild(pid, 10);
    if (rc == kChildTimedOut) {
      ++out.hung;
    } else if (rc != 0) {
      ++out.failed;
    }
  }
  stop.store(true);
  churn.join();
  return out;
}

}  // namespace chi_test
