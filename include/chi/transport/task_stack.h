// TaskStack: tasks handed from client threads to a transport's own thread without a lock
// (a Treiber stack linked through each task's transport_cookie_), taken all at once and
// replayed oldest first. The shm client's submission path and its reconnect queue use it.
// Invariant: a task is in at most one stack, and only the taker touches its cookie after.
#pragma once

#include "chi/core/atomic.h"     // Atomic, MemOrder, kCacheLine
#include "chi/core/status.h"     // ErrorCode
#include "chi/task/task.h"       // Task: the link lives in transport_cookie_
#include "chi/task/task_ops.h"   // CompleteTask

namespace chi {

/** A lock-free stack of tasks (see the file comment). */
class TaskStack {
 public:
  /**
   * Pushes t. seq_cst: the push comes before whatever the pusher checks next (a role
   * word, a closed flag), which the taker writes before it looks at the stack.
   */
  void Push(Task *t) {
    u64 head = head_.Load(MemOrder::kRelaxed);  // relaxed: the CAS decides
    do {
      t->transport_cookie_ = head;
    } while (!head_.CompareExchange(head, reinterpret_cast<u64>(t), MemOrder::kSeqCst));
  }

  /** True when nothing is pushed; `order` as the caller's pairing needs. */
  bool Empty(MemOrder order) const { return head_.Load(order) == 0; }

  /** Takes every pushed task; returns them oldest first, linked through the cookie. */
  Task *TakeOldestFirst() {
    // acquire: the pushers' writes to their tasks are visible.
    u64 head = head_.Exchange(0, MemOrder::kAcquire);
    Task *fifo = nullptr;
    while (head != 0) {
      Task *t = reinterpret_cast<Task *>(head);
      head = t->transport_cookie_;
      t->transport_cookie_ = reinterpret_cast<u64>(fifo);
      fifo = t;
    }
    return fifo;
  }

  /** The task after t in a list TakeOldestFirst returned. */
  static Task *Next(const Task *t) { return reinterpret_cast<Task *>(t->transport_cookie_); }

  /** Completes every pushed task with an error. */
  void FailAll(ErrorCode code, const char *msg) {
    for (Task *t = TakeOldestFirst(); t != nullptr;) {
      Task *next = Next(t);
      t->SetError(code, msg);
      CompleteTask(t);
      t = next;
    }
  }

 private:
  alignas(kCacheLine) Atomic<u64> head_;
};

}  // namespace chi
