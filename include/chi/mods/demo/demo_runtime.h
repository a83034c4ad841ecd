// Runtime half of the demo module. Including this header in one translation
// unit registers the module ("chimaera_demo") with the embedded runtime.
#pragma once

#include <cstring>  // memcpy of the first registered bytes
#include <vector>   // registered bytes read back

#include "chi/gpu/gpu_ipc_cache.h"          // ClientMemory: registered client memory
#include "chi/mods/demo/demo_client.h"      // subtasks use the client
#include "chi/mods/demo/demo_tasks.h"       // task types
#include "chi/module/module_manager.h"      // registration
#include "chi/module/module_runtime.h"      // ModuleRuntime
#include "chi/runtime/co_mutex.h"           // CoMutex
#include "chi/runtime/co_rw_lock.h"         // CoRwLock
#include "chi/runtime/runtime_limits.h"     // MaxOutputSize: LargeOutput's bound
#include "chi/runtime/worker.h"             // SleepFor, NowNs

namespace chimaera::demo {

/** One demo container. */
class Runtime : public chi::ModuleRuntime<Runtime> {
 public:
  /** Nothing to set up; the pool's shape comes from the task. */
  void Create(CreateTask &, chi::RunContext &) {}

  void Custom(CustomTask &task, chi::RunContext &) {
    task.visited_mask_ = container_id_ < 64 ? (1ull << container_id_) : 0;
    task.visits_ = 1;
  }

  void GpuSubmit(GpuSubmitTask &task, chi::RunContext &) {
    task.result_value_ = task.test_value_ * 2 + task.gpu_id_;
  }

  /**
   * Nests depth_ levels of subtasks, each waiting on the next; a subtask's error (kTooDeep
   * past limits.max_subtask_depth) becomes this task's.
   */
  void WaitTest(WaitTestTask &task, chi::RunContext &) {
    if (task.depth_ <= 1) {
      task.current_depth_ = 1;
      return;
    }
    Client self(pool_id_);
    auto sub = self.AsyncWaitTest(chi::PoolQuery::DirectId(container_id_), task.depth_ - 1);
    sub.Wait();  // suspends this fiber, not the worker
    if (sub->GetReturnCode() != 0) {
      task.SetError(static_cast<chi::ErrorCode>(sub->GetReturnCode()), sub->GetMessage());
      return;
    }
    task.current_depth_ = sub->current_depth_ + 1;
  }

  /** Produces the size_ bytes asked for, refusing more than limits.max_output_size first. */
  void LargeOutput(LargeOutputTask &task, chi::RunContext &) {
    if (const chi::u64 bound = chi::MaxOutputSize(); task.size_ > bound) {
      task.SetErrorf(chi::ErrorCode::kTooLarge,
                     "LargeOutput of %llu bytes exceeds limits.max_output_size = %llu",
                     static_cast<unsigned long long>(task.size_),
                     static_cast<unsigned long long>(bound));
      return;
    }
    if (!task.data_.Resize(task.size_)) {
      task.SetError(chi::ErrorCode::kOutOfMemory, "LargeOutput allocation failed");
      return;
    }
    char *d = task.data_.data();
    for (chi::u64 i = 0; i < task.size_; ++i) d[i] = static_cast<char>(i % 256);
  }

  void LockHold(LockHoldTask &task, chi::RunContext &) {
    Take(task.mode_);
    task.start_ns_ = chi::NowNs();
    const chi::u32 inside = inside_.FetchAdd(1) + 1;
    task.max_inside_ = inside;
    if (task.nested_ > 0) {  // a same-group subtask takes the same lock again
      Client self(pool_id_);
      auto sub = self.AsyncLockHold(chi::PoolQuery::DirectId(container_id_), task.mode_,
                                    task.hold_ns_, task.nested_ - 1);
      sub.Wait();
      if (sub->max_inside_ > task.max_inside_) task.max_inside_ = sub->max_inside_;
    }
    if (!chi::SleepFor(task.hold_ns_)) {
      task.SetError(chi::ErrorCode::kShutdown, "the runtime stopped before the hold ended");
    }
    inside_.FetchSub(1);
    task.end_ns_ = chi::NowNs();
    Give(task.mode_);
  }

