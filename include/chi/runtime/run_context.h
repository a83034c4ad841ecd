// RunContext: the runtime-private state of one executing task — the fiber shell
// running it, the worker that owns that shell, its container and pool. Never in
// shared memory; the task struct itself stays plain data. Also the thread-locals
// that tell Future::Wait whether it runs inside a task fiber (yield) or on a
// plain thread (park), and the error a task that has no fiber gets when it tries to wait.
#pragma once

#include <exception>  // WaitWithoutFiber
#include <utility>    // std::move
#include <vector>     // fan-out targets

#include "chi/core/status.h"       // WaitWithoutFiber's code and message
#include "chi/core/types.h"        // u32, u64
#include "chi/runtime/fiber.h"     // FiberShell
#include "chi/task/task.h"         // Task

namespace chi {

class Worker;
class Container;
struct PoolInfo;

/**
 * Thrown when a task running on its worker's stack (RunOn::kWorkerStack) tries to wait:
 * it has no fiber to suspend. The worker answers the task with kUnsupported and this
 * message (which names the method), and goes on serving.
 */
class WaitWithoutFiber : public std::exception {
 public:
  explicit WaitWithoutFiber(const Status &status) : status_(status) {}
  const char *what() const noexcept override { return status_.message(); }
  /** kUnsupported and the message the task is answered with. */
  const Status &status() const { return status_; }

 private:
  Status status_;
};

/**
 * Everything a worker tracks for one task between start and completion. A task
 * holds its shell only while it runs or is suspended: a periodic task waiting
 * for its next run holds none.
 */
class RunContext {
 public:
  /** What the worker should do with the task when its fiber returns control. */
  enum class Kind : u32 { kRun, kFanOut };

  Task *task_ = nullptr;            ///< the task being executed
  Container *container_ = nullptr;  ///< target container (kRun)
  PoolInfo *pool_ = nullptr;        ///< pool reference held while in flight
  Worker *worker_ = nullptr;        ///< the worker that owns the shell
  Kind kind_ = Kind::kRun;
  FiberShell *shell_ = nullptr;     ///< the fiber running the task, from start to finish
  bool finished_ = false;           ///< the task's body returned (its shell is free again)
  bool on_worker_stack_ = false;    ///< runs on the worker's stack (RunOn::kWorkerStack)
  u32 next_minor_ = 1;              ///< TaskNode minor for the next subtask
  u64 next_run_ns_ = 0;             ///< periodic tasks: when to run again
  RunContext *next_ = nullptr;      ///< intrusive link (resume stack, free list)
  std::vector<ContainerId> targets_;  ///< fan-out: containers that get a replica

  /** Task side: switch back to the worker until someone resumes this fiber. */
  void Yield() { shell_->Suspend(); }

  /**
   * Task side, before anything that may suspend (`op` names it for the message): throws
   * WaitWithoutFiber when the task runs on its worker's stack. Checked before the wait
   * registers anywhere, so nothing is left pointing at a context that cannot resume.
   */
  void RequireFiber(const char *op) const {
    if (CHI_UNLIKELY(on_worker_stack_)) ThrowNoFiber(op);
  }

  /**
   * The TaskNode for a task spawned by this one: same major, fresh minor, this task's
   * depth (IpcManager::Stamp puts a subtask one deeper; a fan-out replica stays).
   */
  TaskNode NextChildNode() { return task_->task_node_.Child(next_minor_++); }
  Worker *GetWorker() const { return worker_; }
  Container *GetContainer() const { return container_; }

 private:
  /** Throws RequireFiber's error, naming the method and its pool (worker.h defines it). */
  [[noreturn]] void ThrowNoFiber(const char *op) const;
};

/** The task fiber running on this thread, or nullptr on a plain thread. */
inline thread_local RunContext *tls_current_rctx = nullptr;
/** The worker owning this thread, or nullptr on a client thread. */
inline thread_local Worker *tls_current_worker = nullptr;

/** The running task's context, or nullptr outside a runtime task. */
inline RunContext *CurrentRunContext() { return tls_current_rctx; }

}  // namespace chi
