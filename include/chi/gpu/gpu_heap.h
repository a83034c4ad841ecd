// GpuHeap: the lock-free allocator with free behind CHI_GPU_HEAP, over device memory from
// the runtime (GetClientGpuInfo) or the user (GpuInfo::heap_). A region is formatted ONCE,
// when it is made (GpuHeapRegion::Format; FormatGpuHeap on the host), into a fixed number of
// private partitions, whatever geometry the kernels using it later have, and (regions of
// kGpuHeapMinPartitionsToShare or more) a shared quarter: a spill partition (1/16 of the
// region) and a large one (3/16). CHIMAERA_GPU_INIT formats nothing: each block takes a run
// of tickets and thread t of the block uses private partition (first ticket + t) mod count.
// A request that fits a private partition is served there, or from the spill partition once
// the thread's own is exhausted; a larger one comes from the large partition, which small
// blocks never enter (blocks are never split or merged, so they would fragment it for good).
// A partition has size classes (16 B << c plus a 16-byte header), free lists with tagged
// (ABA-safe) heads and a bump cursor, all lock-free, so any threads may share one.
// Invariant: no thread ever waits on another; exhaustion returns nullptr; a block is always
// freed into the partition it came from; nothing re-formats a region in use.
#pragma once

#include "chi/core/atomic.h"  // Atomic, MemScope, MemOrder
#include "chi/core/macros.h"  // CHI_CROSS_FUN
#include "chi/core/types.h"   // u32, u64

namespace chi::gpu {

/** Alignment of every pointer GpuHeap::Allocate returns. */
inline constexpr u64 kGpuHeapAlign = 16;
/**
 * Size classes c < kGpuHeapClasses: a block of class c gives its user 16 B << c (16 B ..
 * 512 MiB) after its 16-byte header, so a power-of-two request costs 16 bytes more, not double.
 */
inline constexpr u32 kGpuHeapClasses = 26;
/**
 * Region bytes per private partition when the formatter names no count (64 MiB: 2048
 * partitions of ~24 KiB each, beside the shared quarter).
 */
inline constexpr u64 kGpuHeapPartitionBytes = 32 << 10;
/** The smallest partition Format makes while it can make fewer, larger ones instead. */
inline constexpr u64 kGpuHeapMinPartitionBytes = 4096;
/** Most partitions one region has. */
inline constexpr u32 kGpuHeapMaxPartitions = 1u << 20;
/** Largest region: offsets are 32-bit counts of 16-byte units. */
inline constexpr u64 kGpuHeapMaxRegionBytes = (1ull << 36) - 64;
/**
 * Regions of at least this many private partitions keep a quarter of their bytes shared
 * (spill and large partitions); with fewer, a private partition is as large as that quarter.
 */
inline constexpr u32 kGpuHeapMinPartitionsToShare = 8;

/**
 * What precedes every block handed out (16 bytes). `next_` is written only by whoever pushes
 * the block onto a free list; a popper may read a stale value, which its tagged CAS rejects.
 * Blocks are never split or merged, so these 16 bytes stay a block header for good.
 */
struct alignas(16) GpuHeapBlock {
  static constexpr u32 kLive = 0x4c480000u;  ///< "HL": handed out; low byte is the class
  static constexpr u32 kFree = 0x46480000u;  ///< "HF": on a free list; low byte is the class
  Atomic<u32, MemScope::kDevice> state_;     ///< kLive | class, or kFree | class
  u32 owner_;                                ///< index of the owning partition in its region
  Atomic<u64, MemScope::kDevice> next_;      ///< free list: next block's unit, 0 = end
};
static_assert(sizeof(GpuHeapBlock) == kGpuHeapAlign, "the user's bytes start 16 bytes in");

/**
 * One partition's header. Positions are in 16-byte units from the region's start (unit 0 is
 * never a block, so 0 ends a list); a free-list head is tag << 32 | unit, the tag bumped by
 * every push and pop, so a CAS based on a stale head fails even when the same block is back
 * on top (ABA) unless 2^32 operations came between. The headers of a region's partitions sit
 * together at its start (private ones, then spill and large), their blocks after them; a
 * stand-alone GpuHeap (Format) is a region of one partition whose blocks follow its header.
 * An all-zero header is a valid empty heap.
 */
class alignas(64) GpuHeap {
 public:
  static constexpr u32 kMagic = 0x50484347u;  ///< "GCHP": a formatted partition header

