// ZmqRequestTable: the tasks a pure client's ZeroMQ connection has on the wire,
// by request id (slot index in the low half, the slot's generation in the high
// half, so a late answer for a failed task matches nothing), plus back-pressure
// on how many tasks are unanswered and their completion. ZmqClientTransport
// (zmq_client.h) uses it under its socket lock. Invariant: a task is completed
// once, by whoever takes it out of its slot.
#pragma once

#include <climits>  // INT_MAX: wake every blocked sender
#include <vector>   // slots, free list

#include "chi/core/atomic.h"    // counters
#include "chi/core/futex.h"     // back-pressure parking
#include "chi/core/status.h"    // ErrorCode
#include "chi/task/task_ops.h"  // CompleteTask

namespace chi {

/** Request ids of the tasks on the wire, and their completion (see the file comment). */
class ZmqRequestTable {
 public:
  explicit ZmqRequestTable(u64 max_inflight) : max_inflight_(max_inflight) {}

  /** Any thread: counts a task handed over; parks while max_inflight are unanswered. */
  void Admit() {
    for (u32 spins = 0; inflight_.Load(MemOrder::kAcquire) >= max_inflight_; ++spins) {
      if (spins < 1024) {
        CpuRelax();
        continue;
      }
      const u32 seen = room_.Load(MemOrder::kAcquire);
      room_waiters_.FetchAdd(1, MemOrder::kSeqCst);  // seq_cst: visible before the re-check
      if (inflight_.Load(MemOrder::kSeqCst) >= max_inflight_) {
        FutexWait(room_.Raw(), seen, 1000000);
      }
      room_waiters_.FetchSub(1, MemOrder::kRelaxed);
    }
    // relaxed: no reader needs order from it (room waiters pair with the decrement; a
    // leaving watcher's Idle is a hint).
    inflight_.FetchAdd(1, MemOrder::kRelaxed);
  }

  /** Under the socket lock: puts t in a slot and returns its request id. */
  u64 Insert(Task *t) {
    u32 index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = static_cast<u32>(slots_.size());
      slots_.push_back(Slot{});
    }
    slots_[index].task = t;
    outstanding_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a hint for waiting callers
    return (static_cast<u64>(slots_[index].generation) << 32) | index;
  }

  /** Under the socket lock: takes the task request `id` names out of its slot, or nullptr. */
  Task *Take(u64 id) {
    const u32 index = static_cast<u32>(id);
    if (index >= slots_.size() || slots_[index].task == nullptr ||
        slots_[index].generation != static_cast<u32>(id >> 32)) {
      return nullptr;  // an answer to a task already failed by a peer loss
    }
    Task *t = slots_[index].task;
    Release(index);
    return t;
  }

  /** Under the socket lock: fails every task on the wire with `code`. */
  void FailAll(ErrorCode code, const char *why) {
    for (u32 i = 0; i < slots_.size(); ++i) {
      if (Task *t = slots_[i].task) {
        Release(i);
        Fail(t, code, why);
      }
    }
  }

  /** Completes t with an error. */
  void Fail(Task *t, ErrorCode code, const char *why) {
    t->SetError(code, why);
    Complete(t);
  }

  /** Completes t (its outputs are set) and makes room for a parked sender. */
  void Complete(Task *t) {
    // Uncounted before the task shows complete, so that its caller's next Send sees only
    // its own task in flight (a new burst, see ZmqClientTransport::SendNow); seq_cst:
    // pairs with Admit's re-check.
    inflight_.FetchSub(1, MemOrder::kSeqCst);
    CompleteTask(t);
    // seq_cst: counted before the completer reads the watch role (zmq_client.h, Watch).
    completions_.FetchAdd(1, MemOrder::kSeqCst);
    if (room_waiters_.Load(MemOrder::kSeqCst) != 0) {
      room_.FetchAdd(1, MemOrder::kRelease);
      FutexWake(room_.Raw(), INT_MAX);
    }
  }

  /** Tasks completed so far (seq_cst: see Complete). */
  u64 Completions() const { return completions_.Load(MemOrder::kSeqCst); }

  /** Tasks on the wire now (any thread; a hint). */
  u64 Outstanding() const { return outstanding_.Load(MemOrder::kRelaxed); }

  /** Tasks handed over and not completed, sent or not (any thread; a hint). */
  u64 Inflight() const { return inflight_.Load(MemOrder::kRelaxed); }

  /**
   * True when no task is handed over and not completed (any thread; a hint: one admitted
   * meanwhile is taken by the network thread within its blind sleep, ZmqSocketWatch).
   */
  bool Idle() const { return inflight_.Load(MemOrder::kRelaxed) == 0; }

 private:
  /** A sent task awaiting its answer; generation tells a stale answer from a current one. */
  struct Slot {
    Task *task = nullptr;
    u32 generation = 1;
  };

  void Release(u32 index) {
    slots_[index].task = nullptr;
    ++slots_[index].generation;  // a late answer for the old occupant no longer matches
    free_.push_back(index);
    outstanding_.FetchSub(1, MemOrder::kRelaxed);
  }

  const u64 max_inflight_;
  std::vector<Slot> slots_;  ///< request id low half = index; under the socket lock
  std::vector<u32> free_;    ///< under the socket lock
  Atomic<u64> inflight_;     ///< handed over, not completed (includes tasks not yet sent)
  Atomic<u32> room_;         ///< futex word: bumped when a parked sender may go on
  Atomic<u32> room_waiters_;
  Atomic<u64> outstanding_;  ///< in a slot (sent, unanswered)
  Atomic<u64> completions_;
};

}  // namespace chi
