// What every in-segment allocator shares: the AllocatorHeader it starts with, a few
// host/device bit helpers, and CreateAllocator/AttachAllocator, which place an allocator
// at the start of a backend's data and register it. Invariant: allocator state holds
// offsets only, and the segment base is recovered from the allocator's own address.
#pragma once

#include <new>  // placement new

#include "chi/core/atomic.h"             // Atomic: the magic is published with release
#include "chi/core/macros.h"             // CHI_CROSS_FUN
#include "chi/core/status.h"             // Status
#include "chi/core/types.h"              // u32, u64
#include "chi/memory/backend.h"          // MemoryBackend, kBackendVersion
#include "chi/memory/memory_registry.h"  // MemoryRegistry::Register
#include "chi/memory/shm_ptr.h"          // AllocatorId

namespace chi {

/** Which allocator a header belongs to (checked on attach). */
enum class AllocatorKind : u32 { kArena = 1, kSizeClass = 2 };

inline constexpr u64 kAllocatorMagic = 0x434f4c4c41494843ull;  // "CHIALLOC" (little endian)

/** The first member of every in-segment allocator. All positions are segment offsets. */
struct AllocatorHeader {
  Atomic<u64> magic_;  // kAllocatorMagic once initialised (written last)
  u32 version_;        // kBackendVersion at initialisation
  AllocatorKind kind_;
  AllocatorId id_;
  u64 self_offset_;  // where this header lives, from the segment base
  u64 begin_;        // managed bytes are [begin_, end_)
  u64 end_;

  /** Base of the segment as mapped in the calling process (or device). */
  CHI_CROSS_FUN char *SegmentBase() const {
    return const_cast<char *>(reinterpret_cast<const char *>(this)) - self_offset_;
  }

  /** Records placement; the caller publishes with Publish() once its own state is ready. */
  CHI_CROSS_FUN void Fill(AllocatorKind kind, AllocatorId id, char *segment_base, u64 begin,
                          u64 end) {
    version_ = kBackendVersion;
    kind_ = kind;
    id_ = id;
    self_offset_ = static_cast<u64>(reinterpret_cast<char *>(this) - segment_base);
    begin_ = begin;
    end_ = end;
  }

  /** Marks the allocator usable; attachers that read the magic see all state before it. */
  CHI_CROSS_FUN void Publish() { magic_.Store(kAllocatorMagic, MemOrder::kRelease); }
};

namespace detail {

/** Rounds x up to a multiple of a (a power of two). */
CHI_CROSS_FUN constexpr u64 AlignUp(u64 x, u64 a) { return (x + a - 1) & ~(a - 1); }

/** floor(log2(x)) for x > 0, on host and device. */
CHI_CROSS_FUN inline u32 Log2Floor(u64 x) {
#if CHI_IS_GPU && CHI_GPU_CUDA
  return 63u - static_cast<u32>(__clzll(static_cast<long long>(x)));
#else
  return 63u - static_cast<u32>(__builtin_clzll(x));
#endif
}

}  // namespace detail

/**
 * Constructs an AllocT at the start of `backend`'s data, managing the rest of the
 * region, and registers it under `id` so ShmPtrs from it resolve in this process.
 * AllocT provides Init(id, segment_base, end_offset) -> bool and Header(). Host-
 * addressable backends only: in GpuDeviceBackend memory, run Init from a kernel instead.
 */
template <typename AllocT>
Status CreateAllocator(MemoryBackend &backend, AllocatorId id, AllocT **out) {
  *out = nullptr;
  if (!backend.IsAttached() || id.IsNull()) {
    return Status::Errorf(ErrorCode::kInvalidArgument,
                          "cannot create allocator %u.%u in '%s': %s", id.major_, id.minor_,
                          backend.Name(), id.IsNull() ? "null id" : "backend not attached");
  }
  AllocT *alloc = new (backend.Data()) AllocT();
  if (!alloc->Init(id, backend.Base(), backend.Size())) {
    return Status::Errorf(ErrorCode::kTooLarge,
                          "segment '%s' (%llu bytes) does not fit allocator %u.%u", backend.Name(),
                          static_cast<unsigned long long>(backend.Size()), id.major_, id.minor_);
  }
  if (Status st = MemoryRegistry::Get().Register(id, backend.Base(), backend.Size()); !st.ok()) {
    return st;
  }
  *out = alloc;
  return Status::Ok();
}

/**
 * Finds the AllocT that CreateAllocator placed in `backend` (mapped by another process,
 * say), checks its header and registers it here.
 */
template <typename AllocT>
Status AttachAllocator(MemoryBackend &backend, AllocT **out) {
  *out = nullptr;
  if (!backend.IsAttached() || backend.Size() < kBackendDataOffset + sizeof(AllocT)) {
    return Status::Errorf(ErrorCode::kInvalidArgument,
                          "no allocator to attach in '%s': backend not attached or too small",
                          backend.Name());
  }
  AllocT *alloc = reinterpret_cast<AllocT *>(backend.Data());
  const AllocatorHeader &h = alloc->Header();
  if (h.magic_.Load(MemOrder::kAcquire) != kAllocatorMagic) {  // pairs with Publish()
    return Status::Errorf(ErrorCode::kNotFound, "segment '%s' holds no initialised allocator",
                          backend.Name());
  }
  if (h.version_ != kBackendVersion || h.kind_ != AllocT::kKind) {
    return Status::Errorf(ErrorCode::kVersionMismatch,
                          "segment '%s': allocator kind %u version %u, expected kind %u version %u",
                          backend.Name(), static_cast<u32>(h.kind_), h.version_,
                          static_cast<u32>(AllocT::kKind), kBackendVersion);
  }
  if (h.self_offset_ != kBackendDataOffset || h.end_ > backend.Size() || h.begin_ > h.end_) {
    return Status::Errorf(ErrorCode::kSizeMismatch,
                          "segment '%s': allocator region [%llu, %llu) does not fit %llu bytes",
                          backend.Name(), static_cast<unsigned long long>(h.begin_),
                          static_cast<unsigned long long>(h.end_),
                          static_cast<unsigned long long>(backend.Size()));
  }
  if (Status st = MemoryRegistry::Get().Register(h.id_, backend.Base(), backend.Size());
      !st.ok()) {
    return st;
  }
  *out = alloc;
  return Status::Ok();
}

}  // namespace chi
