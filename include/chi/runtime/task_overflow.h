// TaskOverflow: the subtasks a worker's own tasks spawned beyond what its lane holds
// (Worker::PushLocal). They wait here in spawn order and move into the worker's lane as it
// drains. The owner feeds the lane from its loop; a peer helping the owner while it is
// stuck in a long task (lane_help.h) feeds it too after taking from the lane, so a parent
// that spins for its subtasks, never returning to its loop, still has all of them run.
// Invariant: after every Push or FeedInto, the list is non-empty only if the lane was full;
// tasks leave in the order they came (one lock orders pushes and feeds).
#pragma once

#include <deque>  // the waiting tasks
#include <mutex>  // lock_guard

#include "chi/core/atomic.h"        // the size hint
#include "chi/core/types.h"         // u64
#include "chi/queue/task_queue.h"   // TaskLane
#include "chi/runtime/spin_lock.h"  // SpinLock: short sections, rare (overload only)

namespace chi {

struct Task;

/** A worker's overflow list, shared with the peers that help it (locked; rare). */
class TaskOverflow {
 public:
  /**
   * True when nothing waits. A hint for the owner, the only thread that pushes: it sees its
   * own pushes, and a zero it reads was stored by a feed that emptied the list.
   */
  bool Empty() const { return size_.Load(MemOrder::kRelaxed) == 0; }  // relaxed: see above

  /** Appends `t` behind earlier overflow, then moves what `lane` has room for into it. */
  void Push(Task *t, TaskLane *lane) {
    std::lock_guard<SpinLock> hold(lock_);
    list_.push_back(t);
    FeedLocked(lane);
  }

  /** Moves waiting tasks into `lane` while it has room (any thread); true when any moved. */
  bool FeedInto(TaskLane *lane) {
    std::lock_guard<SpinLock> hold(lock_);
    return FeedLocked(lane);
  }

  /** Takes the oldest waiting task, or nullptr (for a worker with no lane to feed). */
  Task *Pop() {
    std::lock_guard<SpinLock> hold(lock_);
    if (list_.empty()) return nullptr;
    Task *t = list_.front();
    list_.pop_front();
    size_.Store(list_.size(), MemOrder::kRelaxed);
    return t;
  }

 private:
  /** FeedInto under the lock; a null lane takes nothing. */
  bool FeedLocked(TaskLane *lane) {
    bool moved = false;
    while (lane != nullptr && !list_.empty() &&
           lane->TryPush(reinterpret_cast<u64>(list_.front()))) {
      list_.pop_front();
      moved = true;
    }
    size_.Store(list_.size(), MemOrder::kRelaxed);  // relaxed: published by the lock
    return moved;
  }

  SpinLock lock_;
  std::deque<Task *> list_;
  Atomic<u64> size_;
};

}  // namespace chi
