// The small types around a Worker that other parts of the runtime name without
// needing the worker itself: its role, its statistics (Monitor), the interface
// of an external poller (transports reading their rings on the worker's thread)
// and the slot that holds one, and the monotonic clock the runtime's timers use.
#pragma once

#include <sched.h>  // sched_yield while a poller swap waits for the loop
#include <time.h>   // clock_gettime

#include "chi/core/atomic.h"  // the slot's pointer, epoch and pin word
#include "chi/core/macros.h"  // kCacheLine
#include "chi/core/types.h"   // u32, u64

namespace chi {

/**
 * What a worker serves (seed 004 roles): lanes of low- or high-latency tasks, or, on a
 * worker of its own (WorkOrchestrator::NewPollerWorker), the GPUs' queues or the network.
 */
enum class WorkerRole : u32 { kLowLatency = 0, kHighLatency = 1, kGpuPoller = 2, kNetwork = 3 };

/** A worker's counters for Monitor. */
struct WorkerStats {
  u32 id_ = 0;
  WorkerRole role_ = WorkerRole::kLowLatency;
  u64 tasks_done_ = 0;    ///< tasks completed on this worker
  u64 queue_depth_ = 0;   ///< tasks waiting in its lanes right now
  u64 blocked_ = 0;       ///< fibers suspended on an event
  u64 parks_ = 0;         ///< times it went to sleep
  u64 stacks_ = 0;        ///< fiber stacks mapped
  u64 fibers_ = 0;        ///< fiber shells created (each runs task after task)
  u64 helped_ = 0;        ///< tasks it took from a stuck peer's lanes (lane_help.h)

  template <typename Ar>
  void serialize(Ar &ar) {
    ar(id_, role_, tasks_done_, queue_depth_, blocked_, parks_, stacks_, fibers_, helped_);
  }
};

/**
 * Work a worker polls besides its lanes: a transport's request rings read in place, so a
 * request reaches a worker without a thread hop. Called on the worker's thread only.
 */
class WorkerPoller {
 public:
  /** Worker `worker_id` starts polling (after it started, woke up, or got this poller). */
  virtual void BeginPolling(u32 worker_id) = 0;
  /** One loop pass: takes in whatever waits; true when it did work. */
  virtual bool Poll() = 0;
  /** The worker will park or exit: stop counting on it; true when work waits after all. */
  virtual bool EndPolling(u32 worker_id) = 0;

 protected:
  ~WorkerPoller() = default;
};

/**
 * How a worker whose work arrives on file descriptors sleeps (the network worker waits in
 * poll() on its sockets, not on a futex no socket can wake). Sleep blocks until its fds
 * have input, Interrupt is called, or the timeout passes (0: none); Interrupt may come
 * from any thread, before or during Sleep, and must end the next or current Sleep.
 */
class WorkerParker {
 public:
  /** The worker's thread: sleeps (see the class comment). */
  virtual void Sleep(u64 timeout_ns) = 0;
  /** Any thread: ends the worker's current or next Sleep. */
  virtual void Interrupt() = 0;

 protected:
  ~WorkerParker() = default;
};

/**
 * The external poller a worker's loop calls every pass, and how another thread swaps it
 * and may then free the old one. The loop pins the poller it read (pin word odd) before
 * it polls, and keeps the pin over idle passes, so such a pass costs two plain loads and
 * no fence; it unpins before anything that may take long (a task fiber), before it
 * parks or exits, and when it sees a new epoch (a swap). Replace returns once the loop is
 * no longer pinned on the old poller. Replace: any thread; the rest: the loop only.
 */
class PollerSlot {
 public:
  /** Swaps `from` for `to` (either may be nullptr); false when `from` is not installed. */
  bool Replace(WorkerPoller *from, WorkerPoller *to) {
    WorkerPoller *expected = from;
    // seq_cst: swap, then read the pin word; Pin stores it, fences, then reads poller_
    // (Dekker): either we see the loop pinned, or it sees the new poller.
    if (!poller_.CompareExchange(expected, to, MemOrder::kSeqCst)) return false;
    // seq_cst: after the swap; a loop pinned on `from` and idle sees it and unpins.
    epoch_.FetchAdd(1, MemOrder::kSeqCst);
    const u64 seq = pin_.Load(MemOrder::kSeqCst);
    if ((seq & 1) == 0) return true;
    // acquire: the loop's last use of `from` precedes its unpin.
    while (pin_.Load(MemOrder::kAcquire) == seq) sched_yield();
    return true;
  }

