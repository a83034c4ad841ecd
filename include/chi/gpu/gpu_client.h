// The GPU side of the client API: what a module client's AsyncX does when it is called
// from a kernel, and what Future<T>::Wait does there. Local() (or ToLocalGpu(this GPU))
// goes to this GPU's orchestrator through gpu2gpu; ToLocalCpu() to the CPU workers through
// gpu2cpu. Futures are per thread: each submitting thread owns its slot, its task (in the
// slot's record, device memory) and its wait. Invariant: every device-side wait is bounded
// (the queue's max_wait_ns_, or the caller's timeout) and gives up on the host's abort flag.
// CHIMAERA_GPU_INIT also formats this launch's CHI_GPU_HEAP partitions (gpu_heap.h).
//
//   __global__ void MyKernel(chi::gpu::GpuInfo info, chi::PoolId pool, chi::u32 *out) {
//     CHIMAERA_GPU_INIT(info);                      // every thread of the block calls it
//     chimaera::demo::Client client(pool);
//     auto f = client.AsyncGpuSubmit(chi::PoolQuery::Local(), 0, 42);
//     if (f.Wait() && f->GetReturnCode() == 0) *out = f->result_value_;   // 126
//   }
#pragma once

#include <new>          // placement new of the task into its record
#include <type_traits>  // is_trivially_destructible

#include "chi/core/ids.h"         // PoolId, MethodId, TaskId, TaskNode
#include "chi/core/pool_query.h"  // PoolQuery, RoutingMode
#include "chi/gpu/device_util.h"  // ClockNs, Backoff, CopyChunks, GlobalThreadId
#include "chi/gpu/gpu_heap.h"     // GpuHeap, HeapSliceFor: CHI_GPU_HEAP's partitions
#include "chi/gpu/gpu_wire.h"     // EncodeRequest, DecodeAnswer, MarkComplete
#include "chi/gpu/mailbox.h"      // GpuQueue, ClientRecord
#include "chi/gpu/queue_set.h"    // GpuInfo
#include "chi/task/future.h"      // Future<T> (its device path calls WaitTask & co.)

