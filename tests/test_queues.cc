// SpscRing, MpscRing and TaskQueue: FIFO order, full/empty, wrap-around, exactly-once
// delivery across threads and processes, back-pressure, futex wake-ups and timeouts.
#include <doctest/doctest.h>

#include "fork_helpers.h"

#include <chi/queue/mpsc_ring.h>
#include <chi/queue/spsc_ring.h>
#include <chi/queue/task_queue.h>

#include <poll.h>         // poll on a pidfd: bounded wait for a child
#include <sched.h>        // sched_yield in bounded polls
#include <signal.h>       // SIGKILL for a child that overstays
#include <sys/mman.h>     // MAP_SHARED regions shared with forked children
#include <sys/syscall.h>  // SYS_pidfd_open
#include <sys/wait.h>     // waitpid, WIFEXITED
#include <unistd.h>       // fork, _exit

#include <atomic>   // test-side flags between threads
#include <thread>   // producer and consumer threads
#include <vector>   // bitmaps and bookkeeping

using chi::u32;
using chi::i64;
using chi::u64;

namespace {

constexpr u64 kSecond = 1000000000ull;
constexpr u64 kMillion = 1000000;

using chi_test::ForkChild;
using chi_test::SharedRegion;
using chi_test::WaitChild;


/** Yields until pred() holds or timeout_ns passes; returns pred(). */
template <typename Pred>
bool PollUntil(Pred pred, u64 timeout_ns = 10 * kSecond) {
  u64 deadline = chi::MonotonicNs() + timeout_ns;
  while (!pred()) {
    if (chi::MonotonicNs() > deadline) return pred();
    sched_yield();
  }
  return true;
}

/** An item carrying its producer and that producer's sequence number. */
constexpr u64 MakeItem(u32 producer, u32 seq) { return (static_cast<u64>(producer) << 32) | seq; }

/**
 * Checks a stream of items from `producers` producers of `per_producer` items each:
 * every item exactly once (bitmap) and each producer's items in order.
 */
class DeliveryChecker {
 public:
  DeliveryChecker(u32 producers, u32 per_producer)
      : per_producer_(per_producer), next_(producers, 0), seen_(u64{producers} * per_producer) {}

  /** Records one item; false on a duplicate, a gap/reorder, or a bad producer id. */
  bool Take(u64 item) {
    u32 producer = static_cast<u32>(item >> 32);
    u32 seq = static_cast<u32>(item);
    if (producer >= next_.size() || seq >= per_producer_) return false;
    u64 bit = u64{producer} * per_producer_ + seq;
    if (seen_[bit]) return false;
    seen_[bit] = true;
    if (seq != next_[producer]) return false;
    ++next_[producer];
    return true;
  }

  /** True once every item of every producer was taken. */
  bool Complete() const {
    for (u32 n : next_) {
      if (n != per_producer_) return false;
    }
    for (bool b : seen_) {
      if (!b) return false;
    }
    return true;
  }

 private:
  u32 per_producer_;
  std::vector<u32> next_;
  std::vector<bool> seen_;
};

/** Pops `total` items (each within 10 s) into the checker; false on timeout or bad item. */
template <typename Ring>
bool ConsumeAll(Ring *ring, DeliveryChecker *checker, u64 total) {
  for (u64 i = 0; i < total; ++i) {
    u64 item = 0;
    if (!ring->Pop(item, 10 * kSecond)) return false;
    if (!checker->Take(item)) return false;
  }
  return true;
}

/** Pushes items 0..count-1 of `producer`, each within 10 s; false on a timeout. */
template <typename Ring>
bool PushAll(Ring *ring, u32 producer, u32 count) {
  for (u32 i = 0; i < count; ++i) {
    if (!ring->Push(MakeItem(producer, i), 10 * kSecond)) return false;
  }
  return true;
}

/** Builds a ring in the region; fails the test when Create refuses. */
template <typename Ring>
Ring *MakeRing(SharedRegion &region, u32 capacity) {
  Ring *ring = Ring::Create(region.get(), capacity);
  REQUIRE(ring != nullptr);
  return ring;
}

}  // namespace

