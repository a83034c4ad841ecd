// Lane help (lane_help.h): an idle worker takes the tasks queued behind a peer stuck in a
// long task, also when it had parked deep; the policy waits kLaneStuckNs of a standing
// head before taking; under load with several stuck workers, every task still runs once.
#include <doctest/doctest.h>

#include <chi/chi.h>

#include "embedded_fixture.h"  // StartWithPool, NewLocalTask
#include "fork_helpers.h"      // SharedRegion: an aligned region for the lanes

#include <unistd.h>  // usleep between submissions

#include <atomic>   // the hog's start flag and run counts, shared with the runtime's workers
#include <memory>   // unique_ptr of the run counts
#include <vector>   // futures

using chi::u32;
using chi::u64;

namespace {

constexpr u64 kMs = 1000000ull;

/** Spins its worker without yielding for spin_ns (a task that should be TASK_HIGH_LATENCY). */
struct SpinTask : public chi::Task {
  CHI_IN u64 spin_ns_ = 0;
  CHI_OUT u32 worker_ = 0;  ///< the worker it ran on
  CHI_OUT u64 end_ns_ = 0;  ///< when it let go (MonotonicNs)
  CHI_OUT u32 sub_worker_ = ~0u;  ///< SpawnSpin: where its subtask ran
  CHI_OUT u64 sub_wait_ns_ = 0;   ///< SpawnSpin: how long it spun until its subtask was done

  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(spin_ns_);
  }
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(worker_, end_ns_, sub_worker_, sub_wait_ns_);
  }
};

/** Set by a spin task once it runs (this test's runtime is embedded: same process). */
std::atomic<u32> g_spinning{0};
/** How often each index of a Count task ran. */
std::unique_ptr<std::atomic<u32>[]> g_runs;

/** Sends method m of the probe with argument `arg` (defined below; SpawnSpin uses it). */
chi::Future<SpinTask> Send(chi::MethodId m, u64 arg);

/**
 * The module under test: Spin hogs its worker; Count records that index `i` ran;
 * SpawnSpin submits a Count (which stays on its worker) and spins until it is done.
 */
class HelpProbe : public chi::ModuleRuntime<HelpProbe> {
 public:
  static constexpr chi::MethodId kSpin = 10;
  static constexpr chi::MethodId kCount = 11;
  static constexpr chi::MethodId kSpawnSpin = 12;
  /** A pool of the probe needs nothing set up. */
  void Create(chimaera::admin::CreatePoolTask &, chi::RunContext &) {}
  /** Spins for the time asked, never yielding its worker. */
  void Spin(SpinTask &t, chi::RunContext &rc) {
    t.worker_ = rc.GetWorker()->GetId();
    g_spinning.fetch_add(1);
    const u64 end = chi::MonotonicNs() + t.spin_ns_;
    while (chi::MonotonicNs() < end) chi::CpuRelax();
    t.end_ns_ = chi::MonotonicNs();
  }
  /** Counts one run of index spin_ns_ (reused as the index), and where and when it ran. */
  void Count(SpinTask &t, chi::RunContext &rc) {
    g_runs[t.spin_ns_].fetch_add(1);
    t.worker_ = rc.GetWorker()->GetId();
    t.end_ns_ = chi::MonotonicNs();
  }
  /**
   * Submits Count of index 0 (a subtask: it queues on this worker's own lane, waking
   * nobody) and spins without yielding until it is done, for spin_ns_ at most; then waits
   * for it in the usual way.
   */
  void SpawnSpin(SpinTask &t, chi::RunContext &rc) {
    t.worker_ = rc.GetWorker()->GetId();
    const u64 start = chi::MonotonicNs();
    auto sub = Send(kCount, 0);
    while (!sub.IsComplete() && chi::MonotonicNs() - start < t.spin_ns_) chi::CpuRelax();
    t.sub_wait_ns_ = chi::MonotonicNs() - start;
    if (sub.Wait() && sub->GetReturnCode() == 0) t.sub_worker_ = sub->worker_;
    t.end_ns_ = chi::MonotonicNs();
  }
  using Methods = chi::MethodList<
      chi::Method<0, chimaera::admin::CreatePoolTask, &HelpProbe::Create, "Create">,
      chi::Method<kSpin, SpinTask, &HelpProbe::Spin, "Spin">,
      chi::Method<kCount, SpinTask, &HelpProbe::Count, "Count">,
      chi::Method<kSpawnSpin, SpinTask, &HelpProbe::SpawnSpin, "SpawnSpin">>;
};
const bool kHelpProbeRegistered = chi::ModuleManager::Register<HelpProbe>("help_probe");
constexpr chi::PoolId kPool(350, 0);

