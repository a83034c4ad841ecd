// Sizing helpers shared by the rings placed in caller-provided regions (SpscRing,
// MpscRing, TaskQueue, CopySpace). Invariant: capacities are powers of two, so a
// position maps to its slot with a mask, and regions start on a cache line.
#pragma once

#include "chi/core/macros.h"  // CHI_CROSS_FUN, kCacheLine
#include "chi/core/types.h"   // u32, u64, size_t

namespace chi {

/** The largest ring capacity (slots or bytes) the rings accept. */
inline constexpr u32 kMaxRingCapacity = 1u << 31;

/**
 * Rounds a requested capacity up to a power of two in [1, kMaxRingCapacity]. Loop-free
 * (every bit below the highest of n - 1 set, plus one): ring geometry is recomputed on
 * hot paths (a slot's answer stream is found from the ring size at every answer).
 */
CHI_CROSS_FUN constexpr u32 RoundUpPow2(u32 n) {
  if (n <= 1) return 1;
  if (n > kMaxRingCapacity) return kMaxRingCapacity;
  u32 p = n - 1;
  p |= p >> 1;
  p |= p >> 2;
  p |= p >> 4;
  p |= p >> 8;
  p |= p >> 16;
  return p + 1;
}

/** Rounds n up to a multiple of `align` (a power of two). */
CHI_CROSS_FUN constexpr u64 RoundUpTo(u64 n, u64 align) { return (n + align - 1) & ~(align - 1); }

/** True when a region may hold a ring: non-null and cache-line aligned. */
CHI_CROSS_FUN inline bool IsRingAligned(const void *mem) {
  return mem != nullptr && (reinterpret_cast<std::uintptr_t>(mem) & (kCacheLine - 1)) == 0;
}

}  // namespace chi
