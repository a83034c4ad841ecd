// Future<T>: the handle a client gets for a submitted task. Wait() spins
// briefly, then parks the thread on the task's state word (futex); inside a
// runtime task it suspends the fiber instead, so the worker keeps running
// other tasks. Dropping an unfinished Future hands the task to the runtime,
// which frees it on completion. In a GPU kernel the same calls poll the task's
// GPU slot instead (chi/gpu/gpu_client.h defines the device path). While a host
// thread spins it runs the process's WaitHelper, if one is installed (a pure client's
// shm transport: the waiting caller delivers ready answers itself).
#pragma once

#include <pthread.h>  // pthread_atfork: a forked child forgets the parent's wait helpers
#include <sched.h>    // sched_yield while polling

#include <type_traits>  // is_trivially_destructible: which tasks a kernel can submit
#include <vector>       // WaitAll

#include "chi/core/atomic.h"          // state word
#include "chi/core/fork_epoch.h"      // tasks a forked child inherited from its parent
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

/**
 * Per-process hooks that a thread spinning in Future::Wait runs on every poll (never in
 * a runtime fiber, never on a GPU, never once the thread parks), and whose poll hooks
 * Future::IsComplete runs on a task not complete yet. A pure client's transport installs
 * one so that a waiting or polling caller takes ready answers off the wire itself instead
 * of waiting for the transport's receiver thread to wake it; a GPU client's worker
 * installs another, so up to kMaxHelpers live side by side. Plain function pointers, not
 * virtuals: with none installed a poll costs one relaxed load. Inside a spin phase that
 * BeginSpin counted, a poll (RunInSpin) costs a load per slot: the count itself is what
 * keeps Remove waiting.
 */
class WaitHelper {
 public:
  using Fn = void (*)(void *ctx);
  /** Helpers installed at once, at most (a transport and a GPU client need two). */
  static constexpr u32 kMaxHelpers = 4;

  /**
   * The helper calls fn(ctx); fn must be cheap when it has nothing to do, and never block.
   * gave_up(ctx), if given, runs when a counted spin phase ends without its task
   * complete (the caller parks next): the helper's owner takes over its answers.
   * poll(ctx), if given, runs when Future::IsComplete finds its task not complete: it
   * delivers what is ready now and never waits, so a thread that polls instead of waiting
   * gets its answer as soon as one that spins would (the owner's thread may be napping).
   */
  constexpr WaitHelper(Fn fn, void *ctx, Fn gave_up = nullptr, Fn poll = nullptr)
      : fn_(fn), ctx_(ctx), gave_up_(gave_up), poll_(poll) {}

  /** Installs h in a free slot; false when all kMaxHelpers slots are taken. */
  static bool Install(WaitHelper *h) {
    for (u32 i = 0; i < kMaxHelpers; ++i) {
      WaitHelper *none = nullptr;
      // release: fn_/ctx_ and whatever ctx points to are set up before a waiter runs them.
      if (installed_[i].CompareExchange(none, h, MemOrder::kRelease)) {
        count_.FetchAdd(1, MemOrder::kRelease);  // release: after the slot (BeginSpin's hint)
        return true;
      }
    }
    return false;
  }

  /**
   * Uninstalls h (if installed) and returns once no thread is running any helper: no
   * thread inside Run or Poll, and every spin phase counted while it was installed ended (each
   * lasts at most Future::kSpinNs; phases that begin afterwards never run it).
   */
  static void Remove(WaitHelper *h) {
    for (u32 i = 0; i < kMaxHelpers; ++i) {
      WaitHelper *expected = h;
      // seq_cst: clear, then read the counts (Dekker with Run's and BeginSpin's count,
      // then load of the helper).
      if (installed_[i].CompareExchange(expected, nullptr, MemOrder::kSeqCst)) {
        count_.FetchSub(1, MemOrder::kRelaxed);  // relaxed: only BeginSpin's hint
      }
    }
    // seq_cst: the second half of that pair; a runner or spinner we see leaves with release.
    while (running_.Load(MemOrder::kSeqCst) != 0 || spinners_.Load(MemOrder::kSeqCst) != 0) {
      sched_yield();
    }
  }

