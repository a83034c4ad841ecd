// The orchestrator's body: every thread of the persistent kernel owns a fixed set of slots
// of its GPU's gpu2gpu queue (slot s belongs to thread s % threads) and of its cpu2gpu queue
// (counted from the last thread down, so the threads that wait on slow PCIe reads of pinned
// memory are not the ones the first gpu2gpu slots depend on; as few of them as can hold the
// queue, kMaxSlotsPerServerThread slots each, to keep PCIe polling light; they read one
// doorbell word a round and scan their cpu2gpu slots only when it moved), polls them, and
// runs each request's GPU handler itself. Many warps therefore serve in parallel
// with no shared queue head and no lock. The same code runs on CPU threads in host tests.
// Invariant: a thread leaves the loop only through the host-visible exit flag; it never
// waits on anything else, so a request can only be late, never lost or blocking.
#pragma once

#include "chi/core/atomic.h"        // control words
#include "chi/core/macros.h"        // CHI_GPU_FUN
#include "chi/core/types.h"         // u32, u64
#include "chi/gpu/device_util.h"    // Backoff, CopyChunks
#include "chi/gpu/gpu_container.h"  // GpuModuleList, GpuPoolTable, GpuRunContext
#include "chi/gpu/gpu_wire.h"       // envelope
#include "chi/gpu/mailbox.h"        // GpuQueue

