// Client of the demo module: the calls DESIGN.md section 2 names, plus lock and
// periodic helpers used by the tests. AsyncGpuSubmit also works inside GPU kernels.
#pragma once

#include <string_view>  // names

#include "chi/mods/admin/admin_client.h"  // pool creation goes through admin
#include "chi/mods/demo/demo_tasks.h"     // task types
#include "chi/module/container_client.h"  // ContainerClient
#if CHI_GPU_CUDA || CHI_GPU_HIP
#include "chi/gpu/gpu_client.h"           // AsyncGpuSubmit from a kernel
#endif

namespace chimaera::demo {

/** Submits demo tasks to one pool. */
class Client : public chi::ContainerClient {
 public:
  Client() = default;
  CHI_CROSS_FUN explicit Client(chi::PoolId pool_id) { pool_id_ = pool_id; }

  /** Creates (or finds) the pool `pool_name` with id `pool_id`; the client adopts the id. */
  chi::Future<CreateTask> AsyncCreate(const chi::PoolQuery &query, std::string_view pool_name,
                                      chi::PoolId pool_id, chi::u32 num_containers = 1) {
    pool_id_ = pool_id;
    return admin::Client().AsyncCreatePool(query, kModuleName, pool_name, pool_id,
                                           num_containers, true);
  }
  /** Echoes `data` back (CustomTask::data_). */
  chi::Future<CustomTask> AsyncCustom(const chi::PoolQuery &query, std::string_view data) {
    return Submit(MakeTask<CustomTask>(pool_id_, query, Method::kCustom,
                                       chi::TaskBuffer(data.data(), data.size())));
  }
  /**
   * result_value_ = test_value * 2 + gpu_id where a CPU handler runs it (Local() from the
   * CPU, ToLocalCpu() from a kernel), test_value * 3 + gpu_id where the GPU handler does
   * (Local() from a kernel, LocalGpuBcast() / ToLocalGpu(id) from the CPU).
   */
  CHI_CROSS_FUN chi::Future<GpuSubmitTask> AsyncGpuSubmit(const chi::PoolQuery &query,
                                                          chi::u32 gpu_id, chi::u32 test_value) {
#if CHI_IS_GPU
    return chi::gpu::AsyncSubmit<GpuSubmitTask>(pool_id_, query, Method::kGpuSubmit, gpu_id,
                                                test_value);
#else
    return Submit(
        MakeTask<GpuSubmitTask>(pool_id_, query, Method::kGpuSubmit, gpu_id, test_value));
#endif
  }
  /** The runtime reads [address, address + bytes) this process registered (a checksum). */
  chi::Future<ReadRegisteredTask> AsyncReadRegistered(const chi::PoolQuery &query,
                                                      const void *address, chi::u64 bytes) {
    return Submit(MakeTask<ReadRegisteredTask>(pool_id_, query, Method::kReadRegistered,
                                               reinterpret_cast<chi::u64>(address), bytes));
  }
  /** A chain of `depth` nested subtasks; current_depth_ == depth. */
  chi::Future<WaitTestTask> AsyncWaitTest(const chi::PoolQuery &query, chi::u32 depth) {
    return Submit(MakeTask<WaitTestTask>(pool_id_, query, Method::kWaitTest, depth));
  }
  /** `size` output bytes, data_[i] = i % 256. */
  chi::Future<LargeOutputTask> AsyncLargeOutput(const chi::PoolQuery &query, chi::u64 size) {
    return Submit(MakeTask<LargeOutputTask>(pool_id_, query, Method::kLargeOutput, size));
  }
  /**
   * Holds a container lock for hold_ns (tests of CoMutex/CoRwLock); kShutdown when the
   * runtime stopped during the hold.
   */
  chi::Future<LockHoldTask> AsyncLockHold(const chi::PoolQuery &query, LockMode mode,
                                          chi::u64 hold_ns, chi::u32 nested = 0) {
    return Submit(
        MakeTask<LockHoldTask>(pool_id_, query, Method::kLockHold, mode, hold_ns, nested));
  }
  /** A periodic task that counts its runs until cancelled or the pool is destroyed. */
  chi::Future<CountTask> AsyncPeriodicCount(const chi::PoolQuery &query, double period_ns) {
    CountTask *t = MakeTask<CountTask>(pool_id_, query, Method::kCount);
    if (t != nullptr) {
      t->task_flags_.SetBits(chi::TASK_PERIODIC);
      t->period_ns_ = period_ns;
    }
    return Submit(t);
  }
  /** Fire-and-forget Custom: nothing to wait for, the runtime frees it. */
  void CustomFireAndForget(const chi::PoolQuery &query, std::string_view data) {
    CustomTask *t = MakeTask<CustomTask>(pool_id_, query, Method::kCustom,
                                         chi::TaskBuffer(data.data(), data.size()));
    if (t != nullptr) chi::GetIpcManager().SendFireAndForget(t);
  }
};

}  // namespace chimaera::demo
