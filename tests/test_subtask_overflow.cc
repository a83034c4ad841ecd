// Subtasks beyond a full lane: a task that spawns more subtasks than its worker's lane
// holds keeps them in the worker's overflow list, which feeds the lane as it drains, so
// idle peers can help with all of them (lane_help.h), not only the first queue_depth, even
// while the parent spins for them without yielding; and every subtask still runs exactly
// once, in the order it was spawned on its worker.
#include <doctest/doctest.h>

#include <chi/chi.h>

#include "embedded_fixture.h"  // StartWithPool, NewLocalTask

#include <atomic>  // run counts and order, shared with the runtime's workers
#include <memory>  // unique_ptr of the run counts
#include <vector>  // the parent's subtask futures

using chi::u32;
using chi::u64;

namespace {

constexpr u64 kMs = 1000000ull;
constexpr u32 kQueueDepth = 16;  ///< this test's lanes (config below)

/** A subtask (Work) or a parent spawning `count_` of them (FanOut). */
struct OverflowTask : public chi::Task {
  IN u64 count_ = 0;     ///< FanOut: subtasks to spawn; Work: its index
  IN u64 spin_ns_ = 0;   ///< how long each Work spins without yielding
  OUT u32 worker_ = 0;   ///< the worker it ran on
  OUT u32 answered_ = 0;  ///< FanOut: subtasks that completed without error
  OUT u32 elsewhere_ = 0;  ///< FanOut: subtasks that ran on another worker than the parent

  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(count_, spin_ns_);
  }
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(worker_, answered_, elsewhere_);
  }
};

/** How often each index of a Work task ran (sized by each test case). */
std::unique_ptr<std::atomic<u32>[]> g_runs;
/** Per worker id: the index of the last Work it started (+1; 0: none yet). */
std::atomic<u64> g_last[64];
/** Work tasks a worker started after one spawned later than them. */
std::atomic<u32> g_out_of_order{0};

chi::Future<OverflowTask> Send(chi::MethodId m, u64 count, u64 spin_ns);

/** The module under test: FanOut spawns Work subtasks and waits for them all. */
class OverflowProbe : public chi::ModuleRuntime<OverflowProbe> {
 public:
  static constexpr chi::MethodId kFanOut = 10;
  static constexpr chi::MethodId kWork = 11;
  static constexpr chi::MethodId kSpinFanOut = 12;
  static constexpr u64 kSpinLimitNs = 10000 * kMs;
  /** A pool of the probe needs nothing set up. */
  void Create(chimaera::admin::CreatePoolTask &, chi::RunContext &) {}
  /** Spawns count_ Work subtasks (they queue on this worker), then waits for each. */
  void FanOut(OverflowTask &t, chi::RunContext &rc) {
    t.worker_ = rc.GetWorker()->GetId();
    std::vector<chi::Future<OverflowTask>> subs;
    subs.reserve(t.count_);
    for (u64 i = 0; i < t.count_; ++i) subs.push_back(Send(kWork, i, t.spin_ns_));
    for (auto &s : subs) {
      if (!s.Wait() || s->GetReturnCode() != 0) continue;
      ++t.answered_;
      t.elsewhere_ += s->worker_ != t.worker_ ? 1 : 0;
    }
  }
  /**
   * Spawns count_ Work subtasks, then spins (never yields: its worker never comes back to
   * its loop) until all are done or kSpinLimitNs passed; answered_ counts those done.
   */
  void SpinFanOut(OverflowTask &t, chi::RunContext &rc) {
    t.worker_ = rc.GetWorker()->GetId();
    std::vector<chi::Future<OverflowTask>> subs;
    subs.reserve(t.count_);
    for (u64 i = 0; i < t.count_; ++i) subs.push_back(Send(kWork, i, t.spin_ns_));
    const u64 limit = chi::MonotonicNs() + kSpinLimitNs;
    u32 done = 0;
    while (done < t.count_ && chi::MonotonicNs() < limit) {
      done = 0;
      for (auto &s : subs) done += s.IsComplete() ? 1 : 0;
      chi::CpuRelax();
    }
    t.answered_ = done;
  }
  /** Records that index count_ ran, and where; spins spin_ns_ without yielding. */
  void Work(OverflowTask &t, chi::RunContext &rc) {
    g_runs[t.count_].fetch_add(1);
    t.worker_ = rc.GetWorker()->GetId();
    if (g_last[t.worker_ % 64].exchange(t.count_ + 1) > t.count_ + 1) g_out_of_order.fetch_add(1);
    const u64 end = chi::MonotonicNs() + t.spin_ns_;
    while (chi::MonotonicNs() < end) chi::CpuRelax();
  }
  using Methods = chi::MethodList<
      chi::Method<0, chimaera::admin::CreatePoolTask, &OverflowProbe::Create, "Create">,
      chi::Method<kFanOut, OverflowTask, &OverflowProbe::FanOut, "FanOut">,
      chi::Method<kWork, OverflowTask, &OverflowProbe::Work, "Work">,
      chi::Method<kSpinFanOut, OverflowTask, &OverflowProbe::SpinFanOut, "SpinFanOut">>;
};
const bool kRegistered = chi::ModuleManager::Register<OverflowProbe>("overflow_probe");
constexpr chi::PoolId kPool(351, 0);

