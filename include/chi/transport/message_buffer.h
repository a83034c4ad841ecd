// Buffers that assemble or encode one message at a time (a stream's reassembly, a large
// request or answer on its way out). Invariant: between messages a buffer is empty; a
// large one keeps its address range, and its pages stay mapped only until the kernel wants
// them back.
//
// Why: a large message (past a data region, so sent in chunks) needs buffers of its size
// on both ends. Freeing them after each message made the next one fault in and zero every
// page again (four 16 MiB buffers per 16 MiB echo: about two thirds of its round trip on
// the 2-core machine). MADV_FREE keeps the pages for the next message at no cost while
// memory is plentiful, and lets the kernel reclaim them, without writing them anywhere,
// when it is not: a burst of huge messages does not pin their memory.
#pragma once

#include <sys/mman.h>  // madvise(MADV_FREE)
#include <unistd.h>    // sysconf(_SC_PAGESIZE)

#include <cstdint>  // uintptr_t
#include <vector>

#include "chi/core/types.h"  // u64

namespace chi {

/** Capacity up to which an emptied buffer simply stays as it is (no system call). */
inline constexpr u64 kWarmBufferBytes = 1ull << 20;

/**
 * Tells the kernel it may take back the whole pages inside [data, data + bytes) whenever it
 * needs memory; until then they stay mapped, and writing them again costs nothing. False
 * when the kernel refused (no MADV_FREE: before Linux 4.5).
 */
inline bool LendPagesToKernel(char *data, u64 bytes) {
  static const u64 page = static_cast<u64>(sysconf(_SC_PAGESIZE));
  const auto lo = (reinterpret_cast<std::uintptr_t>(data) + page - 1) & ~(page - 1);
  const auto hi = (reinterpret_cast<std::uintptr_t>(data) + bytes) & ~(page - 1);
  if (hi <= lo) return true;
  return madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_FREE) == 0;
}

/**
 * Empties a message buffer for the next message. Up to kWarmBufferBytes it stays as it
 * is; a larger one keeps its capacity with its pages lent to the kernel
 * (LendPagesToKernel), or is freed where the kernel cannot take them lazily.
 */
inline void RecycleBuffer(std::vector<char> *v) {
  v->clear();
  if (v->capacity() > kWarmBufferBytes && !LendPagesToKernel(v->data(), v->capacity())) {
    std::vector<char>().swap(*v);
  }
}

/** Empties a buffer and frees its memory: its user is gone (a reaped client, a closed connection). */
inline void ReleaseBuffer(std::vector<char> *v) { std::vector<char>().swap(*v); }

}  // namespace chi
