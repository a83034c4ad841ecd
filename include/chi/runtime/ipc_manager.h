// IpcManager: how a client hands tasks to the runtime. It stamps each task's
// identity (TaskId, TaskNode: a subtask keeps its parent's major) and submits
// it to the embedded runtime's WorkOrchestrator (or a pure client's transport, or the GPU
// transport for LocalGpuBcast/ToLocalGpu), returning a Future. A task that cannot be
// submitted still yields a completed Future carrying the error. RegisterMemory tells the
// runtime about memory its handlers may read (admin RegisterMemory).
#pragma once

#include <sys/prctl.h>  // PR_SET_PTRACER: the runtime may read registered host memory
#include <unistd.h>     // getpid

#include "chi/core/atomic.h"                // id counters
#include "chi/core/status.h"                // ErrorCode
#include "chi/gpu/gpu_ipc_cache.h"          // MemoryType, MemoryRegistration, GpuHooks
#include "chi/mods/admin/admin_tasks.h"     // RegisterMemoryTask
#include "chi/runtime/run_context.h"        // CurrentRunContext
#include "chi/runtime/runtime_limits.h"     // kDefaultMaxSubtaskDepth
#include "chi/runtime/work_orchestrator.h"  // WorkOrchestrator
#include "chi/task/future.h"                // Future
#include "chi/task/task_ops.h"              // NewTask, CompleteTask
#include "chi/transport/transport.h"        // ClientTransport for pure clients

namespace chi {

/** The process's entry point for submitting tasks. */
class IpcManager {
 public:
  /**
   * Connects the manager to an embedded runtime (nullptr detaches it) whose subtasks may
   * nest max_subtask_depth deep (limits.max_subtask_depth).
   */
  void AttachRuntime(WorkOrchestrator *orch, NodeId node,
                     u32 max_subtask_depth = kDefaultMaxSubtaskDepth) {
    node_ = node;
    pid_ = static_cast<u32>(getpid());
    forked_from_ = 0;
    max_subtask_depth_ = max_subtask_depth;
    orch_.Store(orch, MemOrder::kRelease);  // release: node_/pid_ are set before use
  }
  /** Routes every task through a transport to a runtime in another process (nullptr detaches). */
  void AttachTransport(ClientTransport *transport, NodeId node) {
    node_ = node;
    pid_ = static_cast<u32>(getpid());
    forked_from_ = 0;
    transport_.Store(transport, MemOrder::kRelease);
  }
  /**
   * In a child made by fork from process `parent`: the runtime and transports attached
   * there are the parent's. Detaches them without touching them; until CHIMAERA_INIT runs
   * in the child, each task fails saying so.
   */
  void ForgetAfterFork(u32 parent) {
    // relaxed: the child has one thread while fork handlers run.
    orch_.Store(nullptr, MemOrder::kRelaxed);
    transport_.Store(nullptr, MemOrder::kRelaxed);
    gpu_transport_.Store(nullptr, MemOrder::kRelaxed);
    forked_from_ = parent;
  }
  /** Hands LocalGpuBcast / ToLocalGpu tasks to the GPU manager's transport (nullptr detaches). */
  void AttachGpuTransport(ClientTransport *gpu) { gpu_transport_.Store(gpu, MemOrder::kRelease); }
  /** Where requests from other processes for GPU routes go (RequestDispatcher::RouteGpuTo). */
  const Atomic<ClientTransport *> *GpuRoute() const { return &gpu_transport_; }
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

