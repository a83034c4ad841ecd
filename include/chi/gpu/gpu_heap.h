// GpuHeap: the lock-free allocator with free behind CHI_GPU_HEAP, over device memory from
// the runtime (GetClientGpuInfo) or the user (GpuInfo::heap_). CHIMAERA_GPU_INIT cuts the
// region into partitions (HeapSliceFor: per thread, or per group of threads when small);
// each has power-of-two size classes, free lists with tagged (ABA-safe) heads and a bump cursor.
// Invariant: no thread ever waits on another; an exhausted partition returns nullptr; a block
// is always freed into the partition it came from.
#pragma once

#include "chi/core/atomic.h"  // Atomic, MemScope, MemOrder
#include "chi/core/macros.h"  // CHI_CROSS_FUN
#include "chi/core/types.h"   // u32, u64

namespace chi::gpu {

/** Alignment of every pointer GpuHeap::Allocate returns. */
inline constexpr u64 kGpuHeapAlign = 16;
/** Size classes: block sizes 32 B << c (header included), c < kGpuHeapClasses (32 B .. 1 GiB). */
inline constexpr u32 kGpuHeapClasses = 26;
/** The smallest partition HeapSliceFor gives one thread before it groups threads together. */
inline constexpr u64 kGpuHeapMinPartitionBytes = 4096;

/**
 * What precedes every block handed out (16 bytes). `next_` is written only by whoever pushes
 * the block onto a free list; a popper may read a stale value, which its tagged CAS rejects.
 */
struct alignas(16) GpuHeapBlock {
  static constexpr u32 kLive = 0x4c480000u;  ///< "HL": handed out; low byte is the class
  static constexpr u32 kFree = 0x46480000u;  ///< "HF": on a free list; low byte is the class
  Atomic<u32, MemScope::kDevice> state_;     ///< kLive | class, or kFree | class
  u32 owner_units_;                          ///< (this - owning partition) / 16
  Atomic<u64, MemScope::kDevice> next_;      ///< free list: next block's offset units, 0 = end
};
static_assert(sizeof(GpuHeapBlock) == kGpuHeapAlign, "the user's bytes start 16 bytes in");

/**
 * One partition: its header sits at the partition's start, blocks follow. Offsets are in
 * 16-byte units from the header (so a partition is at most 64 GiB); a free-list head is
 * tag << 32 | offset, the tag bumped by every push and pop, so a CAS based on a stale head
 * fails even when the same block is back on top (ABA) unless 2^32 operations came between.
 */
class alignas(64) GpuHeap {
 public:
  /**
   * Lays a partition over `bytes` bytes at `base` (64-byte aligned) and returns it; nullptr
   * when base is null or too small for the header. Whatever the region held is forgotten.
   */
  CHI_CROSS_FUN static GpuHeap *Format(void *base, u64 bytes) {
    if (base == nullptr || bytes < sizeof(GpuHeap)) return nullptr;
    if (bytes > (1ull << 36)) bytes = 1ull << 36;  // offsets are 32-bit in 16-byte units
    auto *h = static_cast<GpuHeap *>(base);
    h->bytes_ = bytes & ~(kGpuHeapAlign - 1);
    // relaxed: the formatting thread publishes the partition with a barrier (__syncthreads)
    // or a thread start, which orders these stores before any other thread's use.
    h->cursor_.Store(sizeof(GpuHeap), MemOrder::kRelaxed);
    h->in_use_.Store(0, MemOrder::kRelaxed);
    for (u32 c = 0; c < kGpuHeapClasses; ++c) h->heads_[c].Store(0, MemOrder::kRelaxed);
    return h;
  }

  /**
   * A block of at least `bytes` bytes, 16-byte aligned, or nullptr when the partition has no
   * room (or bytes is 0 or above the largest class). Lock-free: a retry means another
   * thread's operation on the same list or cursor succeeded.
   */
  CHI_CROSS_FUN void *Allocate(u64 bytes) {
    if (bytes == 0 || bytes_ == 0) return nullptr;
    const u32 c = ClassOf(bytes + sizeof(GpuHeapBlock));
    if (c >= kGpuHeapClasses) return nullptr;
    GpuHeapBlock *b = Pop(c);
    if (b == nullptr) b = Carve(c);
    for (u32 k = c + 1; b == nullptr && k < kGpuHeapClasses; ++k) b = Pop(k);  // a larger one
    if (b == nullptr) return nullptr;
    const u32 cls = b->state_.Load(MemOrder::kRelaxed) & 0xff;  // relaxed: the block is ours
    b->state_.Store(GpuHeapBlock::kLive | cls, MemOrder::kRelaxed);
    in_use_.FetchAdd(BlockBytes(cls), MemOrder::kRelaxed);  // relaxed: a statistic
    return b + 1;
  }