TEST_CASE_TEMPLATE("a ring is FIFO, reports full and empty, and wraps around", Ring,
                   chi::SpscRing<u64>, chi::MpscRing<u64>) {
  SharedRegion region(Ring::BytesFor(8));
  Ring *ring = MakeRing<Ring>(region, 8);
  CHECK(ring->Capacity() == 8);
  CHECK(ring->Empty());
  u64 out = 0;
  CHECK_FALSE(ring->TryPop(out));

  // Many laps of partial fills exercise every slot at many different positions.
  u64 next_push = 0, next_pop = 0;
  for (u32 round = 0; round < 100; ++round) {
    u32 fill = 1 + round % 8;
    for (u32 i = 0; i < fill; ++i) REQUIRE(ring->TryPush(next_push++));
    CHECK(ring->Size() == fill);
    u32 drain = 1 + (round * 3) % fill;
    for (u32 i = 0; i < drain; ++i) {
      REQUIRE(ring->TryPop(out));
      CHECK(out == next_pop++);
    }
    while (ring->TryPop(out)) CHECK(out == next_pop++);
    CHECK(ring->Empty());
  }
  CHECK(next_pop == next_push);

  for (u64 i = 0; i < 8; ++i) REQUIRE(ring->TryPush(100 + i));
  CHECK(ring->Size() == 8);
  CHECK_FALSE(ring->TryPush(999));
  CHECK(ring->Size() == 8);
  for (u64 i = 0; i < 8; ++i) {
    REQUIRE(ring->TryPop(out));
    CHECK(out == 100 + i);
  }
  CHECK_FALSE(ring->TryPop(out));
}

TEST_CASE_TEMPLATE("ring capacity rounds up to a power of two and misaligned memory is refused",
                   Ring, chi::SpscRing<u64>, chi::MpscRing<u64>) {
  CHECK(Ring::BytesFor(5) == Ring::BytesFor(8));
  CHECK(Ring::BytesFor(9) > Ring::BytesFor(8));
  CHECK(Ring::BytesFor(16) - Ring::BytesFor(8) >= 8 * sizeof(u64));
  SharedRegion region(Ring::BytesFor(1000) + 64);
  Ring *ring = Ring::Create(region.get(), 1000);
  REQUIRE(ring != nullptr);
  CHECK(ring->Capacity() == 1024);
  for (u64 i = 0; i < 1024; ++i) REQUIRE(ring->TryPush(i));
  CHECK_FALSE(ring->TryPush(0));
  CHECK(Ring::Create(static_cast<char *>(region.get()) + 8, 4) == nullptr);
  CHECK(Ring::Create(nullptr, 4) == nullptr);
  CHECK(Ring::Create(region.get(), 0)->Capacity() == 1);
}

TEST_CASE("RoundUpPow2 gives the smallest power of two at or above n, capped at 2^31") {
  static_assert(chi::RoundUpPow2(0) == 1 && chi::RoundUpPow2(3) == 4 &&
                chi::RoundUpPow2(1u << 20) == (1u << 20));
  // Against the plain doubling loop, every n up to 2^20 and around each higher power.
  auto reference = [](u64 n) {
    u64 p = 1;
    while (p < n) p <<= 1;
    return p > chi::kMaxRingCapacity ? u64{chi::kMaxRingCapacity} : p;
  };
  u64 wrong = 0;
  for (u32 n = 0; n <= (1u << 20); ++n) wrong += chi::RoundUpPow2(n) != reference(n);
  for (u32 k = 20; k < 32; ++k) {
    for (u32 n : {(1u << k) - 1, 1u << k, (1u << k) + 1}) wrong += chi::RoundUpPow2(n) != reference(n);
  }
  CHECK(wrong == 0);
  CHECK(chi::RoundUpPow2(0xFFFFFFFFu) == chi::kMaxRingCapacity);
}

