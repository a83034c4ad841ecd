// GpuDevice: one GPU's share of the runtime: its pinned and device regions (shareable
// first: a POSIX segment pinned for the GPU and device memory with an IPC handle, so other
// processes can attach; private memory where the platform refuses), its two streams, the
// queue set carved from them, and its orchestrator kernel's launch and stop. GpuManager
// owns one per GPU and keeps the pool bindings in it.
// Invariant: a device whose kernel did not stop when asked is `wedged`, and its memory is
// never freed (the kernel may still use it).
#pragma once

#include <unistd.h>  // getpid: segment names

#include <cstdio>         // fprintf of a fallback to private memory
#include <cstring>        // memset of private pinned memory
#include <string>         // segment names
#include <unordered_map>  // pool -> binding
#include <vector>         // claim words read back

#include "chi/core/atomic.h"          // Atomic
#include "chi/core/status.h"          // Status
#include "chi/gpu/gpu_api.h"          // the CUDA/HIP layer, PinnedShmBackend, GpuDeviceBackend
#include "chi/gpu/gpu_container.h"    // GpuPoolBinding, GpuPoolTable, kMaxGpuPools
#include "chi/gpu/gpu_link.h"         // GpuLink
#include "chi/gpu/module_registry.h"  // GpuModuleTable: the orchestrator's launcher
#include "chi/gpu/queue_set.h"        // GpuQueueSet, GpuQueueConfig, GpuControl

namespace chi::gpu {

/** One GPU's resources (see the file comment). */
struct GpuDevice {
  int id = 0;
  PinnedShmBackend pinned;         ///< cpu2gpu, gpu2cpu (POSIX shm, pinned)
  GpuDeviceBackend device;         ///< descriptors, control, gpu2gpu, records, pools, containers
  void *private_pinned = nullptr;  ///< instead of `pinned` where shm cannot be pinned
  void *private_device = nullptr;  ///< instead of `device` where IPC handles are refused
  Stream stream = nullptr;         ///< the orchestrator's own stream
  Stream copies = nullptr;         ///< table and container copies
  GpuQueueSet set;
  GpuLink link;
  bool running = false;  ///< launched and not yet seen to return
  bool wedged = false;   ///< did not return when asked: keep its memory mapped
  bool abort = false;    ///< the abort word's value (device-side waits give up)
  u64 arena_used = 0;
  std::unordered_map<u64, GpuPoolBinding> bindings;  ///< pool -> its container here
  Atomic<u64> known[kMaxGpuPools];                   ///< pools with bindings (hot-path check)
  GpuPoolTable shadow;                               ///< host copy of the pool table

  /**
   * Maps GPU `id`'s regions for queues of `qc`, creates its streams, carves the queues,
   * clears the device region and writes the descriptors kernels read.
   */
  Status Map(const GpuQueueConfig &qc) {
    const DeviceScope scope(id);  // the caller keeps its own GPU
    if (!scope.status().ok()) return scope.status();
    const std::string name = "chi_gpu_" + std::to_string(getpid()) + "_" + std::to_string(id);
    const u64 pinned_bytes = GpuQueueSet::PinnedBytes(qc);
    const u64 device_bytes = GpuQueueSet::DeviceBytes(qc);
    char *pinned_region = nullptr;
    char *device_region = nullptr;
    if (Status st = pinned.Create(name, pinned_bytes, CreateMode::kReplace); st.ok()) {
      pinned_region = pinned.Data();
      if (pinned.DevicePointer() != pinned.Base()) {
        return Status::Error(ErrorCode::kUnsupported,
                             "pinned memory is not at the same address on the GPU (needs UVA)");
      }
    } else if (Status st2 = Check(MallocHost(&private_pinned, pinned_bytes), "pinned memory");
               st2.ok()) {
      std::fprintf(stderr, "chi: GPU %d queues in private pinned memory: %s\n", id, st.message());
      std::memset(private_pinned, 0, pinned_bytes);
      pinned_region = static_cast<char *>(private_pinned);
    } else {
      return st;
    }
    if (Status st = device.Create(name, device_bytes, id); st.ok()) {
      device_region = device.Data();
    } else if (Status st2 = Check(Malloc(&private_device, device_bytes), "device memory");
               st2.ok()) {
      std::fprintf(stderr, "chi: GPU %d queues in private device memory: %s\n", id, st.message());
      device_region = static_cast<char *>(private_device);
    } else {
      return st;
    }
    if (Status st = Check(StreamCreate(&stream), "create the orchestrator stream"); !st.ok()) {
      return st;
    }
    if (Status st = Check(StreamCreate(&copies), "create the copy stream"); !st.ok()) return st;
    set = GpuQueueSet::Carve(qc, pinned_region, device_region);
    // Both on the copy stream, so the clear is ordered before the descriptors land.
    Status st = Check(MemsetAsync(device_region, 0, device_bytes, copies), "clear GPU queues");
    if (st.ok()) {
      st = Check(MemcpyAsync(set.device, &set.host, sizeof(set.host), copies),
                 "write queue descriptors");
    }
    if (st.ok()) st = Check(StreamSynchronize(copies), "write queue descriptors");
    if (!st.ok()) return st;
    link.Init(static_cast<u32>(id), set.host.cpu2gpu, set.host.gpu2cpu);
    return Status::Ok();
  }