  /**
   * Gives a block back to the partition it came from (whichever thread calls it, through
   * any partition). False, doing nothing, for nullptr, a pointer that is not a live block
   * of a GpuHeap, or a second free of the same block.
   */
  CHI_CROSS_FUN bool Free(void *p) {
    if (p == nullptr || (reinterpret_cast<u64>(p) & (kGpuHeapAlign - 1)) != 0) return false;
    GpuHeapBlock *b = static_cast<GpuHeapBlock *>(p) - 1;
    u32 s = b->state_.Load(MemOrder::kRelaxed);
    if ((s & 0xffff0000u) != GpuHeapBlock::kLive || (s & 0xff) >= kGpuHeapClasses) return false;
    // relaxed: only one of two racing frees may win; the push below publishes the block.
    if (!b->state_.CompareExchange(s, GpuHeapBlock::kFree | (s & 0xff), MemOrder::kRelaxed)) {
      return false;
    }
    GpuHeap *owner = reinterpret_cast<GpuHeap *>(reinterpret_cast<char *>(b) -
                                                 static_cast<u64>(b->owner_units_) * 16);
    owner->in_use_.FetchSub(BlockBytes(s & 0xff), MemOrder::kRelaxed);  // relaxed: a statistic
    owner->Push(s & 0xff, b);
    return true;
  }

  /** Bytes of the blocks handed out and not yet freed (headers and rounding included). */
  CHI_CROSS_FUN u64 BytesInUse() const { return in_use_.Load(MemOrder::kRelaxed); }
  /** The partition's size, its header included. */
  CHI_CROSS_FUN u64 Capacity() const { return bytes_; }
  /** The most a single Allocate can return here (0 when the partition is empty). */
  CHI_CROSS_FUN u64 MaxAllocation() const {
    u64 room = bytes_ > sizeof(GpuHeap) ? bytes_ - sizeof(GpuHeap) : 0;
    u64 block = BlockBytes(0);
    while (block * 2 <= room && block < BlockBytes(kGpuHeapClasses - 1)) block *= 2;
    return block <= room ? block - sizeof(GpuHeapBlock) : 0;
  }

  /** The class whose blocks hold `block_bytes` (header included): ceil(log2(n / 32)). */
  CHI_CROSS_FUN static u32 ClassOf(u64 block_bytes) {
    u32 c = 0;
    while (c < kGpuHeapClasses && BlockBytes(c) < block_bytes) ++c;
    return c;
  }
  /** Bytes of a block of class c, header included. */
  CHI_CROSS_FUN static u64 BlockBytes(u32 c) { return 32ull << c; }

 private:
  /** The block `units` 16-byte units from the header. */
  CHI_CROSS_FUN GpuHeapBlock *At(u32 units) {
    return reinterpret_cast<GpuHeapBlock *>(reinterpret_cast<char *>(this) +
                                            static_cast<u64>(units) * 16);
  }
  CHI_CROSS_FUN u32 UnitsOf(const GpuHeapBlock *b) const {
    return static_cast<u32>((reinterpret_cast<const char *>(b) -
                             reinterpret_cast<const char *>(this)) / 16);
  }

  /** Takes the top block of class c's free list, or nullptr when it is empty. */
  CHI_CROSS_FUN GpuHeapBlock *Pop(u32 c) {
    // acquire: the pusher's writes (the block's next_ and state_) are visible before we
    // follow the head to the block.
    u64 h = heads_[c].Load(MemOrder::kAcquire);
    for (;;) {
      const u32 top = static_cast<u32>(h);
      if (top == 0) return nullptr;
      GpuHeapBlock *b = At(top);
      // relaxed: a stale link (b was popped meanwhile) comes with a stale tag: the CAS fails.
      const u64 next = b->next_.Load(MemOrder::kRelaxed);
      const u64 want = ((h >> 32) + 1) << 32 | static_cast<u32>(next);
      // acquire: as above, for the head a failed CAS hands back.
      if (heads_[c].CompareExchange(h, want, MemOrder::kAcquire)) return b;
    }
  }