TEST_CASE("a ring works through two mappings of one region at different addresses") {
  size_t bytes = chi::MpscRing<u64>::BytesFor(64);
  size_t map_bytes = (bytes + 4095) & ~size_t{4095};
  int fd = memfd_create("chi_ring_test", 0);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, static_cast<off_t>(map_bytes)) == 0);
  void *a = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  void *b = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  REQUIRE(a != MAP_FAILED);
  REQUIRE(b != MAP_FAILED);
  REQUIRE(a != b);
  auto *producer_view = chi::MpscRing<u64>::Create(a, 64);
  auto *consumer_view = chi::MpscRing<u64>::Attach(b);
  for (u64 i = 0; i < 200; ++i) {
    REQUIRE(producer_view->TryPush(i * 7));
    u64 out = 0;
    REQUIRE(consumer_view->TryPop(out));
    CHECK(out == i * 7);
  }
  CHECK(consumer_view->Capacity() == 64);
  CHECK(producer_view->Empty());
  munmap(a, map_bytes);
  munmap(b, map_bytes);
}

TEST_CASE("SpscRing delivers 10^6 items between two threads exactly once and in order") {
  SharedRegion region(chi::SpscRing<u64>::BytesFor(1024));
  auto *ring = MakeRing<chi::SpscRing<u64>>(region, 1024);
  std::atomic<bool> pushed_all{false};
  std::thread producer([ring, &pushed_all] { pushed_all = PushAll(ring, 0, kMillion); });
  DeliveryChecker checker(1, kMillion);
  bool ok = ConsumeAll(ring, &checker, kMillion);
  producer.join();
  CHECK(pushed_all);
  CHECK(ok);
  CHECK(checker.Complete());
  CHECK(ring->Empty());
}

TEST_CASE("MpscRing delivers 10^6 items from 4 producer threads exactly once, in producer order") {
  constexpr u32 kProducers = 4;
  constexpr u32 kEach = kMillion / kProducers;
  SharedRegion region(chi::MpscRing<u64>::BytesFor(1024));
  auto *ring = MakeRing<chi::MpscRing<u64>>(region, 1024);
  std::atomic<u32> producers_done{0};
  std::vector<std::thread> producers;
  for (u32 p = 0; p < kProducers; ++p) {
    producers.emplace_back([ring, p, &producers_done] {
      if (PushAll(ring, p, kEach)) ++producers_done;
    });
  }
  DeliveryChecker checker(kProducers, kEach);
  bool ok = ConsumeAll(ring, &checker, u64{kProducers} * kEach);
  for (auto &t : producers) t.join();
  CHECK(producers_done == kProducers);
  CHECK(ok);
  CHECK(checker.Complete());
  u64 extra = 0;
  CHECK_FALSE(ring->TryPop(extra));
}

