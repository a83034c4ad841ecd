// The general shared-memory allocator (SizeClassAllocator): size classes, alignment,
// refused double and foreign frees, typed New/Delete, running out of memory and
// recovering, and stress with two threads, more threads than cores on one size class,
// and two real processes (fork + exec of this binary) freeing each other's blocks.
// Backends, offset pointers and the arena are in test_shm_memory.cc; the child-process
// plumbing in shm_memory_fixture.h.
#include <doctest/doctest.h>

#include <chrono>   // deadlines for bounded waits
#include <cstdlib>  // getenv
#include <cstring>  // memcpy, memcmp, memset
#include <string>   // names
#include <thread>   // the two-thread and many-thread variants
#include <vector>   // live-block lists

#include "shm_memory_fixture.h"

using namespace shm_memory_test;

namespace {

// ---- Block patterns ----

/** splitmix64: the byte pattern written into blocks. */
u64 Mix(u64 x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/** Writes a block that can check itself: {size, seed} then Mix(seed + i) words. */
void FillBlock(u8 *p, u64 size, u64 seed) {
  std::memcpy(p, &size, 8);
  std::memcpy(p + 8, &seed, 8);
  for (u64 i = 16; i < size; i += 8) {
    u64 v = Mix(seed + i);
    std::memcpy(p + i, &v, size - i < 8 ? size - i : 8);
  }
}

/** True if FillBlock's pattern of this size is intact (nothing else wrote over it). */
bool CheckBlock(const u8 *p, u64 size) {
  u64 stored_size = 0, seed = 0;
  std::memcpy(&stored_size, p, 8);
  std::memcpy(&seed, p + 8, 8);
  if (stored_size != size) return false;
  for (u64 i = 16; i < size; i += 8) {
    u64 v = Mix(seed + i);
    if (std::memcmp(p + i, &v, size - i < 8 ? size - i : 8) != 0) return false;
  }
  return true;
}

// ---- Shared state of the allocator stress ----

/** Single-producer single-consumer ring of blocks handed to the other worker. */
struct BlockRing {
  static constexpr u32 kSlots = 128;
  struct Entry {
    ShmPtr<void> ptr_;
    u64 size_;
  };
  alignas(64) chi::Atomic<u64> head_;  // next to pop (consumer)
  alignas(64) chi::Atomic<u64> tail_;  // next to fill (producer)
  Entry entries_[kSlots];

  bool TryPush(const Entry &e) {
    u64 t = tail_.Load(chi::MemOrder::kRelaxed);  // only we write tail
    if (t - head_.Load(chi::MemOrder::kAcquire) == kSlots) return false;  // slot reuse after pop
    entries_[t % kSlots] = e;
    tail_.Store(t + 1, chi::MemOrder::kRelease);  // publishes the entry
    return true;
  }
  bool TryPop(Entry *e) {
    u64 h = head_.Load(chi::MemOrder::kRelaxed);  // only we write head
    if (h == tail_.Load(chi::MemOrder::kAcquire)) return false;  // pairs with TryPush
    *e = entries_[h % kSlots];
    head_.Store(h + 1, chi::MemOrder::kRelease);  // hands the slot back to the producer
    return true;
  }
};

/** What the two stress workers share: their rings, start and done flags, and counters. */
struct StressControl {
  BlockRing to_[2];  // to_[r]: blocks for worker r to check and free
  chi::Atomic<u32> child_attached_;
  chi::Atomic<u32> started_;
  chi::Atomic<u32> done_[2];
  chi::Atomic<u32> errors_[2];
  chi::Atomic<u64> allocs_[2];
  chi::Atomic<u64> foreign_frees_[2];
};

constexpr int kStressOps = 100000;
constexpr u64 kStressMinSize = 16;
constexpr u64 kStressMaxSize = 64 * 1024;
constexpr size_t kStressMaxLive = 200;
constexpr u64 kStressSegmentBytes = 128ull << 20;

constexpr int kStressBurst = 1500;  // blocks each side carves at once before the churn

/** Log-uniform size in [kStressMinSize, 2^max_bits] (max_bits <= 16). */
u64 RandomSize(u64 &rng, u32 max_bits) {
  rng = Mix(rng);
  u32 bits = 4 + static_cast<u32>(rng % (max_bits - 3));  // 2^4 .. 2^max_bits
  u64 hi = 1ull << bits;
  u64 size = hi - (Mix(rng) % (hi / 2));
  return size < kStressMinSize ? kStressMinSize : (size > kStressMaxSize ? kStressMaxSize : size);
}

/**
 * One side of the stress. First both sides carve a burst of fresh blocks at once (races
 * on the bump region); then they churn: allocate, fill, check and free, mostly in a few
 * hot small classes (races on the same free-list heads) and sometimes up to 64 KiB,
 * handing a quarter of the blocks to the other side and freeing what it hands over.
 * Every block's pattern is checked before it is freed, so an overlap shows up as a
 * corrupted pattern. Counts every failure in errors_.
 */
void StressWorker(SizeClassAllocator *alloc, StressControl *ctl, int me, u64 seed) {
  const int peer = 1 - me;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kChildWaitSeconds / 2);
  auto fail = [&] { ctl->errors_[me].FetchAdd(1); };
  auto release = [&](ShmPtr<void> p, u64 size) {
    if (!CheckBlock(alloc->ToPointer(p.Cast<u8>()), size)) fail();
    if (!alloc->Free(p)) fail();
  };
  auto drain = [&] {
    BlockRing::Entry e;
    while (ctl->to_[me].TryPop(&e)) {
      release(e.ptr_, e.size_);
      ctl->foreign_frees_[me].FetchAdd(1, chi::MemOrder::kRelaxed);
    }
  };
  // Start together so the two sides really overlap.
  ctl->started_.FetchAdd(1);
  while (ctl->started_.Load() < 2) {
    if (std::chrono::steady_clock::now() > deadline) return fail();
    chi::CpuRelax();
  }
  u64 rng = seed;
  u64 serial = static_cast<u64>(me) << 56;
  auto allocate = [&](u32 max_bits, std::vector<BlockRing::Entry> *into) {
    u64 size = RandomSize(rng, max_bits);
    ShmPtr<void> p = alloc->Allocate(size);
    if (p.IsNull()) return fail();
    FillBlock(alloc->ToPointer(p.Cast<u8>()), size, ++serial);
    into->push_back({p, size});
    ctl->allocs_[me].FetchAdd(1, chi::MemOrder::kRelaxed);
  };
  std::vector<BlockRing::Entry> burst;
  for (int i = 0; i < kStressBurst; ++i) allocate(9, &burst);
  std::vector<BlockRing::Entry> live;
  for (int op = 0; op < kStressOps; ++op) {
    rng = Mix(rng);
    const u64 dice = rng % 100;
    if (live.empty() || (dice < 50 && live.size() < kStressMaxLive)) {
      allocate(dice % 8 == 0 ? 16 : 6, &live);
    } else {
      size_t i = Mix(rng) % live.size();
      BlockRing::Entry e = live[i];
      live[i] = live.back();
      live.pop_back();
      if (dice >= 75 || !ctl->to_[peer].TryPush(e)) release(e.ptr_, e.size_);
    }
    drain();
  }
  for (const BlockRing::Entry &e : live) release(e.ptr_, e.size_);
  for (const BlockRing::Entry &e : burst) release(e.ptr_, e.size_);
  ctl->done_[me].Store(1, chi::MemOrder::kRelease);  // we push nothing more
  // Free what the peer still sends until it is done and its last blocks are drained.
  while (true) {
    bool peer_done = ctl->done_[peer].Load(chi::MemOrder::kAcquire) != 0;
    drain();
    if (peer_done && ctl->to_[me].head_.Load() == ctl->to_[me].tail_.Load()) break;
    if (std::chrono::steady_clock::now() > deadline) return fail();
    chi::CpuRelax();
  }
}

// ---- Child routines (run instead of doctest when CHI_TEST_CHILD is set) ----

/** The child half of the two-process allocator stress. */
int ChildStress() {
  PosixShmBackend backend;
  if (!backend.Attach(std::getenv("CHI_TEST_SEGMENT")).ok()) return kChildAttachFailed;
  SizeClassAllocator *alloc = nullptr;
  if (!chi::AttachAllocator(backend, &alloc).ok()) return kChildNoAllocator;
  FullPtr<StressControl> ctl(PtrFromText(std::getenv("CHI_TEST_PTR")).Cast<StressControl>());
  if (ctl.IsNull()) return kChildUnresolved;
  ctl->child_attached_.Store(1);
  StressWorker(alloc, ctl.ptr_, 1, 0xC0FFEE);
  return ctl->errors_[1].Load() == 0 ? kChildOk : kChildStressErrors;
}

const chi_test::ChildRoutine kStressChild("stress", ChildStress);

}  // namespace

