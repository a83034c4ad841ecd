// GpuManager: this runtime's GPUs. For each one it maps the pinned and device regions of
// its queues (queue_set.h), keeps its pool table, launches its orchestrator kernel on a
// stream of its own, and runs one GpuWorker thread for all of them. Chimaera starts it
// after the compose pools exist and stops it first; CHI_IPC reaches it from applications.
// It describes the queues to pure clients (ConnectAnswer::gpu_info), and in a pure client
// it holds the attachment to a runtime's queues (gpu_client_queues.h). Each GPU also gets a
// device-memory region for client kernels' CHI_GPU_HEAP, formatted once (FormatGpuHeap),
// and applications may register gpu2cpu queues of their own (RegisterGpuQueue).
// Invariant: no call here waits on a device as a whole, and every wait on the orchestrator
// is bounded: a GPU that does not stop when asked is reported and its memory left mapped,
// never freed under a kernel that may still use it.
#pragma once

#include <unistd.h>  // getpid, getppid

#include <cstdio>         // fprintf of start-up problems
#include <cstring>        // memset of private pinned memory
#include <memory>         // unique_ptr<Device>
#include <mutex>          // start/stop and pool registration are rare and serialised
#include <new>            // placement new: a forked child's fresh locks
#include <string>         // segment names, messages
#include <unordered_map>  // pool -> container binding
#include <vector>         // devices, bindings

#include "chi/core/status.h"             // Status
#include "chi/gpu/gpu_api.h"             // the CUDA/HIP layer
#include "chi/gpu/gpu_device.h"          // GpuDevice: one GPU's memory, streams, orchestrator
#include "chi/gpu/gpu_heap_format.h"     // FormatGpuHeap: the client kernels' heap
#include "chi/gpu/gpu_client_queues.h"   // a pure client's attachment to a runtime's queues
#include "chi/gpu/gpu_connect_info.h"    // describing the queues to clients
#include "chi/gpu/gpu_ipc_ops.h"         // opening clients' IPC handles
#include "chi/gpu/gpu_worker.h"          // GpuWorker, GpuLink, GpuPoolDirectory
#include "chi/gpu/module_registry.h"     // the application's GPU module list
#include "chi/gpu/queue_set.h"           // GpuQueueSet, GpuInfo
#include "chi/memory/memory_registry.h"  // RegisterGpuAllocator
#include "chi/runtime/config.h"          // ServerConfig: gpu_blocks, gpu_threads_per_block, ...
#include "chi/runtime/ipc_manager.h"     // AttachGpuTransport

namespace chi::gpu {

/** Per-thread stack every kernel gets (set once, before the orchestrator starts). */
inline constexpr u64 kGpuStackBytes = 8192;
/** How long Pause/Stop wait for an orchestrator to leave its loop. */
inline constexpr u64 kGpuStopTimeoutNs = 10000000000ull;
/** Alignment of GPU container states in their arena. */
inline constexpr u64 kGpuStateAlign = 256;
/** Device memory per GPU for client kernels' CHI_GPU_HEAP (2048 partitions of ~32 KiB). */
inline constexpr u64 kGpuClientHeapBytes = 64ull << 20;

/** The GPUs of this process's runtime (one instance per process). */
class GpuManager : private GpuPoolDirectory {
 public:
  static GpuManager &Get() {
    static GpuManager instance;
    return instance;
  }

