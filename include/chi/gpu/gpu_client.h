// The GPU side of the client API: what a module client's AsyncX does when it is called
// from a kernel, and what Future<T>::Wait does there. Local() (or ToLocalGpu(this GPU))
// goes to this GPU's orchestrator through gpu2gpu; ToLocalCpu() to the CPU workers through
// gpu2cpu. Futures are per thread: each submitting thread owns its slot, its task (in the
// slot's record, device memory) and its wait. Invariant: every device-side wait is bounded
// (the queue's max_wait_ns_, or the caller's timeout) and gives up on the host's abort flag.
// CHIMAERA_GPU_INIT also picks the block's CHI_GPU_HEAP partitions (gpu_heap.h); never formats.
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
#include "chi/gpu/gpu_heap.h"     // GpuHeap, GpuHeapRegion: CHI_GPU_HEAP's partitions
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
 * Claims a slot of q, spinning while all are taken; kNoSlot on timeout or abort. *last_seq:
 * the sequence of the slot's last request. Each attempt looks at a small window and the next
 * attempt at the following one, so thousands of waiting threads do not each sweep the queue.
 */
template <MemScope S>
CHI_CROSS_FUN u32 ClaimSlot(const GpuQueue<S> &q, u32 start, u32 *last_seq) {
  const u64 t0 = ClockNs();
  for (u32 n = 0;; ++n) {
    const u32 s = q.TryClaim(start, kClaimWindow, last_seq);
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
 * Completes a task that was never sent with an error: sets it on the staged task and copies
 * that into its record. Out of line: inlined, its message copy (96 byte loads and stores)
 * was hoisted into every submit, since the staged message bytes are otherwise unused.
 */
template <typename TaskT>
CHI_CROSS_FUN CHI_NOINLINE void FailUnsent(TaskT &staged, ErrorCode code, const char *msg,
                                           ClientRecord &r) {
  staged.SetError(code, msg);
  MarkComplete(staged);
  CopyChunks(r.task_, &staged, sizeof(TaskT));
}

/** Fails a waiting task (abort): out of line for the reason FailUnsent is. */
template <typename TaskT>
CHI_CROSS_FUN CHI_NOINLINE void FailWaiting(TaskT *t, ErrorCode code, const char *msg) {
  t->SetError(code, msg);
  MarkComplete(*t);
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
  // By value: its fields are loaded together, before the claim's acquire (which drops the
  // SM's L1), instead of one L2 round trip each where they are used.
  const GpuQueue<S> q = *qp;
  u32 last_seq = 0;
  const u32 s = ClaimSlot(q, ClaimStart(info, q.num_slots_), &last_seq);
  if (s == kNoSlot) return nullptr;
  ClientRecord &r = q.records_[s];
  // The task is built and encoded on this thread's stack, then its bytes go into the record
  // in wide stores: encoding straight from the record read it back field by field, each
  // read an L2 round trip waiting behind the archive's previous store.
  alignas(16) char local[(sizeof(TaskT) + 15) & ~static_cast<size_t>(15)];
  TaskT &task = *new (local) TaskT(static_cast<Args &&>(args)...);
  const u32 seq = NextSeq(last_seq);
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
  TaskT *t = reinterpret_cast<TaskT *>(r.task_);
  if (!routable) {
    FailUnsent(task, ErrorCode::kUnsupported,
               "from a GPU kernel use PoolQuery::Local(), ToLocalGpu(this GPU) or ToLocalCpu()",
               r);
    return t;
  }
  alignas(16) char buf[kGpuPayloadBytes];
  ErrorCode error = ErrorCode::kOk;
  const u32 len = EncodeRequest(task, seq, buf, q.payload_bytes_, &error);
  if (len == 0) {
    FailUnsent(task, error,
               error == ErrorCode::kTooLarge ? "task is larger than the GPU copy space"
                                             : "task inputs cannot be encoded",
               r);
    return t;
  }
  r.seq_ = seq;  // before the post: a later claimer compares the answer against it
  r.stage_ = RecordStage::kPosted;
  if (len <= q.InlineRequestCap()) {
    q.PostInline(s, seq, buf, len);
  } else {
    CopyChunks(q.Payload(s), buf, len);
    q.Post(s, seq, len);
  }
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

/** What a waiting GPU client needs of its record, read once (a register copy). */
struct WaitTicket {
  u32 slot;  ///< the slot its request went to
  u32 seq;   ///< the sequence the answer must carry
};

/**
 * One poll of t's answer: when it is there, decodes it into t and completes t. The answer
 * is staged on this thread's stack (TakeAnswer reads it with the poll when it is small).
 */
template <MemScope S, typename TaskT>
CHI_CROSS_FUN bool TryReadAnswer(const GpuQueue<S> &q, WaitTicket w, ClientRecord *r,
                                 TaskT *t) {
  alignas(16) char buf[kGpuPayloadBytes];
  u32 len = 0;
  if (!q.TakeAnswer(w.slot, w.seq, buf, &len)) return false;
  DecodeAnswer(*t, buf, len, w.seq);
  r->stage_ = RecordStage::kAnswered;
  MarkComplete(*t);
  return true;
}

/**
 * Spins on t's answer; false on timeout (t stays pending). On abort t fails with kShutdown.
 * The ticket is a register copy: an acquire poll (payload-mode queues) drops the SM's L1,
 * and the record read again through memory would cost an L2 round trip ahead of the poll.
 * (The descriptor, by reference: a copy cost client kernels ~14 registers.)
 */
template <MemScope S, typename TaskT>
CHI_CROSS_FUN bool WaitOn(const GpuQueue<S> &q, ClientRecord *r, TaskT *t, float max_sec) {
  const WaitTicket w{r->slot_, r->seq_};
  const u64 limit = max_sec > 0 ? static_cast<u64>(max_sec * 1e9f) : q.max_wait_ns_;
  const u64 t0 = ClockNs();
  for (u32 n = 0;; ++n) {
    if (TryReadAnswer(q, w, r, t)) return true;
    Backoff(n < (1u << 20) ? n : (1u << 20), kClientIdleMaxNs);
    if ((n & 255) == 255) {
      // relaxed: the flag only asks us to stop; nothing is read through it.
      if (q.abort_ != nullptr && q.abort_->Load(MemOrder::kRelaxed) != 0) {
        FailWaiting(t, ErrorCode::kShutdown, "the GPU runtime is stopping");
        return true;
      }
      if (ClockNs() - t0 > limit) return false;
    }
  }
}

/**
 * True when t is complete. Relaxed: a task submitted from a kernel is completed only by
 * the thread that waits on it (ReadAnswer, FailUnsent, FailWaiting), so program order
 * suffices, where an acquire load would drop the SM's L1 on every wait.
 */
template <typename TaskT>
CHI_CROSS_FUN bool CompletedHere(const TaskT *t) {
  return (t->state_.Load(MemOrder::kRelaxed) & task_state::kComplete) != 0;
}

/** Future<T>::Wait on the device: waits for t's answer (bounded). */
template <typename TaskT>
CHI_CROSS_FUN bool WaitTask(TaskT *t, float max_sec) {
  if (CompletedHere(t)) return true;
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
  if (CompletedHere(t)) return true;
  ClientRecord *r = RecordOf(t);
  const WaitTicket w{r->slot_, r->seq_};
  if (r->scope_ == MemScope::kDevice) {
    return TryReadAnswer(*static_cast<const GpuQueue<MemScope::kDevice> *>(r->queue_), w, r, t);
  }
  return TryReadAnswer(*static_cast<const GpuQueue<MemScope::kSystem> *>(r->queue_), w, r, t);
}

/** Future<T>'s release on the device: destroys t and gives its slot back. */
CHI_SERIALIZE_HD_TEMPLATE
template <typename TaskT>
CHI_CROSS_FUN void ReleaseTask(TaskT *t) {
  ClientRecord *r = RecordOf(t);
  const bool pending = r->stage_ == RecordStage::kPosted;
  const u32 seq = r->seq_;  // the last posted from this slot (ours, or before us if unsent)
  t->~TaskT();
  if (r->scope_ == MemScope::kDevice) {
    static_cast<const GpuQueue<MemScope::kDevice> *>(r->queue_)->Release(r->slot_, seq, pending);
  } else {
    static_cast<const GpuQueue<MemScope::kSystem> *>(r->queue_)->Release(r->slot_, seq, pending);
  }
}

#if CHI_GPU_CUDA || CHI_GPU_HIP
namespace detail {
/** This block's copy of its GpuInfo (set by CHIMAERA_GPU_INIT; raw words: no constructor). */
static __shared__ u64 g_block_info[(sizeof(GpuInfo) + 7) / 8];

/**
 * This block's copies of its two queue descriptors (gpu2gpu, gpu2cpu): a submit reads its
 * descriptor from shared memory, not with an L2 round trip ahead of its claim.
 */
static __shared__ u64 g_block_queues[2][(sizeof(GpuQueue<MemScope::kDevice>) + 7) / 8];

/** This block's first CHI_GPU_HEAP ticket: thread t uses partition (ticket + t) mod count. */
static __shared__ u32 g_heap_ticket;

/** Zero bytes: the GpuHeap CHI_GPU_HEAP gives a thread without a heap (all nullptr). */
static __device__ u64 g_no_heap[(sizeof(GpuHeap) + 7) / 8];
}  // namespace detail

/** The GpuInfo CHIMAERA_GPU_INIT stored for this block. */
static CHI_GPU_FUN inline const GpuInfo &BlockInfo() {
  return *reinterpret_cast<const GpuInfo *>(detail::g_block_info);
}

/**
 * Stores `info` for the block, with its queue descriptors copied into shared memory, and
 * takes one CHI_GPU_HEAP ticket per thread of the block from its heap region (thread 0 does
 * it all; a region that is not formatted is dropped from the block's copy: no heap), then a
 * barrier: every thread of the block must call it.
 * Formats nothing: blocks of earlier and concurrent launches keep their memory.
 * num_blocks != 0 spreads the blocks' first slots evenly over the queues.
 */
static CHI_GPU_FUN inline void InitBlock(const GpuInfo &info, u32 num_blocks) {
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    GpuInfo *mine = reinterpret_cast<GpuInfo *>(detail::g_block_info);
    *mine = info;
    mine->num_blocks_ = num_blocks;
    static_assert(sizeof(GpuQueue<MemScope::kDevice>) == sizeof(GpuQueue<MemScope::kSystem>),
                  "both descriptors fit one shared copy each");
    if (info.gpu2gpu_ != nullptr) {
      auto *q = reinterpret_cast<GpuQueue<MemScope::kDevice> *>(detail::g_block_queues[0]);
      *q = *info.gpu2gpu_;
      mine->gpu2gpu_ = q;
    }
    if (info.gpu2cpu_ != nullptr) {
      auto *q = reinterpret_cast<GpuQueue<MemScope::kSystem> *>(detail::g_block_queues[1]);
      *q = *info.gpu2cpu_;
      mine->gpu2cpu_ = q;
    }
    GpuHeapRegion *heap = GpuHeapRegion::Open(info.heap_, info.heap_bytes_);
    if (heap == nullptr) mine->heap_ = nullptr;
    detail::g_heap_ticket = heap ? heap->TakeTickets(blockDim.x * blockDim.y * blockDim.z) : 0;
  }
  __syncthreads();  // the block's info and ticket are written before any thread uses them
}

/** CHI_GPU_HEAP: the calling thread's heap partition (an empty one when there is no heap). */
static CHI_GPU_FUN inline GpuHeap *ThreadHeap() {
  char *const region = BlockInfo().heap_;  // checked by InitBlock: formatted, or nullptr
  if (region == nullptr) return reinterpret_cast<GpuHeap *>(detail::g_no_heap);
  const u32 thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  return reinterpret_cast<GpuHeapRegion *>(region)->PartitionFor(detail::g_heap_ticket + thread);
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