// ---- General allocator ----

TEST_CASE("size classes cover every size with at most 25 percent rounding") {
  for (u32 c = 1; c < SizeClassAllocator::kNumClasses; ++c) {
    CHECK(SizeClassAllocator::ClassSize(c) > SizeClassAllocator::ClassSize(c - 1));
    CHECK(SizeClassAllocator::ClassSize(c) % SizeClassAllocator::kUnit == 0);
    CHECK(SizeClassAllocator::SizeToClass(SizeClassAllocator::ClassSize(c)) == c);
    CHECK(SizeClassAllocator::SizeToClass(SizeClassAllocator::ClassSize(c - 1) + 1) == c);
  }
  for (u64 n = 33; n < (1u << 20); n = n * 9 / 8 + 1) {
    u64 block = SizeClassAllocator::ClassSize(SizeClassAllocator::SizeToClass(n));
    CHECK(block >= n);
    CHECK(block * 4 <= n * 5 + 3 * 16);
  }
  CHECK(SizeClassAllocator::SizeToClass(SizeClassAllocator::kMaxBlock + 1) ==
        SizeClassAllocator::kNumClasses);
}

TEST_CASE("allocations are aligned, disjoint, and every free is accounted for") {
  MallocBackend backend;
  REQUIRE(backend.Create("general", 8 << 20).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(300, 1), &alloc).ok());
  const u64 free_at_start = alloc->FreeBytes();
  CHECK(free_at_start == alloc->Capacity());
  struct Block {
    ShmPtr<void> p;
    u64 size;
  };
  std::vector<Block> blocks;
  u64 rng = 42;
  for (int i = 0; i < 2000; ++i) {
    rng = Mix(rng);
    u64 size = 1 + rng % 3000;
    u64 align = 1ull << (rng >> 60) % 13;  // 1 .. 4096
    ShmPtr<void> p = alloc->Allocate(size, align);
    REQUIRE_FALSE(p.IsNull());
    CHECK(reinterpret_cast<uintptr_t>(alloc->ToPointer(p)) % align == 0);
    std::memset(alloc->ToPointer(p), 0, size);
    if (size >= 16) FillBlock(alloc->ToPointer(p.Cast<u8>()), size, rng);
    blocks.push_back({p, size});
  }
  CHECK(alloc->FreeBytes() < free_at_start);
  CHECK(alloc->AuditFreeBytes() == alloc->FreeBytes());
  for (const Block &b : blocks) {
    if (b.size >= 16) CHECK(CheckBlock(alloc->ToPointer(b.p.Cast<u8>()), b.size));
    CHECK(alloc->Free(b.p));
  }
  CHECK(alloc->FreeBytes() == free_at_start);
  CHECK(alloc->AuditFreeBytes() == free_at_start);
}