/** Sends method m of the probe with argument `arg` to the embedded runtime. */
chi::Future<SpinTask> Send(chi::MethodId m, u64 arg) {
  auto *t = chi_test::NewLocalTask<SpinTask>(kPool, m);
  t->spin_ns_ = arg;
  return chi::GetIpcManager().Send(t);
}

/** Starts the embedded runtime once, with three low-latency workers, and the probe pool. */
void StartRuntime() {
  chi_test::StartWithPool("workers:\n  low_latency: 3\n  high_latency: 1\n", "help_probe", kPool);
}

/** Tasks the low-latency workers took from their peers' lanes so far. */
u64 Helped() {
  u64 n = 0;
  for (const chi::WorkerStats &s : chi::Chimaera::Get().Orchestrator()->Stats()) n += s.helped_;
  return n;
}

/** A queue of 4 lanes (3 peers' and one to spare) of depth 16, in a region of its own. */
struct Lanes {
  chi_test::SharedRegion region{chi::TaskQueue::BytesFor(4, 16)};
  chi::TaskQueue *queue = chi::TaskQueue::Create(region.get(), 4, 16);
  chi::TaskLane *Lane(u32 i) { return &queue->GetLane(i, chi::QueuePriority::kLowLatency); }
};

}  // namespace

TEST_CASE("a lane's tasks are taken only once its head stood still kLaneStuckNs with tasks queued") {
  Lanes q;
  REQUIRE(q.queue != nullptr);
  chi::LaneHelpView view({{q.Lane(0), nullptr}, {q.Lane(1), nullptr}}, 2);
  REQUIRE(view.Size() == 2);
  const u64 t0 = 1000 * kMs;
  CHECK(view.NextDueNs() == ~0ull);                               // no wait runs
  CHECK_FALSE(view.Stuck(0, 0, false, t0));                       // empty: nothing to take
  CHECK_FALSE(view.Stuck(0, 0, true, t0));                        // first sight: the wait starts
  CHECK(view.NextDueNs() == t0 + chi::kLaneStuckNs);              // a watcher looks again then
  CHECK_FALSE(view.Stuck(0, 0, true, t0 + chi::kLaneStuckNs - 1));
  CHECK(view.Stuck(0, 0, true, t0 + chi::kLaneStuckNs));          // the same head, long enough
  CHECK_FALSE(view.Stuck(1, 0, true, t0 + chi::kLaneStuckNs));    // lanes are watched apart
  // The owner popped (the head moved): a new wait, from that look on.
  CHECK_FALSE(view.Stuck(0, 3, true, t0 + 2 * chi::kLaneStuckNs));
  CHECK_FALSE(view.Stuck(0, 3, true, t0 + 3 * chi::kLaneStuckNs - 1));
  CHECK(view.Stuck(0, 3, true, t0 + 3 * chi::kLaneStuckNs));
  // Emptied in between: the wait starts again even at the same head.
  CHECK_FALSE(view.Stuck(0, 3, false, t0 + 4 * chi::kLaneStuckNs));
  CHECK(view.NextDueNs() == t0 + 2 * chi::kLaneStuckNs);  // lane 1's, from its first sight
  CHECK_FALSE(view.Stuck(1, 0, false, t0 + 4 * chi::kLaneStuckNs));
  CHECK(view.NextDueNs() == ~0ull);
  CHECK_FALSE(view.Stuck(0, 3, true, t0 + 4 * chi::kLaneStuckNs + 1));
  // After this worker took some, the owner is still stuck: the next look takes more at once,
  // unless the owner (or another helper) moved the head meanwhile.
  CHECK(view.Stuck(0, 3, true, t0 + 5 * chi::kLaneStuckNs + 1));
  view.Took(0, 35);
  CHECK(view.Stuck(0, 35, true, t0 + 5 * chi::kLaneStuckNs + 2));
  CHECK_FALSE(view.Stuck(0, 36, true, t0 + 5 * chi::kLaneStuckNs + 3));
  CHECK(view.HasRolePeers());
  // Only poller workers' lanes (a lone low-latency worker): they wake it, no timed deep park.
  CHECK_FALSE(chi::LaneHelpView({{q.Lane(3), nullptr}}, 0).HasRolePeers());
}

