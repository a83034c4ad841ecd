// Worker: one runtime thread. It polls its lanes (active set every pass, cold
// set every kColdPollInterval passes), routes each new task to a container,
// runs it on an idle fiber shell, resumes fibers whose awaited event completed,
// and parks when there is nothing to do (on a futex, or through its parker; the
// loop is worker_loop.h).
//
// Hot path: lane pop -> PoolManager::Acquire -> ResolveQuery -> shell switch (none for a
// RunOn::kWorkerStack method) -> Container::Run -> CompleteTask (flag + wake). Waits
// inside a task yield the fiber (WaitInFiber); the completer pushes the waiter onto its
// worker's resume stack, and only that worker ever resumes it. A shell goes back to the
// idle list only when its task's body has returned, never while it is suspended.
#pragma once

#include <time.h>   // clock_gettime for timers

#include <exception>  // std::exception thrown by a task handler
#include <memory>     // unique_ptr for run contexts
#include <thread>     // the worker thread
#include <vector>     // lanes, timers

#include "chi/core/atomic.h"            // parked word, resume stack
#include "chi/core/futex.h"             // parking
#include "chi/queue/task_queue.h"       // TaskLane
#include "chi/runtime/lane_help.h"      // LaneHelpView: taking a stuck peer's tasks
#include "chi/runtime/fiber.h"          // ShellPool, FiberShell
#include "chi/runtime/pool_manager.h"   // PoolManager, PoolInfo
#include "chi/runtime/router.h"         // ResolveQuery
#include "chi/runtime/run_context.h"    // RunContext, thread-locals
#include "chi/runtime/task_overflow.h"  // TaskOverflow: subtasks beyond a full lane
#include "chi/runtime/worker_types.h"   // WorkerRole, WorkerStats, WorkerPoller, NowNs
#include "chi/task/task_ops.h"          // CompleteTask, DeleteTask

namespace chi {

class WorkOrchestrator;

/** A runtime worker thread and everything it owns. */
class Worker {
 public:
  /**
   * Idle time spent polling before parking (lane workers; SetParker sets a worker's own).
   * On 2 cores a longer spin crowded out the other processes' threads: at 400 us, ZeroMQ
   * round trips (then served by these workers) took 1.3-2.8x raw in 3 of 10 runs.
   */
  static constexpr u64 kIdleSpinNs = 100000;
  static constexpr u32 kHotPolls = 16;             ///< idle polls after work with no PAUSE
  static constexpr u32 kColdAfterEmptyPolls = 256;
  static constexpr u32 kColdPollInterval = 16;
  static constexpr u32 kPopBatch = 32;             ///< tasks taken from one lane per pass
  static constexpr u64 kStopGraceNs = 5000000000ull;  ///< blocked fibers may delay exit this long

  Worker(u32 id, WorkerRole role, WorkOrchestrator *orch, PoolManager *pools, NodeId node,
         size_t stack_bytes)
      : id_(id), role_(role), orch_(orch), pools_(pools), node_(node),
        shells_(stack_bytes, &san_, &Worker::ShellMain, this) {}
  ~Worker() { Join(); }
  Worker(const Worker &) = delete;
  Worker &operator=(const Worker &) = delete;

  /** Adds a lane to this worker's active set (before Start). */
  void AddLane(TaskLane *lane) {
    lane->SetTag(id_);
    active_.push_back(LaneSlot{lane, 0});
  }
  /**
   * Gives a poller worker its lane for its tasks' subtasks, with the overflow list its
   * helpers know (WorkOrchestrator::NewPollerWorker; before Start). Nothing else wakes the
   * low-latency workers for those subtasks, so its PushLocal does (WakeHelpers).
   */
  void AddPollerLane(TaskLane *lane, TaskOverflow *overflow) {
    AddLane(lane);
    overflow_ = overflow;
  }
  /**
   * Makes this worker sleep through `parker` instead of its futex, after `idle_spin_ns` of
   * idle polling (before Start; the parker outlives the thread). For a worker of its own
   * whose external poller's input wakes the parker (the network worker's sockets).
   */
  void SetParker(WorkerParker *parker, u64 idle_spin_ns) {
    parker_ = parker;
    idle_spin_ns_ = idle_spin_ns;
  }
  /**
   * Lets this worker take the queued tasks of its peers (the other workers of its role,
   * and the poller workers) while they are stuck in a long task (lane_help.h):
   * `peer_lanes` are their lanes, each with its owner's overflow list, the first
   * `role_lanes` of them its role's; `deep_parked` counts the role's workers parked
   * without watching them (before Start).
   */
  void SetPeers(std::vector<PeerLane> peer_lanes, u32 role_lanes, Atomic<u32> *deep_parked) {
    if (peer_lanes.empty()) return;
    help_ = std::make_unique<LaneHelpView>(std::move(peer_lanes), role_lanes);
    deep_parked_ = deep_parked;
  }
  /** Launches the thread. */
  void Start() { thread_ = std::thread([this] { Loop(); }); }
  /** Asks the loop to drain and exit. */
  void RequestStop() {
    stop_.Store(1, MemOrder::kRelease);
    ForceWake();
  }
  /** Waits for the thread to exit. */
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

