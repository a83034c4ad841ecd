// SizeClassAllocator: the general allocator with free, living inside a segment and used
// from many processes (and device code) at once: task payloads, queues, FutureShm.
// Invariant: a block is in exactly one place (a free list, its owner, or the uncarved
// tail), so free bytes = capacity - bytes handed out. Lock-free: a process dying
// mid-call can leak a block, never wedge the others.
#pragma once

#include <new>  // placement new in New<T>

#include "chi/core/atomic.h"            // Atomic, MemOrder
#include "chi/core/macros.h"            // CHI_CROSS_FUN
#include "chi/core/types.h"             // u32, u64
#include "chi/memory/allocator_base.h"  // AllocatorHeader, AlignUp, Log2Floor
#include "chi/memory/full_ptr.h"        // FullPtr
#include "chi/memory/shm_ptr.h"         // ShmPtr, AllocatorId

namespace chi {
namespace detail {

/** Bytes in a block of class c: 32, 48, then 64·(1, 1.25, 1.5, 1.75), 128·(...), ... */
CHI_CROSS_FUN constexpr u64 SizeClassBytes(u32 c) {
  if (c < 2) return 32 + 16 * static_cast<u64>(c);
  const u32 e = 6 + (c - 2) / 4;
  return (1ull << e) + static_cast<u64>((c - 2) % 4) * (1ull << (e - 2));
}

}  // namespace detail

/**
 * Segregated size classes, four per power of two (at most 25% rounding waste), each with
 * a lock-free Treiber stack of free blocks. A stack head is one 64-bit word {u32 tag,
 * u32 block offset in 16-byte units}; every push and pop bumps the tag, so a pop that
 * read a stale `next` (the ABA case) fails its CAS instead of corrupting the list.
 * An empty class carves a new block from the bump region; when that is exhausted it
 * borrows a block of a larger class. Blocks are never split or merged: memory carved for
 * a class stays in that class (the usual trade of segregated fits for speed).
 *
 * Every block starts with a 16-byte BlockHeader; payloads follow it, 16-byte aligned.
 * Over-aligned payloads get a second "padded" header just before them pointing back.
 */
class SizeClassAllocator {
 public:
  static constexpr AllocatorKind kKind = AllocatorKind::kSizeClass;
  /** Block granule and header size; payloads are aligned to it by default. */
  static constexpr u64 kUnit = 16;
  static constexpr u32 kNumClasses = 122;
  /** Largest alignment honoured (segment bases are page-aligned). */
  static constexpr u64 kMaxAlign = 4096;
  /** Block offsets are u32 units, so a segment is managed up to this offset (64 GiB). */
  static constexpr u64 kMaxRegionEnd = (1ull << 32) * kUnit;
  /** Returned by AuditFreeBytes when a free list is inconsistent. */
  static constexpr u64 kAuditCorrupt = ~0ull;

  /** Bytes in a block of class c. */
  CHI_CROSS_FUN static constexpr u64 ClassSize(u32 c) { return detail::SizeClassBytes(c); }
  /** Largest block (header and padding included). */
  static constexpr u64 kMaxBlock = detail::SizeClassBytes(kNumClasses - 1);

  /** The smallest class whose blocks hold `bytes` (header included); kNumClasses if none. */
  CHI_CROSS_FUN static u32 SizeToClass(u64 bytes) {
    if (bytes <= 64) return bytes <= 32 ? 0 : (bytes <= 48 ? 1 : 2);
    if (bytes > kMaxBlock) return kNumClasses;
    const u32 e = detail::Log2Floor(bytes - 1);  // 2^e < bytes <= 2^(e+1)
    const u64 step = 1ull << (e - 2);
    const u64 k = (bytes - (1ull << e) + step - 1) / step;  // 1..4 quarter steps above 2^e
    return 2 + 4 * (e - 6) + static_cast<u32>(k);
  }

