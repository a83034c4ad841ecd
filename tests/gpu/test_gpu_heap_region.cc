// CHI_GPU_HEAP's region (gpu_heap.h), with CPU threads playing GPU threads over plain
// memory: a region cut once into per-thread partitions plus shared spill and large ones,
// launches played as CHIMAERA_GPU_INIT plays them (tickets from the formatted region),
// frees through any partition, forged and foreign pointers refused, blocks that outlive a
// launch, concurrent launches of different geometries, and 1 MiB to 8 MiB blocks. One
// partition's allocator and the arena are in test_gpu_heap.cc; what a real GPU adds (2048
// threads, device-scope atomics) is in test_gpu_memory (label gpu).
#include <doctest/doctest.h>

#include <chi/gpu/gpu_heap.h>

#include <algorithm>  // sort of live ranges
#include <atomic>     // the stress tests' counters and start line
#include <thread>     // CPU threads playing GPU threads
#include <utility>    // pair
#include <vector>     // live blocks

#include "gpu_heap_test_support.h"  // Region, Fill, Intact, Drain

namespace {

using chi::u32;
using chi::u64;
using chi::gpu::GpuHeap;
using chi::gpu::GpuHeapRegion;
using gpu_heap_test::AwaitGo;
using gpu_heap_test::Drain;
using gpu_heap_test::Fill;
using gpu_heap_test::Intact;
using gpu_heap_test::Region;

}  // namespace

TEST_CASE("a region is cut once into a fixed number of disjoint partitions") {
  constexpr u64 kBytes = 1 << 20;
  auto region = Region(kBytes);
  char *base = region.get();
  GpuHeapRegion *r = GpuHeapRegion::Format(base, kBytes);
  REQUIRE(r != nullptr);
  CHECK(r->Partitions() == kBytes / chi::gpu::kGpuHeapPartitionBytes);
  CHECK(GpuHeapRegion::Open(base, kBytes) == r);
  CHECK(GpuHeapRegion::Open(base, 2 * kBytes) == r);        // a larger GpuInfo size is fine
  CHECK(GpuHeapRegion::Open(base, kBytes - 64) == nullptr);  // formatted for more than given
  CHECK(GpuHeapRegion::Open(nullptr, kBytes) == nullptr);
  auto garbage = Region(4096);
  CHECK(GpuHeapRegion::Open(garbage.get(), 4096) == nullptr);  // never formatted
  REQUIRE(r->SharedPartitions() == 2);  // spill and large, after the private ones
  CHECK(r->Spill() == r->Partition(r->Partitions()));
  CHECK(r->Large() == r->Partition(r->Partitions() + 1));
  CHECK(r->SharedBytes() == kBytes / 4);
  std::vector<std::pair<char *, u64>> blocks;
  for (u32 i = 0; i < r->Partitions() + r->SharedPartitions(); ++i) {
    GpuHeap *h = r->Partition(i);
    CHECK(h->Capacity() >= chi::gpu::kGpuHeapMinPartitionBytes);
    const u64 n = h->OwnMaxAllocation();
    char *p = static_cast<char *>(h->Allocate(n));
    REQUIRE(p != nullptr);
    CHECK(p >= base + GpuHeapRegion::HeaderBytes(r->Partitions()));
    CHECK(p + n <= base + kBytes);
    blocks.emplace_back(p, n);
  }
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 1; i < blocks.size(); ++i) {
    CHECK(blocks[i - 1].first + blocks[i - 1].second <= blocks[i].first);
  }
  for (auto &b : blocks) CHECK(r->Partition(0)->Free(b.first));
  CHECK(r->BytesInUse() == 0);
  // The count asked for is rounded down to a power of two, and lowered while too small.
  CHECK(GpuHeapRegion::Format(base, kBytes, 5)->Partitions() == 4);
  CHECK(GpuHeapRegion::Format(base, kBytes, 1u << 20)->Partitions() == 128);
  CHECK(GpuHeapRegion::Format(base, 8192)->Partitions() == 1);
  CHECK(GpuHeapRegion::Format(base, 8192)->SharedPartitions() == 0);  // too few to share
  CHECK(GpuHeapRegion::Format(base, 8192)->Large() == nullptr);
  CHECK(GpuHeapRegion::Format(base, 64) == nullptr);
  CHECK(GpuHeapRegion::Format(nullptr, kBytes) == nullptr);
}

