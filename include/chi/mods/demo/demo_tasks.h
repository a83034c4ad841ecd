// Tasks of the demo module (chimaera::demo, the seed's MOD_NAME). Method ids
// match chimaera_mod.yaml (a test checks they agree).
#pragma once

#include "chi/core/ids.h"                 // PoolId
#include "chi/gpu/gpu_container.h"        // GpuRuntime's method table (GPU handlers)
#include "chi/mods/admin/admin_tasks.h"   // CreatePoolTask (kCreate)
#include "chi/task/task.h"                // Task
#include "chi/task/task_buffer.h"         // payloads

namespace chimaera::demo {

/** Method ids (chimaera_mod.yaml). */
struct Method {
  static constexpr chi::MethodId kCreate = 0;
  static constexpr chi::MethodId kCustom = 10;
  static constexpr chi::MethodId kGpuSubmit = 11;
  static constexpr chi::MethodId kWaitTest = 12;
  static constexpr chi::MethodId kLargeOutput = 13;
  static constexpr chi::MethodId kLockHold = 14;
  static constexpr chi::MethodId kCount = 15;
  static constexpr chi::MethodId kReadRegistered = 16;
};

/** Name under which the demo module registers. */
inline constexpr std::string_view kModuleName = "chimaera_demo";

/** Pools of this module are created through the admin task. */
using CreateTask = chimaera::admin::CreatePoolTask;

/** Echoes data_ back; records which containers ran it (a bit per container id < 64). */
struct CustomTask : public chi::Task {
  CHI_INOUT chi::TaskBuffer data_;
  CHI_OUT chi::u64 visited_mask_ = 0;   ///< containers that ran the task
  CHI_OUT chi::u32 visits_ = 0;         ///< how many containers ran it
  CHI_OUT chi::u32 via_monitor_ = 0;    ///< 1 when Dynamic() was resolved by Monitor

  CustomTask() = default;
  explicit CustomTask(chi::TaskBuffer data) : data_(std::move(data)) {}

  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(data_);
  }
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(data_, visited_mask_, visits_, via_monitor_);
  }
  /** Broadcast/Range: data from the first replica, visits summed, masks merged. */
  void Aggregate(const CustomTask &replica, chi::u32 index) {
    if (index == 0) data_ = replica.data_;
    visited_mask_ |= replica.visited_mask_;
    visits_ += replica.visits_;
    via_monitor_ |= replica.via_monitor_;
  }
};

/** result_value_ = test_value_ * 2 + gpu_id_ on the CPU (x3 on the GPU handler). */
struct GpuSubmitTask : public chi::Task {
  CHI_IN chi::u32 gpu_id_ = 0;
  CHI_IN chi::u32 test_value_ = 0;
  CHI_OUT chi::u32 result_value_ = 0;

  GpuSubmitTask() = default;
  CHI_CROSS_FUN GpuSubmitTask(chi::u32 gpu_id, chi::u32 test_value)
      : gpu_id_(gpu_id), test_value_(test_value) {}

  template <typename Ar>
  CHI_CROSS_FUN void SerializeIn(Ar &ar) {
    ar(gpu_id_, test_value_);
  }
  template <typename Ar>
  CHI_CROSS_FUN void SerializeOut(Ar &ar) {
    ar(result_value_);
  }
};

/**
 * The demo module's GPU container: its handlers run in the GPU orchestrator. An application
 * serves it by naming it in one .cu file: CHI_GPU_MODULES(chimaera::demo::GpuRuntime).
 */
struct GpuRuntime {
  chi::Atomic<chi::u64, chi::MemScope::kDevice> gpu_submits_;  ///< GpuSubmit tasks run here

  static constexpr std::string_view ModuleName() { return kModuleName; }

  /** result_value_ = test_value_ * 3 + gpu_id_ (the CPU handler doubles instead). */
  CHI_GPU_FUN void GpuSubmit(GpuSubmitTask &task, chi::gpu::GpuRunContext &) {
    task.result_value_ = task.test_value_ * 3 + task.gpu_id_;
    gpu_submits_.FetchAdd(1, chi::MemOrder::kRelaxed);  // relaxed: a statistic for tests
  }

