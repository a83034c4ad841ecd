// A pure client's direct way to the runtime's GPUs: from the handshake's GPU blob it attaches
// each GPU's pinned queue segment (POSIX shm, registered with the driver here too), rebases
// the cpu2gpu queue onto its own mapping and runs a client-mode GpuWorker over it, so that
// LocalGpuBcast / ToLocalGpu tasks go straight to the runtime's orchestrators, with no CPU
// hop through the runtime. The orchestrators stay in the runtime process.
// MPS: this process only writes pinned memory and polls it from the CPU; it never runs a
// kernel for the route. Without MPS, two processes that both run kernels on one GPU
// time-slice (~4.5 ms per round trip measured), so keep GPU polling in the runtime.
// Invariant: a client's claims live in the shared segment with its pid (host_slots.h), so a
// client that dies holding slots loses them to the runtime's reaper, never forever.
#pragma once

#include <cstdio>  // fprintf of why the direct route is not used
#include <memory>  // per-GPU attachments
#include <string>  // messages
#include <vector>  // attachments, links

#include "chi/core/fork_epoch.h"           // KeepInherited: a forked child's inherited attachment
#include "chi/core/status.h"               // Status
#include "chi/gpu/gpu_api.h"               // PinnedShmBackend (via gpu_backend.h)
#include "chi/gpu/gpu_connect_info.h"      // GpuConnectInfo, RebaseCpu2Gpu
#include "chi/gpu/gpu_container.h"         // kMaxGpuPools
#include "chi/gpu/gpu_worker.h"            // GpuWorker, GpuLink, GpuPoolDirectory
#include "chi/mods/admin/admin_tasks.h"    // GpuAttachPoolTask
#include "chi/runtime/ipc_manager.h"       // AttachGpuTransport, the admin round trip

namespace chi::gpu {

/** This client process's attachment to the runtime's GPU queues. */
class GpuClientQueues : private GpuPoolDirectory {
 public:
  GpuClientQueues() = default;
  ~GpuClientQueues() { Detach(); }
  GpuClientQueues(const GpuClientQueues &) = delete;
  GpuClientQueues &operator=(const GpuClientQueues &) = delete;

  /**
   * Attaches the GPUs `blob` (ConnectAnswer::gpu_info) offers and routes `ipc`'s GPU tasks
   * to them. An empty blob is not an error (no GPU queues: GPU tasks keep going to the
   * runtime through the transport); a failure leaves nothing attached.
   */
  Status Attach(const std::vector<char> &blob, IpcManager *ipc) {
    Detach();
    GpuConnectInfo info;
    if (Status st = DecodeGpuConnectInfo(blob, &info); !st.ok()) return st;
    for (u32 i = 0; i < info.gpus.size(); ++i) {
      const GpuQueueAttachInfo &g = info.gpus[i];
      if (g.gpu_id != i) break;  // ToLocalGpu(id) indexes the links: only a 0..n-1 prefix
      auto a = std::make_unique<Attached>();
      if (Status st = a->Map(g); !st.ok()) {
        gpus_.clear();
        return st;
      }
      gpus_.push_back(std::move(a));
    }
    if (gpus_.empty()) return Status::Ok();
    std::vector<GpuLink *> links;
    for (auto &a : gpus_) links.push_back(&a->link);
    ipc_ = ipc;
    worker_.Start(nullptr, nullptr, this, std::move(links), "", false);
    ipc->AttachGpuTransport(&worker_);
    return Status::Ok();
  }

  /**
   * Stops the direct route: GPU tasks still waiting fail with kShutdown. Slots whose
   * answers had not come stay claimed by this pid until the process exits (the runtime
   * reaps them then): the GPU may still write their payloads.
   */
  void Detach() {
    if (ipc_ != nullptr) ipc_->AttachGpuTransport(nullptr);
    if (!gpus_.empty()) {
      worker_.StopIntake();
      worker_.Stop();
    }
    gpus_.clear();
    ipc_ = nullptr;
  }

  /**
   * In a forked child: the attachment, its worker thread and the slots it holds are the
   * parent's. All kept untouched (KeepInherited), so the child's exit neither joins the
   * parent's thread nor unpins or unmaps what the parent still uses.
   */
  void ForgetAfterFork() {
    worker_.ForgetAfterFork();
    for (std::unique_ptr<Attached> &a : gpus_) KeepInherited(std::move(a));
    gpus_.clear();
    ipc_ = nullptr;
  }