  /**
   * Lays a one-partition heap over `bytes` bytes at `base` (64-byte aligned) and returns it;
   * nullptr when base is null or too small for the header. Whatever the region held is
   * forgotten. Regions for CHI_GPU_HEAP are cut by GpuHeapRegion::Format instead.
   */
  CHI_CROSS_FUN static GpuHeap *Format(void *base, u64 bytes) {
    if (base == nullptr || bytes < sizeof(GpuHeap)) return nullptr;
    if (bytes > kGpuHeapMaxRegionBytes) bytes = kGpuHeapMaxRegionBytes;
    auto *h = static_cast<GpuHeap *>(base);
    const u32 first = sizeof(GpuHeap) / 16;
    const u32 end = static_cast<u32>(bytes / 16);
    h->Init(0, first, end, Layout{0, 1, 1, first, end});
    return h;
  }

  /**
   * A block of at least `bytes` bytes, 16-byte aligned, or nullptr when there is no room (or
   * bytes is 0 or above the largest class). A request whose block fits this partition is
   * served here, else (a private partition of a sharing region) from the spill partition; a
   * larger one from the large partition. Lock-free: a retry means another thread's operation
   * on the same list or cursor succeeded.
   */
  CHI_CROSS_FUN void *Allocate(u64 bytes) {
    if (bytes == 0 || bytes > UserBytes(kGpuHeapClasses - 1) || magic_ != kMagic) return nullptr;
    const u32 c = ClassOf(bytes + sizeof(GpuHeapBlock));
    const bool shares = Shares();
    if (BlockBytes(c) <= Capacity()) {
      void *p = Take(c);
      return p != nullptr || !shares ? p : Peer(spill_)->Take(c);
    }
    return shares ? Peer(spill_ + 1)->Take(c) : nullptr;
  }

  /**
   * Gives a block back to the partition it came from (whichever thread calls it, through
   * any partition of the same region). False, doing nothing, for nullptr, a pointer outside
   * the region's blocks (never read), one that is not a live block its owner carved, or a
   * second free of the same block.
   */
  CHI_CROSS_FUN bool Free(void *p) {
    if (magic_ != kMagic) return false;
    const u64 base = reinterpret_cast<u64>(Base());
    const u64 at = reinterpret_cast<u64>(p);
    if ((at & (kGpuHeapAlign - 1)) != 0 || at < base + (static_cast<u64>(span_begin_) + 1) * 16 ||
        at >= base + static_cast<u64>(span_end_) * 16) {
      return false;
    }
    const u32 unit = static_cast<u32>((at - base) / 16 - 1);
    GpuHeapBlock *b = At(unit);
    u32 s = b->state_.Load(MemOrder::kRelaxed);
    const u32 c = s & 0xff;
    if ((s & 0xffffff00u) != GpuHeapBlock::kLive || c >= kGpuHeapClasses) return false;
    if (b->owner_ >= count_) return false;
    GpuHeap *owner = Peer(b->owner_);
    // relaxed: the cursor only grows, and it passed the block before the block was handed out.
    if (unit < owner->begin_ ||
        unit + BlockBytes(c) / 16 > owner->cursor_.Load(MemOrder::kRelaxed)) {
      return false;
    }
    // relaxed: only one of two racing frees may win; the push below publishes the block.
    if (!b->state_.CompareExchange(s, GpuHeapBlock::kFree | c, MemOrder::kRelaxed)) return false;
    owner->in_use_.FetchSub(BlockBytes(c), MemOrder::kRelaxed);  // relaxed: a statistic
    owner->Push(c, b);
    return true;
  }

