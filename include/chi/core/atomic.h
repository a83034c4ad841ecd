// Atomics usable from host, CUDA and HIP code, in private, shared or pinned memory.
// Host and clang-based HIP use the __atomic builtins; nvcc device code uses
// cuda::atomic_ref so the scope (device vs system) is honoured. Values are plain
// T in memory, so an Atomic<T> may live in a shared segment or a GPU mailbox.
#pragma once

#include "chi/core/macros.h"  // CHI_CROSS_FUN
#include "chi/core/types.h"   // u32, u64

#if CHI_GPU_CUDA
#include <cuda/atomic>  // cuda::atomic_ref for device-side scoped atomics
#endif

namespace chi {

/** Memory orders, numerically equal to the GCC __ATOMIC_* constants. */
enum class MemOrder : int {
  kRelaxed = __ATOMIC_RELAXED,
  kAcquire = __ATOMIC_ACQUIRE,
  kRelease = __ATOMIC_RELEASE,
  kAcqRel = __ATOMIC_ACQ_REL,
  kSeqCst = __ATOMIC_SEQ_CST,
};

// The GPU mailboxes (gpu/mailbox.h) poll relaxed and fence once per batch, and publish
// self-flagged words relaxed: on a GPU a system-scope fence costs ~0.5 us. On the host the
// same code runs with acquire polls (its FenceAcquire is then empty) and release publishes,
// which x86 executes as plain loads and stores, so ThreadSanitizer (blind to fences and
// flags) sees the order too.
#if CHI_IS_GPU
/** Order of a poll that a later FenceAcquire pairs with (relaxed on a GPU). */
inline constexpr MemOrder kFencedPoll = MemOrder::kRelaxed;
/** Order of the store that publishes a message of self-flagged words (relaxed on a GPU). */
inline constexpr MemOrder kFlaggedPublish = MemOrder::kRelaxed;
#else
/** Order of a poll that a later FenceAcquire pairs with (acquire on the host). */
inline constexpr MemOrder kFencedPoll = MemOrder::kAcquire;
/** Order of the store that publishes a message of self-flagged words (release on the host). */
inline constexpr MemOrder kFlaggedPublish = MemOrder::kRelease;
#endif

/** Who must observe an atomic: one GPU, or every agent (CPUs, GPUs, processes). */
enum class MemScope : int { kDevice, kSystem };

#if CHI_GPU_CUDA
namespace detail {
/** Maps our order onto libcu++'s. */
CHI_CROSS_FUN constexpr cuda::std::memory_order ToCuda(MemOrder o) {
  switch (o) {
    case MemOrder::kRelaxed: return cuda::std::memory_order_relaxed;
    case MemOrder::kAcquire: return cuda::std::memory_order_acquire;
    case MemOrder::kRelease: return cuda::std::memory_order_release;
    case MemOrder::kAcqRel: return cuda::std::memory_order_acq_rel;
    default: return cuda::std::memory_order_seq_cst;
  }
}
template <MemScope S>
inline constexpr cuda::thread_scope kCudaScope =
    S == MemScope::kSystem ? cuda::thread_scope_system : cuda::thread_scope_device;
}  // namespace detail
#define CHI_ATOMIC_REF(T, S, v) cuda::atomic_ref<T, detail::kCudaScope<S>>(v)
#endif

/**
 * A trivially-copyable atomic value: placement-safe in shared and GPU memory.
 * Scope S only matters on the device; the host is always system-coherent.
 */
template <typename T, MemScope S = MemScope::kSystem>
class Atomic {
 public:
  /** Zero-initialised; usable as a member of a struct laid out in shm. */
  CHI_CROSS_FUN constexpr Atomic() : value_{} {}
  /** Starts at v (not an atomic store). */
  CHI_CROSS_FUN constexpr explicit Atomic(T v) : value_(v) {}

  /** Atomically reads the value. */
  CHI_CROSS_FUN T Load(MemOrder o = MemOrder::kSeqCst) const {
#if CHI_IS_GPU && CHI_GPU_CUDA
    return CHI_ATOMIC_REF(T, S, const_cast<T &>(value_)).load(detail::ToCuda(o));
#else
    return __atomic_load_n(&value_, static_cast<int>(o));
#endif
  }

  /** Atomically writes v. */
  CHI_CROSS_FUN void Store(T v, MemOrder o = MemOrder::kSeqCst) {
#if CHI_IS_GPU && CHI_GPU_CUDA
    CHI_ATOMIC_REF(T, S, value_).store(v, detail::ToCuda(o));
#else
    __atomic_store_n(&value_, v, static_cast<int>(o));
#endif
  }

