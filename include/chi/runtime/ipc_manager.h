// IpcManager: how a client hands tasks to the runtime. It stamps each task's
// identity (TaskId, TaskNode: a subtask keeps its parent's major) and submits
// it to the embedded runtime's WorkOrchestrator, returning a Future. A task
// that cannot be submitted still yields a completed Future carrying the error.
#pragma once

#include <unistd.h>  // getpid

#include "chi/core/atomic.h"                // id counters
#include "chi/core/status.h"                // ErrorCode
#include "chi/runtime/run_context.h"        // CurrentRunContext
#include "chi/runtime/work_orchestrator.h"  // WorkOrchestrator
#include "chi/task/future.h"                // Future
#include "chi/task/task_ops.h"              // NewTask, CompleteTask
#include "chi/transport/transport.h"        // ClientTransport for pure clients

namespace chi {

/** The process's entry point for submitting tasks. */
class IpcManager {
 public:
  /** Connects the manager to an embedded runtime (nullptr detaches it). */
  void AttachRuntime(WorkOrchestrator *orch, NodeId node) {
    node_ = node;
    pid_ = static_cast<u32>(getpid());
    orch_.Store(orch, MemOrder::kRelease);  // release: node_/pid_ are set before use
  }
  /** Routes every task through a transport to a runtime in another process (nullptr detaches). */
  void AttachTransport(ClientTransport *transport, NodeId node) {
    node_ = node;
    pid_ = static_cast<u32>(getpid());
    transport_.Store(transport, MemOrder::kRelease);
  }
  /** Hands LocalGpuBcast / ToLocalGpu tasks to the GPU manager's transport (nullptr detaches). */
  void AttachGpuTransport(ClientTransport *gpu) { gpu_transport_.Store(gpu, MemOrder::kRelease); }
  /** True when tasks can currently be submitted. */
  bool IsConnected() const {
    WorkOrchestrator *orch = orch_.Load(MemOrder::kAcquire);
    return (orch != nullptr && orch->IsAccepting()) ||
           transport_.Load(MemOrder::kAcquire) != nullptr;
  }
  NodeId GetNodeId() const { return node_; }

  /** Allocates a task; pair with Send (or DeleteTask if never sent). */
  template <typename T, typename... Args>
  T *NewTask(Args &&...args) {
    return chi::NewTask<T>(std::forward<Args>(args)...);
  }

  /** Stamps identity fields on a task before it is sent. */
  void Stamp(Task *t) {
    t->task_id_ = TaskId{node_, pid_, next_unique_.FetchAdd(1, MemOrder::kRelaxed)};
    if (RunContext *parent = CurrentRunContext()) {
      t->task_node_ = parent->NextChildNode();  // same major: CoMutex re-entry
    } else {
      t->task_node_ = TaskNode(next_major_.FetchAdd(1, MemOrder::kRelaxed), 0);
    }
  }

  /** Submits a task and returns the future that owns it. */
  template <typename T>
  Future<T> Send(T *t) {
    SendRaw(t);
    return Future<T>(t);
  }

  /** Submits a task nobody will wait for; the runtime frees it. */
  void SendFireAndForget(Task *t) {
    t->task_flags_.SetBits(TASK_FIRE_AND_FORGET);
    SendRaw(t);
  }

  /** Requests a periodic task to stop after its current run. */
  static void Cancel(Task *t) {
    t->state_.FetchOr(task_state::kCancelRequested, MemOrder::kRelease);
  }

 private:
  void SendRaw(Task *t) {
    Stamp(t);
    const RoutingMode mode = t->pool_query_.GetMode();
    if (mode == RoutingMode::kLocalGpuBcast || mode == RoutingMode::kToLocalGpu) {
      ClientTransport *gpu = gpu_transport_.Load(MemOrder::kAcquire);
      if (gpu != nullptr && gpu->Send(t)) return;  // CPU -> GPU: the GPU manager answers
    }
    WorkOrchestrator *orch = orch_.Load(MemOrder::kAcquire);
    if (orch == nullptr) {
      if (ClientTransport *tr = transport_.Load(MemOrder::kAcquire); tr != nullptr && tr->Send(t)) {
        return;
      }
    }
    if (CHI_UNLIKELY(orch == nullptr || !orch->Submit(t))) {
      t->SetError(ErrorCode::kShutdown,
                  "no runtime: call chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true) first");
      CompleteTask(t);
    }
  }

  Atomic<WorkOrchestrator *> orch_{nullptr};  ///< null when no runtime is attached
  Atomic<ClientTransport *> transport_{nullptr};  ///< pure clients: the way to the runtime
  Atomic<ClientTransport *> gpu_transport_{nullptr};  ///< CPU -> GPU routes (GPU builds)
  NodeId node_ = 0;
  u32 pid_ = 0;
  Atomic<u64> next_unique_{1};
  Atomic<u64> next_major_{1};
};

}  // namespace chi
