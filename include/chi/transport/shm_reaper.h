// The shared-memory transport's process reaper: the life of the runtime's client slots.
// ShmServer's poller runs it to notice clients that connect, close, die (their pid is
// gone) or corrupt their request stream, to drain what they left in flight, and to reset
// their slot for the next client. Invariant: a slot is reset only once its owner is gone
// and none of its tasks is in flight (checked holding the slot's reader flag, since workers
// take requests in too), so a late answer never reaches the next owner.
#pragma once

#include <deque>   // error answers waiting for room (error path only)
#include <new>     // placement new of a slot's wait events
#include <vector>  // assembly and answer buffers, slot lists

#include "chi/core/atomic.h"            // Atomic, CpuRelax
#include "chi/core/caller.h"            // Caller: the verified owner of a slot
#include "chi/core/status.h"            // ErrorCode
#include "chi/queue/mpsc_ring.h"        // finished tasks handed from workers to the poller
#include "chi/runtime/spin_lock.h"      // error answers queued by workers and the poller
#include "chi/task/task_ops.h"          // DeleteTask of discarded answers
#include "chi/transport/message_buffer.h"  // ReleaseBuffer of a reset slot
#include "chi/transport/shm_process.h"  // IsProcessAlive
#include "chi/transport/shm_region_backing.h"  // ShmRegionBacking of the answer region
#include "chi/transport/shm_segment.h"  // the slot table in the segment
#include "chi/transport/shm_stream.h"   // stream resets

namespace chi {

/** What the runtime knows about one client slot (private to the runtime process). */
struct alignas(kCacheLine) ShmServedSlot {
  enum class Phase : u32 { kIdle, kServing, kDraining };

  /// Values of `writer`: who appends. A worker holds it for one small answer, so another
  /// worker waits a little for it; the poller may hold it across a long stream.
  static constexpr u32 kWorkerWrites = 1;
  static constexpr u32 kPollerWrites = 2;

  // Line 0: written by the workers that answer (and by the poller when it writes).
  Atomic<u32> writer;         ///< non-zero (kWorkerWrites, kPollerWrites) while someone appends
  Atomic<u32> reader;         ///< 1 while someone (poller or worker) reads the request stream
  Atomic<u32> completing;     ///< workers inside OnComplete for this slot right now
  Atomic<u32> pending_count;  ///< tasks in `pending` (the poller's park re-check)
  Atomic<u64> answered;       ///< requests answered or discarded, ever
  /// The writer flag holder's position in the answer data region (read for statistics).
  Atomic<u64> answer_data_w;
  /// The writer flag holder's: how much of the answer data region /dev/shm backed.
  ShmRegionBacking answer_backing;

  // Line 1: read by the workers, written by the poller only on rare events.
  alignas(kCacheLine) Atomic<u32> draining;  ///< 1: answers of this slot are discarded
  Atomic<u32> credit_wait;  ///< 1: the poller stopped reading until an answer frees a credit
  Atomic<u32> handoff;      ///< 1: a worker left requests it cannot take for the poller
  MpscRing<u64> *pending = nullptr;  ///< finished tasks whose answers the poller writes
  void *pending_mem = nullptr;
  Atomic<u32> error_count;  ///< entries of `errors` (the poller's park re-check)
  SpinLock errors_lock;     ///< guards `errors` (pushed by any reader, popped by the poller)
  std::deque<std::vector<char>> errors;  ///< error answers not yet written

  // The reader flag holder's. In flight = accepted - answered.
  alignas(kCacheLine) Atomic<u64> accepted;  ///< requests taken in (and error answers), ever
  u64 answered_seen = 0;                     ///< the reader's last view of `answered`
  bool assembling = false;                   ///< a request arriving in pieces (the poller's)
  u64 poller_seen = 0;  ///< the poller's: 1 + the read position it found waiting, or 0
  bool poller_queue = false;  ///< the poller's: more than one request waited at its last look
  bool assembly_by_ref = false;              ///< its pieces are chunks in the data region
  Phase phase = Phase::kIdle;
  ProcessIdentity owner;
  Caller caller;  ///< the owner as Activate verified it (CallerOf this slot's tasks)
  bool owner_dead = false;
  bool counts_as_reclaimed = false;
  MessageBuffer assembly;  ///< a request arriving in pieces
  u64 assembly_total = 0;
  MessageBuffer outgoing;  ///< an answer being streamed (writer held meanwhile)
  u64 outgoing_sent = 0;
  bool outgoing_open = false;

