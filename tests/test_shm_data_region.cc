// A slot's data region (shm_data_region.h) on its own: blocks reserved and freed in order,
// blocks that would cross the region's end moved to the next lap, a reader that publishes
// nonsense leaving the writer without room instead of overlapping blocks, refs outside the
// region refused, and the kRef stream records that carry refs (shm_stream.h).
#include <doctest/doctest.h>

#include <chi/transport/shm_data_region.h>

#include <cstdlib>  // aligned_alloc for a stream
#include <memory>   // the region's memory
#include <vector>   // region bytes

using chi::Atomic;
using chi::MemOrder;
using chi::ShmDataRef;
using chi::ShmDataRegion;
using chi::ShmStream;
using chi::u64;

namespace {

constexpr u64 kRegion = 4096;

/** A region of kRegion bytes and its shared `released` word, in this process. */
struct Region {
  std::vector<char> bytes = std::vector<char>(kRegion);
  Atomic<u64> released;
  ShmDataRegion view{bytes.data(), kRegion, &released};
};

}  // namespace

TEST_CASE("blocks are reserved at the write position and freed in order") {
  Region r;
  u64 w = 0;
  ShmDataRef a;
  char *pa = r.view.Reserve(w, 1000, &a);
  REQUIRE(pa == r.bytes.data());
  CHECK(a.pos == 0);
  CHECK(a.bytes == 1000);
  w = ShmDataRegion::Commit(a);
  ShmDataRef b;
  REQUIRE(r.view.Reserve(w, 3000, &b) == r.bytes.data() + 1000);
  w = ShmDataRegion::Commit(b);
  CHECK(r.view.HeldBytes(w) == 4000);
  ShmDataRef c;
  CHECK(r.view.Reserve(w, 200, &c) == nullptr);  // 96 bytes left before the end, none after
  CHECK_FALSE(r.view.HasRoomSeqCst(w, 200));
  REQUIRE(r.view.Resolve(a) == r.bytes.data());
  r.view.Release(a);
  // Free: [0, 1000) on the next lap; the 96-byte tail is skipped.
  REQUIRE(r.view.HasRoomSeqCst(w, 200));
  char *pc = r.view.Reserve(w, 200, &c);
  REQUIRE(pc == r.bytes.data());
  CHECK(c.pos == kRegion);
  CHECK(r.view.Resolve(c) == r.bytes.data());
  r.view.Release(b);
  r.view.Release(c);
  w = ShmDataRegion::Commit(c);
  CHECK(r.view.HeldBytes(w) == 0);
}

TEST_CASE("the room for an encode in place is the larger of the tail and the next lap's head") {
  Region r;
  u64 start = 0;
  CHECK(r.view.ContiguousRoom(0, &start) == kRegion);
  CHECK(start == 0);
  // Written up to 3000, freed up to 2000: the tail has 1096 bytes, the next lap's head 2000.
  r.released.Store(2000, MemOrder::kRelaxed);
  CHECK(r.view.ContiguousRoom(3000, &start) == 2000);
  CHECK(start == kRegion);
  CHECK(r.view.At(start) == r.bytes.data());
  // Freed up to 500 instead: the tail (1096) beats the head (500).
  r.released.Store(500, MemOrder::kRelaxed);
  CHECK(r.view.ContiguousRoom(3000, &start) == 1096);
  CHECK(start == 3000);
}

TEST_CASE("an empty region offers all of itself, from the next lap's start if need be") {
  Region r;
  r.released.Store(3000, MemOrder::kRelaxed);  // everything written so far is freed
  u64 start = 0;
  CHECK(r.view.ContiguousRoom(3000, &start) == kRegion);
  CHECK(start == kRegion);
  ShmDataRef big;
  REQUIRE(r.view.Reserve(3000, 4000, &big) == r.bytes.data());
  CHECK(big.pos == kRegion);
  const u64 w = ShmDataRegion::Commit(big);
  CHECK(r.view.HeldBytes(w) == w - 3000);  // the skipped tail counts until the block is freed
  CHECK(r.view.ContiguousRoom(w, &start) == 0);
  ShmDataRef more;
  CHECK(r.view.Reserve(w, 64, &more) == nullptr);
  r.view.Release(big);
  CHECK(r.view.ContiguousRoom(w, &start) == kRegion);
  CHECK(start == 2 * kRegion);
}

