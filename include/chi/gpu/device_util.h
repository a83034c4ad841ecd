// Small helpers the GPU mailboxes, the orchestrator loop and the GPU client share: thread
// ids, spin pauses, a nanosecond clock, scoped acquire fences, warp votes and 16-byte copies. Each
// has a host version, so the same protocol code also runs on CPU threads (host tests).
// Invariant: nothing here blocks; every wait built on these is bounded by its caller.
#pragma once

#if !CHI_IS_GPU
#include <time.h>  // clock_gettime for the host clock
#endif

#include "chi/core/atomic.h"  // CpuRelax, MemScope
#include "chi/core/macros.h"  // CHI_CROSS_FUN, CHI_IS_GPU, CHI_GPU_CUDA/HIP
#include "chi/core/types.h"   // u32, u64

namespace chi::gpu {

/** Monotonic nanoseconds: %globaltimer on NVIDIA, s_memrealtime (100 MHz) on AMD. */
CHI_CROSS_FUN inline u64 ClockNs() {
#if CHI_IS_GPU && CHI_GPU_CUDA
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#elif CHI_IS_GPU
  return __builtin_amdgcn_s_memrealtime() * 10;
#else
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<u64>(ts.tv_sec) * 1000000000ull + static_cast<u64>(ts.tv_nsec);
#endif
}

/** Yields the issue slot for about `ns` nanoseconds (a hint; a CPU pause on the host). */
CHI_CROSS_FUN inline void SpinPause(u32 ns) {
#if CHI_IS_GPU && CHI_GPU_CUDA
  __nanosleep(ns);
#elif CHI_IS_GPU
  (void)ns;
  __builtin_amdgcn_s_sleep(2);
#else
  (void)ns;
  CpuRelax();
#endif
}

/**
 * The pause for the n-th consecutive empty poll: none for a while (latency), then growing
 * sleeps up to max_ns, so idle pollers stop flooding L2 or the PCIe link.
 */
CHI_CROSS_FUN inline void Backoff(u32 n, u32 max_ns) {
  if (n < 64) return;
  u32 ns = 32u << ((n - 64) >> 6 < 6 ? (n - 64) >> 6 : 6);
  SpinPause(ns < max_ns ? ns : max_ns);
}

/** This thread's index in its launch (x-major over the grid); 0 on the host. */
CHI_CROSS_FUN inline u32 GlobalThreadId() {
#if CHI_IS_GPU
  const u32 block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const u32 in_block = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  return block * (blockDim.x * blockDim.y * blockDim.z) + in_block;
#else
  return 0;
#endif
}

/**
 * Acquire fence at scope S: orders a relaxed poll (kFencedPoll) that saw new data before
 * the reads of that data (polls stay relaxed so a batch of them can be in flight at once).
 * Nothing on the host, where those polls are acquire loads themselves.
 */
template <MemScope S>
CHI_CROSS_FUN inline void FenceAcquire() {
#if CHI_IS_GPU && CHI_GPU_CUDA
  cuda::atomic_thread_fence(cuda::std::memory_order_acquire, S == MemScope::kSystem
                                                                 ? cuda::thread_scope_system
                                                                 : cuda::thread_scope_device);
#elif CHI_IS_GPU
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
#endif
}

/**
 * Reads the two adjacent 8-byte words at p (16-byte aligned) with relaxed order, in one
 * 16-byte load where the hardware has one: a GPU thread's strong loads of pinned memory go
 * one PCIe round trip each, so a flagged pair read this way costs one. Each word is read
 * whole; the pair is not (each word carries its own flag).
 */
template <MemScope S>
CHI_CROSS_FUN inline void LoadPair(const Atomic<u64, S> *p, u64 *a, u64 *b) {
#if CHI_IS_GPU && CHI_GPU_CUDA
  if constexpr (S == MemScope::kSystem) {
    asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];"
                 : "=l"(*a), "=l"(*b)
                 : "l"(p)
                 : "memory");
  } else {
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];"
                 : "=l"(*a), "=l"(*b)
                 : "l"(p)
                 : "memory");
  }
#else
  *a = p[0].Load(kFencedPoll);  // relaxed: each word carries its own flag
  *b = p[1].Load(kFencedPoll);
#endif
}

/** The lanes of this warp running this code together now (all ones on the host). */
CHI_CROSS_FUN inline u32 WarpMask() {
#if CHI_IS_GPU && CHI_GPU_CUDA
  return __activemask();
#else
  return ~0u;
#endif
}

/**
 * True when `p` holds on any lane of `mask`; the lanes also wait for each other here. A
 * polling loop that votes once per round keeps its warp in step, so a lane serving a task is
 * not interleaved with its idle neighbours' polls and sleeps (NVIDIA's independent thread
 * scheduling would otherwise run the two paths by turns). One thread on the host.
 */
CHI_CROSS_FUN inline bool WarpAny(u32 mask, bool p) {
#if CHI_IS_GPU && CHI_GPU_CUDA
  return __any_sync(mask, p) != 0;
#elif CHI_IS_GPU
  (void)mask;
  return __any(p) != 0;
#else
  (void)mask;
  return p;
#endif
}

/** How many lanes of `mask` hold `p` (the lanes also wait for each other); p on the host. */
CHI_CROSS_FUN inline u32 WarpCount(u32 mask, bool p) {
#if CHI_IS_GPU && CHI_GPU_CUDA
  return static_cast<u32>(__popc(__ballot_sync(mask, p)));
#elif CHI_IS_GPU
  (void)mask;
  return static_cast<u32>(__popcll(__ballot(p)));
#else
  (void)mask;
  return p ? 1u : 0u;
#endif
}

/** 16 bytes, the widest plain load and store; buffers copied with it are 16-aligned. */
struct alignas(16) Chunk16 {
  u64 lo;
  u64 hi;
};

/** Chunks CopyChunks loads before storing any: 128 bytes, 16 registers. */
inline constexpr u32 kCopyBatchChunks = 8;

/**
 * Copies `len` bytes rounded up to 16 between 16-aligned buffers whose capacity is a
 * multiple of 16. Loads go out in batches of kCopyBatchChunks, all issued before the batch
 * is stored, so a request read over PCIe costs one round trip per 128 bytes, not one per 16.
 * (A 256-byte batch was tried before: it raised the orchestrator to 164 registers a thread,
 * which can keep client blocks from sharing an SM with it.)
 */
CHI_CROSS_FUN inline void CopyChunks(void *dst, const void *src, u32 len) {
  auto *d = static_cast<Chunk16 *>(dst);
  const auto *s = static_cast<const Chunk16 *>(src);
  const u32 n = (len + 15) / 16;
  for (u32 i = 0; i < n; i += kCopyBatchChunks) {
    Chunk16 batch[kCopyBatchChunks];
    CHI_UNROLL
    for (u32 k = 0; k < kCopyBatchChunks; ++k) {
      if (i + k < n) batch[k] = s[i + k];
    }
    CHI_UNROLL
    for (u32 k = 0; k < kCopyBatchChunks; ++k) {
      if (i + k < n) d[i + k] = batch[k];
    }
  }
}

}  // namespace chi::gpu
