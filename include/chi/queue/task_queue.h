// TaskQueue: the runtime's submission queue, num_lanes x kNumPriorities lanes of u64
// entries (a task pointer in-process, a packed shm offset across processes), all in one
// caller-provided region. Clients push into a lane; the worker named by the lane's tag
// pops, and so may a worker helping it (lane_help.h). Invariant: lanes are independent
// rings at fixed offsets from the queue header, so the region may be mapped at different
// addresses.
#pragma once

#include <new>  // placement new into the caller's region

#include "chi/core/atomic.h"        // chi::Atomic for the lane tag
#include "chi/core/macros.h"        // CHI_CROSS_FUN, kCacheLine
#include "chi/core/types.h"         // u32, u64
#include "chi/queue/mpsc_ring.h"    // MpscRing<u64>: the lane's storage
#include "chi/queue/ring_layout.h"  // RoundUpPow2, RoundUpTo, IsRingAligned

namespace chi {

/** How urgent the tasks of a lane are; each lane exists once per priority. */
enum class QueuePriority : u32 { kLowLatency = 0, kHighLatency = 1 };

/** Number of QueuePriority values. */
inline constexpr u32 kNumPriorities = 2;

/** One lane of u64 task entries (many producers, shared pops) plus its owner's metadata. */
class TaskLane {
 public:
  /**
   * Constructs the lane in place; `this` must start LaneBytes(depth) bytes of region.
   * TaskQueue::Create does this for every lane.
   */
  CHI_CROSS_FUN TaskLane(u32 lane_id, QueuePriority prio, u32 depth)
      : lane_id_(lane_id), prio_(prio), ring_(depth) {}

  /** Region bytes one lane of `depth` entries occupies (a multiple of the cache line). */
  CHI_CROSS_FUN static size_t LaneBytes(u32 depth) {
    return RoundUpTo(sizeof(TaskLane) - sizeof(MpscRing<u64>) + MpscRing<u64>::BytesFor(depth),
                     kCacheLine);
  }

  /** Appends an entry; false when the lane is full. Any number of producers. */
  CHI_CROSS_FUN bool TryPush(u64 entry) { return ring_.TryPush(entry); }
  /** Appends an entry, blocking while the lane is full (host only). */
  void Push(u64 entry) { ring_.Push(entry); }
  /** Appends an entry, blocking while full up to timeout_ns (0 = forever); false on timeout. */
  bool Push(u64 entry, u64 timeout_ns) { return ring_.Push(entry, timeout_ns); }
  /**
   * Removes the oldest entry; false when empty. Any number of consumers: the worker the
   * lane belongs to, and workers helping it while it is stuck in a long task (lane_help.h).
   */
  CHI_CROSS_FUN bool TryPop(u64 &entry) { return ring_.TryPopShared(entry); }

  /** Entries waiting (in-flight pushes count); exact when quiet. */
  CHI_CROSS_FUN u32 Size() const { return ring_.Size(); }
  /** Entries popped so far: stands still while nobody pops (see lane_help.h). */
  CHI_CROSS_FUN u64 Head() const { return ring_.Consumed(); }
  /** True when the oldest entry is published (seq_cst: for a parking worker's re-check). */
  CHI_CROSS_FUN bool HasReady() const { return ring_.HasReady(); }
  /** True when no entry is waiting. */
  CHI_CROSS_FUN bool Empty() const { return ring_.Empty(); }
  /** Entries the lane holds at most. */
  CHI_CROSS_FUN u32 Capacity() const { return ring_.Capacity(); }

  /** Owner-defined tag (the runtime stores the serving worker's id); 0 until set. */
  CHI_CROSS_FUN u32 GetTag() const {
    // acquire: pairs with SetTag, so what the owner prepared before tagging is visible.
    return tag_.Load(MemOrder::kAcquire);
  }
  /** Sets the owner-defined tag. */
  CHI_CROSS_FUN void SetTag(u32 tag) {
    // release: publishes the owner's setup (e.g. the worker's state) with the tag.
    tag_.Store(tag, MemOrder::kRelease);
  }

  /** This lane's index within its queue. */
  CHI_CROSS_FUN u32 LaneId() const { return lane_id_; }
  /** This lane's priority. */
  CHI_CROSS_FUN QueuePriority Priority() const { return prio_; }

  /** The underlying ring (statistics, blocking options). */
  CHI_CROSS_FUN MpscRing<u64> &Ring() { return ring_; }

 private:
  // Line 0: identity and tag.
  alignas(kCacheLine) u32 lane_id_;
  QueuePriority prio_;
  Atomic<u32> tag_;
  // From line 1: the ring. Must stay last: its slots trail the lane in the region.
  MpscRing<u64> ring_;
};

static_assert(sizeof(TaskLane) == kCacheLine + sizeof(MpscRing<u64>),
              "the lane's ring must be its last member so its slots trail the lane");

/** num_lanes x kNumPriorities TaskLanes in one region, addressed by (lane, priority). */
class TaskQueue {
 public:
  /** Region bytes for all lanes x kNumPriorities of `depth` (rounded to 2^k) entries. */
  CHI_CROSS_FUN static size_t BytesFor(u32 num_lanes, u32 depth) {
    return sizeof(TaskQueue) +
           static_cast<size_t>(num_lanes) * kNumPriorities * TaskLane::LaneBytes(depth);
  }

  /**
   * Constructs the queue and all its lanes at `mem` (BytesFor bytes, 64-byte aligned).
   * Returns nullptr when `mem` is null or misaligned.
   */
  CHI_CROSS_FUN static TaskQueue *Create(void *mem, u32 num_lanes, u32 depth) {
    if (!IsRingAligned(mem)) return nullptr;
    auto *queue = new (mem) TaskQueue(num_lanes, RoundUpPow2(depth));
    for (u32 lane = 0; lane < num_lanes; ++lane) {
      for (u32 p = 0; p < kNumPriorities; ++p) {
        new (queue->LaneAt(lane * kNumPriorities + p))
            TaskLane(lane, static_cast<QueuePriority>(p), queue->depth_);
      }
    }
    return queue;
  }

  /** Views a queue that another process (or an earlier Create) built at `mem`. */
  CHI_CROSS_FUN static TaskQueue *Attach(void *mem) { return static_cast<TaskQueue *>(mem); }

  /** The lane `lane` (< NumLanes()) of priority `prio`. */
  CHI_CROSS_FUN TaskLane &GetLane(u32 lane, QueuePriority prio) {
    return *static_cast<TaskLane *>(LaneAt(lane * kNumPriorities + static_cast<u32>(prio)));
  }

  /** Lanes per priority. */
  CHI_CROSS_FUN u32 NumLanes() const { return num_lanes_; }
  /** Entries each lane holds (the requested depth rounded up to a power of two). */
  CHI_CROSS_FUN u32 Depth() const { return depth_; }

 private:
  /** Records the geometry; Create builds the lanes. */
  CHI_CROSS_FUN TaskQueue(u32 num_lanes, u32 depth)
      : num_lanes_(num_lanes), depth_(depth), lane_bytes_(TaskLane::LaneBytes(depth)) {}

  /** Start of lane number `index` (lane-major, priority-minor). */
  CHI_CROSS_FUN void *LaneAt(u32 index) {
    return reinterpret_cast<char *>(this) + sizeof(TaskQueue) + index * lane_bytes_;
  }

  alignas(kCacheLine) u32 num_lanes_;
  u32 depth_;
  u64 lane_bytes_;  ///< stride between lanes
};

}  // namespace chi
