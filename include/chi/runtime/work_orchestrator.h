// WorkOrchestrator: starts the workers, gives each its lane of the process
// queue (low-latency workers serve the kLowLatency priority, high-latency ones
// kHighLatency), and is where every task enters the runtime (Submit).
// Client threads block when a lane is full (back-pressure); worker threads
// never block on a lane, since they may be the only consumer of it. The first
// kPollerLanes poller workers (network, GPU) get a lane too, for their tasks' subtasks
// only, which the low-latency workers help (lane_help.h) while the poller is stuck.
#pragma once

#include <sched.h>  // sched_yield while the last submitters finish

#include <cstdlib>  // aligned_alloc/free for the queue region
#include <memory>   // unique_ptr<Worker>
#include <vector>   // workers

#include "chi/core/status.h"           // Status
#include "chi/queue/task_queue.h"      // TaskQueue, TaskLane
#include "chi/runtime/pool_manager.h"  // PoolManager
#include "chi/runtime/worker.h"        // Worker

namespace chi {

/** How many workers of each role, and their resources. */
struct WorkerConfig {
  u32 low_latency = 1;
  u32 high_latency = 1;
  u32 queue_depth = 1024;          ///< entries per lane
  u32 lanes_per_worker = 1;        ///< lanes each worker polls (clients rotate over them)
  u64 stack_bytes = 64 * 1024;     ///< fiber stack size
};

/** Owns the worker threads and the process queue they serve. */
class WorkOrchestrator {
 public:
  /** Poller workers (NewPollerWorker) that get a lane helped by the low-latency workers. */
  static constexpr u32 kPollerLanes = 4;

  WorkOrchestrator() = default;
  ~WorkOrchestrator() { Stop(); }
  WorkOrchestrator(const WorkOrchestrator &) = delete;
  WorkOrchestrator &operator=(const WorkOrchestrator &) = delete;

  /** Creates the queue and workers and starts their threads. */
  Status Start(const WorkerConfig &cfg, PoolManager *pools, NodeId node) {
    if (cfg.low_latency == 0) {
      return Status::Error(ErrorCode::kBadConfig, "workers.low_latency must be at least 1");
    }
    const u32 n = cfg.low_latency + cfg.high_latency;
    pools_ = pools;
    node_ = node;
    poller_workers_.Store(0, MemOrder::kRelaxed);  // relaxed: no poller worker exists yet
    stack_bytes_ = cfg.stack_bytes;
    lanes_per_worker_ = cfg.lanes_per_worker == 0 ? 1 : cfg.lanes_per_worker;
    const u32 worker_lanes = n * lanes_per_worker_;
    queue_bytes_ = TaskQueue::BytesFor(worker_lanes + kPollerLanes, cfg.queue_depth);
    queue_mem_ = std::aligned_alloc(kCacheLine, (queue_bytes_ + kCacheLine - 1) / kCacheLine * kCacheLine);
    if (queue_mem_ == nullptr) return Status::Error(ErrorCode::kOutOfMemory, "process queue");
    queue_ = TaskQueue::Create(queue_mem_, worker_lanes + kPollerLanes, cfg.queue_depth);
    for (u32 i = 0; i < n; ++i) {
      const bool low = i < cfg.low_latency;
      auto w = std::make_unique<Worker>(i, low ? WorkerRole::kLowLatency : WorkerRole::kHighLatency,
                                        this, pools, node, cfg.stack_bytes);
      for (u32 l = 0; l < lanes_per_worker_; ++l) {
        TaskLane *lane = &queue_->GetLane(i * lanes_per_worker_ + l,
                                          low ? QueuePriority::kLowLatency
                                              : QueuePriority::kHighLatency);
        w->AddLane(lane);
        lanes_.push_back(lane);
      }
      (low ? low_ : high_).push_back(w.get());
      workers_.push_back(std::move(w));
    }
    for (u32 k = 0; k < kPollerLanes; ++k) {
      poller_lanes_.push_back(
          PeerLane{&queue_->GetLane(worker_lanes + k, QueuePriority::kLowLatency),
                   &poller_overflow_[k]});
    }
    MakePeers(low_, &deep_parked_[0], poller_lanes_);
    MakePeers(high_, &deep_parked_[1], {});
    for (auto &w : workers_) w->Start();
    accepting_.Store(1, MemOrder::kRelease);
    return Status::Ok();
  }

