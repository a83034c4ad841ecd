// What one poll of pinned host memory costs a GPU thread, by the shape of its loads: one
// 8-byte relaxed (strong) load, four of them in one 32-byte sector, two 16-byte volatile
// vector loads over the same sector, four plain loads after an acquire fence, and one
// 16-byte relaxed pair (the gpu2cpu answer poll). Tells whether strong loads of system memory
// from one thread overlap or go one PCIe round trip each (the answer words' poll depends on it).
#pragma once

#include <cstdio>   // the report
#include <cstring>  // clearing the probe words
#include <thread>   // the CPU side of the ping-pong

#include "bench_gpu_util.cuh"

namespace bench_gpu {

/** Ways to read four adjacent words of pinned memory. */
enum class PollShape : u32 { kOneStrong, kFourStrong, kTwoVolatileV2, kFencePlusFour, kOnePair };

/** Two 16-byte volatile loads (per-8-byte single-copy atomic, as NCCL's LL reads). */
__device__ inline void LoadVolatileV2(const u64 *p, u64 *a, u64 *b) {
  asm volatile("ld.volatile.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
}

/** Averages `iters` polls of `words` (pinned) in one shape; the sum keeps the loads alive. */
__global__ void PollProbeKernel(const u64 *words, PollShape shape, u32 iters, double *ns,
                                u64 *sink) {
  using W = chi::Atomic<u64, chi::MemScope::kSystem>;
  const W *w = reinterpret_cast<const W *>(words);
  u64 sum = 0;
  const u64 t0 = chi::gpu::ClockNs();
  for (u32 i = 0; i < iters; ++i) {
    switch (shape) {
      case PollShape::kOneStrong:
        sum += w[0].Load(chi::MemOrder::kRelaxed);
        break;
      case PollShape::kFourStrong:
        sum += w[0].Load(chi::MemOrder::kRelaxed) + w[1].Load(chi::MemOrder::kRelaxed) +
               w[2].Load(chi::MemOrder::kRelaxed) + w[3].Load(chi::MemOrder::kRelaxed);
        break;
      case PollShape::kTwoVolatileV2: {
        u64 a, b, c, d;
        LoadVolatileV2(words, &a, &b);
        LoadVolatileV2(words + 2, &c, &d);
        sum += a + b + c + d;
        break;
      }
      case PollShape::kOnePair: {  // the gpu2cpu answer poll (chi::gpu::LoadPair)
        u64 a, b;
        chi::gpu::LoadPair(w, &a, &b);
        sum += a + b;
        break;
      }
      case PollShape::kFencePlusFour: {
        chi::gpu::FenceAcquire<chi::MemScope::kSystem>();
        const volatile u64 *v = words;
        sum += v[0] + v[1] + v[2] + v[3];
        break;
      }
    }
  }
  *ns = static_cast<double>(chi::gpu::ClockNs() - t0) / iters;
  *sink = sum;
}

/** Four weak 8-byte loads with a cache operator ("cv": fetch again; "cg": bypass L1). */
template <bool kCv>
__device__ inline void LoadFourWeak(const u64 *p, u64 *v) {
  if constexpr (kCv) {
    asm volatile("ld.global.cv.v2.u64 {%0, %1}, [%4];\n\tld.global.cv.v2.u64 {%2, %3}, [%4+16];"
                 : "=l"(v[0]), "=l"(v[1]), "=l"(v[2]), "=l"(v[3]) : "l"(p) : "memory");
  } else {
    asm volatile("ld.global.cg.v2.u64 {%0, %1}, [%4];\n\tld.global.cg.v2.u64 {%2, %3}, [%4+16];"
                 : "=l"(v[0]), "=l"(v[1]), "=l"(v[2]), "=l"(v[3]) : "l"(p) : "memory");
  }
}

/**
 * The GPU pings (pinned word), a CPU thread answers by writing four flagged words (as an
 * inline answer), and the GPU polls them in `shape` until all four carry the round's flag:
 * a GPU->CPU->GPU round trip whose answer read is the poll. Mean ns per round, or -1 when
 * the poll never saw the answer (a shape that can read stale data forever).
 */
__global__ void PollPingPongKernel(Flags *f, const u64 *words, u32 shape, u32 iters,
                                   double *ns) {
  using W = chi::Atomic<u64, chi::MemScope::kSystem>;
  const W *w = reinterpret_cast<const W *>(words);
  const u64 t0 = chi::gpu::ClockNs();
  for (u32 i = 1; i <= iters; ++i) {
    f->ping.Store(i, chi::MemOrder::kRelease);
    const u64 start = chi::gpu::ClockNs();
    for (;;) {
      u64 v[4];
      if (shape == 0) {
        CHI_UNROLL
        for (u32 k = 0; k < 4; ++k) v[k] = w[k].Load(chi::MemOrder::kRelaxed);
      } else if (shape == 1) {
        LoadVolatileV2(words, &v[0], &v[1]);
        LoadVolatileV2(words + 2, &v[2], &v[3]);
      } else if (shape == 2) {
        LoadFourWeak<true>(words, v);
      } else {
        LoadFourWeak<false>(words, v);
      }
      bool all = true;
      CHI_UNROLL
      for (u32 k = 0; k < 4; ++k) all &= static_cast<u32>(v[k] >> 32) == i;
      if (all) break;
      if (chi::gpu::ClockNs() - start > 100000000ull || f->abort.Load(chi::MemOrder::kRelaxed)) {
        *ns = -1;
        f->abort.Store(1, chi::MemOrder::kRelaxed);
        return;
      }
    }
  }
  *ns = static_cast<double>(chi::gpu::ClockNs() - t0) / iters;
}

/** PollPingPongKernel in every shape, the CPU side answering from a host thread. */
inline void PollPingPong(Flags *f, cudaStream_t stream, u32 iters) {
  u64 *words = nullptr;
  double *ns = nullptr;
  Ok(cudaHostAlloc(&words, 64, cudaHostAllocMapped), "pinned words");
  Ok(cudaHostAlloc(&ns, sizeof(double), cudaHostAllocMapped), "probe result");
  const char *names[] = {"4 relaxed 8-byte loads", "2 volatile 16-byte loads",
                         "2 ld.global.cv 16-byte loads", "2 ld.global.cg 16-byte loads"};
  std::printf("GPU->CPU->GPU ping-pong, the answer's 4 flagged words read by the poll (mean"
              " ns):\n");
  for (u32 shape = 0; shape < 4; ++shape) {
    std::memset(static_cast<void *>(f), 0, sizeof(Flags));
    std::memset(words, 0, 64);
    using W = chi::Atomic<u64, chi::MemScope::kSystem>;
    W *w = reinterpret_cast<W *>(words);
    std::thread cpu([&] {
      for (u32 i = 1; i <= iters; ++i) {
        while (f->ping.Load(chi::MemOrder::kAcquire) != i) {
          if (f->abort.Load(chi::MemOrder::kRelaxed) != 0) return;
        }
        const u64 flag = static_cast<u64>(i) << 32;
        for (u32 k = 3; k >= 1; --k) w[k].Store(flag | k, chi::MemOrder::kRelaxed);
        w[0].Store(flag, chi::MemOrder::kRelaxed);
      }
    });
    PollPingPongKernel<<<1, 1, 0, stream>>>(f, words, shape, iters, ns);
    Wait(stream, "poll ping-pong");
    f->abort.Store(1, chi::MemOrder::kRelaxed);
    cpu.join();
    if (*ns < 0) {
      std::printf("  %-44s  never saw the answer (stale reads)\n", names[shape]);
    } else {
      std::printf("  %-44s %8.0f\n", names[shape], *ns);
    }
  }
  std::memset(static_cast<void *>(f), 0, sizeof(Flags));
  cudaFreeHost(words);
  cudaFreeHost(ns);
}

/** Runs every shape on one thread and prints the mean ns per poll. */
inline void PollProbe(cudaStream_t stream, u32 iters) {
  u64 *words = nullptr;
  double *ns = nullptr;
  u64 *sink = nullptr;
  Ok(cudaHostAlloc(&words, 64, cudaHostAllocMapped), "pinned words");
  Ok(cudaHostAlloc(&ns, sizeof(double), cudaHostAllocMapped), "probe result");
  Ok(cudaMalloc(&sink, sizeof(u64)), "probe sink");
  const char *names[] = {"1 relaxed 8-byte load", "4 relaxed 8-byte loads (one sector)",
                         "2 volatile 16-byte loads (one sector)",
                         "acquire fence + 4 volatile loads", "1 relaxed 16-byte pair (LoadPair)"};
  std::printf("one poll of pinned memory from one GPU thread (mean ns, %u polls):\n", iters);
  for (u32 s = 0; s < 5; ++s) {
    PollProbeKernel<<<1, 1, 0, stream>>>(words, static_cast<PollShape>(s), iters, ns, sink);
    Wait(stream, "poll probe");
    std::printf("  %-44s %8.0f\n", names[s], *ns);
  }
  cudaFreeHost(words);
  cudaFreeHost(ns);
  cudaFree(sink);
}

}  // namespace bench_gpu