TEST_CASE("MpscRing with shared pops gives each of 4 producers' items to one of 3 consumers, "
          "each consumer seeing a producer's items in order") {
  constexpr u32 kProducers = 4;
  constexpr u32 kConsumers = 3;
  constexpr u32 kEach = kMillion / kProducers;
  SharedRegion region(chi::MpscRing<u64>::BytesFor(64));  // small: many laps, many races
  auto *ring = MakeRing<chi::MpscRing<u64>>(region, 64);
  std::atomic<u64> popped{0};
  std::vector<std::vector<u64>> got(kConsumers);
  std::vector<std::thread> threads;
  for (u32 c = 0; c < kConsumers; ++c) {
    threads.emplace_back([ring, &popped, &got, c] {
      const u64 deadline = chi::MonotonicNs() + 60 * kSecond;
      u64 item = 0;
      while (popped.load() < u64{kProducers} * kEach && chi::MonotonicNs() < deadline) {
        if (ring->TryPopShared(item)) {
          got[c].push_back(item);
          popped.fetch_add(1);
        }
      }
    });
  }
  std::vector<std::thread> producers;
  std::atomic<u32> pushed_all{0};
  for (u32 p = 0; p < kProducers; ++p) {
    producers.emplace_back([ring, p, &pushed_all] {
      if (PushAll(ring, p, kEach)) pushed_all.fetch_add(1);
    });
  }
  for (auto &t : producers) t.join();
  for (auto &t : threads) t.join();
  CHECK(pushed_all.load() == kProducers);
  std::vector<bool> seen(u64{kProducers} * kEach);
  u64 duplicates = 0, out_of_order = 0, total = 0;
  for (const std::vector<u64> &items : got) {
    std::vector<i64> last(kProducers, -1);
    for (u64 item : items) {
      const u32 producer = static_cast<u32>(item >> 32);
      const u32 seq = static_cast<u32>(item);
      REQUIRE(producer < kProducers);
      REQUIRE(seq < kEach);
      const u64 bit = u64{producer} * kEach + seq;
      duplicates += seen[bit] ? 1 : 0;
      seen[bit] = true;
      out_of_order += static_cast<i64>(seq) <= last[producer] ? 1 : 0;
      last[producer] = seq;
      ++total;
    }
  }
  CHECK(duplicates == 0);
  CHECK(out_of_order == 0);
  CHECK(total == u64{kProducers} * kEach);
  for (const std::vector<u64> &items : got) CHECK(!items.empty());  // all three took part
  u64 extra = 0;
  CHECK_FALSE(ring->TryPopShared(extra));
}

TEST_CASE("SpscRing delivers 10^6 items from a producer process exactly once and in order") {
  SharedRegion region(chi::SpscRing<u64>::BytesFor(1024));
  auto *ring = MakeRing<chi::SpscRing<u64>>(region, 1024);
  pid_t child = ForkChild([ring] { return PushAll(ring, 0, kMillion); });
  DeliveryChecker checker(1, kMillion);
  bool ok = ConsumeAll(ring, &checker, kMillion);
  if (!ok) kill(child, SIGKILL);
  CHECK(WaitChild(child));
  CHECK(ok);
  CHECK(checker.Complete());
}

TEST_CASE("MpscRing delivers 10^6 items from 4 producer processes exactly once, in order") {
  constexpr u32 kProducers = 4;
  constexpr u32 kEach = kMillion / kProducers;
  SharedRegion region(chi::MpscRing<u64>::BytesFor(1024));
  auto *ring = MakeRing<chi::MpscRing<u64>>(region, 1024);
  std::vector<pid_t> children;
  for (u32 p = 0; p < kProducers; ++p) {
    children.push_back(ForkChild([ring, p] { return PushAll(ring, p, kEach); }));
  }
  DeliveryChecker checker(kProducers, kEach);
  bool ok = ConsumeAll(ring, &checker, u64{kProducers} * kEach);
  if (!ok) {
    for (pid_t c : children) kill(c, SIGKILL);
  }
  for (pid_t c : children) CHECK(WaitChild(c));
  CHECK(ok);
  CHECK(checker.Complete());
}

TEST_CASE_TEMPLATE("a full ring blocks the producer and loses nothing (capacity 8, slow consumer)",
                   Ring, chi::SpscRing<u64>, chi::MpscRing<u64>) {
  constexpr u32 kItems = 100000;
  SharedRegion region(Ring::BytesFor(8));
  Ring *ring = MakeRing<Ring>(region, 8);
  std::atomic<bool> pushed_all{false};
  std::thread producer([ring, &pushed_all] { pushed_all = PushAll(ring, 0, kItems); });
  // The consumer only drains a full ring, so every refill ends with the producer blocked.
  DeliveryChecker checker(1, kItems);
  bool ok = true;
  u32 received = 0;
  while (ok && received < kItems) {
    if (received + 8 <= kItems) ok = PollUntil([ring] { return ring->Size() == 8; });
    u64 item = 0;
    while (ok && received < kItems && ring->TryPop(item)) {
      ok = checker.Take(item);
      ++received;
    }
  }
  producer.join();
  CHECK(pushed_all);
  CHECK(ok);
  CHECK(checker.Complete());
  CHECK(ring->ProducerStalls() > 0);
}