  /** Bytes of this partition's blocks handed out and not yet freed (headers included). */
  CHI_CROSS_FUN u64 BytesInUse() const { return in_use_.Load(MemOrder::kRelaxed); }
  /** Bytes the partition's blocks may take (its header, apart, not included). */
  CHI_CROSS_FUN u64 Capacity() const { return static_cast<u64>(end_ - begin_) * 16; }
  /** The most one Allocate through this partition can return, shared space included. */
  CHI_CROSS_FUN u64 MaxAllocation() {
    const u64 own = OwnMaxAllocation();
    if (!Shares()) return own;
    const u64 large = Peer(spill_ + 1)->OwnMaxAllocation();
    return large > own ? large : own;
  }
  /** The most one block of this partition's own can hold (0 when the partition is empty). */
  CHI_CROSS_FUN u64 OwnMaxAllocation() const {
    u64 most = 0;
    for (u32 c = 0; c < kGpuHeapClasses && BlockBytes(c) <= Capacity(); ++c) most = UserBytes(c);
    return most;
  }

  /** The class whose blocks hold `block_bytes` (header included), kGpuHeapClasses if none. */
  CHI_CROSS_FUN static u32 ClassOf(u64 block_bytes) {
    u32 c = 0;
    while (c < kGpuHeapClasses && BlockBytes(c) < block_bytes) ++c;
    return c;
  }
  /** Bytes a block of class c gives its user. */
  CHI_CROSS_FUN static u64 UserBytes(u32 c) { return 16ull << c; }
  /** Bytes of a block of class c, header included. */
  CHI_CROSS_FUN static u64 BlockBytes(u32 c) { return UserBytes(c) + sizeof(GpuHeapBlock); }

 private:
  friend class GpuHeapRegion;

  /** What every partition of a region shares: where the others are, and all their blocks. */
  struct Layout {
    u32 peers;       ///< unit of the first partition header
    u32 count;       ///< partition headers, shared ones included
    u32 spill;       ///< index of the spill partition (large: spill + 1); count when none
    u32 span_begin;  ///< first unit of any partition's blocks
    u32 span_end;    ///< one past the last
  };

  /**
   * Makes this header the partition at unit `self` of its region, its blocks in [first,
   * end). Relaxed stores: the formatter publishes the region (a copy before any launch, a
   * kernel boundary, a thread start) before anyone uses it.
   */
  CHI_CROSS_FUN void Init(u32 self, u32 first, u32 end, const Layout &l) {
    self_ = self;
    begin_ = first;
    end_ = end;
    peers_ = l.peers;
    count_ = l.count;
    spill_ = l.spill;
    span_begin_ = l.span_begin;
    span_end_ = l.span_end;
    cursor_.Store(first, MemOrder::kRelaxed);
    in_use_.Store(0, MemOrder::kRelaxed);
    for (u32 c = 0; c < kGpuHeapClasses; ++c) heads_[c].Store(0, MemOrder::kRelaxed);
    magic_ = kMagic;
  }

  /** The region's first byte. */
  CHI_CROSS_FUN char *Base() {
    return reinterpret_cast<char *>(this) - static_cast<u64>(self_) * 16;
  }
  /** The block at `unit`. */
  CHI_CROSS_FUN GpuHeapBlock *At(u32 unit) {
    return reinterpret_cast<GpuHeapBlock *>(Base() + static_cast<u64>(unit) * 16);
  }
  /** Partition `index` of the region (index < count_). */
  CHI_CROSS_FUN GpuHeap *Peer(u32 index) {
    return reinterpret_cast<GpuHeap *>(Base() + static_cast<u64>(peers_) * 16) + index;
  }
  /** This partition's index in its region. */
  CHI_CROSS_FUN u32 Index() const { return (self_ - peers_) / (sizeof(GpuHeap) / 16); }
  /** True for a private partition of a region with spill and large partitions. */
  CHI_CROSS_FUN bool Shares() const { return spill_ < count_ && Index() < spill_; }