  /** Refuses new tasks, lets workers drain their lanes, joins them and frees the queue. */
  void Stop() {
    if (workers_.empty()) return;
    accepting_.Store(0, MemOrder::kSeqCst);  // seq_cst: before reading submitting_ (Dekker)
    // Submits already past the check finish their push (workers still drain, so a full lane
    // frees up); the tasks they pushed are run before the workers stop.
    while (submitting_.Load(MemOrder::kSeqCst) != 0) sched_yield();
    for (auto &w : workers_) w->RequestStop();
    for (auto &w : workers_) w->Join();
    workers_.clear();
    low_.clear();
    high_.clear();
    lanes_.clear();
    poller_lanes_.clear();
    std::free(queue_mem_);
    queue_mem_ = nullptr;
    queue_ = nullptr;
  }

  /** True between Start and Stop. */
  bool IsAccepting() const { return accepting_.Load(MemOrder::kAcquire) != 0; }

  /**
   * Hands a task to a worker. From a task fiber it stays on this worker (its
   * subtasks run where the parent runs); from other threads lanes rotate.
   * Returns false (task untouched) when the runtime no longer accepts work.
   */
  bool Submit(Task *t) {
    if (CHI_UNLIKELY(!IsAccepting())) return false;
    if (Worker *me = LocalWorkerFor(*t)) {
      me->PushLocal(t);  // a worker: Stop joins it before freeing anything
      return true;
    }
    return SubmitShared(t);
  }

  /**
   * Hands a task to a worker's lane (rotating), even from a worker that could run it: a
   * network worker spreads a stream of requests over the low-latency workers this way.
   * Returns false (task untouched) when the runtime no longer accepts work.
   */
  bool SubmitShared(Task *t) {
    const bool high = t->task_flags_.Any(TASK_HIGH_LATENCY) && !high_.empty();
    return WhileAccepting([&] {
      thread_local u32 rotate = 0;
      const std::vector<Worker *> &set = high ? high_ : low_;
      SubmitTo(set[rotate++ % set.size()], t);
      return true;
    });
  }

  /**
   * A worker of its own for a poller whose work cannot wake a futex-parked thread (role
   * kGpuPoller: the GPU worker polls GPU queues; kNetwork: the ZeroMQ server's sockets,
   * slept on through a WorkerParker). The low-latency tasks its poller submits run on it,
   * with no hop to another thread. Nothing is submitted to its lanes: the first
   * kPollerLanes poller workers get one lane for the subtasks their tasks spawn, which the
   * low-latency workers take while the poller is stuck in a long task (later ones keep
   * their subtasks to themselves). Its owner starts it (after ReplacePoller) and stops it,
   * before this orchestrator stops.
   */
  std::unique_ptr<Worker> NewPollerWorker(WorkerRole role) {
    // relaxed: only makes ids and lanes distinct.
    const u32 k = poller_workers_.FetchAdd(1, MemOrder::kRelaxed);
    const u32 id = static_cast<u32>(workers_.size()) + k;
    auto w = std::make_unique<Worker>(id, role, this, pools_, node_, stack_bytes_);
    if (k < poller_lanes_.size()) w->AddPollerLane(poller_lanes_[k].lane, poller_lanes_[k].overflow);
    return w;
  }

  /**
   * After queueing a task behind an awake worker w (which may be stuck in a long task):
   * wakes a peer of w that sleeps without watching the lanes, so it can help (lane_help.h).
   * A poller worker's peers are the low-latency workers (it calls this for its subtasks).
   */
  void WakeDeepPeer(Worker *w) {
    const bool high = w->GetRole() == WorkerRole::kHighLatency;
    // seq_cst: after our publish into the lane, against a parking worker's count then
    // re-check of the lanes (Worker::ParkDeep).
    if (deep_parked_[high ? 1 : 0].Load(MemOrder::kSeqCst) == 0) return;
    WakeFirst(high ? high_ : low_, [w](Worker *p) { return p != w && p->IsDeepParked(); });
  }