  /**
   * Opens every GPU, launches their orchestrators (when a .cu file registered the GPU
   * modules) and attaches the CPU->GPU transport to `ipc`. A node without GPUs is not an
   * error: GPU routes then fail with the reason. Returns the first problem met.
   */
  Status Start(const ServerConfig &cfg, PoolManager *pools, WorkOrchestrator *orch,
               IpcManager *ipc) {
    std::lock_guard<std::mutex> g(mu_);
    if (started_) return Status::Ok();
    pools_ = pools;
    ipc_ = ipc;
    blocks_ = cfg.gpu_blocks;
    threads_ = cfg.gpu_threads_per_block;
    depth_ = cfg.gpu_queue_depth;
    table_ = GpuModuleRegistry::Get();
    start_error_ = Status::Ok();
    PreferEagerModuleLoading();
    int n = 0;
    std::string reason;
    if (gpus_of_parent_ != 0) {
      reason = ForkedReason();  // no CUDA/HIP call: the driver's state is the parent's
    } else if (const Error e = GetDeviceCount(&n); e != kSuccess || n == 0) {
      reason = std::string("this node has no usable GPU (") +
               (e != kSuccess ? ErrorString(e) : "no device") + ")";
      n = 0;
    }
    for (int i = 0; i < n && start_error_.ok(); ++i) {
      auto d = std::make_unique<Device>();
      start_error_ = OpenDevice(*d, i);
      devices_.push_back(std::move(d));
    }
    if (!start_error_.ok()) {
      reason = start_error_.message();
      CloseDevices();
      std::fprintf(stderr, "chi: GPU start failed: %s\n", start_error_.ToString().c_str());
    }
    std::vector<GpuLink *> links;
    for (auto &d : devices_) links.push_back(&d->link);
    worker_.Start(pools, orch, this, std::move(links), std::move(reason));
    ipc->AttachGpuTransport(&worker_);
    if (!devices_.empty()) {  // release: the devices above are set up before a hook runs
      GpuHooks::Get().runtime_ops.Store(&kRuntimeIpcOps, MemOrder::kRelease);
      GpuHooks::Get().ensure_pool.Store(&EnsurePoolForClient, MemOrder::kRelease);
    }
    started_ = true;
    return start_error_;
  }

  /** Stops the orchestrators and the GpuWorker; waiting CPU->GPU tasks fail with kShutdown. */
  void Stop() {
    std::lock_guard<std::mutex> g(mu_);
    if (!started_) return;
    ipc_->AttachGpuTransport(nullptr);
    // release: a handler that still sees the hooks finds the devices open (workers drained).
    GpuHooks::Get().ensure_pool.Store(nullptr, MemOrder::kRelease);
    ClientMemory().Clear();  // retires every client IPC mapping (unmapped below)
    GpuHooks::Get().runtime_ops.Store(nullptr, MemOrder::kRelease);
    const bool drained = worker_.StopIntake();
    for (auto &d : devices_) {
      d->abort = true;  // waiting kernels give up
      if (d->running) {
        d->StopKernel(kGpuStopTimeoutNs);
      } else {
        d->WriteControl(1);
      }
    }
    worker_.Stop();
    bool all_stopped = true;
    for (auto &d : devices_) all_stopped &= !d->running;
    if (all_stopped) CloseRetired();  // no kernel left for the unmap to wait on
    if (!drained) {
      std::fprintf(stderr, "chi: GPU->CPU tasks still running at stop; GPU queues left mapped\n");
      for (auto &d : devices_) d->wedged = true;
    }
    CloseDevices();
    started_ = false;
  }

  /**
   * In a forked child (Chimaera's fork child handler): the GPUs, their orchestrators, the
   * worker thread, a client's attachment and the IPC mappings are the parent's, and CUDA/HIP
   * state does not survive fork. All are kept untouched, never torn down (KeepInherited):
   * the child's exit joins no thread of the parent's and frees nothing the parent uses. If
   * the parent had GPUs open, a runtime the child starts serves no GPU (GPU tasks fail
   * naming the fork) and a client child sends its GPU tasks through the runtime.
   */
  void ForgetAfterFork() {
    new (&mu_) std::mutex();  // a parent thread may have held these; none of them runs here
    new (&sync_mu_) std::mutex();
    new (&retire_mu_) std::mutex();
    if (!devices_.empty() || client_.NumGpus() != 0) gpus_of_parent_ = static_cast<u32>(getppid());
    // relaxed: the child has one thread while fork handlers run.
    GpuHooks::Get().ensure_pool.Store(nullptr, MemOrder::kRelaxed);
    GpuHooks::Get().runtime_ops.Store(nullptr, MemOrder::kRelaxed);
    ClientMemory().ForgetAfterFork();
    worker_.ForgetAfterFork();
    client_.ForgetAfterFork();
    for (std::unique_ptr<Device> &d : devices_) KeepInherited(std::move(d));
    devices_.clear();
    heaps_.clear();
    retired_.clear();
    pools_ = nullptr;
    ipc_ = nullptr;
    client_ipc_ = nullptr;
    started_ = false;
  }

