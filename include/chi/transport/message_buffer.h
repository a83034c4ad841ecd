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

#include <vector>

#include "chi/core/lend_pages.h"  // LendPagesToKernel
#include "chi/core/types.h"       // u64

namespace chi {

/** Capacity up to which an emptied buffer simply stays as it is (no system call). */
inline constexpr u64 kWarmBufferBytes = 1ull << 20;

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
