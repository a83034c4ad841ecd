// MpscRing<T>: a bounded many-producer single-consumer ring placed in a caller's region.
// Producers may be threads, processes or GPU threads; the runtime's task lanes use it.
// Invariant: one consumer (TryPop, Pop), or several that all use TryPopShared; a producer
// owns a slot from its claim of `tail_` until it publishes the slot's sequence number, and
// no pointers live in the region.
//
// Protocol (Vyukov's bounded queue, one consumer). Slot i starts with seq = i. A producer
// reads tail_ = p; when slot p % C has seq == p the slot is free for lap p / C, and a CAS
// of tail_ from p to p + 1 claims it; the producer writes the value and publishes
// seq = p + 1. The consumer at head h reads when seq == h + 1, advances head_, then frees
// the slot for the next lap with seq = h + C. Producers thus learn "full" from the slot
// they want, never from the consumer's line. Sequence numbers only grow: no ABA. Several
// consumers (TryPopShared) claim head h with a CAS of head_ from h to h + 1 before reading
// the slot; a consumer that finds seq > h + 1 lost h to another and reads head_ again.
// A producer that dies between claim and publish stalls the consumer at that slot.
// Blocking ends (host only) park on a WaitEvent (see wait_event.h); GPU code uses
// TryPush/TryPop, and a host end fed from a GPU polls instead of parking.
#pragma once

#include <new>          // placement new into the caller's region
#include <type_traits>  // is_trivially_copyable: values are copied as bytes across processes

#include "chi/core/atomic.h"        // chi::Atomic, MemOrder
#include "chi/core/macros.h"        // CHI_CROSS_FUN, kCacheLine
#include "chi/core/types.h"         // u32, u64, i64
#include "chi/queue/ring_layout.h"  // RoundUpPow2, IsRingAligned
#include "chi/queue/wait_event.h"   // WaitEvent, WaitStats, AwaitOp, kPublishOrder

namespace chi {

/** Bounded MPSC ring of trivially-copyable T; lives in (and trails into) a caller region. */
template <typename T>
class MpscRing {
  static_assert(std::is_trivially_copyable_v<T>, "ring values are copied as raw bytes");
  static_assert(alignof(T) <= kCacheLine, "over-aligned values are not supported");

 public:
  /** Bytes of region needed for `capacity` (rounded up to a power of two) slots. */
  CHI_CROSS_FUN static size_t BytesFor(u32 capacity) {
    return sizeof(MpscRing) + static_cast<size_t>(RoundUpPow2(capacity)) * sizeof(Slot);
  }

  /**
   * Constructs an empty ring at `mem` (BytesFor(capacity) bytes, 64-byte aligned).
   * Returns nullptr when `mem` is null or misaligned.
   */
  CHI_CROSS_FUN static MpscRing *Create(void *mem, u32 capacity) {
    if (!IsRingAligned(mem)) return nullptr;
    return new (mem) MpscRing(capacity);
  }

  /** Views a ring that another process (or an earlier Create) built at `mem`. */
  CHI_CROSS_FUN static MpscRing *Attach(void *mem) { return static_cast<MpscRing *>(mem); }

  /**
   * Constructs in place for embedding as the LAST member of a larger header (TaskLane):
   * `this` must start BytesFor(capacity) bytes of region. Prefer Create elsewhere.
   */
  CHI_CROSS_FUN explicit MpscRing(u32 capacity)
      : capacity_(RoundUpPow2(capacity)), mask_(RoundUpPow2(capacity) - 1) {
    Slot *slots = Slots();
    for (u32 i = 0; i < capacity_; ++i) new (&slots[i].seq_) Atomic<u64>(i);
  }