  /** GPUs in use. */
  u32 NumGpus() const { return static_cast<u32>(devices_.size()); }

  /**
   * ConnectAnswer::gpu_info: the cpu2gpu queues pure clients may attach (GPUs whose queues
   * are in a shareable pinned segment, from GPU 0 on); empty when there are none.
   */
  std::vector<char> DescribeQueuesForClients() const {
    GpuConnectInfo info;
    info.runtime_pid = static_cast<u32>(getpid());
    for (const auto &d : devices_) {
      if (!d->pinned.IsAttached()) break;  // private memory: clients cannot reach it
      GpuQueueAttachInfo g = DescribeCpu2Gpu(static_cast<u32>(d->id), d->set.host.cpu2gpu,
                                             d->pinned.Data());
      g.segment = d->pinned.Name();
      g.segment_size = d->pinned.Size();
      g.segment_version = d->pinned.Header()->version_;
      g.gpu2cpu_slots = d->set.gpu2cpu_slots;
      g.gpu2gpu_slots = d->set.gpu2gpu_slots;
      info.gpus.push_back(std::move(g));
    }
    return EncodeGpuConnectInfo(info);
  }

  /**
   * A pure client: attaches the queues `gpu_info` offers (see GpuClientQueues::Attach). In
   * a child forked from a process that used the GPUs, GPU tasks go through the runtime's
   * transport instead (pinning the queues would need the driver the parent holds).
   */
  Status AttachClientQueues(const std::vector<char> &gpu_info, IpcManager *ipc) {
    client_ipc_ = ipc;
    if (gpus_of_parent_ != 0) return Status::Ok();
    return client_.Attach(gpu_info, ipc);
  }
  /** A pure client: stops using the runtime's GPU queues. */
  void DetachClientQueues() {
    client_.Detach();
    client_ipc_ = nullptr;
  }
  /** A pure client's attachment (NumGpus() == 0 when GPU tasks go through the transport). */
  const GpuClientQueues &ClientQueues() const { return client_; }

  /** IpcManager::RegisterMemory of this process's runtime or runtime connection. */
  Status RegisterMemory(void *ptr, u64 bytes, MemoryType type) {
    IpcManager *ipc = ipc_ != nullptr ? ipc_ : client_ipc_;
    if (ipc == nullptr) return Status::Error(ErrorCode::kShutdown, "chi is not initialised");
    return ipc->RegisterMemory(ptr, bytes, type);
  }

  /** Frees cpu2gpu slots of dead client processes now (the GPU worker also does it). */
  u32 ReapDeadClients() { return worker_.ReapDeadClients(); }
  /** Why Start failed (ok when it did not). */
  Status StartError() const {
    std::lock_guard<std::mutex> g(mu_);
    return start_error_;
  }

  /**
   * Makes every orchestrator leave its loop (waiting, bounded, for each to return), so the
   * SMs are free for other kernels. Tasks posted meanwhile wait in their slots.
   */
  Status PauseGpuOrchestrator() {
    std::lock_guard<std::mutex> g(mu_);
    Status first;
    for (auto &d : devices_) {
      Status st = d->StopKernel(kGpuStopTimeoutNs);
      if (!st.ok() && first.ok()) first = st;
    }
    if (first.ok()) CloseRetired();
    return first;
  }

  /** Relaunches the paused orchestrators; they pick up where they stopped. */
  Status ResumeGpuOrchestrator() {
    std::lock_guard<std::mutex> g(mu_);
    Status first;
    for (auto &d : devices_) {
      if (d->running || d->wedged || table_ == nullptr) continue;
      Status st = d->Launch(*table_, blocks_, threads_);
      if (!st.ok() && first.ok()) first = st;
    }
    return first;
  }

  /**
   * What a kernel on GPU gpu_id needs to submit tasks (pools created so far get their GPU
   * containers now). An unknown GPU gives an empty info: the kernel's submits then fail.
   */
  GpuInfo GetClientGpuInfo(u32 gpu_id) {
    if (gpu_id >= devices_.size()) return GpuInfo();
    Device &d = *devices_[gpu_id];
    {
      std::lock_guard<std::mutex> g(sync_mu_);
      SyncPools(d);
    }
    GpuInfo info = d.set.ClientInfo(gpu_id, static_cast<u32>(getpid()));
    info.heap_ = gpu_id < heaps_.size() ? static_cast<char *>(heaps_[gpu_id]) : nullptr;
    info.heap_bytes_ = info.heap_ != nullptr ? kGpuClientHeapBytes : 0;
    return info;
  }