  /**
   * Lays the allocator out at `this` (inside the segment at `segment_base`), managing
   * the bytes after it up to segment offset `end_offset` (capped at kMaxRegionEnd).
   * False when not even one block would fit.
   */
  CHI_CROSS_FUN bool Init(AllocatorId id, char *segment_base, u64 end_offset) {
    const u64 self = static_cast<u64>(reinterpret_cast<char *>(this) - segment_base);
    const u64 begin = detail::AlignUp(self + sizeof(SizeClassAllocator), kCacheLine);
    if (end_offset > kMaxRegionEnd) end_offset = kMaxRegionEnd;
    if (id.IsNull() || begin + ClassSize(0) > end_offset) return false;
    const u64 end = begin + (end_offset - begin) / kUnit * kUnit;
    hdr_.Fill(kKind, id, segment_base, begin, end);
    // Relaxed stores: Publish()'s release makes them visible to anyone who attaches.
    bump_.Store(begin, MemOrder::kRelaxed);
    for (FreeList &l : lists_) {
      l.head_.Store(0, MemOrder::kRelaxed);
      l.live_.Store(0, MemOrder::kRelaxed);
    }
    hdr_.Publish();
    return true;
  }

  /**
   * Allocates `size` bytes aligned to `align` (a power of two up to kMaxAlign).
   * Returns null, and changes nothing, when the request cannot be met.
   */
  CHI_CROSS_FUN ShmPtr<void> Allocate(u64 size, u64 align = kUnit) {
    if (align == 0 || (align & (align - 1)) != 0 || align > kMaxAlign) return {};
    if (align < kUnit) align = kUnit;
    if (size > kMaxBlock) return {};
    // Header plus payload plus worst-case padding to reach `align` (blocks are 16-aligned).
    const u32 want = SizeToClass(size + align);
    if (want >= kNumClasses) return {};
    u32 got = want;
    u64 block = Pop(want);
    if (block == 0) block = Carve(ClassSize(want));
    while (block == 0 && ++got < kNumClasses) block = Pop(got);
    if (block == 0) return {};
    lists_[got].live_.FetchAdd(1, MemOrder::kRelaxed);  // a statistic: no ordering needed
    BlockHeader *h = HeaderAt(block);
    h->class_ = got;
    h->back_ = 0;
    // Relaxed: the block is ours alone; whoever frees it got the pointer through a
    // synchronising hand-off, which carries these stores along.
    h->state_.Store(kLive, MemOrder::kRelaxed);
    const u64 payload = detail::AlignUp(block + kUnit, align);
    if (payload != block + kUnit) {
      BlockHeader *pad = HeaderAt(payload - kUnit);
      pad->class_ = got;
      pad->back_ = static_cast<u32>(payload - block);
      pad->state_.Store(kPadded, MemOrder::kRelaxed);  // same reasoning as above
    }
    return ShmPtr<void>(hdr_.id_, payload);
  }

  /** Allocates and returns both forms of the pointer. */
  CHI_CROSS_FUN FullPtr<void> AllocateFull(u64 size, u64 align = kUnit) {
    ShmPtr<void> p = Allocate(size, align);
    return FullPtr<void>(ToPointer(p), p);
  }

  /**
   * Returns a block to its class. False (and nothing freed) for a null pointer, another
   * allocator's pointer, or a block that is not live (a double free is caught this way
   * unless the block was handed out again in between).
   */
  template <typename T>
  CHI_CROSS_FUN bool Free(ShmPtr<T> ptr) {
    if (ptr.IsNull() || ptr.alloc_id_ != hdr_.id_) return false;
    const u64 off = ptr.off_;
    if (off % kUnit != 0 || off < hdr_.begin_ + kUnit || off >= hdr_.end_) return false;
    u64 block = off - kUnit;
    BlockHeader *h = HeaderAt(block);
    if (h->state_.Load(MemOrder::kRelaxed) == kPadded) {  // ordered by the hand-off, as above
      if (h->back_ > off - hdr_.begin_) return false;
      block = off - h->back_;
      h = HeaderAt(block);
    }
    const u32 c = h->class_;
    if (c >= kNumClasses || block + ClassSize(c) > hdr_.end_) return false;
    u32 expected = kLive;
    // Relaxed: only one of two racing frees may win; the data hand-off is Push's release.
    if (!h->state_.CompareExchange(expected, kFree, MemOrder::kRelaxed)) return false;
    lists_[c].live_.FetchSub(1, MemOrder::kRelaxed);  // a statistic: no ordering needed
    Push(c, block);
    return true;
  }

