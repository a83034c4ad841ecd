// UserGpuQueues: gpu2cpu queues applications make in their own pinned memory and register
// (CHI_IPC->RegisterGpuQueue) so the GpuWorker serves them beside each GPU's own: a fixed
// table, changed under a mutex, read by the worker's thread with a busy flag per entry.
// Invariant: once Unregister returns Ok the worker neither polls the queue nor answers into
// it (the state_/busy_ Dekker pair, then the in-flight count drained): its memory may go.
#pragma once

#include <time.h>  // nanosleep while a removal waits

#include <mutex>  // Register / Unregister are rare and serialised
#include <new>    // placement new: a forked child's fresh lock

#include "chi/core/atomic.h"   // Atomic, CpuRelax
#include "chi/core/status.h"   // Status, ErrorCode
#include "chi/gpu/gpu_wire.h"  // kGpuEnvelopeBytes: the smallest useful payload
#include "chi/gpu/mailbox.h"   // GpuQueue, kGpuPayloadBytes

namespace chi::gpu {

/** Most user queues one runtime serves at a time. */
inline constexpr u32 kMaxUserGpuQueues = 16;
/** Most slots of one user queue (the worker scans them all every round). */
inline constexpr u32 kMaxUserGpuQueueSlots = 1u << 16;

/** Why `q` cannot be served as a gpu2cpu queue, or Ok. */
inline Status CheckUserGpuQueue(const GpuQueue<MemScope::kSystem> &q) {
  if (q.request_ == nullptr || q.answer_ == nullptr || q.payload_ == nullptr ||
      q.claims_ == nullptr || q.served_ == nullptr) {
    return Status::Error(ErrorCode::kInvalidArgument,
                         "GPU queue has a null array: build it with GpuQueue::Make");
  }
  if (q.records_ == nullptr) {
    return Status::Error(ErrorCode::kInvalidArgument,
                         "GPU queue has no client records: Make it with gpu_clients = true");
  }
  if (q.num_slots_ == 0 || q.num_slots_ > kMaxUserGpuQueueSlots) {
    return Status::Errorf(ErrorCode::kInvalidArgument, "GPU queue has %u slots (1 to %u allowed)",
                          q.num_slots_, kMaxUserGpuQueueSlots);
  }
  if (q.payload_bytes_ < 64 || q.payload_bytes_ > kGpuPayloadBytes || q.payload_bytes_ % 16 != 0) {
    return Status::Errorf(ErrorCode::kInvalidArgument,
                          "GPU queue payload of %u bytes: it must be a multiple of 16 in [64, %u]",
                          q.payload_bytes_, kGpuPayloadBytes);
  }
  if (q.max_wait_ns_ == 0) {
    return Status::Error(ErrorCode::kInvalidArgument,
                         "GPU queue max_wait_ns_ is 0: its kernels would give up at once");
  }
  return Status::Ok();
}

/** The registered user queues (see the file comment); LinkT is GpuLink. */
template <typename LinkT>
class UserGpuQueues {
 public:
  /** Adds q (its descriptor is copied); the worker polls it from its next round. */
  Status Register(const GpuQueue<MemScope::kSystem> &q) {
    if (Status st = CheckUserGpuQueue(q); !st.ok()) return st;
    std::lock_guard<std::mutex> g(mu_);
    Entry *free_entry = nullptr;
    for (Entry &e : entries_) {
      const u32 state = e.state_.Load(MemOrder::kAcquire);
      if (state != kEmpty && e.link.gpu2cpu.request_ == q.request_) {
        if (state == kActive) {
          return Status::Error(ErrorCode::kAlreadyExists, "this GPU queue is registered already");
        }
        if (e.link.gpu2cpu_inflight.Load(MemOrder::kAcquire) != 0) {
          return Status::Error(ErrorCode::kAlreadyExists,
                               "this GPU queue is still draining an earlier registration");
        }
      }
      const bool drained = e.link.gpu2cpu_inflight.Load(MemOrder::kAcquire) == 0;
      const bool idle = state == kEmpty || (state == kRemoved && drained);
      if (idle && free_entry == nullptr) free_entry = &e;
    }
    if (free_entry == nullptr) {
      return Status::Errorf(ErrorCode::kOutOfMemory,
                            "too many GPU queues registered (at most %u): unregister one first",
                            kMaxUserGpuQueues);
    }
    free_entry->link.gpu_id = ~0u;
    free_entry->link.gpu2cpu = q;
    const u32 index = static_cast<u32>(free_entry - entries_);
    if (used_.Load(MemOrder::kRelaxed) < index + 1) used_.Store(index + 1, MemOrder::kRelease);
    // release: the descriptor above is visible to the worker once it sees kActive.
    free_entry->state_.Store(kActive, MemOrder::kRelease);
    return Status::Ok();
  }