  /**
   * Wakes the worker if it is parked; call after publishing work for it. True when it
   * was parked (this call or a racing one woke it), false when it was awake.
   */
  bool Wake() {
    // seq_cst load: every publish that precedes a Wake is itself seq_cst (the lane's
    // slot store, Resume's CAS), so this pairs with Park()'s fence without a second one.
    if (parked_.Load(MemOrder::kSeqCst) == kAwake) return false;
    ForceWake();
    return true;
  }

  /** True while the worker sleeps (any thread; a hint, it may wake any moment). */
  bool IsParked() const { return parked_.Load(MemOrder::kRelaxed) != kAwake; }  // relaxed: a hint
  /**
   * True while it sleeps without watching its peers' lanes (any thread; a hint): only a
   * wake brings it to a peer stuck with tasks queued (WorkOrchestrator::SubmitTo).
   */
  bool IsDeepParked() const { return parked_.Load(MemOrder::kAcquire) == kParkedDeep; }

  /**
   * Swaps the external poller called every loop pass from `from` to `to` (either may be
   * nullptr; any thread); false when `from` was not the one installed. Returns once the
   * loop no longer uses `from`, so its owner may then go.
   */
  bool ReplacePoller(WorkerPoller *from, WorkerPoller *to) { return external_.Replace(from, to); }

  /**
   * Runs a task that this worker's external poller took in (its own thread only): it
   * starts right after the poll, without a trip through the lanes. `pool` is the
   * reference taken for it when it was decoded; the task's completion releases it.
   */
  void Adopt(Task *t, PoolInfo *pool) { adopted_.push_back(Adopted{t, pool}); }
  /**
   * True while adopted tasks wait for their start (its own thread only): a poller then
   * ends its pass, and the loop starts them before anything else.
   */
  bool HasAdopted() const { return !adopted_.empty(); }

  /** Queues a suspended fiber to be resumed by this worker (any thread). */
  void Resume(RunContext *r) {
    u64 head = resume_.Load(MemOrder::kRelaxed);
    do {
      r->next_ = reinterpret_cast<RunContext *>(head);
      // seq_cst: publishes the fiber and its completed task to the resumer, and is the
      // store half of the Dekker pair Wake() completes with its seq_cst load.
    } while (!resume_.CompareExchange(head, reinterpret_cast<u64>(r), MemOrder::kSeqCst));
    if (tls_current_worker != this) Wake();
  }

  /** Task side: suspends the running fiber until `t` completes. */
  void WaitInFiber(Task *t, RunContext *r) {
    r->RequireFiber("wait for another task");
    if (t->IsComplete()) return;
    t->waiter_ = r;
    // acq_rel: publishes waiter_ to the completer; sees its kComplete if it came first.
    const u32 prev = t->state_.FetchOr(task_state::kHasWaiter, MemOrder::kAcqRel);
    if (prev & task_state::kComplete) return;
    ++blocked_;
    r->Yield();
    --blocked_;
  }

  /** Task side: gives other tasks a turn, then continues (timed waits poll with this). */
  void YieldInFiber(RunContext *r) {
    r->RequireFiber("yield");
    Resume(r);
    r->Yield();
  }