  /** Allocates and constructs a T in place; null when out of memory. */
  template <typename T, typename... Args>
  CHI_CROSS_FUN FullPtr<T> New(Args &&...args) {
    ShmPtr<void> p = Allocate(sizeof(T), alignof(T) < kUnit ? kUnit : alignof(T));
    if (p.IsNull()) return {};
    T *obj = new (ToPointer(p)) T(static_cast<Args &&>(args)...);
    return FullPtr<T>(obj, p.Cast<T>());
  }

  /** Destroys and frees an object made by New. False if it is not one of ours. */
  template <typename T>
  CHI_CROSS_FUN bool Delete(ShmPtr<T> ptr) {
    if (ptr.IsNull() || ptr.alloc_id_ != hdr_.id_) return false;
    ToPointer(ptr)->~T();
    return Free(ptr);
  }
  template <typename T>
  CHI_CROSS_FUN bool Delete(FullPtr<T> ptr) {
    return Delete(ptr.shm_);
  }

  /** Bytes managed in all. */
  CHI_CROSS_FUN u64 Capacity() const { return hdr_.end_ - hdr_.begin_; }
  /**
   * Bytes of blocks currently handed out (headers and class rounding included). Sums
   * the per-class counters: exact when quiescent, a snapshot while others allocate.
   */
  CHI_CROSS_FUN u64 UsedBytes() const {
    u64 used = 0;
    for (u32 c = 0; c < kNumClasses; ++c) {
      used += lists_[c].live_.Load(MemOrder::kRelaxed) * ClassSize(c);  // a statistic
    }
    return used;
  }
  /** Capacity() - UsedBytes(): back at its starting value once everything is freed. */
  CHI_CROSS_FUN u64 FreeBytes() const { return Capacity() - UsedBytes(); }

  /**
   * Recounts free bytes the slow way (free lists plus the uncarved tail), checking every
   * free block's header. Only meaningful while no other thread or process is allocating.
   * Equals FreeBytes() when the allocator is consistent; kAuditCorrupt when a list is not.
   */
  u64 AuditFreeBytes() const {
    u64 total = hdr_.end_ - bump_.Load(MemOrder::kAcquire);
    const u64 max_steps = Capacity() / ClassSize(0) + 1;
    for (u32 c = 0; c < kNumClasses; ++c) {
      u64 unit = static_cast<u32>(lists_[c].head_.Load(MemOrder::kAcquire));
      for (u64 steps = 0; unit != 0; ++steps) {
        const u64 block = unit * kUnit;
        if (steps > max_steps || block < hdr_.begin_ || block + ClassSize(c) > hdr_.end_) {
          return kAuditCorrupt;
        }
        const BlockHeader *h = HeaderAt(block);
        if (h->class_ != c || h->state_.Load(MemOrder::kRelaxed) != kFree) return kAuditCorrupt;
        total += ClassSize(c);
        unit = h->next_unit_.Load(MemOrder::kRelaxed);
      }
    }
    return total;
  }

  /** Local pointer for p (no registry lookup: the allocator knows its own base). */
  template <typename T>
  CHI_CROSS_FUN T *ToPointer(ShmPtr<T> p) const {
    return p.IsNull() ? nullptr : reinterpret_cast<T *>(hdr_.SegmentBase() + p.off_);
  }
  /** ShmPtr for a pointer into this allocator's segment. */
  template <typename T>
  CHI_CROSS_FUN ShmPtr<T> ToShmPtr(const T *ptr) const {
    if (ptr == nullptr) return {};
    return ShmPtr<T>(hdr_.id_, static_cast<u64>(reinterpret_cast<const char *>(ptr) -
                                                hdr_.SegmentBase()));
  }

