// Two threads that spin for each other across processes (a client waiting for its answer,
// the runtime thread serving it) must not share one CPU: each then progresses only while
// the other is off it. Each end records where it runs (NoteCpu); an end that finds the
// other on its own CPU yields to it (ShareCpu), and a runtime thread that keeps finding
// it so moves itself to another CPU (CpuUnstacker): the kernel's balancer leaves two
// threads that keep handing one CPU to each other stacked there for tens of milliseconds.
#pragma once

#include <sched.h>  // sched_getcpu, sched_{get,set}affinity

#if defined(__GLIBC__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && \
    __has_include(<sys/rseq.h>)
#include <sys/rseq.h>  // __rseq_offset, __rseq_size: the kernel's per-thread CPU word
#if defined(__has_builtin)
#if __has_builtin(__builtin_thread_pointer) && defined(RSEQ_SIG)
#define CHI_HAVE_RSEQ_CPU 1
#endif
#endif
#endif

#include "chi/core/atomic.h"  // Atomic, MemOrder
#include "chi/core/types.h"   // u32, u64

namespace chi {

/**
 * The CPU the calling thread runs on, plus one (0: unknown). Read straight from the
 * rseq area glibc registered for the thread (one load, ~1 ns): the waits that ask this
 * on every poll then poll faster than through sched_getcpu's call (~3 ns), which stays
 * the fallback where rseq is not registered (old kernels, valgrind).
 */
inline u32 CpuTag() {
#ifdef CHI_HAVE_RSEQ_CPU
  if (__rseq_size != 0) {
    const auto *area = reinterpret_cast<const volatile struct rseq *>(
        static_cast<const char *>(__builtin_thread_pointer()) + __rseq_offset);
    const int cpu = static_cast<int>(area->cpu_id);
    if (cpu >= 0) return static_cast<u32>(cpu) + 1;
  }
#endif
  const int cpu = sched_getcpu();
  return cpu < 0 ? 0 : static_cast<u32>(cpu) + 1;
}

/** Records the caller's CPU in `where` when it changed (the line is rarely written). */
inline void NoteCpu(Atomic<u32> &where) {
  const u32 cpu = CpuTag();
  // relaxed: a scheduling hint, never a synchronisation.
  if (where.Load(MemOrder::kRelaxed) != cpu) where.Store(cpu, MemOrder::kRelaxed);
}

/**
 * True when the other end last ran on the caller's CPU (`other` as NoteCpu wrote it):
 * then it can only progress while we do not run, and the caller should yield to it.
 */
inline bool ShareCpu(const Atomic<u32> &other) {
  const u32 cpu = other.Load(MemOrder::kRelaxed);  // relaxed: a hint
  return cpu != 0 && cpu == CpuTag();
}

/**
 * A runtime thread's memory of finding its peer on its CPU. Once that has lasted
 * kMoveAfterNs with no sighting apart, the thread moves to another CPU it may run on (its
 * affinity minus this CPU, then its whole affinity again: it stays free to go anywhere),
 * at most once per kMoveIntervalNs so an oversubscribed machine does not see it hop.
 * Only for threads the runtime owns: a client's threads are the application's.
 */
class CpuUnstacker {
 public:
  /** Stacking this long (ns) moves the thread. */
  static constexpr u64 kMoveAfterNs = 2000000;
  /** The least time (ns) between two moves. */
  static constexpr u64 kMoveIntervalNs = 50000000;

  /**
   * The peer was seen on this thread's CPU at `now_ns`; may move the thread. True when it
   * moved (the caller counts it: Monitor reports the moves).
   */
  bool Stacked(u64 now_ns) {
    if (since_ns_ == 0) since_ns_ = now_ns;
    if (now_ns - since_ns_ < kMoveAfterNs || now_ns - last_move_ns_ < kMoveIntervalNs) {
      return false;
    }
    last_move_ns_ = now_ns;
    since_ns_ = 0;
    return MoveOff();
  }

  /** The peer was seen elsewhere: the stacking, if any, is over. */
  void Apart() { since_ns_ = 0; }

 private:
  /**
   * Moves the calling thread off its current CPU, when it has anywhere else to go; true
   * when it moved.
   */
  static bool MoveOff() {
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return false;
    const int cpu = sched_getcpu();
    if (cpu < 0 || CPU_COUNT(&allowed) < 2 || !CPU_ISSET(cpu, &allowed)) return false;
    cpu_set_t others = allowed;
    CPU_CLR(cpu, &others);
    // The kernel migrates a thread off a CPU its new mask excludes at once; the full mask
    // again afterwards leaves it where it landed.
    const bool moved = sched_setaffinity(0, sizeof(others), &others) == 0;
    sched_setaffinity(0, sizeof(allowed), &allowed);
    return moved;
  }

  u64 since_ns_ = 0;      ///< when the current stacking was first seen (0: none)
  u64 last_move_ns_ = 0;  ///< when the thread last moved
};

}  // namespace chi