  /**
   * Counts a thread entering Future::Wait's spin phase while a helper is installed;
   * true when counted (pair it with EndSpin; poll with RunInSpin meanwhile). The
   * helpers' owners read Spinners() to leave ready answers to the waiting callers.
   */
  static bool BeginSpin() {
    // relaxed: a hint; a helper installed later is simply not run by this phase.
    if (count_.Load(MemOrder::kRelaxed) == 0) return false;
    // seq_cst: count, then load the helpers in RunInSpin (Dekker with Remove).
    spinners_.FetchAdd(1, MemOrder::kSeqCst);
    return true;
  }
  /**
   * Ends what a successful BeginSpin counted; `done`: the caller's task completed. A
   * caller that gave up leaves the spinner count before the gave_up hooks run: an owner
   * a hook wakes must not see it still spinning and leave the answers to it (the shm
   * receiver would nap for 10 ms while the caller parks).
   */
  static void EndSpin(bool done) {
    if (done) {
      // release: our helper calls happen before Remove sees the count drop.
      spinners_.FetchSub(1, MemOrder::kRelease);
      return;
    }
    // seq_cst: counted as running before no longer as spinning, so Remove, which waits
    // for both counts to drop, always sees us, or we see its nullptr below (as in Run).
    running_.FetchAdd(1, MemOrder::kSeqCst);
    spinners_.FetchSub(1, MemOrder::kRelease);  // release: as above
    CallEach(&WaitHelper::gave_up_);
    // release: our hook calls happen before Remove sees the count drop.
    running_.FetchSub(1, MemOrder::kRelease);
  }
  /** Threads spinning in Future::Wait with a helper installed right now (a hint). */
  static u32 Spinners() { return spinners_.Load(MemOrder::kRelaxed); }  // relaxed: a hint

  /** Runs the installed helpers inside a spin phase that BeginSpin counted. */
  static void RunInSpin() { CallEach(&WaitHelper::fn_); }

  /** Runs the installed helpers from anywhere (counted while they run). */
  static void Run() { RunCounted(&WaitHelper::fn_); }

  /** Runs the installed helpers' poll hooks (Future::IsComplete on a task not complete). */
  static void Poll() { RunCounted(&WaitHelper::poll_); }

 private:
  /**
   * Calls hook `which` (fn_, gave_up_ or poll_) of every installed helper that has one;
   * the caller is counted (running_ or spinners_), so Remove waits for it.
   */
  static void CallEach(Fn WaitHelper::*which) {
    for (u32 i = 0; i < kMaxHelpers; ++i) {
      // seq_cst: read after our count (Dekker with Remove): nullptr once it was removed.
      WaitHelper *h = installed_[i].Load(MemOrder::kSeqCst);
      if (h != nullptr && h->*which != nullptr) (h->*which)(h->ctx_);
    }
  }

  /** Calls hook `which` of every installed helper, counted in running_ meanwhile. */
  static void RunCounted(Fn WaitHelper::*which) {
    // relaxed: only a hint; the helpers are re-read below inside the count.
    if (count_.Load(MemOrder::kRelaxed) == 0) return;
    // seq_cst: count, then load the helpers; Remove does the reverse, so it waits for us
    // or we see its nullptr.
    running_.FetchAdd(1, MemOrder::kSeqCst);
    CallEach(which);
    // release: our use of the helpers happens before Remove sees the count drop.
    running_.FetchSub(1, MemOrder::kRelease);
  }

  /**
   * In a child made by fork (only the forking thread lives on): the helpers and the
   * threads counted in running_ and spinners_ are the parent's, so the child starts with
   * none. A parent's helper run here would take the parent's answers off its transport.
   */
  static void ForgetInherited() {
    for (Atomic<WaitHelper *> &h : installed_) h.Store(nullptr, MemOrder::kRelaxed);
    // relaxed: the child has one thread while fork handlers run.
    count_.Store(0, MemOrder::kRelaxed);
    running_.Store(0, MemOrder::kRelaxed);
    spinners_.Store(0, MemOrder::kRelaxed);
  }

  Fn fn_;
  void *ctx_;
  Fn gave_up_;
  Fn poll_;
  static inline Atomic<WaitHelper *> installed_[kMaxHelpers] = {};
  static inline Atomic<u32> count_{0};     ///< slots in use (a hint for BeginSpin and Run)
  static inline Atomic<u32> running_{0};   ///< threads inside Run's, Poll's or EndSpin's calls
  static inline Atomic<u32> spinners_{0};  ///< threads in a counted spin phase
  /** ForgetInherited runs in every forked child (registered before main). */
  static inline const int fork_handler_ = pthread_atfork(nullptr, nullptr, &ForgetInherited);
};