  /** Adds d and returns the previous value. */
  CHI_CROSS_FUN T FetchAdd(T d, MemOrder o = MemOrder::kSeqCst) {
#if CHI_IS_GPU && CHI_GPU_CUDA
    return CHI_ATOMIC_REF(T, S, value_).fetch_add(d, detail::ToCuda(o));
#else
    return __atomic_fetch_add(&value_, d, static_cast<int>(o));
#endif
  }

  /** Subtracts d and returns the previous value. */
  CHI_CROSS_FUN T FetchSub(T d, MemOrder o = MemOrder::kSeqCst) {
#if CHI_IS_GPU && CHI_GPU_CUDA
    return CHI_ATOMIC_REF(T, S, value_).fetch_sub(d, detail::ToCuda(o));
#else
    return __atomic_fetch_sub(&value_, d, static_cast<int>(o));
#endif
  }

  /**
   * Adds d to a word only the calling thread writes (counters others merely read): a
   * relaxed load and store, no locked read-modify-write.
   */
  CHI_CROSS_FUN void AddOwned(T d) { Store(Load(MemOrder::kRelaxed) + d, MemOrder::kRelaxed); }

  /** Ors bits in and returns the previous value. */
  CHI_CROSS_FUN T FetchOr(T d, MemOrder o = MemOrder::kSeqCst) {
#if CHI_IS_GPU && CHI_GPU_CUDA
    return CHI_ATOMIC_REF(T, S, value_).fetch_or(d, detail::ToCuda(o));
#else
    return __atomic_fetch_or(&value_, d, static_cast<int>(o));
#endif
  }

  /** Ands bits and returns the previous value. */
  CHI_CROSS_FUN T FetchAnd(T d, MemOrder o = MemOrder::kSeqCst) {
#if CHI_IS_GPU && CHI_GPU_CUDA
    return CHI_ATOMIC_REF(T, S, value_).fetch_and(d, detail::ToCuda(o));
#else
    return __atomic_fetch_and(&value_, d, static_cast<int>(o));
#endif
  }

  /** Swaps in v and returns the previous value. */
  CHI_CROSS_FUN T Exchange(T v, MemOrder o = MemOrder::kSeqCst) {
#if CHI_IS_GPU && CHI_GPU_CUDA
    return CHI_ATOMIC_REF(T, S, value_).exchange(v, detail::ToCuda(o));
#else
    return __atomic_exchange_n(&value_, v, static_cast<int>(o));
#endif
  }

  /** Strong CAS: on failure `expected` receives the current value. */
  CHI_CROSS_FUN bool CompareExchange(T &expected, T desired,
                                     MemOrder o = MemOrder::kSeqCst) {
#if CHI_IS_GPU && CHI_GPU_CUDA
    return CHI_ATOMIC_REF(T, S, value_).compare_exchange_strong(expected, desired,
                                                                 detail::ToCuda(o));
#else
    // A failed CAS is only a load: it may not carry release semantics.
    const int fail = o == MemOrder::kRelease  ? __ATOMIC_RELAXED
                     : o == MemOrder::kAcqRel ? __ATOMIC_ACQUIRE
                                              : static_cast<int>(o);
    return __atomic_compare_exchange_n(&value_, &expected, desired, false,
                                       static_cast<int>(o), fail);
#endif
  }

  /** Address of the raw word (for futex waits on 32-bit atomics). */
  CHI_CROSS_FUN T *Raw() { return &value_; }

 private:
  alignas(sizeof(T)) T value_;
};

/** Full (sequentially consistent) fence: orders a store before a later load (Dekker wake-ups). */
CHI_CROSS_FUN inline void FenceSeqCst() {
#if CHI_IS_GPU && CHI_GPU_CUDA
  cuda::atomic_thread_fence(cuda::std::memory_order_seq_cst, cuda::thread_scope_system);
#elif defined(__SANITIZE_THREAD__)
  // TSan cannot model fences; a locked RMW is a full barrier on x86 and keeps TSan quiet.
  int dummy = 0;
  __atomic_exchange_n(&dummy, 1, __ATOMIC_SEQ_CST);
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

/** Hint to the CPU or GPU that we are spinning. */
CHI_CROSS_FUN inline void CpuRelax() {
#if CHI_IS_GPU && CHI_GPU_CUDA
  __nanosleep(32);
#elif CHI_IS_GPU
  __builtin_amdgcn_s_sleep(1);
#elif defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace chi