  void Count(CountTask &task, chi::RunContext &) { ++task.runs_; }

  /**
   * Reads memory the sender registered (a test of the runtime's view of it): the sender as
   * its transport identifies it, never a pid from the request.
   */
  void ReadRegistered(ReadRegisteredTask &task, chi::RunContext &) {
    const chi::Caller caller = chi::CallerOf(task);
    if (caller.pid == 0) {
      return task.SetErrorf(chi::ErrorCode::kPermissionDenied,
                            "ReadRegistered: the runtime cannot verify which process a %s "
                            "client is",
                            caller.ViaName());
    }
    if (task.bytes_ > kMaxReadBytes) {
      return task.SetErrorf(chi::ErrorCode::kTooLarge,
                            "ReadRegistered reads at most %llu bytes at once",
                            static_cast<unsigned long long>(kMaxReadBytes));
    }
    std::vector<char> bytes;
    chi::Status st = chi::gpu::ClientMemory().Read(caller.pid, task.address_, task.bytes_, &bytes);
    if (!st.ok()) return task.SetError(st.code(), st.message());
    task.checksum_ = Checksum(bytes.data(), bytes.size());
    task.first_ = 0;
    std::memcpy(&task.first_, bytes.data(), bytes.size() < 8 ? bytes.size() : 8);
  }

  /** Dynamic(): hash the task's group onto a container (counted in via_monitor_). */
  void Monitor(chi::MonitorMode mode, chi::MethodId method, chi::Task *task,
               chi::RunContext &) override {
    if (mode != chi::MonitorMode::kGlobalSchedule) return;
    task->pool_query_ = chi::PoolQuery::DirectHash(task->task_node_.major_);
    if (method == Method::kCustom) static_cast<CustomTask *>(task)->via_monitor_ = 1;
  }

  /** The handlers that never wait run on the worker's stack, without a fiber switch. */
  static constexpr chi::RunOn kNoWait = chi::RunOn::kWorkerStack;
  using Methods = chi::MethodList<
      chi::Method<Method::kCreate, CreateTask, &Runtime::Create, "Create">,
      chi::Method<Method::kCustom, CustomTask, &Runtime::Custom, "Custom", kNoWait>,
      chi::Method<Method::kGpuSubmit, GpuSubmitTask, &Runtime::GpuSubmit, "GpuSubmit", kNoWait>,
      chi::Method<Method::kWaitTest, WaitTestTask, &Runtime::WaitTest, "WaitTest">,
      chi::Method<Method::kLargeOutput, LargeOutputTask, &Runtime::LargeOutput, "LargeOutput",
                  kNoWait>,
      chi::Method<Method::kLockHold, LockHoldTask, &Runtime::LockHold, "LockHold">,
      chi::Method<Method::kCount, CountTask, &Runtime::Count, "Count", kNoWait>,
      chi::Method<Method::kReadRegistered, ReadRegisteredTask, &Runtime::ReadRegistered,
                  "ReadRegistered">>;

 private:
  /** The most ReadRegistered copies for one task (it answers with a checksum only). */
  static constexpr chi::u64 kMaxReadBytes = 64ull << 20;

  void Take(LockMode m) {
    if (m == LockMode::kMutex) mutex_.Lock();
    if (m == LockMode::kRead) rw_.ReadLock();
    if (m == LockMode::kWrite) rw_.WriteLock();
  }
  void Give(LockMode m) {
    if (m == LockMode::kMutex) mutex_.Unlock();
    if (m == LockMode::kRead) rw_.ReadUnlock();
    if (m == LockMode::kWrite) rw_.WriteUnlock();
  }

  chi::CoMutex mutex_;
  chi::CoRwLock rw_;
  chi::Atomic<chi::u32> inside_;  ///< LockHold tasks inside their critical section
};

/** Registers the demo module in every process that includes this header. */
inline const bool kRegistered = chi::ModuleManager::Register<Runtime>(kModuleName);

}  // namespace chimaera::demo