TEST_CASE("consecutive tickets reach distinct partitions, and wrap around") {
  auto region = Region(256 << 10);
  GpuHeapRegion *r = GpuHeapRegion::Format(region.get(), 256 << 10, 8);
  REQUIRE(r->Partitions() == 8);
  CHECK(r->TakeTickets(4) == 0);  // one block of 4 threads
  CHECK(r->TakeTickets(4) == 4);  // the next block, maybe of another launch
  std::vector<GpuHeap *> seen;
  for (u32 t = 0; t < 8; ++t) seen.push_back(r->PartitionFor(t));
  std::sort(seen.begin(), seen.end());
  CHECK(std::unique(seen.begin(), seen.end()) == seen.end());
  CHECK(r->PartitionFor(8) == r->PartitionFor(0));
  CHECK(r->PartitionFor(0xffffffffu) == r->PartitionFor(7));
}

TEST_CASE("a block is freed through any partition of its region, back into its own") {
  auto region = Region(64 << 10);
  GpuHeapRegion *r = GpuHeapRegion::Format(region.get(), 64 << 10, 4);
  REQUIRE(r->Partitions() == 4);
  GpuHeap *a = r->Partition(0);
  GpuHeap *b = r->Partition(3);
  void *p = a->Allocate(100);
  REQUIRE(p != nullptr);
  CHECK(a->BytesInUse() > 0);
  CHECK(b->Free(p));  // through b, as a thread given another partition would
  CHECK(a->BytesInUse() == 0);
  CHECK(b->BytesInUse() == 0);
  CHECK(a->Allocate(100) == p);
}

TEST_CASE("outside pointers, uncarved bytes and a header naming the wrong owner are refused") {
  auto region = Region(64 << 10);
  GpuHeapRegion *r = GpuHeapRegion::Format(region.get(), 64 << 10, 4);
  GpuHeap *h = r->Partition(0);
  auto *p = static_cast<u32 *>(h->Allocate(256));
  REQUIRE(p != nullptr);
  auto other = Region(64 << 10);
  GpuHeap *stranger = GpuHeapRegion::Format(other.get(), 64 << 10, 4)->Partition(0);
  CHECK_FALSE(stranger->Free(p));  // another region's block: not even read
  CHECK_FALSE(h->Free(region.get() + 16));  // the region's header
  CHECK_FALSE(h->Free(reinterpret_cast<char *>(p) + 4096));  // never carved
  // A live-looking header inside the block's own bytes, naming a partition that never
  // carved there.
  p[0] = chi::gpu::GpuHeapBlock::kLive;
  p[1] = 1;
  CHECK_FALSE(h->Free(p + 4));
  CHECK(h->BytesInUse() == GpuHeap::BlockBytes(GpuHeap::ClassOf(256 + 16)));
  CHECK(h->Free(p));
  CHECK(r->BytesInUse() == 0);
}

namespace {

/**
 * Plays a kernel launch of `blocks` x `threads` with CPU threads, as CHIMAERA_GPU_INIT and
 * CHI_GPU_HEAP do: each block takes its tickets, and its thread t runs body(partition of
 * ticket + t, global thread id). The threads run until Join (or the destructor).
 */
class Launch {
 public:
  template <typename Body>
  Launch(GpuHeapRegion *r, u32 blocks, u32 threads, Body body) {
    for (u32 b = 0; b < blocks; ++b) {
      const u32 ticket = r->TakeTickets(threads);
      for (u32 t = 0; t < threads; ++t) {
        threads_.emplace_back([=] { body(r->PartitionFor(ticket + t), b * threads + t); });
      }
    }
  }
  ~Launch() { Join(); }
  Launch(const Launch &) = delete;
  Launch &operator=(const Launch &) = delete;

