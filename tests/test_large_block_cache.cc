// Large task payloads keep their memory between tasks: a freed block serves the next
// allocation it fits, blocks past the warm budget lend their pages to the kernel and still
// read back intact, the kept blocks stay within their limits, and TaskBuffer payloads on
// either side of the size boundary encode, decode, copy and move intact, and a process
// forked while another thread uses the cache can still allocate.
#include <doctest/doctest.h>

#include <chi/memory/large_block_cache.h>
#include <chi/serialize/archive.h>
#include <chi/task/task_buffer.h>

#include <cstdint>  // uintptr_t
#include <set>
#include <thread>
#include <vector>

#include "fork_while_busy.h"
#include "lazy_free_bytes.h"

namespace {

using chi::LargeBlockCache;
using chi::u32;
using chi::u64;

constexpr u64 kMiB = 1ull << 20;

/** Writes a pattern of `tag` over every 512th byte and both ends of [p, p + n). */
void Fill(char *p, u64 n, u32 tag) {
  if (n == 0) return;
  for (u64 i = 0; i < n; i += 512) p[i] = static_cast<char>((i / 512 + tag) % 251);
  p[n - 1] = static_cast<char>(tag);
}

/** True when [p, p + n) holds Fill's pattern for `tag`. */
bool Holds(const char *p, u64 n, u32 tag) {
  if (n == 0) return true;
  for (u64 i = 0; i < n; i += 512) {
    if (i != n - 1 && p[i] != static_cast<char>((i / 512 + tag) % 251)) return false;
  }
  return p[n - 1] == static_cast<char>(tag);
}

LargeBlockCache &Cache() { return LargeBlockCache::Instance(); }

}  // namespace

TEST_CASE("a freed large block serves the next allocation it fits") {
  Cache().Trim();
  char *a = static_cast<char *>(Cache().Allocate(32 * kMiB));
  REQUIRE(a != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 64 == 0);
  Fill(a, 32 * kMiB, 1);
  CHECK(Holds(a, 32 * kMiB, 1));
  Cache().Free(a);
  CHECK(Cache().Kept().blocks == 1);
  CHECK(Cache().Kept().warm_bytes >= 32 * kMiB);  // within the warm budget: its pages stay ours

  char *b = static_cast<char *>(Cache().Allocate(30 * kMiB));  // same granule count or fewer
  CHECK(b == a);
  CHECK(Cache().Kept().blocks == 0);
  Fill(b, 30 * kMiB, 2);
  CHECK(Holds(b, 30 * kMiB, 2));
  Cache().Free(b);
  Cache().Trim();
  CHECK(Cache().Kept().blocks == 0);
  CHECK(Cache().Kept().bytes == 0);
  CHECK(Cache().Kept().warm_bytes == 0);
}

TEST_CASE("blocks freed past the warm budget lend their pages and still serve intact") {
  Cache().Trim();
  constexpr u64 kBytes = 40 * kMiB;
  char *a = static_cast<char *>(Cache().Allocate(kBytes));
  char *b = static_cast<char *>(Cache().Allocate(kBytes));
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  Fill(a, kBytes, 3);
  Fill(b, kBytes, 4);
  const u64 lazy_before = chi_test::LazyFreeBytes();
  Cache().Free(a);  // warm: 40 MiB of the 64 MiB budget
  Cache().Free(b);  // past the budget: lent
  CHECK(Cache().Kept().blocks == 2);
  CHECK(Cache().Kept().warm_bytes <= Cache().WarmLimit());
  CHECK(Cache().Kept().bytes > Cache().Kept().warm_bytes);
  // Allow for pages the kernel took back already.
  CHECK(chi_test::LazyFreeBytes() >= lazy_before + kBytes / 2);

  char *c = static_cast<char *>(Cache().Allocate(kBytes));
  char *d = static_cast<char *>(Cache().Allocate(kBytes));
  CHECK(std::set<char *>{c, d} == std::set<char *>{a, b});
  // A lent page reads as ours again or as zeros: what the next payload writes is what it reads.
  Fill(c, kBytes, 5);
  Fill(d, kBytes, 6);
  CHECK(Holds(c, kBytes, 5));
  CHECK(Holds(d, kBytes, 6));
  Cache().Free(c);
  Cache().Free(d);
  Cache().Trim();
}

