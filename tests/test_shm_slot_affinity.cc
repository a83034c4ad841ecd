// ShmSlotAffinity (which runtime worker reads which shm client slot): a slot stays with
// its home while the home keeps up, and is taken over when the home parked, when the home
// has two more waiting slots than the looker, or when a request waited kLongWaitLooks looks.
#include <doctest/doctest.h>

#include <chi/transport/shm_slot_affinity.h>

#include <vector>

using chi::ShmSlotAffinity;
using chi::u32;
using chi::u64;

namespace {

constexpr u64 kBothPolling = 0b11;  // workers 0 and 1 (ids + 1: 1 and 2) poll

/** A slot's request position as ShouldRead asks for it (1 + read position, 0: empty). */
auto At(u64 position) {
  return [position] { return position; };
}

/** Runs a foreign look of `v` over slots 0..n-1, with `waiting` slots holding requests. */
void Look(ShmSlotAffinity &a, ShmSlotAffinity::View &v, u32 n, const std::vector<bool> &waiting) {
  a.Survey(
      v,
      [n](auto visit) {
        for (u32 i = 0; i < n; ++i) visit(i);
      },
      [&waiting](u32 i) { return static_cast<bool>(waiting[i]); });
}

}  // namespace

TEST_CASE("a worker looks at others' slots once every kForeignLookEvery passes") {
  ShmSlotAffinity a(4, 4);
  ShmSlotAffinity::View &v = a.ViewOf(3);
  u32 looks = 0;
  for (u64 pass = 1; pass <= 10 * ShmSlotAffinity::kForeignLookEvery; ++pass) {
    const bool abroad = ShmSlotAffinity::BeginPass(v);
    CHECK(abroad == (pass % ShmSlotAffinity::kForeignLookEvery == 0));
    looks += abroad ? 1 : 0;
  }
  CHECK(looks == 10);
  CHECK(&a.ViewOf(3) == &v);
  CHECK(&a.ViewOf(2) != &v);  // each worker its own
}

TEST_CASE("a slot with no home is read by anyone and then belongs to whoever took it") {
  ShmSlotAffinity a(2, 4);
  ShmSlotAffinity::View &v1 = a.ViewOf(0);
  ShmSlotAffinity::View &v2 = a.ViewOf(1);
  CHECK(a.HomeOf(0) == 0);
  CHECK(a.ShouldRead(v1, 1, 0, false, kBothPolling, At(0)));
  CHECK(a.ShouldRead(v2, 2, 0, false, kBothPolling, At(0)));
  a.NoteTaken(0, 2);
  CHECK(a.HomeOf(0) == 2);
  CHECK(a.ShouldRead(v2, 2, 0, false, kBothPolling, At(0)));   // its home, every pass
  CHECK_FALSE(a.ShouldRead(v1, 1, 0, false, kBothPolling, At(0)));  // not a look: left alone
}

TEST_CASE("a busy home keeps its one client while it makes progress, however long") {
  ShmSlotAffinity a(1, 4);
  a.NoteTaken(0, 1);
  ShmSlotAffinity::View &v = a.ViewOf(1);  // worker id 1 is "2"
  for (u64 k = 0; k < 4 * ShmSlotAffinity::kLongWaitLooks; ++k) {
    Look(a, v, 1, {true});
    // A request waits at every look, but each time a later one: the home took the last.
    CHECK_FALSE(a.ShouldRead(v, 2, 0, true, kBothPolling, At(1 + 64 * k)));
  }
}

TEST_CASE("one waiting client stays with its home until the wait is long") {
  ShmSlotAffinity a(1, 4);
  a.NoteTaken(0, 1);
  ShmSlotAffinity::View &v = a.ViewOf(1);
  u32 looks = 0;
  bool taken = false;
  while (!taken && looks < 2 * ShmSlotAffinity::kLongWaitLooks) {
    Look(a, v, 1, {true});
    taken = a.ShouldRead(v, 2, 0, true, kBothPolling, At(1000));  // the same request each look
    ++looks;
  }
  CHECK(taken);
  CHECK(looks == ShmSlotAffinity::kLongWaitLooks);  // not earlier: moving it would gain nothing
}

TEST_CASE("a home with two more waiting slots than the looker gives one up at the second look") {
  ShmSlotAffinity a(3, 4);
  for (u32 i = 0; i < 3; ++i) a.NoteTaken(i, 1);  // worker "1" homes all three
  ShmSlotAffinity::View &v = a.ViewOf(1);       // worker "2" homes none
  Look(a, v, 3, {true, true, false});
  CHECK_FALSE(a.ShouldRead(v, 2, 1, true, kBothPolling, At(500)));  // first sight of it
  Look(a, v, 3, {true, true, false});
  CHECK(a.ShouldRead(v, 2, 1, true, kBothPolling, At(500)));  // still waiting: 2 >= 0 + 2
  a.NoteTaken(1, 2);
  CHECK(a.HomeOf(1) == 2);
  // Now one each: the other waiting slot stays with its home.
  Look(a, v, 3, {true, true, false});
  CHECK_FALSE(a.ShouldRead(v, 2, 0, true, kBothPolling, At(700)));
  Look(a, v, 3, {true, true, false});
  CHECK_FALSE(a.ShouldRead(v, 2, 0, true, kBothPolling, At(700)));
}

TEST_CASE("a slot whose home stopped polling is taken at the next look") {
  ShmSlotAffinity a(1, 4);
  a.NoteTaken(0, 1);
  ShmSlotAffinity::View &v = a.ViewOf(1);
  CHECK_FALSE(a.ShouldRead(v, 2, 0, false, 0b10, At(9)));  // not a look
  Look(a, v, 1, {true});
  CHECK(a.ShouldRead(v, 2, 0, true, 0b10, At(9)));  // worker 0 (home "1") is parked
}

TEST_CASE("a look that finds the slot empty starts the wait over") {
  ShmSlotAffinity a(1, 4);
  a.NoteTaken(0, 1);
  ShmSlotAffinity::View &v = a.ViewOf(1);
  for (u32 k = 0; k + 1 < ShmSlotAffinity::kLongWaitLooks; ++k) {
    CHECK_FALSE(a.ShouldRead(v, 2, 0, true, kBothPolling, At(77)));
  }
  CHECK_FALSE(a.ShouldRead(v, 2, 0, true, kBothPolling, At(0)));  // empty at this look
  for (u32 k = 0; k + 1 < ShmSlotAffinity::kLongWaitLooks; ++k) {
    CHECK_FALSE(a.ShouldRead(v, 2, 0, true, kBothPolling, At(77)));
  }
  CHECK(a.ShouldRead(v, 2, 0, true, kBothPolling, At(77)));
}
