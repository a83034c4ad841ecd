// CHI_GPU_HEAP's allocator within one partition (gpu_heap.h) and the per-thread arena
// (gpu_arena.h), with CPU threads playing GPU threads over plain memory: the same
// CHI_CROSS_FUN code a kernel runs. Alignment and bounds, exhaustion and reuse, refused
// frees, and threads allocating from one partition at once. A region cut into partitions,
// and launches over it, are in test_gpu_heap_region.cc; what a real GPU adds (2048 threads,
// device-scope atomics) is in test_gpu_memory (label gpu).
#include <doctest/doctest.h>

#include <chi/gpu/gpu_arena.h>
#include <chi/gpu/gpu_heap.h>

#include <algorithm>  // sort of live ranges
#include <atomic>     // the stress tests' counters and start line
#include <cstring>    // memset
#include <thread>     // CPU threads playing GPU threads
#include <utility>    // pair
#include <vector>     // live blocks

#include "gpu_heap_test_support.h"  // Region, Fill, Intact, Drain

namespace {

using chi::u32;
using chi::u64;
using chi::gpu::GpuArena;
using chi::gpu::GpuHeap;
using gpu_heap_test::AwaitGo;
using gpu_heap_test::Drain;
using gpu_heap_test::Fill;
using gpu_heap_test::Intact;
using gpu_heap_test::Region;

}  // namespace

TEST_CASE("every block is 16-byte aligned and holds the bytes asked for") {
  auto region = Region(1 << 20);
  GpuHeap *h = GpuHeap::Format(region.get(), 1 << 20);
  REQUIRE(h != nullptr);
  std::vector<std::pair<char *, u64>> live;
  for (u64 n : {1ull, 15ull, 16ull, 17ull, 100ull, 1000ull, 4096ull, 5000ull, 65536ull}) {
    char *p = static_cast<char *>(h->Allocate(n));
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<u64>(p) % chi::gpu::kGpuHeapAlign == 0);
    CHECK(p >= region.get());
    CHECK(p + n <= region.get() + (1 << 20));
    std::memset(p, 0x5A, n);
    live.emplace_back(p, n);
  }
  std::sort(live.begin(), live.end());
  for (size_t i = 1; i < live.size(); ++i) {
    CHECK(live[i - 1].first + live[i - 1].second <= live[i].first);
  }
  CHECK(h->BytesInUse() > 0);
  for (auto &b : live) CHECK(h->Free(b.first));
  CHECK(h->BytesInUse() == 0);
}

TEST_CASE("zero bytes, a request above the partition and a missing region give nullptr") {
  auto region = Region(8192);
  GpuHeap *h = GpuHeap::Format(region.get(), 8192);
  REQUIRE(h != nullptr);
  CHECK(h->Allocate(0) == nullptr);
  CHECK(h->Allocate(h->MaxAllocation() + 1) == nullptr);
  void *biggest = h->Allocate(h->MaxAllocation());
  CHECK(biggest != nullptr);
  CHECK(h->Free(biggest));
  CHECK(h->Allocate(1ull << 40) == nullptr);
  CHECK(GpuHeap::Format(nullptr, 8192) == nullptr);
  CHECK(GpuHeap::Format(region.get(), 16) == nullptr);
}

TEST_CASE("an exhausted heap returns nullptr, and a freed block lets the next allocation succeed") {
  auto region = Region(16384);
  GpuHeap *h = GpuHeap::Format(region.get(), 16384);
  std::vector<void *> got = Drain(h, 48);
  REQUIRE(got.size() > 10);
  CHECK(h->Allocate(48) == nullptr);           // still nothing, asked again
  std::vector<void *> tail = Drain(h, 1);      // smaller blocks take the cursor's last bytes
  CHECK(tail.size() < 3);
  CHECK(h->Allocate(1) == nullptr);            // then nothing of any size is left
  CHECK(h->Free(got.back()));
  got.pop_back();
  void *again = h->Allocate(48);
  CHECK(again != nullptr);
  got.push_back(again);
  for (void *p : got) CHECK(h->Free(p));
  for (void *p : tail) CHECK(h->Free(p));
  CHECK(h->BytesInUse() == 0);
  CHECK(Drain(h, 48).size() == got.size());  // everything came back
}