  /**
   * A live block of class c (or a larger one) from this partition's own blocks, counted in
   * its BytesInUse; nullptr when the lists of class c and up and the cursor are all empty.
   */
  CHI_CROSS_FUN void *Take(u32 c) {
    GpuHeapBlock *b = Pop(c);
    if (b == nullptr) b = Carve(c);
    for (u32 k = c + 1; b == nullptr && k < kGpuHeapClasses && BlockBytes(k) <= Capacity(); ++k) {
      b = Pop(k);  // a larger one: no larger class was ever carved here
    }
    if (b == nullptr) return nullptr;
    const u32 cls = b->state_.Load(MemOrder::kRelaxed) & 0xff;  // relaxed: the block is ours
    b->state_.Store(GpuHeapBlock::kLive | cls, MemOrder::kRelaxed);
    in_use_.FetchAdd(BlockBytes(cls), MemOrder::kRelaxed);  // relaxed: a statistic
    return b + 1;
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
    const u32 unit = static_cast<u32>((reinterpret_cast<char *>(b) - Base()) / 16);
    u64 h = heads_[c].Load(MemOrder::kRelaxed);  // relaxed: the CAS below orders the push
    for (;;) {
      b->next_.Store(static_cast<u32>(h), MemOrder::kRelaxed);  // published by the CAS
      const u64 want = ((h >> 32) + 1) << 32 | unit;
      // release: the block's link, state and the freer's last writes to it happen before
      // the next popper (acquire) touches it.
      if (heads_[c].CompareExchange(h, want, MemOrder::kRelease)) return;
    }
  }

  /** A never-used block of class c from the bump cursor, or nullptr when it does not fit. */
  CHI_CROSS_FUN GpuHeapBlock *Carve(u32 c) {
    const u64 units = BlockBytes(c) / 16;
    // relaxed: the cursor only hands out disjoint ranges; nothing is published through it.
    u32 at = cursor_.Load(MemOrder::kRelaxed);
    for (;;) {
      if (at + units > end_) return nullptr;
      if (cursor_.CompareExchange(at, static_cast<u32>(at + units), MemOrder::kRelaxed)) break;
    }
    GpuHeapBlock *b = At(at);
    b->owner_ = Index();
    b->next_.Store(0, MemOrder::kRelaxed);
    b->state_.Store(GpuHeapBlock::kFree | c, MemOrder::kRelaxed);  // Take marks it live
    return b;
  }

  u32 magic_;       ///< kMagic once formatted (zero: an empty heap)
  u32 self_;        ///< this header's unit
  u32 begin_;       ///< first unit of this partition's blocks
  u32 end_;         ///< one past its last unit
  u32 peers_;       ///< unit of the region's first partition header
  u32 count_;       ///< partition headers in the region, shared ones included
  u32 spill_;       ///< index of the spill partition (large: spill_ + 1); count_ when none
  u32 span_begin_;  ///< first unit of any partition's blocks (what Free accepts) ...
  u32 span_end_;    ///< ... and one past the last
  Atomic<u32, MemScope::kDevice> cursor_;                  ///< first never-used unit
  Atomic<u64, MemScope::kDevice> in_use_;                  ///< live block bytes
  Atomic<u64, MemScope::kDevice> heads_[kGpuHeapClasses];  ///< tag << 32 | unit
};
static_assert(sizeof(GpuHeap) == 256, "a partition header is 16 units of 16 bytes");

/**
 * A CHI_GPU_HEAP region: this header (128 bytes), then its partitions' headers (private,
 * then spill and large), then their blocks: equal private shares of three quarters of the
 * region, the spill partition's 1/16 and the large one's 3/16 (regions of fewer than
 * kGpuHeapMinPartitionsToShare private partitions share nothing: all of it is private).
 * Format writes only the first HeaderBytes(count) bytes, so a host can format device memory
 * by copying an image of them (FormatGpuHeap). The ticket counter sits on its own line:
 * blocks bump it while kernels read the layout words.
 */
class alignas(64) GpuHeapRegion {
 public:
  static constexpr u64 kMagic = 0x4e47524145484347ull;  ///< "CGHEARGN"

  /**
   * The private partition count Format uses for a region of `bytes` when asked for `wanted`
   * (0: one per kGpuHeapPartitionBytes): a power of two, lowered until each partition has
   * kGpuHeapMinPartitionBytes (or is the only one). 0 when not even one partition fits.
   */
  CHI_CROSS_FUN static u32 PartitionsFor(u64 bytes, u32 wanted) {
    if (bytes > kGpuHeapMaxRegionBytes) bytes = kGpuHeapMaxRegionBytes;
    u64 n = wanted != 0 ? wanted : bytes / kGpuHeapPartitionBytes;
    if (n > kGpuHeapMaxPartitions) n = kGpuHeapMaxPartitions;
    u32 p = 1;
    while (static_cast<u64>(p) * 2 <= n) p *= 2;
    while (p > 1 && PartitionBytes(bytes, p) < kGpuHeapMinPartitionBytes) p /= 2;
    return PartitionBytes(bytes, p) >= GpuHeap::BlockBytes(0) ? p : 0;
  }

