// GpuLink: the CPU's view of one GPU's two CPU-facing queues (cpu2gpu, which this process
// posts into, and gpu2cpu, which GPU threads post into) and the sender-side bookkeeping the
// GpuWorker keeps for them; GpuPoolDirectory: which pools a GPU serves. Both are shared by
// the runtime's GPU devices (gpu_device.h) and a pure client's attached queues
// (gpu_client_queues.h), which hand their links to a GpuWorker.
#pragma once

#include <memory>  // per-slot arrays

#include "chi/core/atomic.h"  // Atomic
#include "chi/core/ids.h"     // PoolId
#include "chi/core/status.h"  // Status
#include "chi/core/types.h"   // u32, u64
#include "chi/gpu/mailbox.h"  // GpuQueue, MemScope

namespace chi::gpu {

/** Which pools a GPU serves (GpuManager registers them lazily; host tests fake it). */
class GpuPoolDirectory {
 public:
  /** Ok when GPU gpu_id has a container for `pool` (made now if needed), else why not. */
  virtual Status EnsurePool(u32 gpu_id, PoolId pool) = 0;

 protected:
  ~GpuPoolDirectory() = default;
};

/** The CPU's view of one GPU's CPU-facing queues, and its bookkeeping for them. */
struct GpuLink {
  u32 gpu_id = 0;
  GpuQueue<MemScope::kSystem> cpu2gpu;     ///< this process posts; the GPU answers
  GpuQueue<MemScope::kSystem> gpu2cpu;     ///< GPU threads post; the GpuWorker answers
  std::unique_ptr<Atomic<u64>[]> pending;  ///< cpu2gpu: the Task* awaiting each slot's answer
  std::unique_ptr<u32[]> sent;             ///< cpu2gpu: the sequence we posted in each slot
  Atomic<u32> freed;                       ///< cpu2gpu: bumped whenever a slot frees (futex)
  Atomic<u32> free_waiters;                ///< senders parked on `freed`
  Atomic<u32> used_slots;                  ///< cpu2gpu: 1 + the highest slot ever claimed
  Atomic<u64> cpu2gpu_inflight;
  Atomic<u64> gpu2cpu_inflight;

  /** Binds the link to a GPU's queue descriptors. */
  void Init(u32 id, const GpuQueue<MemScope::kSystem> &c2g,
            const GpuQueue<MemScope::kSystem> &g2c) {
    gpu_id = id;
    cpu2gpu = c2g;
    gpu2cpu = g2c;
    pending = std::make_unique<Atomic<u64>[]>(c2g.num_slots_);
    sent = std::make_unique<u32[]>(c2g.num_slots_);
  }
};

}  // namespace chi::gpu