  /** Writes the control words through the copy stream (kernels read them from L2). */
  Status WriteControl(u32 exit) {
    GpuControl words;
    words.exit_.Store(exit, MemOrder::kRelaxed);  // relaxed: a host-private staging copy
    words.abort_.Store(abort ? 1 : 0, MemOrder::kRelaxed);
    const DeviceScope scope(id);  // the caller keeps its own GPU
    Status st = scope.status();
    if (st.ok()) {
      st = Check(MemcpyAsync(set.control, &words, sizeof(words), copies), "write GPU control");
    }
    if (st.ok()) st = Check(StreamSynchronize(copies), "write GPU control");
    return st;
  }

  /** Launches the orchestrator of `table`'s modules (its control words cleared first). */
  Status Launch(const GpuModuleTable &table, u32 blocks, u32 threads) {
    abort = false;
    if (Status st = WriteControl(0); !st.ok()) return st;
    const DeviceScope scope(id);  // the caller keeps its own GPU
    const int rc = table.launch(set.Args(static_cast<u32>(id)), blocks, threads, stream);
    if (Status st = Check(static_cast<Error>(rc), "launch the GPU orchestrator"); !st.ok()) {
      return st;
    }
    running = true;
    return Status::Ok();
  }

  /** Asks the orchestrator to return and waits for it, at most timeout_ns. */
  Status StopKernel(u64 timeout_ns) {
    if (!running) return Status::Ok();
    Status st = WriteControl(1);
    if (st.ok()) st = WaitStream(stream, timeout_ns);
    if (!st.ok()) {
      wedged = true;
      return Status::Errorf(st.code(), "GPU %d orchestrator did not stop: %s", id, st.message());
    }
    running = false;
    return Status::Ok();
  }

  /**
   * Frees the gpu2gpu and gpu2cpu slots that client kernels hold (see
   * GpuManager::ReclaimGpuSlots); on the copy stream, from the caller's thread.
   */
  Status ReclaimClientSlots() {
    const DeviceScope scope(id);  // the caller keeps its own GPU
    Status st = scope.status();
    const auto &g2g = set.host.gpu2gpu;
    const auto &g2c = set.host.gpu2cpu;
    if (st.ok())
      st = Check(MemsetAsync(g2g.claims_, claim::kVerify, 4ull * g2g.num_slots_, copies),
                 "reclaim gpu2gpu slots");
    if (st.ok())
      st = Check(MemsetAsync(g2c.claims_, claim::kVerify, 4ull * g2c.num_slots_, copies),
                 "reclaim gpu2cpu slots");
    if (st.ok()) st = Check(StreamSynchronize(copies), "reclaim slots");
    return st;
  }

  /** Slots of the gpu2gpu and gpu2cpu queues that clients hold right now. */
  Status CountHeldSlots(u32 *gpu2gpu, u32 *gpu2cpu) {
    const DeviceScope scope(id);  // the caller keeps its own GPU
    Status st = scope.status();
    if (st.ok()) st = CountHeld(set.host.gpu2gpu.claims_, set.host.gpu2gpu.num_slots_, gpu2gpu);
    if (st.ok()) st = CountHeld(set.host.gpu2cpu.claims_, set.host.gpu2cpu.num_slots_, gpu2cpu);
    return st;
  }

  /** Frees the streams and regions (never call it on a wedged device). */
  void Release() {
    const DeviceScope scope(id);
    if (stream != nullptr) StreamDestroy(stream);
    if (copies != nullptr) StreamDestroy(copies);
    stream = copies = nullptr;
    device.Destroy();
    if (pinned.IsAttached()) pinned.Destroy();
    if (private_device != nullptr) Free(private_device);
    if (private_pinned != nullptr) FreeHost(private_pinned);
    private_device = private_pinned = nullptr;
  }

 private:
  /** Counts held claim words of one queue (copied back to the host). */
  Status CountHeld(const Atomic<u32, MemScope::kDevice> *claims, u32 n, u32 *held) {
    std::vector<u32> words(n);
    Status st = Check(MemcpyAsync(words.data(), claims, 4ull * n, copies), "read slot claims");
    if (st.ok()) st = Check(StreamSynchronize(copies), "read slot claims");
    *held = 0;
    for (u32 w : words) *held += (w & claim::kHeld) != 0 ? 1 : 0;
    return st;
  }
};

}  // namespace chi::gpu
