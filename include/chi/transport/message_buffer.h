// Buffers that assemble or encode one message at a time (a stream's reassembly, a large
// request or answer on its way out). Invariant: between messages a buffer is empty; a
// large one keeps its address range, and the emptied buffers of a process keep at most
// WarmMessageBudget() bytes of pages resident between them (memory.warm_message_bytes,
// default kWarmMessageBytes); the rest stay mapped only until the kernel wants them back.
//
// Why: a large message (past a data region, so sent in chunks) needs buffers of its size
// on both ends. Freeing them after each message made the next one fault in and zero every
// page again (four 16 MiB buffers per 16 MiB echo: about two thirds of its round trip on
// the 2-core machine). MADV_FREE keeps the pages while memory is plentiful and lets the
// kernel reclaim them, without writing them anywhere, when it is not: a burst of huge
// messages does not pin their memory. But lending costs a page-table walk and a TLB flush
// per message (a 16 MiB echo took 16.6-17.1 ms lending its four buffers, 13.3-13.7 ms
// without), so buffers within the process's warm budget are kept as they are.
#pragma once

#include <vector>

#include "chi/core/atomic.h"      // the process's warm byte count
#include "chi/core/lend_pages.h"  // LendPagesToKernel
#include "chi/core/types.h"       // u64

namespace chi {

/** Capacity up to which an emptied buffer simply stays as it is (no budget, no system call). */
inline constexpr u64 kWarmBufferBytes = 1ull << 20;

/**
 * The default bytes of larger emptied buffers a process keeps resident: the two buffers of
 * a 64 MiB message (assembly and answer on the runtime, request and answer on a client).
 */
inline constexpr u64 kWarmMessageBytes = 128ull << 20;

/** A message's bytes, and the share of the process's warm budget it holds while empty. */
struct MessageBuffer {
  std::vector<char> bytes;  ///< the message being assembled or encoded
  u64 warm = 0;             ///< budget bytes it holds (its capacity when last kept whole)

  MessageBuffer() = default;
  MessageBuffer(const MessageBuffer &) = delete;
  MessageBuffer &operator=(const MessageBuffer &) = delete;
  inline ~MessageBuffer();
};

namespace detail {

/** Bytes of the warm budget held by emptied buffers in this process. */
inline Atomic<u64> &WarmMessageBytesHeld() {
  static Atomic<u64> held;
  return held;
}

/** The process's warm budget (SetWarmMessageBudget; kWarmMessageBytes until then). */
inline Atomic<u64> &WarmMessageBudgetWord() {
  static Atomic<u64> budget(kWarmMessageBytes);
  return budget;
}

/** Takes `n` bytes of the warm budget; false when they would exceed it. */
inline bool TakeWarm(u64 n) {
  Atomic<u64> &held = WarmMessageBytesHeld();
  // relaxed: counts guarding no other memory; a budget changed meanwhile applies next time.
  const u64 budget = WarmMessageBudgetWord().Load(MemOrder::kRelaxed);
  u64 cur = held.Load(MemOrder::kRelaxed);
  while (n <= budget && cur <= budget - n) {
    if (held.CompareExchange(cur, cur + n, MemOrder::kRelaxed)) return true;
  }
  return false;
}

/** Gives back the budget buffer `b` holds. */
inline void GiveWarm(MessageBuffer *b) {
  if (b->warm == 0) return;
  WarmMessageBytesHeld().FetchSub(b->warm, MemOrder::kRelaxed);  // relaxed: as in TakeWarm
  b->warm = 0;
}

}  // namespace detail

MessageBuffer::~MessageBuffer() { detail::GiveWarm(this); }

/**
 * Sets the bytes of emptied large buffers this process keeps resident (the config key
 * memory.warm_message_bytes; 0 lends every one). Buffers holding more than a lowered
 * budget settle their share again when they are next emptied.
 */
inline void SetWarmMessageBudget(u64 bytes) {
  detail::WarmMessageBudgetWord().Store(bytes, MemOrder::kRelaxed);  // relaxed: a limit
}

/** The bytes of emptied large buffers this process may keep resident. */
inline u64 WarmMessageBudget() {
  return detail::WarmMessageBudgetWord().Load(MemOrder::kRelaxed);  // relaxed: a limit
}

/** The budget bytes emptied buffers of this process hold now (Monitor, tests). */
inline u64 WarmMessageBytes() { return detail::WarmMessageBytesHeld().Load(MemOrder::kRelaxed); }

/**
 * Empties a message buffer for the next message, keeping its capacity. Up to
 * kWarmBufferBytes it stays as it is; a larger one stays resident while the process's warm
 * budget has room for it, else its pages are lent to the kernel (LendPagesToKernel), or it
 * is freed where the kernel cannot take them lazily.
 */
inline void RecycleBuffer(MessageBuffer *b) {
  b->bytes.clear();
  const u64 capacity = b->bytes.capacity();
  if (capacity <= kWarmBufferBytes) return;
  // It grew, was lent last time, or the budget was lowered below what buffers hold:
  // settle its share again.
  if (b->warm != capacity || (b->warm != 0 && WarmMessageBytes() > WarmMessageBudget())) {
    detail::GiveWarm(b);
    if (detail::TakeWarm(capacity)) b->warm = capacity;
  }
  if (b->warm != 0) return;
  if (!LendPagesToKernel(b->bytes.data(), capacity)) std::vector<char>().swap(b->bytes);
}

/** Empties a buffer and frees its memory: its user is gone (a reaped client, a closed connection). */
inline void ReleaseBuffer(MessageBuffer *b) {
  detail::GiveWarm(b);
  std::vector<char>().swap(b->bytes);
}

}  // namespace chi