  /**
   * Task side: suspends the running fiber for `ns` nanoseconds. False when the worker
   * woke it early because it stops (the task should say it was cut short).
   */
  bool SleepInFiber(RunContext *r, u64 ns) {
    r->RequireFiber("sleep");
    const u64 wake_ns = NowNs() + ns;
    sleepers_.push_back(Sleeper{wake_ns, r});
    ++blocked_;
    r->Yield();
    --blocked_;
    return NowNs() >= wake_ns;
  }

  /**
   * Queues a task on this worker from its own thread without ever blocking on itself.
   * What its lane cannot take waits in overflow_, behind earlier overflow (order kept),
   * and moves into the lane as it drains (FeedLane, or a helping peer), where idle peers
   * can take it.
   */
  void PushLocal(Task *t) {
    TaskLane *lane = active_.empty() ? nullptr : active_.front().lane;
    if (!overflow_->Empty() || lane == nullptr || !lane->TryPush(reinterpret_cast<u64>(t))) {
      overflow_->Push(t, lane);
    }
    if (overflow_ != &own_overflow_) WakeHelpers();  // a poller worker's lane (AddPollerLane)
  }

  /** Its overflow list, which helping peers feed into its lanes (lane_help.h). */
  TaskOverflow *Overflow() { return overflow_; }

  /** Snapshot of the counters (read racily from other threads: statistics only). */
  WorkerStats Stats() const {
    WorkerStats s;
    s.id_ = id_;
    s.role_ = role_;
    s.tasks_done_ = tasks_done_.Load(MemOrder::kRelaxed);
    for (const LaneSlot &l : active_) s.queue_depth_ += l.lane->Size();
    for (const LaneSlot &l : cold_) s.queue_depth_ += l.lane->Size();
    s.blocked_ = blocked_;
    s.parks_ = parks_.Load(MemOrder::kRelaxed);
    s.stacks_ = shells_.Stacks().TotalStacks();
    s.fibers_ = shells_.Created();
    s.helped_ = helped_.Load(MemOrder::kRelaxed);
    return s;
  }

  u32 GetId() const { return id_; }
  WorkerRole GetRole() const { return role_; }

 private:
  struct LaneSlot {
    TaskLane *lane;
    u32 empty_polls;
  };
  struct Sleeper {
    u64 wake_ns;
    RunContext *r;
  };
  struct Adopted {
    Task *task;
    PoolInfo *pool;
  };

  inline void Loop();
  /**
   * Moves overflowed tasks into this worker's first active lane while it has room (a
   * worker without lanes starts them); true when it started any.
   */
  inline bool FeedLane();
  inline bool PollLanes(u64 pass);
  inline bool DrainResumes();
  inline bool StartAdopted();
  inline bool RunDueTimers(bool stopping);
  inline bool HasWork() const;
  inline bool HelpPeers(u64 now_ns);
  /**
   * A poller worker queued a subtask: wakes a deep-parked low-latency worker, which then
   * watches its lane (their deep parks have no timeout for a poller's lane).
   */
  inline void WakeHelpers();
  inline u64 NextTimerNs() const;
  inline bool ParkDeep();
  inline void Park();
  inline void StartTask(Task *t);
  inline void StartAcquired(Task *t, PoolInfo *pool);
  inline void Launch(RunContext *r);
  inline void RunOnStack(RunContext *r);
  inline void RunToEnd(RunContext *r);
  inline void StartFiber(RunContext *r);
  inline void SwitchTo(RunContext *r);
  inline bool RunsAgain(const RunContext *r) const;
  inline void FinishInShell(RunContext *r);
  inline void OnFiberDone(RunContext *r);
  inline void ShellLoop(FiberShell &shell);
  inline void RunBody(RunContext *r);
  inline void EndShells();
  inline void FanOut(RunContext *r);
  inline void FinishTask(Task *t, PoolInfo *pool);  ///< release pool, count, publish

  /** FiberShell::Body of every shell: `worker` is this worker. */
  static void ShellMain(void *worker, FiberShell &shell) {
    static_cast<Worker *>(worker)->ShellLoop(shell);
  }
  /** parked_ values: awake, asleep (watching peers, or with nobody to watch), asleep deep. */
  static constexpr u32 kAwake = 0;
  static constexpr u32 kParked = 1;
  static constexpr u32 kParkedDeep = 2;