  /**
   * Has the GPU worker serve `queue`, a gpu2cpu queue the caller made (GpuQueue::Make over
   * its own pinned memory, gpu_clients = true, zeroed): kernels whose GpuInfo::gpu2cpu_ is
   * a device-readable copy of the descriptor submit ToLocalCpu() tasks through it. Errors
   * name the problem (bad geometry, null arrays, too many queues, no GPU runtime).
   */
  Status RegisterGpuQueue(const GpuQueue<MemScope::kSystem> &queue) {
    return worker_.RegisterQueue(queue);
  }
  /**
   * Stops serving a registered queue. After Ok the worker neither polls it nor answers into
   * it, so its memory may be freed; kTimeout while tasks from it still run (call again).
   */
  Status UnregisterGpuQueue(const GpuQueue<MemScope::kSystem> &queue) {
    return worker_.UnregisterQueue(queue);
  }
  /** The seed's AssignGpuLanesToWorker: registered queues are served at once, so only Ok. */
  Status AssignGpuLanesToWorker() { return Status::Ok(); }

  /** The gpu2gpu queue of GPU gpu_id (a device address), or nullptr. */
  GpuQueue<MemScope::kDevice> *GetGpuToGpuQueue(u32 gpu_id) const {
    return gpu_id < devices_.size() ? &devices_[gpu_id]->set.device->gpu2gpu : nullptr;
  }

  /** Lets the host resolve ShmPtrs of allocator `id` into GPU-visible memory at `data`. */
  Status RegisterGpuAllocator(AllocatorId id, void *data, u64 capacity) {
    return MemoryRegistry::Get().Register(id, data, capacity);
  }

  /**
   * Frees the slots that client kernels of GPU gpu_id hold (a kernel that died holding
   * one). Call only while none of this process's client kernels runs on that GPU; each
   * slot is reused once its last request has been answered.
   */
  Status ReclaimGpuSlots(u32 gpu_id) {
    if (gpu_id >= devices_.size()) return Status::Error(ErrorCode::kInvalidArgument, "no such GPU");
    std::lock_guard<std::mutex> g(sync_mu_);
    return devices_[gpu_id]->ReclaimClientSlots();
  }

  /** Slots of GPU gpu_id's gpu2gpu and gpu2cpu queues that clients hold right now. */
  Status CountHeldSlots(u32 gpu_id, u32 *gpu2gpu, u32 *gpu2cpu) {
    if (gpu_id >= devices_.size()) return Status::Error(ErrorCode::kInvalidArgument, "no such GPU");
    std::lock_guard<std::mutex> g(sync_mu_);
    return devices_[gpu_id]->CountHeldSlots(gpu2gpu, gpu2cpu);
  }

  /** Copies the GPU container of `pool` on GPU gpu_id back to the host (tests, stats). */
  template <typename GpuRuntimeT>
  Status ReadGpuContainer(u32 gpu_id, PoolId pool, GpuRuntimeT *out) {
    if (gpu_id >= devices_.size()) return Status::Error(ErrorCode::kInvalidArgument, "no such GPU");
    Device &d = *devices_[gpu_id];
    std::lock_guard<std::mutex> g(sync_mu_);
    auto it = d.bindings.find(pool.ToU64());
    if (it == d.bindings.end()) {
      return Status::Errorf(ErrorCode::kUnknownPool, "pool %s has no container on GPU %u",
                            pool.ToString().c_str(), gpu_id);
    }
    const DeviceScope scope(d.id);  // the caller keeps its own GPU
    Status st = scope.status();
    if (st.ok())
      st = Check(MemcpyAsync(out, it->second.state, sizeof(GpuRuntimeT), d.copies),
                 "read GPU container");
    if (st.ok()) st = Check(StreamSynchronize(d.copies), "read GPU container");
    return st;
  }

