// A test-and-test-and-set spin lock for very short critical sections in the
// runtime (CoMutex wait tables). Never held across a fiber switch or a syscall.
#pragma once

#include "chi/core/atomic.h"  // Atomic, CpuRelax

namespace chi {

/** Minimal spin lock (BasicLockable, so std::lock_guard works). */
class SpinLock {
 public:
  void lock() {
    for (;;) {
      // acquire: the critical section sees the previous holder's writes.
      if (word_.Exchange(1, MemOrder::kAcquire) == 0) return;
      while (word_.Load(MemOrder::kRelaxed) != 0) CpuRelax();
    }
  }
  void unlock() { word_.Store(0, MemOrder::kRelease); }  // release: publish the section

 private:
  Atomic<u32> word_;
};

}  // namespace chi
