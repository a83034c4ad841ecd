// Runtime half of the admin module: creates pools (running each container's
// kCreate), destroys them once drained, stops the runtime, reports statistics,
// records client memory registrations and sets up GPU containers on request.
// Always registered: the runtime creates the admin pool (kAdminPoolId) at start.
#pragma once

#include <unistd.h>  // getpid, getuid: the runtime's own process and user

#include <memory>  // unique_ptr<PoolInfo>

#include "chi/gpu/gpu_ipc_cache.h"         // ClientMemory, GpuHooks (CUDA-free)
#include "chi/memory/large_block_cache.h"  // what Monitor reports of the payload cache
#include "chi/mods/admin/admin_tasks.h"     // task types
#include "chi/module/module_manager.h"      // registration
#include "chi/module/module_runtime.h"      // ModuleRuntime, chi::Method
#include "chi/runtime/config.h"             // ComposeEntry
#include "chi/runtime/ipc_manager.h"        // ComposePool submits through it
#include "chi/runtime/pool_manager.h"       // PoolManager
#include "chi/runtime/work_orchestrator.h"  // WakeAll, Stats
#include "chi/task/task_ops.h"              // CallerOf: who sent a task
#include "chi/transport/message_buffer.h"   // WarmMessageBytes for Monitor

namespace chimaera::admin {

/** The admin container (one per runtime). */
class Runtime : public chi::ModuleRuntime<Runtime> {
 public:
  /** Gives the container the runtime services it manages. */
  void Bind(chi::PoolManager *pools, chi::WorkOrchestrator *orch, void (*on_stop)(),
            std::vector<TransportStats> (*transport_stats)() = nullptr) {
    pools_ = pools;
    orch_ = orch;
    on_stop_ = on_stop;
    transport_stats_ = transport_stats;
  }

  /** The admin pool itself needs no set-up. */
  void Create(CreatePoolTask &, chi::RunContext &) {}

  /** Creates (or, with get_or_create_, finds) a pool and runs kCreate on its containers. */
  void CreatePool(CreatePoolTask &task, chi::RunContext &rctx) {
    const std::string_view name = task.pool_name_.view();
    if (!task.module_name_.Fits() || !task.pool_name_.Fits() || name.empty()) {
      task.SetError(chi::ErrorCode::kInvalidArgument,
                    "module and pool names must be 1..63 characters");
      return;
    }
    if (task.new_pool_id_ == chi::kAdminPoolId) {
      task.SetError(chi::ErrorCode::kInvalidArgument, "pool id 1.0 is reserved for admin");
      return;
    }
    chi::PoolId existing = pools_->FindByName(name);
    if (!existing.IsNull()) {
      if (task.get_or_create_ && (task.new_pool_id_.IsNull() || task.new_pool_id_ == existing)) {
        task.new_pool_id_ = existing;
        return;
      }
      task.SetErrorf(chi::ErrorCode::kAlreadyExists, "pool '%s' already exists as %s",
                     task.pool_name_.c_str(), existing.ToString().c_str());
      return;
    }
    std::unique_ptr<chi::PoolInfo> info;
    chi::Status st = pools_->PreparePool(task.module_name_.view(), name, task.new_pool_id_,
                                         task.num_containers_, &info);
    if (!st.ok()) return task.SetError(st.code(), st.message());
    task.new_pool_id_ = info->id_;
    for (auto &container : info->containers_) {
      if (!container->HasMethod(Method::kCreate)) continue;
      container->Run(Method::kCreate, &task, rctx);
      if (task.rc_ != 0) return;  // a container refused: the pool is dropped
    }
    chi::PoolId holder;
    st = pools_->CommitPool(std::move(info), &holder);
    if (!st.ok()) {
      if (st.code() == chi::ErrorCode::kAlreadyExists && task.get_or_create_ && !holder.IsNull()) {
        task.new_pool_id_ = holder;  // lost a race with an identical request
        return;
      }
      task.SetError(st.code(), st.message());
    }
  }