TEST_CASE("double frees and foreign pointers are refused without damage") {
  MallocBackend backend;
  REQUIRE(backend.Create("refuse", 1 << 20).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(301, 1), &alloc).ok());
  const u64 free_at_start = alloc->FreeBytes();
  ShmPtr<void> p = alloc->Allocate(100);
  ShmPtr<void> aligned = alloc->Allocate(100, 1024);
  REQUIRE_FALSE(p.IsNull());
  REQUIRE_FALSE(aligned.IsNull());
  CHECK(alloc->Free(p));
  CHECK_FALSE(alloc->Free(p));
  CHECK_FALSE(alloc->Free(ShmPtr<void>(AllocatorId(999, 1), aligned.off_)));
  CHECK_FALSE(alloc->Free(ShmPtr<void>::GetNull()));
  CHECK_FALSE(alloc->Free(ShmPtr<void>(alloc->Id(), 8)));  // inside the header
  CHECK(alloc->Free(aligned));
  CHECK_FALSE(alloc->Free(aligned));
  CHECK(alloc->FreeBytes() == free_at_start);
  CHECK(alloc->AuditFreeBytes() == free_at_start);
}

TEST_CASE("New constructs in place and Delete runs the destructor") {
  MallocBackend backend;
  REQUIRE(backend.Create("typed", 1 << 20).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(302, 1), &alloc).ok());
  static int destroyed = 0;
  struct alignas(128) Tracked {
    u64 value;
    explicit Tracked(u64 v) : value(v) {}
    ~Tracked() { ++destroyed; }
  };
  const u64 free_at_start = alloc->FreeBytes();
  FullPtr<Tracked> t = alloc->New<Tracked>(77);
  REQUIRE_FALSE(t.IsNull());
  CHECK(t->value == 77);
  CHECK(reinterpret_cast<uintptr_t>(t.ptr_) % 128 == 0);
  CHECK(alloc->Delete(t));
  CHECK(destroyed == 1);
  CHECK(alloc->FreeBytes() == free_at_start);
}

