// GpuWorker: the CPU side of every GPU's CPU-facing queues, on one thread (seed 000's
// GPU-worker role). It is the ClientTransport IpcManager hands LocalGpuBcast/ToLocalGpu
// tasks to (posted into cpu2gpu, completed when the GPU's answer lands), and it serves
// gpu2cpu: each request becomes a host task (the container's LoadTaskIn) that runs on this
// same thread, a runtime Worker of role kGpuPoller whose external poller this is (no hop to
// another thread; a task may still wait, in its fiber), and whose TaskCompleter writes the
// answer back into the slot. It serves the gpu2cpu queues applications register
// (RegisterQueue, user_queues.h) the same way. High-latency tasks go to those workers.
// While a task holds the thread without yielding, a rescue thread serves the gpu2cpu
// queues instead, handing their tasks to the low-latency workers (poller_rescue.h).
// A pure client process runs one too, over the cpu2gpu queues it attached (client mode: no
// gpu2cpu serving); cpu2gpu slots are shared by processes through host_slots.h.
// Invariant: every task given to Send completes exactly once, with its answer or an error
// (no GPU, bad GPU id, unknown pool, too large, shutdown); nothing is dropped.
#pragma once

#include <time.h>    // nanosleep: the rescue thread's wait between passes
#include <unistd.h>  // getpid: the claim words hold the claimer's pid

#include <algorithm>  // std::min of the rescue thread's wait
#include <climits>  // INT_MAX: wake every parked sender
#include <cstring>  // memcpy of diagnostic and error answers
#include <memory>   // the dispatcher and the worker thread
#include <string>   // the no-GPU reason
#include <vector>   // links, error answers, broadcast replicas

#include "chi/core/atomic.h"                   // Atomic, FenceSeqCst, CpuRelax
#include "chi/core/fork_epoch.h"               // KeepInherited: a forked child's inherited thread
#include "chi/core/futex.h"                    // parking senders and the idle worker
#include "chi/core/status.h"                   // Status, ErrorCode
#include "chi/gpu/gpu_ipc_cache.h"             // ClientMemory: dead clients' registrations
#include "chi/gpu/gpu_link.h"                  // GpuLink, GpuPoolDirectory
#include "chi/gpu/gpu_wire.h"                  // envelope helpers, EncodeErrorAnswer
#include "chi/gpu/host_slots.h"                // cpu2gpu claims shared across processes
#include "chi/gpu/mailbox.h"                   // GpuQueue
#include "chi/gpu/user_queues.h"               // UserGpuQueues: registered gpu2cpu queues
#include "chi/runtime/poller_rescue.h"        // serving gpu2cpu while the worker is stuck
#include "chi/runtime/pool_manager.h"          // PoolManager
#include "chi/runtime/run_context.h"           // CurrentRunContext
#include "chi/runtime/work_orchestrator.h"     // WorkOrchestrator, Worker: the thread we run on
#include "chi/task/future.h"                   // WaitHelper: waiting callers take answers
#include "chi/task/task_ops.h"                 // CompleteTask, DeleteTask
#include "chi/transport/client_connect.h"      // ProcessAlive for the dead-client reaper
#include "chi/transport/request_dispatcher.h"  // RequestDispatcher, chi::DecodeAnswer
#include "chi/transport/transport.h"           // ClientTransport

