// The cpu2gpu owner probe of bench_gpu: one warp replays the orchestrator's cpu2gpu polling
// round piece by piece (doorbell, scan of 8 request words a lane, system fences, idle naps,
// a device-memory poll of its gpu2gpu slots), and the host times a request -> answer round
// trip through it for each combination; then the mini orchestrator: the real server loop
// and queue code on a private queue set, without the runtime around them. Together they
// split the raw slot round trip into the cost of each piece, next to the bare pinned
// ping-pong (they found the serialized poll loads of ServeOwned). Bounded like every spin.
#pragma once

#include <sys/mman.h>  // the registered shared mapping

#include <cstring>  // memset of the probe words
#include <vector>   // round trips

#include "bench_gpu_util.cuh"          // Bench, Ok, Die, Wait
#include "chi/core/atomic.h"           // Atomic, MemScope
#include "chi/gpu/device_util.h"       // Backoff, FenceAcquire, WarpAny, ClockNs
#include "chi/gpu/gpu_server.h"        // ServeLoop: the real owner loop
#include "chi/gpu/orchestrator.h"      // OrchestratorKernel: the runtime's own kernel
#include "chi/gpu/queue_set.h"         // GpuQueueSet: a private copy of one GPU's queues
#include "chi/mods/demo/demo_tasks.h"  // the demo GPU runtime the mini orchestrator serves

