// Allocator benchmark: SizeClassAllocator (and ArenaAllocator) in a POSIX shm segment
// against glibc malloc/free, on the same workloads in the same run. Prints the median
// ns per allocate+free pair over several repetitions and the ratio to malloc (the floor).
// Usage: allocators [repetitions=7]
#include <chi/memory/arena_allocator.h>
#include <chi/memory/malloc_backend.h>
#include <chi/memory/posix_shm_backend.h>
#include <chi/memory/size_class_allocator.h>

#include <unistd.h>  // getpid

#include <algorithm>  // sort, shuffle
#include <atomic>     // start barrier of the two-thread runs (harness only)
#include <chrono>     // steady_clock
#include <cstdio>     // printf
#include <cstdlib>    // malloc, free, atoi
#include <random>     // sizes and free orders
#include <string>     // segment name
#include <thread>     // two-thread runs
#include <vector>     // samples

namespace {

using chi::ShmPtr;
using chi::SizeClassAllocator;
using chi::u32;
using chi::u64;
using chi::u8;

constexpr u64 kPairOps = 2000000;   // allocate+free pairs per thread per repetition
constexpr u64 kBatch = 1000;        // blocks live at once in the batch workload
constexpr u64 kBatchRounds = 2000;  // batches per thread per repetition
constexpr u64 kSizeCount = 4096;    // length of the pre-drawn size sequence
constexpr u64 kSegmentBytes = 512ull << 20;

volatile u64 g_sink;  // keeps the compiler from deleting malloc/free pairs

/** Sizes drawn once (log-uniform in [16, 4096]) so both allocators see the same ones. */
std::vector<u64> DrawSizes(u64 seed, bool fixed64) {
  std::mt19937_64 rng(seed);
  std::vector<u64> sizes(kSizeCount);
  for (u64 &s : sizes) {
    u64 hi = 1ull << (4 + rng() % 9);  // 16 .. 4096
    s = fixed64 ? 64 : hi - rng() % (hi / 2);
  }
  return sizes;
}

/** glibc malloc/free behind the interface the workloads use. */
struct MallocApi {
  using Handle = void *;
  Handle Alloc(u64 n) { return std::malloc(n); }
  u8 *Ptr(Handle h) { return static_cast<u8 *>(h); }
  void Free(Handle h) { std::free(h); }
};

/** Our allocator, keeping ShmPtrs as real users do. */
struct ChiApi {
  using Handle = ShmPtr<void>;
  SizeClassAllocator *alloc;
  Handle Alloc(u64 n) { return alloc->Allocate(n); }
  u8 *Ptr(Handle h) { return static_cast<u8 *>(alloc->ToPointer(h)); }
  void Free(Handle h) { alloc->Free(h); }
};

/** Allocate, touch one byte, free: `ops` times. */
template <typename Api>
void RunPairs(Api &api, const std::vector<u64> &sizes, u64 ops) {
  u64 sum = 0;
  for (u64 i = 0; i < ops; ++i) {
    typename Api::Handle h = api.Alloc(sizes[i % kSizeCount]);
    u8 *p = api.Ptr(h);
    p[0] = static_cast<u8>(i);
    sum += p[0];
    api.Free(h);
  }
  g_sink = g_sink + sum;
}

/** Allocate kBatch blocks, then free them in a shuffled order: `rounds` times. */
template <typename Api>
void RunBatches(Api &api, const std::vector<u64> &sizes, const std::vector<u32> &order,
                u64 rounds) {
  std::vector<typename Api::Handle> live(kBatch);
  u64 sum = 0, k = 0;
  for (u64 r = 0; r < rounds; ++r) {
    for (u64 i = 0; i < kBatch; ++i) {
      live[i] = api.Alloc(sizes[k++ % kSizeCount]);
      api.Ptr(live[i])[0] = static_cast<u8>(i);
    }
    for (u32 i : order) {
      sum += api.Ptr(live[i])[0];
      api.Free(live[i]);
    }
  }
  g_sink = g_sink + sum;
}

/** Wall-clock nanoseconds of `threads` copies of body(thread_index) started together. */
template <typename Body>
double TimeThreads(int threads, Body body) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) chi::CpuRelax();
      body(t);
    });
  }
  while (ready.load() < threads - 1) chi::CpuRelax();
  auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  body(0);
  for (std::thread &t : pool) t.join();
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/** One table row: median ns per pair (per thread) for ours and for malloc. */
struct Row {
  const char *name;
  int threads;
  double chi_ns;
  double malloc_ns;
};