TEST_CASE("PeersQueued sees a task ready in any peer lane and a lane's head counts its pops") {
  Lanes q;
  REQUIRE(q.queue != nullptr);
  chi::LaneHelpView view({{q.Lane(1), nullptr}, {q.Lane(2), nullptr}}, 1);
  CHECK(view.HasRolePeers());
  CHECK_FALSE(view.PeersQueued());
  REQUIRE(q.Lane(0)->TryPush(7));  // not a peer's lane
  CHECK_FALSE(view.PeersQueued());
  REQUIRE(q.Lane(2)->TryPush(8));
  CHECK(view.PeersQueued());
  CHECK(q.Lane(2)->Head() == 0);
  u64 e = 0;
  REQUIRE(q.Lane(2)->TryPop(e));
  CHECK(e == 8);
  CHECK(q.Lane(2)->Head() == 1);
  CHECK_FALSE(view.PeersQueued());
}

TEST_CASE("an overflow list feeds a lane in push order, only what the lane has room for") {
  Lanes q;
  REQUIRE(q.queue != nullptr);
  chi::TaskLane *lane = q.Lane(3);
  chi::TaskOverflow overflow;
  auto task = [](u64 i) { return reinterpret_cast<chi::Task *>(i * 64); };  // never touched
  CHECK(overflow.Empty());
  for (u64 i = 1; i <= 16; ++i) REQUIRE(lane->TryPush(i * 64));  // the lane is full
  for (u64 i = 17; i <= 40; ++i) overflow.Push(task(i), lane);
  CHECK_FALSE(overflow.Empty());
  CHECK(lane->Size() == 16);
  CHECK_FALSE(overflow.FeedInto(lane));  // no room: nothing moves
  // A helper takes 5: a feed moves the next 5 in order, the rest wait.
  u64 e = 0;
  for (u64 i = 1; i <= 5; ++i) {
    REQUIRE(lane->TryPop(e));
    CHECK(e == i * 64);
  }
  CHECK(overflow.FeedInto(lane));
  CHECK(lane->Size() == 16);
  // A push finds room only behind what already waits (order kept), and moves that too.
  for (u64 i = 6; i <= 9; ++i) REQUIRE(lane->TryPop(e));
  overflow.Push(task(41), lane);
  CHECK(lane->Size() == 16);
  u64 next = 10;
  while (!overflow.Empty() || !lane->Empty()) {
    if (!lane->TryPop(e)) break;
    CHECK(e == next * 64);
    ++next;
    overflow.FeedInto(lane);
  }
  CHECK(next == 42);  // every task once, in push order
  CHECK(overflow.Pop() == nullptr);
  overflow.Push(task(50), nullptr);  // no lane (a poller's worker): it waits for Pop
  CHECK(overflow.Pop() == task(50));
  CHECK(overflow.Empty());
}