TEST_CASE_TEMPLATE("a producer parked on a full ring is woken by a pop", Ring,
                   chi::SpscRing<u64>, chi::MpscRing<u64>) {
  SharedRegion region(Ring::BytesFor(2));
  Ring *ring = MakeRing<Ring>(region, 2);
  REQUIRE(ring->TryPush(1));
  REQUIRE(ring->TryPush(2));
  std::atomic<bool> pushed{false};
  std::thread producer([&] {
    pushed.store(ring->Push(3, 20 * kSecond));
  });
  CHECK(PollUntil([ring] { return ring->ProducerParks() > 0; }));
  CHECK_FALSE(pushed.load());
  u64 out = 0;
  REQUIRE(ring->TryPop(out));
  CHECK(out == 1);
  CHECK(PollUntil([&] { return pushed.load(); }));
  producer.join();
  REQUIRE(ring->TryPop(out));
  CHECK(out == 2);
  REQUIRE(ring->TryPop(out));
  CHECK(out == 3);
}

TEST_CASE_TEMPLATE("a consumer parked on an empty ring is woken by a push", Ring,
                   chi::SpscRing<u64>, chi::MpscRing<u64>) {
  SharedRegion region(Ring::BytesFor(4));
  Ring *ring = MakeRing<Ring>(region, 4);
  std::atomic<u64> got{0};
  std::thread consumer([&] {
    u64 out = 0;
    if (ring->Pop(out, 20 * kSecond)) got.store(out);
  });
  CHECK(PollUntil([ring] { return ring->ConsumerParks() > 0; }));
  CHECK(got.load() == 0);
  ring->Push(42);
  // Well before the consumer's own timeout, which would also hand it the value.
  CHECK(PollUntil([&] { return got.load() == 42; }, 5 * kSecond));
  consumer.join();
}

TEST_CASE("a consumer parked in another process is woken by a push from this one") {
  SharedRegion region(chi::MpscRing<u64>::BytesFor(4));
  auto *ring = MakeRing<chi::MpscRing<u64>>(region, 4);
  pid_t child = ForkChild([ring] {
    u64 out = 0;
    return ring->Pop(out, 20 * kSecond) && out == 77;
  });
  CHECK(PollUntil([ring] { return ring->ConsumerParks() > 0; }));
  ring->Push(77);
  // Well before the child's own timeout, which would also hand it the value.
  CHECK(WaitChild(child, 5000));
}

TEST_CASE_TEMPLATE("Pop times out on an empty ring and Push with a timeout on a full one", Ring,
                   chi::SpscRing<u64>, chi::MpscRing<u64>) {
  SharedRegion region(Ring::BytesFor(2));
  Ring *ring = MakeRing<Ring>(region, 2);
  u64 out = 5;
  u64 start = chi::MonotonicNs();
  CHECK_FALSE(ring->Pop(out, 2000000));
  CHECK(chi::MonotonicNs() - start >= 2000000);
  CHECK(out == 5);
  CHECK(ring->Push(1, 2000000));
  CHECK(ring->Push(2, 2000000));
  start = chi::MonotonicNs();
  CHECK_FALSE(ring->Push(3, 2000000));
  CHECK(chi::MonotonicNs() - start >= 2000000);
  CHECK(ring->Pop(out, 2000000));
  CHECK(out == 1);
  CHECK(ring->Pop(out, 2000000));
  CHECK(out == 2);
  CHECK(ring->Empty());
}

