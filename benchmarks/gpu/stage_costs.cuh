// bench_gpu's per-stage costs: one GPU thread times each piece of a task's trip on its own
// (fences, copies from pinned and device memory, publishing, encode, serve, decode, a whole
// ServeSlot from pinned memory, a device slot claim), averaged over many rounds.
#pragma once

#include <vector>  // the host copy of the pool table

#include "bench_gpu_util.cuh"
#include "chi/gpu/gpu_client.h"  // StartOn, the whole submit from a kernel
#include "chi/gpu/gpu_server.h"  // ServeSlot, HandleRequest
#include "chi/mods/demo/demo_tasks.h"  // the demo task and its GPU runtime

namespace bench_gpu {

// ---- Per-stage device costs (one thread, averaged over `iters` rounds each) -------------

/** What StageKernel measures, in ns per round (len: the demo task's request bytes). */
struct StageCosts {
  double len;
  double fence_sys;            ///< acquire fence at system scope (before reading a payload)
  double copy_pinned;          ///< the request out of pinned memory (CopyChunks)
  double copy_device;          ///< the request out of device memory (CopyChunks)
  double publish_pinned;       ///< payload into pinned memory + release store of its word
  double publish_device;       ///< payload into device memory + release store of its word
  double encode;               ///< client: build the task and encode its request
  double handle;               ///< server: decode, run the demo handler, encode the answer
  double decode;               ///< client: decode the answer into the task
  double serve_raw;            ///< ServeSlot on a pinned queue: a 4-byte request (refused)
  double serve_task;           ///< ServeSlot on a pinned queue: the demo task's request
  double claim_release;        ///< TryClaim + Release of a free slot of a device queue
  double start_on;             ///< a kernel's whole submit (StartOn) into a device queue
  double clock_read;           ///< one ClockNs (%globaltimer) read
  double claim_slot;           ///< ClaimSlot (with its deadline clock) + Release
};

/** Times each stage of a task's trip on its own (pinned and device: 1 KiB scratch each). */
__global__ void StageKernel(char *pinned, char *device, char *queue_pinned, char *queue_device,
                            chi::gpu::GpuPoolTable *pools, chi::PoolId pool, u32 iters,
                            StageCosts *out, u32 *sink) {
  using List = chi::gpu::GpuModuleList<chimaera::demo::GpuRuntime>;
  constexpr u32 kCap = chi::gpu::kGpuPayloadBytes;
  alignas(16) char req[kCap];
  alignas(16) char buf[kCap];
  u32 acc = 0;
  chi::ErrorCode err = chi::ErrorCode::kOk;
  auto make = [&](u32 v) {
    chimaera::demo::GpuSubmitTask t(0, v);
    t.pool_id_ = pool;
    t.pool_query_ = chi::PoolQuery::Local();
    t.method_ = chimaera::demo::Method::kGpuSubmit;
    return chi::gpu::EncodeRequest(t, v, req, kCap, &err);
  };
  const u32 len = make(1);
  chi::gpu::CopyChunks(pinned, req, len);
  chi::gpu::CopyChunks(device, req, len);
  auto * const pinned_word = reinterpret_cast<Sys *>(pinned + kCap);
  auto * const device_word = reinterpret_cast<Dev *>(device + kCap);
  auto time = [&](auto &&fn) {
    const u64 t0 = chi::gpu::ClockNs();
    for (u32 i = 0; i < iters; ++i) fn(i);
    return static_cast<double>(chi::gpu::ClockNs() - t0) / iters;
  };
  StageCosts c;
  c.len = len;
  c.fence_sys = time([&](u32) { chi::gpu::FenceAcquire<chi::MemScope::kSystem>(); });
  c.copy_pinned = time([&](u32) {
    chi::gpu::FenceAcquire<chi::MemScope::kSystem>();  // as the server does: no stale L1 lines
    chi::gpu::CopyChunks(buf, pinned, len);
    acc += static_cast<u8>(buf[len - 1]);
  });
  c.copy_device = time([&](u32) {
    chi::gpu::FenceAcquire<chi::MemScope::kDevice>();
    chi::gpu::CopyChunks(buf, device, len);
    acc += static_cast<u8>(buf[len - 1]);
  });
  c.publish_pinned = time([&](u32 i) {
    chi::gpu::CopyChunks(pinned, req, len);
    pinned_word->Store(i, chi::MemOrder::kRelease);
  });
  c.publish_device = time([&](u32 i) {
    chi::gpu::CopyChunks(device, req, len);
    device_word->Store(i, chi::MemOrder::kRelease);
  });
  c.encode = time([&](u32 i) { acc += make(i) + static_cast<u8>(req[len - 1]); });
  chi::gpu::ServerState st{pools, chi::gpu::GpuPoolCache{}, chi::gpu::GpuRunContext{}};
  u32 answer_len = 0;
  c.handle = time([&](u32) {
    chi::gpu::CopyChunks(buf, req, len);
    answer_len = chi::gpu::HandleRequest<List>(buf, len, kCap, st);
  });
  c.decode = time([&](u32 i) {
    chimaera::demo::GpuSubmitTask t;
    chi::gpu::DecodeAnswer(t, buf, answer_len, chi::gpu::GetRequestId(buf));
    acc += t.result_value_ + i;
  });
  // The orchestrator's whole serve of one cpu2gpu slot (fence, copy in, run, copy out,
  // answer word), on a one-slot queue in pinned memory; the request is rewritten untimed.
  using SysQueue = chi::gpu::GpuQueue<chi::MemScope::kSystem>;
  const SysQueue q = SysQueue::Make(1, kCap, 1000000000ull, queue_pinned,
                                    queue_pinned + SysQueue::SharedBytes(1, kCap), false,
                                    queue_device, nullptr);
  auto serve = [&](u32 bytes) {
    u64 spent = 0;
    for (u32 i = 1; i <= iters; ++i) {
      chi::gpu::CopyChunks(q.Payload(0), req, bytes);
      const u64 word = static_cast<u64>(i) | static_cast<u64>(bytes) << 32;
      const u64 t0 = chi::gpu::ClockNs();
      chi::gpu::FenceAcquire<chi::MemScope::kSystem>();  // as ServeOwned does before it
      chi::gpu::ServeSlot<List>(q, 0, word, st);
      spent += chi::gpu::ClockNs() - t0;
    }
    return static_cast<double>(spent) / iters;
  };
  using DevQueue = chi::gpu::GpuQueue<chi::MemScope::kDevice>;
  const DevQueue dq = DevQueue::Make(1, kCap, 1000000000ull, queue_device + 2048,
                                     queue_device + 2048 + DevQueue::SharedBytes(1, kCap), true,
                                     queue_device + 1024, nullptr);
  c.claim_release = time([&](u32) {
    u32 last = 0;
    const u32 slot = dq.TryClaim(0, ~0u, &last);
    acc += slot;
    dq.Release(slot, last, false);
  });
  {
    chi::gpu::GpuInfo info;
    info.magic_ = chi::gpu::kGpuInfoMagic;
    u64 spent = 0;
    for (u32 i = 0; i < iters; ++i) {
      const u64 t0 = chi::gpu::ClockNs();
      auto *t = chi::gpu::StartOn<chimaera::demo::GpuSubmitTask>(
          &dq, info, pool, chi::PoolQuery::Local(), chimaera::demo::Method::kGpuSubmit, true, 0u,
          i);
      spent += chi::gpu::ClockNs() - t0;
      chi::gpu::ClientRecord *r = chi::gpu::RecordOf(t);
      dq.Answer(r->slot_, r->seq_, 0);  // as if served and read: the slot is free again
      r->stage_ = chi::gpu::RecordStage::kAnswered;
      chi::gpu::ReleaseTask(t);
    }
    c.start_on = static_cast<double>(spent) / iters;
  }
  c.clock_read = time([&](u32) { acc += static_cast<u32>(chi::gpu::ClockNs()); });
  c.claim_slot = time([&](u32) {
    u32 last = 0;
    const u32 slot = chi::gpu::ClaimSlot(dq, 0, &last);
    acc += slot;
    dq.Release(slot, last, false);
  });
  make(1);
  c.serve_raw = serve(4);
  c.serve_task = serve(len);
  *out = c;
  *sink = acc;
}

/** Runs StageKernel against a private pool table holding one demo GPU container. */
StageCosts StageCostsOnDevice(Bench &B, u32 iters) {
  using Table = chi::gpu::GpuPoolTable;
  void *state = nullptr;
  Table *table = nullptr;
  char *pinned = nullptr;
  char *device = nullptr;
  StageCosts *out = nullptr;
  Ok(cudaMalloc(&state, sizeof(chimaera::demo::GpuRuntime)), "stage state");
  Ok(cudaMemset(state, 0, sizeof(chimaera::demo::GpuRuntime)), "stage state");
  Ok(cudaMalloc(&table, sizeof(Table)), "stage table");
  Ok(cudaHostAlloc(&pinned, 2 * chi::gpu::kGpuPayloadBytes, cudaHostAllocPortable), "pinned");
  Ok(cudaMalloc(&device, 2 * chi::gpu::kGpuPayloadBytes), "stage device");
  Ok(cudaMalloc(&out, sizeof(StageCosts)), "stage out");
  char *queue_pinned = nullptr;
  char *queue_device = nullptr;
  Ok(cudaHostAlloc(&queue_pinned, 4096, cudaHostAllocPortable), "stage queue");
  std::memset(queue_pinned, 0, 4096);
  Ok(cudaMalloc(&queue_device, 8192), "stage queue");
  Ok(cudaMemset(queue_device, 0, 8192), "stage queue");
  std::vector<u64> host_table((sizeof(Table) + 7) / 8, 0);  // zero: the table's idle state
  auto *t = reinterpret_cast<Table *>(host_table.data());
  const chi::gpu::GpuPoolBinding binding{kPool, 0, state};
  t->Publish(&binding, 1);
  Ok(cudaMemcpy(table, t, sizeof(Table), cudaMemcpyHostToDevice), "stage table");
  StageKernel<<<1, 1, 0, B.a>>>(pinned, device, queue_pinned, queue_device, table, kPool, iters,
                                out, B.wrong);
  Wait(B.a, "stage costs");
  StageCosts c;
  Ok(cudaMemcpy(&c, out, sizeof(c), cudaMemcpyDeviceToHost), "stage out");
  cudaFree(state);
  cudaFree(table);
  cudaFreeHost(pinned);
  cudaFree(device);
  cudaFree(out);
  cudaFreeHost(queue_pinned);
  cudaFree(queue_device);
  return c;
}

}  // namespace bench_gpu
