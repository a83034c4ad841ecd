// Task flags (seed 004) and the per-task completion word shared by submitter,
// worker and waiters. Flag values travel with tasks: keep them stable.
#pragma once

#include "chi/core/types.h"  // u32

namespace chi {

/** Runs again every period_ns_ until cancelled or its pool is destroyed. */
inline constexpr u32 TASK_PERIODIC = 1u << 0;
/** Nobody waits: the runtime frees the task when it completes. */
inline constexpr u32 TASK_FIRE_AND_FORGET = 1u << 1;
/** Prefer a high-latency worker (long or blocking work). */
inline constexpr u32 TASK_HIGH_LATENCY = 1u << 2;
/** The task has been routed to a container (set by the runtime). */
inline constexpr u32 TASK_ROUTED = 1u << 3;
/** A replica made by the runtime for Range/Broadcast fan-out. */
inline constexpr u32 TASK_REPLICA = 1u << 4;
/** A periodic task asked to stop (set by Cancel or pool destruction). */
inline constexpr u32 TASK_CANCELLED = 1u << 5;

/** Bits of Task::state_, the word every waiter watches. */
namespace task_state {
inline constexpr u32 kComplete = 1u << 0;   ///< outputs are final
inline constexpr u32 kParked = 1u << 1;     ///< a thread sleeps on the futex
inline constexpr u32 kHasWaiter = 1u << 2;  ///< a fiber registered itself in waiter_
inline constexpr u32 kOrphaned = 1u << 3;   ///< the Future was dropped: completer frees
inline constexpr u32 kCancelRequested = 1u << 4;  ///< stop a periodic task after its current run
}  // namespace task_state

}  // namespace chi
