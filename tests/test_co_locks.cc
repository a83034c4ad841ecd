// CoMutex and CoRwLock inside runtime tasks: waiting suspends the fiber (other
// tasks keep running on the same worker), same-group tasks re-enter, readers
// overlap and writers exclude, and the fibers of waiters are reused afterwards.
#include "embedded_fixture.h"

#include <algorithm>
#include <vector>

using chimaera::demo::LockHoldTask;
using chimaera::demo::LockMode;
using chi::PoolQuery;

namespace {

constexpr chi::u64 kMs = 1000000ull;

chimaera::demo::Client &LockPool() {
  static chimaera::demo::Client c = chi_test::MakeDemoPool("locks", chi::PoolId(220, 0));
  return c;
}

struct Interval {
  chi::u64 start, end;
};

std::vector<Interval> RunAll(std::vector<chi::Future<LockHoldTask>> &fs) {
  REQUIRE(chi::WaitAll(fs, 60));
  std::vector<Interval> out;
  for (auto &f : fs) {
    REQUIRE(f->GetReturnCode() == 0);
    REQUIRE(f->end_ns_ >= f->start_ns_);
    out.push_back({f->start_ns_, f->end_ns_});
  }
  std::sort(out.begin(), out.end(), [](auto &a, auto &b) { return a.start < b.start; });
  return out;
}

}  // namespace

TEST_CASE("five tasks holding a CoMutex for 10 ms each run one after another") {
  auto &client = LockPool();
  std::vector<chi::Future<LockHoldTask>> fs;
  for (int i = 0; i < 5; ++i) fs.push_back(client.AsyncLockHold(PoolQuery::Local(), LockMode::kMutex, 10 * kMs));
  std::vector<Interval> iv = RunAll(fs);
  for (size_t i = 1; i < iv.size(); ++i) CHECK(iv[i].start >= iv[i - 1].end);
  CHECK(iv.back().end - iv.front().start >= 40 * kMs);
  for (auto &f : fs) CHECK(f->max_inside_ == 1);
}

TEST_CASE("a subtask of the holder's group re-enters the CoMutex without deadlock") {
  auto &client = LockPool();
  auto f = client.AsyncLockHold(PoolQuery::Local(), LockMode::kMutex, 1 * kMs, 3);
  REQUIRE(f.Wait(30));
  CHECK(f->GetReturnCode() == 0);
  CHECK(f->max_inside_ == 4);  // parent and three nested subtasks inside together
  // A different group still waits for the whole nest to finish.
  std::vector<chi::Future<LockHoldTask>> fs;
  fs.push_back(client.AsyncLockHold(PoolQuery::Local(), LockMode::kMutex, 5 * kMs, 2));
  fs.push_back(client.AsyncLockHold(PoolQuery::Local(), LockMode::kMutex, 5 * kMs, 0));
  std::vector<Interval> iv = RunAll(fs);
  CHECK(iv[1].start >= iv[0].end);
}

TEST_CASE("CoRwLock lets five readers overlap") {
  auto &client = LockPool();
  const chi::u64 hold = 20 * kMs;
  std::vector<chi::Future<LockHoldTask>> fs;
  for (int i = 0; i < 5; ++i) fs.push_back(client.AsyncLockHold(PoolQuery::Local(), LockMode::kRead, hold));
  std::vector<Interval> iv = RunAll(fs);
  // Overlap, not a time bound (machines are shared): two readers held it at once.
  bool overlapped = false;
  for (size_t i = 0; i < iv.size(); ++i) {
    for (size_t j = i + 1; j < iv.size(); ++j) {
      overlapped |= iv[i].start < iv[j].end && iv[j].start < iv[i].end;
    }
  }
  CHECK(overlapped);
  chi::u32 most = 0;
  for (auto &f : fs) most = std::max(most, f->max_inside_);
  CHECK(most >= 2);
}

TEST_CASE("CoRwLock writers exclude readers and other writers") {
  auto &client = LockPool();
  std::vector<chi::Future<LockHoldTask>> fs;
  std::vector<bool> is_writer;
  for (int i = 0; i < 9; ++i) {
    const bool w = i % 3 == 1;
    is_writer.push_back(w);
    fs.push_back(client.AsyncLockHold(PoolQuery::Local(), w ? LockMode::kWrite : LockMode::kRead, 3 * kMs));
  }
  REQUIRE(chi::WaitAll(fs, 60));
  for (size_t i = 0; i < fs.size(); ++i) {
    if (!is_writer[i]) continue;
    CHECK(fs[i]->max_inside_ == 1);
    for (size_t j = 0; j < fs.size(); ++j) {
      if (i == j) continue;
      const bool disjoint = fs[j]->end_ns_ <= fs[i]->start_ns_ || fs[j]->start_ns_ >= fs[i]->end_ns_;
      CAPTURE(i);
      CAPTURE(j);
      CHECK(disjoint);
    }
  }
}

TEST_CASE("a writer's own group re-enters its write lock") {
  auto &client = LockPool();
  auto f = client.AsyncLockHold(PoolQuery::Local(), LockMode::kWrite, 1 * kMs, 2);
  REQUIRE(f.Wait(30));
  CHECK(f->GetReturnCode() == 0);
  CHECK(f->max_inside_ == 3);
}

TEST_CASE("two waves of 100 tasks queued on a CoMutex run on at most 100 fiber shells") {
  auto &client = LockPool();
  auto shells = [] {
    chi::u64 n = 0;
    for (const chi::WorkerStats &w : chi::Chimaera::Get().Orchestrator()->Stats()) n += w.fibers_;
    return n;
  };
  const chi::u64 before = shells();
  for (int wave = 0; wave < 2; ++wave) {
    std::vector<chi::Future<LockHoldTask>> fs;
    for (int i = 0; i < 100; ++i) {
      fs.push_back(client.AsyncLockHold(PoolQuery::Local(), LockMode::kMutex, kMs / 10));
    }
    std::vector<Interval> iv = RunAll(fs);
    for (size_t i = 1; i < iv.size(); ++i) CHECK(iv[i].start >= iv[i - 1].end);
  }
  // Each waiter holds its shell while suspended; the second wave reuses the first wave's.
  CHECK(shells() - before <= 100);
}