  /**
   * The worker a task submitted from the calling thread stays on: the calling worker when
   * it serves the task's latency class (see RunsHere), else nullptr (it goes to a lane).
   */
  Worker *LocalWorkerFor(const Task &t) const {
    Worker *me = tls_current_worker;
    if (me == nullptr) return nullptr;
    return RunsHere(*me, t.task_flags_.Any(TASK_HIGH_LATENCY) && !high_.empty()) ? me : nullptr;
  }

  /** Hands replica `index` of a fan-out to a worker, spreading replicas over workers. */
  void SubmitSpread(Task *t, u32 index) { SubmitTo(low_[index % low_.size()], t); }

  /**
   * Wakes one parked low-latency worker, if any: a transport's poller found requests
   * piling up while the awake workers read them (the woken one joins them). Any thread,
   * also while Stop runs (then it wakes none). False when none was woken.
   */
  bool WakeParkedLowLatency() {
    return WhileAccepting([&] { return WakeFirst(low_, [](Worker *w) { return w->IsParked(); }); });
  }

  /** Wakes every worker (e.g. so periodic tasks of a destroyed pool stop now). */
  void WakeAll() {
    for (auto &w : workers_) w->Wake();
  }

  /** Installs `p` on every low-latency worker that has no external poller yet. */
  void InstallPoller(WorkerPoller *p) {
    for (Worker *w : low_) w->ReplacePoller(nullptr, p);
  }
  /** Removes `p` wherever it is installed; returns once no worker uses it. */
  void RemovePoller(WorkerPoller *p) {
    for (Worker *w : low_) w->ReplacePoller(p, nullptr);
  }

  /** Counters of every worker. */
  std::vector<WorkerStats> Stats() const {
    std::vector<WorkerStats> out;
    for (const auto &w : workers_) out.push_back(w->Stats());
    return out;
  }
  u32 NumWorkers() const { return static_cast<u32>(workers_.size()); }

 private:
  /**
   * Runs f() (which returns bool) while Stop cannot free the workers and lanes, for a
   * thread that is not a worker (transport servers, pollers, applications); false without
   * calling f once Stop began.
   */
  template <typename F>
  bool WhileAccepting(F f) {
    // seq_cst: count, then check accepting_; Stop does the reverse (Dekker).
    submitting_.FetchAdd(1, MemOrder::kSeqCst);
    if (CHI_UNLIKELY(accepting_.Load(MemOrder::kSeqCst) == 0)) {
      submitting_.FetchSub(1, MemOrder::kRelease);
      return false;
    }
    const bool done = f();
    submitting_.FetchSub(1, MemOrder::kRelease);  // release: our uses before Stop's free
    return done;
  }

  /**
   * Whether a task submitted on worker w runs there: a high-latency task on a high-latency
   * worker, a low-latency one on a low-latency or GPU-poller worker.
   */
  static bool RunsHere(const Worker &w, bool high) {
    const WorkerRole r = w.GetRole();
    return high ? r == WorkerRole::kHighLatency
                : r == WorkerRole::kLowLatency || r == WorkerRole::kGpuPoller ||
                      r == WorkerRole::kNetwork;
  }

  /** Lane l (of lanes_per_worker_) of worker w. */
  TaskLane *LaneOf(const Worker *w, u32 l) const {
    return lanes_[w->GetId() * lanes_per_worker_ + l];
  }

  /**
   * Gives each worker of `set` the lanes of the others, and `more` (the poller workers'),
   * so it can help them (lane_help.h).
   */
  void MakePeers(const std::vector<Worker *> &set, Atomic<u32> *deep_parked,
                 const std::vector<PeerLane> &more) {
    for (Worker *w : set) {
      std::vector<PeerLane> peer_lanes;
      for (Worker *p : set) {
        if (p == w) continue;
        for (u32 l = 0; l < lanes_per_worker_; ++l) {
          peer_lanes.push_back(PeerLane{LaneOf(p, l), p->Overflow()});
        }
      }
      const u32 role_lanes = static_cast<u32>(peer_lanes.size());
      peer_lanes.insert(peer_lanes.end(), more.begin(), more.end());
      w->SetPeers(std::move(peer_lanes), role_lanes, deep_parked);
    }
  }