  /** Refuses new tasks for the pool, waits for in-flight ones, then frees it. */
  void DestroyPool(DestroyPoolTask &task, chi::RunContext &rctx) {
    if (!MayControl(task, "DestroyPool")) return;
    if (task.target_ == chi::kAdminPoolId) {
      task.SetError(chi::ErrorCode::kInvalidArgument, "the admin pool cannot be destroyed");
      return;
    }
    chi::Status st;
    chi::PoolInfo *info = pools_->BeginDestroy(task.target_, &st);
    if (info == nullptr) return task.SetError(st.code(), st.message());
    orch_->WakeAll();  // periodic tasks of this pool end at their worker's next look
    // seq_cst: after BeginDestroy's seq_cst flag, every task that got past Acquire is in
    // the sum (Dekker with Acquire); acquire: what the drained tasks did is visible before
    // the containers die.
    while (info->inflight_.Sum(chi::MemOrder::kSeqCst) != 0) {
      rctx.GetWorker()->YieldInFiber(&rctx);
    }
    pools_->FinishDestroy(info);
  }

  /** Stops taking tasks; the process's owner finalizes. */
  void StopRuntime(StopRuntimeTask &task, chi::RunContext &) {
    if (!MayControl(task, "StopRuntime")) return;
    if (on_stop_ != nullptr) on_stop_();
  }

  /**
   * Records a client's memory (chi::gpu::ClientMemory) for the process that sent the task,
   * as its transport identifies it: a client registers only its own memory, and the
   * runtime's own pid is never a client's. Device memory of another process needs this
   * runtime's GPU layer; its IPC handle is opened on first use, not here.
   */
  void RegisterMemory(RegisterMemoryTask &task, chi::RunContext &) {
    chi::gpu::MemoryRegistration reg = task.reg_;
    const chi::Caller caller = chi::CallerOf(task);
    const chi::u32 self = static_cast<chi::u32>(getpid());
    if (caller.pid == 0) {
      return task.SetErrorf(chi::ErrorCode::kPermissionDenied,
                            "RegisterMemory: the runtime cannot verify which process a %s "
                            "client is; register over shm or ipc",
                            caller.ViaName());
    }
    if (!caller.IsThisProcess() && caller.pid == self) {
      return task.SetError(chi::ErrorCode::kPermissionDenied,
                           "RegisterMemory: the runtime's own process is never a client");
    }
    if (reg.pid != caller.pid) {
      return task.SetErrorf(chi::ErrorCode::kPermissionDenied,
                            "RegisterMemory: registration names pid %u but came from pid %u",
                            reg.pid, caller.pid);
    }
    if (reg.type == chi::gpu::MemoryType::kGpuDeviceMemory && reg.pid != self &&
        chi::gpu::GpuHooks::Get().runtime_ops.Load(chi::MemOrder::kAcquire) == nullptr) {
      const chi::Status st = chi::gpu::HookedIpcOpener::NoGpu();
      return task.SetError(st.code(), st.message());
    }
    chi::Status st = chi::gpu::ClientMemory().Register(reg);
    if (!st.ok()) task.SetError(st.code(), st.message());
  }

  /** Gives GPU gpu_id_ a container for pool target_ (GpuManager does the work). */
  void GpuAttachPool(GpuAttachPoolTask &task, chi::RunContext &) {
    chi::gpu::EnsureGpuPoolFn ensure =
        chi::gpu::GpuHooks::Get().ensure_pool.Load(chi::MemOrder::kAcquire);
    if (ensure == nullptr) {
      return task.SetError(chi::ErrorCode::kUnsupported,
                           "this runtime has no GPU (or was built without CUDA/HIP)");
    }
    chi::Status st = ensure(task.gpu_id_, task.target_);
    if (!st.ok()) task.SetError(st.code(), st.message());
  }

  /** Fills the report: every worker's, pool's and transport's counters, and kept memory. */
  void MonitorStats(MonitorTask &task, chi::RunContext &) {
    MonitorReport report;
    report.workers_ = orch_->Stats();
    report.pools_ = pools_->Stats();
    if (transport_stats_ != nullptr) report.transports_ = transport_stats_();
    const chi::LargeBlockCache::Usage kept = chi::LargeBlockCache::Instance().Kept();
    report.payload_cache_.blocks_ = kept.blocks;
    report.payload_cache_.bytes_ = kept.bytes;
    report.payload_cache_.resident_bytes_ = kept.warm_bytes;
    report.payload_cache_.message_buffer_bytes_ = chi::WarmMessageBytes();
    std::vector<char> buf;
    chi::OutputArchive out(buf);
    out(report);
    task.report_.Assign(buf.data(), buf.size());
  }

