// Answers of the ZeroMQ server (zmq_server.h): the slot that carries one remote
// task's answer (its client's routing id and the encoded bytes), a bounded pool of
// slots, and the lock-free list on which answers wait for the network worker.
// Invariant: a slot has one owner at a time: the pool (under the server's lock), a
// dispatched task (its transport cookie), or the list.
#pragma once

#include <string>  // routing ids
#include <vector>  // encoded answers, the pool

#include "chi/core/atomic.h"  // the list head, the held-bytes counter
#include "chi/core/caller.h"  // Caller: who sent the request
#include "chi/core/types.h"   // u64

namespace chi {

/** Where one remote task's answer goes, and its encoded bytes. */
struct ZmqAnswerSlot {
  ZmqAnswerSlot *next = nullptr;  ///< the next slot on ZmqAnswerQueue's list
  std::string peer;               ///< socket index byte + routing id
  Caller caller;                  ///< who sent the request (the peer's verified identity)
  std::vector<char> bytes;        ///< the encoded answer (capacity reused)
};

/** Slots kept for reuse (single-threaded: the server's lock guards it). */
class ZmqAnswerPool {
 public:
  static constexpr u64 kKeepBufferBytes = 1 << 20;  ///< larger answer buffers are not kept
  static constexpr size_t kMaxFreeSlots = 1024;     ///< slots beyond this are freed

  ZmqAnswerPool() = default;
  ~ZmqAnswerPool() { Clear(); }
  ZmqAnswerPool(const ZmqAnswerPool &) = delete;
  ZmqAnswerPool &operator=(const ZmqAnswerPool &) = delete;

  /** A slot from the pool, or a new one. */
  ZmqAnswerSlot *Take() {
    if (free_.empty()) return new ZmqAnswerSlot();
    ZmqAnswerSlot *s = free_.back();
    free_.pop_back();
    pooled_bytes_ -= s->bytes.capacity();
    Publish();
    return s;
  }

  /** Keeps a slot for reuse; large buffers and slots beyond the pool's bound are freed. */
  void Give(ZmqAnswerSlot *s) {
    if (free_.size() >= kMaxFreeSlots) {
      delete s;
      return;
    }
    if (s->bytes.capacity() > kKeepBufferBytes) std::vector<char>().swap(s->bytes);
    s->bytes.clear();
    pooled_bytes_ += s->bytes.capacity();
    free_.push_back(s);
    Publish();
  }

  /** Frees every pooled slot. */
  void Clear() {
    for (ZmqAnswerSlot *s : free_) delete s;
    free_.clear();
    pooled_bytes_ = 0;
    Publish();
  }

  /** Bytes the pool holds (any thread). */
  u64 BytesHeld() const { return bytes_held_.Load(MemOrder::kRelaxed); }  // relaxed: a statistic

 private:
  void Publish() {
    bytes_held_.Store(pooled_bytes_ + free_.size() * sizeof(ZmqAnswerSlot), MemOrder::kRelaxed);
  }

  std::vector<ZmqAnswerSlot *> free_;
  u64 pooled_bytes_ = 0;
  Atomic<u64> bytes_held_;
};

/** Encoded answers waiting for the network worker: any thread pushes, it takes them all. */
class ZmqAnswerQueue {
 public:
  /** Pushes an encoded answer (any thread). */
  void Push(ZmqAnswerSlot *slot) {
    ZmqAnswerSlot *head = head_.Load(MemOrder::kRelaxed);
    do {
      slot->next = head;
      // release: the encoded bytes are visible to the thread that takes the list.
    } while (!head_.CompareExchange(head, slot, MemOrder::kRelease));
  }

  /** True when answers wait (acquire: a taker then sees their bytes). */
  bool Waiting() const { return head_.Load(MemOrder::kAcquire) != nullptr; }

  /** A hint that answers wait, for a sender that must not overtake them (relaxed). */
  bool WaitingHint() const { return head_.Load(MemOrder::kRelaxed) != nullptr; }

  /** Takes every waiting answer, oldest first (linked through next); nullptr when none. */
  ZmqAnswerSlot *TakeAll() {
    // acquire: pairs with Push's release; the encoded bytes are visible.
    ZmqAnswerSlot *list = head_.Exchange(nullptr, MemOrder::kAcquire);
    ZmqAnswerSlot *fifo = nullptr;
    while (list != nullptr) {  // the list is newest first; reverse it
      ZmqAnswerSlot *next = list->next;
      list->next = fifo;
      fifo = list;
      list = next;
    }
    return fifo;
  }

 private:
  Atomic<ZmqAnswerSlot *> head_{nullptr};  ///< newest first
};

}  // namespace chi
