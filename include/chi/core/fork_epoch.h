// Which process this is, across fork: ThisPid() is getpid() without a system call, and
// ForkGeneration() counts the forks since the process that first ran this program (0
// there, one more in each child made by fork). A pthread_atfork child handler registered
// before main keeps both. State made before a fork (threads, a runtime connection, tasks
// in flight) belongs to the parent; code that must not touch it in a child compares these.
#pragma once

#include <pthread.h>  // pthread_atfork
#include <unistd.h>   // getpid

#include <memory>  // unique_ptr

#include "chi/core/types.h"  // u32

namespace chi {

namespace detail {

/** The current process's identity across fork (see the file comment). */
struct ForkEpoch {
  u32 generation = 0;  ///< forks between the first process and this one
  u32 pid = 0;         ///< getpid(), refreshed in each child

  ForkEpoch() : pid(static_cast<u32>(getpid())) {
    // The child handler runs in the only thread the child has, before fork returns there.
    pthread_atfork(nullptr, nullptr, [] {
      ++fork_epoch.generation;
      fork_epoch.pid = static_cast<u32>(getpid());
    });
  }

  static ForkEpoch fork_epoch;
};

/** Made before main, so every fork after it is counted. */
inline ForkEpoch ForkEpoch::fork_epoch;

}  // namespace detail

/** getpid() of this process, without the system call. */
inline u32 ThisPid() { return detail::ForkEpoch::fork_epoch.pid; }

/** Forks between the first process of this program and this one (0: never forked). */
inline u32 ForkGeneration() { return detail::ForkEpoch::fork_epoch.generation; }

namespace detail {

/**
 * What forked children keep (KeepInherited), in static storage: a child handler may not
 * allocate. Until exec, a forked child of a threaded process may call only
 * async-signal-safe functions, and malloc is not one: an allocator lock that another of
 * the parent's threads held at the fork stays held in the child (ASan's allocator, seen
 * hanging a runtime's forked child). Static storage is also where leak checkers look.
 */
struct InheritedKeep {
  static constexpr u32 kMaxKept = 256;  ///< about a dozen generations of full runtimes
  void *kept[kMaxKept] = {};
  u32 count = 0;

  static InheritedKeep keep;
};

inline InheritedKeep InheritedKeep::keep;

}  // namespace detail

/**
 * Keeps an object a forked child inherited from its parent for the rest of the process,
 * never destroyed (its destructor would stop the parent's threads or remove what the
 * parent still serves through) and still reachable, so leak checkers do not report it.
 * Allocates nothing (see InheritedKeep); past kMaxKept objects in one process, later ones
 * are still never destroyed, only no longer listed. For fork child handlers only (the
 * child has one thread while they run).
 */
template <typename T>
void KeepInherited(std::unique_ptr<T> inherited) {
  if (inherited == nullptr) return;
  detail::InheritedKeep &k = detail::InheritedKeep::keep;
  T *p = inherited.release();
  if (k.count < detail::InheritedKeep::kMaxKept) k.kept[k.count++] = p;
}

/** Objects this process keeps for its parent (KeepInherited): a test's view. */
inline u32 InheritedKept() { return detail::InheritedKeep::keep.count; }

}  // namespace chi
