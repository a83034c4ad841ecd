// Making, copying, completing and freeing tasks in this process. NewTask<T>
// stamps each task with TaskOps<T> (destroy, clone, aggregate) so the runtime
// can handle any task type-erased; CompleteTask publishes the outputs and wakes
// whoever waits: a suspended fiber, a parked thread, or nobody (fire-and-forget).
#pragma once

#include <climits>   // INT_MAX for waking every parked waiter
#include <concepts>  // same_as: a task's Aggregate returns void
#include <new>       // placement new
#include <utility>   // std::forward
#include <vector>    // clone buffer

#include "chi/core/futex.h"           // waking parked threads
#include "chi/serialize/archive.h"    // clone/aggregate through the one wire format
#include "chi/task/task.h"            // Task, TaskOps
#include "chi/task/task_memory.h"     // per-thread task memory

namespace chi {

class RunContext;
/** Resumes a fiber on the worker that owns it (defined with the Worker). */
inline void ResumeWaiter(RunContext *r);

namespace detail {

/** Detects an optional `void Aggregate(const T &replica, u32 index)` on a task. */
template <typename T>
concept HasAggregate = requires(T &t, const T &o, u32 index) {
  { t.Aggregate(o, index) } -> std::same_as<void>;
};

/** True when T declares a member named Aggregate, whatever its signature. */
template <typename T>
concept NamesAggregate = requires { &T::Aggregate; };

/** The type-erased operations for task type T. */
template <typename T>
struct TaskOpsFor {
  static void Destroy(Task *t) {
    static_cast<T *>(t)->~T();
    TaskMemory::Free(t);
  }
  /** Deep copy through SerializeIn, so a replica carries exactly what a remote node would. */
  static Task *Clone(const Task &src);
  /** Default fold: the first failure wins; outputs come from replica 0 (lowest container). */
  static void Aggregate(Task &into, const Task &replica, u32 index) {
    // A fold with another signature would be skipped for the default: refuse it instead.
    static_assert(!NamesAggregate<T> || HasAggregate<T>,
                  "a task's Aggregate must be `void Aggregate(const TaskT &replica, chi::u32 "
                  "index)`: the runtime calls it once per replica to fold it into the task");
    T &dst = static_cast<T &>(into);
    const T &rep = static_cast<const T &>(replica);
    if constexpr (HasAggregate<T>) {
      dst.Aggregate(rep, index);
    } else if (index == 0) {
      std::vector<char> buf;
      OutputArchive out(buf);
      const_cast<T &>(rep).SerializeOut(out);
      InputArchive in(buf.data(), buf.size());
      dst.SerializeOut(in);
    }
    if (replica.rc_ != 0 && into.rc_ == 0) {
      into.rc_ = replica.rc_;
      into.msg_ = replica.msg_;
    }
  }
  static void SaveIn(Task &t, OutputArchive &ar) {
    t.SerializeBaseIn(ar);
    static_cast<T &>(t).SerializeIn(ar);
  }
  /** Answer header + outputs, written (OutputArchive) or read (InputArchive) alike. */
  template <typename Ar>
  static void Out(Task &t, Ar &ar) {
    t.SerializeBaseOut(ar);
    static_cast<T &>(t).SerializeOut(ar);
  }
  static constexpr TaskOps kOps{&Destroy, &Clone, &Aggregate, &SaveIn, &Out<OutputArchive>,
                                &Out<InputArchive>};
};

}  // namespace detail

/**
 * Allocates and constructs a task of type T in this process; the runtime or the
 * owning Future frees it. Returns nullptr when memory is exhausted.
 */
template <typename T, typename... Args>
T *NewTask(Args &&...args) {
  void *mem = TaskMemory::Alloc(sizeof(T));
  if (mem == nullptr) return nullptr;
  T *t = new (mem) T(std::forward<Args>(args)...);
  t->ops_ = &detail::TaskOpsFor<T>::kOps;
  return t;
}

/** Destroys a task made by NewTask (any thread). */
inline void DeleteTask(Task *t) {
  if (t != nullptr) t->ops_->destroy(t);
}

template <typename T>
Task *detail::TaskOpsFor<T>::Clone(const Task &src) {
  T *copy = NewTask<T>();
  if (copy == nullptr) return nullptr;
  std::vector<char> buf;
  OutputArchive out(buf);
  const_cast<T &>(static_cast<const T &>(src)).SerializeIn(out);
  InputArchive in(buf.data(), buf.size());
  copy->SerializeIn(in);
  copy->CopyBase(src);
  return copy;
}

/**
 * Who sent t: the transport that delivered it (or delivered the task t replicates) vouches
 * for its client; a task with none was submitted in this process. Handlers that act for a
 * client (memory registration, stopping the runtime) decide with this.
 */
inline Caller CallerOf(const Task &t) {
  const Task *root = &t;
  while (root->parent_ != nullptr) root = root->parent_;
  return root->completer_ != nullptr ? root->completer_->CallerOf(*root) : Caller::ThisProcess();
}

/**
 * Publishes a finished task: frees it (fire-and-forget or orphaned), or marks it
 * complete and wakes its waiter. The caller must not touch `t` afterwards.
 */
inline void CompleteTask(Task *t) {
  if (t->completer_ != nullptr) {  // a transport answers a remote caller
    t->completer_->OnComplete(t);
    return;
  }
  if (t->task_flags_.Any(TASK_FIRE_AND_FORGET)) {
    DeleteTask(t);
    return;
  }
  // acq_rel: release publishes the outputs; acquire sees the waiter's registration.
  const u32 prev = t->state_.FetchOr(task_state::kComplete, MemOrder::kAcqRel);
  if (prev & task_state::kOrphaned) {
    DeleteTask(t);
  } else if (prev & task_state::kHasWaiter) {
    ResumeWaiter(t->waiter_);  // the fiber cannot free t before it is resumed
  } else if (prev & task_state::kParked) {
    FutexWake(t->state_.Raw(), INT_MAX);
  }
}

}  // namespace chi