  /** Queues an error answer for the poller to write (any reader). */
  void PushError(std::vector<char> &&answer) {
    errors_lock.lock();
    errors.push_back(std::move(answer));
    errors_lock.unlock();
    // seq_cst: the count is what the parked poller re-checks (Dekker with its park).
    error_count.FetchAdd(1, MemOrder::kSeqCst);
  }

  /** Takes the oldest error answer; false when there is none. */
  bool PopError(std::vector<char> *out) {
    if (error_count.Load(MemOrder::kRelaxed) == 0) return false;  // relaxed: a hint
    errors_lock.lock();
    const bool have = !errors.empty();
    if (have) {
      *out = std::move(errors.front());
      errors.pop_front();
    }
    errors_lock.unlock();
    if (have) error_count.FetchSub(1, MemOrder::kRelaxed);  // relaxed: only a "look" hint
    return have;
  }

  /** Takes the reader flag, waiting for a worker that holds it (never long: it never blocks). */
  void LockReader() {
    u32 idle = 0;
    // acquire: the previous reader's reads and counts are complete before ours.
    while (!reader.CompareExchange(idle, 1, MemOrder::kAcquire)) {
      idle = 0;
      CpuRelax();
    }
  }
  /** Hands the reader flag back. */
  void UnlockReader() { reader.Store(0, MemOrder::kRelease); }  // release: our reads first

  /** Requests not yet answered or discarded. */
  u64 InFlight() const {
    // relaxed accepted: written by the poller, or read after it was joined. acquire
    // answered: a completer's last touches of the slot come before its count.
    u64 taken = accepted.Load(MemOrder::kRelaxed);
    return taken - answered.Load(MemOrder::kAcquire);
  }

  /** Ends one request's life here; wakes the poller if it waits for this credit. */
  void ReleaseCredit(WaitEvent &poller) {
    // seq_cst: release orders our stream writes and frees before the count; seq_cst
    // pairs with the poller's credit_wait store and re-read (Dekker).
    answered.FetchAdd(1, MemOrder::kSeqCst);
    if (credit_wait.Load(MemOrder::kSeqCst) != 0) poller.Notify();
  }
};

/** Walks the slot table for the poller and moves slots through their phases. */
class ShmReaper {
 public:
  using Phase = ShmServedSlot::Phase;

  /** serving_bits: one bit per slot, set while workers may read its requests. */
  ShmReaper(ShmSegment *segment, ShmServedSlot *slots, u32 num_slots, Atomic<u64> *serving_bits)
      : segment_(segment), slots_(slots), num_slots_(num_slots), serving_bits_(serving_bits) {}

  /** Slots being served (the poller reads their requests). */
  const std::vector<u32> &Serving() const { return serving_; }
  /** True while some slot is served or drained (liveness checks are due). */
  bool Busy() const { return !serving_.empty() || !draining_.empty(); }

  /**
   * Walks the table: serves newly active slots, starts draining closed ones and, with
   * check_liveness (it reads /proc), those whose owner died. Publishes the statistics.
   */
  void Scan(bool check_liveness) {
    for (u32 i = 0; i < num_slots_; ++i) {
      ShmClientSlot *slot = segment_->Slot(i);
      ShmServedSlot &s = slots_[i];
      // acquire: the client's set-up writes come before its state change.
      const u32 state = slot->state_.Load(MemOrder::kAcquire);
      const u32 pid = slot->owner_pid_.Load(MemOrder::kAcquire);
      const ProcessIdentity owner{pid, slot->owner_start_ticks_.Load(MemOrder::kAcquire)};
      switch (s.phase) {
        case Phase::kIdle:
          if (state == static_cast<u32>(ShmSlotState::kActive)) {
            Activate(i, owner);
          } else if (pid != 0 && (state == static_cast<u32>(ShmSlotState::kClosed) ||
                                  (check_liveness && !IsProcessAlive(owner)))) {
            Reset(i);  // left (or died) before it was ever served
          }
          break;
        case Phase::kServing:
          if (state == static_cast<u32>(ShmSlotState::kClosed)) {
            BeginDrain(i, false);
          } else if (check_liveness && !IsProcessAlive(s.owner)) {
            s.owner_dead = true;
            BeginDrain(i, true);
          }
          break;
        case Phase::kDraining:
          if (check_liveness && !s.owner_dead && !IsProcessAlive(s.owner)) s.owner_dead = true;
          break;
      }
    }
    PublishStats();
  }