  using GpuMethods = chi::gpu::GpuMethodList<
      chi::gpu::GpuMethod<Method::kGpuSubmit, GpuSubmitTask, &GpuRuntime::GpuSubmit>>;
};

/** Spawns a chain of subtasks `depth_` deep and waits on each; current_depth_ == depth_. */
struct WaitTestTask : public chi::Task {
  CHI_IN chi::u32 depth_ = 1;
  CHI_OUT chi::u32 current_depth_ = 0;

  WaitTestTask() = default;
  explicit WaitTestTask(chi::u32 depth) : depth_(depth) {}

  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(depth_);
  }
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(current_depth_);
  }
};

/** Produces size_ bytes with data_[i] = i % 256. */
struct LargeOutputTask : public chi::Task {
  CHI_IN chi::u64 size_ = 0;
  CHI_OUT chi::TaskBuffer data_;

  LargeOutputTask() = default;
  explicit LargeOutputTask(chi::u64 size) : size_(size) {}

  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(size_);
  }
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(data_);
  }
};

/** How a LockHoldTask takes the container's locks. */
enum class LockMode : chi::u32 { kMutex = 0, kRead = 1, kWrite = 2 };

/**
 * Holds the container's CoMutex / CoRwLock for hold_ns_, optionally spawning
 * `nested_` same-group subtasks that take the same lock (re-entry test).
 */
struct LockHoldTask : public chi::Task {
  CHI_IN LockMode mode_ = LockMode::kMutex;
  CHI_IN chi::u64 hold_ns_ = 0;
  CHI_IN chi::u32 nested_ = 0;
  CHI_OUT chi::u64 start_ns_ = 0;  ///< when the lock was granted (CLOCK_MONOTONIC)
  CHI_OUT chi::u64 end_ns_ = 0;    ///< when it was released
  CHI_OUT chi::u32 max_inside_ = 0;  ///< most holders seen inside at once

  LockHoldTask() = default;
  LockHoldTask(LockMode mode, chi::u64 hold_ns, chi::u32 nested)
      : mode_(mode), hold_ns_(hold_ns), nested_(nested) {}

  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(mode_, hold_ns_, nested_);
  }
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(start_ns_, end_ns_, max_inside_);
  }
};

/** Counts its own runs (meant to be TASK_PERIODIC). */
struct CountTask : public chi::Task {
  CHI_OUT chi::u64 runs_ = 0;

  template <typename Ar>
  void SerializeIn(Ar &) {}
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(runs_);
  }
};

/** FNV-1a over `bytes` bytes: what ReadRegisteredTask reports (tests compute it too). */
inline chi::u64 Checksum(const char *data, chi::u64 bytes) {
  chi::u64 h = 0xcbf29ce484222325ull;
  for (chi::u64 i = 0; i < bytes; ++i) {
    h = (h ^ static_cast<unsigned char>(data[i])) * 0x100000001b3ull;
  }
  return h;
}

/**
 * Makes the runtime read [address_, address_ + bytes_) of memory the calling process
 * registered (IpcManager::RegisterMemory): checksum_ = Checksum of those bytes, first_ =
 * the first (up to) 8 of them. Proves the runtime sees the client's data.
 */
struct ReadRegisteredTask : public chi::Task {
  CHI_IN chi::u64 address_ = 0;
  CHI_IN chi::u64 bytes_ = 0;
  CHI_OUT chi::u64 checksum_ = 0;
  CHI_OUT chi::u64 first_ = 0;

  ReadRegisteredTask() = default;
  ReadRegisteredTask(chi::u64 address, chi::u64 bytes) : address_(address), bytes_(bytes) {}

  template <typename Ar>
  void SerializeIn(Ar &ar) {
    ar(address_, bytes_);
  }
  template <typename Ar>
  void SerializeOut(Ar &ar) {
    ar(checksum_, first_);
  }
};

}  // namespace chimaera::demo