namespace chi::gpu {

/** Slots of one queue a server thread may own (its poll batch). */
inline constexpr u32 kMaxSlotsPerServerThread = 8;
/** Longest pause of an idle server thread between polls. */
inline constexpr u32 kServerIdleMaxNs = 512;
/** Polls between two reads of the exit flag. */
inline constexpr u32 kExitCheckRounds = 64;

/**
 * Host -> GPU control words of one GPU. They live in device memory, written by the host
 * through the copy engine: every server thread and waiting client polls them, and from
 * pinned memory that many readers saturate the PCIe read path (seen on an H200 with 16896
 * server threads: each task then took milliseconds).
 */
struct alignas(64) GpuControl {
  Atomic<u32, MemScope::kDevice> exit_;   ///< leave the orchestrator loop
  Atomic<u32, MemScope::kDevice> abort_;  ///< every device-side wait gives up
};

/** What one launch of the orchestrator needs (passed by value to the kernel). */
struct ServerArgs {
  GpuQueue<MemScope::kDevice> *gpu2gpu = nullptr;  ///< descriptor in device memory
  GpuQueue<MemScope::kSystem> *cpu2gpu = nullptr;  ///< descriptor in device memory
  GpuControl *control = nullptr;                   ///< device memory
  GpuPoolTable *pools = nullptr;                   ///< device memory
  u32 gpu_id = 0;
};

/** Per-thread state of the server loop. */
struct ServerState {
  GpuPoolTable *pools;
  GpuPoolCache cache;
  GpuRunContext rctx;
};

/**
 * Decodes one request in `buf` (len bytes), runs it and writes the answer into `buf`.
 * Every failure becomes an error answer. Returns the answer's length.
 */
template <typename ModuleList>
CHI_GPU_FUN u32 HandleRequest(char (&buf)[kGpuPayloadBytes], u32 len, u32 cap,
                              ServerState &st) {
  const u64 id = GetRequestId(buf);
  InputArchive in(buf + kGpuEnvelopeBytes, len - kGpuEnvelopeBytes);
  Task base;
  base.SerializeBaseIn(in);
  if (!in.ok()) {  // truncated bytes, or an invalid pool query (SerializeBaseIn)
    return EncodeErrorAnswer(id, ErrorCode::kMalformed, "GPU request header is malformed", buf,
                             cap);
  }
  u32 module = 0;
  void *state = nullptr;
  if (!st.pools->Lookup(base.pool_id_, &module, &state, &st.cache)) {
    return EncodeErrorAnswer(id, ErrorCode::kUnknownPool, "no GPU container for this pool", buf,
                             cap);
  }
  st.rctx.pool_id_ = base.pool_id_;
  return ModuleList::Run(module, state, base.method_, base, in, id, buf, cap, st.rctx);
}

/**
 * Answers the request `word` of slot s (seq | len << 32). The caller has ordered the payload
 * after the word (an acquire load of it, or an acquire fence after a batch of polls).
 */
template <typename ModuleList, MemScope S>
CHI_GPU_FUN void ServeSlot(const GpuQueue<S> &q, u32 s, u64 word, ServerState &st) {
  alignas(16) char buf[kGpuPayloadBytes];
  const u32 seq = static_cast<u32>(word);
  const u32 len = static_cast<u32>(word >> 32);
  u32 out;
  if (len < kGpuEnvelopeBytes || len > q.payload_bytes_) {
    out = EncodeErrorAnswer(seq, ErrorCode::kMalformed, "GPU request length is out of range", buf,
                            q.payload_bytes_);
  } else {
    CopyChunks(buf, q.Payload(s), len);
    out = HandleRequest<ModuleList>(buf, len, q.payload_bytes_, st);
  }
  q.PutAnswer(s, seq, buf, out);
}

/**
 * Polls this thread's slots of q once and serves the new requests. `served` mirrors
 * q.served_ for those slots. True when any was served. The poll is a fixed, unrolled batch
 * of loads, all issued before any result is used: over PCIe the batch then costs one round
 * trip, where a loop storing each word before loading the next cost one per slot (seen on
 * an H200: 8 pinned words took ~12 us, most of a CPU->GPU round trip).
 */
template <typename ModuleList, MemScope S>
CHI_GPU_FUN bool ServeOwned(const GpuQueue<S> &q, u32 tid, u32 threads, u32 *served,
                            ServerState &st) {
  constexpr u32 kBatch = kMaxSlotsPerServerThread;
  // Constant indices only (every loop unrolled, the serve loop selects by comparison), so
  // `words` and `served` stay in registers and no load waits on a store to the stack.
  u64 words[kBatch];
  CHI_UNROLL
  for (u32 k = 0; k < kBatch; ++k) {
    const u32 s = tid + k * threads;
    words[k] = s < q.num_slots_ ? q.PeekRequest(s) : served[k];  // not ours: reads as served
  }
  u32 fresh = 0;
  CHI_UNROLL
  for (u32 k = 0; k < kBatch; ++k) {
    if (static_cast<u32>(words[k]) != served[k]) fresh |= 1u << k;
  }
  if (fresh == 0) return false;
  FenceAcquire<S>();  // one for the batch: the payloads were written before their words
  for (u32 k = 0; fresh != 0; ++k, fresh >>= 1) {
    if ((fresh & 1u) == 0) continue;
    u64 word = 0;
    CHI_UNROLL
    for (u32 j = 0; j < kBatch; ++j) word = j == k ? words[j] : word;
    const u32 s = tid + k * threads;
    ServeSlot<ModuleList>(q, s, word, st);
    CHI_UNROLL
    for (u32 j = 0; j < kBatch; ++j) served[j] = j == k ? static_cast<u32>(word) : served[j];
    q.served_[s] = static_cast<u32>(word);  // survives a pause: the next launch starts from it
  }
  return true;
}

/** Threads that serve a queue of `slots` slots: the fewest that own at most the poll batch. */
CHI_CROSS_FUN inline u32 ServerThreadsFor(u32 slots, u32 threads) {
  const u32 needed = (slots + kMaxSlotsPerServerThread - 1) / kMaxSlotsPerServerThread;
  return needed < threads ? (needed == 0 ? 1 : needed) : threads;
}

/** Copies the served sequences of this thread's slots of q into `served` (0 past the end). */
template <MemScope S>
CHI_GPU_FUN void LoadServed(const GpuQueue<S> &q, u32 tid, u32 threads, u32 *served) {
  for (u32 k = 0; k < kMaxSlotsPerServerThread; ++k) {
    const u32 s = tid + k * threads;
    served[k] = s < q.num_slots_ ? q.served_[s] : 0;
  }
}

/**
 * One round of a cpu2gpu owner (every lane of the warp calls it; `polls_cpu` marks the
 * owners). Each owner reads, in one batch and so one PCIe round trip, the doorbell and the
 * request word of its first slot: host threads claim the lowest free slots, so with up to
 * one submitter per owner every post is found and served in that one read. The doorbell
 * counts every post; the owners add the posts they took that way (warp-wide) to the count
 * they have seen, and only when the doorbell is ahead of it do they fence and scan all
 * their slots. A post the scan misses keeps the doorbell ahead, so it is found next round.
 * True when this thread served a request.
 */
template <typename ModuleList>
CHI_GPU_FUN bool ServeCpuPosts(const GpuQueue<MemScope::kSystem> &q, u32 ctid, u32 owners,
                               bool polls_cpu, u32 warp, u32 *served, u64 *bell_seen,
                               ServerState &st) {
  u64 bell = 0;
  bool fast = false;
  if (polls_cpu) {
    st.rctx.from_cpu_ = true;
    // The doorbell load goes first and the acquire load does not hold it back: they travel
    // together. No doorbell (a queue without one): every round scans, below.
    bell = q.doorbell_ != nullptr ? q.Doorbell() : ~*bell_seen;
    // acquire: a new request's payload is read right after it (a fence costs ~0.5 us).
    const u64 first = q.PeekRequestAcquire(ctid);  // ctid < owners <= num_slots_
    fast = static_cast<u32>(first) != served[0];
    if (fast) {
      ServeSlot<ModuleList>(q, ctid, first, st);
      served[0] = static_cast<u32>(first);
      q.served_[ctid] = served[0];  // survives a pause: the next launch starts from it
    }
  }
  *bell_seen += WarpCount(warp, fast);
  bool did = fast;
  if (polls_cpu && bell != *bell_seen) {
    FenceAcquire<MemScope::kSystem>();  // request words posted before that count show
    *bell_seen = bell;
    did |= ServeOwned<ModuleList>(q, ctid, owners, served, st);
  }
  st.rctx.from_cpu_ = false;
  return did;
}

/** The orchestrator loop of server thread `tid` of `threads`, until the exit flag is set. */
template <typename ModuleList>
CHI_GPU_FUN void ServeLoop(const ServerArgs &a, u32 tid, u32 threads) {
  const GpuQueue<MemScope::kDevice> g2g = *a.gpu2gpu;  // immutable while the kernel runs
  const GpuQueue<MemScope::kSystem> c2g = *a.cpu2gpu;
  u32 served_g2g[kMaxSlotsPerServerThread];
  u32 served_c2g[kMaxSlotsPerServerThread];
  const u32 ctid = threads - 1 - tid;  // this thread's place among the cpu2gpu owners
  const u32 c2g_owners = ServerThreadsFor(c2g.num_slots_, threads);
  LoadServed(g2g, tid, threads, served_g2g);
  LoadServed(c2g, ctid, c2g_owners, served_c2g);
  ServerState st{a.pools, GpuPoolCache{}, GpuRunContext{}};
  st.rctx.gpu_id_ = a.gpu_id;
  st.rctx.server_thread_ = tid;
  const bool polls_cpu = ctid < c2g_owners;
  const u32 warp = WarpMask();  // every lane of the warp enters the loop together
  u32 idle = 0;
  u64 bell_seen = ~0ull;  // never a real count: the first round scans (posts before a pause)
  for (u32 round = 1;; ++round) {
    bool did = ServeOwned<ModuleList>(g2g, tid, threads, served_g2g, st);
    did |= ServeCpuPosts<ModuleList>(c2g, ctid, c2g_owners, polls_cpu, warp, served_c2g,
                                     &bell_seen, st);
    did = WarpAny(warp, did);  // the warp goes round together (see WarpAny)
    if (did) {
      idle = 0;
    } else if (idle < (1u << 20)) {
      Backoff(++idle, kServerIdleMaxNs);
    } else {
      Backoff(idle, kServerIdleMaxNs);
    }
    // relaxed: a late look at the flag only delays the exit by one more round. The vote makes
    // the whole warp leave in the same round.
    if (round % kExitCheckRounds == 0 &&
        WarpAny(warp, a.control->exit_.Load(MemOrder::kRelaxed) != 0)) {
      break;
    }
  }
}

}  // namespace chi::gpu