  /**
   * Stops serving q: after Ok, nothing touches its memory. Waits for the worker to leave the
   * queue and for tasks it started to answer, up to timeout_ns; kTimeout when some still run
   * (the queue is no longer polled; call again before freeing its memory).
   */
  Status Unregister(const GpuQueue<MemScope::kSystem> &q, u64 timeout_ns) {
    std::lock_guard<std::mutex> g(mu_);
    for (Entry &e : entries_) {
      const u32 state = e.state_.Load(MemOrder::kAcquire);
      if (state == kEmpty || e.link.gpu2cpu.request_ != q.request_) continue;
      // seq_cst: pairs with Serve's busy_ store then state_ load (a Dekker pair): either the
      // worker sees kRemoved, or we see busy_ set and wait for its round on this queue.
      e.state_.Store(kRemoved, MemOrder::kSeqCst);
      u64 waited = 0;
      while (e.busy_.Load(MemOrder::kSeqCst) != 0 ||
             e.link.gpu2cpu_inflight.Load(MemOrder::kAcquire) != 0) {
        if (waited >= timeout_ns) {
          return Status::Errorf(ErrorCode::kTimeout,
                                "tasks from this GPU queue still run after %llu ms; it is no "
                                "longer polled: unregister again before freeing its memory",
                                static_cast<unsigned long long>(timeout_ns / 1000000));
        }
        timespec ts{0, 50000};
        nanosleep(&ts, nullptr);
        waited += 50000;
      }
      e.state_.Store(kEmpty, MemOrder::kRelease);  // release: reusable; nothing refers to it
      return Status::Ok();
    }
    return Status::Error(ErrorCode::kNotFound, "this GPU queue is not registered");
  }

  /**
   * The worker's round: serve(link, index) on every active queue; true when any did work.
   * The index names the queue in Link() while tasks from it run.
   */
  template <typename ServeFn>
  bool Serve(ServeFn &&serve) {
    bool did = false;
    const u32 used = used_.Load(MemOrder::kAcquire);  // acquire: entries below it are set up
    for (u32 i = 0; i < used; ++i) {
      Entry &e = entries_[i];
      if (e.state_.Load(MemOrder::kAcquire) != kActive) continue;  // the cheap look
      e.busy_.Store(1, MemOrder::kSeqCst);  // seq_cst: the Dekker half Unregister reads
      if (e.state_.Load(MemOrder::kSeqCst) == kActive) did |= serve(e.link, i);
      e.busy_.Store(0, MemOrder::kRelease);  // release: our slot writes precede the removal
    }
    return did;
  }

  /** Forgets every queue (the worker's thread has stopped and nothing is in flight). */
  void Clear() {
    std::lock_guard<std::mutex> g(mu_);
    for (Entry &e : entries_) e.state_.Store(kEmpty, MemOrder::kRelease);
  }

  /**
   * In a forked child: the queues and their tasks are the parent's. A fresh lock (a parent
   * thread may have held it) and no queue, without touching the parent's queue memory.
   */
  void ForgetAfterFork() {
    new (&mu_) std::mutex();
    for (Entry &e : entries_) {
      e.state_.Store(kEmpty, MemOrder::kRelaxed);  // relaxed: the child has one thread here
      e.link.gpu2cpu_inflight.Store(0, MemOrder::kRelaxed);
    }
  }

  /** GPU->CPU tasks from user queues still running. */
  u64 Inflight() const {
    u64 n = 0;
    const u32 used = used_.Load(MemOrder::kAcquire);
    for (u32 i = 0; i < used; ++i) n += entries_[i].link.gpu2cpu_inflight.Load(MemOrder::kAcquire);
    return n;
  }

  /** The link of entry `index` (what Serve passed). */
  LinkT &Link(u32 index) { return entries_[index].link; }

 private:
  static constexpr u32 kEmpty = 0;
  static constexpr u32 kActive = 1;
  static constexpr u32 kRemoved = 2;  ///< no longer polled; tasks from it may still run

  struct Entry {
    Atomic<u32> state_;
    Atomic<u32> busy_;  ///< 1 while the worker serves this queue
    LinkT link;
  };

  std::mutex mu_;
  Entry entries_[kMaxUserGpuQueues];
  Atomic<u32> used_;  ///< 1 + the highest entry ever used
};

}  // namespace chi::gpu