namespace owner_probe {

using chi::u32;
using chi::u64;
using Sys64 = chi::Atomic<u64, chi::MemScope::kSystem>;
using Dev32 = chi::Atomic<u32, chi::MemScope::kDevice>;

/** Which pieces of the owner's round a probe run includes. */
enum Piece : u32 {
  kBell = 1,     ///< read the doorbell; scan the request words only when it moved
  kFences = 2,   ///< acquire fence (system) after the doorbell and before the "payload"
  kNap = 4,      ///< the server's idle Backoff (up to 512 ns)
  kDevPoll = 8,  ///< 8 device-memory loads a lane per round (its gpu2gpu slots)
  kAllLanes = 16 ///< every lane scans 8 words (256 pinned loads a scan); else lane 0 only
};

/** Pinned words of the probe: doorbell, 256 request words, 256 answer words, stop. */
struct alignas(64) Shared {
  Sys64 bell;
  u64 pad0[7];
  Sys64 request[256];
  Sys64 answer[256];
  Sys64 stop;
};

/** One warp serving slot requests the way the orchestrator's cpu2gpu owner warp does. */
__global__ void OwnerKernel(Shared *sh, Dev32 *dev, u32 pieces) {
  const u32 lane = threadIdx.x;
  const u32 warp = chi::gpu::WarpMask();
  u64 served[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  u64 bell_seen = ~0ull;
  u32 idle = 0;
  const u64 t0 = chi::gpu::ClockNs();
  u32 sink = 0;
  for (u32 round = 1;; ++round) {
    if (pieces & kDevPoll) {
      for (u32 k = 0; k < 8; ++k) sink += dev[lane + 32 * k].Load(chi::MemOrder::kRelaxed);
    }
    bool scan = true;
    if (pieces & kBell) {
      const u64 b = sh->bell.Load(chi::MemOrder::kRelaxed);
      scan = b != bell_seen;
      if (scan) {
        if (pieces & kFences) chi::gpu::FenceAcquire<chi::MemScope::kSystem>();
        bell_seen = b;
      }
    }
    bool did = false;
    if (scan && (lane == 0 || (pieces & kAllLanes))) {
      u64 w[8];
      for (u32 k = 0; k < 8; ++k) w[k] = sh->request[lane + 32 * k].Load(chi::MemOrder::kRelaxed);
      for (u32 k = 0; k < 8; ++k) {
        if (w[k] == served[k]) continue;
        if (pieces & kFences) chi::gpu::FenceAcquire<chi::MemScope::kSystem>();
        sh->answer[lane + 32 * k].Store(w[k], chi::MemOrder::kRelease);
        served[k] = w[k];
        did = true;
      }
    }
    did = chi::gpu::WarpAny(warp, did);
    if (did) {
      idle = 0;
    } else if (pieces & kNap) {
      chi::gpu::Backoff(++idle < (1u << 20) ? idle : (1u << 20), 512);
    }
    if ((round & 63) == 0 &&
        chi::gpu::WarpAny(warp, sh->stop.Load(chi::MemOrder::kRelaxed) != 0 ||
                                    chi::gpu::ClockNs() - t0 > 20000000000ull)) {
      break;
    }
  }
  if (sink == 0xdeadbeef) dev[0].Store(sink, chi::MemOrder::kRelaxed);
}

/**
 * Median host round trip (ns) of `iters` requests on slot 0 through OwnerKernel with
 * `pieces`; the host posts as GpuQueue::Post does (request word, then doorbell add).
 */
template <typename NowFn, typename MedianFn>
double RoundTripNs(Shared *sh, Dev32 *dev, u32 pieces, u32 iters, cudaStream_t s, NowFn now,
                   MedianFn median, bool *ok) {
  std::memset(static_cast<void *>(sh), 0, sizeof(Shared));
  OwnerKernel<<<1, 32, 0, s>>>(sh, dev, pieces);
  std::vector<double> v;
  *ok = true;
  for (u32 i = 1; i <= iters && *ok; ++i) {
    const double t0 = now();
    sh->request[0].Store(i, chi::MemOrder::kRelease);
    sh->bell.FetchAdd(1, chi::MemOrder::kRelease);
    while (sh->answer[0].Load(chi::MemOrder::kAcquire) != i) {
      if (now() - t0 > 5e9) {
        *ok = false;
        break;
      }
    }
    v.push_back(now() - t0);
  }
  sh->stop.Store(1, chi::MemOrder::kRelease);
  if (cudaStreamSynchronize(s) != cudaSuccess) *ok = false;
  return median(std::vector<double>(v.begin() + v.size() / 10, v.end()));
}

/** The real server loop over a private queue set, `blockDim.x * gridDim.x` threads. */
template <typename ModuleList>
__global__ void MiniOrchestrator(chi::gpu::ServerArgs a) {
  chi::gpu::ServeLoop<ModuleList>(a, blockIdx.x * blockDim.x + threadIdx.x,
                                  gridDim.x * blockDim.x);
}

/**
 * A private GpuQueueSet (pinned + device regions) served by MiniOrchestrator: the real
 * queue code and server loop without the runtime around them.
 */
struct MiniQueues {
  chi::gpu::GpuQueueSet set;
  char *pinned = nullptr;
  char *device = nullptr;
  u32 seq[256] = {};

  /** Carves the queues for `threads` server threads; false on a CUDA error. */
  bool Make(u32 threads) {
    chi::gpu::GpuQueueConfig c;
    c.server_threads = threads;
    c.depth = 256;
    const u64 pb = chi::gpu::GpuQueueSet::PinnedBytes(c);
    const u64 db = chi::gpu::GpuQueueSet::DeviceBytes(c);
    if (cudaHostAlloc(&pinned, pb, cudaHostAllocPortable) != cudaSuccess) return false;
    std::memset(pinned, 0, pb);
    if (cudaMalloc(&device, db) != cudaSuccess) return false;
    if (cudaMemset(device, 0, db) != cudaSuccess) return false;
    set = chi::gpu::GpuQueueSet::Carve(c, pinned, device);
    return cudaMemcpy(set.device, &set.host, sizeof(set.host), cudaMemcpyHostToDevice) ==
           cudaSuccess;
  }

  /** Asks the mini orchestrator to leave (through `s`, not the default stream). */
  bool Stop(cudaStream_t s) {
    chi::gpu::GpuControl words;
    words.exit_.Store(1, chi::MemOrder::kRelaxed);  // relaxed: a host-private staging copy
    words.abort_.Store(0, chi::MemOrder::kRelaxed);
    return cudaMemcpyAsync(set.control, &words, sizeof(words), cudaMemcpyHostToDevice, s) ==
               cudaSuccess &&
           cudaStreamSynchronize(s) == cudaSuccess;
  }

  /** One raw 4-byte request through slot `slot`, as GpuWorker::RawRoundTrip posts it. */
  bool RoundTrip(u32 slot, double timeout_ns, double (*now)()) {
    const auto &q = set.host.cpu2gpu;
    const u32 s = q.TryClaim(slot, 1);
    if (s == chi::gpu::kNoSlot) return false;
    std::memcpy(q.Payload(s), "\1\2\3\4", 4);
    const u32 n = ++seq[s];
    q.Post(s, n, 4);
    const double t0 = now();
    u32 len = 0;
    while (!q.Answered(s, n, &len)) {
      if (now() - t0 > timeout_ns) return false;
    }
    q.Release(s, n, false);
    return true;
  }
};

}  // namespace owner_probe

namespace bench_gpu {

/**
 * Memory of the cpu2gpu owner probe: pinned from cudaHostAlloc and, as the runtime's queues
 * are, a shared mapping registered with the driver. Allocated before the orchestrator starts
 * and freed after it stops (freeing device memory waits for every kernel, the orchestrator
 * included).
 */
struct ProbeMemory {
  owner_probe::Shared *alloc = nullptr;
  owner_probe::Shared *mapped = nullptr;
  owner_probe::Dev32 *dev = nullptr;