  /** Slot i's request stream is corrupt: tell its client, reclaim the slot once it leaves. */
  void Break(u32 i, ErrorCode why) {
    ShmClientSlot *slot = segment_->Slot(i);
    slot->broken_code_.Store(static_cast<u32>(why), MemOrder::kRelaxed);
    // seq_cst: pairs with the client's park re-check of its slot state.
    slot->state_.Store(static_cast<u32>(ShmSlotState::kBroken), MemOrder::kSeqCst);
    slot->answer_ready_.Notify();
    slot->request_room_.Notify();
    auto &broken = segment_->Header()->stats_.broken_streams;
    broken.Store(broken.Load(MemOrder::kRelaxed) + 1, MemOrder::kRelaxed);  // relaxed: a stat
    BeginDrain(i, true);
  }

  /** Advances every draining slot; true when one was reset. */
  bool DrainAll() {
    bool reset = false;
    for (size_t k = 0; k < draining_.size();) {
      if (DrainStep(draining_[k])) {
        draining_[k] = draining_.back();
        draining_.pop_back();
        reset = true;
      } else {
        ++k;
      }
    }
    return reset;
  }

  /** True when a draining slot has answers to drop (the poller's park re-check). */
  bool DrainingHasWork() const {
    for (u32 i : draining_) {
      // seq_cst: the re-check against a completer's seq_cst count.
      if (slots_[i].pending_count.Load(MemOrder::kSeqCst) != 0) return true;
    }
    return false;
  }

  /** Drops the answers and error answers slot i still holds (draining, or on Stop). */
  void DiscardQueued(u32 i) {
    ShmServedSlot &s = slots_[i];
    WaitEvent &poller = segment_->Header()->server_event_;
    std::vector<char> dropped;
    while (s.PopError(&dropped)) s.ReleaseCredit(poller);
    if (s.outgoing_open) {
      s.outgoing_open = false;
      ReleaseBuffer(&s.outgoing);
      s.writer.Store(0, MemOrder::kRelease);  // release: nothing of ours follows
      s.ReleaseCredit(poller);
    }
    u64 v = 0;
    while (s.pending->TryPop(v)) {
      s.pending_count.FetchSub(1, MemOrder::kRelaxed);  // relaxed: the poller's own count
      DeleteTask(reinterpret_cast<Task *>(v));
      s.ReleaseCredit(poller);
    }
  }

  /** Writes `clients` and `bytes_in_use` into the segment's statistics. */
  void PublishStats() {
    u64 bytes = 0;
    auto count = [&](u32 i) {
      const ShmServedSlot &s = slots_[i];
      const u64 outgoing = s.outgoing_open ? s.outgoing.bytes.size() - s.outgoing_sent : 0;
      bytes += segment_->RequestStream(i).UsedBytes() + segment_->AnswerStream(i).UsedBytes() +
               s.assembly.bytes.size() + outgoing;
      // Answers in the runtime data region the client has not freed yet. relaxed: statistics.
      const u64 w = s.answer_data_w.Load(MemOrder::kRelaxed);
      const u64 freed = segment_->Slot(i)->answer_data_released_.Load(MemOrder::kRelaxed);
      if (freed <= w) bytes += w - freed;
    };
    for (u32 i : serving_) count(i);
    for (u32 i : draining_) count(i);
    ShmStatsBlock &stats = segment_->Header()->stats_;
    // relaxed: statistics, read on their own.
    stats.clients.Store(static_cast<u32>(serving_.size()), MemOrder::kRelaxed);
    stats.bytes_in_use.Store(bytes, MemOrder::kRelaxed);
  }