  /** Diagnostic: raw request bytes to GPU gpu_id's orchestrator, raw answer back. */
  Status RawRequest(u32 gpu_id, const char *bytes, u32 len, std::vector<char> *answer,
                    u64 timeout_ns) {
    return worker_.RawRoundTrip(gpu_id, bytes, len, answer, timeout_ns);
  }

 private:
  using Device = GpuDevice;

  GpuManager() = default;

  /** The instance, made before main: a fork while another thread made it would leave the
   * child waiting forever on its construction guard (Chimaera's handler calls Get). */
  static inline GpuManager &made_ = Get();

  /** Why a forked child's runtime serves no GPU (fits a task's message). */
  std::string ForkedReason() const {
    return "no GPU here: forked from process " + std::to_string(gpus_of_parent_) +
           ", which had GPUs open (CUDA/HIP do not survive fork)";
  }

  /** GpuIpcOps::copy_to_host: on the device's copy stream (never a device-wide wait). */
  static Status CopyToHostHook(u32 device, void *dst, const void *src, u64 bytes) {
    GpuManager &m = Get();
    if (device >= m.devices_.size()) {
      return Status::Errorf(ErrorCode::kInvalidArgument, "no GPU %u in this runtime", device);
    }
    Device &d = *m.devices_[device];
    std::lock_guard<std::mutex> g(m.sync_mu_);
    const DeviceScope scope(d.id);  // the caller keeps its own GPU
    Status st = scope.status();
    if (st.ok()) st = Check(MemcpyAsync(dst, src, bytes, d.copies), "read client memory");
    if (st.ok()) st = Check(StreamSynchronize(d.copies), "read client memory");
    return st;
  }

  /** GpuHooks::ensure_pool: admin GpuAttachPool from a directly attached client. */
  static Status EnsurePoolForClient(u32 gpu_id, PoolId pool) {
    GpuManager &m = Get();
    if (gpu_id >= m.devices_.size()) {
      return Status::Errorf(ErrorCode::kInvalidArgument, "no GPU %u in this runtime", gpu_id);
    }
    return m.EnsurePool(gpu_id, pool);
  }
  /**
   * GpuIpcOps::close. Unmapping an IPC handle may wait for the whole device (seen on an
   * H200: it never returned under a running orchestrator), so the mapping is only retired
   * here and unmapped once the orchestrators have stopped (Pause or Stop).
   */
  static void RetireIpcMapping(u32 device, void *base) {
    GpuManager &m = Get();
    std::lock_guard<std::mutex> g(m.retire_mu_);
    m.retired_.push_back(Retired{device, base});
  }

  /** Unmaps the retired IPC mappings (call only while no orchestrator runs). */
  void CloseRetired() {
    std::lock_guard<std::mutex> g(retire_mu_);
    for (const Retired &r : retired_) CloseIpcHandle(r.device, r.base);
    retired_.clear();
  }

  static inline const GpuIpcOps kRuntimeIpcOps{&OpenIpcHandle, &RetireIpcMapping,
                                               &CopyToHostHook};