/** Owns one submitted task until it completes and the caller is done with it. */
template <typename TaskT>
class Future {
 public:
  static constexpr u64 kSpinNs = 50000;  ///< time a waiting thread polls before it parks
  static constexpr u64 kTimedPollNs = 50000;  ///< fiber poll interval for timed waits
  /**
   * Polls at the start of a wait with no PAUSE. 64 cover a shm round trip's wait on the
   * 2-core VM (32, about 260 ns of polls there, often ran out just before the answer came).
   */
  static constexpr u32 kHotPolls = 64;
  /**
   * Time a waiting thread spins (counted from its 64th poll) before it starts yielding the
   * CPU, unless it just woke a thread. A yield is a system call through the scheduler
   * (0.4-1 us on the 2-core VM): yielding at the 64th poll, as waits did before, cost
   * nearly every in-process round trip one, since 64 polls of a completion flag take
   * ~150 ns there (bench_embedded's round trip: 624-800 ns with it, 157-267 ns without).
   */
  static constexpr u64 kYieldAfterNs = 5000;

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

  /**
   * True once outputs are final. On a host thread a task not complete yet lets the
   * process's wait helpers deliver ready answers first (WaitHelper::Poll), so polling
   * finds an answer as soon as waiting would.
   */
  CHI_CROSS_FUN bool IsComplete() const {
#if CHI_IS_GPU
    if constexpr (gpu::kGpuTask<TaskT>) {
      return task_ != nullptr && gpu::PollTask(task_);
    } else {
      return false;
    }
#else
    if (task_ == nullptr) return false;
    if (task_->IsComplete()) return true;
    WaitHelper::Poll();
    return task_->IsComplete();
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
    // acquire: a completed task is ours alone (its completer is done with it): free it
    // without the locked or below.
    if (t->state_.Load(MemOrder::kAcquire) & task_state::kComplete) {
      DeleteTask(t);
      return;
    }
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
    if (CHI_UNLIKELY(ForkGeneration() != 0) && FailInherited()) return true;
    const bool counted = WaitHelper::BeginSpin();
    const bool done = SpinOnThread(counted);
    if (counted) WaitHelper::EndSpin(done);
    if (done) return true;
    return ParkOnThread(max_sec);
  }

  /**
   * In a child made by fork: a task this process's parent submitted before the fork is
   * answered to the parent, never here, so it fails now (true) instead of waiting forever.
   * Tasks served for remote callers (completer_ set) and this process's own are left alone.
   */
  bool FailInherited() {
    const u32 pid = task_->task_id_.pid_;
    if (pid == 0 || pid == ThisPid() || task_->completer_ != nullptr) return false;
    task_->SetErrorf(ErrorCode::kShutdown,
                     "submitted by process %u, which this process was forked from: the answer "
                     "goes there",
                     pid);
    // release: the error is set before a reader sees the task complete.
    task_->state_.FetchOr(task_state::kComplete, MemOrder::kRelease);
    return true;
  }

  /**
   * Wait's spin phase on a thread: true when the task completed within kSpinNs. A phase
   * that BeginSpin counted (`helped`) runs the process's wait helper on each poll.
   */
  bool SpinOnThread(bool helped) {
    // Poll for a fixed time (PAUSE costs 10-140 cycles by CPU), counted from the 64th
    // poll, so a short wait reads no clock. The first kHotPolls polls skip the PAUSE: a
    // short task's answer comes within them, and each PAUSE delays noticing it. Every
    // 64 polls, read the clock and maybe yield the CPU. A thread this one just woke
    // (FutexWake: say the worker its submit unparked) is often placed on this very CPU by
    // the scheduler: yield from the first clock read then. Otherwise the answer comes from
    // a thread running elsewhere and a yield would only delay noticing it: yield only once
    // the spin has lasted kYieldAfterNs, for whatever other thread may share this CPU.
    const bool woke = TakeWokeAnother();
    u64 spin_start = 0;
    for (u32 i = 1;; ++i) {
      // Wait checked the task just before; the helper may complete it.
      if (helped) WaitHelper::RunInSpin();
      if (task_->IsComplete()) return true;
      if (i > kHotPolls) CpuRelax();
      if ((i & 63) == 0) {
        const u64 now = NowNs();
        if (spin_start == 0) spin_start = now;
        if (now - spin_start >= kSpinNs) return false;
        if (woke || now - spin_start >= kYieldAfterNs) sched_yield();
      }
    }
  }

  /** Wait's second phase: parks on the task's state word until completion or max_sec. */
  bool ParkOnThread(float max_sec) {
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