namespace chi::gpu {

/** The GPU-worker thread and the CPU->GPU transport. */
class GpuWorker : public ClientTransport,
                  private TaskCompleter,
                  private WorkerPoller,
                  private RescuablePoller {
 public:
  static constexpr u64 kMinNapNs = 20000;    ///< first idle nap
  static constexpr u64 kMaxNapNs = 1000000;  ///< longest idle nap (gpu2cpu latency when idle)
  static constexpr u32 kClaimSpins = 256;    ///< full-queue spins before a sender parks
  static constexpr u64 kDrainTimeoutNs = 5000000000ull;
  static constexpr u64 kReapPeriodNs = 100000000;  ///< how often the runtime looks for dead clients
  static constexpr u32 kUserLinkBase = 1u << 16;   ///< link index of user queue 0 (task cookies)
  static constexpr u64 kClientStackBytes = 64 * 1024;  ///< a client's worker runs no tasks
  /** The rescue thread's wait between passes over the gpu2cpu queues (a stuck worker's). */
  static constexpr u64 kRescueNapNs = 50000;

  GpuWorker() = default;
  ~GpuWorker() override { Stop(); }
  GpuWorker(const GpuWorker &) = delete;
  GpuWorker &operator=(const GpuWorker &) = delete;

  /**
   * Starts serving `links` (not owned; they outlive Stop). With no links, every send fails
   * with `no_gpu_reason`. `runtime` = this process runs the orchestrators: it also reaps
   * the cpu2gpu slots and registrations of dead client processes (a client's worker passes
   * false, with no gpu2cpu queue in its links and null pools/orch).
   */
  void Start(PoolManager *pools, WorkOrchestrator *orch, GpuPoolDirectory *directory,
             std::vector<GpuLink *> links, std::string no_gpu_reason, bool runtime = true) {
    runtime_ = runtime;
    pid_ = static_cast<u32>(getpid());
    pools_ = pools;
    orch_ = orch;
    directory_ = directory;
    links_ = std::move(links);
    no_gpu_reason_ = std::move(no_gpu_reason);
    dispatcher_ = std::make_unique<RequestDispatcher>(pools, orch);
    closing_.Store(0, MemOrder::kRelease);
    stop_.Store(0, MemOrder::kRelease);
    rounds_ = 0;
    next_reap_ = NowNs() + kReapPeriodNs;
    if (!links_.empty()) {
      // A client process has no orchestrator: its thread only takes cpu2gpu answers.
      worker_ = orch != nullptr ? orch->NewPollerWorker(WorkerRole::kGpuPoller)
                                : std::make_unique<Worker>(0, WorkerRole::kGpuPoller, nullptr,
                                                           nullptr, 0, kClientStackBytes);
      worker_->ReplacePoller(nullptr, this);
      worker_->Start();
      if (orch != nullptr) rescue_.Start(this, "chi-gpu-rescue");  // it serves gpu2cpu
      // Beside a pure client's transport helper, if any (a process holds up to four).
      helping_ = WaitHelper::Install(&helper_);
    }
  }

  /**
   * Refuses new sends (they fail with kShutdown) and waits, bounded, for GPU->CPU tasks
   * still running in the workers. False when some are still running (their slots must
   * then stay mapped).
   */
  bool StopIntake() {
    closing_.Store(1, MemOrder::kSeqCst);  // seq_cst: pairs with Send's senders_ count
    const u64 deadline = NowNs() + kDrainTimeoutNs;
    for (;;) {
      u64 busy = senders_.Load(MemOrder::kSeqCst) + user_.Inflight();
      for (GpuLink *l : links_) busy += l->gpu2cpu_inflight.Load(MemOrder::kAcquire);
      if (busy == 0) return true;
      if (NowNs() > deadline) return false;
      static_cast<void>(SleepFor(100000));  // cut short by a stop: the deadline still holds
    }
  }

  /** Joins the thread, then fails every CPU->GPU task still waiting with kShutdown. */
  void Stop() {
    rescue_.Stop();  // the kernels are stopped: no request comes that needs rescuing
    closing_.Store(1, MemOrder::kSeqCst);
    stop_.Store(1, MemOrder::kRelease);
    Wake();
    if (helping_) WaitHelper::Remove(&helper_);  // returns once no waiter is inside it
    helping_ = false;
    if (worker_ != nullptr) {
      worker_->RequestStop();  // it drains the tasks it runs, then exits
      worker_->Join();
      worker_.reset();
    }
    if (user_.Inflight() == 0) user_.Clear();  // a restarted worker must not poll them
    for (GpuLink *l : links_) {
      for (u32 s = 0; s < l->cpu2gpu.num_slots_; ++s) {
        const u64 p = l->pending[s].Exchange(0, MemOrder::kAcquire);
        if (p == 0) continue;
        l->cpu2gpu_inflight.FetchSub(1, MemOrder::kRelaxed);
        Fail(reinterpret_cast<Task *>(p), ErrorCode::kShutdown,
             "the GPU runtime stopped before the GPU answered");
      }
    }
    links_.clear();
  }

  /**
   * In a forked child: the thread, links and tasks are the parent's. Keeps the thread's
   * Worker unjoined (KeepInherited) and forgets the links and queues, so Stop and the
   * destructor touch nothing of the parent's; sends then fail with kShutdown.
   */
  void ForgetAfterFork() {
    KeepInherited(std::move(worker_));
    rescue_.ForgetAfterFork();
    helping_ = false;
    links_.clear();
    user_.ForgetAfterFork();
    // relaxed: the child has one thread here. A parent's sender in flight would hold up
    // StopIntake's drain; closing_ fails sends until Start.
    senders_.Store(0, MemOrder::kRelaxed);
    closing_.Store(1, MemOrder::kRelaxed);
  }

  /** Routes a LocalGpuBcast / ToLocalGpu task to its GPU(s); always completes it. */
  bool Send(Task *t) override {
    senders_.FetchAdd(1, MemOrder::kSeqCst);  // seq_cst: StopIntake sees us or we see it
    if (closing_.Load(MemOrder::kSeqCst) != 0) {
      Fail(t, ErrorCode::kShutdown, "the GPU runtime is stopping");
    } else if (links_.empty()) {
      Fail(t, ErrorCode::kUnsupported, no_gpu_reason_.c_str());
    } else if (t->pool_query_.GetMode() == RoutingMode::kToLocalGpu) {
      const u32 id = t->pool_query_.GetId();
      if (id >= links_.size()) {
        t->SetErrorf(ErrorCode::kInvalidArgument, "ToLocalGpu(%u): this node has %zu GPU(s)", id,
                     links_.size());
        CompleteTask(t);
      } else {
        SendTo(*links_[id], t);
      }
    } else if (links_.size() == 1) {
      SendTo(*links_[0], t);
    } else {
      Broadcast(t);
    }
    senders_.FetchSub(1, MemOrder::kSeqCst);
    return true;
  }

  /** Fails every outstanding task and stops (ClientTransport). */
  void Close() override {
    StopIntake();
    Stop();
  }
  const char *Name() const override { return "gpu"; }

  /**
   * Diagnostic: posts raw request bytes to GPU `gpu` and copies its raw answer (how tests
   * check that the orchestrator answers malformed input). On timeout the slot stays held.
   */
  Status RawRoundTrip(u32 gpu, const char *bytes, u32 len, std::vector<char> *answer,
                      u64 timeout_ns) {
    if (gpu >= links_.size()) return Status::Error(ErrorCode::kInvalidArgument, "no such GPU");
    GpuLink &l = *links_[gpu];
    if (len > l.cpu2gpu.payload_bytes_) {
      return Status::Error(ErrorCode::kTooLarge, "raw request exceeds the copy space");
    }
    const u32 s = ClaimSlot(l);
    if (s == kNoSlot) return Status::Error(ErrorCode::kShutdown, "GPU runtime is stopping");
    std::memcpy(l.cpu2gpu.Payload(s), bytes, len);
    const u32 seq = NextHostSeq(l.cpu2gpu, s);
    l.sent[s] = seq;
    l.cpu2gpu.Post(s, seq, len);
    const u64 deadline = NowNs() + timeout_ns;
    alignas(16) char buf[kGpuPayloadBytes];
    u32 out = 0;
    while (!l.cpu2gpu.TakeAnswer(s, seq, buf, &out)) {
      if (NowNs() > deadline) return Status::Error(ErrorCode::kTimeout, "no answer from the GPU");
      CpuRelax();
    }
    answer->assign(buf, buf + out);
    FreeHostSlot(l, s);
    return Status::Ok();
  }

  /**
   * Serves `queue`, a gpu2cpu queue in the caller's memory, like every GPU's own: kernels
   * given a GpuInfo whose gpu2cpu_ is its descriptor submit ToLocalCpu() tasks through it.
   * Fails (naming why) for a bad queue, too many queues, or no running GPU worker.
   */
  Status RegisterQueue(const GpuQueue<MemScope::kSystem> &queue) {
    if (!runtime_ || worker_ == nullptr || stop_.Load(MemOrder::kAcquire) != 0) {
      return Status::Error(ErrorCode::kUnsupported,
                           "no GPU worker serves gpu2cpu queues in this process (no GPU runtime)");
    }
    return user_.Register(queue);
  }
  /** Stops serving `queue`; after Ok its memory may be freed (see UserGpuQueues::Unregister). */
  Status UnregisterQueue(const GpuQueue<MemScope::kSystem> &queue) {
    return user_.Unregister(queue, kDrainTimeoutNs);
  }

  /** Counters of the worker thread (gpu2cpu tasks run on it); zeros when it is not running. */
  WorkerStats ThreadStats() const { return worker_ != nullptr ? worker_->Stats() : WorkerStats{}; }

  /** Tasks this worker posted straight into a cpu2gpu queue (no CPU transport on the way). */
  u64 Posted() const { return posted_.Load(MemOrder::kRelaxed); }  // relaxed: a statistic

  /**
   * Frees cpu2gpu slots held by dead processes (once answered) and drops dead processes'
   * memory registrations; the runtime's thread does this every kReapPeriodNs. Returns the
   * slots freed.
   */
  u32 ReapDeadClients() {
    u32 freed = 0;
    for (GpuLink *l : links_) {
      freed += ReapDeadHostClaims(l->cpu2gpu, pid_, [](u32 pid) { return ProcessAlive(pid); });
    }
    if (freed != 0) {
      for (GpuLink *l : links_) {
        l->freed.FetchAdd(1, MemOrder::kSeqCst);  // seq_cst: read against free_waiters
        if (l->free_waiters.Load(MemOrder::kSeqCst) != 0) FutexWake(l->freed.Raw(), INT_MAX);
      }
    }
    ClientMemory().DropDead([](u32 pid) { return ProcessAlive(pid); });
    return freed;
  }

 private:
  friend class GpuBroadcast;

  /** Posts t to one GPU, or completes it with the reason it cannot go. */
  void SendTo(GpuLink &l, Task *t) {
    if (Status st = directory_->EnsurePool(l.gpu_id, t->pool_id_); !st.ok()) {
      return Fail(t, st.code(), st.message());
    }
    const u32 s = ClaimSlot(l);
    if (s == kNoSlot) return Fail(t, ErrorCode::kShutdown, "the GPU runtime is stopping");
    char *p = l.cpu2gpu.Payload(s);
    const u32 seq = NextHostSeq(l.cpu2gpu, s);
    PutRequestId(p, seq);
    OutputArchive ar(p + kGpuEnvelopeBytes, l.cpu2gpu.payload_bytes_ - kGpuEnvelopeBytes);
    t->ops_->save_in(*t, ar);
    if (!ar.ok()) {
      FreeHostSlot(l, s);
      t->SetErrorf(ar.code() == ErrorCode::kTooLarge ? ErrorCode::kTooLarge : ar.code(),
                   "task does not fit the %u-byte GPU copy space", l.cpu2gpu.payload_bytes_);
      CompleteTask(t);
      return;
    }
    l.sent[s] = seq;
    l.pending[s].Store(reinterpret_cast<u64>(t), MemOrder::kRelease);  // sent[s] is visible
    l.cpu2gpu_inflight.FetchAdd(1, MemOrder::kSeqCst);  // seq_cst: the Dekker half of Wake
    l.cpu2gpu.Post(s, seq, kGpuEnvelopeBytes + static_cast<u32>(ar.Size()));
    posted_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
    Wake();
  }

  inline void Broadcast(Task *t);

  /**
   * Claims a cpu2gpu slot for this process; blocks (spin, then park) while all are taken.
   * Slots other processes hold come back when they finish (or, dead, when reaped).
   */
  u32 ClaimSlot(GpuLink &l) {
    thread_local u32 hint = 0;
    for (u32 n = 0;; ++n) {
      if (stop_.Load(MemOrder::kAcquire) != 0) return kNoSlot;
      const u32 seen = l.freed.Load(MemOrder::kAcquire);
      const u32 s = ClaimHostSlot(l.cpu2gpu, hint, pid_);
      if (s != kNoSlot) {
        hint = s;  // a thread keeps reusing its slot: the worker scans only [0, used_slots)
        u32 used = l.used_slots.Load(MemOrder::kRelaxed);
        // relaxed: pending[s], published later with release, is what the scan relies on.
        while (used < s + 1 && !l.used_slots.CompareExchange(used, s + 1, MemOrder::kRelaxed)) {
        }
        return s;
      }
      if (n < kClaimSpins) {
        CpuRelax();
      } else if (RunContext *r = CurrentRunContext()) {
        r->GetWorker()->SleepInFiber(r, kMinNapNs);  // a worker never blocks its thread
      } else {
        l.free_waiters.FetchAdd(1, MemOrder::kSeqCst);
        FutexWait(l.freed.Raw(), seen, kMaxNapNs);  // returns at once if a slot freed since
        l.free_waiters.FetchSub(1, MemOrder::kRelaxed);
      }
    }
  }

  /** Frees a cpu2gpu slot and wakes a parked sender. */
  void FreeHostSlot(GpuLink &l, u32 s) {
    ReleaseHostSlot(l.cpu2gpu, s);
    l.freed.FetchAdd(1, MemOrder::kSeqCst);  // seq_cst: read against free_waiters below
    if (l.free_waiters.Load(MemOrder::kSeqCst) != 0) FutexWake(l.freed.Raw(), INT_MAX);
  }

  /** Completes t with an error. */
  static void Fail(Task *t, ErrorCode code, const char *msg) {
    t->SetError(code, msg);
    CompleteTask(t);
  }

  /** Wakes the thread if it naps (after a CPU->GPU post). */
  void Wake() {
    FenceSeqCst();  // our post and inflight count are visible before we read sleeping_
    if (sleeping_.Load(MemOrder::kRelaxed) != 0 && sleeping_.Exchange(0, MemOrder::kAcqRel) != 0) {
      FutexWake(sleeping_.Raw(), 1);
    }
  }

  /** WorkerPoller: our worker starts polling (nothing to set up). */
  void BeginPolling(u32) override {}

  /**
   * WorkerPoller: one pass over every link (answers, then requests) and the registered
   * queues; now and then, the dead-client reaper. True when it did work.
   */
  bool Poll() override {
    bool did = false;
    // The clock is read once every 1024 passes (and after each nap): cheap even when busy.
    if (runtime_ && (++rounds_ & 1023) == 0 && NowNs() > next_reap_) {
      did |= ReapDeadClients() != 0;
      next_reap_ = NowNs() + kReapPeriodNs;
    }
    polls_.AddOwned(1);  // only this thread writes it: the rescue thread's sign of progress
    did |= TakeAnswers();
    did |= ServeAll();
    return did;
  }

  /**
   * Takes in the gpu2cpu requests of every link and registered queue, unless another thread
   * does (the rescue thread while this worker is stuck, or this worker): one reader at a
   * time, as the queues' served_ words and the user queues' busy flags require.
   */
  bool ServeAll() {
    u32 idle = 0;
    // acquire: the previous reader's served_ words and slot reads happen before ours.
    if (!serving_.CompareExchange(idle, 1, MemOrder::kAcquire)) return false;
    bool did = false;
    for (u32 i = 0; i < links_.size(); ++i) did |= ServeRequests(*links_[i], i);
    did |= user_.Serve([this](GpuLink &l, u32 i) { return ServeRequests(l, kUserLinkBase + i); });
    serving_.Store(0, MemOrder::kRelease);  // release: ours happen before the next reader's
    return did;
  }

  // ---- The rescue thread (RescuablePoller; poller_rescue.h) ----

  /** How many times the worker polled the queues (relaxed: a mark of progress). */
  u64 WorkerPolls() const override { return polls_.Load(MemOrder::kRelaxed); }
  /** True while the worker naps (EndPolling), idle rather than stuck. */
  bool WorkerSleeping() const override { return sleeping_.Load(MemOrder::kRelaxed) != 0; }

  /**
   * For a worker stuck in a task: completes the CPU->GPU answers that came and takes in the
   * gpu2cpu requests, whose tasks go to the low-latency workers' lanes (this thread is no
   * runtime worker, so the dispatcher submits them there).
   */
  bool RescuePass() override {
    TakeAnswers();
    ServeAll();
    return false;  // the queues are polled, not signalled: the next pass finds what comes
  }

  /** GPUs cannot wake a thread: sleeps a short while (bounded by timeout_ms). */
  void AwaitInput(int timeout_ms) override {
    const u64 ns = std::min<u64>(static_cast<u64>(timeout_ms) * 1000000, kRescueNapNs);
    timespec ts{0, static_cast<long>(ns)};
    nanosleep(&ts, nullptr);
  }

  /**
   * WorkerPoller: our worker found nothing to do for a while and would park, but GPUs
   * cannot wake it. So it naps here, bounded (growing up to kMaxNapNs), polling once
   * between naps, and goes on (true) when a pass finds work. Never while any task is out: a
   * GPU answer cannot wake us, and a kernel waiting on a GPU->CPU answer usually posts its
   * next request right after (and the tasks we run are among those counted). False once
   * stopping: the worker may then park and exit.
   */
  bool EndPolling(u32) override {
    for (u64 nap = kMinNapNs;; nap = nap * 2 < kMaxNapNs ? nap * 2 : kMaxNapNs) {
      sleeping_.Store(1, MemOrder::kRelaxed);
      FenceSeqCst();  // sleeping_ is visible before we look for posts (pairs with Wake)
      u64 inflight = user_.Inflight();
      for (GpuLink *l : links_) {
        inflight += l->cpu2gpu_inflight.Load(MemOrder::kRelaxed) +
                    l->gpu2cpu_inflight.Load(MemOrder::kRelaxed);
      }
      if (inflight != 0 || stop_.Load(MemOrder::kAcquire) != 0) {
        sleeping_.Store(0, MemOrder::kRelaxed);
        return stop_.Load(MemOrder::kAcquire) == 0;
      }
      FutexWait(sleeping_.Raw(), 1, nap);
      sleeping_.Store(0, MemOrder::kRelaxed);
      rounds_ = 1023;  // the next pass looks at the reaper's clock
      if (Poll()) return true;
    }
  }

  /**
   * Completes the CPU->GPU tasks whose answers arrived, on every link, unless another
   * thread is doing it: the worker's loop, or a caller spinning in Future::Wait (through
   * the wait helper), who so takes its own answer without a hop through this thread.
   */
  bool TakeAnswers() {
    // relaxed: a cheap first look; the CAS below orders the work.
    if (answering_.Load(MemOrder::kRelaxed) != 0) return false;
    u32 idle = 0;
    // acquire: the previous holder's slot frees and task completions happen before ours.
    if (!answering_.CompareExchange(idle, 1, MemOrder::kAcquire)) return false;
    bool did = false;
    for (GpuLink *l : links_) did |= CompleteAnswers(*l);
    answering_.Store(0, MemOrder::kRelease);  // release: our work before the next holder's
    return did;
  }

  /**
   * The wait helper's entry (future.h): a waiting caller's poll. Callers waiting on other
   * tasks pass through here too, so with nothing out on any GPU it only reads counters.
   */
  static void HelpWaiters(void *self) {
    auto *w = static_cast<GpuWorker *>(self);
    for (GpuLink *l : w->links_) {
      // relaxed: a hint; TakeAnswers' CAS and CompleteAnswers' acquire order the real work.
      if (l->cpu2gpu_inflight.Load(MemOrder::kRelaxed) != 0) {
        w->TakeAnswers();
        return;
      }
    }
  }

  /** Completes the CPU->GPU tasks of link l whose answers arrived (TakeAnswers' holder). */
  bool CompleteAnswers(GpuLink &l) {
    if (l.cpu2gpu_inflight.Load(MemOrder::kAcquire) == 0) return false;
    bool did = false;
    const u32 used = l.used_slots.Load(MemOrder::kAcquire);  // covers every pending slot
    alignas(16) char buf[kGpuPayloadBytes];
    for (u32 s = 0; s < used; ++s) {
      const u64 p = l.pending[s].Load(MemOrder::kAcquire);  // pairs with SendTo's release
      u32 len = 0;
      if (p == 0 || !l.cpu2gpu.TakeAnswer(s, l.sent[s], buf, &len)) continue;
      Task *t = reinterpret_cast<Task *>(p);
      chi::DecodeAnswer(t, buf, len);
      l.pending[s].Store(0, MemOrder::kRelaxed);  // only this thread reads it from now on
      FreeHostSlot(l, s);
      l.cpu2gpu_inflight.FetchSub(1, MemOrder::kRelease);
      CompleteTask(t);
      did = true;
    }
    return did;
  }

  /** Turns new gpu2cpu requests into host tasks (or error answers). */
  bool ServeRequests(GpuLink &l, u32 index) {
    const GpuQueue<MemScope::kSystem> &q = l.gpu2cpu;
    bool did = false;
    for (u32 s = 0; s < q.num_slots_; ++s) {
      const u64 w = q.PeekRequest(s);
      const u32 seq = static_cast<u32>(w);
      if (seq == q.served_[s]) continue;
      alignas(16) char buf[kGpuPayloadBytes];
      u32 len = 0;
      const char *p = q.TakeRequest(s, w, buf, &len);
      if (p == nullptr) continue;  // posted inline and still arriving: the next sweep takes it
      q.served_[s] = seq;
      did = true;
      if (len < kGpuEnvelopeBytes || len > q.payload_bytes_) {
        q.PutAnswer(s, seq, buf,
                    EncodeErrorAnswer(seq, ErrorCode::kMalformed,
                                      "GPU request length is out of range", buf, q.payload_bytes_));
        continue;
      }
      l.gpu2cpu_inflight.FetchAdd(1, MemOrder::kRelaxed);  // before: the task may finish at once
      const u64 cookie = static_cast<u64>(index) << 32 | s;
      if (!dispatcher_->Dispatch(p, len, this, cookie, &error_answer_)) {
        l.gpu2cpu_inflight.FetchSub(1, MemOrder::kRelaxed);
        const u32 n = static_cast<u32>(error_answer_.size()) < q.payload_bytes_
                          ? static_cast<u32>(error_answer_.size())
                          : q.payload_bytes_;
        std::memcpy(buf, error_answer_.data(), n);
        q.PutAnswer(s, seq, buf, n);
      }
    }
    return did;
  }

  /**
   * Who sent a GPU->CPU task: a kernel of this process (the runtime's orchestrators, or the
   * queues this process's application registered), so this process.
   */
  Caller CallerOf(const Task &) const override {
    Caller c = Caller::ThisProcess();
    c.via = Caller::Via::kGpu;
    return c;
  }

  /** A GPU->CPU task finished on a worker: its answer goes back into its slot. */
  void OnComplete(Task *t) override {
    const u32 index = static_cast<u32>(t->transport_cookie_ >> 32);
    GpuLink &l = index >= kUserLinkBase ? user_.Link(index - kUserLinkBase) : *links_[index];
    const u32 s = static_cast<u32>(t->transport_cookie_);
    const GpuQueue<MemScope::kSystem> &q = l.gpu2cpu;
    alignas(16) char buf[kGpuPayloadBytes];  // staged: PutAnswer picks inline or payload
    const u64 id = t->request_id_;
    PutRequestId(buf, id);
    OutputArchive ar(buf + kGpuEnvelopeBytes, q.payload_bytes_ - kGpuEnvelopeBytes);
    t->ops_->save_out(*t, ar);
    const u32 len = ar.ok() ? kGpuEnvelopeBytes + static_cast<u32>(ar.Size())
                            : EncodeErrorAnswer(id, ErrorCode::kTooLarge,
                                                "the task's outputs exceed the GPU copy space",
                                                buf, q.payload_bytes_);
    t->completer_ = nullptr;
    DeleteTask(t);
    q.PutAnswer(s, static_cast<u32>(id), buf, len);
    l.gpu2cpu_inflight.FetchSub(1, MemOrder::kRelease);  // the slot is no longer touched
  }

  PoolManager *pools_ = nullptr;
  WorkOrchestrator *orch_ = nullptr;
  GpuPoolDirectory *directory_ = nullptr;
  std::vector<GpuLink *> links_;
  UserGpuQueues<GpuLink> user_;  ///< gpu2cpu queues applications registered
  std::string no_gpu_reason_;
  std::unique_ptr<RequestDispatcher> dispatcher_;
  std::vector<char> error_answer_;  ///< reused by ServeRequests (error answers only)
  std::unique_ptr<Worker> worker_;  ///< the thread: polls us, runs the tasks we take in
  u32 rounds_ = 0;                  ///< Poll passes (the reaper's clock is read every 1024)
  u64 next_reap_ = 0;               ///< when Poll next looks for dead clients
  bool runtime_ = true;  ///< serves gpu2cpu and reaps dead clients (false: a client's worker)
  u32 pid_ = 0;          ///< what our claim words hold
  Atomic<u64> posted_;
  Atomic<u32> closing_;
  Atomic<u32> stop_;
  Atomic<u64> senders_;
  alignas(kCacheLine) Atomic<u32> sleeping_;  ///< futex word: 1 while the thread naps
  alignas(kCacheLine) Atomic<u32> answering_;  ///< 1 while a thread runs CompleteAnswers
  /// 1 while a thread takes in gpu2cpu requests (ServeAll); off answering_'s line, which
  /// waiting callers write.
  alignas(kCacheLine) Atomic<u32> serving_;
  Atomic<u64> polls_;    ///< the worker's polls (WorkerPolls)
  PollerRescue rescue_;  ///< serves gpu2cpu while the worker is stuck in a task
  WaitHelper helper_{&GpuWorker::HelpWaiters, this};
  bool helping_ = false;  ///< helper_ is installed
};

}  // namespace chi::gpu

// GpuWorker::Broadcast's replicas and their fold: every user of the worker needs them, so
// they come with this header.
#include "chi/gpu/gpu_broadcast.h"  // IWYU pragma: export
