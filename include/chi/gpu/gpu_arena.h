// GpuArena: one GPU thread's bump allocator (the seed's per-thread ArenaAllocator) for
// scratch that lives as long as one task: Allocate moves a cursor, Reset after the task
// gives everything back at once. Its buffer usually comes from the thread's CHI_GPU_HEAP
// (FromHeap / ReturnTo). Invariant: one thread owns an arena; nothing here is atomic.
#pragma once

#include "chi/core/macros.h"  // CHI_CROSS_FUN
#include "chi/core/types.h"   // u64
#include "chi/gpu/gpu_heap.h"  // GpuHeap: where FromHeap takes the buffer

namespace chi::gpu {

/** A bump allocator over a caller-owned buffer (see the file comment). */
class GpuArena {
 public:
  /** An empty arena: every Allocate returns nullptr. */
  GpuArena() = default;
  /** An arena over [base, base + bytes). */
  CHI_CROSS_FUN GpuArena(void *base, u64 bytes) : base_(static_cast<char *>(base)), bytes_(bytes) {
    if (base_ == nullptr) bytes_ = 0;
  }

  /** An arena over `bytes` taken from `heap` (empty when the heap has no room). */
  CHI_CROSS_FUN static GpuArena FromHeap(GpuHeap *heap, u64 bytes) {
    return heap == nullptr ? GpuArena() : GpuArena(heap->Allocate(bytes), bytes);
  }
  /**
   * Gives a FromHeap arena's buffer back through `heap`, any partition of the same region
   * (the block knows its owner), even in a later kernel than the one that took it.
   */
  CHI_CROSS_FUN void ReturnTo(GpuHeap *heap) {
    if (heap != nullptr && base_ != nullptr) heap->Free(base_);
    base_ = nullptr;
    bytes_ = used_ = 0;
  }

  /**
   * `bytes` aligned to `align` (a power of two, 16 unless said), or nullptr when the rest
   * of the buffer is too small: an arena never grows.
   */
  CHI_CROSS_FUN void *Allocate(u64 bytes, u64 align = 16) {
    const u64 base = reinterpret_cast<u64>(base_);
    const u64 at = (base + used_ + align - 1) & ~(align - 1);
    if (base_ == nullptr || at + bytes > base + bytes_ || at + bytes < at) return nullptr;
    used_ = at + bytes - base;
    return reinterpret_cast<void *>(at);
  }

  /** Forgets every allocation (after the task that used them completed). */
  CHI_CROSS_FUN void Reset() { used_ = 0; }
  /** Bytes taken since the last Reset (alignment padding included). */
  CHI_CROSS_FUN u64 Used() const { return used_; }
  /** The buffer's size. */
  CHI_CROSS_FUN u64 Capacity() const { return bytes_; }

 private:
  char *base_ = nullptr;
  u64 bytes_ = 0;
  u64 used_ = 0;
};

}  // namespace chi::gpu
