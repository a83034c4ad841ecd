// Container: one shard of a pool, living in the runtime. A module derives from
// chi::ModuleRuntime (module_runtime.h), which implements these virtuals from a
// compile-time list of methods, so no generated switch is ever written by hand.
#pragma once

#include <string>       // pool name
#include <string_view>  // Init

#include "chi/core/atomic.h"  // per-container counters
#include "chi/core/ids.h"     // PoolId, ContainerId, MethodId
#include "chi/core/striped_counter.h"  // tasks done, counted by every worker
#include "chi/core/types.h"   // u32, u64
#include "chi/serialize/archive.h"  // InputArchive/OutputArchive for the wire hooks
#include "chi/task/task.h"    // Task

namespace chi {

class RunContext;

/** Scheduling phases a container may take part in (seed 004 Monitor modes). */
enum class MonitorMode : u32 {
  kLocalSchedule = 0,   ///< pick where on this node the task runs
  kGlobalSchedule = 1,  ///< resolve PoolQuery::Dynamic() into a concrete query
};

/**
 * Where a method's handler runs (the last argument of chi::Method). A fiber costs a switch
 * in and out per task (two context jumps, and the return predictions they break); a
 * handler that never waits can skip it, as HPX's stackless threads and Argobots'
 * tasklets do.
 */
enum class RunOn : u32 {
  kUnknown = 0,      ///< no such method (Container::RunsOn only)
  kFiber = 1,        ///< on a fiber of its own: it may wait (subtasks, SleepFor, co-locks)
  kWorkerStack = 2,  ///< on the worker's own stack: no switch, and it may never wait
};

/** Base of every runtime container; type-erased entry points used by workers. */
class Container {
 public:
  virtual ~Container() = default;

  /** Binds the container to its pool; called once by the PoolManager. */
  void Init(PoolId pool_id, std::string_view pool_name, ContainerId container_id,
            u32 num_containers) {
    pool_id_ = pool_id;
    pool_name_ = std::string(pool_name);
    container_id_ = container_id;
    num_containers_ = num_containers;
  }

  /** Runs `method` on `task` (inside a task fiber, or on the worker's stack: RunsOn). */
  virtual void Run(MethodId method, Task *task, RunContext &rctx) = 0;
  /** Scheduling hook; the default keeps the task where it is and leaves Dynamic as Local. */
  virtual void Monitor(MonitorMode mode, MethodId method, Task *task, RunContext &rctx) {
    (void)mode;
    (void)method;
    (void)task;
    (void)rctx;
  }
  /** Where `method`'s handler runs; kUnknown when this module has no such method. */
  virtual RunOn RunsOn(MethodId method) const = 0;
  /** True when this module implements `method`. */
  bool HasMethod(MethodId method) const { return RunsOn(method) != RunOn::kUnknown; }
  /** A readable method name for messages ("Custom"), or "?" when unknown. */
  virtual const char *MethodName(MethodId method) const = 0;
  /**
   * Transports: makes the task for `method` from its serialized inputs (the
   * routing header was decoded into `base`); nullptr on unknown method or bad
   * bytes. Answers travel through the task's own TaskOps (save_out / load_out).
   */
  virtual Task *LoadTaskIn(MethodId method, const Task &base, InputArchive &ar) = 0;

  PoolId GetPoolId() const { return pool_id_; }
  const std::string &GetPoolName() const { return pool_name_; }
  ContainerId GetContainerId() const { return container_id_; }
  u32 GetNumContainers() const { return num_containers_; }
  /** Tasks this container has finished (for Monitor stats). */
  u64 TasksDone() const { return tasks_done_.Sum(); }
  /** Counts a finished task (relaxed: a statistic, nothing synchronises on it). */
  void CountDone() { tasks_done_.Add(1); }

 protected:
  PoolId pool_id_;
  std::string pool_name_;
  ContainerId container_id_ = 0;
  u32 num_containers_ = 1;
  StripedCounter tasks_done_;  ///< striped: every worker running the container counts here
};

}  // namespace chi