  void ForceWake() {
    if (parked_.Exchange(kAwake, MemOrder::kAcqRel) == kAwake) return;
    if (parker_ != nullptr) {
      parker_->Interrupt();
    } else {
      FutexWake(parked_.Raw(), 1);
    }
  }
  RunContext *NewRunContext() {
    RunContext *r = free_rctx_;
    if (r != nullptr) {
      free_rctx_ = r->next_;
      *r = RunContext();
    } else {
      all_rctx_.push_back(std::make_unique<RunContext>());
      r = all_rctx_.back().get();
    }
    r->worker_ = this;
    return r;
  }
  void FreeRunContext(RunContext *r) {
    r->task_ = nullptr;
    r->next_ = free_rctx_;
    free_rctx_ = r;
  }

  u32 id_;
  WorkerRole role_;
  WorkOrchestrator *orch_;
  PoolManager *pools_;
  NodeId node_;
  ShellPool shells_;                ///< fibers that run tasks, reused task after task
  RunContext *starting_ = nullptr;  ///< the task StartFiber hands to the shell it enters
  std::thread thread_;
  std::vector<LaneSlot> active_;
  std::vector<LaneSlot> cold_;
  TaskOverflow own_overflow_;  ///< its tasks' subtasks beyond a full lane (PushLocal)
  /// own_overflow_, or the orchestrator's for a poller worker's lane (AddPollerLane)
  TaskOverflow *overflow_ = &own_overflow_;
  std::vector<Adopted> adopted_;      ///< tasks the external poller took in (Adopt)
  std::vector<RunContext *> timers_;  ///< periodic tasks waiting for their next run
  std::vector<Sleeper> sleepers_;     ///< fibers in SleepInFiber
  RunContext *free_rctx_ = nullptr;
  std::vector<std::unique_ptr<RunContext>> all_rctx_;
  FiberSanitizerState san_;  ///< sanitizer view of the worker's own stack
  RouteTargets targets_;
  u64 blocked_ = 0;
  u64 running_ = 0;  ///< fibers started and not finished (includes blocked and periodic)
  WorkerParker *parker_ = nullptr;  ///< how it sleeps, when not on parked_ (SetParker)
  u64 idle_spin_ns_ = kIdleSpinNs;   ///< idle polling before it sleeps
  std::unique_ptr<LaneHelpView> help_;  ///< its peers' lanes (SetPeers), or none
  Atomic<u32> *deep_parked_ = nullptr;  ///< its role's count of deep-parked workers
  u64 next_help_ns_ = 0;                ///< when its idle loop looks at the peers next
  alignas(kCacheLine) Atomic<u32> parked_;   ///< futex word: kParked(Deep) while sleeping
  alignas(kCacheLine) Atomic<u64> resume_;   ///< Treiber stack of RunContexts to resume
  alignas(kCacheLine) Atomic<u32> stop_;
  PollerSlot external_;  ///< the external poller (ReplacePoller), unpinned before any fiber
  Atomic<u64> tasks_done_;
  Atomic<u64> parks_;
  Atomic<u64> helped_;  ///< tasks taken from stuck peers' lanes (HelpPeers)
};

/** Resumes a fiber on the worker that owns it (used by CompleteTask). */
inline void ResumeWaiter(RunContext *r) { r->worker_->Resume(r); }

inline void RunContext::ThrowNoFiber(const char *op) const {
  // Short enough for the task's message: it names the method, the pool and the wait.
  const MethodId method = task_ != nullptr ? task_->method_ : 0;
  const char *name = container_ != nullptr ? container_->MethodName(method) : "?";
  const std::string pool = task_ != nullptr ? task_->pool_id_.ToString() : "?";
  throw WaitWithoutFiber(
      Status::Errorf(ErrorCode::kUnsupported,
                     "method %s of pool %s runs on the worker's stack and cannot %s", name,
                     pool.c_str(), op));
}

// ---- Fiber shells -----------------------------------------------------------

/** Runs r's task where its method runs: on a fiber shell, or on this stack. */
void Worker::Launch(RunContext *r) {
  if (r->on_worker_stack_) {
    RunOnStack(r);
  } else {
    StartFiber(r);
  }
}

/**
 * Runs a RunOn::kWorkerStack task to its end right here, on the loop's stack: the same
 * steps as a shell's pass (ShellLoop, then OnFiberDone), without the two switches.
 */
void Worker::RunOnStack(RunContext *r) {
  ++running_;
  external_.Unpin();  // as SwitchTo: the task may run long
  tls_current_rctx = r;
  RunToEnd(r);
  tls_current_rctx = nullptr;
  OnFiberDone(r);
}

/** One task's run where it stands (a shell, or the worker's stack): body, then its end. */
void Worker::RunToEnd(RunContext *r) {
  RunBody(r);
  FinishInShell(r);
  r->finished_ = true;
}

void Worker::StartFiber(RunContext *r) {
  ++running_;
  r->finished_ = false;
  r->shell_ = shells_.Take();  // idle: waits at the top of ShellLoop for starting_
  starting_ = r;
  SwitchTo(r);
}

void Worker::SwitchTo(RunContext *r) {
  external_.Unpin();  // a task may run long: a poller's owner must not wait for it
  tls_current_rctx = r;
  r->shell_->Enter();
  tls_current_rctx = nullptr;
  if (r->finished_) OnFiberDone(r);
}

/** Runs in every shell: one task per pass; returns only when the worker exits (EndShells). */
void Worker::ShellLoop(FiberShell &shell) {
  for (;;) {
    RunContext *r = starting_;
    starting_ = nullptr;
    if (r == nullptr) return;
    RunToEnd(r);
    shell.Suspend();  // SwitchTo sees finished_ and frees the shell before its next task
  }
}

/** At exit: ends the idle shells, and unwinds those whose task stayed blocked past the grace. */
void Worker::EndShells() {
  starting_ = nullptr;
  shells_.EndIdle();
  for (auto &r : all_rctx_) {
    if (r->shell_ == nullptr) continue;
    tls_current_rctx = r.get();
    r->shell_->Abandon();  // the task is never answered (as before shells): its destructors run
    tls_current_rctx = nullptr;
  }
}

// ---- Task start, run and completion ---------------------------------------

void Worker::FinishTask(Task *t, PoolInfo *pool) {
  if (pool != nullptr) pools_->Release(pool);
  tasks_done_.AddOwned(1);  // only this thread writes it
  CompleteTask(t);
}

void Worker::StartTask(Task *t) { StartAcquired(t, pools_->Acquire(t->pool_id_)); }

/** Starts `t` holding `pool` (null: the pool is gone or being destroyed). */
void Worker::StartAcquired(Task *t, PoolInfo *pool) {
  if (CHI_UNLIKELY(pool == nullptr)) {
    t->SetErrorf(ErrorCode::kUnknownPool, "pool %s does not exist (or is being destroyed)",
                 t->pool_id_.ToString().c_str());
    return FinishTask(t, nullptr);
  }
  RunContext *r = NewRunContext();
  r->task_ = t;
  r->pool_ = pool;
  if (t->pool_query_.GetMode() == RoutingMode::kDynamic) {
    Container *first = pool->FirstLocal();
    if (first != nullptr) first->Monitor(MonitorMode::kGlobalSchedule, t->method_, t, *r);
  }
  Status st = ResolveQuery(*pool, t->pool_query_, node_, &targets_);
  if (st.ok() && !targets_.fan_out_) {
    r->container_ = pool->GetContainer(targets_.single_);
    const RunOn where = r->container_->RunsOn(t->method_);
    r->on_worker_stack_ = where == RunOn::kWorkerStack;
    if (where == RunOn::kUnknown) {
      st = Status::Errorf(ErrorCode::kUnknownMethod, "pool %s (module %s) has no method %u",
                          pool->id_.ToString().c_str(), pool->module_name_.c_str(), t->method_);
    }
  }
  if (CHI_UNLIKELY(!st.ok())) {
    t->SetError(st.code(), st.message());
    FreeRunContext(r);
    return FinishTask(t, pool);
  }
  if (targets_.fan_out_) {
    r->kind_ = RunContext::Kind::kFanOut;
    r->targets_ = targets_.many_;
    r->container_ = pool->GetContainer(targets_.many_.front());
  } else {
    r->container_->Monitor(MonitorMode::kLocalSchedule, t->method_, t, *r);
  }
  Launch(r);
}

/** Runs the task's handler (or its fan-out); an exception it throws becomes its error answer. */
void Worker::RunBody(RunContext *r) {
  try {
    if (r->kind_ == RunContext::Kind::kFanOut) {
      FanOut(r);
    } else {
      r->container_->Run(r->task_->method_, r->task_, *r);
    }
  } catch (const FiberShell::Unwind &) {
    throw;  // EndShells abandons this fiber: not the task's failure
  } catch (const ctx::detail::forced_unwind &) {
    throw;  // Boost destroys this fiber
  } catch (const WaitWithoutFiber &e) {
    r->task_->SetError(e.status().code(), e.status().message());
  } catch (const std::exception &e) {
    r->task_->SetErrorf(ErrorCode::kInternal, "task threw: %s", e.what());
  } catch (...) {
    r->task_->SetError(ErrorCode::kInternal, "task threw a non-standard exception");
  }
}

/** True when r's periodic task runs again after this run (OnFiberDone puts it on the timers). */
bool Worker::RunsAgain(const RunContext *r) const {
  const Task *t = r->task_;
  return t->task_flags_.Any(TASK_PERIODIC) && t->rc_ == 0 &&
         (t->state_.Load(MemOrder::kAcquire) & task_state::kCancelRequested) == 0 &&
         r->pool_->destroying_.Load(MemOrder::kAcquire) == 0 &&
         stop_.Load(MemOrder::kAcquire) == 0;
}

/**
 * After its body returned, still on its fiber: a task that is done is counted and
 * completed here, before the switch back to the loop, so whoever waits (a caller in
 * another process, a thread, a fiber) does not wait for the switch and the loop's
 * bookkeeping too. A transport's answer goes out before the counting; a local task is
 * counted (and its pool released) before its waiter can see it done. r->task_ is cleared:
 * the task may be freed by then. A periodic task that runs again is left to OnFiberDone.
 */
void Worker::FinishInShell(RunContext *r) {
  if (RunsAgain(r)) return;
  Task *t = r->task_;
  PoolInfo *pool = r->pool_;
  Container *counted =
      r->container_ != nullptr && r->kind_ == RunContext::Kind::kRun ? r->container_ : nullptr;
  r->task_ = nullptr;
  tls_current_rctx = nullptr;  // completion runs outside any task, as it would on the loop
  // A transport's answer first: the pool stays held until it is out, so its containers
  // live on; the completer owns (and frees) the task from there.
  const bool answer_first = t->completer_ != nullptr;
  if (answer_first) CompleteTask(t);
  if (counted != nullptr) counted->CountDone();
  pool->tasks_done_.Add(1);
  if (answer_first) {
    pools_->Release(pool);
    tasks_done_.AddOwned(1);  // only this thread writes it
  } else {
    FinishTask(t, pool);  // releases the pool, counts, and publishes the outputs
  }
  tls_current_rctx = r;
}

void Worker::OnFiberDone(RunContext *r) {
  --running_;
  // Its body returned: its shell (none on the worker's stack) waits for the next task.
  if (r->shell_ != nullptr) shells_.Give(r->shell_);
  r->shell_ = nullptr;
  if (r->task_ == nullptr) {  // finished in its shell (FinishInShell)
    FreeRunContext(r);
    return;
  }
  // A periodic task that runs again (RunsAgain): still ours until it ends.
  r->next_run_ns_ = NowNs() + static_cast<u64>(r->task_->period_ns_);
  ++running_;
  timers_.push_back(r);
  if (r->container_ != nullptr) r->container_->CountDone();
}

/**
 * Sleeps for `ns` nanoseconds: inside a runtime task the fiber is suspended and
 * the worker runs other tasks; elsewhere the thread sleeps. False when a stopping
 * runtime cut the sleep short (so that it does not hold up the stop): a task that
 * needed the whole time should then fail (kShutdown) rather than report success, so the
 * result may not be ignored.
 */
[[nodiscard]] inline bool SleepFor(u64 ns) {
  if (RunContext *r = CurrentRunContext()) return r->GetWorker()->SleepInFiber(r, ns);
  timespec ts{static_cast<time_t>(ns / 1000000000ull), static_cast<long>(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0) {
  }
  return true;
}

}  // namespace chi

// The loop's definitions (Loop, PollLanes, HasWork, Park, ...): every user of a Worker
// needs them, so they come with this header.
#include "chi/runtime/worker_loop.h"  // IWYU pragma: export
