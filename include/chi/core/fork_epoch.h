// Which process this is, across fork: ThisPid() is getpid() without a system call, and
// ForkGeneration() counts the forks since the process that first ran this program (0
// there, one more in each child made by fork). A pthread_atfork child handler registered
// before main keeps both. State made before a fork (threads, a runtime connection, tasks
// in flight) belongs to the parent; code that must not touch it in a child compares these.
#pragma once

#include <pthread.h>  // pthread_atfork
#include <unistd.h>   // getpid

#include <memory>  // unique_ptr
#include <vector>  // what KeepInherited keeps

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

/**
 * Keeps an object a forked child inherited from its parent for the rest of the process,
 * never destroyed (its destructor would stop the parent's threads or remove what the
 * parent still serves through) and still reachable, so leak checkers do not report it.
 * For fork child handlers only (the child has one thread while they run).
 */
template <typename T>
void KeepInherited(std::unique_ptr<T> inherited) {
  if (inherited == nullptr) return;
  static auto *kept = new std::vector<void *>();
  kept->push_back(inherited.release());
}

}  // namespace chi