  /** Wakes the first worker of `set` that `pick` chooses; false when it chose none. */
  template <typename Pick>
  static bool WakeFirst(const std::vector<Worker *> &set, Pick pick) {
    for (Worker *p : set) {
      if (pick(p)) {
        p->Wake();
        return true;
      }
    }
    return false;
  }

  /** Queues t in one of w's lanes (rotating) and wakes w, or a peer that can help it. */
  void SubmitTo(Worker *w, Task *t) {
    thread_local u32 lane_rotate = 0;
    TaskLane *lane = LaneOf(w, lane_rotate++ % lanes_per_worker_);
    Worker *me = tls_current_worker;
    if (me != nullptr) {
      // A worker never blocks on a lane: if it is full, the task runs here instead.
      if (!lane->TryPush(reinterpret_cast<u64>(t))) {
        me->PushLocal(t);
        return;
      }
    } else {
      lane->Push(reinterpret_cast<u64>(t));  // back-pressure: a client waits for room
    }
    if (!w->Wake()) WakeDeepPeer(w);
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<Worker *> low_;
  std::vector<Worker *> high_;
  std::vector<TaskLane *> lanes_;
  void *queue_mem_ = nullptr;
  u64 queue_bytes_ = 0;
  u32 lanes_per_worker_ = 1;
  PoolManager *pools_ = nullptr;   ///< for NewPollerWorker
  NodeId node_ = 0;                ///< for NewPollerWorker
  u64 stack_bytes_ = 64 * 1024;    ///< for NewPollerWorker
  Atomic<u32> poller_workers_;     ///< made by NewPollerWorker (ids after the lanes' workers)
  std::vector<PeerLane> poller_lanes_;           ///< lanes of the first poller workers
  TaskOverflow poller_overflow_[kPollerLanes];   ///< their overflow lists (outlive them)
  TaskQueue *queue_ = nullptr;
  Atomic<u32> accepting_;
  alignas(kCacheLine) Atomic<u32> submitting_;  ///< non-worker threads inside Submit
  /// Low- and high-latency workers parked deep (lane_help.h). A line of its own: workers
  /// write it as they park and wake, submitters read accepting_ on every Submit.
  alignas(kCacheLine) Atomic<u32> deep_parked_[2];
};

// ---- Worker functions that need the orchestrator ----

void Worker::WakeHelpers() { orch_->WakeDeepPeer(this); }

// ---- Fan-out (Range / Broadcast), run inside the original task's fiber ----

void Worker::FanOut(RunContext *r) {
  Task *t = r->task_;
  const u32 n = static_cast<u32>(r->targets_.size());
  std::vector<Task *> replicas(n, nullptr);
  for (u32 i = 0; i < n; ++i) {
    Task *rep = t->ops_->clone(*t);
    if (rep == nullptr) {
      t->SetError(ErrorCode::kOutOfMemory, "no memory for a broadcast replica");
      break;
    }
    rep->pool_query_ = PoolQuery::DirectId(r->targets_[i]);
    rep->task_flags_.UnsetBits(TASK_FIRE_AND_FORGET | TASK_PERIODIC);
    rep->task_flags_.SetBits(TASK_REPLICA);
    rep->task_node_ = r->NextChildNode();
    rep->parent_ = t;
    replicas[i] = rep;
    orch_->SubmitSpread(rep, i);
  }
  for (u32 i = 0; i < n && replicas[i] != nullptr; ++i) WaitInFiber(replicas[i], r);
  for (u32 i = 0; i < n && replicas[i] != nullptr; ++i) {
    t->ops_->aggregate(*t, *replicas[i], i);
    DeleteTask(replicas[i]);
  }
}

}  // namespace chi
