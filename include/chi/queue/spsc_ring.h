// SpscRing<T>: a bounded single-producer single-consumer ring placed in a caller's region
// (private, POSIX shm or GPU-visible pinned memory), for channels with exactly one feeding
// thread or process. Invariant: one producer and one consumer at a time; the
// region holds no pointers (only positions relative to `this`), and head, tail and the
// wait words sit on separate cache lines.
//
// Protocol. Positions are 64-bit counters that never wrap in practice. Slot i of a ring of
// capacity C carries seq = p + 1 once position p (p % C == i) is published. The producer
// owns tail_ and decides "full" from head_ (cached); the consumer owns head_ and decides
// "empty" from the slot's seq, which shares the cache line with the value, so a handoff
// moves one line. Blocking ends (host only) park on a WaitEvent (see wait_event.h); GPU code
// uses TryPush/TryPop, and a host end fed from a GPU polls instead of parking.
#pragma once

#include <new>          // placement new into the caller's region
#include <type_traits>  // is_trivially_copyable: values are copied as bytes across processes

#include "chi/core/atomic.h"        // chi::Atomic, MemOrder
#include "chi/core/macros.h"        // CHI_CROSS_FUN, kCacheLine
#include "chi/core/types.h"         // u32, u64
#include "chi/queue/ring_layout.h"  // RoundUpPow2, IsRingAligned
#include "chi/queue/wait_event.h"   // WaitEvent, WaitStats, AwaitOp, kPublishOrder

namespace chi {

/** Bounded SPSC ring of trivially-copyable T; lives in (and trails into) a caller region. */
template <typename T>
class SpscRing {
  static_assert(std::is_trivially_copyable_v<T>, "ring values are copied as raw bytes");
  static_assert(alignof(T) <= kCacheLine, "over-aligned values are not supported");

 public:
  /** Bytes of region needed for `capacity` (rounded up to a power of two) slots. */
  CHI_CROSS_FUN static size_t BytesFor(u32 capacity) {
    return sizeof(SpscRing) + static_cast<size_t>(RoundUpPow2(capacity)) * sizeof(Slot);
  }

  /**
   * Constructs an empty ring at `mem` (BytesFor(capacity) bytes, 64-byte aligned).
   * Returns nullptr when `mem` is null or misaligned.
   */
  CHI_CROSS_FUN static SpscRing *Create(void *mem, u32 capacity) {
    if (!IsRingAligned(mem)) return nullptr;
    return new (mem) SpscRing(RoundUpPow2(capacity));
  }

  /** Views a ring that another process (or an earlier Create) built at `mem`. */
  CHI_CROSS_FUN static SpscRing *Attach(void *mem) { return static_cast<SpscRing *>(mem); }

  /** Appends v; false when the ring is full. Producer only. */
  CHI_CROSS_FUN bool TryPush(const T &v) {
    // relaxed: only this producer writes tail_.
    u64 tail = tail_.Load(MemOrder::kRelaxed);
    if (tail - head_cache_ >= capacity_) {
      // acquire: the consumer finished reading the slots it released before head_ moved.
      head_cache_ = head_.Load(MemOrder::kAcquire);
      if (tail - head_cache_ >= capacity_) return false;
    }
    Slot &slot = Slots()[tail & mask_];
    slot.value_ = v;
    // relaxed: tail_ only feeds Size(); the publish below orders everything.
    tail_.Store(tail + 1, MemOrder::kRelaxed);
    // kPublishOrder: release hands the value over; seq_cst pairs with a parked consumer.
    slot.seq_.Store(tail + 1, kPublishOrder);
    not_empty_.Notify();
    return true;
  }

  /** Removes the oldest value into `out`; false when the ring is empty. Consumer only. */
  CHI_CROSS_FUN bool TryPop(T &out) {
    // relaxed: only this consumer writes head_.
    u64 head = head_.Load(MemOrder::kRelaxed);
    Slot &slot = Slots()[head & mask_];
    // acquire: pairs with the producer's publish, so value_ is complete.
    if (slot.seq_.Load(MemOrder::kAcquire) != head + 1) return false;
    out = slot.value_;
    // kPublishOrder: release lets the producer reuse the slot only after our read;
    // seq_cst pairs with a parked producer.
    head_.Store(head + 1, kPublishOrder);
    not_full_.Notify();
    return true;
  }

  /** Appends v, blocking while full (spin, then futex park). Producer only, host only. */
  void Push(const T &v) { AwaitPush(v, kNoDeadline); }

  /** Appends v, blocking while full up to timeout_ns (0 = forever); false on timeout. */
  bool Push(const T &v, u64 timeout_ns) { return AwaitPush(v, DeadlineAfter(timeout_ns)); }

  /** Removes the oldest value, blocking while empty up to timeout_ns (0 = forever). */
  bool Pop(T &out, u64 timeout_ns) {
    return AwaitOp(
        not_empty_, consumer_stats_, [&] { return TryPop(out); },
        [&] {
          // relaxed head: our own counter; seq_cst seq: the waiter's Dekker re-check.
          u64 head = head_.Load(MemOrder::kRelaxed);
          return Slots()[head & mask_].seq_.Load(MemOrder::kSeqCst) == head + 1;
        },
        DeadlineAfter(timeout_ns));
  }

  /** Values in the ring; exact only when both ends are quiet. */
  CHI_CROSS_FUN u32 Size() const {
    // acquire: a best-effort snapshot; clamped because the two loads are not atomic together.
    u64 head = head_.Load(MemOrder::kAcquire);
    u64 tail = tail_.Load(MemOrder::kAcquire);
    if (tail <= head) return 0;
    return tail - head > capacity_ ? capacity_ : static_cast<u32>(tail - head);
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
  /** One value and the position that last published it. */
  struct Slot {
    Atomic<u64> seq_;  ///< p + 1 once position p is published into this slot
    T value_;
  };

  /** Initialises the header and every slot; `capacity` is already a power of two. */
  CHI_CROSS_FUN explicit SpscRing(u32 capacity) : capacity_(capacity), mask_(capacity - 1) {
    Slot *slots = Slots();
    for (u32 i = 0; i < capacity; ++i) new (&slots[i].seq_) Atomic<u64>(0);
  }

  /** The slot array trailing the header in the same region. */
  CHI_CROSS_FUN Slot *Slots() {
    return reinterpret_cast<Slot *>(reinterpret_cast<char *>(this) + sizeof(SpscRing));
  }

  /** Push with an absolute deadline. */
  bool AwaitPush(const T &v, u64 deadline_ns) {
    return AwaitOp(
        not_full_, producer_stats_, [&] { return TryPush(v); },
        [&] {
          // relaxed tail: our own counter; seq_cst head: the waiter's Dekker re-check.
          return tail_.Load(MemOrder::kRelaxed) - head_.Load(MemOrder::kSeqCst) < capacity_;
        },
        deadline_ns, kFullRingBackoff);
  }

  // Line 0: written once by the constructor, then only read.
  alignas(kCacheLine) u32 capacity_;
  u32 mask_;
  // Line 1: the producer's.
  alignas(kCacheLine) Atomic<u64> tail_;
  u64 head_cache_ = 0;  ///< producer's last view of head_, saves reading the consumer's line
  WaitStats producer_stats_;
  // Line 2: the consumer's.
  alignas(kCacheLine) Atomic<u64> head_;
  WaitStats consumer_stats_;
  // Line 3: read on every operation, written only when someone parks.
  alignas(kCacheLine) WaitEvent not_empty_;  ///< the consumer parks here
  WaitEvent not_full_;                       ///< the producer parks here
};

}  // namespace chi
