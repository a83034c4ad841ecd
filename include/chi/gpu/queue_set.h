// GpuQueueSet: everything one GPU's routes need, carved out of two regions: a pinned one
// (the CPU-facing queues: cpu2gpu, gpu2cpu) and a device one (the descriptors kernels read,
// the control words, gpu2gpu, the GPU clients' records, the pool table, the container
// states). GpuManager carves real pinned and device memory; host tests carve
// plain memory and play the GPU with CPU threads. Also GpuInfo, what a client kernel gets.
// Invariant: both regions start zeroed; zero is the idle state of every word.
#pragma once

#include <cstring>  // memcpy of the descriptors (host regions)

#include "chi/core/types.h"         // u32, u64
#include "chi/gpu/gpu_container.h"  // GpuPoolTable
#include "chi/gpu/gpu_server.h"     // GpuControl, ServerArgs, kMaxSlotsPerServerThread
#include "chi/gpu/mailbox.h"        // GpuQueue

namespace chi::gpu {

/** Sizes of one GPU's queues. */
struct GpuQueueConfig {
  u32 server_threads = 32;               ///< orchestrator blocks x threads per block
  u32 depth = 256;                       ///< slots of each CPU-facing queue (gpu.queue_depth)
  u32 payload_bytes = kGpuPayloadBytes;  ///< copy space per slot (<= kGpuPayloadBytes)
  u64 max_wait_ns = 30000000000ull;      ///< GPU clients stop waiting after this long
  u64 arena_bytes = 1ull << 20;          ///< GPU container states
};

/** The descriptors kernels read, together at the start of the device region. */
struct GpuDescriptors {
  GpuQueue<MemScope::kDevice> gpu2gpu;
  GpuQueue<MemScope::kSystem> cpu2gpu;
  GpuQueue<MemScope::kSystem> gpu2cpu;
};

inline constexpr u64 kGpuInfoMagic = 0x4f464e4955504743ull;  // "CGPUINFO"

/**
 * What a client kernel needs to submit tasks (CHI_IPC->GetClientGpuInfo): device addresses
 * of its GPU's queue descriptors, and the device-memory region CHI_GPU_HEAP allocates from
 * (gpu_heap.h). Passed to the kernel by value; CHIMAERA_GPU_INIT keeps a copy per block.
 * The region is formatted once, when it is made: the runtime's by GpuManager, a user's own
 * by FormatGpuHeap (gpu_heap_format.h) or GpuHeapRegion::Format before any kernel gets it. Any
 * number of kernels, at once or one after another, may share it, and a block one kernel
 * allocated stays valid in later ones until freed. A thread allocates from its own partition
 * (~24 KiB of the runtime's 64 MiB), then a spill partition once that runs dry; a block too
 * big for its partition comes from a large one shared by all (up to 8 MiB there). An
 * unformatted region means no heap.
 */
struct GpuInfo {
  u64 magic_ = 0;  ///< kGpuInfoMagic once filled in
  u32 gpu_id_ = 0;
  u32 pid_ = 0;                                     ///< stamped into task ids
  GpuQueue<MemScope::kDevice> *gpu2gpu_ = nullptr;  ///< Local() from a kernel
  GpuQueue<MemScope::kSystem> *gpu2cpu_ = nullptr;  ///< ToLocalCpu() from a kernel
  u32 num_blocks_ = 0;  ///< set by CHIMAERA_GPU_INIT_BLOCKS: spreads blocks over the slots
  u32 reserved_ = 0;
  char *heap_ = nullptr;  ///< a formatted GpuHeapRegion in device memory (nullptr: no heap)
  u64 heap_bytes_ = 0;    ///< its size (at least what it was formatted for)
};

/** One GPU's queues, control block, pool table and container arena. */
struct GpuQueueSet {
  u32 cpu2gpu_slots = 0;
  u32 gpu2gpu_slots = 0;
  u32 gpu2cpu_slots = 0;
  u32 payload_bytes = 0;
  GpuControl *control = nullptr;     ///< device region (the host writes it by copy)
  GpuDescriptors host;               ///< the descriptors' values (pointers valid on both sides)
  GpuDescriptors *device = nullptr;  ///< where kernels read them (device region)
  GpuPoolTable *pools = nullptr;     ///< device region
  char *arena = nullptr;             ///< device region: GPU container states
  u64 arena_bytes = 0;

  /** Slot counts: gpu2gpu gives every server thread a slot; none exceeds the poll batch. */
  static void Geometry(const GpuQueueConfig &c, u32 *c2g, u32 *g2g, u32 *g2c) {
    const u32 threads = c.server_threads == 0 ? 1 : c.server_threads;
    const u32 depth = RoundUp32(c.depth == 0 ? 1 : c.depth);
    const u64 cap = static_cast<u64>(threads) * kMaxSlotsPerServerThread;
    const u32 most = cap > 0x40000000ull ? 0x40000000u : static_cast<u32>(cap);
    *c2g = depth < most ? depth : most;
    const u32 g = depth > RoundUp32(threads) ? depth : RoundUp32(threads);
    *g2g = g < most ? g : most;
    *g2c = depth;
  }

  /** Bytes of the pinned region. */
  static u64 PinnedBytes(const GpuQueueConfig &c) {
    u32 c2g, g2g, g2c;
    Geometry(c, &c2g, &g2g, &g2c);
    using Sys = GpuQueue<MemScope::kSystem>;
    return Sys::SharedBytes(c2g, Payload(c)) + Sys::ClientBytes(c2g, false) +
           Sys::SharedBytes(g2c, Payload(c)) + Sys::ServerBytes(g2c);
  }

