// ShmSlotAffinity: which runtime worker reads which shm client slot. Each slot has a
// home worker, the last one that took its requests in; the others leave it alone while
// the home keeps up. So a client's stream, its answers and its tasks stay in one worker's
// cache, and workers do not race each other for the slot's flags: one client with many
// requests in flight is served by one worker, not torn between several (their answers
// would fight over the stream). A worker takes a slot over (becoming its home) when
//  - its home has stopped polling (parked: its clients were quiet), or
//  - its request waited through two looks of this worker while the home has at least two
//    more slots with requests waiting than this worker (spreading busy clients), or
//  - its request waited through kLongWaitLooks looks (the home runs a long task).
// Only a hint: the slot's reader flag decides who reads.
#pragma once

#include <cstring>  // memset of a survey
#include <memory>   // the per-worker views and the homes

#include "chi/core/atomic.h"  // Atomic, MemOrder
#include "chi/core/macros.h"  // kCacheLine
#include "chi/core/types.h"   // u32, u64

namespace chi {

/** Slot homes and each polling worker's view of the slots it does not own. */
class ShmSlotAffinity {
 public:
  /** A worker looks at slots homed elsewhere once every this many of its passes. */
  static constexpr u64 kForeignLookEvery = 8;
  /** Looks a request may wait before any worker takes it from a busy home. */
  static constexpr u32 kLongWaitLooks = 64;
  /** Homes counted apart in a survey (the readers mask's width; more share counts). */
  static constexpr u32 kMaxViews = 64;

  /** What a worker remembers of a foreign slot between its looks. */
  struct Watch {
    u64 position = 0;  ///< 1 + the read position of the request found waiting, or 0
    u32 looks = 0;     ///< consecutive looks that found that same request waiting
  };

  /** One worker's state across its passes (only that worker touches it). */
  struct alignas(kCacheLine) View {
    u32 next_slot = 0;  ///< where its next pass starts (round robin)
    u64 busy = 0;       ///< slots (mod 64) read in a batch at its next look
    u64 passes = 0;
    u32 load[kMaxViews] = {};  ///< at a look: slots with requests waiting, by home
    std::unique_ptr<Watch[]> watch;  ///< per slot
  };

  /** For num_slots slots, none homed yet, read by workers whose ids are below num_workers. */
  ShmSlotAffinity(u32 num_slots, u32 num_workers)
      : num_slots_(num_slots),
        num_views_(num_workers != 0 ? num_workers : 1),
        homes_(std::make_unique<Atomic<u32>[]>(num_slots)),
        views_(std::make_unique<View[]>(num_views_)) {}

  /** The calling worker's view (its own thread only); made on first use. */
  View &ViewOf(u32 worker_id) {
    View &v = views_[worker_id % num_views_];
    if (v.watch == nullptr) v.watch = std::make_unique<Watch[]>(num_slots_);
    return v;
  }

  /** A worker starts a pass: true when it looks at slots homed elsewhere in it. */
  static bool BeginPass(View &v) { return ++v.passes % kForeignLookEvery == 0; }

  /**
   * At a look: counts, by home, the slots among `slots` (a callable visiting each served
   * slot index) whose requests wait (`waiting(i)`).
   */
  template <typename ForEachSlot, typename Waiting>
  void Survey(View &v, ForEachSlot slots, Waiting waiting) {
    std::memset(v.load, 0, sizeof(v.load));
    slots([&](u32 i) {
      const u32 home = HomeOf(i);
      if (home != 0 && waiting(i)) ++v.load[(home - 1) % kMaxViews];
    });
  }

  /**
   * Whether worker `me` (id + 1) reads slot i now: its own and unhomed slots always,
   * others only at a look (`abroad`, after Survey) and by the rules at the top. `readers`:
   * the polling workers' mask; `position()`: 1 + the slot's read position when a request
   * waits there, else 0 (asked only when a foreign slot's wait decides).
   */
  template <typename Position>
  bool ShouldRead(View &v, u32 me, u32 i, bool abroad, u64 readers, Position position_of) {
    const u32 home = HomeOf(i);
    if (home == 0 || home == me) return true;
    if (!abroad) return false;
    if (((readers >> ((home - 1) % 64)) & 1) == 0) return true;
    const u64 position = position_of();
    Watch &w = v.watch[i];
    if (position == 0 || position != w.position) {
      w.position = position;
      w.looks = position == 0 ? 0 : 1;
      return false;
    }
    ++w.looks;
    const u32 theirs = v.load[(home - 1) % kMaxViews];
    const u32 mine = v.load[(me - 1) % kMaxViews];
    return theirs >= mine + 2 || w.looks >= kLongWaitLooks;
  }

  /** Worker `me` took slot i's requests in: it is the slot's home from now on. */
  void NoteTaken(u32 i, u32 me) {
    // relaxed: a hint; written only when the home changes, so the line stays shared.
    if (homes_[i].Load(MemOrder::kRelaxed) != me) homes_[i].Store(me, MemOrder::kRelaxed);
  }

  /** Slot i's current home (worker id + 1, 0 for none). */
  u32 HomeOf(u32 i) const { return homes_[i].Load(MemOrder::kRelaxed); }  // relaxed: a hint

 private:
  u32 num_slots_;
  u32 num_views_;
  std::unique_ptr<Atomic<u32>[]> homes_;
  std::unique_ptr<View[]> views_;
};

}  // namespace chi