  /** GPUs attached (0: GPU tasks go through the runtime's transport). */
  u32 NumGpus() const { return static_cast<u32>(gpus_.size()); }
  /** GPU gpu's cpu2gpu queue as this process maps it (gpu < NumGpus()). */
  const GpuQueue<MemScope::kSystem> &Cpu2Gpu(u32 gpu) const { return gpus_[gpu]->link.cpu2gpu; }
  /** What the runtime announced for GPU gpu (gpu < NumGpus()). */
  const GpuQueueAttachInfo &Info(u32 gpu) const { return gpus_[gpu]->info; }
  /** True when GPU gpu's segment is also pinned in this process. */
  bool Pinned(u32 gpu) const { return gpus_[gpu]->pinned.IsAttached(); }
  /** Tasks posted straight into a cpu2gpu queue so far. */
  u64 Posted() const { return worker_.Posted(); }

 private:
  /** One GPU's mapping and link. */
  struct Attached {
    GpuQueueAttachInfo info;
    PinnedShmBackend pinned;  ///< the segment, registered with the driver here
    PosixShmBackend plain;    ///< the segment unpinned, where this process cannot pin it
    GpuLink link;
    std::unique_ptr<Atomic<u64>[]> known;  ///< pools the runtime has set up on this GPU

    /** Attaches and checks the segment, then rebases the queue onto it. */
    Status Map(const GpuQueueAttachInfo &g) {
      info = g;
      if (g.segment_version != kBackendVersion) {
        return Status::Errorf(ErrorCode::kVersionMismatch,
                              "GPU queue segment '%s' has layout version %u; this client "
                              "understands %u",
                              g.segment.c_str(), g.segment_version, kBackendVersion);
      }
      // Pinning here is not needed for correctness (the runtime pinned the pages); it lets
      // this process's own kernels reach the queue and matches the runtime's mapping.
      PosixShmBackend *seg = &pinned;
      if (Status st = pinned.Attach(g.segment); !st.ok()) {
        if (Status st2 = plain.Attach(g.segment); !st2.ok()) return st2;
        std::fprintf(stderr, "chi: GPU %u queue attached unpinned: %s\n", g.gpu_id, st.message());
        seg = &plain;
      }
      if (seg->Size() != g.segment_size) {
        return Status::Errorf(ErrorCode::kSizeMismatch,
                              "GPU queue segment '%s' is %llu bytes; the runtime announced %llu",
                              g.segment.c_str(), static_cast<unsigned long long>(seg->Size()),
                              static_cast<unsigned long long>(g.segment_size));
      }
      GpuQueue<MemScope::kSystem> q;
      if (Status st = RebaseCpu2Gpu(g, seg->Data(), seg->DataSize(), &q); !st.ok()) return st;
      link.Init(g.gpu_id, q, GpuQueue<MemScope::kSystem>());
      known = std::make_unique<Atomic<u64>[]>(kMaxGpuPools);
      return Status::Ok();
    }
  };

  /**
   * GpuPoolDirectory: the runtime's GPU gpu_id must have a container for `pool`. Asked of
   * the runtime once per pool (an admin GpuAttachPool round trip), then remembered.
   */
  Status EnsurePool(u32 gpu_id, PoolId pool) override {
    Atomic<u64> *known = gpus_[gpu_id]->known.get();
    const u64 key = pool.ToU64();
    for (u32 i = 0; i < kMaxGpuPools; ++i) {
      if (known[i].Load(MemOrder::kRelaxed) == key) return Status::Ok();  // relaxed: a hint
    }
    auto *t = ipc_->NewTask<chimaera::admin::GpuAttachPoolTask>(gpu_id, pool);
    if (t == nullptr) return Status::Error(ErrorCode::kOutOfMemory, "GpuAttachPool task");
    t->pool_id_ = kAdminPoolId;
    t->pool_query_ = PoolQuery::Local();
    t->method_ = chimaera::admin::Method::kGpuAttachPool;
    Future<chimaera::admin::GpuAttachPoolTask> f = ipc_->Send(t);
    if (!f.Wait(kAttachPoolWaitSec)) {
      return Status::Error(ErrorCode::kTimeout, "the runtime did not set up the GPU pool");
    }
    if (f->GetReturnCode() != 0) {
      return Status::Error(static_cast<ErrorCode>(f->GetReturnCode()), f->GetMessage());
    }
    for (u32 i = 0; i < kMaxGpuPools; ++i) {
      u64 empty = 0;
      // relaxed: the entry is only a cache of the runtime's answer.
      if (known[i].CompareExchange(empty, key, MemOrder::kRelaxed) || empty == key) break;
    }
    return Status::Ok();
  }

  static constexpr float kAttachPoolWaitSec = 30;

  std::vector<std::unique_ptr<Attached>> gpus_;
  IpcManager *ipc_ = nullptr;
  GpuWorker worker_;
};

}  // namespace chi::gpu