  /** Shared partitions (spill and large) beside `partitions` private ones: 0 or 2. */
  CHI_CROSS_FUN static u32 SharedPartitionsFor(u32 partitions) {
    return partitions >= kGpuHeapMinPartitionsToShare ? 2 : 0;
  }

  /** Bytes Format writes for `partitions` private partitions: this header and all theirs. */
  CHI_CROSS_FUN static u64 HeaderBytes(u32 partitions) {
    const u64 headers = static_cast<u64>(partitions) + SharedPartitionsFor(partitions);
    return sizeof(GpuHeapRegion) + headers * sizeof(GpuHeap);
  }

  /**
   * Cuts `bytes` bytes at `base` (64-byte aligned) into PartitionsFor(bytes, partitions)
   * formatted private partitions (and the shared ones) and returns the region; nullptr when
   * base is null or too small. Call it once, before any kernel gets the region (host memory,
   * or one GPU thread before the kernels that use it): it forgets every block handed out.
   */
  CHI_CROSS_FUN static GpuHeapRegion *Format(void *base, u64 bytes, u32 partitions = 0) {
    const u32 n = PartitionsFor(bytes, partitions);
    if (base == nullptr || n == 0) return nullptr;
    if (bytes > kGpuHeapMaxRegionBytes) bytes = kGpuHeapMaxRegionBytes;
    auto *r = static_cast<GpuHeapRegion *>(base);
    const u32 shared = SharedPartitionsFor(n);
    const u64 part = PartitionBytes(bytes, n) / 16;
    const u32 first = static_cast<u32>(HeaderBytes(n) / 16);
    const u32 spill_begin = static_cast<u32>(first + n * part);
    const u32 large_begin = static_cast<u32>(spill_begin + SpillBytes(bytes, n) / 16);
    const u32 span_end = static_cast<u32>(large_begin + LargeBytes(bytes, n) / 16);
    const u32 peers = sizeof(GpuHeapRegion) / 16;
    const GpuHeap::Layout layout{peers, n + shared, n, first, span_end};
    for (u32 i = 0; i < n; ++i) {
      r->Partition(i)->Init(peers + i * (sizeof(GpuHeap) / 16), static_cast<u32>(first + i * part),
                            static_cast<u32>(first + (i + 1) * part), layout);
    }
    if (shared != 0) {
      r->Partition(n)->Init(peers + n * (sizeof(GpuHeap) / 16), spill_begin, large_begin, layout);
      r->Partition(n + 1)->Init(peers + (n + 1) * (sizeof(GpuHeap) / 16), large_begin, span_end,
                                layout);
    }
    r->bytes_ = bytes;
    r->partitions_ = n;
    r->mask_ = n - 1;
    r->shared_ = shared;
    r->shared_bytes_ = SpillBytes(bytes, n) + LargeBytes(bytes, n);
    r->next_ticket_.Store(0, MemOrder::kRelaxed);  // relaxed: published with the region
    r->magic_ = kMagic;
    return r;
  }

  /**
   * The region formatted at `base`, when it fits in `bytes` (a GpuInfo's heap_ and
   * heap_bytes_); nullptr when base is null or holds no formatted region.
   */
  CHI_CROSS_FUN static GpuHeapRegion *Open(void *base, u64 bytes) {
    auto *r = static_cast<GpuHeapRegion *>(base);
    if (r == nullptr || r->magic_ != kMagic || r->bytes_ > bytes || r->partitions_ == 0 ||
        (r->partitions_ & r->mask_) != 0 || r->mask_ != r->partitions_ - 1 ||
        r->shared_ != SharedPartitionsFor(r->partitions_)) {
      return nullptr;
    }
    return r;
  }