  /** Waits for every thread of the launch. */
  void Join() {
    for (auto &t : threads_) t.join();
    threads_.clear();
  }

 private:
  std::vector<std::thread> threads_;
};

/** A block a test keeps, with what Fill wrote into it. */
struct Held {
  char *p;
  u64 n;
  u32 owner, round;
};

/**
 * What concurrent launches still hold (`held`, per thread): no two blocks overlap, each is
 * intact, each frees through partition `via` (into the one that carved it), and the region
 * ends with nothing in use. Adds to the launches' own broken/refused counts, which must end 0.
 */
void CheckHeldThenFree(const std::vector<std::vector<Held>> &held, GpuHeapRegion *r, u32 via,
                       std::atomic<u32> *broken, std::atomic<u32> *refused) {
  std::vector<Held> all;
  for (const auto &v : held) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end(), [](const Held &x, const Held &y) { return x.p < y.p; });
  u32 overlaps = 0;
  for (size_t i = 1; i < all.size(); ++i) overlaps += all[i - 1].p + all[i - 1].n > all[i].p;
  CHECK(overlaps == 0);
  for (const Held &m : all) {
    *broken += !Intact(m.p, m.n, m.owner, m.round);
    *refused += !r->Partition(via)->Free(m.p);
  }
  CHECK(broken->load() == 0);
  CHECK(refused->load() == 0);
  CHECK(r->BytesInUse() == 0);
}

}  // namespace

TEST_CASE("blocks one launch leaves live survive a later launch of another geometry") {
  constexpr u64 kBytes = 1 << 20;
  constexpr u32 kEach = 3;
  auto region = Region(kBytes);
  GpuHeapRegion *r = GpuHeapRegion::Format(region.get(), kBytes);  // 32 partitions
  REQUIRE(r != nullptr);
  std::vector<Held> kept(2 * 4 * kEach);
  Launch(r, 2, 4, [&](GpuHeap *h, u32 tid) {  // the first kernel: allocates, fills, keeps
    for (u32 j = 0; j < kEach; ++j) {
      const u64 n = 100 + 700 * j + tid * 8;
      char *p = static_cast<char *>(h->Allocate(n));
      if (p != nullptr) Fill(p, n, tid, j);
      kept[tid * kEach + j] = {p, n, tid, j};
    }
  }).Join();
  for (const Held &k : kept) REQUIRE(k.p != nullptr);
  const u64 kept_bytes = r->BytesInUse();
  std::atomic<u32> broken{0}, refused{0};
  std::atomic<u64> total{0};
  Launch(r, 4, 16, [&](GpuHeap *h, u32 tid) {  // the second: drains its partitions, 3 times
    for (u32 round = 0; round < 3; ++round) {
      std::vector<Held> mine;
      for (u32 i = 0;; ++i) {
        const u64 n = 16u << ((tid + i) % 8);  // 16 B .. 2 KiB
        char *p = static_cast<char *>(h->Allocate(n));
        if (p == nullptr) break;
        Fill(p, n, 1000 + tid, round * 4096 + i);
        mine.push_back({p, n, 1000 + tid, round * 4096 + i});
      }
      for (const Held &m : mine) {
        total += m.n;
        broken += !Intact(m.p, m.n, m.owner, m.round);
        refused += !h->Free(m.p);
      }
    }
  }).Join();
  CHECK(broken.load() == 0);
  CHECK(refused.load() == 0);
  CHECK(total.load() > kBytes);  // it really allocated heavily: each partition ran dry
  CHECK(r->BytesInUse() == kept_bytes);
  Launch(r, 1, 8, [&](GpuHeap *h, u32 tid) {  // the third: checks and frees the first's
    for (u32 j = 0; j < kEach; ++j) {
      const Held &k = kept[((tid + 3) % 8) * kEach + j];  // another thread's, another partition
      broken += !Intact(k.p, k.n, k.owner, k.round);
      refused += !h->Free(k.p);
    }
  }).Join();
  CHECK(broken.load() == 0);
  CHECK(refused.load() == 0);
  CHECK(r->BytesInUse() == 0);
}