  /** Maps GPU i's regions, carves its queues and launches its orchestrator. */
  Status OpenDevice(Device &d, int i) {
    d.id = i;
    const DeviceScope scope(d.id);  // the caller keeps its own GPU
    if (!scope.status().ok()) return scope.status();
    u64 stack = kGpuStackBytes;
    if (table_ != nullptr) {
      u64 frame = 0;
      if (Status st = Check(static_cast<Error>(table_->kernel_stack_bytes(&frame)),
                            "load the orchestrator kernel");
          !st.ok()) {
        return st;
      }
      if (frame + 1024 > stack) stack = frame + 1024;
      u32 resident = 0;
      if (Status st = Check(static_cast<Error>(table_->max_resident_blocks(threads_, &resident)),
                            "orchestrator occupancy");
          !st.ok()) {
        return st;
      }
      if (blocks_ > resident) {
        return Status::Errorf(ErrorCode::kBadConfig,
                              "gpu.blocks %u x gpu.threads_per_block %u cannot all be resident on "
                              "GPU %d (at most %u blocks): a persistent kernel needs every block "
                              "running",
                              blocks_, threads_, i, resident);
      }
    }
    if (Status st = Check(SetStackLimit(stack), "set the GPU stack size"); !st.ok()) return st;
    GpuQueueConfig qc;
    qc.server_threads = blocks_ * threads_;
    qc.depth = depth_;
    if (Status st = d.Map(qc); !st.ok()) return st;
    void *heap = nullptr;  // formatted here, once: kernels only pick partitions
    Status heap_st = Check(Malloc(&heap, kGpuClientHeapBytes), "GPU client heap");
    if (heap_st.ok()) heap_st = FormatGpuHeap(heap, kGpuClientHeapBytes, 0, d.copies);
    if (!heap_st.ok()) {
      std::fprintf(stderr, "chi: GPU %d has no CHI_GPU_HEAP: %s\n", i, heap_st.message());
      if (heap != nullptr) Free(heap);  // before this GPU's orchestrator starts
      heap = nullptr;
    }
    heaps_.resize(static_cast<size_t>(i) + 1, nullptr);
    heaps_[i] = heap;
    {
      std::lock_guard<std::mutex> g(sync_mu_);
      if (Status s2 = SyncPools(d); !s2.ok()) return s2;  // compose pools, before the launch
    }
    return table_ != nullptr ? d.Launch(*table_, blocks_, threads_) : Status::Ok();
  }

  /** Frees every device (leaking, on purpose, those a kernel may still use). */
  void CloseDevices() {
    for (size_t i = 0; i < heaps_.size(); ++i) {
      if (heaps_[i] == nullptr || (i < devices_.size() && devices_[i]->wedged)) continue;
      const DeviceScope scope(static_cast<int>(i));  // the caller keeps its own GPU
      Free(heaps_[i]);
    }
    heaps_.clear();
    for (auto &d : devices_) {
      if (d->wedged) {
        d.release();  // a kernel may still touch its memory: never free it
        continue;
      }
      d->Release();
    }
    devices_.clear();
  }

  /**
   * Gives every pool whose module has a GPU runtime a container on d, drops those of
   * destroyed pools, and republishes d's pool table. Caller holds sync_mu_.
   */
  Status SyncPools(Device &d) {
    if (table_ == nullptr || pools_ == nullptr) return Status::Ok();
    std::vector<GpuPoolBinding> next;
    std::unordered_map<u64, GpuPoolBinding> kept;
    Status first;
    for (const PoolStats &p : pools_->Stats()) {
      const int module = table_->find_module(p.module_name_);
      if (module < 0 || next.size() == kMaxGpuPools) continue;
      const u64 key = p.id_.ToU64();
      auto it = d.bindings.find(key);
      GpuPoolBinding b{};
      if (it != d.bindings.end()) {
        b = it->second;
      } else if (Status st = MakeContainer(d, p.id_, static_cast<u32>(module), &b); !st.ok()) {
        if (first.ok()) first = st;
        continue;
      }
      kept[key] = b;
      next.push_back(b);
    }
    d.bindings = std::move(kept);
    const u32 v = d.shadow.version_.Load(MemOrder::kRelaxed) + 1;  // relaxed: host-private copy
    d.shadow.Fill(v, next.data(), static_cast<u32>(next.size()));
    d.shadow.version_.Store(v, MemOrder::kRelaxed);
    const DeviceScope scope(d.id);  // the caller keeps its own GPU
    Status st = scope.status();
    if (st.ok()) {
      st = Check(MemcpyAsync(d.set.pools->tables_[v & 1], d.shadow.tables_[v & 1],
                             sizeof(d.shadow.tables_[0]), d.copies),
                 "write the GPU pool table");
    }
    if (st.ok()) st = Check(StreamSynchronize(d.copies), "write the GPU pool table");
    if (st.ok()) {  // the idle copy is complete on the GPU: now make it the live one
      st = Check(MemcpyAsync(&d.set.pools->version_, &d.shadow.version_, sizeof(u32), d.copies),
                 "publish the GPU pool table");
    }
    if (st.ok()) st = Check(StreamSynchronize(d.copies), "publish the GPU pool table");
    for (u32 i = 0; i < kMaxGpuPools; ++i) {
      // relaxed: a stale read only sends EnsurePool to this (locked) slow path again.
      d.known[i].Store(i < next.size() ? next[i].pool.ToU64() : 0, MemOrder::kRelaxed);
    }
    return st.ok() ? first : st;
  }

