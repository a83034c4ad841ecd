// FullPtr<T>: a local pointer and its ShmPtr carried together, so code can both use the
// object and hand its location to another process without a second lookup.
// Invariant: ptr_ and shm_ name the same bytes (or are both null).
#pragma once

#include "chi/core/macros.h"              // CHI_CROSS_FUN
#include "chi/memory/memory_registry.h"   // MemoryRegistry: host-side conversions
#include "chi/memory/shm_ptr.h"           // ShmPtr

namespace chi {

/** A pointer usable here (ptr_) together with its process-independent form (shm_). */
template <typename T>
struct FullPtr {
  T *ptr_ = nullptr;
  ShmPtr<T> shm_;

  constexpr FullPtr() = default;
  /** Both halves already known (what allocators return). */
  CHI_CROSS_FUN constexpr FullPtr(T *ptr, ShmPtr<T> shm) : ptr_(ptr), shm_(shm) {}

  /** Resolves a ShmPtr through this process's registry; null if its allocator is unknown. */
  explicit FullPtr(ShmPtr<T> shm) : ptr_(MemoryRegistry::Get().Resolve(shm)), shm_(shm) {
    if (ptr_ == nullptr) shm_ = ShmPtr<T>::GetNull();
  }

  /** Finds which registered segment holds ptr; null if none does (scans the registry). */
  explicit FullPtr(T *ptr) : ptr_(ptr), shm_(MemoryRegistry::Get().FindShmPtr(ptr)) {
    if (shm_.IsNull()) ptr_ = nullptr;
  }

  CHI_CROSS_FUN static constexpr FullPtr GetNull() { return FullPtr(); }
  CHI_CROSS_FUN constexpr bool IsNull() const { return ptr_ == nullptr; }

  /** The same location viewed as another type. */
  template <typename U>
  CHI_CROSS_FUN FullPtr<U> Cast() const {
    return FullPtr<U>(reinterpret_cast<U *>(ptr_), shm_.template Cast<U>());
  }

  CHI_CROSS_FUN T *operator->() const { return ptr_; }
  /** Dereference (a template so that FullPtr<void> stays well-formed). */
  template <typename U = T>
  CHI_CROSS_FUN U &operator*() const {
    return *ptr_;
  }
};

}  // namespace chi