TEST_CASE("a freed larger block serves a smaller request once nothing else is left") {
  auto region = Region(8192);
  GpuHeap *h = GpuHeap::Format(region.get(), 8192);
  std::vector<void *> big = Drain(h, 1000);  // 1 KiB blocks until full
  REQUIRE(!big.empty());
  while (void *p = h->Allocate(16)) big.push_back(p);  // use up the tail too
  CHECK(h->Allocate(16) == nullptr);
  CHECK(h->Free(big.front()));
  void *small = h->Allocate(16);
  CHECK(small == big.front());
}

TEST_CASE("a second free of a block, and pointers the heap never gave, are refused") {
  auto region = Region(8192);
  GpuHeap *h = GpuHeap::Format(region.get(), 8192);
  void *p = h->Allocate(64);
  REQUIRE(p != nullptr);
  const u64 used = h->BytesInUse();
  CHECK(h->Free(p));
  CHECK_FALSE(h->Free(p));
  CHECK_FALSE(h->Free(nullptr));
  CHECK_FALSE(h->Free(static_cast<char *>(p) + 8));  // misaligned
  alignas(16) char foreign[64] = {};
  CHECK_FALSE(h->Free(foreign + 16));
  CHECK(h->BytesInUse() == used - GpuHeap::BlockBytes(GpuHeap::ClassOf(64 + 16)));
  CHECK(h->BytesInUse() == 0);
  void *a = h->Allocate(64);
  void *b = h->Allocate(64);
  CHECK(a == p);  // the one free went onto the list exactly once
  CHECK(b != p);
}

TEST_CASE("8 threads allocating, filling and freeing from one partition never share a block") {
  constexpr u64 kBytes = 4 << 20;
  constexpr u32 kThreads = 8, kRounds = 20000, kKeep = 6;
  auto region = Region(kBytes);
  GpuHeap *h = GpuHeap::Format(region.get(), kBytes);
  std::atomic<u32> broken{0}, failed{0}, go{0};
  std::vector<std::thread> ts;
  for (u32 t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      AwaitGo(go);
      struct Live {
        void *p;
        u64 n;
        u32 round;
      };
      std::vector<Live> mine;
      u32 seed = t * 7919 + 1;
      for (u32 r = 0; r < kRounds; ++r) {
        seed = seed * 1103515245 + 12345;
        const u64 n = 4 + (seed >> 8) % 3000;
        void *p = h->Allocate(n);
        if (p == nullptr) {
          failed.fetch_add(1);
        } else {
          Fill(p, n, t, r);
          mine.push_back({p, n, r});
        }
        if (mine.size() > kKeep || (p == nullptr && !mine.empty())) {
          const size_t k = (seed >> 4) % mine.size();
          if (!Intact(mine[k].p, mine[k].n, t, mine[k].round)) broken.fetch_add(1);
          if (!h->Free(mine[k].p)) broken.fetch_add(1);
          mine.erase(mine.begin() + static_cast<long>(k));
        }
      }
      for (const Live &l : mine) {
        if (!Intact(l.p, l.n, t, l.round) || !h->Free(l.p)) broken.fetch_add(1);
      }
    });
  }
  go.store(1);
  for (auto &t : ts) t.join();
  CHECK(broken.load() == 0);
  CHECK(failed.load() == 0);  // 8 x 7 live blocks of < 4 KiB fit in 4 MiB many times over
  CHECK(h->BytesInUse() == 0);
}

