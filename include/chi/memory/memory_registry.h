// The per-process map from AllocatorId to where that allocator's segment is mapped here.
// Used to turn a ShmPtr received from another process into a local pointer and back.
// Invariant: lookups never lock and never crash; an unknown id or an offset past the
// registered segment resolves to null. Host only (device code resolves through its allocator).
#pragma once

#include <cstdint>  // uintptr_t
#include <mutex>    // std::mutex: serialises the rare Register/Unregister calls

#include "chi/core/atomic.h"      // Atomic, MemOrder
#include "chi/core/fork_lock.h"   // HoldAcrossFork for the writer lock
#include "chi/core/status.h"      // Status
#include "chi/core/types.h"       // u32, u64
#include "chi/memory/shm_ptr.h"   // AllocatorId, ShmPtr

namespace chi {

/**
 * A fixed-size open-addressing table (kCapacity slots, linear probing). A slot, once
 * keyed, never becomes empty again, so probe chains stay intact; unregistering leaves a
 * tombstone (base 0) that a later registration may re-key.
 */
class MemoryRegistry {
 public:
  static constexpr u32 kCapacity = 256;

  /** The process-wide registry (constant-initialised: no guard on the hot path). */
  static MemoryRegistry &Get() {
    static MemoryRegistry registry;
    return registry;
  }

  constexpr MemoryRegistry() = default;
  MemoryRegistry(const MemoryRegistry &) = delete;
  MemoryRegistry &operator=(const MemoryRegistry &) = delete;

  /**
   * Records that allocator `id` resolves offsets against `base`, valid for `size` bytes.
   * Re-registering an id replaces its mapping. Fails on a null id or a full table.
   */
  Status Register(AllocatorId id, void *base, u64 size) {
    if (id.IsNull() || base == nullptr || size == 0) {
      return Status::Errorf(ErrorCode::kInvalidArgument,
                            "cannot register allocator %u.%u with base %p and size %llu",
                            id.major_, id.minor_, base, static_cast<unsigned long long>(size));
    }
    std::lock_guard<std::mutex> lock(writer_mutex_);
    const u64 key = id.ToU64();
    Slot *target = nullptr;
    for (u32 i = 0; i < kCapacity; ++i) {
      Slot &s = slots_[(Hash(key) + i) % kCapacity];
      u64 k = s.key_.Load(MemOrder::kRelaxed);  // writers are serialised by the mutex
      if (k == key) {
        target = &s;
        break;
      }
      if (target == nullptr && (k == 0 || s.base_.Load(MemOrder::kRelaxed) == 0)) target = &s;
      if (k == 0) break;  // end of the chain: the id is not present
    }
    if (target == nullptr) {
      return Status::Errorf(ErrorCode::kOutOfMemory,
                            "memory registry is full (%u allocators); cannot add %u.%u",
                            kCapacity, id.major_, id.minor_);
    }
    // Key, then size, then base with release: a reader that sees the new base
    // (acquire) also sees the new key and size, which is what its re-check relies on.
    target->key_.Store(key, MemOrder::kRelaxed);
    target->size_.Store(size, MemOrder::kRelaxed);
    target->base_.Store(reinterpret_cast<uintptr_t>(base), MemOrder::kRelease);
    return Status::Ok();
  }

  /** Forgets allocator `id` (no-op when unknown). */
  void Unregister(AllocatorId id) {
    std::lock_guard<std::mutex> lock(writer_mutex_);
    // Relaxed: a tombstone publishes no data; readers just stop resolving the id.
    if (Slot *s = FindSlot(id.ToU64())) s->base_.Store(0, MemOrder::kRelaxed);
  }

  /** Forgets every allocator whose base lies in [base, base+size): used when unmapping. */
  void UnregisterRange(const void *base, u64 size) {
    std::lock_guard<std::mutex> lock(writer_mutex_);
    const uintptr_t lo = reinterpret_cast<uintptr_t>(base);
    for (Slot &s : slots_) {
      uintptr_t b = s.base_.Load(MemOrder::kRelaxed);  // writers are serialised
      if (b != 0 && b >= lo && b - lo < size) s.base_.Store(0, MemOrder::kRelaxed);  // as above
    }
  }