  /**
   * Reserves `n` consecutive tickets (one per thread of a block) and returns the first.
   * Launches running at once get different tickets, so different partitions while fewer
   * than Partitions() threads hold tickets together.
   */
  CHI_CROSS_FUN u32 TakeTickets(u32 n) {
    // relaxed: a ticket only spreads threads over partitions; nothing is published by it.
    return next_ticket_.FetchAdd(n, MemOrder::kRelaxed);
  }
  /** The private partition of `ticket` (wraps around: the count is a power of two). */
  CHI_CROSS_FUN GpuHeap *PartitionFor(u32 ticket) { return Partition(ticket & mask_); }
  /** Partition i: private for i < Partitions(), then spill and large (SharedPartitions()). */
  CHI_CROSS_FUN GpuHeap *Partition(u32 i) { return reinterpret_cast<GpuHeap *>(this + 1) + i; }
  /** The spill partition (small blocks whose thread's partition ran dry), or nullptr. */
  CHI_CROSS_FUN GpuHeap *Spill() { return shared_ != 0 ? Partition(partitions_) : nullptr; }
  /** The large partition (blocks too big for a private one), or nullptr. */
  CHI_CROSS_FUN GpuHeap *Large() { return shared_ != 0 ? Partition(partitions_ + 1) : nullptr; }
  /** How many private partitions the region has (a power of two). */
  CHI_CROSS_FUN u32 Partitions() const { return partitions_; }
  /** How many shared partitions follow them: 0, or 2 (spill, large). */
  CHI_CROSS_FUN u32 SharedPartitions() const { return shared_; }
  /** Bytes the shared partitions' blocks take, as recorded at format time. */
  CHI_CROSS_FUN u64 SharedBytes() const { return shared_bytes_; }
  /** The region's size as formatted. */
  CHI_CROSS_FUN u64 Bytes() const { return bytes_; }
  /** The most one Allocate through any partition can return (when nothing else is live). */
  CHI_CROSS_FUN u64 MaxAllocation() { return Partition(0)->MaxAllocation(); }
  /** Every partition's BytesInUse, shared ones included, summed (a snapshot). */
  CHI_CROSS_FUN u64 BytesInUse() {
    u64 sum = 0;
    for (u32 i = 0; i < partitions_ + shared_; ++i) sum += Partition(i)->BytesInUse();
    return sum;
  }

 private:
  /** Bytes of the shared quarter of a region of `bytes` with n private partitions. */
  CHI_CROSS_FUN static u64 SharedQuarter(u64 bytes, u32 n) {
    return SharedPartitionsFor(n) != 0 ? (bytes / 4) & ~63ull : 0;
  }
  /** Bytes of the spill partition's blocks: a quarter of the shared quarter. */
  CHI_CROSS_FUN static u64 SpillBytes(u64 bytes, u32 n) {
    return (SharedQuarter(bytes, n) / 4) & ~63ull;
  }
  /** Bytes of the large partition's blocks: the rest of the shared quarter. */
  CHI_CROSS_FUN static u64 LargeBytes(u64 bytes, u32 n) {
    return SharedQuarter(bytes, n) - SpillBytes(bytes, n);
  }
  /** Bytes of each of n private partitions' blocks in a region of `bytes` (a multiple of 64). */
  CHI_CROSS_FUN static u64 PartitionBytes(u64 bytes, u32 n) {
    const u64 taken = HeaderBytes(n) + SharedQuarter(bytes, n);
    return bytes > taken ? ((bytes - taken) / n) & ~63ull : 0;
  }

  u64 magic_;         ///< kMagic once formatted
  u64 bytes_;         ///< the size it was formatted for
  u32 partitions_;    ///< private partitions: a power of two
  u32 mask_;          ///< partitions_ - 1
  u32 shared_;        ///< SharedPartitionsFor(partitions_)
  u32 pad0_;
  u64 shared_bytes_;  ///< bytes of the shared partitions' blocks
  u64 reserved_[3];
  Atomic<u32, MemScope::kDevice> next_ticket_;  ///< the next block's first ticket
  u32 pad_[15];
};
static_assert(sizeof(GpuHeapRegion) == 128, "partition headers start 128 bytes in");

}  // namespace chi::gpu