namespace chi::gpu {

/** Longest pause between two polls of a waiting GPU client. */
inline constexpr u32 kClientIdleMaxNs = 256;
/** Slots a GPU client looks at per claim attempt (it moves on to the next ones after). */
inline constexpr u32 kClaimWindow = 32;

/** The record holding a task started by StartTask. */
template <typename TaskT>
CHI_CROSS_FUN ClientRecord *RecordOf(const TaskT *t) {
  return reinterpret_cast<ClientRecord *>(const_cast<char *>(reinterpret_cast<const char *>(t)) -
                                          offsetof(ClientRecord, task_));
}

/** Where this thread starts looking for a free slot: distinct per thread of a launch. */
CHI_CROSS_FUN inline u32 ClaimStart(const GpuInfo &info, u32 slots) {
#if CHI_IS_GPU
  if (info.num_blocks_ != 0) {
    const u32 block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const u32 in_block = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const u32 per_block = slots / info.num_blocks_ == 0 ? 1 : slots / info.num_blocks_;
    return block * per_block + in_block;
  }
#endif
  (void)info;
  (void)slots;
  return GlobalThreadId();
}

/**
 * Claims a slot of q, spinning while all are taken; kNoSlot on timeout or abort. Each
 * attempt looks at a small window and the next attempt at the following one, so thousands
 * of waiting threads do not each sweep the whole queue.
 */
template <MemScope S>
CHI_CROSS_FUN u32 ClaimSlot(const GpuQueue<S> &q, u32 start) {
  const u64 t0 = ClockNs();
  for (u32 n = 0;; ++n) {
    const u32 s = q.TryClaim(start, kClaimWindow);
    if (s != kNoSlot) return s;
    start += kClaimWindow;
    Backoff(n + 64, kClientIdleMaxNs);
    if ((n & 63) == 63) {
      if (q.abort_ != nullptr && q.abort_->Load(MemOrder::kRelaxed) != 0) return kNoSlot;
      if (ClockNs() - t0 > q.max_wait_ns_) return kNoSlot;
    }
  }
}

/**
 * Builds TaskT in a claimed slot of q and posts its request. An error found before sending
 * (unsupported route, a task larger than the copy space) completes the task at once with
 * that error. Returns nullptr only when no slot could be claimed.
 */
CHI_SERIALIZE_HD_TEMPLATE
template <typename TaskT, MemScope S, typename... Args>
CHI_CROSS_FUN TaskT *StartOn(const GpuQueue<S> *qp, const GpuInfo &info, PoolId pool,
                             const PoolQuery &query, MethodId method, bool routable,
                             Args &&...args) {
  static_assert(sizeof(TaskT) <= kGpuTaskBytes, "task too large for a GPU client record");
  static_assert(std::is_trivially_destructible_v<TaskT>,
                "a task submitted from a kernel lives in a GPU slot: no owning members");
  static_assert(alignof(TaskT) <= 16, "GPU client tasks are 16-byte aligned at most");
  static_assert(std::is_trivially_copyable_v<TaskT>,
                "a GPU client task is built on the stack and its bytes copied into its record");
  const GpuQueue<S> &q = *qp;
  const u32 s = ClaimSlot(q, ClaimStart(info, q.num_slots_));
  if (s == kNoSlot) return nullptr;
  ClientRecord &r = q.records_[s];
  // The task is built and encoded on this thread's stack, then its bytes go into the record
  // in wide stores: encoding straight from the record read it back field by field, each
  // read an L2 round trip waiting behind the archive's previous store.
  alignas(16) char local[(sizeof(TaskT) + 15) & ~static_cast<size_t>(15)];
  TaskT &task = *new (local) TaskT(static_cast<Args &&>(args)...);
  const u32 seq = r.seq_ + 1;
  task.pool_id_ = pool;
  task.pool_query_ = query;
  task.method_ = method;
  const u64 unique = static_cast<u64>(GlobalThreadId()) << 32 | seq;
  task.task_id_ = TaskId{0, info.pid_, unique};
  task.task_node_ = TaskNode(unique, 0);
  r.slot_ = s;
  r.scope_ = S;
  r.queue_ = qp;
  r.stage_ = RecordStage::kLocal;
  alignas(16) char buf[kGpuPayloadBytes];
  u32 len = 0;
  if (!routable) {
    task.SetError(ErrorCode::kUnsupported,
                  "from a GPU kernel use PoolQuery::Local(), ToLocalGpu(this GPU) or ToLocalCpu()");
  } else {
    ErrorCode error = ErrorCode::kOk;
    len = EncodeRequest(task, seq, buf, q.payload_bytes_, &error);
    if (len == 0) {
      task.SetError(error, error == ErrorCode::kTooLarge ? "task is larger than the GPU copy space"
                                                         : "task inputs cannot be encoded");
    }
  }
  TaskT *t = reinterpret_cast<TaskT *>(r.task_);
  if (len == 0) {
    MarkComplete(task);  // an error found before sending: complete at once
    CopyChunks(r.task_, local, sizeof(TaskT));
    return t;
  }
  CopyChunks(q.Payload(s), buf, len);
  r.seq_ = seq;  // before the post: a later claimer compares the answer against it
  r.stage_ = RecordStage::kPosted;
  q.Post(s, seq, len);
  // After the post: only this thread reads the record's task until it releases the slot, so
  // its bytes go out while the server works (the post's release fence need not wait on them).
  CopyChunks(r.task_, local, sizeof(TaskT));
  return t;
}

/** Submits a task from a GPU thread (or a host test thread): see StartOn. */
template <typename TaskT, typename... Args>
CHI_CROSS_FUN TaskT *StartTask(const GpuInfo &info, PoolId pool, const PoolQuery &query,
                               MethodId method, Args &&...args) {
  if (info.magic_ != kGpuInfoMagic) return nullptr;  // CHIMAERA_GPU_INIT was not called
  const RoutingMode mode = query.GetMode();
  if (mode == RoutingMode::kToLocalCpu) {
    return StartOn<TaskT>(info.gpu2cpu_, info, pool, query, method, true,
                          static_cast<Args &&>(args)...);
  }
  const bool routable = mode == RoutingMode::kLocal ||
                        (mode == RoutingMode::kToLocalGpu && query.GetId() == info.gpu_id_);
  return StartOn<TaskT>(info.gpu2gpu_, info, pool, query, method, routable,
                        static_cast<Args &&>(args)...);
}

/** Reads the answer of t's request (it is in the slot) into t and completes t. */
template <MemScope S, typename TaskT>
CHI_CROSS_FUN void ReadAnswer(const GpuQueue<S> &q, ClientRecord *r, TaskT *t, u32 len) {
  alignas(16) char buf[kGpuPayloadBytes];
  if (len > q.payload_bytes_) len = q.payload_bytes_;
  CopyChunks(buf, q.Payload(r->slot_), len);
  DecodeAnswer(*t, buf, len, r->seq_);
  r->stage_ = RecordStage::kAnswered;
  MarkComplete(*t);
}

/** Spins on t's answer; false on timeout (t stays pending). On abort t fails with kShutdown. */
template <MemScope S, typename TaskT>
CHI_CROSS_FUN bool WaitOn(const GpuQueue<S> &q, ClientRecord *r, TaskT *t, float max_sec) {
  const u64 limit = max_sec > 0 ? static_cast<u64>(max_sec * 1e9f) : q.max_wait_ns_;
  const u64 t0 = ClockNs();
  u32 len = 0;
  for (u32 n = 0;; ++n) {
    if (q.Answered(r->slot_, r->seq_, &len)) {
      ReadAnswer(q, r, t, len);
      return true;
    }
    Backoff(n < (1u << 20) ? n : (1u << 20), kClientIdleMaxNs);
    if ((n & 255) == 255) {
      // relaxed: the flag only asks us to stop; nothing is read through it.
      if (q.abort_ != nullptr && q.abort_->Load(MemOrder::kRelaxed) != 0) {
        t->SetError(ErrorCode::kShutdown, "the GPU runtime is stopping");
        MarkComplete(*t);
        return true;
      }
      if (ClockNs() - t0 > limit) return false;
    }
  }
}

/** Future<T>::Wait on the device: waits for t's answer (bounded). */
template <typename TaskT>
CHI_CROSS_FUN bool WaitTask(TaskT *t, float max_sec) {
  if (t->IsComplete()) return true;
  ClientRecord *r = RecordOf(t);
  if (r->scope_ == MemScope::kDevice) {
    return WaitOn(*static_cast<const GpuQueue<MemScope::kDevice> *>(r->queue_), r, t, max_sec);
  }
  return WaitOn(*static_cast<const GpuQueue<MemScope::kSystem> *>(r->queue_), r, t, max_sec);
}

/** Future<T>::IsComplete on the device: one poll of t's answer. */
template <typename TaskT>
CHI_CROSS_FUN bool PollTask(const TaskT *task) {
  TaskT *t = const_cast<TaskT *>(task);
  if (t->IsComplete()) return true;
  ClientRecord *r = RecordOf(t);
  u32 len = 0;
  if (r->scope_ == MemScope::kDevice) {
    const auto &q = *static_cast<const GpuQueue<MemScope::kDevice> *>(r->queue_);
    if (!q.Answered(r->slot_, r->seq_, &len)) return false;
    ReadAnswer(q, r, t, len);
  } else {
    const auto &q = *static_cast<const GpuQueue<MemScope::kSystem> *>(r->queue_);
    if (!q.Answered(r->slot_, r->seq_, &len)) return false;
    ReadAnswer(q, r, t, len);
  }
  return true;
}

/** Future<T>'s release on the device: destroys t and gives its slot back. */
CHI_SERIALIZE_HD_TEMPLATE
template <typename TaskT>
CHI_CROSS_FUN void ReleaseTask(TaskT *t) {
  ClientRecord *r = RecordOf(t);
  const bool pending = r->stage_ == RecordStage::kPosted;
  t->~TaskT();
  if (r->scope_ == MemScope::kDevice) {
    static_cast<const GpuQueue<MemScope::kDevice> *>(r->queue_)->Release(r->slot_, pending);
  } else {
    static_cast<const GpuQueue<MemScope::kSystem> *>(r->queue_)->Release(r->slot_, pending);
  }
}

#if CHI_GPU_CUDA || CHI_GPU_HIP
namespace detail {
/** This block's copy of its GpuInfo (set by CHIMAERA_GPU_INIT; raw words: no constructor). */
static __shared__ u64 g_block_info[(sizeof(GpuInfo) + 7) / 8];

/** Zero bytes: the GpuHeap CHI_GPU_HEAP gives a thread without a partition (all nullptr). */
static __device__ u64 g_no_heap[(sizeof(GpuHeap) + 7) / 8];
}  // namespace detail

/** The GpuInfo CHIMAERA_GPU_INIT stored for this block. */
static CHI_GPU_FUN inline const GpuInfo &BlockInfo() {
  return *reinterpret_cast<const GpuInfo *>(detail::g_block_info);
}

/** The calling thread's partition of `info`'s heap region (see HeapSliceFor). */
static CHI_GPU_FUN inline GpuHeapSlice ThreadHeapSlice(const GpuInfo &info) {
  const u32 block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const u32 blocks = gridDim.x * gridDim.y * gridDim.z;
  const u32 thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const u32 threads = blockDim.x * blockDim.y * blockDim.z;
  return HeapSliceFor(info.heap_, info.heap_bytes_, block, blocks, thread, threads);
}

/**
 * Stores `info` for the block (thread 0 writes) and formats this launch's heap partitions
 * (each group's first thread), then a barrier: every thread of the block must call it.
 * num_blocks != 0 spreads the blocks' first slots evenly over the queues.
 */
static CHI_GPU_FUN inline void InitBlock(const GpuInfo &info, u32 num_blocks) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    GpuInfo *mine = reinterpret_cast<GpuInfo *>(detail::g_block_info);
    *mine = info;
    mine->num_blocks_ = num_blocks;
  }
  const GpuHeapSlice slice = ThreadHeapSlice(info);
  if (slice.leader) GpuHeap::Format(slice.base, slice.bytes);
  __syncthreads();  // the block's info and partitions are written before any thread uses them
}

