// SpinProbe: a test module whose one method holds its worker without yielding (a task that
// should have been TASK_HIGH_LATENCY) and says which kind of worker ran it: what the poller
// rescue tests (poller_rescue.h) put on a poller worker, over ZeroMQ (test_cross_process.cc)
// and GPU->CPU (tests/gpu/test_gpu_runtime.cu). Registered in every process of a binary
// that includes it.
#pragma once

#include <doctest/doctest.h>

#include <chi/chi.h>

namespace spin_probe {

/** Spins for spin_ns; reports when it let go and the role of the worker it held. */
struct SpinTask : public chi::Task {
  CHI_IN chi::u64 spin_ns_ = 0;
  CHI_OUT chi::u64 end_ns_ = 0;  ///< when it let go of its worker (CLOCK_MONOTONIC)
  CHI_OUT chi::u32 role_ = 0;    ///< the chi::WorkerRole of that worker (see RoleOf)

  SpinTask() = default;
  CHI_CROSS_FUN explicit SpinTask(chi::u64 spin_ns) : spin_ns_(spin_ns) {}

  template <typename Ar>
  CHI_CROSS_FUN void SerializeIn(Ar &ar) {
    ar(spin_ns_);
  }
  template <typename Ar>
  CHI_CROSS_FUN void SerializeOut(Ar &ar) {
    ar(end_ns_, role_);
  }
};

/** What SpinTask::role_ holds for a worker of `role`. */
constexpr chi::u32 RoleOf(chi::WorkerRole role) { return static_cast<chi::u32>(role) + 1; }

/** The runtime side of SpinTask. */
class SpinProbe : public chi::ModuleRuntime<SpinProbe> {
 public:
  static constexpr chi::MethodId kSpin = 10;
  /** A pool of the probe needs nothing set up. */
  void Create(chimaera::admin::CreatePoolTask &, chi::RunContext &) {}
  /** Spins, never yielding its worker, for the time asked. */
  void Spin(SpinTask &t, chi::RunContext &) {
    const chi::Worker *w = chi::tls_current_worker;
    t.role_ = w != nullptr ? RoleOf(w->GetRole()) : 0;
    const chi::u64 end = chi::MonotonicNs() + t.spin_ns_;
    while (chi::MonotonicNs() < end) chi::CpuRelax();
    t.end_ns_ = chi::MonotonicNs();
  }
  using Methods = chi::MethodList<
      chi::Method<0, chimaera::admin::CreatePoolTask, &SpinProbe::Create, "Create">,
      chi::Method<kSpin, SpinTask, &SpinProbe::Spin, "Spin">>;
};
inline const bool kRegistered = chi::ModuleManager::Register<SpinProbe>("spin_probe");

/** Creates a SpinProbe pool `pool` through the current runtime or connection (or finds it). */
inline void CreatePool(chi::PoolId pool) {
  auto made = chimaera::admin::Client().AsyncCreatePool(chi::PoolQuery::Local(), "spin_probe",
                                                        "spin_probe", pool);
  REQUIRE(made.Wait(30));
  REQUIRE_MESSAGE(made->GetReturnCode() == 0, made->GetMessage());
}

}  // namespace spin_probe