  CHI_CROSS_FUN AllocatorId Id() const { return hdr_.id_; }
  CHI_CROSS_FUN const AllocatorHeader &Header() const { return hdr_; }

 private:
  /** Block states, kept in the header's state word. */
  static constexpr u32 kFree = 0x46524545u;    // on a free list
  static constexpr u32 kLive = 0x4c495645u;    // handed out
  static constexpr u32 kPadded = 0x50414444u;  // the header before an over-aligned payload

  /** The 16 bytes before every payload. */
  struct BlockHeader {
    Atomic<u32> next_unit_;  // free-list link (units), meaningful while the block is free
    Atomic<u32> state_;      // kFree / kLive / kPadded
    u32 class_;              // size class of the whole block
    u32 back_;               // kPadded only: bytes back from the payload to the block
  };
  static_assert(sizeof(BlockHeader) == kUnit, "a block header is one unit");

  /**
   * One stack head per class, each on its own cache line so classes do not contend. The
   * class's count of live blocks shares the line: the CAS has just fetched it anyway.
   */
  struct alignas(kCacheLine) FreeList {
    Atomic<u64> head_;  // {tag << 32 | block offset in units}; unit 0 = empty
    Atomic<u64> live_;  // blocks of this class handed out
  };

  CHI_CROSS_FUN BlockHeader *HeaderAt(u64 off) const {
    return reinterpret_cast<BlockHeader *>(hdr_.SegmentBase() + off);
  }

  /** Pops a free block of class c (segment offset), or 0 when the list is empty. */
  CHI_CROSS_FUN u64 Pop(u32 c) {
    Atomic<u64> &head = lists_[c].head_;
    // Acquire: see the pusher's `next` link and everything written to the block before Free.
    u64 old = head.Load(MemOrder::kAcquire);
    while (static_cast<u32>(old) != 0) {
      const u64 block = static_cast<u64>(static_cast<u32>(old)) * kUnit;
      // May be stale if another thread popped this block meanwhile; the tag makes the CAS fail.
      const u32 next = HeaderAt(block)->next_unit_.Load(MemOrder::kRelaxed);
      const u64 desired = (((old >> 32) + 1) << 32) | next;
      // Acquire on success and failure: a retry reads the new head's link, as above.
      if (head.CompareExchange(old, desired, MemOrder::kAcquire)) return block;
    }
    return 0;
  }

  /** Pushes block (segment offset) onto class c's free list. */
  CHI_CROSS_FUN void Push(u32 c, u64 block) {
    Atomic<u64> &head = lists_[c].head_;
    BlockHeader *h = HeaderAt(block);
    const u64 unit = block / kUnit;
    u64 old = head.Load(MemOrder::kRelaxed);  // only a guess; the CAS checks it
    u64 desired;
    do {
      h->next_unit_.Store(static_cast<u32>(old), MemOrder::kRelaxed);  // published by the CAS
      desired = (((old >> 32) + 1) << 32) | unit;
      // Release: the link and the block's contents become visible to the next popper.
    } while (!head.CompareExchange(old, desired, MemOrder::kRelease));
  }

  /** Takes `bytes` from the uncarved tail (segment offset), or 0 when it is exhausted. */
  CHI_CROSS_FUN u64 Carve(u64 bytes) {
    // Relaxed: fresh bytes carry no data; a CAS (not fetch_add) so a failed large request
    // does not use up the tail that smaller requests could still get.
    u64 cur = bump_.Load(MemOrder::kRelaxed);
    do {
      if (bytes > hdr_.end_ - cur) return 0;
    } while (!bump_.CompareExchange(cur, cur + bytes, MemOrder::kRelaxed));
    return cur;
  }

  AllocatorHeader hdr_;
  alignas(kCacheLine) Atomic<u64> bump_;  // start of the uncarved tail
  FreeList lists_[kNumClasses];
};

}  // namespace chi
