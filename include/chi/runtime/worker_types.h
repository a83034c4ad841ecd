// The small types around a Worker that other parts of the runtime name without
// needing the worker itself: its role, its statistics (Monitor), the interface
// of an external poller (transports reading their rings on the worker's thread),
// and the monotonic clock the runtime's timers use.
#pragma once

#include <time.h>  // clock_gettime

#include "chi/core/types.h"  // u32, u64

namespace chi {

/** What a worker serves (seed 004 roles; GPU-poller and network come later). */
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

  template <typename Ar>
  void serialize(Ar &ar) {
    ar(id_, role_, tasks_done_, queue_depth_, blocked_, parks_, stacks_, fibers_);
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

/** Monotonic nanoseconds. */
inline u64 NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<u64>(ts.tv_sec) * 1000000000ull + static_cast<u64>(ts.tv_nsec);
}

}  // namespace chi