TEST_CASE("a lowered warm limit lends the kept blocks past it at once and on later frees") {
  Cache().Trim();
  REQUIRE(Cache().WarmLimit() == LargeBlockCache::kDefaultWarmBytes);
  constexpr u64 kBytes = 24 * kMiB;
  char *a = static_cast<char *>(Cache().Allocate(kBytes));
  char *b = static_cast<char *>(Cache().Allocate(kBytes));
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  Fill(a, kBytes, 8);
  Cache().Free(a);
  Cache().Free(b);
  REQUIRE(Cache().Kept().warm_bytes == Cache().Kept().bytes);  // both within the default 64 MiB

  const u64 lazy_before = chi_test::LazyFreeBytes();
  Cache().SetWarmLimit(30 * kMiB);  // as memory.warm_payload_bytes: 30m would set it
  CHECK(Cache().WarmLimit() == 30 * kMiB);
  CHECK(Cache().Kept().blocks == 2);  // still kept, for reuse
  CHECK(Cache().Kept().warm_bytes <= 30 * kMiB);
  CHECK(Cache().Kept().warm_bytes != 0);  // the one that fits stays resident
  CHECK(chi_test::LazyFreeBytes() >= lazy_before + kBytes / 2);

  Cache().SetWarmLimit(0);  // 0: every kept block is lent, now and when freed later
  CHECK(Cache().Kept().warm_bytes == 0);
  CHECK(Cache().Kept().blocks == 2);
  char *c = static_cast<char *>(Cache().Allocate(kBytes));
  REQUIRE(c != nullptr);
  Fill(c, kBytes, 9);
  CHECK(Holds(c, kBytes, 9));  // a lent block serves intact
  Cache().Free(c);
  CHECK(Cache().Kept().warm_bytes == 0);

  Cache().SetWarmLimit(LargeBlockCache::kDefaultWarmBytes);
  Cache().Trim();
}

TEST_CASE("a kept block far larger than the allocation does not serve it") {
  Cache().Trim();
  char *big = static_cast<char *>(Cache().Allocate(64 * kMiB));
  REQUIRE(big != nullptr);
  Cache().Free(big);
  REQUIRE(Cache().Kept().blocks == 1);
  char *small = static_cast<char *>(Cache().Allocate(8 * kMiB));
  REQUIRE(small != nullptr);
  CHECK(small != big);
  CHECK(Cache().Kept().blocks == 1);  // the big one waits for a payload its size
  Fill(small, 8 * kMiB, 7);
  CHECK(Holds(small, 8 * kMiB, 7));
  Cache().Free(small);
  Cache().Trim();
}

TEST_CASE("the kept blocks stay within their count and byte limits") {
  // Each batch is allocated whole, then freed: the ones past the limits are unmapped.
  auto allocate_then_free = [](u32 count, u64 bytes) {
    std::vector<void *> blocks;
    for (u32 i = 0; i < count; ++i) {
      blocks.push_back(Cache().Allocate(bytes));
      REQUIRE(blocks.back() != nullptr);
    }
    for (void *p : blocks) Cache().Free(p);
  };
  Cache().Trim();
  allocate_then_free(LargeBlockCache::kMaxKeptBlocks + 4, 4 * kMiB);  // 272 MiB: the count binds
  CHECK(Cache().Kept().blocks == LargeBlockCache::kMaxKeptBlocks);
  CHECK(Cache().Kept().warm_bytes <= Cache().WarmLimit());
  Cache().Trim();
  allocate_then_free(48, 24 * kMiB);  // 1152 MiB: the bytes bind
  CHECK(Cache().Kept().blocks < 48);
  CHECK(Cache().Kept().bytes <= LargeBlockCache::kMaxKeptBytes);
  CHECK(Cache().Kept().bytes + 24 * kMiB > LargeBlockCache::kMaxKeptBytes);
  CHECK(Cache().Kept().warm_bytes <= Cache().WarmLimit());
  Cache().Trim();
  CHECK(Cache().Kept().blocks == 0);
}

TEST_CASE("a window of small large payloads keeps its blocks resident and reuses them all") {
  // 64 payloads of 256 KiB in flight at once (a client's outstanding tasks): each block is
  // a 512 KiB mapping, not a 2 MiB one, so all of them fit the warm budget and come back.
  Cache().Trim();
  constexpr u64 kBytes = 256 << 10;
  std::set<char *> first;
  for (int round = 0; round < 2; ++round) {
    std::vector<char *> blocks;
    for (u32 i = 0; i < LargeBlockCache::kMaxKeptBlocks; ++i) {
      blocks.push_back(static_cast<char *>(Cache().Allocate(kBytes)));
      REQUIRE(blocks.back() != nullptr);
      Fill(blocks.back(), kBytes, i);
    }
    for (u32 i = 0; i < blocks.size(); ++i) CHECK(Holds(blocks[i], kBytes, i));
    if (round == 0) {
      first.insert(blocks.begin(), blocks.end());
    } else {
      CHECK(std::set<char *>(blocks.begin(), blocks.end()) == first);  // every one reused
      CHECK(Cache().Kept().blocks == 0);
    }
    for (char *p : blocks) Cache().Free(p);
    CHECK(Cache().Kept().blocks == LargeBlockCache::kMaxKeptBlocks);
    CHECK(Cache().Kept().warm_bytes == Cache().Kept().bytes);  // none lent
    CHECK(Cache().Kept().bytes == LargeBlockCache::kMaxKeptBlocks * (512 << 10));
  }
  Cache().Trim();
}