TEST_CASE("two launches of different geometries at once on one region never share a block") {
  constexpr u64 kBytes = 512 << 10;
  constexpr u32 kRounds = 20000, kKeep = 4;
  auto region = Region(kBytes);
  GpuHeapRegion *r = GpuHeapRegion::Format(region.get(), kBytes, 8);  // 4 threads a partition
  REQUIRE(r->Partitions() == 8);
  std::vector<std::vector<Held>> held(32);
  std::atomic<u32> go{0}, broken{0}, refused{0}, got{0};
  auto churn = [&](u32 launch, GpuHeap *h, u32 tid) {
    const u32 owner = launch * 100 + tid;
    std::vector<Held> &mine = held[launch * 16 + tid];
    AwaitGo(go);
    u32 seed = owner * 7919 + 1;
    for (u32 round = 0; round < kRounds; ++round) {
      seed = seed * 1103515245 + 12345;
      const u64 n = 4 + (seed >> 8) % 1000;
      char *p = static_cast<char *>(h->Allocate(n));
      if (p != nullptr) {
        got.fetch_add(1);
        Fill(p, n, owner, round);
        mine.push_back({p, n, owner, round});
      }
      if (mine.size() > kKeep || (p == nullptr && !mine.empty())) {
        const size_t k = (seed >> 4) % mine.size();
        broken += !Intact(mine[k].p, mine[k].n, owner, mine[k].round);
        refused += !h->Free(mine[k].p);
        mine.erase(mine.begin() + static_cast<long>(k));
      }
    }
  };
  {
    Launch a(r, 2, 8, [&](GpuHeap *h, u32 tid) { churn(0, h, tid); });
    Launch b(r, 8, 2, [&](GpuHeap *h, u32 tid) { churn(1, h, tid); });
    go.store(1);
  }
  CHECK(got.load() > 32 * kRounds / 2);
  // What both launches still hold: intact, and no two blocks overlap.
  CheckHeldThenFree(held, r, 0, &broken, &refused);
}

TEST_CASE("1 MiB and 8 MiB blocks from a 64 MiB region: writable end to end, then all back") {
  constexpr u64 kBytes = 64ull << 20;  // the runtime's client heap: 2048 partitions
  auto region = Region(kBytes);
  char *base = region.get();
  GpuHeapRegion *r = GpuHeapRegion::Format(base, kBytes);
  REQUIRE(r != nullptr);
  REQUIRE(r->Partitions() == 2048);
  CHECK(r->MaxAllocation() >= (8ull << 20));
  GpuHeap *h = r->PartitionFor(r->TakeTickets(1));
  CHECK(h->OwnMaxAllocation() < (1ull << 20));  // far beyond the thread's own partition
  for (u32 round = 0; round < 3; ++round) {
    char *mib = static_cast<char *>(h->Allocate(1ull << 20));
    char *eight = static_cast<char *>(h->Allocate(8ull << 20));
    REQUIRE(mib != nullptr);
    REQUIRE(eight != nullptr);
    CHECK(reinterpret_cast<u64>(mib) % chi::gpu::kGpuHeapAlign == 0);
    CHECK(reinterpret_cast<u64>(eight) % chi::gpu::kGpuHeapAlign == 0);
    CHECK(mib >= base + GpuHeapRegion::HeaderBytes(r->Partitions()));
    CHECK(eight >= base + GpuHeapRegion::HeaderBytes(r->Partitions()));
    CHECK(mib + (1ull << 20) <= base + kBytes);
    CHECK(eight + (8ull << 20) <= base + kBytes);
    CHECK((mib + (1ull << 20) <= eight || eight + (8ull << 20) <= mib));
    Fill(mib, 1ull << 20, 1, round);
    Fill(eight, 8ull << 20, 8, round);
    CHECK(Intact(mib, 1ull << 20, 1, round));
    CHECK(Intact(eight, 8ull << 20, 8, round));
    CHECK(h->BytesInUse() == 0);  // counted where they live: the large partition
    CHECK(r->Large()->BytesInUse() == ((1ull << 20) + 16) + ((8ull << 20) + 16));
    CHECK(r->Partition(77)->Free(eight));  // any thread's partition frees them
    CHECK(h->Free(mib));
    CHECK_FALSE(h->Free(mib));
    CHECK(r->BytesInUse() == 0);
  }
  CHECK(h->Allocate(r->MaxAllocation() + 1) == nullptr);
  void *most = h->Allocate(r->MaxAllocation());
  CHECK(most != nullptr);
  CHECK(h->Free(most));
  CHECK(r->BytesInUse() == 0);
}