TEST_CASE("out of memory returns a null ShmPtr and the allocator recovers after frees") {
  MallocBackend backend;
  REQUIRE(backend.Create("oom", 256 << 10).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(303, 1), &alloc).ok());
  const u64 free_at_start = alloc->FreeBytes();
  CHECK(alloc->Allocate(alloc->Capacity()).IsNull());  // too big: nothing carved
  CHECK(alloc->Allocate(~0ull - 8).IsNull());          // absurd: no overflow
  CHECK(alloc->FreeBytes() == free_at_start);
  std::vector<ShmPtr<void>> blocks;
  while (true) {
    ShmPtr<void> p = alloc->Allocate(4000);
    if (p.IsNull()) break;
    blocks.push_back(p);
    REQUIRE(blocks.size() < 1000);
  }
  CHECK(blocks.size() > 40);
  std::vector<ShmPtr<void>> smalls;  // use up the tail too
  while (true) {
    ShmPtr<void> p = alloc->Allocate(16);
    if (p.IsNull()) break;
    smalls.push_back(p);
    REQUIRE(smalls.size() < 1000);
  }
  CHECK(alloc->Allocate(16).IsNull());
  CHECK(alloc->Allocate(4000).IsNull());
  CHECK(alloc->FreeBytes() < 32);
  CHECK(alloc->AuditFreeBytes() == alloc->FreeBytes());

  CHECK(alloc->Free(blocks.back()));
  blocks.pop_back();
  const u64 free_before_borrow = alloc->FreeBytes();
  ShmPtr<void> small = alloc->Allocate(100);  // no 128-byte block anywhere: borrows the 4 KiB one
  REQUIRE_FALSE(small.IsNull());
  CHECK(free_before_borrow - alloc->FreeBytes() == SizeClassAllocator::ClassSize(
                                                       SizeClassAllocator::SizeToClass(4016)));
  CHECK(alloc->Allocate(4000).IsNull());
  CHECK(alloc->Free(small));
  ShmPtr<void> again = alloc->Allocate(4000);  // the block is back in its own class
  REQUIRE_FALSE(again.IsNull());
  blocks.push_back(again);

  for (ShmPtr<void> p : blocks) CHECK(alloc->Free(p));
  for (ShmPtr<void> p : smalls) CHECK(alloc->Free(p));
  CHECK(alloc->FreeBytes() == free_at_start);
  CHECK(alloc->AuditFreeBytes() == free_at_start);
  CHECK_FALSE(alloc->Allocate(4000).IsNull());
}

TEST_CASE("two threads allocating and freeing each other's blocks leak nothing") {
  MallocBackend backend;
  REQUIRE(backend.Create("threads", kStressSegmentBytes).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(400, 1), &alloc).ok());
  FullPtr<StressControl> ctl = alloc->New<StressControl>();
  REQUIRE_FALSE(ctl.IsNull());
  const u64 free_with_control = alloc->FreeBytes();
  std::thread other([&] { StressWorker(alloc, ctl.ptr_, 1, 0xBEEF); });
  StressWorker(alloc, ctl.ptr_, 0, 0xFACE);
  other.join();
  CHECK(ctl->errors_[0].Load() == 0);
  CHECK(ctl->errors_[1].Load() == 0);
  CHECK(ctl->foreign_frees_[0].Load() > 0);
  CHECK(ctl->foreign_frees_[1].Load() > 0);
  CHECK(alloc->FreeBytes() == free_with_control);
  CHECK(alloc->AuditFreeBytes() == free_with_control);
}