  /** Builds module `module`'s initial container for `pool` and copies it into d's arena. */
  Status MakeContainer(Device &d, PoolId pool, u32 module, GpuPoolBinding *out) {
    const u64 bytes = table_->state_bytes(module);
    const u64 at = (d.arena_used + kGpuStateAlign - 1) / kGpuStateAlign * kGpuStateAlign;
    if (at + bytes > d.set.arena_bytes) {
      return Status::Errorf(ErrorCode::kOutOfMemory, "GPU %d has no room for pool %s's container",
                            d.id, pool.ToString().c_str());
    }
    std::vector<u64> host((bytes + 7) / 8 + 1);
    table_->construct_state(module, host.data());
    const DeviceScope scope(d.id);  // the caller keeps its own GPU
    Status st = scope.status();
    if (st.ok()) {
      st = Check(MemcpyAsync(d.set.arena + at, host.data(), bytes, d.copies), "copy GPU container");
    }
    if (st.ok()) st = Check(StreamSynchronize(d.copies), "copy GPU container");
    if (!st.ok()) return st;
    d.arena_used = at + bytes;
    *out = GpuPoolBinding{pool, module, d.set.arena + at};
    return Status::Ok();
  }

  /** GpuPoolDirectory: does GPU gpu_id serve `pool`? Registers it on first use. */
  Status EnsurePool(u32 gpu_id, PoolId pool) override {
    Device &d = *devices_[gpu_id];
    const u64 key = pool.ToU64();
    if (!pools_->Contains(pool)) {
      return Status::Errorf(ErrorCode::kUnknownPool, "pool %s does not exist",
                            pool.ToString().c_str());
    }
    for (u32 i = 0; i < kMaxGpuPools; ++i) {
      if (d.known[i].Load(MemOrder::kRelaxed) == key) return Status::Ok();  // relaxed: a hint
    }
    if (table_ == nullptr) {
      return Status::Error(ErrorCode::kUnsupported,
                           "no GPU modules were registered: add CHI_GPU_MODULES(...) to one .cu "
                           "file of the application");
    }
    std::lock_guard<std::mutex> g(sync_mu_);
    Status st = SyncPools(d);
    for (u32 i = 0; i < kMaxGpuPools; ++i) {
      if (d.known[i].Load(MemOrder::kRelaxed) == key) return Status::Ok();
    }
    if (!st.ok()) return st;
    return Status::Errorf(ErrorCode::kUnsupported,
                          "pool %s has no GPU container: its module is not in CHI_GPU_MODULES",
                          pool.ToString().c_str());
  }

  mutable std::mutex mu_;  ///< Start, Stop, Pause, Resume
  std::mutex sync_mu_;     ///< pool tables and copies
  bool started_ = false;
  Status start_error_;
  PoolManager *pools_ = nullptr;
  IpcManager *ipc_ = nullptr;
  const GpuModuleTable *table_ = nullptr;
  u32 blocks_ = 1;
  u32 threads_ = 32;
  u32 depth_ = 256;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<void *> heaps_;  ///< per GPU: CHI_GPU_HEAP's region (nullptr: none)
  GpuWorker worker_;
  struct Retired {
    u32 device;
    void *base;
  };
  std::mutex retire_mu_;          ///< retired_ (IPC closes come from worker threads)
  std::vector<Retired> retired_;  ///< client IPC mappings waiting for the kernels to stop
  GpuClientQueues client_;             ///< a pure client's attachment (empty in a runtime)
  IpcManager *client_ipc_ = nullptr;   ///< a pure client's IpcManager
  u32 gpus_of_parent_ = 0;  ///< in a forked child: the parent's pid, when it had GPUs open
};

}  // namespace chi::gpu

/**
 * The seed's entry point for GPU set-up calls (GetClientGpuInfo, PauseGpuOrchestrator,
 * ResumeGpuOrchestrator, RegisterGpuAllocator, RegisterGpuQueue, GetGpuToGpuQueue, ...).
 */
#ifndef CHI_IPC
#define CHI_IPC (&::chi::gpu::GpuManager::Get())
#endif
