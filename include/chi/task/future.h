// Future<T>: the handle a client gets for a submitted task. Wait() spins
// briefly, then parks the thread on the task's state word (futex); inside a
// runtime task it suspends the fiber instead, so the worker keeps running
// other tasks. Dropping an unfinished Future hands the task to the runtime,
// which frees it on completion. In a GPU kernel the same calls poll the task's
// GPU slot instead (chi/gpu/gpu_client.h defines the device path).
#pragma once

#include <sched.h>  // sched_yield while polling

#include <climits>      // INT_MAX
#include <type_traits>  // is_trivially_destructible: which tasks a kernel can submit
#include <vector>       // WaitAll

#include "chi/core/atomic.h"          // state word
#include "chi/core/futex.h"           // parking a client thread
#include "chi/runtime/worker.h"       // fiber waits (WaitInFiber, YieldInFiber), NowNs
#include "chi/task/task.h"            // Task
#include "chi/task/task_ops.h"        // DeleteTask

namespace chi {

#if CHI_GPU_CUDA || CHI_GPU_HIP
namespace gpu {
/** Task types a kernel can submit: they live in GPU slots and have nothing to destroy. */
template <typename TaskT>
inline constexpr bool kGpuTask = std::is_trivially_destructible_v<TaskT>;
// Device path of Future (defined in chi/gpu/gpu_client.h, which GPU clients include).
template <typename TaskT>
CHI_CROSS_FUN bool WaitTask(TaskT *task, float max_sec);
template <typename TaskT>
CHI_CROSS_FUN bool PollTask(const TaskT *task);
template <typename TaskT>
CHI_CROSS_FUN void ReleaseTask(TaskT *task);
}  // namespace gpu
#endif

/** Owns one submitted task until it completes and the caller is done with it. */
template <typename TaskT>
class Future {
 public:
  static constexpr u64 kSpinNs = 50000;  ///< time a waiting thread polls before it parks
  static constexpr u64 kTimedPollNs = 50000;  ///< fiber poll interval for timed waits

  Future() = default;
  /** Takes ownership of a submitted task. */
  CHI_CROSS_FUN explicit Future(TaskT *task) : task_(task) {}
  CHI_CROSS_FUN Future(Future &&o) noexcept : task_(o.task_) { o.task_ = nullptr; }
  CHI_CROSS_FUN Future &operator=(Future &&o) noexcept {
    if (this != &o) {
      Release();
      task_ = o.task_;
      o.task_ = nullptr;
    }
    return *this;
  }
  Future(const Future &) = delete;
  Future &operator=(const Future &) = delete;
  CHI_CROSS_FUN ~Future() { Release(); }

  /**
   * Waits for completion; false on timeout (the task stays valid, wait again).
   * max_sec = 0 waits without limit.
   */
  CHI_CROSS_FUN bool Wait(float max_sec = 0) {
    if (task_ == nullptr) return false;
#if CHI_IS_GPU
    if constexpr (gpu::kGpuTask<TaskT>) {
      return gpu::WaitTask(task_, max_sec);  // always bounded, even for max_sec = 0
    } else {
      return false;  // only GPU task types are ever waited on in a kernel
    }
#else
    if (task_->IsComplete()) return true;
    if (RunContext *r = CurrentRunContext()) return WaitInFiber(r, max_sec);
    return WaitOnThread(max_sec);
#endif
  }

  /** True once outputs are final. */
  CHI_CROSS_FUN bool IsComplete() const {
#if CHI_IS_GPU
    if constexpr (gpu::kGpuTask<TaskT>) {
      return task_ != nullptr && gpu::PollTask(task_);
    } else {
      return false;
    }
#else
    return task_ != nullptr && task_->IsComplete();
#endif
  }
  /** False for a default-constructed (empty) future. */
  CHI_CROSS_FUN bool IsValid() const { return task_ != nullptr; }
  CHI_CROSS_FUN TaskT *operator->() { return task_; }
  CHI_CROSS_FUN TaskT &operator*() { return *task_; }
  CHI_CROSS_FUN TaskT *get() { return task_; }
  /** The task's return code (0 = success); valid after Wait() returned true. */
  CHI_CROSS_FUN u32 GetReturnCode() const { return task_->GetReturnCode(); }

  /** Gives up ownership: the runtime frees the task when it completes (or now if it has). */
  CHI_CROSS_FUN void Release() {
    if (task_ == nullptr) return;
    TaskT *t = task_;
    task_ = nullptr;
#if CHI_IS_GPU
    if constexpr (gpu::kGpuTask<TaskT>) gpu::ReleaseTask(t);  // frees the task's GPU slot
#else
    // acq_rel: pairs with CompleteTask; exactly one side sees the other's bit and frees.
    const u32 prev = t->state_.FetchOr(task_state::kOrphaned, MemOrder::kAcqRel);
    if (prev & task_state::kComplete) DeleteTask(t);
#endif
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
    // Poll for a fixed time (PAUSE costs 10-140 cycles by CPU). Every 64 polls,
    // read the clock and yield the CPU: a worker we just woke is often placed on
    // this very CPU by the scheduler, and must not wait for our time slice to end.
    const u64 spin_start = NowNs();
    for (u32 i = 1;; ++i) {
      if (task_->IsComplete()) return true;
      CpuRelax();
      if ((i & 63) == 0) {
        if (NowNs() - spin_start >= kSpinNs) break;
        sched_yield();
      }
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