  void Allocate() {
    using owner_probe::Shared;
    Ok(cudaHostAlloc(&alloc, sizeof(Shared), cudaHostAllocPortable), "probe pinned");
    void *m = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED) Die("probe mmap");
    std::memset(m, 0, sizeof(Shared));
    Ok(cudaHostRegister(m, sizeof(Shared), cudaHostRegisterPortable | cudaHostRegisterMapped),
       "probe register");
    mapped = static_cast<Shared *>(m);
    Ok(cudaMalloc(&dev, 256 * sizeof(owner_probe::Dev32)), "probe device");
    Ok(cudaMemset(dev, 0, 256 * sizeof(owner_probe::Dev32)), "probe device");
  }
  void Free() {
    cudaHostUnregister(mapped);
    munmap(mapped, sizeof(owner_probe::Shared));
    cudaFreeHost(alloc);
    cudaFree(dev);
  }
};

/**
 * Times the cpu2gpu owner's round piece by piece (see owner_probe.cuh) in both kinds of
 * pinned memory; `all` runs every combination, else the bare scan and the orchestrator's
 * round.
 */
void OwnerProbe(Bench &B, ProbeMemory &m, u32 iters, bool all, const char *when) {
  using namespace owner_probe;
  const struct {
    u32 pieces;
    const char *name;
    bool always;
  } runs[] = {
      {0, "lane 0 scans 8 words", true},
      {kAllLanes, "32 lanes scan 8 words each", false},
      {kBell, "doorbell, then lane 0 scans", false},
      {kBell | kFences, "doorbell + fences", false},
      {kBell | kFences | kNap, "doorbell + fences + nap", false},
      {kBell | kFences | kNap | kDevPoll, "doorbell + fences + nap + device poll", false},
      {kBell | kFences | kNap | kDevPoll | kAllLanes, "all of it, 32 lanes (the orchestrator)",
       true},
      {kFences | kNap | kDevPoll | kAllLanes, "all but the doorbell (32 lanes)", false},
  };
  for (Shared *sh : {m.alloc, m.mapped}) {
    std::printf("cpu2gpu owner probe, %s, %s (host round trip, median ns):\n",
                sh == m.alloc ? "cudaHostAlloc" : "registered shared mapping", when);
    for (const auto &r : runs) {
      if (!all && !r.always) continue;
      bool ok = false;
      const double ns = RoundTripNs(
          sh, m.dev, r.pieces, iters, B.a, [] { return chi_bench::NowNs(); },
          [](std::vector<double> v) { return chi_bench::Median(std::move(v)); }, &ok);
      std::printf("  probe %-42s %8.0f%s\n", r.name, ns, ok ? "" : " (timed out)");
      if (!ok) Die("the owner probe timed out");
    }
  }
}

/**
 * The raw cpu2gpu round trip through the real queue code and server loop on a private queue
 * set, `blocks` x `threads` server threads, no runtime around it: in MiniOrchestrator (no
 * register cap) or, `capped`, in the runtime's own OrchestratorKernel.
 */
void MiniOrchestratorProbe(Bench &B, u32 iters, u32 blocks, u32 threads, bool capped = false) {
  using List = chi::gpu::GpuModuleList<chimaera::demo::GpuRuntime>;
  owner_probe::MiniQueues m;
  if (!m.Make(blocks * threads)) Die("mini orchestrator memory");
  if (capped) {
    chi::gpu::OrchestratorKernel<List><<<blocks, threads, 0, B.b>>>(m.set.Args(0));
  } else {
    owner_probe::MiniOrchestrator<List><<<blocks, threads, 0, B.b>>>(m.set.Args(0));
  }
  Ok(cudaGetLastError(), "mini orchestrator launch");
  std::vector<double> v;
  for (u32 i = 0; i < iters; ++i) {
    const double t0 = chi_bench::NowNs();
    if (!m.RoundTrip(0, 5e9, [] { return chi_bench::NowNs(); })) Die("mini orchestrator: no answer");
    v.push_back(chi_bench::NowNs() - t0);
  }
  if (!m.Stop(B.a)) Die("mini orchestrator stop");
  Wait(B.b, "mini orchestrator");
  std::printf("  %s %u x %u: raw slot round trip %.0f ns (median)\n",
              capped ? "OrchestratorKernel (register cap)" : "mini orchestrator (no cap)",
              blocks, threads,
              chi_bench::Median(std::vector<double>(v.begin() + iters / 10, v.end())));
  cudaFreeHost(m.pinned);
  cudaFree(m.device);
}

}  // namespace bench_gpu