TEST_CASE("a thread whose partition runs dry spills, small blocks never enter the large space") {
  constexpr u64 kBytes = 4 << 20;  // 128 partitions; spill 256 KiB, large 768 KiB
  auto region = Region(kBytes);
  GpuHeapRegion *r = GpuHeapRegion::Format(region.get(), kBytes);
  REQUIRE(r->SharedPartitions() == 2);
  GpuHeap *h = r->Partition(5);
  std::vector<void *> got = Drain(h, 1000);
  const u64 own = h->Capacity() / GpuHeap::BlockBytes(GpuHeap::ClassOf(1000 + 16));
  CHECK(got.size() > own);  // more than its own partition holds: the rest came from spill
  CHECK(r->Spill()->BytesInUse() > r->Spill()->Capacity() * 9 / 10);
  CHECK(r->Large()->BytesInUse() == 0);
  CHECK(r->Partition(6)->BytesInUse() == 0);  // no other thread's partition was touched
  CHECK(r->Partition(6)->Allocate(1000) != nullptr);  // which still serves its own thread
  void *big = h->Allocate(512 << 10);  // the large space is whole
  CHECK(big != nullptr);
  for (u32 i = 0; i < got.size(); ++i) Fill(got[i], 1000, 5, i);
  for (u32 i = 0; i < got.size(); ++i) CHECK(Intact(got[i], 1000, 5, i));
  for (void *p : got) CHECK(r->Partition(9)->Free(p));
  CHECK(h->Free(big));
  CHECK(h->BytesInUse() == 0);
  CHECK(r->Spill()->BytesInUse() == 0);
  CHECK(r->Large()->BytesInUse() == 0);
  CHECK(Drain(h, 1000).size() == got.size());  // all of it came back where it belongs
}

