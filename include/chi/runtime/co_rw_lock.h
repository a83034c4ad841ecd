// CoRwLock: a reader-writer lock for runtime tasks. Readers share; a writer
// excludes everyone except tasks of its own TaskNode group (re-entrant by
// major id). Waiters suspend their fibers and are served in arrival order: a
// waiting writer stops new readers from overtaking it, and on release the next
// writer's whole group, or the run of readers at the head, is rescheduled.
#pragma once

#include <deque>    // FIFO of waiters
#include <mutex>    // std::lock_guard over SpinLock
#include <sched.h>  // sched_yield for callers outside a task
#include <vector>   // tasks to wake

#include "chi/runtime/run_context.h"  // CurrentRunContext, Yield
#include "chi/runtime/spin_lock.h"    // protects the state
#include "chi/runtime/worker.h"       // ResumeWaiter

namespace chi {

/** Fiber-suspending reader-writer lock with group re-entry for writers. */
class CoRwLock {
 public:
  /** Shared hold; suspends while a writer of another group holds or waits. */
  void ReadLock() { Acquire(false); }
  /** Exclusive hold; suspends while readers or another group's writer hold. */
  void WriteLock() { Acquire(true); }

  /** Releases a shared hold (a reader inside its own group's write hold releases that). */
  void ReadUnlock() { Release(false); }
  /** Releases an exclusive hold. */
  void WriteUnlock() { Release(true); }

 private:
  struct Waiter {
    u64 major;
    bool write;
    RunContext *r;
  };
  static constexpr u64 kThreadGroup = ~0ull;

  static u64 MajorOf(RunContext *r) {
    return r != nullptr ? r->task_->task_node_.major_ : kThreadGroup;
  }

  /** Grants a request immediately when allowed; caller holds mu_. */
  bool TryGrant(u64 major, bool write, bool queue_empty) {
    const bool same_group = writers_ > 0 && writer_major_ == major && major != kThreadGroup;
    if (same_group) {
      ++writers_;  // any hold inside our own write hold counts as a write hold
      return true;
    }
    if (write) {
      if (writers_ == 0 && readers_ == 0 && queue_empty) {
        writer_major_ = major;
        writers_ = 1;
        return true;
      }
      return false;
    }
    if (writers_ == 0 && queue_empty) {
      ++readers_;
      return true;
    }
    return false;
  }

  void Acquire(bool write) {
    RunContext *r = CurrentRunContext();
    if (r != nullptr) r->RequireFiber("lock a CoRwLock");
    const u64 major = MajorOf(r);
    {
      std::lock_guard<SpinLock> g(mu_);
      if (TryGrant(major, write, waiters_.empty())) return;
      if (r != nullptr) waiters_.push_back(Waiter{major, write, r});
    }
    if (r != nullptr) {
      r->Yield();  // resumed by Release once granted
      return;
    }
    for (;;) {  // plain threads poll
      {
        std::lock_guard<SpinLock> g(mu_);
        if (TryGrant(major, write, waiters_.empty())) return;
      }
      sched_yield();
    }
  }

  void Release(bool write) {
    std::vector<RunContext *> wake;
    {
      std::lock_guard<SpinLock> g(mu_);
      const u64 major = MajorOf(CurrentRunContext());
      if (writers_ > 0 && (write || writer_major_ == major)) {
        --writers_;
      } else {
        --readers_;
      }
      if (writers_ == 0 && readers_ == 0 && !waiters_.empty()) GrantNext(&wake);
    }
    for (RunContext *r : wake) ResumeWaiter(r);
  }

  /** Hands the free lock to the head of the queue; caller holds mu_. */
  void GrantNext(std::vector<RunContext *> *wake) {
    if (waiters_.front().write) {
      writer_major_ = waiters_.front().major;
      for (auto it = waiters_.begin(); it != waiters_.end();) {
        if (it->major == writer_major_) {  // the whole group enters together
          ++writers_;
          wake->push_back(it->r);
          it = waiters_.erase(it);
        } else {
          ++it;
        }
      }
      return;
    }
    while (!waiters_.empty() && !waiters_.front().write) {
      ++readers_;
      wake->push_back(waiters_.front().r);
      waiters_.pop_front();
    }
  }

  SpinLock mu_;
  u32 readers_ = 0;
  u32 writers_ = 0;
  u64 writer_major_ = 0;
  std::deque<Waiter> waiters_;
};

}  // namespace chi