TEST_CASE("threads draining one partition to exhaustion get distinct blocks, then all of it back") {
  constexpr u64 kBytes = 1 << 20;
  constexpr u32 kThreads = 8;
  auto region = Region(kBytes);
  GpuHeap *h = GpuHeap::Format(region.get(), kBytes);
  for (u32 pass = 0; pass < 3; ++pass) {
    std::vector<std::vector<std::pair<char *, u64>>> got(kThreads);
    std::atomic<u32> go{0};
    std::vector<std::thread> ts;
    for (u32 t = 0; t < kThreads; ++t) {
      ts.emplace_back([&, t] {
        AwaitGo(go);
        for (u32 i = 0;; ++i) {
          const u64 n = 16u << ((t + i) % 6);  // 16 B .. 512 B
          char *p = static_cast<char *>(h->Allocate(n));
          if (p == nullptr) break;  // a bounded failure, never a hang
          Fill(p, n, t, i);
          got[t].emplace_back(p, n);
        }
      });
    }
    go.store(1);
    for (auto &t : ts) t.join();
    std::vector<std::pair<char *, u64>> all;
    u32 broken = 0;
    for (u32 t = 0; t < kThreads; ++t) {
      for (u32 i = 0; i < got[t].size(); ++i) {
        broken += !Intact(got[t][i].first, got[t][i].second, t, i);
        all.push_back(got[t][i]);
      }
    }
    CHECK(broken == 0);
    std::sort(all.begin(), all.end());
    u32 overlaps = 0;
    for (size_t i = 1; i < all.size(); ++i) {
      overlaps += all[i - 1].first + all[i - 1].second > all[i].first;
    }
    CHECK(overlaps == 0);
    CHECK(all.size() > 1000);
    // Frees come from threads other than the allocators, concurrently.
    ts.clear();
    for (u32 t = 0; t < kThreads; ++t) {
      ts.emplace_back([&, t] {
        for (auto &b : got[(t + 1) % kThreads]) CHECK(h->Free(b.first));
      });
    }
    for (auto &t : ts) t.join();
    CHECK(h->BytesInUse() == 0);
  }
}

TEST_CASE("a zeroed partition header is an empty heap: nothing to allocate, nothing to free") {
  alignas(64) char zero[sizeof(GpuHeap)] = {};
  auto *h = reinterpret_cast<GpuHeap *>(zero);
  CHECK(h->Allocate(16) == nullptr);
  alignas(16) char foreign[64] = {};
  CHECK_FALSE(h->Free(foreign + 16));
  CHECK(h->BytesInUse() == 0);
  CHECK(h->MaxAllocation() == 0);
}

TEST_CASE("an arena hands out aligned bump allocations until full, and Reset reuses it") {
  alignas(64) char buf[256];
  GpuArena a(buf, sizeof(buf));
  char *x = static_cast<char *>(a.Allocate(10));
  char *y = static_cast<char *>(a.Allocate(10));
  char *z = static_cast<char *>(a.Allocate(8, 64));
  REQUIRE(x != nullptr);
  REQUIRE(y != nullptr);
  REQUIRE(z != nullptr);
  CHECK(x == buf);
  CHECK(y == buf + 16);
  CHECK(reinterpret_cast<u64>(z) % 64 == 0);
  CHECK(a.Allocate(200) == nullptr);  // never grows
  CHECK(a.Used() <= a.Capacity());
  a.Reset();
  CHECK(a.Used() == 0);
  CHECK(a.Allocate(256) == buf);
  CHECK(GpuArena().Allocate(1) == nullptr);
}

TEST_CASE("an arena taken from the heap goes back to it") {
  auto region = Region(1 << 16);
  GpuHeap *h = GpuHeap::Format(region.get(), 1 << 16);
  GpuArena a = GpuArena::FromHeap(h, 4096);
  CHECK(a.Capacity() == 4096);
  CHECK(a.Allocate(4000) != nullptr);
  CHECK(h->BytesInUse() > 0);
  a.ReturnTo(h);
  CHECK(h->BytesInUse() == 0);
  CHECK(a.Allocate(1) == nullptr);
  CHECK(GpuArena::FromHeap(h, 1ull << 40).Allocate(1) == nullptr);  // no room: an empty arena
}
