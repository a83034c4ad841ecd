// The shm server's poller thread (ShmServerCore's, shm_server_core.h): notices clients
// that come and go, reads the request streams no worker reads (and those workers hand
// over or leave waiting), writes the answers workers queued, reaps dead clients, and
// parks when none of that is due. Included by shm_server_core.h after the class; not
// meant to be included on its own.
#pragma once

#include "chi/transport/shm_server_core.h"  // the class these functions belong to

namespace chi {

void ShmServerCore::Run() {
  pthread_setname_np(pthread_self(), "chi-shm-poller");
  u64 next_reap = MonotonicNs() + shm_server::kReapIntervalNs;
  u64 next_look = 0;
  u64 idle_since = 0;
  bool woke = true;
  for (u32 pass = 0;; ++pass) {
    bool worked = false;
    // A look at the streams the workers read, every kPollerLookNs (PollerMayRead).
    bool look = false;
    if ((pass & 63) == 0 || woke) {
      const u64 clock = MonotonicNs();
      // relaxed: read by clients' liveness checks only, as a clock value.
      header_->heartbeat_ns_.Store(clock, MemOrder::kRelaxed);
      const bool rang = std::exchange(rang_, false);  // a client rang: look now
      look = clock >= next_look || rang;
      if (look) next_look = clock + shm_server::kPollerLookNs;
      woke = false;
    }
    // relaxed: a hint; a request the workers leave is handed over (handoff) or found by
    // a look, and EndPolling re-checks the streams before a worker stops reading.
    const bool workers_read = header_->worker_readers_.Load(MemOrder::kRelaxed) != 0;
    // acquire: a client's slot writes before its membership bump are visible.
    u32 seq = header_->membership_seq_.Load(MemOrder::kAcquire);
    if (seq != seen_membership_) {
      seen_membership_ = seq;
      reaper_->Scan(false);
      worked = true;
    }
    // acquire: Stop wrote stop_deadline_ before it raised the flag.
    const bool reading = stopping_.Load(MemOrder::kAcquire) == 0;
    // By index: a corrupt stream moves its slot out of the serving list.
    const std::vector<u32> &serving = reaper_->Serving();
    for (size_t k = 0; k < serving.size(); ++k) {
      const u32 i = serving[k];
      if (reading && PollerMayRead(i, workers_read, look)) worked |= PumpRequests(i);
      if (slots_[i].phase != Phase::kServing) continue;
      worked |= answers_.Pump(i, slots_[i]);
      // An answer that waits for room in a stream or region whose positions its client
      // forged would wait forever: the slot is reset instead.
      if (slots_[i].outgoing_open && !answers_.PositionsValid(i, slots_[i])) {
        reaper_->Break(i, ErrorCode::kMalformed);
        worked = true;
      }
    }
    if (wake_parked_) {
      // A look found requests stalled or piling up while workers read: wake a parked
      // worker, which takes such slots over (ShmSlotAffinity). The poller does not read
      // them itself: it could only hand them to the lanes, maybe of the very worker that
      // is stuck, and beside busy workers that cost 4 clients on 4 workers a third of
      // their throughput.
      wake_parked_ = false;
      if (WorkOrchestrator *orch = dispatcher_->Orchestrator()) orch->WakeParkedLowLatency();
    }
    worked |= reaper_->DrainAll();
    if (!reading && (Quiet() || MonotonicNs() >= stop_deadline_)) break;
    if (worked) {
      idle_since = 0;
      if ((pass & 1023) != 0) continue;
    } else if ((pass & 63) != 0) {
      CpuRelax();
      continue;
    }
    const u64 now = MonotonicNs();
    if (now >= next_reap) {
      reaper_->Scan(true);
      next_reap = now + (reaper_->Busy() ? shm_server::kReapIntervalNs : shm_server::kIdleScanNs);
    }
    if (worked) continue;
    if (idle_since == 0) idle_since = now;
    // While workers read the request streams the poller is not needed for requests:
    // it parks at once instead of competing with them for the CPU (ReadyToRun's
    // re-check decides), and wakes for its next look while requests wait.
    if (!workers_read && now - idle_since < shm_server::kPollerSpinNs) {
      sched_yield();  // a worker or client sharing this CPU runs meanwhile
      continue;
    }
    u64 deadline = reading ? next_reap : stop_deadline_;
    if (reading && workers_read && RequestsWaiting() && next_look < deadline) {
      deadline = next_look;
    }
    header_->server_event_.Wait([&] { return ReadyToRun(); }, deadline,
                                header_->stats_.poller_waits);
    idle_since = 0;
    woke = true;
  }
}

bool ShmServerCore::PollerMayRead(u32 i, bool workers_read, bool look) {
  ShmServedSlot &s = slots_[i];
  if (!workers_read) return true;
  // relaxed: set before the worker's Notify; PumpRequests clears it before reading.
  if (s.handoff.Load(MemOrder::kRelaxed) != 0) return true;
  if (!look) return false;
  // relaxed: the look below reads the stream itself; a ring after this store rings again.
  ShmClientSlot *slot = segment_.Slot(i);
  if (slot->client_rang_.Load(MemOrder::kRelaxed) != 0) {
    slot->client_rang_.Store(0, MemOrder::kRelaxed);
  }
  const ShmStream rs = segment_.RequestStream(i);
  if (rs.Unframed()) return true;  // bytes with no record: the poller breaks the slot
  // Stalled (the same request waited at two looks: its home is busy) or piling up (more
  // than one request waited at both): a parked worker should join the readers.
  const u64 seen = rs.HasData() ? rs.ReadPosition() + 1 : 0;
  const bool queue = rs.UsedBytes() > 2 * kCacheLine;
  wake_parked_ |= (seen != 0 && seen == s.poller_seen) || (queue && s.poller_queue);
  s.poller_seen = seen;
  s.poller_queue = queue;
  return false;
}

bool ShmServerCore::RequestsWaiting() const {
  for (u32 i : reaper_->Serving()) {
    if (segment_.RequestStream(i).HasData()) return true;
  }
  return false;
}

bool ShmServerCore::ReadyToRun() {
  if (stopping_.Load(MemOrder::kSeqCst) != 0 && Quiet()) return true;
  if (header_->membership_seq_.Load(MemOrder::kSeqCst) != seen_membership_) return true;
  const bool reading = stopping_.Load(MemOrder::kSeqCst) == 0;
  // seq_cst: Dekker with EndPolling, which clears its bit and then re-checks the streams.
  const bool workers_read = header_->worker_readers_.Load(MemOrder::kSeqCst) != 0;
  for (u32 i : reaper_->Serving()) {
    ShmServedSlot &s = slots_[i];
    if (s.pending_count.Load(MemOrder::kSeqCst) != 0 ||
        s.error_count.Load(MemOrder::kSeqCst) != 0) {
      return true;
    }
    // seq_cst: a client whose requests wait unread rang (RingIfUnread): look at once.
    if (workers_read && segment_.Slot(i)->client_rang_.Load(MemOrder::kSeqCst) != 0) {
      rang_ = true;
      return true;
    }
    // seq_cst: a worker stores the hand-over before its Notify.
    const bool ours = !workers_read || s.handoff.Load(MemOrder::kSeqCst) != 0;
    if (reading && ours && segment_.RequestStream(i).HasDataSeqCst() &&
        s.accepted.Load(MemOrder::kRelaxed) - s.answered.Load(MemOrder::kSeqCst) <
            options_.max_outstanding) {
      return true;
    }
    if (s.outgoing_open && segment_.AnswerStream(i).HasRoomSeqCst(1)) return true;
  }
  return reaper_->DrainingHasWork();
}

bool ShmServerCore::Quiet() const {
  for (u32 i = 0; i < options_.num_slots; ++i) {
    if (slots_[i].InFlight() != 0) return false;
  }
  return true;
}

bool ShmServerCore::PumpRequests(u32 i) {
  ShmServedSlot &s = slots_[i];
  const ShmStream rs = segment_.RequestStream(i);
  // An empty stream costs no write of the flag's line (workers write it as they answer).
  // Unframed: bytes published with no record, which only this slow check sees.
  if (!rs.HasData() && !rs.Unframed()) {
    // relaxed: what a worker handed over is gone (a worker took it after all).
    if (s.handoff.Load(MemOrder::kRelaxed) != 0) s.handoff.Store(0, MemOrder::kRelaxed);
    return false;
  }
  u32 idle = 0;
  // acquire: a worker's reads and counts are complete before ours. Busy: a worker reads.
  if (!s.reader.CompareExchange(idle, 1, MemOrder::kAcquire)) return false;
  s.handoff.Store(0, MemOrder::kRelaxed);  // relaxed: we read whatever it pointed at now
  const bool worked = PumpRequestsLocked(i, s);
  s.UnlockReader();
  if (worked) {
    NoteCpu(segment_.Slot(i)->runtime_cpu_);
    segment_.Slot(i)->request_room_.Notify();
  }
  return worked;
}

bool ShmServerCore::PumpRequestsLocked(u32 i, ShmServedSlot &s) {
  const ShmStream rs = segment_.RequestStream(i);
  bool worked = false;
  for (u32 n = 0; n < shm_server::kRecordsPerPass; ++n) {
    if (!HasCredit(s)) break;
    ShmStream::Piece p;
    ShmStream::PeekResult r = rs.Peek(&p);
    if (r == ShmStream::PeekResult::kEmpty && !rs.Unframed()) break;
    worked = true;
    if (r != ShmStream::PeekResult::kReady) {
      reaper_->Break(i, ErrorCode::kMalformed);
      return true;
    }
    if (p.kind == ShmStream::kRef) {
      if (ErrorCode bad = TakeRef(i, s, p); bad != ErrorCode::kOk) {
        reaper_->Break(i, bad);
        return true;
      }
      rs.Consume(p);
      continue;
    }
    if (!s.assembling) {
      if (p.kind != ShmStream::kBegin) {
        reaper_->Break(i, ErrorCode::kMalformed);
        return true;
      }
      if (p.message_bytes > options_.max_message_bytes) {
        reaper_->Break(i, ErrorCode::kTooLarge);
        return true;
      }
      if (p.bytes == p.message_bytes && p.Contiguous()) {
        // The record stays unconsumed while decoding, so the client cannot reuse it.
        Dispatch(i, p.first, p.bytes);
        rs.Consume(p);
        continue;
      }
      s.assembly.bytes.clear();
      s.assembly_total = p.message_bytes;
      s.assembling = true;
      s.assembly_by_ref = false;
    } else if (p.kind != ShmStream::kMore || s.assembly_by_ref ||
               p.bytes > s.assembly_total - s.assembly.bytes.size()) {
      reaper_->Break(i, ErrorCode::kMalformed);
      return true;
    }
    if (!AppendToAssembly(s, p.first, p.first_bytes) ||
        !AppendToAssembly(s, p.second, p.second_bytes)) {
      reaper_->Break(i, ErrorCode::kOutOfMemory);
      return true;
    }
    rs.Consume(p);
    if (s.assembly.bytes.size() == s.assembly_total) {
      s.assembling = false;
      Dispatch(i, s.assembly.bytes.data(), s.assembly.bytes.size());
      RecycleBuffer(&s.assembly);
    }
  }
  return worked;
}

}  // namespace chi
