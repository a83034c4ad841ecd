// Offset pointers: AllocatorId names an allocator, ShmPtr<T> is {allocator, byte offset}.
// Used by every structure that lives in shared, pinned or device memory, where raw
// pointers mean nothing to the other side. Invariant: an offset is counted from the
// base of the segment holding the allocator, so it is the same in every process.
#pragma once

#include "chi/core/macros.h"  // CHI_CROSS_FUN
#include "chi/core/types.h"   // u32, u64

namespace chi {

/** Names one allocator across processes and devices. {0,0} is the null id. */
struct AllocatorId {
  u32 major_ = 0;
  u32 minor_ = 0;

  constexpr AllocatorId() = default;
  CHI_CROSS_FUN constexpr AllocatorId(u32 major, u32 minor) : major_(major), minor_(minor) {}

  /** The null id: "no allocator". */
  CHI_CROSS_FUN static constexpr AllocatorId GetNull() { return AllocatorId(); }
  CHI_CROSS_FUN constexpr bool IsNull() const { return major_ == 0 && minor_ == 0; }
  /** Packs into one integer (hash keys; never 0 for a non-null id). */
  CHI_CROSS_FUN constexpr u64 ToU64() const { return (static_cast<u64>(major_) << 32) | minor_; }

  CHI_CROSS_FUN constexpr bool operator==(const AllocatorId &o) const {
    return major_ == o.major_ && minor_ == o.minor_;
  }
  CHI_CROSS_FUN constexpr bool operator!=(const AllocatorId &o) const { return !(*this == o); }

  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    ar(major_, minor_);
  }
};

/**
 * A pointer that survives crossing address spaces: which allocator, and the byte
 * offset from its segment's base. Null when the allocator id is null.
 */
template <typename T>
struct ShmPtr {
  AllocatorId alloc_id_;
  u64 off_ = 0;

  constexpr ShmPtr() = default;
  CHI_CROSS_FUN constexpr ShmPtr(AllocatorId id, u64 off) : alloc_id_(id), off_(off) {}

  /** The null pointer (what a failed allocation returns). */
  CHI_CROSS_FUN static constexpr ShmPtr GetNull() { return ShmPtr(); }
  CHI_CROSS_FUN constexpr bool IsNull() const { return alloc_id_.IsNull(); }

  /** The same location viewed as another type (no adjustment, like static_cast on void*). */
  template <typename U>
  CHI_CROSS_FUN constexpr ShmPtr<U> Cast() const {
    return ShmPtr<U>(alloc_id_, off_);
  }

  CHI_CROSS_FUN constexpr bool operator==(const ShmPtr &o) const {
    return alloc_id_ == o.alloc_id_ && off_ == o.off_;
  }
  CHI_CROSS_FUN constexpr bool operator!=(const ShmPtr &o) const { return !(*this == o); }

  /** Flat on the wire: major, minor, offset. */
  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    ar(alloc_id_.major_, alloc_id_.minor_, off_);
  }
};

}  // namespace chi
