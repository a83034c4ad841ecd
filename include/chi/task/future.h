// Future<T>: the handle a client gets for a submitted task. Wait() spins
// briefly, then parks the thread on the task's state word (futex); inside a
// runtime task it suspends the fiber instead, so the worker keeps running
// other tasks. Dropping an unfinished Future hands the task to the runtime,
// which frees it on completion.
#pragma once

#include <climits>  // INT_MAX
#include <utility>  // std::exchange
#include <vector>   // WaitAll

#include "chi/core/atomic.h"          // state word
#include "chi/core/futex.h"           // parking a client thread
#include "chi/runtime/worker.h"       // fiber waits (WaitInFiber, YieldInFiber), NowNs
#include "chi/task/task.h"            // Task
#include "chi/task/task_ops.h"        // DeleteTask

namespace chi {

/** Owns one submitted task until it completes and the caller is done with it. */
template <typename TaskT>
class Future {
 public:
  static constexpr u32 kSpinsBeforePark = 4096;
  static constexpr u64 kTimedPollNs = 50000;  ///< fiber poll interval for timed waits

  Future() = default;
  /** Takes ownership of a submitted task. */
  explicit Future(TaskT *task) : task_(task) {}
  Future(Future &&o) noexcept : task_(std::exchange(o.task_, nullptr)) {}
  Future &operator=(Future &&o) noexcept {
    if (this != &o) {
      Release();
      task_ = std::exchange(o.task_, nullptr);
    }
    return *this;
  }
  Future(const Future &) = delete;
  Future &operator=(const Future &) = delete;
  ~Future() { Release(); }

  /**
   * Waits for completion; false on timeout (the task stays valid, wait again).
   * max_sec = 0 waits without limit.
   */
  bool Wait(float max_sec = 0) {
    if (task_ == nullptr) return false;
    if (task_->IsComplete()) return true;
    if (RunContext *r = CurrentRunContext()) return WaitInFiber(r, max_sec);
    return WaitOnThread(max_sec);
  }

  /** True once outputs are final. */
  bool IsComplete() const { return task_ != nullptr && task_->IsComplete(); }
  /** False for a default-constructed (empty) future. */
  bool IsValid() const { return task_ != nullptr; }
  TaskT *operator->() { return task_; }
  TaskT &operator*() { return *task_; }
  TaskT *get() { return task_; }
  /** The task's return code (0 = success); valid after Wait() returned true. */
  u32 GetReturnCode() const { return task_->GetReturnCode(); }

  /** Gives up ownership: the runtime frees the task when it completes (or now if it has). */
  void Release() {
    if (task_ == nullptr) return;
    TaskT *t = std::exchange(task_, nullptr);
    // acq_rel: pairs with CompleteTask; exactly one side sees the other's bit and frees.
    const u32 prev = t->state_.FetchOr(task_state::kOrphaned, MemOrder::kAcqRel);
    if (prev & task_state::kComplete) DeleteTask(t);
  }

 private:
  bool WaitInFiber(RunContext *r, float max_sec) {
    if (max_sec <= 0) {
      r->GetWorker()->WaitInFiber(task_, r);
      return true;
    }
    // A timed wait polls on a short fiber sleep, so the waiter never needs a
    // wake-up that could race with its own timeout.
    const u64 deadline = NowNs() + static_cast<u64>(max_sec * 1e9);
    while (!task_->IsComplete()) {
      if (NowNs() >= deadline) return false;
      r->GetWorker()->SleepInFiber(r, kTimedPollNs);
    }
    return true;
  }

  bool WaitOnThread(float max_sec) {
    for (u32 i = 0; i < kSpinsBeforePark; ++i) {
      if (task_->IsComplete()) return true;
      CpuRelax();
    }
    const u64 deadline = max_sec > 0 ? NowNs() + static_cast<u64>(max_sec * 1e9) : 0;
    for (;;) {
      u32 s = task_->state_.Load(MemOrder::kAcquire);
      if (s & task_state::kComplete) return true;
      u64 timeout = 0;
      if (deadline != 0) {
        const u64 now = NowNs();
        if (now >= deadline) return false;
        timeout = deadline - now;
      }
      if (!(s & task_state::kParked)) {
        // acq_rel: announce the sleeper before sleeping; a concurrent completion fails the CAS.
        if (!task_->state_.CompareExchange(s, s | task_state::kParked, MemOrder::kAcqRel)) continue;
        s |= task_state::kParked;
      }
      FutexWait(task_->state_.Raw(), s, timeout);
    }
  }

  TaskT *task_ = nullptr;
};

/** Waits for every future; false if any timed out (max_sec applies to each). */
template <typename TaskT>
bool WaitAll(std::vector<Future<TaskT>> &futures, float max_sec = 0) {
  bool all = true;
  for (Future<TaskT> &f : futures) all = f.Wait(max_sec) && all;
  return all;
}

}  // namespace chi