/** CHI_GPU_HEAP: the calling thread's heap partition (an empty one when there is no heap). */
static CHI_GPU_FUN inline GpuHeap *ThreadHeap() {
  const GpuHeapSlice slice = ThreadHeapSlice(BlockInfo());
  if (slice.base == nullptr) return reinterpret_cast<GpuHeap *>(detail::g_no_heap);
  return reinterpret_cast<GpuHeap *>(slice.base);
}

/** Submits from a kernel, as a module client's AsyncX does there (empty future: no slot). */
template <typename TaskT, typename... Args>
CHI_GPU_FUN Future<TaskT> AsyncSubmit(PoolId pool, const PoolQuery &query, MethodId method,
                                      Args &&...args) {
  return Future<TaskT>(
      StartTask<TaskT>(BlockInfo(), pool, query, method, static_cast<Args &&>(args)...));
}
#endif

}  // namespace chi::gpu

#if CHI_GPU_CUDA || CHI_GPU_HIP
/** Per-block client set-up in a kernel (all threads of the block call it). */
#define CHIMAERA_GPU_INIT(gpu_info) ::chi::gpu::InitBlock((gpu_info), 0u)
/** The same, named for client-process kernels. */
#define CHI_CLIENT_GPU_INIT(gpu_info) CHIMAERA_GPU_INIT(gpu_info)
/** Multi-block variant: each of num_blocks blocks starts on its own share of the slots. */
#define CHIMAERA_GPU_INIT_BLOCKS(gpu_info, num_blocks) \
  ::chi::gpu::InitBlock((gpu_info), static_cast<::chi::u32>(num_blocks))
/** The calling thread's GpuHeap (Allocate / Free), valid after CHIMAERA_GPU_INIT. */
#define CHI_GPU_HEAP (::chi::gpu::ThreadHeap())
#endif
