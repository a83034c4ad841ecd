// Subtasks beyond a full lane: a task that spawns more subtasks than its worker's lane
// holds keeps them in the worker's overflow list, which feeds the lane as it drains, so
// idle peers can help with all of them (lane_help.h), not only the first queue_depth, even
// while the parent spins for them without yielding; and every subtask still runs exactly
// once, in the order it was spawned on its worker.
#include <doctest/doctest.h>

#include "overflow_probe.h"  // the OverflowProbe module, its pool and run records

using namespace overflow_probe;

namespace {

/** Starts the embedded runtime once: two low-latency workers with lanes of kQueueDepth. */
void StartRuntime() {
  chi_test::StartWithPool("queue_depth: 16\nworkers:\n  low_latency: 2\n  high_latency: 1\n",
                          "overflow_probe", kPool);
}

}  // namespace

TEST_CASE("subtasks beyond a full lane are helped by an idle peer, and each runs once") {
  StartRuntime();
  constexpr u32 kSubtasks = 6 * kQueueDepth;
  ResetRuns(kSubtasks);
  // Each subtask holds its worker 1 ms: the parent's worker, running them one by one,
  // leaves its lane's head standing long enough for the idle peer to take what waits.
  auto parent = Send(OverflowProbe::kFanOut, kSubtasks, 1 * kMs);
  REQUIRE(parent.Wait(60));
  CHECK(parent->GetReturnCode() == 0);
  CHECK(parent->answered_ == kSubtasks);
  CHECK(RanOnce(kSubtasks) == kSubtasks);
  CHECK(g_out_of_order.load() == 0);  // FIFO per worker: the lane first, then the overflow
  INFO("the parent ran on worker " << parent->worker_ << "; " << parent->elsewhere_ << " of "
       << kSubtasks << " subtasks ran on the other worker");
  // Only a lane is visible to helpers: had the overflow stayed private to the parent's
  // worker, at most one lane's worth could have run elsewhere.
  CHECK(parent->elsewhere_ > kQueueDepth);
}

TEST_CASE("a parent spinning for subtasks beyond its full lane has them all run by its peer") {
  StartRuntime();
  constexpr u32 kSubtasks = 3 * kQueueDepth;
  ResetRuns(kSubtasks);
  // The parent's worker never returns to its loop while the parent spins, so it never feeds
  // its lane from its overflow: only the helping peer can, after each take.
  auto parent = Send(OverflowProbe::kSpinFanOut, kSubtasks, kMs / 10);
  REQUIRE(parent.Wait(60));
  CHECK(parent->GetReturnCode() == 0);
  INFO("the parent ran on worker " << parent->worker_);
  CHECK(parent->answered_ == kSubtasks);  // before the peer fed the lane: one lane's worth
  CHECK(parent->elsewhere_ == kSubtasks);  // its own worker only spun
  CHECK(RanOnce(kSubtasks) == kSubtasks);
  CHECK(g_out_of_order.load() == 0);
}
