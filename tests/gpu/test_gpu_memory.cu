// Client kernels' memory on a real GPU, in one process with an embedded runtime: CHI_GPU_HEAP
// from 2048 threads (allocate, fill, verify, free; across threads; to exhaustion; blocks kept
// across kernels of other grids; two kernels at once on two streams; 256 KiB blocks from the
// shared large partition; a user's own region formatted by FormatGpuHeap), and a gpu2cpu
// queue the test makes in its own pinned memory and registers with CHI_IPC->RegisterGpuQueue.
// Label gpu; without a GPU it prints "skipped: no GPU" and exits 77. The host never
// synchronises the whole device (the orchestrator never returns).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chi/chi.h>
#include <chi/gpu/gpu_arena.h>
#include <chi/gpu/gpu_manager.h>
#include <chi/gpu/orchestrator.h>
#include <chi/mods/demo/demo_client.h>
#include <chi/mods/demo/demo_runtime.h>
#include <chi/runtime/chimaera.h>

#include <cstring>
#include <string>

#include "gpu_test_main.h"  // main: GPU check, runtime, demo pool, doctest

CHI_GPU_MODULES(chimaera::demo::GpuRuntime);

namespace {

using chi::u32;
using chi::u64;
using SysQueue = chi::gpu::GpuQueue<chi::MemScope::kSystem>;

const chi::PoolId kPool(430, 0);
constexpr u64 kKernelTimeoutNs = 120000000000ull;
constexpr u32 kBlockThreads = 256;

/** What the heap kernels count (device memory). */
struct HeapCounters {
  u32 intact;         ///< blocks whose fill was still there when checked
  u32 broken;         ///< blocks whose fill was not
  u32 no_memory;      ///< allocations that returned nullptr where room was expected
  u32 refused_frees;  ///< Free returned false for a live block
  unsigned long long in_use;  ///< the region's BytesInUse (InUseKernel)
  u32 exhausted;      ///< threads whose allocations ran out (the exhaustion kernel)
  u32 max_live;       ///< most blocks one thread held at once there
  u32 overlapped;     ///< ConcurrentKernel blocks that saw the other kernel's blocks start
  u32 ran_dry;        ///< HeavyKernel threads that some round left on nullptr
};

/** Fills a block with words naming (thread, round, index). */
__device__ void Fill(u32 *p, u32 words, u32 tid, u32 round, u32 j) {
  for (u32 i = 0; i < words; ++i) p[i] = (tid << 12) ^ (round << 4) ^ j ^ (i * 2654435761u);
}

/** True when Fill's words are all still there. */
__device__ bool Intact(const u32 *p, u32 words, u32 tid, u32 round, u32 j) {
  for (u32 i = 0; i < words; ++i) {
    if (p[i] != ((tid << 12) ^ (round << 4) ^ j ^ (i * 2654435761u))) return false;
  }
  return true;
}

/** One thread: the BytesInUse of every partition of info's heap region (~0: no region). */
__global__ void InUseKernel(chi::gpu::GpuInfo info, HeapCounters *c) {
  chi::gpu::GpuHeapRegion *r = chi::gpu::GpuHeapRegion::Open(info.heap_, info.heap_bytes_);
  c->in_use = r == nullptr ? ~0ull : r->BytesInUse();
}

/**
 * Every thread, `rounds` times: allocates four blocks of varied sizes, fills and checks
 * them, frees two itself and hands one to its neighbour in the block (freed there, after a
 * barrier); the last goes through a GpuArena taken from the heap.
 */
__global__ void HeapKernel(chi::gpu::GpuInfo info, u32 rounds, HeapCounters *c) {
  CHIMAERA_GPU_INIT(info);
  __shared__ u32 *handed[kBlockThreads];
  __shared__ u32 handed_words[kBlockThreads];
  const u32 tid = chi::gpu::GlobalThreadId();
  const u32 me = threadIdx.x;
  u32 intact = 0, broken = 0, no_memory = 0, refused = 0;
  for (u32 r = 0; r < rounds; ++r) {
    u32 *blocks[3];
    u32 words[3];
    for (u32 j = 0; j < 3; ++j) {
      words[j] = 4 + (tid * 7 + r * 13 + j * 29) % 500;  // 16 B .. 2 KiB
      blocks[j] = static_cast<u32 *>(CHI_GPU_HEAP->Allocate(words[j] * 4));
      if (blocks[j] == nullptr) ++no_memory;
      else Fill(blocks[j], words[j], tid, r, j);
    }
    for (u32 j = 0; j < 2; ++j) {
      if (blocks[j] == nullptr) continue;
      Intact(blocks[j], words[j], tid, r, j) ? ++intact : ++broken;
      if (!CHI_GPU_HEAP->Free(blocks[j])) ++refused;
    }
    handed[me] = blocks[2];
    handed_words[me] = words[2];
    __syncthreads();
    const u32 from = (me + 1) % blockDim.x;  // the neighbour's block, freed by this thread
    const u32 from_tid = tid - me + from;
    if (u32 *p = handed[from]) {
      Intact(p, handed_words[from], from_tid, r, 2) ? ++intact : ++broken;
      if (!CHI_GPU_HEAP->Free(p)) ++refused;
    }
    chi::gpu::GpuArena arena = chi::gpu::GpuArena::FromHeap(CHI_GPU_HEAP, 512);
    auto *scratch = static_cast<u32 *>(arena.Allocate(64 * 4));
    if (scratch == nullptr) {
      ++no_memory;
    } else {
      Fill(scratch, 64, tid, r, 3);
      Intact(scratch, 64, tid, r, 3) ? ++intact : ++broken;
    }
    arena.Reset();
    arena.ReturnTo(CHI_GPU_HEAP);
    __syncthreads();  // the neighbour is done with handed[] before the next round writes it
  }
  atomicAdd(&c->intact, intact);
  atomicAdd(&c->broken, broken);
  atomicAdd(&c->no_memory, no_memory);
  atomicAdd(&c->refused_frees, refused);
}

/** Every thread allocates 4 KiB blocks until its heap says no, checks them, frees them. */
__global__ void ExhaustKernel(chi::gpu::GpuInfo info, HeapCounters *c) {
  CHIMAERA_GPU_INIT(info);
  constexpr u32 kMost = 64;
  u32 *live[kMost];
  u32 n = 0;
  const u32 tid = chi::gpu::GlobalThreadId();
  while (n < kMost) {
    auto *p = static_cast<u32 *>(CHI_GPU_HEAP->Allocate(4000));
    if (p == nullptr) break;
    Fill(p, 16, tid, n, 0);
    live[n++] = p;
  }
  if (n < kMost) atomicAdd(&c->exhausted, 1u);
  atomicMax(&c->max_live, n);
  u32 broken = 0, refused = 0;
  for (u32 i = 0; i < n; ++i) {
    broken += !Intact(live[i], 16, tid, i, 0);
    refused += !CHI_GPU_HEAP->Free(live[i]);
  }
  // A freed block makes the next allocation succeed again.
  void *again = CHI_GPU_HEAP->Allocate(4000);
  if (again == nullptr) atomicAdd(&c->no_memory, 1u);
  else refused += !CHI_GPU_HEAP->Free(again);
  atomicAdd(&c->broken, broken);
  atomicAdd(&c->refused_frees, refused);
}

/** Blocks each thread of KeepKernel leaves live. */
constexpr u32 kKeptPerThread = 3;
/** KeepKernel's and CheckKeptKernel's threads (grids 4 x 128 and 2 x 256). */
constexpr u32 kKeepThreads = 512;

/** The words of block j KeepKernel's thread tid keeps. */
__device__ u32 KeptWords(u32 tid, u32 j) { return 8 + (tid * 5 + j * 37) % 200; }

/** Allocates and fills kKeptPerThread blocks per thread and leaves them live in kept[]. */
__global__ void KeepKernel(chi::gpu::GpuInfo info, u32 **kept, HeapCounters *c) {
  CHIMAERA_GPU_INIT(info);
  const u32 tid = chi::gpu::GlobalThreadId();
  for (u32 j = 0; j < kKeptPerThread; ++j) {
    auto *p = static_cast<u32 *>(CHI_GPU_HEAP->Allocate(KeptWords(tid, j) * 4));
    if (p == nullptr) atomicAdd(&c->no_memory, 1u);
    else Fill(p, KeptWords(tid, j), tid, 7, j);
    kept[tid * kKeptPerThread + j] = p;
  }
}

/**
 * Every thread, `rounds` times: allocates blocks of 256 B .. 2 KiB until its partition runs
 * dry (or 64 of them), fills each whole, then checks and frees them.
 */
__global__ void HeavyKernel(chi::gpu::GpuInfo info, u32 rounds, HeapCounters *c) {
  CHIMAERA_GPU_INIT(info);
  constexpr u32 kMost = 64;
  const u32 tid = chi::gpu::GlobalThreadId();
  u32 intact = 0, broken = 0, refused = 0, most = 0;
  bool ran_dry = false;
  for (u32 r = 0; r < rounds; ++r) {
    u32 *live[kMost];
    u32 n = 0;
    while (n < kMost) {
      const u32 words = 64u << ((tid + n) % 4);
      auto *p = static_cast<u32 *>(CHI_GPU_HEAP->Allocate(words * 4));
      if (p == nullptr) break;
      Fill(p, words, tid, r, n);
      live[n++] = p;
    }
    most = n > most ? n : most;
    ran_dry = ran_dry || n < kMost;
    for (u32 i = 0; i < n; ++i) {
      Intact(live[i], 64u << ((tid + i) % 4), tid, r, i) ? ++intact : ++broken;
      refused += !CHI_GPU_HEAP->Free(live[i]);
    }
  }
  atomicAdd(&c->intact, intact);
  atomicAdd(&c->broken, broken);
  atomicAdd(&c->refused_frees, refused);
  atomicMax(&c->max_live, most);
  if (ran_dry) atomicAdd(&c->ran_dry, 1u);
}

/** Checks KeepKernel's blocks (thread tid those of KeepKernel's tid) and frees them. */
__global__ void CheckKeptKernel(chi::gpu::GpuInfo info, u32 **kept, HeapCounters *c) {
  CHIMAERA_GPU_INIT(info);
  const u32 tid = chi::gpu::GlobalThreadId();
  for (u32 j = 0; j < kKeptPerThread; ++j) {
    u32 *p = kept[tid * kKeptPerThread + j];
    if (p == nullptr) continue;
    Intact(p, KeptWords(tid, j), tid, 7, j) ? atomicAdd(&c->intact, 1u)
                                            : atomicAdd(&c->broken, 1u);
    if (!CHI_GPU_HEAP->Free(p)) atomicAdd(&c->refused_frees, 1u);
  }
}

/** LargeKernel's grid (4 x 8) and block size: 8 MiB in all, within the 12 MiB large space. */
constexpr u32 kLargeBlocks = 4, kLargeThreads = 8;
constexpr u32 kLargeWords = (256u << 10) / 4;

/**
 * Every thread takes one 256 KiB block (far beyond its ~24 KiB partition: the region's shared
 * large partition serves it), fills it whole, and after a barrier checks and frees it.
 */
__global__ void LargeKernel(chi::gpu::GpuInfo info, HeapCounters *c) {
  CHIMAERA_GPU_INIT(info);
  const u32 tid = chi::gpu::GlobalThreadId();
  auto *p = static_cast<u32 *>(CHI_GPU_HEAP->Allocate(kLargeWords * 4));
  if (p != nullptr) Fill(p, kLargeWords, tid, 0, 5);
  __syncthreads();  // the block's 256 KiB blocks are all live at once before any is checked
  if (p == nullptr) {
    atomicAdd(&c->no_memory, 1u);
    return;
  }
  Intact(p, kLargeWords, tid, 0, 5) ? atomicAdd(&c->intact, 1u) : atomicAdd(&c->broken, 1u);
  if (!CHI_GPU_HEAP->Free(p)) atomicAdd(&c->refused_frees, 1u);
}

/**
 * One of two kernels run at once on two streams: each block first waits (at most 2 s) until
 * `blocks_total` blocks of both have started; then every thread, `rounds` times, frees the
 * block it took kHold rounds ago (after checking it) and takes a new one, filled with words
 * naming (launch, thread, round).
 */
__global__ void ConcurrentKernel(chi::gpu::GpuInfo info, u32 launch, u32 rounds, u32 *started,
                                 u32 blocks_total, HeapCounters *c) {
  CHIMAERA_GPU_INIT(info);
  constexpr u32 kHold = 4;
  if (threadIdx.x == 0) {
    atomicAdd(started, 1u);
    const u64 t0 = chi::gpu::ClockNs();
    while (atomicAdd(started, 0u) < blocks_total && chi::gpu::ClockNs() - t0 < 2000000000ull) {
    }
    if (atomicAdd(started, 0u) >= blocks_total) atomicAdd(&c->overlapped, 1u);
  }
  __syncthreads();
  const u32 me = chi::gpu::GlobalThreadId() + (launch << 16);
  u32 *held[kHold] = {};
  u32 words[kHold] = {};
  u32 round[kHold] = {};
  u32 intact = 0, broken = 0, no_memory = 0, refused = 0;
  for (u32 r = 0; r < rounds + kHold; ++r) {
    const u32 k = r % kHold;
    if (held[k] != nullptr) {
      Intact(held[k], words[k], me, round[k], k) ? ++intact : ++broken;
      refused += !CHI_GPU_HEAP->Free(held[k]);
      held[k] = nullptr;
    }
    if (r >= rounds) continue;
    words[k] = 4 + (me * 11 + r * 17) % 300;
    round[k] = r;
    held[k] = static_cast<u32 *>(CHI_GPU_HEAP->Allocate(words[k] * 4));
    if (held[k] == nullptr) ++no_memory;
    else Fill(held[k], words[k], me, r, k);
  }
  atomicAdd(&c->intact, intact);
  atomicAdd(&c->broken, broken);
  atomicAdd(&c->no_memory, no_memory);
  atomicAdd(&c->refused_frees, refused);
}

/** What a submitting kernel counts. */
struct SubmitCounters {
  u32 correct;
  u32 wrong;
  u32 value;  ///< thread 0's result
  u32 rc;     ///< thread 0's return code (999: empty future, 998: no answer in time)
};

/** Every thread submits `count` ToLocalCpu() tasks through info.gpu2cpu_ (v -> 2 v). */
__global__ void ToCpuKernel(chi::gpu::GpuInfo info, chi::PoolId pool, u32 count, u32 base,
                            float wait_sec, SubmitCounters *c) {
  CHIMAERA_GPU_INIT(info);
  chimaera::demo::Client client(pool);
  const u32 tid = chi::gpu::GlobalThreadId();
  for (u32 i = 0; i < count; ++i) {
    const u32 v = base + tid * count + i;
    auto f = client.AsyncGpuSubmit(chi::PoolQuery::ToLocalCpu(), 0, v);
    const bool answered = f.IsValid() && f.Wait(wait_sec);
    const bool ok = answered && f->GetReturnCode() == 0 && f->result_value_ == v * 2;
    atomicAdd(ok ? &c->correct : &c->wrong, 1u);
    if (tid == 0) {
      c->value = answered ? f->result_value_ : 0;
      c->rc = !f.IsValid() ? 999 : answered ? f->GetReturnCode() : 998;
    }
    if (!ok) return;
  }
}

/** Test memory made before the runtime starts. */
struct Env {
  cudaStream_t stream = nullptr;
  cudaStream_t second = nullptr;  ///< the concurrent-kernels test's other stream
  HeapCounters *heap = nullptr;
  SubmitCounters *submit = nullptr;
  u32 **kept = nullptr;      ///< KeepKernel's blocks (kKeepThreads x kKeptPerThread)
  u32 *started = nullptr;    ///< ConcurrentKernel's start count
  char *user_heap = nullptr;  ///< a region of the test's own (kUserHeapBytes, never freed)
};
Env g_env;

/** Runs `launch` on the test stream with counters zeroed; copies them back (bounded wait). */
template <typename T, typename Launch>
T Run(T *counters, Launch launch) {
  T host{};
  REQUIRE(cudaMemsetAsync(counters, 0, sizeof(T), g_env.stream) == cudaSuccess);
  launch(g_env.stream);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const chi::Status st = chi::gpu::WaitStream(g_env.stream, kKernelTimeoutNs);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  REQUIRE(cudaMemcpyAsync(&host, counters, sizeof(T), cudaMemcpyDeviceToHost, g_env.stream) ==
          cudaSuccess);
  REQUIRE(cudaStreamSynchronize(g_env.stream) == cudaSuccess);
  return host;
}

/** The size of the test's own heap region. */
constexpr u64 kUserHeapBytes = 4ull << 20;

/** The BytesInUse of every partition of info's heap region (~0: not a formatted region). */
unsigned long long HeapInUse(const chi::gpu::GpuInfo &info) {
  return Run(g_env.heap, [&](cudaStream_t s) { InUseKernel<<<1, 1, 0, s>>>(info, g_env.heap); })
      .in_use;
}

/**
 * A gpu2cpu queue in the test's own memory: request/answer words, payloads and served
 * sequences in pinned memory, claims and client records in device memory, and the
 * descriptor kernels read in pinned memory (same address on both sides).
 */
class UserQueue {
 public:
  static constexpr u32 kSlots = 64;