  /**
   * Stamps identity fields on a task before it is sent. A root task's node is (its
   * unique id, 0) at depth 0, which the compact routing header then leaves out; a
   * subtask's is in its parent's group, one level deeper. False when that passes
   * max_subtask_depth: the task then carries kTooDeep, and must be completed, not sent.
   */
  bool Stamp(Task *t) {
    const u64 unique = NextUnique();
    t->task_id_ = TaskId{node_, pid_, unique};
    if (RunContext *parent = CurrentRunContext()) {
      t->task_node_ = parent->NextChildNode();  // same major: CoMutex re-entry
      // The parent's node was just read, and the bound lies beside node_ and pid_.
      if (CHI_UNLIKELY(++t->task_node_.depth_ > max_subtask_depth_)) return RefuseTooDeep(t);
    } else {
      t->task_node_ = TaskNode(unique, 0);
    }
    return true;
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

  /**
   * Tells the runtime about [ptr, ptr + bytes) so that its handlers can read it
   * (chi::gpu::ClientMemory().Translate/Read with this process's pid). kGpuDeviceMemory:
   * the allocation's CUDA/HIP IPC handle travels in an admin RegisterMemory task; the
   * runtime opens it on first use and caches it (re-registering the address with another
   * allocation replaces it; a dead client's entries are dropped). Host memory of a pure
   * client is copied by the runtime with process_vm_readv, which the kernel allows when
   * the runtime may trace this process (the same user, and ptrace_scope permitting).
   * The runtime registers memory for the process its transport identifies: over tcp it
   * cannot, and answers kPermissionDenied (use shm or ipc).
   * Errors: kInvalidArgument (null, zero size, not device memory, past the allocation's
   * end), kUnsupported (no GPU layer here or in the runtime), kPermissionDenied, kTimeout.
   */
  Status RegisterMemory(void *ptr, u64 bytes, gpu::MemoryType type, float timeout_sec = 30) {
    if (ptr == nullptr || bytes == 0) {
      return Status::Error(ErrorCode::kInvalidArgument, "RegisterMemory: null pointer or zero size");
    }
    if (static_cast<u32>(type) > static_cast<u32>(gpu::MemoryType::kGpuDeviceMemory)) {
      return Status::Errorf(ErrorCode::kInvalidArgument, "RegisterMemory: unknown memory type %u",
                            static_cast<u32>(type));
    }
    gpu::MemoryRegistration reg;
    reg.pid = static_cast<u32>(getpid());
    reg.type = type;
    reg.address = reinterpret_cast<u64>(ptr);
    reg.bytes = bytes;
    if (type == gpu::MemoryType::kGpuDeviceMemory) {
      gpu::DescribeDeviceMemoryFn describe = gpu::GpuHooks::Get().describe.Load(MemOrder::kAcquire);
      if (describe == nullptr) {
        return Status::Error(ErrorCode::kUnsupported,
                             "RegisterMemory(kGpuDeviceMemory): this program was built without "
                             "CUDA/HIP (CHIMAERA_ENABLE_CUDA / CHIMAERA_ENABLE_ROCM)");
      }
      if (Status st = describe(ptr, bytes, &reg); !st.ok()) return st;
    } else {
      AllowRuntimeToRead();
    }
    auto *t = NewTask<chimaera::admin::RegisterMemoryTask>(reg);
    if (t == nullptr) return Status::Error(ErrorCode::kOutOfMemory, "RegisterMemory task");
    t->pool_id_ = kAdminPoolId;
    t->pool_query_ = PoolQuery::Local();
    t->method_ = chimaera::admin::Method::kRegisterMemory;
    Future<chimaera::admin::RegisterMemoryTask> f = Send(t);
    if (!f.Wait(timeout_sec)) {
      return Status::Error(ErrorCode::kTimeout, "RegisterMemory: the runtime did not answer");
    }
    if (f->GetReturnCode() != 0) {
      return Status::Error(static_cast<ErrorCode>(f->GetReturnCode()), f->GetMessage());
    }
    return Status::Ok();
  }

  /**
   * Lets the runtime this pure client talks to copy its memory where the kernel restricts
   * that to a process's ancestors (Yama's ptrace_scope 1): registering host memory asks the
   * runtime to read it. Nothing to do for an embedded runtime (the same process).
   */
  void AllowRuntimeToRead() const {
    ClientTransport *tr = transport_.Load(MemOrder::kAcquire);
    const u32 runtime = orch_.Load(MemOrder::kAcquire) == nullptr && tr != nullptr
                            ? tr->RuntimePid()
                            : 0;
    // Fails harmlessly (EINVAL) where the kernel has no Yama: any process of ours may.
    if (runtime != 0) (void)prctl(PR_SET_PTRACER, static_cast<unsigned long>(runtime), 0, 0, 0);
  }

  /** Requests a periodic task to stop after its current run. */
  static void Cancel(Task *t) {
    t->state_.FetchOr(task_state::kCancelRequested, MemOrder::kRelease);
  }

 private:
  void SendRaw(Task *t) {
    if (CHI_UNLIKELY(!Stamp(t))) {
      CompleteTask(t);  // its parent sees kTooDeep, as from a handler
      return;
    }
    if (t->pool_query_.IsGpuRoute()) {
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
      if (orch == nullptr && forked_from_ != 0) {
        // A task's message holds 95 characters: this one fits with any pid.
        t->SetErrorf(ErrorCode::kShutdown,
                     "forked from process %u after CHIMAERA_INIT there: call "
                     "chi::CHIMAERA_INIT in this process",
                     forked_from_);
      } else {
        t->SetError(ErrorCode::kShutdown,
                    "no runtime: call chi::CHIMAERA_INIT(chi::ChimaeraMode::kClient, true) first");
      }
      CompleteTask(t);
    }
  }

  /** Stamp's refusal of a subtask past max_subtask_depth_: sets kTooDeep, returns false. */
  CHI_NOINLINE bool RefuseTooDeep(Task *t) const {
    t->SetErrorf(ErrorCode::kTooDeep, "subtask at depth %u exceeds limits.max_subtask_depth = %u",
                 t->task_node_.depth_, max_subtask_depth_);
    return false;
  }

  Atomic<WorkOrchestrator *> orch_{nullptr};  ///< null when no runtime is attached
  Atomic<ClientTransport *> transport_{nullptr};  ///< pure clients: the way to the runtime
  Atomic<ClientTransport *> gpu_transport_{nullptr};  ///< CPU -> GPU routes (GPU builds)
  NodeId node_ = 0;
  u32 pid_ = 0;
  u32 forked_from_ = 0;  ///< the parent's pid in a forked child until it attaches its own
  u32 max_subtask_depth_ = kDefaultMaxSubtaskDepth;  ///< limits.max_subtask_depth
  /**
   * Task ids a thread takes from the shared counter at once: a submit then costs no
   * shared read-modify-write, and threads submitting side by side do not pass the
   * counter's line between them for every task.
   */
  static constexpr u64 kIdBlock = 1024;

  /** This thread's ids still to hand out, and the manager they came from. */
  struct IdBlock {
    u64 instance = 0;  ///< the manager's instance_ (0: none yet)
    u64 next = 0;
    u64 end = 0;
  };

  /** A process-unique id for a task of this manager (unique, not ordered across threads). */
  u64 NextUnique() {
    thread_local IdBlock block;
    if (CHI_UNLIKELY(block.instance != instance_ || block.next == block.end)) {
      block.instance = instance_;
      // relaxed: only the counter's atomicity matters; the ids carry no other data.
      block.next = next_unique_.FetchAdd(kIdBlock, MemOrder::kRelaxed);
      block.end = block.next + kIdBlock;
    }
    return block.next++;
  }

  /** Numbers the managers of this process, so a thread's block never outlives its own. */
  static u64 NewInstance() {
    static Atomic<u64> instances{0};
    return instances.FetchAdd(1, MemOrder::kRelaxed) + 1;  // relaxed: only uniqueness
  }

  Atomic<u64> next_unique_{1};
  const u64 instance_ = NewInstance();
};

}  // namespace chi