  /** Appends v; false when the ring is full. Any number of producers. */
  CHI_CROSS_FUN bool TryPush(const T &v) {
    // relaxed: the CAS below decides; this is only a starting guess.
    u64 pos = tail_.Load(MemOrder::kRelaxed);
    Slot *slot;
    for (;;) {
      slot = &Slots()[pos & mask_];
      // acquire: pairs with the consumer's free, so its read of the old value is done.
      u64 seq = slot->seq_.Load(MemOrder::kAcquire);
      i64 lag = static_cast<i64>(seq - pos);
      if (lag == 0) {
        // relaxed: the claim only has to be atomic; the slot's seq carries the data.
        if (tail_.CompareExchange(pos, pos + 1, MemOrder::kRelaxed)) break;
      } else if (lag < 0) {
        return false;  // the slot still holds last lap's value: full
      } else {
        // relaxed: another producer took pos; retry from the newest tail.
        pos = tail_.Load(MemOrder::kRelaxed);
      }
    }
    slot->value_ = v;
    // kPublishOrder: release hands the value over; seq_cst pairs with a parked consumer.
    slot->seq_.Store(pos + 1, kPublishOrder);
    not_empty_.Notify();
    return true;
  }

  /**
   * Removes the oldest value into `out`; false when the ring is empty or the oldest
   * claimed slot is not published yet. Consumer only.
   */
  CHI_CROSS_FUN bool TryPop(T &out) {
    // relaxed: only this consumer writes head_.
    u64 head = head_.Load(MemOrder::kRelaxed);
    Slot &slot = Slots()[head & mask_];
    // acquire: pairs with the producer's publish, so value_ is complete.
    if (slot.seq_.Load(MemOrder::kAcquire) != head + 1) return false;
    out = slot.value_;
    // kPublishOrder: seq_cst pairs with parked producers (they wait on head_). It comes
    // before the slot's free so this fence does not wait for the slot line's ownership.
    head_.Store(head + 1, kPublishOrder);
    // release: our read of value_ happens before a producer's next write to the slot.
    slot.seq_.Store(head + capacity_, MemOrder::kRelease);
    not_full_.Notify();
    return true;
  }

  /**
   * TryPop for a ring with several consumers (a task lane's owner and the workers that
   * help it, see lane_help.h): the oldest value is claimed with a CAS of head_. Every
   * consumer of such a ring must pop with this; it costs what TryPop's seq_cst store does.
   */
  CHI_CROSS_FUN bool TryPopShared(T &out) {
    // relaxed: the CAS below decides; this is only a starting guess.
    u64 head = head_.Load(MemOrder::kRelaxed);
    for (;;) {
      Slot &slot = Slots()[head & mask_];
      // acquire: pairs with the producer's publish, so value_ is complete.
      const u64 seq = slot.seq_.Load(MemOrder::kAcquire);
      const i64 lag = static_cast<i64>(seq - (head + 1));
      if (lag < 0) return false;  // empty, or the oldest claimed slot is not published yet
      if (lag > 0) {              // another consumer took head: retry from the newest
        head = head_.Load(MemOrder::kRelaxed);
        continue;
      }
      // kPublishOrder (seq_cst) as TryPop's store: parked producers wait on head_. The
      // slot is ours once the CAS succeeds: producers need seq == head + capacity_.
      if (head_.CompareExchange(head, head + 1, kPublishOrder)) {
        out = slot.value_;
        // release: our read of value_ happens before a producer's next write to the slot.
        slot.seq_.Store(head + capacity_, MemOrder::kRelease);
        not_full_.Notify();
        return true;
      }
    }
  }

  /** Appends v, blocking while full (spin, then futex park). Host only. */
  void Push(const T &v) { AwaitPush(v, kNoDeadline); }

  /** Appends v, blocking while full up to timeout_ns (0 = forever); false on timeout. */
  bool Push(const T &v, u64 timeout_ns) { return AwaitPush(v, DeadlineAfter(timeout_ns)); }

  /** Removes the oldest value, blocking while empty up to timeout_ns (0 = forever). */
  bool Pop(T &out, u64 timeout_ns) {
    return AwaitOp(
        not_empty_, consumer_stats_, [&] { return TryPop(out); }, [&] { return HasReady(); },
        DeadlineAfter(timeout_ns));
  }

