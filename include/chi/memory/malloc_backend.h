// Private (process-local) memory with the same interface as the shared backends, used
// by the embedded runtime where nothing else needs to attach. Invariant: the region has
// the same header and page-aligned data as a POSIX segment, so allocators cannot tell.
#pragma once

#include <cstdlib>      // aligned_alloc, free
#include <string>       // std::string for messages
#include <string_view>  // names

#include "chi/core/status.h"     // Status, ErrorCode
#include "chi/core/types.h"      // u64
#include "chi/memory/backend.h"  // MemoryBackend, CreateMode

namespace chi {

/** A heap region laid out like a segment; only this process can use it. */
class MallocBackend : public MemoryBackend {
 public:
  MallocBackend() = default;
  /** Frees the region. */
  ~MallocBackend() { Detach(); }

  /** Allocates at least `data_size` usable bytes; `name` is only kept for messages. */
  Status Create(std::string_view name, u64 data_size,
                CreateMode /*mode*/ = CreateMode::kExclusive) {
    if (IsAttached()) {
      return Status::Errorf(ErrorCode::kInvalidArgument,
                            "cannot create region '%.64s': this handle already holds '%s'",
                            std::string(name).c_str(), Name());
    }
    if (data_size == 0 || data_size > kMaxDataSize) {
      return Status::Errorf(ErrorCode::kInvalidArgument,
                            "region '%.64s': size %llu is outside 1..%llu bytes",
                            std::string(name).c_str(), static_cast<unsigned long long>(data_size),
                            static_cast<unsigned long long>(kMaxDataSize));
    }
    const u64 size = RegionSize(data_size);
    void *base = std::aligned_alloc(kBackendDataOffset, size);
    if (base == nullptr) {
      return Status::Errorf(ErrorCode::kOutOfMemory, "region '%.64s': cannot allocate %llu bytes",
                            std::string(name).c_str(), static_cast<unsigned long long>(size));
    }
    WriteHeader(static_cast<BackendHeader *>(base), BackendKind::kMalloc, size);
    SetRegion(static_cast<char *>(base), size, name);
    return Status::Ok();
  }

  /** Private memory has no name another process could open. */
  Status Attach(std::string_view name) {
    return Status::Errorf(ErrorCode::kUnsupported,
                          "cannot attach '%.64s': malloc regions are private to their process",
                          std::string(name).c_str());
  }

  /** Frees the region (and forgets allocators registered inside it). Idempotent. */
  void Detach() {
    if (!IsAttached()) return;
    char *base = Base();
    ClearRegion();
    std::free(base);
  }

  /** Same as Detach: nothing outlives the process. */
  Status Destroy() {
    Detach();
    return Status::Ok();
  }

 private:
  static constexpr u64 kMaxDataSize = 1ull << 46;
};

}  // namespace chi