TEST_CASE("more threads than cores churning one size class never share a block") {
  // Every thread pops and pushes on the same free-list head, so CASes fail and retry;
  // a block handed to two threads at once shows up as a broken token.
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 500000;
  MallocBackend backend;
  REQUIRE(backend.Create("hot_class", 1 << 20).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(402, 1), &alloc).ok());
  const u64 free_at_start = alloc->FreeBytes();
  chi::Atomic<u32> errors;
  auto churn = [&](u64 me) {
    ShmPtr<void> held[3];
    u64 token[3] = {0, 0, 0};
    for (int op = 0; op < kOpsPerThread; ++op) {
      const int slot = op % 3;
      if (!held[slot].IsNull()) {
        u64 *p = alloc->ToPointer(held[slot].Cast<u64>());
        if (p[0] != token[slot] || p[1] != ~token[slot]) errors.FetchAdd(1);
        if (!alloc->Free(held[slot])) errors.FetchAdd(1);
      }
      held[slot] = alloc->Allocate(16);
      if (held[slot].IsNull()) {
        errors.FetchAdd(1);
        continue;
      }
      token[slot] = (me << 32) | static_cast<u64>(op);
      u64 *p = alloc->ToPointer(held[slot].Cast<u64>());
      p[0] = token[slot];
      p[1] = ~token[slot];
    }
    for (ShmPtr<void> h : held) {
      if (!h.IsNull() && !alloc->Free(h)) errors.FetchAdd(1);
    }
  };
  std::vector<std::thread> threads;
  for (u64 t = 0; t < kThreads; ++t) threads.emplace_back(churn, t + 1);
  for (std::thread &t : threads) t.join();
  CHECK(errors.Load() == 0);
  CHECK(alloc->FreeBytes() == free_at_start);
  CHECK(alloc->AuditFreeBytes() == free_at_start);
}

TEST_CASE("two processes allocating and freeing each other's blocks leak nothing") {
  const std::string name = UniqueName("stress");
  SegmentGuard guard{name};
  PosixShmBackend backend;
  REQUIRE(backend.Create(name, kStressSegmentBytes).ok());
  SizeClassAllocator *alloc = nullptr;
  REQUIRE(chi::CreateAllocator(backend, AllocatorId(401, 1), &alloc).ok());
  const u64 free_at_start = alloc->FreeBytes();
  FullPtr<StressControl> ctl = alloc->New<StressControl>();
  REQUIRE_FALSE(ctl.IsNull());
  const u64 free_with_control = alloc->FreeBytes();

  pid_t pid = SpawnChild("stress", {{"CHI_TEST_SEGMENT", name},
                                    {"CHI_TEST_PTR", PtrToText(ctl.shm_.Cast<void>())}});
  REQUIRE(pid > 0);
  // Once the child has the segment mapped its name is no longer needed: removing it now
  // means even a crash below leaves nothing behind in /dev/shm.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kChildWaitSeconds);
  while (ctl->child_attached_.Load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  CHECK(ctl->child_attached_.Load() == 1);
  CHECK(PosixShmBackend::DestroyByName(name).ok());
  StressWorker(alloc, ctl.ptr_, 0, 0xFACE);
  CHECK(WaitChild(pid) == kChildOk);
  CHECK(ctl->errors_[0].Load() == 0);
  CHECK(ctl->errors_[1].Load() == 0);
  CHECK(ctl->allocs_[1].Load() > kStressOps / 4);
  CHECK(ctl->foreign_frees_[0].Load() > 0);  // blocks the child allocated, freed here
  CHECK(ctl->foreign_frees_[1].Load() > 0);  // and the other way round
  CHECK(alloc->FreeBytes() == free_with_control);
  CHECK(alloc->AuditFreeBytes() == free_with_control);
  CHECK(alloc->Delete(ctl));
  CHECK(alloc->FreeBytes() == free_at_start);
}
