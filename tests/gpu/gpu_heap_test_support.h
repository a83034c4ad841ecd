// Shared parts of the CHI_GPU_HEAP tests (test_gpu_heap.cc: one partition and the arena;
// test_gpu_heap_region.cc: a region's partitions and launches), where CPU threads play GPU
// threads over plain memory: the region they format and the fill pattern that shows a block
// was never shared. Host code, included by one test file per binary.
#pragma once

#include <doctest/doctest.h>

#include <chi/gpu/gpu_heap.h>

#include <atomic>   // the start signal of a churn
#include <cstdlib>  // aligned_alloc
#include <cstring>  // memset
#include <memory>   // unique_ptr over the region
#include <thread>   // yield while waiting to start
#include <vector>   // drained blocks

namespace gpu_heap_test {

using chi::u32;
using chi::u64;
using chi::gpu::GpuHeap;

/** A 64-byte aligned region filled with garbage (Format must not rely on zeroes). */
inline std::unique_ptr<char, void (*)(void *)> Region(u64 bytes) {
  void *p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  REQUIRE(p != nullptr);
  std::memset(p, 0xA5, bytes);
  return {static_cast<char *>(p), &std::free};
}

/** Writes a pattern naming (owner, round) over a block. */
inline void Fill(void *p, u64 bytes, u32 owner, u32 round) {
  auto *w = static_cast<u32 *>(p);
  for (u64 i = 0; i < bytes / 4; ++i) w[i] = owner * 0x10001u ^ round ^ static_cast<u32>(i);
}

/** True when the block still holds Fill's pattern. */
inline bool Intact(const void *p, u64 bytes, u32 owner, u32 round) {
  const auto *w = static_cast<const u32 *>(p);
  for (u64 i = 0; i < bytes / 4; ++i) {
    if (w[i] != (owner * 0x10001u ^ round ^ static_cast<u32>(i))) return false;
  }
  return true;
}

/** Allocates `bytes` blocks until the heap says no; returns them (bounded by the region). */
inline std::vector<void *> Drain(GpuHeap *h, u64 bytes) {
  std::vector<void *> got;
  while (void *p = h->Allocate(bytes)) {
    got.push_back(p);
    REQUIRE(got.size() < (1u << 24));
  }
  return got;
}

/**
 * Waits for a churn's start signal, yielding: with more threads waiting than CPUs, the thread
 * that starts the rest (and, under ThreadSanitizer, its runtime's locks) must still get a CPU.
 */
inline void AwaitGo(const std::atomic<u32> &go) {
  while (go.load(std::memory_order_acquire) == 0) std::this_thread::yield();
}

}  // namespace gpu_heap_test