  /** Local base address of allocator `id`, or null when unknown here. O(1), lock-free. */
  char *Base(AllocatorId id) const {
    u64 size = 0;
    return Lookup(id, &size);
  }

  /** Local pointer for p; null for a null pointer, an unknown allocator or a bad offset. */
  template <typename T>
  T *Resolve(ShmPtr<T> p) const {
    if (p.IsNull()) return nullptr;
    u64 size = 0;
    char *base = Lookup(p.alloc_id_, &size);
    if (base == nullptr || p.off_ >= size) return nullptr;
    return reinterpret_cast<T *>(base + p.off_);
  }

  /** ShmPtr for a local pointer inside a registered segment (scans: not for hot paths). */
  template <typename T>
  ShmPtr<T> FindShmPtr(const T *ptr) const {
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    for (const Slot &s : slots_) {
      const u64 k = s.key_.Load(MemOrder::kRelaxed);  // re-checked below, as in Lookup
      const uintptr_t b = s.base_.Load(MemOrder::kAcquire);  // pairs with Register's release
      if (b == 0 || p < b || p - b >= s.size_.Load(MemOrder::kRelaxed)) continue;
      if (s.key_.Load(MemOrder::kRelaxed) != k) continue;  // re-keyed meanwhile
      return ShmPtr<T>(AllocatorId(static_cast<u32>(k >> 32), static_cast<u32>(k)), p - b);
    }
    return ShmPtr<T>::GetNull();
  }

 private:
  /** One table entry, alone on its cache line so readers of one slot share nothing else. */
  struct alignas(kCacheLine) Slot {
    Atomic<u64> key_;        // AllocatorId::ToU64(); 0 = never used
    Atomic<uintptr_t> base_;  // 0 = tombstone (unregistered)
    Atomic<u64> size_;
  };

  /** Fibonacci hashing: spreads consecutive ids over the table. */
  static constexpr u32 Hash(u64 key) {
    return static_cast<u32>((key * 0x9E3779B97F4A7C15ull) >> 56) % kCapacity;
  }

  /** The slot keyed `key`, or null (writers only, under the mutex). */
  Slot *FindSlot(u64 key) {
    for (u32 i = 0; i < kCapacity; ++i) {
      Slot &s = slots_[(Hash(key) + i) % kCapacity];
      u64 k = s.key_.Load(MemOrder::kRelaxed);
      if (k == key) return &s;
      if (k == 0) return nullptr;
    }
    return nullptr;
  }

  /** Lock-free read of one id's base and size. */
  char *Lookup(AllocatorId id, u64 *size) const {
    if (id.IsNull()) return nullptr;
    const u64 key = id.ToU64();
    for (u32 i = 0; i < kCapacity; ++i) {
      const Slot &s = slots_[(Hash(key) + i) % kCapacity];
      // Relaxed: the acquire that matters is on base_, and the key is re-checked after it.
      u64 k = s.key_.Load(MemOrder::kRelaxed);
      if (k == 0) return nullptr;
      if (k != key) continue;
      uintptr_t b = s.base_.Load(MemOrder::kAcquire);  // pairs with Register's release
      *size = s.size_.Load(MemOrder::kRelaxed);  // ordered after the base load above
      // Re-check the key: a tombstone re-keyed by another id between our loads is not ours.
      if (b == 0 || s.key_.Load(MemOrder::kRelaxed) != key) return nullptr;
      return reinterpret_cast<char *>(b);
    }
    return nullptr;
  }

  Slot slots_[kCapacity];
  std::mutex writer_mutex_;

  /** The registry's writer lock, for HoldAcrossFork. */
  static std::mutex &WriterMutex() { return Get().writer_mutex_; }
  /** A child forked while another thread registered a segment can still register its own. */
  static inline const bool held_across_fork_ = (HoldAcrossFork<&WriterMutex>(), true);
};

}  // namespace chi