 private:
  /**
   * Who may own a slot: a live process (pid and start time as the slot records them), of
   * the runtime's user or root by the kernel's word, and never the runtime itself. The pid
   * a client writes into its slot is only its claim; this is what the runtime checks of it.
   */
  static Status VerifyOwner(const ProcessIdentity &owner, Caller *out) {
    if (owner.pid == 0 || owner.pid == static_cast<u32>(getpid())) {
      return Status::Errorf(ErrorCode::kPermissionDenied,
                            "shm slot claimed for pid %u, which is no client process",
                            owner.pid);
    }
    const detail::ProcStat st = detail::ReadProcStat(owner.pid);
    const u32 uid = ProcessUid(owner.pid);
    if (!st.found || st.state == 'Z' || st.state == 'X' || st.start_ticks != owner.start_ticks ||
        uid == Caller::kNoUid) {
      return Status::Errorf(ErrorCode::kPermissionDenied,
                            "shm slot claimed for pid %u with a start time that process does "
                            "not have",
                            owner.pid);
    }
    if (!Caller::IsRuntimeUid(uid)) {
      return Status::Errorf(ErrorCode::kPermissionDenied,
                            "shm slot claimed for pid %u, which runs as uid %u (the runtime "
                            "serves uid %u)",
                            owner.pid, uid, static_cast<u32>(getuid()));
    }
    *out = Caller{Caller::Via::kShm, owner.pid, uid};
    return Status::Ok();
  }

  /** Starts serving slot i, or breaks it when its claimed owner fails VerifyOwner. */
  void Activate(u32 i, const ProcessIdentity &owner) {
    ShmServedSlot &s = slots_[i];
    Caller caller;
    if (!VerifyOwner(owner, &caller).ok()) {
      s.phase = Phase::kServing;  // never readable: its serving bit stays clear
      s.owner = owner;
      s.caller = Caller{};
      serving_.push_back(i);
      Break(i, ErrorCode::kPermissionDenied);
      return;
    }
    s.caller = caller;
    // The first requests then take no page faults. The client backed the pages when it
    // connected (it refuses rings /dev/shm cannot back), so the result says nothing new.
    (void)segment_->RequestStream(i).Prefault();
    (void)segment_->AnswerStream(i).Prefault();
    s.phase = Phase::kServing;
    s.owner = owner;
    s.owner_dead = false;
    s.counts_as_reclaimed = false;
    serving_.push_back(i);
    // release: the slot's set-up above precedes a worker's read of the bit.
    serving_bits_[i / 64].FetchOr(1ull << (i % 64), MemOrder::kRelease);
  }

  /** Stops serving slot i; its tasks finish and their answers are dropped. */
  void BeginDrain(u32 i, bool counts_as_reclaimed) {
    ShmServedSlot &s = slots_[i];
    s.phase = Phase::kDraining;
    s.counts_as_reclaimed = counts_as_reclaimed;
    // relaxed: readers check the bit holding the reader flag, which DrainStep takes after
    // this, so none takes a request in once DrainStep has seen the slot idle.
    serving_bits_[i / 64].FetchAnd(~(1ull << (i % 64)), MemOrder::kRelaxed);
    // seq_cst: completers that read it from now on drop their answers.
    s.draining.Store(1, MemOrder::kSeqCst);
    // The partial request (assembling, assembly) belongs to the reader flag's holder; a
    // worker may hold it now. Reset clears both under the flag.
    for (size_t k = 0; k < serving_.size(); ++k) {
      if (serving_[k] == i) {
        serving_[k] = serving_.back();
        serving_.pop_back();
        break;
      }
    }
    draining_.push_back(i);
    PublishStats();
  }