/** Sends method m of the probe to the embedded runtime. */
chi::Future<OverflowTask> Send(chi::MethodId m, u64 count, u64 spin_ns) {
  auto *t = chi_test::NewLocalTask<OverflowTask>(kPool, m);
  t->count_ = count;
  t->spin_ns_ = spin_ns;
  return chi::GetIpcManager().Send(t);
}

/** Starts the embedded runtime once: two low-latency workers with lanes of kQueueDepth. */
void StartRuntime() {
  chi_test::StartWithPool("queue_depth: 16\nworkers:\n  low_latency: 2\n  high_latency: 1\n",
                          "overflow_probe", kPool);
}

}  // namespace

TEST_CASE("subtasks beyond a full lane are helped by an idle peer, and each runs once") {
  StartRuntime();
  constexpr u32 kSubtasks = 6 * kQueueDepth;
  g_runs = std::make_unique<std::atomic<u32>[]>(kSubtasks);
  for (auto &last : g_last) last = 0;
  // Each subtask holds its worker 1 ms: the parent's worker, running them one by one,
  // leaves its lane's head standing long enough for the idle peer to take what waits.
  auto parent = Send(OverflowProbe::kFanOut, kSubtasks, 1 * kMs);
  REQUIRE(parent.Wait(60));
  CHECK(parent->GetReturnCode() == 0);
  CHECK(parent->answered_ == kSubtasks);
  u32 once = 0;
  for (u32 i = 0; i < kSubtasks; ++i) once += g_runs[i].load() == 1 ? 1 : 0;
  CHECK(once == kSubtasks);
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
  g_runs = std::make_unique<std::atomic<u32>[]>(kSubtasks);
  for (auto &last : g_last) last = 0;
  g_out_of_order = 0;
  // The parent's worker never returns to its loop while the parent spins, so it never feeds
  // its lane from its overflow: only the helping peer can, after each take.
  auto parent = Send(OverflowProbe::kSpinFanOut, kSubtasks, kMs / 10);
  REQUIRE(parent.Wait(60));
  CHECK(parent->GetReturnCode() == 0);
  INFO("the parent ran on worker " << parent->worker_);
  CHECK(parent->answered_ == kSubtasks);  // before the peer fed the lane: one lane's worth
  u32 once = 0;
  for (u32 i = 0; i < kSubtasks; ++i) once += g_runs[i].load() == 1 ? 1 : 0;
  CHECK(once == kSubtasks);
  CHECK(g_out_of_order.load() == 0);
}