  /** Values claimed and not yet popped (in-flight pushes count); exact when quiet. */
  CHI_CROSS_FUN u32 Size() const {
    // acquire: a best-effort snapshot; clamped because the two loads are not atomic together.
    u64 head = head_.Load(MemOrder::kAcquire);
    u64 tail = tail_.Load(MemOrder::kAcquire);
    if (tail <= head) return 0;
    return tail - head > capacity_ ? capacity_ : static_cast<u32>(tail - head);
  }
  /** Values popped so far (the head's position): it stands still while nobody pops. */
  CHI_CROSS_FUN u64 Consumed() const { return head_.Load(MemOrder::kAcquire); }  // a snapshot

  /**
   * True when the value at the head is published (a pop would succeed now, barring a
   * racing consumer). seq_cst: a parking consumer's re-check against a producer's publish.
   */
  CHI_CROSS_FUN bool HasReady() const {
    const u64 head = head_.Load(MemOrder::kSeqCst);
    return Slots()[head & mask_].seq_.Load(MemOrder::kSeqCst) == head + 1;
  }

  /** Slots in the ring (the requested capacity rounded up to a power of two). */
  CHI_CROSS_FUN u32 Capacity() const { return capacity_; }
  /** True when Size() is 0. */
  CHI_CROSS_FUN bool Empty() const { return Size() == 0; }

  /** Push calls that found the ring full (statistic). */
  CHI_CROSS_FUN u64 ProducerStalls() const { return producer_stats_.Stalls(); }
  /** Times a producer slept on the futex (statistic). */
  CHI_CROSS_FUN u64 ProducerParks() const { return producer_stats_.Parks(); }
  /** Pop calls that found the ring empty (statistic). */
  CHI_CROSS_FUN u64 ConsumerStalls() const { return consumer_stats_.Stalls(); }
  /** Times the consumer slept on the futex (statistic). */
  CHI_CROSS_FUN u64 ConsumerParks() const { return consumer_stats_.Parks(); }

 private:
  /** One value and the sequence number that says whose turn the slot is. */
  struct Slot {
    Atomic<u64> seq_;  ///< p: free for position p; p + 1: holds position p
    T value_;
  };

  /** The slot array trailing the header in the same region. */
  CHI_CROSS_FUN Slot *Slots() {
    return reinterpret_cast<Slot *>(reinterpret_cast<char *>(this) + sizeof(MpscRing));
  }
  CHI_CROSS_FUN const Slot *Slots() const {
    return reinterpret_cast<const Slot *>(reinterpret_cast<const char *>(this) + sizeof(MpscRing));
  }

  /** Push with an absolute deadline. */
  bool AwaitPush(const T &v, u64 deadline_ns) {
    return AwaitOp(
        not_full_, producer_stats_, [&] { return TryPush(v); },
        [&] {
          // seq_cst: the waiter's Dekker re-check against the consumer's head_ store.
          // head_ first: tail_ read later is then never below it. The slot may still be
          // a moment from freed, or another producer may take it; AwaitOp then retries.
          u64 head = head_.Load(MemOrder::kSeqCst);
          return tail_.Load(MemOrder::kSeqCst) - head < capacity_;
        },
        deadline_ns, kFullRingBackoff);
  }

  // Line 0: written once by the constructor, then only read.
  alignas(kCacheLine) u32 capacity_;
  u32 mask_;
  // Line 1: shared by the producers (claimed with CAS).
  alignas(kCacheLine) Atomic<u64> tail_;
  WaitStats producer_stats_;
  // Line 2: the consumer's.
  alignas(kCacheLine) Atomic<u64> head_;
  WaitStats consumer_stats_;
  // Line 3: read on every operation, written only when someone parks.
  alignas(kCacheLine) WaitEvent not_empty_;  ///< the consumer parks here
  WaitEvent not_full_;                       ///< producers park here
};

}  // namespace chi
