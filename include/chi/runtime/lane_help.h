// Lane help: workers of one role take the queued tasks of a peer stuck in a long task.
// Tasks reach a worker's lanes by rotation (WorkOrchestrator::SubmitTo), so a task that
// never yields (one that should have been TASK_HIGH_LATENCY) would hold up every task
// queued behind it while the other workers idle. An idle worker looks at its peers' lanes
// every kLaneHelpLookNs; when a lane's oldest task has waited kLaneStuckNs without the
// lane's head moving, its owner has not come back to its loop in that time, and the idle
// worker pops the lane's tasks (lanes allow several consumers: TaskLane::TryPop) and runs
// them. A parked worker cannot look, so it parks with a timeout while a peer has tasks
// queued, and a submitter that queues behind an awake worker wakes a peer that parked
// without one (the "deep" park; the Dekker pair is PeersQueued against the lane publish).
// Tasks a worker's own tasks spawn go to its own lane with no wake (the worker runs them
// when its task yields), so a deep park ends after kLaneDeepParkNs all the same: a task
// that spins until its subtask is done is helped too, only later. Subtasks a full lane
// cannot take wait in the worker's overflow list (task_overflow.h) and move into the lane
// as it drains: its owner feeds it from its loop, and a helper after each take, so helpers
// reach all of them even while the owner spins for them. Low-latency workers also watch the
// lanes of the poller workers (network, GPU), which hold only those workers' subtasks; a
// poller worker wakes a deep-parked one as it queues them (WakeDeepPeer), so a worker with
// no peers of its own role parks deep with no timeout.
// Invariant: a worker takes only from a lane whose head stood still with tasks queued for
// kLaneStuckNs (its owner popped nothing meanwhile); nothing promises a task a particular
// worker (lanes rotate), so no order or placement is lost.
#pragma once

#include <utility>  // move of the lane list
#include <vector>   // the peers' lanes and the views

#include "chi/core/types.h"             // u32, u64
#include "chi/queue/task_queue.h"       // TaskLane
#include "chi/runtime/task_overflow.h"  // TaskOverflow: the owner's tasks beyond its lane

namespace chi {

/** How long a peer's lane may hold tasks with its head standing still before others help. */
inline constexpr u64 kLaneStuckNs = 100000;
/** How often an idle (spinning) worker looks at its peers' lanes. */
inline constexpr u64 kLaneHelpLookNs = 20000;
/** How long a worker parks at most while a peer has tasks queued (then it looks again). */
inline constexpr u64 kLaneWatchParkNs = kLaneStuckNs / 2;
/**
 * How long a worker parks at most while no peer has tasks queued: the bound on how long a
 * task queued with no wake (a stuck worker's own subtask) waits unseen. An idle worker
 * with peers wakes this often (100 times a second) for a look.
 */
inline constexpr u64 kLaneDeepParkNs = 10000000;

/** A peer's lane and its owner's overflow list, which feeds that lane. */
struct PeerLane {
  TaskLane *lane;
  TaskOverflow *overflow;
};

/** One worker's memory of its peers' lanes between its looks (its own thread only). */
class LaneHelpView {
 public:
  /**
   * The peers' lanes, in the order Stuck and Took name them by index: the first
   * `role_lanes` are those of workers of its own role, the rest the poller workers'.
   */
  explicit LaneHelpView(std::vector<PeerLane> lanes, u32 role_lanes)
      : lanes_(std::move(lanes)), watch_(lanes_.size()), role_lanes_(role_lanes) {}

  /** Number of peer lanes. */
  u32 Size() const { return static_cast<u32>(lanes_.size()); }
  /** Peer lane k. */
  TaskLane *Lane(u32 k) const { return lanes_[k].lane; }
  /** The overflow list of lane k's owner. */
  TaskOverflow *Overflow(u32 k) const { return lanes_[k].overflow; }
  /**
   * True when it watches workers of its own role: their subtasks come with no wake, so a
   * deep park must end after kLaneDeepParkNs (a poller worker wakes it: WakeHelpers).
   */
  bool HasRolePeers() const { return role_lanes_ != 0; }

  /**
   * Whether to take lane k's tasks at `now_ns`, seeing its head at `head` with `queued`
   * tasks behind it: true once the same head has been seen with tasks queued for
   * kLaneStuckNs. An empty lane, or a head that moved, starts the wait again.
   */
  bool Stuck(u32 k, u64 head, bool queued, u64 now_ns) {
    Watch &w = watch_[k];
    if (!queued) {
      w.armed = false;
      return false;
    }
    if (!w.armed || w.head != head) {
      w = Watch{head, now_ns, true};
      return false;
    }
    return now_ns - w.since_ns >= kLaneStuckNs;
  }

  /**
   * When the earliest running wait reaches kLaneStuckNs (~0 when none runs): a watching
   * worker parks until then at most, so it looks right when a lane becomes stuck.
   */
  u64 NextDueNs() const {
    u64 due = ~0ull;
    for (const Watch &w : watch_) {
      if (w.armed && w.since_ns + kLaneStuckNs < due) due = w.since_ns + kLaneStuckNs;
    }
    return due;
  }

  /**
   * This worker took tasks from lane k, leaving its head at `head`: the lane's owner is
   * still stuck (only helpers moved the head since), so the next look may take more at once.
   */
  void Took(u32 k, u64 head) { watch_[k].head = head; }

  /**
   * True when some peer lane has a task ready at its head. seq_cst: the re-check of a
   * worker about to park deep, against a submitter's publish then read of the deep count.
   */
  bool PeersQueued() const {
    for (const PeerLane &l : lanes_) {
      if (l.lane->HasReady()) return true;
    }
    return false;
  }

 private:
  /** What was seen of one lane: its head, since when, and whether a wait is running. */
  struct Watch {
    u64 head = 0;
    u64 since_ns = 0;
    bool armed = false;
  };

  std::vector<PeerLane> lanes_;
  std::vector<Watch> watch_;
  u32 role_lanes_;
};

}  // namespace chi
