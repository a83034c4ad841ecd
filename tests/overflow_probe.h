// A test module for subtasks beyond a full lane (test_subtask_overflow, test_poller_lane):
// FanOut spawns Work subtasks and waits for them, SpinFanOut spawns them and spins; Work
// records that it ran, where, and in what order per worker. Each test binary includes it
// once and starts its own runtime configuration with a pool of it (kPool).
#pragma once

#include <chi/chi.h>

#include "embedded_fixture.h"  // NewLocalTask

#include <atomic>  // run counts and order, shared with the runtime's workers
#include <memory>  // unique_ptr of the run counts
#include <vector>  // the parent's subtask futures

namespace overflow_probe {

using chi::u32;
using chi::u64;

inline constexpr u64 kMs = 1000000ull;
inline constexpr u32 kQueueDepth = 16;  ///< the tests' lanes (their configs say so)

/** A subtask (Work) or a parent spawning `count_` of them (FanOut). */
struct OverflowTask : public chi::Task {
  CHI_IN u64 count_ = 0;     ///< FanOut: subtasks to spawn; Work: its index
  CHI_IN u64 spin_ns_ = 0;   ///< how long each Work spins without yielding
  CHI_OUT u32 worker_ = 0;   ///< the worker it ran on
  CHI_OUT u32 answered_ = 0;  ///< FanOut: subtasks that completed without error
  CHI_OUT u32 elsewhere_ = 0;  ///< FanOut: subtasks that ran on another worker than the parent

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
inline std::unique_ptr<std::atomic<u32>[]> g_runs;
/** Per worker id: the index of the last Work it started (+1; 0: none yet). */
inline std::atomic<u64> g_last[64];
/** Work tasks a worker started after one spawned later than them. */
inline std::atomic<u32> g_out_of_order{0};

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
   * its loop) until all are done or kSpinLimitNs passed; answered_ counts those done,
   * elsewhere_ those of them that ran on another worker.
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
    for (auto &s : subs) {
      if (s.IsComplete()) t.elsewhere_ += s->worker_ != t.worker_ ? 1 : 0;
    }
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
inline const bool kRegistered = chi::ModuleManager::Register<OverflowProbe>("overflow_probe");
inline constexpr chi::PoolId kPool(351, 0);

/** Sends method m of the probe to the embedded runtime. */
inline chi::Future<OverflowTask> Send(chi::MethodId m, u64 count, u64 spin_ns) {
  auto *t = chi_test::NewLocalTask<OverflowTask>(kPool, m);
  t->count_ = count;
  t->spin_ns_ = spin_ns;
  return chi::GetIpcManager().Send(t);
}

/** Clears the run records for `subtasks` Work tasks (each test case starts with this). */
inline void ResetRuns(u32 subtasks) {
  g_runs = std::make_unique<std::atomic<u32>[]>(subtasks);
  for (auto &last : g_last) last = 0;
  g_out_of_order = 0;
}

/** How many of Work tasks 0..subtasks-1 ran exactly once. */
inline u32 RanOnce(u32 subtasks) {
  u32 once = 0;
  for (u32 i = 0; i < subtasks; ++i) once += g_runs[i].load() == 1 ? 1 : 0;
  return once;
}

}  // namespace overflow_probe