TEST_CASE("large blocks exhaust the shared space, then nullptr, and small blocks stay intact") {
  constexpr u64 kBytes = 4 << 20;
  constexpr u64 kLarge = 64 << 10;
  auto region = Region(kBytes);
  GpuHeapRegion *r = GpuHeapRegion::Format(region.get(), kBytes);
  REQUIRE(r->SharedPartitions() == 2);
  std::vector<Held> small;
  for (u32 i = 0; i < 4 * r->Partitions(); ++i) {
    const u64 n = 16 + (i * 37) % 2000;
    char *p = static_cast<char *>(r->PartitionFor(i)->Allocate(n));
    REQUIRE(p != nullptr);
    Fill(p, n, 1, i);
    small.push_back({p, n, 1, i});
  }
  GpuHeap *h = r->Partition(3);
  std::vector<char *> large;
  while (char *p = static_cast<char *>(h->Allocate(kLarge))) {
    Fill(p, kLarge, 2, static_cast<u32>(large.size()));
    large.push_back(p);
    REQUIRE(large.size() < 1000);
  }
  const u64 block = GpuHeap::BlockBytes(GpuHeap::ClassOf(kLarge + 16));  // 64 KiB + 16
  CHECK(large.size() == r->Large()->Capacity() / block);
  CHECK(h->Allocate(kLarge) == nullptr);      // asked again: still nothing, never a hang
  CHECK(h->Allocate(1ull << 20) == nullptr);  // nor anything larger
  void *small_again = h->Allocate(100);       // while the thread's own space still serves it
  CHECK(small_again != nullptr);
  for (const Held &s : small) CHECK(Intact(s.p, s.n, s.owner, s.round));
  for (u32 i = 0; i < large.size(); ++i) CHECK(Intact(large[i], kLarge, 2, i));
  // Forged live headers inside live blocks, naming a partition that never carved there.
  auto *forged = reinterpret_cast<u32 *>(large[1]);
  forged[0] = chi::gpu::GpuHeapBlock::kLive | 4;
  forged[1] = r->Partitions();  // the spill partition, whose blocks lie before the large ones
  CHECK_FALSE(h->Free(forged + 4));
  forged = reinterpret_cast<u32 *>(small[0].p);
  forged[0] = chi::gpu::GpuHeapBlock::kLive;
  forged[1] = r->Partitions() + 1;  // the large partition, whose blocks lie after this one
  CHECK_FALSE(h->Free(forged + 4));
  auto other = Region(kBytes);
  GpuHeap *stranger = GpuHeapRegion::Format(other.get(), kBytes)->Partition(0);
  CHECK_FALSE(stranger->Free(large[0]));  // another region's: refused, not even read
  CHECK(h->Free(large.back()));
  large.pop_back();
  char *again = static_cast<char *>(h->Allocate(kLarge));  // a freed large block makes room
  CHECK(again != nullptr);
  large.push_back(again);
  for (char *p : large) CHECK(r->Partition(0)->Free(p));
  for (const Held &s : small) CHECK(h->Free(s.p));
  CHECK(h->Free(small_again));
  CHECK(r->BytesInUse() == 0);
}

TEST_CASE("threads mixing small and large blocks at once never get overlapping blocks") {
  constexpr u64 kBytes = 32 << 20;  // 1024 partitions of ~24 KiB; spill 2 MiB, large 6 MiB
  constexpr u32 kRounds = 3000, kKeep = 6;
  auto region = Region(kBytes);
  GpuHeapRegion *r = GpuHeapRegion::Format(region.get(), kBytes);
  REQUIRE(r->SharedPartitions() == 2);
  std::vector<std::vector<Held>> held(32);
  std::atomic<u32> go{0}, broken{0}, refused{0}, small_got{0}, large_got{0}, large_failed{0};
  auto churn = [&](GpuHeap *h, u32 tid) {
    std::vector<Held> &mine = held[tid];
    AwaitGo(go);
    u32 seed = tid * 7919 + 1;
    for (u32 round = 0; round < kRounds; ++round) {
      seed = seed * 1103515245 + 12345;
      const bool large = (seed >> 16) % 5 == 0;
      const u64 n = large ? (24 << 10) + (seed >> 4) % (136 << 10) : 4 + (seed >> 8) % 3000;
      char *p = static_cast<char *>(h->Allocate(n));
      if (p != nullptr) {
        (large ? large_got : small_got).fetch_add(1);
        Fill(p, n, tid, round);
        mine.push_back({p, n, tid, round});
      } else if (large) {
        large_failed.fetch_add(1);
      }
      if (mine.size() > kKeep || (p == nullptr && !mine.empty())) {
        const size_t k = (seed >> 4) % mine.size();
        broken += !Intact(mine[k].p, mine[k].n, tid, mine[k].round);
        refused += !h->Free(mine[k].p);
        mine.erase(mine.begin() + static_cast<long>(k));
      }
    }
  };
  {
    Launch a(r, 2, 8, churn);
    Launch b(r, 4, 4, [&](GpuHeap *h, u32 tid) { churn(h, 16 + tid); });
    go.store(1);
  }
  CHECK(small_got.load() > 32 * kRounds / 2);
  CHECK(large_got.load() > 1000);  // of ~19200 asked: many found room while others held some
  CHECK(large_got.load() + large_failed.load() > 32 * kRounds / 10);
  CheckHeldThenFree(held, r, 1, &broken, &refused);
}