  /** Bytes of the device region. */
  static u64 DeviceBytes(const GpuQueueConfig &c) {
    u32 c2g, g2g, g2c;
    Geometry(c, &c2g, &g2g, &g2c);
    using Sys = GpuQueue<MemScope::kSystem>;
    using Dev = GpuQueue<MemScope::kDevice>;
    return Align(sizeof(GpuDescriptors)) + Align(sizeof(GpuControl)) + Align(sizeof(GpuPoolTable)) +
           Dev::SharedBytes(g2g, Payload(c)) + Dev::ClientBytes(g2g, true) + Dev::ServerBytes(g2g) +
           Sys::ServerBytes(c2g) + Sys::ClientBytes(g2c, true) + Align(c.arena_bytes);
  }

  /**
   * Carves zeroed regions of PinnedBytes and DeviceBytes (64-byte aligned). `pinned` must be
   * addressable at the same address by the host and the GPU; `device` by the GPU.
   */
  static GpuQueueSet Carve(const GpuQueueConfig &c, char *pinned, char *device) {
    GpuQueueSet q;
    Geometry(c, &q.cpu2gpu_slots, &q.gpu2gpu_slots, &q.gpu2cpu_slots);
    q.payload_bytes = Payload(c);
    using Sys = GpuQueue<MemScope::kSystem>;
    using Dev = GpuQueue<MemScope::kDevice>;
    char *p = pinned;
    char *c2g_shared = Take(&p, Sys::SharedBytes(q.cpu2gpu_slots, q.payload_bytes));
    char *c2g_client = Take(&p, Sys::ClientBytes(q.cpu2gpu_slots, false));
    char *g2c_shared = Take(&p, Sys::SharedBytes(q.gpu2cpu_slots, q.payload_bytes));
    char *g2c_server = Take(&p, Sys::ServerBytes(q.gpu2cpu_slots));
    char *d = device;
    q.device = reinterpret_cast<GpuDescriptors *>(Take(&d, sizeof(GpuDescriptors)));
    q.control = reinterpret_cast<GpuControl *>(Take(&d, sizeof(GpuControl)));
    const auto *abort = &q.control->abort_;
    q.pools = reinterpret_cast<GpuPoolTable *>(Take(&d, sizeof(GpuPoolTable)));
    char *g2g_shared = Take(&d, Dev::SharedBytes(q.gpu2gpu_slots, q.payload_bytes));
    char *g2g_client = Take(&d, Dev::ClientBytes(q.gpu2gpu_slots, true));
    char *g2g_server = Take(&d, Dev::ServerBytes(q.gpu2gpu_slots));
    char *c2g_server = Take(&d, Sys::ServerBytes(q.cpu2gpu_slots));
    char *g2c_client = Take(&d, Sys::ClientBytes(q.gpu2cpu_slots, true));
    q.arena = Take(&d, c.arena_bytes);
    q.arena_bytes = Align(c.arena_bytes);
    q.host.gpu2gpu = Dev::Make(q.gpu2gpu_slots, q.payload_bytes, c.max_wait_ns, g2g_shared,
                               g2g_client, true, g2g_server, abort);
    q.host.cpu2gpu = Sys::Make(q.cpu2gpu_slots, q.payload_bytes, c.max_wait_ns, c2g_shared,
                               c2g_client, false, c2g_server, abort);
    q.host.gpu2cpu = Sys::Make(q.gpu2cpu_slots, q.payload_bytes, c.max_wait_ns, g2c_shared,
                               g2c_client, true, g2c_server, abort);
    return q;
  }

  /** Host regions only (tests): writes the descriptors where kernels would read them. */
  void WriteDescriptorsHost() const { std::memcpy(device, &host, sizeof(host)); }

  /** The orchestrator's launch arguments. */
  ServerArgs Args(u32 gpu_id) const {
    ServerArgs a;
    a.gpu2gpu = &device->gpu2gpu;
    a.cpu2gpu = &device->cpu2gpu;
    a.control = control;
    a.pools = pools;
    a.gpu_id = gpu_id;
    return a;
  }

  /** What a client kernel on this GPU receives. */
  GpuInfo ClientInfo(u32 gpu_id, u32 pid) const {
    GpuInfo info;
    info.magic_ = kGpuInfoMagic;
    info.gpu_id_ = gpu_id;
    info.pid_ = pid;
    info.gpu2gpu_ = &device->gpu2gpu;
    info.gpu2cpu_ = &device->gpu2cpu;
    return info;
  }

 private:
  static u32 Payload(const GpuQueueConfig &c) {
    u32 b = c.payload_bytes < 64 ? 64 : c.payload_bytes;
    b = b > kGpuPayloadBytes ? kGpuPayloadBytes : b;
    return (b + 15) & ~15u;
  }
  static u32 RoundUp32(u32 n) { return (n + 31) & ~31u; }
  static u64 Align(u64 n) { return (n + 63) & ~63ull; }
  static char *Take(char **cursor, u64 bytes) {
    char *at = *cursor;
    *cursor += Align(bytes);
    return at;
  }
};

}  // namespace chi::gpu

namespace chi {

/** What a kernel needs to call clients (CHIMAERA_GPU_INIT), by its name in the GPU API. */
using IpcManagerGpuInfo = gpu::GpuInfo;

}  // namespace chi