  /** Puts block b (class c) on top of class c's free list. */
  CHI_CROSS_FUN void Push(u32 c, GpuHeapBlock *b) {
    const u32 units = UnitsOf(b);
    u64 h = heads_[c].Load(MemOrder::kRelaxed);  // relaxed: the CAS below orders the push
    for (;;) {
      b->next_.Store(static_cast<u32>(h), MemOrder::kRelaxed);  // published by the CAS
      const u64 want = ((h >> 32) + 1) << 32 | units;
      // release: the block's link, state and the freer's last writes to it happen before
      // the next popper (acquire) touches it.
      if (heads_[c].CompareExchange(h, want, MemOrder::kRelease)) return;
    }
  }

  /** A never-used block of class c from the bump cursor, or nullptr when it does not fit. */
  CHI_CROSS_FUN GpuHeapBlock *Carve(u32 c) {
    const u64 size = BlockBytes(c);
    // relaxed: the cursor only hands out disjoint ranges; nothing is published through it.
    u64 at = cursor_.Load(MemOrder::kRelaxed);
    for (;;) {
      if (at + size > bytes_) return nullptr;
      if (cursor_.CompareExchange(at, at + size, MemOrder::kRelaxed)) break;
    }
    auto *b = reinterpret_cast<GpuHeapBlock *>(reinterpret_cast<char *>(this) + at);
    b->owner_units_ = static_cast<u32>(at / 16);
    b->next_.Store(0, MemOrder::kRelaxed);
    b->state_.Store(GpuHeapBlock::kFree | c, MemOrder::kRelaxed);  // Allocate marks it live
    return b;
  }

  u64 bytes_;                                              ///< partition size
  Atomic<u64, MemScope::kDevice> cursor_;                  ///< first never-used byte
  Atomic<u64, MemScope::kDevice> in_use_;                  ///< live block bytes
  Atomic<u64, MemScope::kDevice> heads_[kGpuHeapClasses];  ///< tag << 32 | offset units
};

/** One thread's share of a heap region (see HeapSliceFor). */
struct GpuHeapSlice {
  char *base = nullptr;  ///< the partition's start (nullptr: this thread has no heap)
  u64 bytes = 0;         ///< its size
  bool leader = false;   ///< this thread formats it (the first thread of its group)
};

/**
 * Where thread `thread` of block `block` (of `blocks` blocks of `threads` threads) finds its
 * partition of the region [region, region + bytes): each block gets an equal share, cut
 * into per-thread partitions when each is at least kGpuHeapMinPartitionBytes, else into
 * partitions shared by groups of 2, 4, ... threads, down to one per block. Pure arithmetic:
 * every thread (and CHI_GPU_HEAP on every call) computes the same answer.
 */
CHI_CROSS_FUN inline GpuHeapSlice HeapSliceFor(char *region, u64 bytes, u32 block, u32 blocks,
                                               u32 thread, u32 threads) {
  GpuHeapSlice s;
  if (region == nullptr || blocks == 0 || threads == 0 || block >= blocks || thread >= threads) {
    return s;
  }
  const u64 per_block = (bytes / blocks) & ~63ull;
  if (per_block < sizeof(GpuHeap)) return s;
  u32 group = 1;
  while (group < threads &&
         ((per_block / ((threads + group - 1) / group)) & ~63ull) < kGpuHeapMinPartitionBytes) {
    group *= 2;
  }
  if (group > threads) group = threads;
  const u32 parts = (threads + group - 1) / group;
  const u64 part_bytes = (per_block / parts) & ~63ull;
  if (part_bytes < sizeof(GpuHeap)) return s;
  s.base = region + static_cast<u64>(block) * per_block +
           static_cast<u64>(thread / group) * part_bytes;
  s.bytes = part_bytes;
  s.leader = thread % group == 0;
  return s;
}

}  // namespace chi::gpu
