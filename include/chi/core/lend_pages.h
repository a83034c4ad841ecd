// Lending a buffer's pages to the kernel: memory kept for the next large message or
// payload stays mapped, and writing it again costs nothing, until the kernel needs the
// memory; then it takes the pages back without writing them anywhere (MADV_FREE). A burst
// of huge messages therefore does not pin its memory, and a steady stream of them does not
// fault in and zero every page again.
#pragma once

#include <sys/mman.h>  // madvise(MADV_FREE)
#include <unistd.h>    // sysconf(_SC_PAGESIZE)

#include <cstdint>  // uintptr_t

#include "chi/core/types.h"  // u64

namespace chi {

/**
 * Tells the kernel it may take back the whole pages inside [data, data + bytes) whenever it
 * needs memory; until then they stay mapped, and writing them again costs nothing. A page
 * the kernel took reads as zeros. False when the kernel refused (no MADV_FREE: before
 * Linux 4.5).
 */
inline bool LendPagesToKernel(char *data, u64 bytes) {
  static const u64 page = static_cast<u64>(sysconf(_SC_PAGESIZE));
  const auto lo = (reinterpret_cast<std::uintptr_t>(data) + page - 1) & ~(page - 1);
  const auto hi = (reinterpret_cast<std::uintptr_t>(data) + bytes) & ~(page - 1);
  if (hi <= lo) return true;
  return madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_FREE) == 0;
}

}  // namespace chi
