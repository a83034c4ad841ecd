// What every memory backend shares: the header at offset 0 of a region and the
// MemoryBackend handle (where the region is mapped here). POSIX shm, malloc, pinned
// and device backends build on it. Invariant: a header's magic is written last, so a
// region whose magic reads right is fully described by the rest of its header.
#pragma once

#include <cstring>      // memcpy, strlen
#include <string_view>  // names

#include "chi/core/atomic.h"             // Atomic: the magic is published with release
#include "chi/core/types.h"              // u32, u64
#include "chi/memory/memory_registry.h"  // MemoryRegistry::UnregisterRange on detach

namespace chi {

/** Which backend made a region (recorded in its header, for diagnostics). */
enum class BackendKind : u32 { kPosixShm = 1, kMalloc = 2, kPinnedShm = 3, kGpuDevice = 4 };

/** What Create does when a segment of that name already exists. */
enum class CreateMode {
  kExclusive,  ///< fail with kAlreadyExists (the default: never clobber silently)
  kReplace,    ///< unlink the stale segment first; processes still attached keep the old one
};

inline constexpr u64 kBackendMagic = 0x47455348494843ull;  // "CHIHSEG" (little endian)
/** Bumped whenever BackendHeader or an allocator's in-segment layout changes. */
inline constexpr u32 kBackendVersion = 1;
/** Data starts one page in: the header fits, and data is page-aligned for any user. */
inline constexpr u64 kBackendDataOffset = 4096;
/** Longest segment name kept (the user part; the OS name adds a per-user prefix). */
inline constexpr u32 kMaxSegmentName = 200;

/** The first bytes of every region. */
struct BackendHeader {
  Atomic<u64> magic_;  // kBackendMagic once the rest is valid (written last)
  u32 version_;        // kBackendVersion
  BackendKind kind_;
  u64 size_;           // whole region in bytes, header included
  u64 data_offset_;    // where data begins (kBackendDataOffset)
};
static_assert(sizeof(BackendHeader) <= kBackendDataOffset, "header must fit before the data");

/**
 * A region mapped into this process: base address, total size and name. Concrete
 * backends (PosixShmBackend, MallocBackend, ...) derive from it; allocators take a
 * MemoryBackend& so they do not care where the bytes came from.
 */
class MemoryBackend {
 public:
  MemoryBackend() { name_[0] = '\0'; }
  MemoryBackend(const MemoryBackend &) = delete;
  MemoryBackend &operator=(const MemoryBackend &) = delete;

  /** True while a region is mapped through this handle. */
  bool IsAttached() const { return base_ != nullptr; }
  /** Start of the region (the header); offsets in ShmPtrs count from here. */
  char *Base() const { return base_; }
  /** Whole region in bytes, header included. */
  u64 Size() const { return size_; }
  /** First byte usable by allocators. */
  char *Data() const { return base_ == nullptr ? nullptr : base_ + kBackendDataOffset; }
  /** Bytes usable by allocators. */
  u64 DataSize() const { return size_ > kBackendDataOffset ? size_ - kBackendDataOffset : 0; }
  /** The header (host-addressable for every backend except device memory). */
  BackendHeader *Header() const { return reinterpret_cast<BackendHeader *>(base_); }
  /** The name given at Create/Attach (for messages). */
  const char *Name() const { return name_; }

 protected:
  ~MemoryBackend() = default;

  /** Remembers a newly mapped region. */
  void SetRegion(char *base, u64 size, std::string_view name) {
    base_ = base;
    size_ = size;
    size_t n = name.size() < kMaxSegmentName ? name.size() : kMaxSegmentName;
    std::memcpy(name_, name.data(), n);
    name_[n] = '\0';
  }

  /** Forgets the region, and every allocator registered inside it. */
  void ClearRegion() {
    if (base_ != nullptr) MemoryRegistry::Get().UnregisterRange(base_, size_);
    base_ = nullptr;
    size_ = 0;
  }

  /** Fills in a fresh header; the magic goes last so attachers never see half of it. */
  static void WriteHeader(BackendHeader *h, BackendKind kind, u64 size) {
    h->version_ = kBackendVersion;
    h->kind_ = kind;
    h->size_ = size;
    h->data_offset_ = kBackendDataOffset;
    h->magic_.Store(kBackendMagic, MemOrder::kRelease);  // publishes the fields above
  }

  /** Whole region size for `data_size` usable bytes, rounded up to whole pages. */
  static u64 RegionSize(u64 data_size) {
    constexpr u64 kPage = 4096;
    return (kBackendDataOffset + data_size + kPage - 1) / kPage * kPage;
  }

 private:
  char *base_ = nullptr;
  u64 size_ = 0;
  char name_[kMaxSegmentName + 1];
};

}  // namespace chi