void PrintRow(const Row &r) {
  std::printf("%-44s %7d %10.1f %12.1f %11.2f\n", r.name, r.threads, r.chi_ns, r.malloc_ns,
              r.chi_ns / r.malloc_ns);
}

}  // namespace

int main(int argc, char **argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  if (reps < 1) {
    std::fprintf(stderr, "usage: %s [repetitions >= 1]\n", argv[0]);
    return 2;
  }
  const std::string name = "bench_alloc_" + std::to_string(getpid());
  chi::PosixShmBackend backend;
  if (chi::Status st = backend.Create(name, kSegmentBytes); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  chi::PosixShmBackend::DestroyByName(name);  // the mapping lives on; nothing is left behind
  SizeClassAllocator *alloc = nullptr;
  if (chi::Status st = chi::CreateAllocator(backend, chi::AllocatorId(900, 1), &alloc);
      !st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  ChiApi chi_api{alloc};
  MallocApi malloc_api;
  const u64 free_at_start = alloc->FreeBytes();

  std::vector<std::vector<u64>> fixed = {DrawSizes(1, true), DrawSizes(2, true)};
  std::vector<std::vector<u64>> mixed = {DrawSizes(3, false), DrawSizes(4, false)};
  std::vector<u32> order(kBatch);
  for (u32 i = 0; i < kBatch; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(5));

  std::printf("allocators: SizeClassAllocator in POSIX shm vs glibc malloc/free\n");
  std::printf("median of %d runs; ns per allocate+free pair, per thread (wall time / pairs "
              "per thread)\n\n",
              reps);
  std::printf("%-44s %7s %10s %12s %11s\n", "workload", "threads", "chi ns", "malloc ns",
              "chi/malloc");

  for (int threads : {1, 2}) {
    auto measure = [&](const char *label, auto run, u64 pairs_per_thread) {
      std::vector<double> chi_ns, malloc_ns;
      for (int r = 0; r < reps; ++r) {
        chi_ns.push_back(TimeThreads(threads, [&](int t) { run(chi_api, t); }) /
                         static_cast<double>(pairs_per_thread));
        malloc_ns.push_back(TimeThreads(threads, [&](int t) { run(malloc_api, t); }) /
                            static_cast<double>(pairs_per_thread));
      }
      PrintRow({label, threads, Median(chi_ns), Median(malloc_ns)});
    };
    measure(
        "pair, 64 B",
        [&](auto &api, int t) { RunPairs(api, fixed[t], kPairOps); }, kPairOps);
    measure(
        "pair, 16 B - 4 KiB",
        [&](auto &api, int t) { RunPairs(api, mixed[t], kPairOps); }, kPairOps);
    measure(
        "batch: 1000 live, 16 B - 4 KiB, random free",
        [&](auto &api, int t) { RunBatches(api, mixed[t], order, kBatchRounds); },
        kBatch * kBatchRounds);
  }

  // The arena next to a malloc pair: allocation only, reset between rounds.
  {
    chi::ArenaAllocator *arena = nullptr;
    chi::MallocBackend arena_backend;
    if (!arena_backend.Create("bench_arena", 64ull << 20).ok() ||
        !chi::CreateAllocator(arena_backend, chi::AllocatorId(900, 2), &arena).ok()) {
      std::fprintf(stderr, "cannot set up the arena\n");
      return 1;
    }
    std::vector<double> arena_ns, malloc_ns;
    constexpr u64 kRound = 500000;  // 64 B x 500k = 32 MB per round
    for (int r = 0; r < reps; ++r) {
      arena_ns.push_back(TimeThreads(1, [&](int) {
                           u64 sum = 0;
                           for (u64 i = 0; i < kPairOps; ++i) {
                             if (i % kRound == 0) arena->Reset();
                             u8 *p = static_cast<u8 *>(arena->ToPointer(arena->Allocate(64)));
                             p[0] = static_cast<u8>(i);
                             sum += p[0];
                           }
                           g_sink = g_sink + sum;
                         }) /
                         static_cast<double>(kPairOps));
      malloc_ns.push_back(TimeThreads(1, [&](int) { RunPairs(malloc_api, fixed[0], kPairOps); }) /
                          static_cast<double>(kPairOps));
    }
    PrintRow({"arena 64 B, no free (malloc: pair 64 B)", 1, Median(arena_ns),
              Median(malloc_ns)});
  }

  const bool balanced = alloc->FreeBytes() == free_at_start &&
                        alloc->AuditFreeBytes() == free_at_start;
  std::printf("\nafter all runs: free bytes %s the starting figure (%llu)\n",
              balanced ? "equal" : "DIFFER FROM", static_cast<unsigned long long>(free_at_start));
  return balanced ? 0 : 1;
}