  /** One pass of the poller, if any (a new one is told BeginPolling first). */
  bool Poll(u32 worker_id) {
    // relaxed: our own word, and a hint; Pin's load after its fence decides.
    if (begun_ == nullptr && (pin_.Load(MemOrder::kRelaxed) & 1) == 0 &&
        poller_.Load(MemOrder::kRelaxed) == nullptr) {
      return false;
    }
    Pin();
    if (pinned_ == nullptr) {
      begun_ = nullptr;  // removed: its owner no longer counts on us
      return false;
    }
    if (begun_ != pinned_) pinned_->BeginPolling(worker_id);
    begun_ = pinned_;
    return pinned_->Poll();
  }

  /** The loop parks or exits: the poller stops counting on it (EndPolling), unpinned. */
  bool End(u32 worker_id) {
    bool work = false;
    if (begun_ != nullptr) {
      Pin();
      // A poller swapped out meanwhile: its owner no longer counts on us.
      work = pinned_ == begun_ && begun_->EndPolling(worker_id);
      begun_ = nullptr;
    }
    Unpin();
    return work;
  }

  /** Drops the pin: a Replace waiting for the loop may return. */
  void Unpin() {
    const u64 seq = pin_.Load(MemOrder::kRelaxed);  // relaxed: only the loop writes it
    // release: our uses of the pinned poller precede it.
    if ((seq & 1) != 0) pin_.Store(seq + 1, MemOrder::kRelease);
  }

 private:
  /** Pins the loop on poller_ unless it is pinned already in the current epoch. */
  void Pin() {
    u64 seq = pin_.Load(MemOrder::kRelaxed);  // relaxed: only the loop writes it
    if ((seq & 1) != 0) {
      // relaxed: a line written only by Replace; a new epoch makes us read poller_ again.
      if (epoch_.Load(MemOrder::kRelaxed) == pinned_epoch_) return;
      pin_.Store(++seq, MemOrder::kRelease);  // release: unpinned, as in Unpin
    }
    // release: a Replace that reads this value (not the unpin before it: C++20's release
    // sequences hold no plain stores) must see our uses of the old poller as done.
    pin_.Store(seq + 1, MemOrder::kRelease);
    // seq_cst fence: the pin before the reads below (Dekker with Replace's swap).
    FenceSeqCst();
    pinned_epoch_ = epoch_.Load(MemOrder::kSeqCst);
    pinned_ = poller_.Load(MemOrder::kSeqCst);
  }

  // Written by Replace only.
  alignas(kCacheLine) Atomic<WorkerPoller *> poller_{nullptr};
  Atomic<u64> epoch_;  ///< bumped by every Replace
  // The loop's (the pin word is read by Replace).
  alignas(kCacheLine) Atomic<u64> pin_;  ///< odd while the loop may use pinned_
  WorkerPoller *pinned_ = nullptr;       ///< poller_ as read when the loop pinned
  u64 pinned_epoch_ = 0;                 ///< epoch_ as read then
  WorkerPoller *begun_ = nullptr;        ///< the poller told BeginPolling
};

/** Monotonic nanoseconds. */
inline u64 NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<u64>(ts.tv_sec) * 1000000000ull + static_cast<u64>(ts.tv_nsec);
}

}  // namespace chi
