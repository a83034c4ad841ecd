// ArenaAllocator: bump allocation inside a segment, for short-lived or per-thread scratch
// (task staging, per-block GPU scratch). Lives in the segment; usable from many processes
// and from device code at once. Invariant: head_ only grows between Reset() calls, so a
// returned range is never handed out twice until the owner resets the arena.
#pragma once

#include <new>  // placement new in New<T>

#include "chi/core/atomic.h"              // Atomic, MemOrder
#include "chi/core/macros.h"              // CHI_CROSS_FUN
#include "chi/core/types.h"               // u64
#include "chi/memory/allocator_base.h"    // AllocatorHeader, AlignUp
#include "chi/memory/full_ptr.h"          // FullPtr
#include "chi/memory/shm_ptr.h"           // ShmPtr, AllocatorId

namespace chi {

/**
 * A lock-free bump allocator: one fetch_add per allocation, no free, Reset() to reuse.
 * A failed allocation tries to undo its bump; under contention the arena may then stay
 * full until Reset() (arenas are sized for their users, so this is the rare case).
 */
class ArenaAllocator {
 public:
  static constexpr AllocatorKind kKind = AllocatorKind::kArena;
  /** Every allocation is a multiple of this and aligned to it. */
  static constexpr u64 kGranule = 16;
  /** Largest alignment honoured (segment bases are page-aligned). */
  static constexpr u64 kMaxAlign = 4096;

  /**
   * Lays the arena out at `this` (inside the segment at `segment_base`), managing the
   * bytes after it up to segment offset `end_offset`. False when nothing would be left.
   */
  CHI_CROSS_FUN bool Init(AllocatorId id, char *segment_base, u64 end_offset) {
    u64 self = static_cast<u64>(reinterpret_cast<char *>(this) - segment_base);
    u64 begin = detail::AlignUp(self + sizeof(ArenaAllocator), kCacheLine);
    if (id.IsNull() || begin >= end_offset) return false;
    hdr_.Fill(kKind, id, segment_base, begin, end_offset);
    head_.Store(begin, MemOrder::kRelaxed);  // published by Publish()'s release
    hdr_.Publish();
    return true;
  }

  /** Allocates `size` bytes aligned to `align` (power of two); null when full. */
  CHI_CROSS_FUN ShmPtr<void> Allocate(u64 size, u64 align = kGranule) {
    if (align == 0 || (align & (align - 1)) != 0 || align > kMaxAlign) return {};
    if (align < kGranule) align = kGranule;
    if (size > hdr_.end_ - hdr_.begin_) return {};
    // head_ stays a multiple of kGranule, so at most align - kGranule bytes go to padding.
    const u64 bump = detail::AlignUp(size == 0 ? 1 : size, kGranule) + (align - kGranule);
    // Relaxed: the bytes handed out carry no data from other allocators to synchronise with.
    const u64 old = head_.FetchAdd(bump, MemOrder::kRelaxed);
    if (old + bump > hdr_.end_) {
      u64 expected = old + bump;
      head_.CompareExchange(expected, old, MemOrder::kRelaxed);  // undo if nobody followed
      return {};
    }
    return ShmPtr<void>(hdr_.id_, detail::AlignUp(old, align));
  }

  /** Allocates and returns both forms of the pointer. */
  CHI_CROSS_FUN FullPtr<void> AllocateFull(u64 size, u64 align = kGranule) {
    ShmPtr<void> p = Allocate(size, align);
    return FullPtr<void>(ToPointer(p), p);
  }

  /** Allocates and constructs a T in place (there is no Delete: Reset() reclaims). */
  template <typename T, typename... Args>
  CHI_CROSS_FUN FullPtr<T> New(Args &&...args) {
    ShmPtr<void> p = Allocate(sizeof(T), alignof(T) < kGranule ? kGranule : alignof(T));
    if (p.IsNull()) return {};
    T *obj = new (ToPointer(p)) T(static_cast<Args &&>(args)...);
    return FullPtr<T>(obj, p.Cast<T>());
  }

  /** Forgets every allocation. Only the owner may call it, with no allocation in flight. */
  CHI_CROSS_FUN void Reset() { head_.Store(hdr_.begin_, MemOrder::kRelaxed); }

  /** Bytes handed out (padding included). */
  CHI_CROSS_FUN u64 UsedBytes() const {
    u64 h = head_.Load(MemOrder::kRelaxed);  // a statistic: no ordering needed
    return (h < hdr_.end_ ? h : hdr_.end_) - hdr_.begin_;
  }
  /** Bytes still available. */
  CHI_CROSS_FUN u64 FreeBytes() const { return Capacity() - UsedBytes(); }
  /** Bytes managed in all. */
  CHI_CROSS_FUN u64 Capacity() const { return hdr_.end_ - hdr_.begin_; }

  /** Local pointer for p (no registry lookup: the arena knows its own base). */
  template <typename T>
  CHI_CROSS_FUN T *ToPointer(ShmPtr<T> p) const {
    return p.IsNull() ? nullptr : reinterpret_cast<T *>(hdr_.SegmentBase() + p.off_);
  }
  /** ShmPtr for a pointer this arena returned. */
  template <typename T>
  CHI_CROSS_FUN ShmPtr<T> ToShmPtr(const T *ptr) const {
    if (ptr == nullptr) return {};
    return ShmPtr<T>(hdr_.id_, static_cast<u64>(reinterpret_cast<const char *>(ptr) -
                                                hdr_.SegmentBase()));
  }

  CHI_CROSS_FUN AllocatorId Id() const { return hdr_.id_; }
  CHI_CROSS_FUN const AllocatorHeader &Header() const { return hdr_; }

 private:
  AllocatorHeader hdr_;
  alignas(kCacheLine) Atomic<u64> head_;  // next free offset; own line: every allocation hits it
};

}  // namespace chi