TEST_CASE("tasks queued behind a worker stuck in a long task are run by a peer that parked deep") {
  StartRuntime();
  const u64 helped_before = Helped();
  usleep(200 * 1000);  // every worker idles past its spin and parks with nothing to watch
  g_spinning = 0;
  constexpr u64 kSpinNs = 2000 * kMs;
  auto hog = Send(HelpProbe::kSpin, kSpinNs);
  for (int i = 0; i < 2000 && g_spinning.load() == 0; ++i) usleep(1000);
  REQUIRE(g_spinning.load() == 1);
  // One at a time, with the other workers parked deep again in between: submissions rotate
  // over the three workers, so two of these six queue behind the hog.
  g_runs = std::make_unique<std::atomic<u32>[]>(6);
  std::vector<chi::Future<SpinTask>> quick;
  for (u64 i = 0; i < 6; ++i) {
    usleep(50 * 1000);
    quick.push_back(Send(HelpProbe::kCount, i));
    REQUIRE(quick.back().Wait(10));
    INFO("quick task " << i);
    CHECK(quick.back()->GetReturnCode() == 0);
  }
  const u64 quick_done_ns = chi::MonotonicNs();
  REQUIRE(hog.Wait(30));
  CHECK(hog->GetReturnCode() == 0);
  INFO("the hog ran on worker " << hog->worker_ << " and ended "
       << (static_cast<double>(hog->end_ns_) - static_cast<double>(quick_done_ns)) / kMs
       << " ms after the last quick task");
  CHECK(quick_done_ns < hog->end_ns_);  // none of them waited for the hog
  u32 not_on_hog = 0;
  for (auto &f : quick) not_on_hog += f->worker_ != hog->worker_ ? 1 : 0;
  CHECK(not_on_hog == 6);
  for (u64 i = 0; i < 6; ++i) CHECK(g_runs[i].load() == 1);
  CHECK(Helped() - helped_before >= 2);
}

TEST_CASE("with two workers stuck and 10^4 quick tasks submitted, every task runs exactly once") {
  StartRuntime();
  constexpr u32 kTasks = 10000;
  g_runs = std::make_unique<std::atomic<u32>[]>(kTasks);
  g_spinning = 0;
  const u64 helped_before = Helped();
  auto hog_a = Send(HelpProbe::kSpin, 1000 * kMs);
  auto hog_b = Send(HelpProbe::kSpin, 1000 * kMs);
  for (int i = 0; i < 2000 && g_spinning.load() < 2; ++i) usleep(1000);
  REQUIRE(g_spinning.load() == 2);
  std::vector<chi::Future<SpinTask>> quick;
  quick.reserve(kTasks);
  for (u32 i = 0; i < kTasks; ++i) quick.push_back(Send(HelpProbe::kCount, i));
  u32 answered = 0, before_hogs = 0;
  for (auto &f : quick) answered += f.Wait(30) && f->GetReturnCode() == 0 ? 1 : 0;
  const u64 quick_done_ns = chi::MonotonicNs();
  REQUIRE(hog_a.Wait(30));
  REQUIRE(hog_b.Wait(30));
  CHECK(answered == kTasks);
  u32 once = 0;
  for (u32 i = 0; i < kTasks; ++i) once += g_runs[i].load() == 1 ? 1 : 0;
  CHECK(once == kTasks);
  before_hogs += quick_done_ns < hog_a->end_ns_ && quick_done_ns < hog_b->end_ns_ ? 1 : 0;
  INFO("hogs on workers " << hog_a->worker_ << " and " << hog_b->worker_);
  CHECK(hog_a->worker_ != hog_b->worker_);
  CHECK(before_hogs == 1);  // the third worker ran them all (with its peers' queues)
  CHECK(Helped() - helped_before > 0);
}

TEST_CASE("a subtask queued behind its own parent spinning for it is run by a peer parked deep") {
  StartRuntime();
  g_runs = std::make_unique<std::atomic<u32>[]>(1);
  const u64 helped_before = Helped();
  usleep(200 * 1000);  // every worker idles past its spin and parks with nothing to watch
  constexpr u64 kSpinNs = 2000 * kMs;
  auto parent = Send(HelpProbe::kSpawnSpin, kSpinNs);
  REQUIRE(parent.Wait(30));
  CHECK(parent->GetReturnCode() == 0);
  INFO("the parent ran on worker " << parent->worker_ << ", its subtask on " << parent->sub_worker_
       << " after " << static_cast<double>(parent->sub_wait_ns_) / kMs << " ms");
  // Nothing wakes a peer for a subtask; a deep park ends after kLaneDeepParkNs, the peer
  // then sees the lane's standing head and takes it kLaneStuckNs later.
  CHECK(parent->sub_wait_ns_ < kSpinNs);
  CHECK(parent->sub_worker_ != parent->worker_);
  CHECK(g_runs[0].load() == 1);
  CHECK(Helped() - helped_before >= 1);
}