TEST_CASE("TaskQueue lanes and priorities are independent rings") {
  constexpr u32 kLanes = 3;
  SharedRegion region(chi::TaskQueue::BytesFor(kLanes, 6));
  chi::TaskQueue *queue = chi::TaskQueue::Create(region.get(), kLanes, 6);
  REQUIRE(queue != nullptr);
  CHECK(queue->NumLanes() == kLanes);
  CHECK(queue->Depth() == 8);
  using chi::QueuePriority;
  const QueuePriority prios[] = {QueuePriority::kLowLatency, QueuePriority::kHighLatency};
  // Fill each (lane, priority) with its own values, a different count per lane.
  for (u32 lane = 0; lane < kLanes; ++lane) {
    for (QueuePriority prio : prios) {
      chi::TaskLane &l = queue->GetLane(lane, prio);
      CHECK(l.LaneId() == lane);
      CHECK(l.Priority() == prio);
      CHECK(l.Capacity() == 8);
      for (u32 i = 0; i < lane + 1; ++i) {
        REQUIRE(l.TryPush(MakeItem(lane * 2 + static_cast<u32>(prio), i)));
      }
    }
  }
  // Filling one lane to the brim leaves its neighbours untouched.
  chi::TaskLane &full = queue->GetLane(1, QueuePriority::kHighLatency);
  while (full.TryPush(MakeItem(3, full.Size()))) {
  }
  CHECK(full.Size() == 8);
  CHECK(queue->GetLane(1, QueuePriority::kLowLatency).Size() == 2);
  CHECK(queue->GetLane(2, QueuePriority::kLowLatency).Size() == 3);
  for (u32 lane = 0; lane < kLanes; ++lane) {
    for (QueuePriority prio : prios) {
      chi::TaskLane &l = queue->GetLane(lane, prio);
      u32 id = lane * 2 + static_cast<u32>(prio);
      u32 expect = (lane == 1 && prio == QueuePriority::kHighLatency) ? 8 : lane + 1;
      for (u32 i = 0; i < expect; ++i) {
        u64 entry = 0;
        REQUIRE(l.TryPop(entry));
        CHECK(entry == MakeItem(id, i));
      }
      CHECK(l.Empty());
    }
  }
}

TEST_CASE("TaskLane tags are per lane and visible through another mapping of the queue") {
  SharedRegion region(chi::TaskQueue::BytesFor(4, 16));
  chi::TaskQueue *queue = chi::TaskQueue::Create(region.get(), 4, 16);
  REQUIRE(queue != nullptr);
  using chi::QueuePriority;
  CHECK(queue->GetLane(2, QueuePriority::kLowLatency).GetTag() == 0);
  for (u32 lane = 0; lane < 4; ++lane) {
    queue->GetLane(lane, QueuePriority::kLowLatency).SetTag(100 + lane);
    queue->GetLane(lane, QueuePriority::kHighLatency).SetTag(200 + lane);
  }
  pid_t child = ForkChild([mem = region.get()] {
    chi::TaskQueue *q = chi::TaskQueue::Attach(mem);
    bool ok = q->NumLanes() == 4 && q->Depth() == 16;
    for (u32 lane = 0; lane < 4; ++lane) {
      ok = ok && q->GetLane(lane, QueuePriority::kLowLatency).GetTag() == 100 + lane;
      ok = ok && q->GetLane(lane, QueuePriority::kHighLatency).GetTag() == 200 + lane;
    }
    q->GetLane(3, QueuePriority::kHighLatency).Push(MakeItem(9, 9));
    return ok;
  });
  CHECK(WaitChild(child));
  u64 entry = 0;
  CHECK(queue->GetLane(3, QueuePriority::kHighLatency).TryPop(entry));  // the child has exited
  CHECK(entry == MakeItem(9, 9));
  CHECK(queue->GetLane(3, QueuePriority::kLowLatency).Empty());
}