TEST_CASE("an allocation beyond any machine fails cleanly") {
  CHECK(Cache().Allocate(1ull << 50) == nullptr);
  chi::TaskBuffer huge;
  CHECK_FALSE(huge.Resize(1ull << 50));
  CHECK(huge.empty());
  CHECK(huge.data() == nullptr);
}

TEST_CASE("task buffers on either side of the large-block boundary keep their bytes") {
  Cache().Trim();
  for (u64 n : {LargeBlockCache::kMinBytes - 1, LargeBlockCache::kMinBytes,
                LargeBlockCache::kMinBytes + 1, 33 * kMiB}) {
    CAPTURE(n);
    std::vector<char> bytes(n);
    Fill(bytes.data(), n, static_cast<u32>(n % 97));
    chi::TaskBuffer original(bytes.data(), n);
    REQUIRE(original.size() == n);
    CHECK(Holds(original.data(), n, static_cast<u32>(n % 97)));

    chi::TaskBuffer copy(original);  // deep copy
    CHECK(copy.data() != original.data());
    CHECK(copy.view() == original.view());
    chi::TaskBuffer moved(std::move(copy));
    CHECK(moved.view() == original.view());
    CHECK(copy.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract

    std::vector<char> wire;
    chi::OutputArchive out(wire);
    original.serialize(out);
    REQUIRE(out.ok());
    chi::TaskBuffer decoded;
    chi::InputArchive in(wire.data(), wire.size());
    decoded.serialize(in);
    REQUIRE(in.ok());
    CHECK(decoded.view() == original.view());
  }
  Cache().Trim();
}

TEST_CASE("a freed large task buffer's memory serves the next payload") {
  Cache().Trim();
  const char *where = nullptr;
  {
    chi::TaskBuffer first(16 * kMiB);
    where = first.data();
  }
  chi::TaskBuffer next(16 * kMiB);  // zeroed, though its block held the first one's bytes
  CHECK(next.data() == where);
  bool zero = true;
  for (u64 i = 0; i < next.size(); i += 4096) zero = zero && next.data()[i] == 0;
  CHECK(zero);
  next.Reset();
  Cache().Trim();
}

TEST_CASE("threads taking and freeing large blocks at once each keep their own bytes") {
  constexpr int kThreads = 4;
  constexpr int kRounds = 40;
  std::vector<int> bad(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &bad] {
      for (int r = 0; r < kRounds; ++r) {
        const u64 n = (4 + static_cast<u64>((t * 7 + r * 5) % 21)) * kMiB;
        const u32 tag = static_cast<u32>(t * 1000 + r);
        char *p = static_cast<char *>(Cache().Allocate(n));
        if (p == nullptr) {
          ++bad[t];
          continue;
        }
        Fill(p, n, tag);
        std::this_thread::yield();  // let the others reuse and free around us
        if (!Holds(p, n, tag)) ++bad[t];
        Cache().Free(p);
      }
    });
  }
  for (std::thread &th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) CHECK(bad[t] == 0);
  CHECK(Cache().Kept().blocks <= LargeBlockCache::kMaxKeptBlocks);
  Cache().Trim();
}

TEST_CASE("a process forked while another thread uses the cache can allocate large blocks") {
  Cache().Trim();
  const chi_test::ForkOutcome out = chi_test::ForkWhileBusy(
      100,
      [] { Cache().Free(Cache().Allocate(8 * kMiB)); },  // holds the cache's lock often
      [] {  // the child: only this thread; the cache must still be usable
        char *p = static_cast<char *>(Cache().Allocate(6 * kMiB));
        if (p == nullptr) return 2;
        Fill(p, 6 * kMiB, 7);
        const bool ok = Holds(p, 6 * kMiB, 7);
        Cache().Free(p);
        return ok && Cache().Kept().blocks >= 1 ? 0 : 3;
      });
  CHECK(out.hung == 0);
  CHECK(out.failed == 0);
  Cache().Trim();
}