  UserQueue() {
    const u32 payload = chi::gpu::kGpuPayloadBytes;
    const u64 shared = SysQueue::SharedBytes(kSlots, payload);
    const u64 server = SysQueue::ServerBytes(kSlots);
    pinned_bytes_ = Lines(shared) + Lines(server) + Lines(sizeof(SysQueue));
    const u64 client = SysQueue::ClientBytes(kSlots, true);
    REQUIRE(cudaHostAlloc(&pinned_, pinned_bytes_, cudaHostAllocPortable) == cudaSuccess);
    REQUIRE(cudaMalloc(&device_, client) == cudaSuccess);
    std::memset(pinned_, 0, pinned_bytes_);
    REQUIRE(cudaMemsetAsync(device_, 0, client, g_env.stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(g_env.stream) == cudaSuccess);
    char *p = static_cast<char *>(pinned_);
    queue_ = SysQueue::Make(kSlots, payload, 5000000000ull, p, static_cast<char *>(device_), true,
                            p + Lines(shared), nullptr);
    descriptor_ = reinterpret_cast<SysQueue *>(p + Lines(shared) + Lines(server));
    *descriptor_ = queue_;
  }
  /** Frees with the orchestrator paused: cudaFree waits for every kernel on the device. */
  ~UserQueue() {
    const bool paused = CHI_IPC->PauseGpuOrchestrator().ok();
    cudaFreeHost(pinned_);
    cudaFree(device_);
    if (paused) CHI_IPC->ResumeGpuOrchestrator();
  }

  const SysQueue &Queue() const { return queue_; }
  /** GetClientGpuInfo(0) with ToLocalCpu() sent through this queue. */
  chi::gpu::GpuInfo Info() const {
    chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
    info.gpu2cpu_ = descriptor_;
    return info;
  }
  /** Slots whose last request the worker served (it writes served_ in our pinned memory). */
  u32 ServedSlots() const {
    u32 n = 0;
    for (u32 s = 0; s < kSlots; ++s) n += queue_.served_[s] != 0;
    return n;
  }
  /** Slots holding a request with no answer. */
  u32 UnansweredSlots() const {
    u32 n = 0;
    for (u32 s = 0; s < kSlots; ++s) {
      const u32 asked = static_cast<u32>(queue_.request_[s].Load());
      n += asked != static_cast<u32>(queue_.answer_[s].Load());
    }
    return n;
  }

 private:
  static u64 Lines(u64 n) { return (n + 63) & ~63ull; }
  void *pinned_ = nullptr;
  void *device_ = nullptr;
  u64 pinned_bytes_ = 0;
  SysQueue queue_;
  SysQueue *descriptor_ = nullptr;
};

}  // namespace

TEST_CASE("the runtime gives every GPU a client heap through GetClientGpuInfo") {
  const chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  CHECK(info.heap_ != nullptr);
  CHECK(info.heap_bytes_ == chi::gpu::kGpuClientHeapBytes);
}

TEST_CASE("2048 GPU threads allocate, fill, verify and free from CHI_GPU_HEAP; all comes back") {
  const chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  constexpr u32 kRounds = 200;
  HeapCounters c = Run(g_env.heap, [&](cudaStream_t s) {
    HeapKernel<<<8, kBlockThreads, 0, s>>>(info, kRounds, g_env.heap);
  });
  CHECK(c.broken == 0);
  CHECK(c.no_memory == 0);
  CHECK(c.refused_frees == 0);
  CHECK(c.intact == 2048u * kRounds * 4);
  CHECK(HeapInUse(info) == 0);
}

TEST_CASE("a GPU thread's heap runs out with nullptr, never a hang, and a free makes room again") {
  const chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  HeapCounters c = Run(g_env.heap, [&](cudaStream_t s) {
    ExhaustKernel<<<8, kBlockThreads, 0, s>>>(info, g_env.heap);
  });
  CHECK(c.exhausted == 2048);  // ~24 KiB a thread, a 4 MiB spill for all: < 64 x 4 KiB
  CHECK(c.max_live >= 1);
  CHECK(c.broken == 0);
  CHECK(c.refused_frees == 0);
  CHECK(c.no_memory == 0);
  CHECK(HeapInUse(info) == 0);
}

TEST_CASE("a kernel's live blocks survive a heavy kernel of another grid, and a third frees them") {
  const chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  REQUIRE(HeapInUse(info) == 0);
  HeapCounters keep = Run(g_env.heap, [&](cudaStream_t s) {
    KeepKernel<<<4, 128, 0, s>>>(info, g_env.kept, g_env.heap);
  });
  CHECK(keep.no_memory == 0);
  const unsigned long long kept_bytes = HeapInUse(info);
  CHECK(kept_bytes > 0);
  HeapCounters heavy = Run(g_env.heap, [&](cudaStream_t s) {
    HeavyKernel<<<16, kBlockThreads, 0, s>>>(info, 4, g_env.heap);  // 2 threads a partition
  });
  CHECK(heavy.broken == 0);
  CHECK(heavy.refused_frees == 0);
  CHECK(heavy.intact > 0);
  CHECK(heavy.ran_dry > 4096 / 2);  // the partitions and the spill ran dry
  CHECK(HeapInUse(info) == kept_bytes);
  HeapCounters check = Run(g_env.heap, [&](cudaStream_t s) {
    CheckKeptKernel<<<2, kBlockThreads, 0, s>>>(info, g_env.kept, g_env.heap);
  });
  CHECK(check.broken == 0);
  CHECK(check.intact == kKeepThreads * kKeptPerThread);
  CHECK(check.refused_frees == 0);
  CHECK(HeapInUse(info) == 0);
}

TEST_CASE("two kernels at once on two streams never get the same block of the client heap") {
  const chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  constexpr u32 kRounds = 400;
  HeapCounters host{};
  REQUIRE(cudaMemsetAsync(g_env.heap, 0, sizeof(HeapCounters), g_env.stream) == cudaSuccess);
  REQUIRE(cudaMemsetAsync(g_env.started, 0, sizeof(u32), g_env.stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(g_env.stream) == cudaSuccess);
  ConcurrentKernel<<<8, 128, 0, g_env.stream>>>(info, 0, kRounds, g_env.started, 12, g_env.heap);
  ConcurrentKernel<<<4, kBlockThreads, 0, g_env.second>>>(info, 1, kRounds, g_env.started, 12,
                                                          g_env.heap);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  for (cudaStream_t s : {g_env.stream, g_env.second}) {
    const chi::Status st = chi::gpu::WaitStream(s, kKernelTimeoutNs);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
  }
  REQUIRE(cudaMemcpyAsync(&host, g_env.heap, sizeof(host), cudaMemcpyDeviceToHost,
                          g_env.stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(g_env.stream) == cudaSuccess);
  WARN_MESSAGE(host.overlapped == 12, "the two kernels did not all run at once");
  CHECK(host.broken == 0);
  CHECK(host.no_memory == 0);  // 2048 threads, 2048 partitions: each thread has its own
  CHECK(host.refused_frees == 0);
  CHECK(host.intact == 2048u * kRounds);
  CHECK(HeapInUse(info) == 0);
}

TEST_CASE("GPU threads each take a 256 KiB block of the client heap, fill, verify, free it") {
  const chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  REQUIRE(HeapInUse(info) == 0);
  HeapCounters c = Run(g_env.heap, [&](cudaStream_t s) {
    LargeKernel<<<kLargeBlocks, kLargeThreads, 0, s>>>(info, g_env.heap);
  });
  CHECK(c.no_memory == 0);
  CHECK(c.broken == 0);
  CHECK(c.refused_frees == 0);
  CHECK(c.intact == kLargeBlocks * kLargeThreads);
  CHECK(HeapInUse(info) == 0);
}

TEST_CASE("a user's own region is no heap until FormatGpuHeap formats it, then serves kernels") {
  chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  info.heap_ = g_env.user_heap;
  info.heap_bytes_ = kUserHeapBytes;
  HeapCounters none = Run(g_env.heap, [&](cudaStream_t s) {
    ExhaustKernel<<<1, 32, 0, s>>>(info, g_env.heap);
  });
  CHECK(none.max_live == 0);  // garbage, not a region: CHI_GPU_HEAP gives nullptr
  CHECK(HeapInUse(info) == ~0ull);
  const chi::Status st = chi::gpu::FormatGpuHeap(g_env.user_heap, kUserHeapBytes, 64);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  HeapCounters used = Run(g_env.heap, [&](cudaStream_t s) {
    ExhaustKernel<<<2, 32, 0, s>>>(info, g_env.heap);  // 64 threads, 64 partitions of ~48 KiB
  });
  CHECK(used.max_live >= 8);
  CHECK(used.broken == 0);
  CHECK(used.refused_frees == 0);
  CHECK(used.no_memory == 0);
  CHECK(HeapInUse(info) == 0);
}

TEST_CASE("a kernel without a heap region gets nullptr from CHI_GPU_HEAP") {
  chi::gpu::GpuInfo info = CHI_IPC->GetClientGpuInfo(0);
  info.heap_ = nullptr;
  info.heap_bytes_ = 0;
  HeapCounters c = Run(g_env.heap, [&](cudaStream_t s) {
    ExhaustKernel<<<1, 32, 0, s>>>(info, g_env.heap);
  });
  CHECK(c.exhausted == 32);
  CHECK(c.max_live == 0);
  CHECK(c.no_memory == 32);
}

TEST_CASE("a registered user gpu2cpu queue carries a kernel's ToLocalCpu tasks: 88 -> 176") {
  UserQueue uq;
  REQUIRE(CHI_IPC->RegisterGpuQueue(uq.Queue()).ok());
  CHECK(CHI_IPC->AssignGpuLanesToWorker().ok());
  CHECK(CHI_IPC->RegisterGpuQueue(uq.Queue()).code() == chi::ErrorCode::kAlreadyExists);
  const chi::gpu::GpuInfo info = uq.Info();
  SubmitCounters one = Run(g_env.submit, [&](cudaStream_t s) {
    ToCpuKernel<<<1, 1, 0, s>>>(info, kPool, 1, 88, 5.0f, g_env.submit);
  });
  CHECK(one.rc == 0);
  CHECK(one.value == 176);
  CHECK(uq.ServedSlots() >= 1);  // the worker answered through our queue
  SubmitCounters many = Run(g_env.submit, [&](cudaStream_t s) {
    ToCpuKernel<<<2, 64, 0, s>>>(info, kPool, 20, 1000, 5.0f, g_env.submit);
  });
  CHECK(many.correct == 128 * 20);
  CHECK(many.wrong == 0);
  const chi::Status st = CHI_IPC->UnregisterGpuQueue(uq.Queue());
  CHECK_MESSAGE(st.ok(), st.ToString());
}

TEST_CASE("an unregistered user queue is no longer polled, so its memory may be freed") {
  UserQueue uq;
  REQUIRE(CHI_IPC->RegisterGpuQueue(uq.Queue()).ok());
  const chi::gpu::GpuInfo info = uq.Info();
  SubmitCounters before = Run(g_env.submit, [&](cudaStream_t s) {
    ToCpuKernel<<<1, 1, 0, s>>>(info, kPool, 1, 21, 5.0f, g_env.submit);
  });
  CHECK(before.value == 42);
  REQUIRE(CHI_IPC->UnregisterGpuQueue(uq.Queue()).ok());
  CHECK(CHI_IPC->UnregisterGpuQueue(uq.Queue()).code() == chi::ErrorCode::kNotFound);
  SubmitCounters after = Run(g_env.submit, [&](cudaStream_t s) {
    ToCpuKernel<<<1, 1, 0, s>>>(info, kPool, 1, 21, 0.5f, g_env.submit);
  });
  CHECK(after.correct == 0);
  CHECK(after.rc == 998);              // posted, never answered
  CHECK(uq.UnansweredSlots() == 1);    // the request sits in the queue, untouched
}

TEST_CASE("RegisterGpuQueue names what is wrong with a bad queue") {
  SysQueue empty;
  const chi::Status st = CHI_IPC->RegisterGpuQueue(empty);
  CHECK(st.code() == chi::ErrorCode::kInvalidArgument);
  CHECK(std::string(st.message()).find("null") != std::string::npos);
}

/** The test memory and kernels, then the runtime and the tests (gpu_test_main.h). */
int main(int argc, char **argv) {
  return chi_gpu_test::RunWithRuntime(argc, argv, "gpu_memory_test", kPool, [] {
    return cudaStreamCreateWithFlags(&g_env.stream, cudaStreamNonBlocking) == cudaSuccess &&
           cudaMalloc(&g_env.heap, sizeof(HeapCounters)) == cudaSuccess &&
           cudaStreamCreateWithFlags(&g_env.second, cudaStreamNonBlocking) == cudaSuccess &&
           cudaMalloc(&g_env.submit, sizeof(SubmitCounters)) == cudaSuccess &&
           cudaMalloc(&g_env.kept, sizeof(u32 *) * kKeepThreads * kKeptPerThread) ==
               cudaSuccess &&
           cudaMalloc(&g_env.started, sizeof(u32)) == cudaSuccess &&
           cudaMalloc(&g_env.user_heap, kUserHeapBytes) == cudaSuccess &&
           cudaMemset(g_env.user_heap, 0xA5, kUserHeapBytes) == cudaSuccess &&
           chi::gpu::PreloadKernel(HeapKernel) == cudaSuccess &&
           chi::gpu::PreloadKernel(ExhaustKernel) == cudaSuccess &&
           chi::gpu::PreloadKernel(InUseKernel) == cudaSuccess &&
           chi::gpu::PreloadKernel(KeepKernel) == cudaSuccess &&
           chi::gpu::PreloadKernel(HeavyKernel) == cudaSuccess &&
           chi::gpu::PreloadKernel(CheckKeptKernel) == cudaSuccess &&
           chi::gpu::PreloadKernel(ConcurrentKernel) == cudaSuccess &&
           chi::gpu::PreloadKernel(LargeKernel) == cudaSuccess &&
           chi::gpu::PreloadKernel(ToCpuKernel) == cudaSuccess;
  });
}