  using Methods = chi::MethodList<
      chi::Method<Method::kCreate, CreatePoolTask, &Runtime::Create, "Create">,
      chi::Method<Method::kMonitor, MonitorTask, &Runtime::MonitorStats, "Monitor">,
      chi::Method<Method::kCreatePool, CreatePoolTask, &Runtime::CreatePool, "CreatePool">,
      chi::Method<Method::kDestroyPool, DestroyPoolTask, &Runtime::DestroyPool, "DestroyPool">,
      chi::Method<Method::kStopRuntime, StopRuntimeTask, &Runtime::StopRuntime, "StopRuntime">,
      chi::Method<Method::kRegisterMemory, RegisterMemoryTask, &Runtime::RegisterMemory,
                  "RegisterMemory">,
      chi::Method<Method::kGpuAttachPool, GpuAttachPoolTask, &Runtime::GpuAttachPool,
                  "GpuAttachPool">>;

 private:
  /**
   * True when task's sender may stop the runtime or destroy pools: the runtime's own user
   * (or root), as its transport identifies it. Otherwise fails the task and returns false.
   */
  static bool MayControl(chi::Task &task, const char *what) {
    const chi::Caller caller = chi::CallerOf(task);
    if (caller.IsRuntimeUser()) return true;
    if (caller.uid == chi::Caller::kNoUid) {
      task.SetErrorf(chi::ErrorCode::kPermissionDenied,
                     "%s: refused: the runtime cannot verify the user of a %s client", what,
                     caller.ViaName());
    } else {
      task.SetErrorf(chi::ErrorCode::kPermissionDenied,
                     "%s: refused for uid %u: only the runtime's user (uid %u) may", what,
                     caller.uid, static_cast<chi::u32>(getuid()));
    }
    return false;
  }

  chi::PoolManager *pools_ = nullptr;
  chi::WorkOrchestrator *orch_ = nullptr;
  void (*on_stop_)() = nullptr;
  std::vector<TransportStats> (*transport_stats_)() = nullptr;  ///< standalone runtime only
};

/** Registers the admin module in every process that includes this header. */
inline const bool kRegistered = chi::ModuleManager::Register<Runtime>(kModuleName);

/** Creates the admin pool directly (no worker needed) and binds it to the runtime. */
inline chi::Status CreateAdminPool(chi::PoolManager &pools, chi::WorkOrchestrator &orch,
                                   void (*on_stop)(),
                                   std::vector<TransportStats> (*transport_stats)() = nullptr) {
  std::unique_ptr<chi::PoolInfo> info;
  chi::Status st = pools.PreparePool(kModuleName, "admin", chi::kAdminPoolId, 1, &info);
  if (!st.ok()) return st;
  static_cast<Runtime *>(info->containers_[0].get())
      ->Bind(&pools, &orch, on_stop, transport_stats);
  return pools.CommitPool(std::move(info));
}

/** Creates one `compose:` pool from the config and waits for it. */
inline chi::Status ComposePool(chi::IpcManager &ipc, const chi::ComposeEntry &e) {
  auto *t = ipc.NewTask<CreatePoolTask>(e.mod_name, e.pool_name, e.pool_id, e.num_containers, true);
  if (t == nullptr) return chi::Status::Error(chi::ErrorCode::kOutOfMemory, "compose task");
  t->pool_id_ = chi::kAdminPoolId;
  t->pool_query_ = e.pool_query;
  t->method_ = Method::kCreatePool;
  chi::Future<CreatePoolTask> f = ipc.Send(t);
  f.Wait();
  if (f->GetReturnCode() != 0) {
    return chi::Status::Errorf(static_cast<chi::ErrorCode>(f->GetReturnCode()), "%s",
                               f->GetMessage());
  }
  return chi::Status::Ok();
}

}  // namespace chimaera::admin