  /** Drops what a draining slot holds; resets it (true) once its owner is gone and idle. */
  bool DrainStep(u32 i) {
    DiscardQueued(i);
    ShmServedSlot &s = slots_[i];
    s.LockReader();  // a worker that took a request in has counted it when it lets go
    const bool busy = s.InFlight() != 0;  // completers' last touches come before their count
    s.UnlockReader();
    if (busy) return false;
    // acquire: the client's last writes to the slot come before its kClosed.
    const u32 state = segment_->Slot(i)->state_.Load(MemOrder::kAcquire);
    if (state != static_cast<u32>(ShmSlotState::kClosed) && !s.owner_dead) return false;
    Reset(i);
    return true;
  }

  /** Empties slot i and hands it back to the table (owner gone, nothing in flight). */
  void Reset(u32 i) {
    ShmServedSlot &s = slots_[i];
    ShmClientSlot *slot = segment_->Slot(i);
    u32 idle = 0;
    // acquire: a completer that slipped past the draining flag finishes its append first.
    while (!s.writer.CompareExchange(idle, ShmServedSlot::kPollerWrites, MemOrder::kAcquire)) {
      idle = 0;
      CpuRelax();
    }
    s.LockReader();  // a worker that glanced at the stream is gone from it
    segment_->RequestStream(i).Reset();
    segment_->AnswerStream(i).Reset();
    // relaxed: as below. The data regions start over with the streams that name them.
    slot->request_data_released_.Store(0, MemOrder::kRelaxed);
    slot->answer_data_released_.Store(0, MemOrder::kRelaxed);
    s.answer_data_w.Store(0, MemOrder::kRelaxed);
    s.answer_backing = ShmRegionBacking();  // pages stay backed: a new client re-asks cheaply
    new (&slot->answer_ready_) WaitEvent();  // a dead client may have died parked
    new (&slot->request_room_) WaitEvent();
    // relaxed: nobody else uses the slot now; the owner_pid_ release below publishes all.
    slot->runtime_needs_room_.Store(0, MemOrder::kRelaxed);
    slot->broken_code_.Store(0, MemOrder::kRelaxed);
    slot->owner_start_ticks_.Store(0, MemOrder::kRelaxed);
    slot->generation_.Store(slot->generation_.Load(MemOrder::kRelaxed) + 1, MemOrder::kRelaxed);
    slot->state_.Store(static_cast<u32>(ShmSlotState::kFree), MemOrder::kRelaxed);
    const bool reclaimed_one = s.phase != Phase::kIdle && s.counts_as_reclaimed;
    s.phase = Phase::kIdle;
    s.owner = ProcessIdentity{};
    s.caller = Caller{};
    s.owner_dead = false;
    s.counts_as_reclaimed = false;
    s.assembling = false;
    // Kept between messages (message_buffer.h); the slot's next client starts without them.
    ReleaseBuffer(&s.assembly);
    if (!s.outgoing_open) ReleaseBuffer(&s.outgoing);  // DiscardQueued closed a half-sent one
    s.draining.Store(0, MemOrder::kRelaxed);  // relaxed: no completer of this slot is left
    s.UnlockReader();
    s.writer.Store(0, MemOrder::kRelease);  // release: the stream resets come first
    // release: the reset slot is complete before a client can claim it.
    slot->owner_pid_.Store(0, MemOrder::kRelease);
    if (reclaimed_one) {
      // Counted once the slot is free: whoever reads the count (release: with acquire)
      // can claim the slot at once. Only the poller writes it.
      auto &reclaimed = segment_->Header()->stats_.reclaimed_clients;
      reclaimed.Store(reclaimed.Load(MemOrder::kRelaxed) + 1, MemOrder::kRelease);
    }
    PublishStats();
  }

  ShmSegment *segment_;
  ShmServedSlot *slots_;
  u32 num_slots_;
  Atomic<u64> *serving_bits_;  ///< the ShmServerCore's; set in Activate, cleared in BeginDrain
  std::vector<u32> serving_;   ///< the poller's: slots in Phase::kServing
  std::vector<u32> draining_;  ///< the poller's: slots in Phase::kDraining
};

}  // namespace chi
