// A poller worker (network, GPU) runs the tasks its poller takes in, and their subtasks stay
// on it, in a lane of its own: while such a parent spins without yielding, a low-latency
// worker takes them (lane_help.h), woken by the poller's queueing even with no peer of its
// own role (so no timed park) to bring it; each subtask runs once, in spawn order.
#include <doctest/doctest.h>

#include "overflow_probe.h"  // the OverflowProbe module, its pool and run records

#include <unistd.h>  // usleep until the low-latency worker sleeps

using namespace overflow_probe;

namespace {

/** Starts the embedded runtime once: one low-latency worker with lanes of kQueueDepth. */
void StartRuntime() {
  chi_test::StartWithPool("queue_depth: 16\nworkers:\n  low_latency: 1\n  high_latency: 1\n",
                          "overflow_probe", kPool);
}

/** A transport's stand-in: adopts one task on its poller worker's first pass. */
class AdoptOnce : public chi::WorkerPoller {
 public:
  AdoptOnce(chi::Worker *w, chi::Task *t) : worker_(w), task_(t) {}
  void BeginPolling(u32) override {}
  bool Poll() override {
    chi::Task *t = task_.exchange(nullptr);
    if (t == nullptr) return false;
    worker_->Adopt(t, chi::Chimaera::Get().Pools()->Acquire(t->pool_id_));
    return true;
  }
  bool EndPolling(u32) override { return task_.load() != nullptr; }

 private:
  chi::Worker *worker_;
  std::atomic<chi::Task *> task_;
};

}  // namespace

TEST_CASE("a poller worker's parent spinning for its subtasks has them run by a lane worker") {
  StartRuntime();
  constexpr u32 kSubtasks = 3 * kQueueDepth;
  ResetRuns(kSubtasks);
  // A network or GPU worker runs what its poller takes in, and its tasks' subtasks stay
  // on it; while such a parent spins, only the low-latency worker can run them. It has no
  // peer of its own role, so it parks deep with no timeout: the poller's queueing wakes it.
  std::unique_ptr<chi::Worker> poller =
      chi::Chimaera::Get().Orchestrator()->NewPollerWorker(chi::WorkerRole::kNetwork);
  auto *t = chi_test::NewLocalTask<OverflowTask>(kPool, OverflowProbe::kSpinFanOut);
  t->count_ = kSubtasks;
  t->spin_ns_ = kMs / 10;
  chi::Future<OverflowTask> parent(t);
  AdoptOnce adopt(poller.get(), t);
  REQUIRE(poller->ReplacePoller(nullptr, &adopt));
  usleep(50000);  // the low-latency worker, idle since the pool's creation, has parked deep
  poller->Start();
  REQUIRE(parent.Wait(60));
  CHECK(parent->GetReturnCode() == 0);
  CHECK(parent->worker_ == poller->GetId());
  CHECK(parent->answered_ == kSubtasks);  // with no lane, or no wake: 0 of 48 in its 10 s
  CHECK(parent->elsewhere_ == kSubtasks);
  CHECK(RanOnce(kSubtasks) == kSubtasks);
  CHECK(g_out_of_order.load() == 0);
  poller->ReplacePoller(&adopt, nullptr);
  poller->RequestStop();
  poller->Join();
}
