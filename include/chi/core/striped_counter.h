// StripedCounter: a count that many threads change at once without sharing a cache line.
// Each thread adds to its own stripe (one of kStripes, each on its own line) and readers
// sum the stripes. For the per-task counts on the hot path (a pool's tasks in flight, a
// container's tasks done): as single atomics every worker's add moved the line from the
// worker before it (perf on a 16-core host, 4 workers: those locked adds were most of
// Worker::OnFiberDone's samples).
// A thread may subtract what another added, so one stripe alone can wrap below zero; the
// sum of all of them is still exact (u64 arithmetic wraps back).
#pragma once

#include "chi/core/atomic.h"  // Atomic, MemOrder
#include "chi/core/macros.h"  // kCacheLine
#include "chi/core/types.h"   // u32, u64

namespace chi {

/** A counter striped over cache lines; exact Sum, contention-free Add/Sub. */
class StripedCounter {
 public:
  static constexpr u32 kStripes = 16;

  /** Adds d on the calling thread's stripe. */
  void Add(u64 d, MemOrder o = MemOrder::kRelaxed) { stripes_[ThisStripe()].value.FetchAdd(d, o); }
  /** Subtracts d on the calling thread's stripe (it may have been added on another). */
  void Sub(u64 d, MemOrder o = MemOrder::kRelaxed) { stripes_[ThisStripe()].value.FetchSub(d, o); }

  /**
   * The total. Exact once the changes it should see are ordered before this call (`o` is
   * applied to every stripe's load); while they race with it, read as statistics only.
   */
  u64 Sum(MemOrder o = MemOrder::kRelaxed) const {
    u64 sum = 0;
    for (const Stripe &s : stripes_) sum += s.value.Load(o);
    return sum;
  }

 private:
  struct alignas(kCacheLine) Stripe {
    Atomic<u64> value;
  };

  /** The calling thread's stripe: threads take stripes in turn on first use. */
  static u32 ThisStripe() {
    thread_local u32 stripe = kStripes;  // kStripes: not chosen yet
    if (CHI_UNLIKELY(stripe == kStripes)) {
      static Atomic<u32> next;
      stripe = next.FetchAdd(1, MemOrder::kRelaxed) % kStripes;  // relaxed: only spreads threads
    }
    return stripe;
  }

  Stripe stripes_[kStripes];
};

}  // namespace chi