TEST_CASE("a writer that waits for each block's release reuses the region's first bytes") {
  Region r;
  u64 w = 0;
  for (int k = 0; k < 10; ++k) {
    ShmDataRef ref;
    REQUIRE(r.view.Reserve(w, 700, &ref) == r.bytes.data());
    w = ShmDataRegion::Commit(ref);
    r.view.Release(ref);  // the reader is done before the next block is written
  }
  CHECK(w == 9 * kRegion + 700);  // a new lap each time, always at offset 0
  CHECK(r.view.HeldBytes(w) == 0);
}

TEST_CASE("a reader that freed more than was written moves the writer on; no block overlaps") {
  Region r;
  ShmDataRef ref;
  u64 start = 0;
  r.released.Store(9000, MemOrder::kRelaxed);  // beyond anything written (w = 100)
  REQUIRE(r.view.Reserve(100, 10, &ref) != nullptr);
  CHECK(ref.pos == 3 * kRegion);  // on past the reader's position (9000), never back
  CHECK(r.view.HasRoomSeqCst(100, 10));
  CHECK(r.view.ContiguousRoom(100, &start) == kRegion);
  CHECK(start >= 9000);
  CHECK(r.view.HeldBytes(100) == 0);
  CHECK(r.view.Reserve(0, kRegion + 1, &ref) == nullptr);  // larger than the region
  CHECK(r.view.Reserve(0, 0, &ref) == nullptr);
}

TEST_CASE("a ref outside the region or crossing its end is refused") {
  Region r;
  CHECK(r.view.Resolve(ShmDataRef{0, kRegion}) == r.bytes.data());
  CHECK(r.view.Resolve(ShmDataRef{5 * kRegion + 64, 128}) == r.bytes.data() + 64);
  CHECK(r.view.Resolve(ShmDataRef{kRegion - 8, 64}) == nullptr);
  CHECK(r.view.Resolve(ShmDataRef{0, kRegion + 1}) == nullptr);
  CHECK(r.view.Resolve(ShmDataRef{64, 0}) == nullptr);
  CHECK(r.view.Resolve(ShmDataRef{~0ull, ~0ull}) == nullptr);
  ShmDataRegion off;
  CHECK_FALSE(off.Enabled());
  CHECK(off.Resolve(ShmDataRef{0, 1}) == nullptr);
}

TEST_CASE("kRef records carry a ref; a kRef record of another length is a corrupt stream") {
  constexpr unsigned kRing = 1024;
  const size_t bytes = ShmStream::BytesFor(kRing);
  std::unique_ptr<char, decltype(&std::free)> mem(
      static_cast<char *>(std::aligned_alloc(64, bytes)), &std::free);
  const ShmStream s = ShmStream::Create(mem.get(), kRing);
  REQUIRE(s.Valid());
  const ShmDataRef sent{123456, 789, 5000};
  REQUIRE(s.WritableBytes(ShmStream::kRefBytes) >= ShmStream::kRefBytes);
  s.WriteRef(&sent, MemOrder::kSeqCst);
  ShmStream::Piece p;
  REQUIRE(s.Peek(&p) == ShmStream::PeekResult::kReady);
  CHECK(p.kind == ShmStream::kRef);
  CHECK(p.bytes == ShmStream::kRefBytes);
  const ShmDataRef got = chi::RefOf(p);
  CHECK(got.pos == sent.pos);
  CHECK(got.bytes == sent.bytes);
  CHECK(got.total == sent.total);
  CHECK_FALSE(got.Whole());
  s.Consume(p);
  CHECK(s.Peek(&p) == ShmStream::PeekResult::kEmpty);

  // A header claiming kRef with 32 payload bytes: the reader must not trust the stream.
  const ShmStream bad = ShmStream::Create(mem.get(), kRing);
  REQUIRE(bad.Valid());
  char payload[32] = {};
  bad.WritePiece(true, sizeof(payload), payload, sizeof(payload));  // a kWhole record
  auto *word = reinterpret_cast<Atomic<u64> *>(mem.get() + ShmStream::BytesFor(kRing) - kRing);
  word->Store(static_cast<u64>(ShmStream::kRef) | (u64{32} << 32), MemOrder::kRelease);
  CHECK(bad.Peek(&p) == ShmStream::PeekResult::kCorrupt);
}
