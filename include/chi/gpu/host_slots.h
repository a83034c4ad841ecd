// How CPU processes share one GPU's cpu2gpu queue: the runtime's GpuWorker and every pure
// client that attached the queue's pinned segment claim slots with a CAS on the slot's
// claim word (in that shared segment), which holds the claimer's pid while the slot is held.
// Invariant: the claim word is the only ownership record, so a dead claimer is always
// identifiable, and its slot is freed only once the request it posted has been answered.
// Only host code uses these claim words (GPU clients use gpu2gpu/gpu2cpu, see mailbox.h).
#pragma once

#include "chi/core/atomic.h"   // MemOrder
#include "chi/core/types.h"    // u32, u64
#include "chi/gpu/mailbox.h"   // GpuQueue, kNoSlot, claim::kFree

namespace chi::gpu {

using HostQueue = GpuQueue<MemScope::kSystem>;

/** Claims a free slot for process `pid`, looking from `start`; kNoSlot when all are held. */
inline u32 ClaimHostSlot(const HostQueue &q, u32 start, u32 pid) {
  for (u32 i = 0; i < q.num_slots_; ++i) {
    const u32 s = (start + i) % q.num_slots_;
    u32 expected = claim::kFree;
    // acquire: the previous owner's request word and payload reads come before our use.
    if (q.claims_[s].CompareExchange(expected, pid, MemOrder::kAcquire)) return s;
  }
  return kNoSlot;
}

/**
 * The sequence number the next request in held slot s must carry: one past the last one
 * any process posted there (a per-process counter would repeat the server's served value).
 */
inline u32 NextHostSeq(const HostQueue &q, u32 s) {
  // relaxed: our claim's acquire ordered the previous owner's post (it released the claim
  // after its post) before this read.
  return NextSeq(static_cast<u32>(q.request_[s].Load(MemOrder::kRelaxed)));
}

/** Gives held slot s back (its answer has been read, or it was never posted). */
inline void ReleaseHostSlot(const HostQueue &q, u32 s) {
  // release: our reads of the answer happen before the next owner writes the payload.
  q.claims_[s].Store(claim::kFree, MemOrder::kRelease);
}

/** The pid holding slot s (0 when free). */
inline u32 HostSlotOwner(const HostQueue &q, u32 s) {
  return q.claims_[s].Load(MemOrder::kAcquire);  // acquire: pairs with the claim CAS
}

/** Slots held right now (by any process). */
inline u32 CountHeldHostSlots(const HostQueue &q) {
  u32 n = 0;
  for (u32 s = 0; s < q.num_slots_; ++s) n += HostSlotOwner(q, s) != 0 ? 1 : 0;
  return n;
}

/**
 * Frees the slots held by dead processes (alive(pid) false), skipping `self_pid`, once
 * their last request has been answered: the GPU no longer touches the payload then.
 * Slots still waiting for an answer are left for a later call. Returns how many it freed.
 */
template <typename Alive>
u32 ReapDeadHostClaims(const HostQueue &q, u32 self_pid, Alive alive) {
  u32 freed = 0;
  for (u32 s = 0; s < q.num_slots_; ++s) {
    u32 owner = HostSlotOwner(q, s);
    if (owner == claim::kFree || owner == self_pid || alive(owner)) continue;
    // acquire: the answer word is read before we hand the payload to another claimer.
    const u32 answered = static_cast<u32>(q.answer_[s].Load(MemOrder::kAcquire));
    const u32 posted = static_cast<u32>(q.request_[s].Load(MemOrder::kAcquire));
    if (answered != posted) continue;  // the GPU has not answered yet
    // release: a CAS, so a live process cannot lose a slot it claimed meanwhile.
    if (q.claims_[s].CompareExchange(owner, claim::kFree, MemOrder::kRelease)) ++freed;
  }
  return freed;
}

}  // namespace chi::gpu
