// Client of the admin module: create, find and destroy pools, stop the runtime,
// read statistics. Every call returns a Future; Wait() then check GetReturnCode().
#pragma once

#include <string_view>  // names

#include "chi/mods/admin/admin_tasks.h"     // task types
#include "chi/module/container_client.h"    // ContainerClient

namespace chimaera::admin {

/** Talks to the admin pool (chi::kAdminPoolId). */
class Client : public chi::ContainerClient {
 public:
  Client() : ContainerClient(chi::kAdminPoolId) {}

  /** Creates a pool of `module_name`; with get_or_create an existing pool of that name is returned. */
  chi::Future<CreatePoolTask> AsyncCreatePool(const chi::PoolQuery &query,
                                              std::string_view module_name,
                                              std::string_view pool_name, chi::PoolId pool_id,
                                              chi::u32 num_containers = 1,
                                              bool get_or_create = true) {
    return Submit(MakeTask<CreatePoolTask>(pool_id_, query, Method::kCreatePool, module_name,
                                           pool_name, pool_id, num_containers, get_or_create));
  }
  /** Same as AsyncCreatePool with get_or_create = true. */
  chi::Future<CreatePoolTask> AsyncGetOrCreatePool(const chi::PoolQuery &query,
                                                   std::string_view module_name,
                                                   std::string_view pool_name,
                                                   chi::PoolId pool_id,
                                                   chi::u32 num_containers = 1) {
    return AsyncCreatePool(query, module_name, pool_name, pool_id, num_containers, true);
  }
  /** Destroys a pool once its in-flight tasks finish. */
  chi::Future<DestroyPoolTask> AsyncDestroyPool(const chi::PoolQuery &query, chi::PoolId target) {
    return Submit(MakeTask<DestroyPoolTask>(pool_id_, query, Method::kDestroyPool, target));
  }
  /** Asks the runtime to stop. */
  chi::Future<StopRuntimeTask> AsyncStopRuntime(const chi::PoolQuery &query) {
    return Submit(MakeTask<StopRuntimeTask>(pool_id_, query, Method::kStopRuntime));
  }
  /** Collects worker and pool statistics; decode with ->Decode(). */
  chi::Future<MonitorTask> AsyncMonitor(const chi::PoolQuery &query) {
    return Submit(MakeTask<MonitorTask>(pool_id_, query, Method::kMonitor));
  }
};

}  // namespace chimaera::admin
