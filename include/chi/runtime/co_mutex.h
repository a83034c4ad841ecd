// CoMutex: a mutex for runtime tasks (seed 004 "Locking and Synchronization").
// A task that cannot take it suspends its fiber, never the worker. Tasks of
// one TaskNode group (same major id: a task and its subtasks) share ownership,
// so a subtask re-acquiring its parent's lock does not deadlock. Waiting groups
// are served first-come first-served; unlocking hands the lock to the next
// group and reschedules every task of that group at once.
#pragma once

#include <deque>          // FIFO of waiting groups
#include <mutex>          // std::lock_guard over SpinLock
#include <sched.h>        // sched_yield for callers outside a task
#include <unordered_map>  // major -> blocked tasks
#include <vector>         // blocked tasks of one group

#include "chi/runtime/run_context.h"  // CurrentRunContext, Yield
#include "chi/runtime/spin_lock.h"    // protects the tables
#include "chi/runtime/worker.h"       // ResumeWaiter

namespace chi {

/** Fiber-suspending, group re-entrant mutex. */
class CoMutex {
 public:
  /** Takes the lock for the calling task's group, suspending the task while another group holds it. */
  void Lock() {
    RunContext *r = CurrentRunContext();
    if (r != nullptr) r->RequireFiber("lock a CoMutex (TryLock can)");
    const u64 major = r != nullptr ? r->task_->task_node_.major_ : kThreadGroup;
    {
      std::lock_guard<SpinLock> g(mu_);
      if (holders_ == 0 || (owner_ == major && major != kThreadGroup)) {
        owner_ = major;
        ++holders_;
        return;
      }
      if (r != nullptr) {
        std::vector<RunContext *> &group = blocked_[major];
        if (group.empty()) order_.push_back(major);
        group.push_back(r);
      }
    }
    if (r != nullptr) {
      r->Yield();  // resumed by Unlock once our group owns the lock
      return;
    }
    while (!TryLockThread()) sched_yield();  // plain threads (tests, tools) poll
  }

  /** Takes the lock only if it is free or already owned by the caller's group. */
  bool TryLock() {
    RunContext *r = CurrentRunContext();
    const u64 major = r != nullptr ? r->task_->task_node_.major_ : kThreadGroup;
    std::lock_guard<SpinLock> g(mu_);
    if (holders_ == 0 || (owner_ == major && major != kThreadGroup)) {
      owner_ = major;
      ++holders_;
      return true;
    }
    return false;
  }

  /** Releases one hold; the last release of a group hands the lock to the next group. */
  void Unlock() {
    std::vector<RunContext *> wake;
    {
      std::lock_guard<SpinLock> g(mu_);
      if (--holders_ != 0) return;
      if (!order_.empty()) {
        owner_ = order_.front();
        order_.pop_front();
        auto it = blocked_.find(owner_);
        wake = std::move(it->second);
        blocked_.erase(it);
        holders_ = static_cast<u32>(wake.size());
      }
    }
    for (RunContext *r : wake) ResumeWaiter(r);
  }

  /** Groups waiting right now (diagnostics). */
  size_t WaitingGroups() {
    std::lock_guard<SpinLock> g(mu_);
    return order_.size();
  }

 private:
  static constexpr u64 kThreadGroup = ~0ull;  ///< callers outside a task never share

  bool TryLockThread() {
    std::lock_guard<SpinLock> g(mu_);
    if (holders_ != 0 || !order_.empty()) return false;  // queued tasks go first
    owner_ = kThreadGroup;
    holders_ = 1;
    return true;
  }

  SpinLock mu_;
  u64 owner_ = 0;
  u32 holders_ = 0;
  std::deque<u64> order_;
  std::unordered_map<u64, std::vector<RunContext *>> blocked_;
};

/** Holds a CoMutex for a scope. */
class ScopedCoMutex {
 public:
  explicit ScopedCoMutex(CoMutex &m) : m_(m) { m_.Lock(); }
  ~ScopedCoMutex() { m_.Unlock(); }
  ScopedCoMutex(const ScopedCoMutex &) = delete;
  ScopedCoMutex &operator=(const ScopedCoMutex &) = delete;

 private:
  CoMutex &m_;
};

}  // namespace chi
