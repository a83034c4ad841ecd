// The working part of ShmServer (shm_server.h): the poller thread, the workers'
// in-place reading of request streams (a WorkerPoller), answers, and the reaper's
// slot life cycle. Heap-allocated by ShmServer so it can outlive a stuck Stop.
// Invariant: only the holder of a slot's `reader` flag reads its requests, only the
// holder of its `writer` flag appends answers.
#pragma once

#include <pthread.h>  // pthread_setname_np for the poller thread
#include <sched.h>    // sched_yield while the poller spins

#include <cstdlib>  // aligned_alloc / free for the pending-answer rings
#include <cstring>  // memcpy of request ids
#include <memory>   // unique_ptr
#include <new>      // bad_alloc of an assembly
#include <thread>   // the poller thread
#include <utility>  // std::move, std::exchange
#include <vector>   // answer buffers

#include "chi/core/atomic.h"                   // Atomic, CpuRelax
#include "chi/core/status.h"                   // Status, ErrorCode
#include "chi/queue/mpsc_ring.h"               // finished tasks handed from workers to the poller
#include "chi/queue/wait_event.h"              // MonotonicNs for the poller's clock
#include "chi/runtime/config.h"                // ServerConfig (segment sizes)
#include "chi/runtime/work_orchestrator.h"     // WorkerPoller installed on the workers
#include "chi/serialize/archive.h"             // OutputArchive for answers
#include "chi/task/task_ops.h"                 // DeleteTask
#include "chi/transport/message_buffer.h"      // RecycleBuffer of request assemblies
#include "chi/transport/request_dispatcher.h"  // decode + submit, error answers
#include "chi/transport/shm_process.h"         // SelfIdentity for the segment header
#include "chi/transport/shm_reaper.h"          // slot life cycle, ShmServedSlot
#include "chi/transport/shm_segment.h"         // segment layout, ShmServerInfo
#include "chi/transport/shm_server_answers.h"  // ShmAnswerWriter: answers back to clients
#include "chi/transport/shm_server_types.h"    // options, statistics, limits
#include "chi/transport/shm_slot_affinity.h"   // which worker reads which slot
#include "chi/transport/shm_stream.h"          // request and answer streams

namespace chi {

/** Everything the server runs on; heap-allocated so it can outlive a stuck Stop. */
class ShmServerCore final : public TaskCompleter, public WorkerPoller {
 public:
  ShmServerCore(RequestDispatcher *dispatcher, const ShmServerOptions &options)
      : dispatcher_(dispatcher), options_(options) {}

  ~ShmServerCore() {
    for (u32 i = 0; i < options_.num_slots && slots_ != nullptr; ++i) {
      std::free(slots_[i].pending_mem);
    }
  }

  Status Start(u32 port) {
    port_ = port;
    self_ = SelfIdentity();
    ShmGeometry g{options_.num_slots, options_.ring_bytes, options_.max_message_bytes,
                  options_.max_outstanding};
    slots_ = std::make_unique<ShmServedSlot[]>(options_.num_slots);
    serving_words_ = (options_.num_slots + 63) / 64;
    serving_bits_ = std::make_unique<Atomic<u64>[]>(serving_words_);
    const u32 pending_capacity = 2 * options_.max_outstanding;
    const size_t pending_bytes =
        RoundUpTo(MpscRing<u64>::BytesFor(pending_capacity), kCacheLine);
    for (u32 i = 0; i < options_.num_slots; ++i) {
      slots_[i].pending_mem = std::aligned_alloc(kCacheLine, pending_bytes);
      if (slots_[i].pending_mem == nullptr) {
        return Status::Error(ErrorCode::kOutOfMemory, "shm transport: no memory for slots");
      }
      slots_[i].pending = MpscRing<u64>::Create(slots_[i].pending_mem, pending_capacity);
    }
    if (Status st = data_.Open(options_.request_data_segment, options_.answer_data_segment,
                               options_.num_slots, &g.data);
        !st.ok()) {
      return st;
    }
    if (Status st = segment_.Create(port, g, self_); !st.ok()) return st;
    header_ = segment_.Header();
    // relaxed: published with the state below.
    header_->heartbeat_ns_.Store(MonotonicNs(), MemOrder::kRelaxed);
    reaper_ = std::make_unique<ShmReaper>(&segment_, slots_.get(), options_.num_slots,
                                          serving_bits_.get());
    // release: clients that see kServing see the initialised segment.
    header_->runtime_state_.Store(static_cast<u32>(ShmRuntimeState::kServing),
                                  MemOrder::kRelease);
    poller_ = std::thread([this] { Run(); });
    if (WorkOrchestrator *orch = dispatcher_->Orchestrator()) orch->InstallPoller(this);
    return Status::Ok();
  }

  /** Drains and stops; true when nothing references the core any more. */
  bool Stop() {
    // Workers read no more requests: from here on only the poller touches the streams,
    // so clients must wake it again (seq_cst: as in EndPolling).
    if (WorkOrchestrator *orch = dispatcher_->Orchestrator()) orch->RemovePoller(this);
    header_->worker_readers_.Store(0, MemOrder::kSeqCst);
    header_->server_event_.Notify();
    // seq_cst: clients re-check the state before they park (Dekker with Notify).
    header_->runtime_state_.Store(static_cast<u32>(ShmRuntimeState::kStopping),
                                  MemOrder::kSeqCst);
    stop_deadline_ = MonotonicNs() + shm_server::kStopGraceNs;
    // seq_cst: pairs with the poller's park re-check (it reads stopping_ there).
    stopping_.Store(1, MemOrder::kSeqCst);
    header_->server_event_.Notify();
    if (poller_.joinable()) poller_.join();
    // seq_cst: a completer either sees `stopped_` or is counted in `completing` when we
    // read it below (Dekker with OnComplete's entry).
    stopped_.Store(1, MemOrder::kSeqCst);
    for (u32 i = 0; i < options_.num_slots; ++i) {
      // seq_cst: the other half of that pair. Completers never block, so this is short.
      while (slots_[i].completing.Load(MemOrder::kSeqCst) != 0) CpuRelax();
    }
    // seq_cst: as above; every answer we sent precedes it, so clients read those first.
    header_->runtime_state_.Store(static_cast<u32>(ShmRuntimeState::kStopped),
                                  MemOrder::kSeqCst);
    bool quiet = true;
    for (u32 i = 0; i < options_.num_slots; ++i) {
      segment_.Slot(i)->answer_ready_.Notify();  // clients notice the stop now
      segment_.Slot(i)->request_room_.Notify();
      reaper_->DiscardQueued(i);
      if (slots_[i].InFlight() != 0) quiet = false;
    }
    if (quiet) {
      segment_.Destroy();
    } else {
      PosixShmBackend::DestroyByName(ShmSegmentName(port_));  // keep our mapping alive
    }
    return quiet;
  }

  ShmServerInfo Info() const {
    return ShmServerInfo{segment_.Name(), segment_.Size(), kShmTransportVersion, port_,
                         self_.pid};
  }
  const ShmSegmentHeader *Header() const { return header_; }
  /** The segment as this process mapped it (its geometry noted at create). */
  const ShmSegment &Segment() const { return segment_; }

  /**
   * Requests taken in and not yet answered or discarded, over every slot (any thread;
   * Monitor). `answered` is read first: each request it counts was counted in `accepted`
   * before, so the difference never wraps.
   */
  u64 TasksOutstanding() const {
    u64 n = 0;
    for (u32 i = 0; i < options_.num_slots; ++i) {
      const u64 answered = slots_[i].answered.Load(MemOrder::kAcquire);  // acquire: see above
      const u64 accepted = slots_[i].accepted.Load(MemOrder::kRelaxed);  // relaxed: a statistic
      n += accepted > answered ? accepted - answered : 0;
    }
    return n;
  }

  /**
   * A worker finished a client's task: write its answer now when the stream is free
   * and has room, else hand it to the poller. Never blocks.
   */
  void OnComplete(Task *t) override {
    const u32 i = static_cast<u32>(t->transport_cookie_);
    ShmServedSlot &s = slots_[i];
    // seq_cst: Stop stores `stopped_` and then reads this count; either it waits for
    // us or we see `stopped_` below.
    s.completing.FetchAdd(1, MemOrder::kSeqCst);
    Answer(i, s, t);
    // release: nothing we did to the slot or the segment follows this.
    s.completing.FetchSub(1, MemOrder::kRelease);
  }

  /** Who sent t: the owner of its slot, as the reaper verified it when it began serving. */
  Caller CallerOf(const Task &t) const override {
    return slots_[static_cast<u32>(t.transport_cookie_)].caller;
  }

  /** A worker starts reading requests: clients need not wake the poller any more. */
  void BeginPolling(u32 worker_id) override {
    // seq_cst: clients read the mask after publishing a request (Dekker with EndPolling).
    header_->worker_readers_.FetchOr(1ull << (worker_id % 64), MemOrder::kSeqCst);
  }

  /**
   * A worker's pass: takes in the small requests of the served slots it reads now (its
   * own, and others' that their home leaves waiting: ShmSlotAffinity). A slot that held
   * at most one request at this worker's last look is read up to its first task this
   * worker keeps, and the pass ends there: the worker's loop starts that task before
   * anything reads the next record, whose header lies in the client's cache (a round
   * trip's answer should not wait for that transfer). After such a look, or one that
   * found a queue, the slot is read in a batch (up to kRecordsPerPass), as a stream of
   * requests wants. The next pass goes on after the slot it ended at, so a busy client
   * cannot starve the others.
   */
  bool Poll() override {
    // acquire: Stop's flag; a stopping server reads no more requests.
    if (stopping_.Load(MemOrder::kAcquire) != 0) return false;
    const Worker *self = tls_current_worker;
    const u32 me = self != nullptr ? self->GetId() + 1 : 0;
    ShmSlotAffinity::View &v = affinity_.ViewOf(self != nullptr ? self->GetId() : 0);
    const bool abroad = ShmSlotAffinity::BeginPass(v);
    // relaxed: a hint for the affinity (it only delays a take-over by a look).
    const u64 readers = abroad ? header_->worker_readers_.Load(MemOrder::kRelaxed) : 0;
    if (abroad) {
      affinity_.Survey(v, [this](auto visit) { ForEachServed(visit); },
                       [this](u32 i) { return segment_.RequestStream(i).HasData(); });
    }
    const u32 start = v.next_slot < serving_words_ * 64 ? v.next_slot : 0;
    const u32 start_word = start / 64;
    const u64 below_start = (1ull << (start % 64)) - 1;  // start's word, bits before it
    bool did = false;
    // From start's word to the last, then round to start's word again: there the first
    // visit keeps the bits from start on, the last one the bits before it.
    for (u32 k = 0; k <= serving_words_; ++k) {
      const u32 w = (start_word + k) % serving_words_;
      // acquire: a slot's set-up (Activate) precedes its bit.
      u64 bits = serving_bits_[w].Load(MemOrder::kAcquire);
      if (w == start_word) bits &= k == 0 ? ~below_start : below_start;
      while (bits != 0) {
        const u32 i = w * 64 + static_cast<u32>(__builtin_ctzll(bits));
        bits &= bits - 1;
        const ShmStream rs = segment_.RequestStream(i);
        auto position = [&rs] { return rs.HasData() ? rs.ReadPosition() + 1 : 0; };
        if (!affinity_.ShouldRead(v, me, i, abroad, readers, position)) continue;
        const u64 bit = 1ull << (i % 64);
        const bool first = (v.busy & bit) == 0;
        const u32 taken = TakeRequests(i, first ? self : nullptr);
        // Busy: a batch found a queue, or a first look stopped before seeing the rest.
        v.busy = taken >= 2 || (first && taken != 0) ? v.busy | bit : v.busy & ~bit;
        if (taken == 0) continue;
        did = true;
        affinity_.NoteTaken(i, me);
        if (first && self != nullptr && self->HasAdopted()) {
          v.next_slot = i + 1;
          return true;
        }
      }
    }
    return did;
  }

  /** Calls visit(i) for every slot workers may read now (the serving bits). */
  template <typename Visit>
  void ForEachServed(Visit visit) const {
    for (u32 w = 0; w < serving_words_; ++w) {
      u64 bits = serving_bits_[w].Load(MemOrder::kAcquire);  // acquire: as in Poll
      while (bits != 0) {
        visit(w * 64 + static_cast<u32>(__builtin_ctzll(bits)));
        bits &= bits - 1;
      }
    }
  }

  /**
   * A worker is going to park: clients must wake the poller again. A request published
   * before they could see that is handed to the poller here (never lost).
   */
  bool EndPolling(u32 worker_id) override {
    // seq_cst: clear, then re-check the streams (clients publish, then read the mask).
    header_->worker_readers_.FetchAnd(~(1ull << (worker_id % 64)), MemOrder::kSeqCst);
    bool waiting = false;
    ForEachServed([&](u32 i) { waiting = waiting || segment_.RequestStream(i).HasDataSeqCst(); });
    if (waiting) header_->server_event_.Notify();
    return false;
  }

 private:
  using Phase = ShmServedSlot::Phase;

  /**
   * Takes in slot i's whole, contiguous requests on a worker (holding the slot's reader
   * flag): up to kRecordsPerPass records, stopping early right after one whose task
   * `stop_for` (the calling worker, or nullptr for a batch) adopted. Anything else
   * (pieces, a corrupt stream, no credit) stays for the poller, which is woken to handle
   * it. Returns how many records it took.
   */
  u32 TakeRequests(u32 i, const Worker *stop_for) {
    ShmServedSlot &s = slots_[i];
    const ShmStream rs = segment_.RequestStream(i);
    // Cheap tests first: an idle or busy slot costs no write of the flag's line.
    if (!rs.HasData() || s.reader.Load(MemOrder::kRelaxed) != 0) return 0;
    u32 idle = 0;
    // acquire: the previous reader's reads and counts are complete before ours.
    if (!s.reader.CompareExchange(idle, 1, MemOrder::kAcquire)) return 0;
    ShmClientSlot *slot = segment_.Slot(i);
    u32 taken = 0;
    bool leave = false;
    // relaxed: BeginDrain clears the bit before the reaper takes the flag we hold.
    const bool serving = (serving_bits_[i / 64].Load(MemOrder::kRelaxed) >> (i % 64)) & 1;
    if (serving && s.assembling) leave = rs.HasData();
    while (serving && !leave && taken < shm_server::kRecordsPerPass) {
      if (!HasCredit(s)) break;  // the credit's release wakes the poller
      ShmStream::Piece p;
      ShmStream::PeekResult r = rs.Peek(&p);
      if (r == ShmStream::PeekResult::kEmpty) break;
      if (r == ShmStream::PeekResult::kReady && p.kind == ShmStream::kRef) {
        // Chunks, and bad refs (the poller breaks the slot), are the poller's.
        if (!RefOf(p).Whole() || TakeRef(i, s, p) != ErrorCode::kOk) {
          leave = true;
          break;
        }
      } else if (r != ShmStream::PeekResult::kReady || p.kind != ShmStream::kBegin ||
                 p.bytes != p.message_bytes || !p.Contiguous() ||
                 p.message_bytes > options_.max_message_bytes) {
        leave = true;
        break;
      } else {
        Dispatch(i, p.first, p.bytes);  // decoded in place, as in PumpRequests
      }
      rs.Consume(p);
      ++taken;
      // Counted before the task starts: the client may read it once it has the answer.
      slot->worker_taken_.AddOwned(1);  // the reader flag's holder
      if (stop_for != nullptr && stop_for->HasAdopted()) break;  // Poll ends its pass
    }
    if (taken != 0) {
      NoteCpu(slot->runtime_cpu_);
      // Still a reader: the reaper's Reset rebuilds this event once the readers are gone.
      slot->request_room_.Notify();
    }
    s.UnlockReader();
    if (leave) {
      s.handoff.Store(1, MemOrder::kSeqCst);  // seq_cst: before Notify (ReadyToRun's re-check)
      header_->server_event_.Notify();
    }
    return taken;
  }

  /** OnComplete's body: discard, write now (ShmAnswerWriter), or queue for the poller. */
  void Answer(u32 i, ShmServedSlot &s, Task *t) {
    // seq_cst: pairs with Stop's store (see OnComplete); draining: set before the
    // poller waits for this slot's credits.
    if (stopped_.Load(MemOrder::kSeqCst) != 0 || s.draining.Load(MemOrder::kAcquire) != 0) {
      DeleteTask(t);
      s.ReleaseCredit(header_->server_event_);
      return;
    }
    if (answers_.TryWrite(i, s, t)) {
      DeleteTask(t);
      s.ReleaseCredit(header_->server_event_);
      GiveWayTo(segment_.Slot(i)->client_cpu_, header_->stats_.cpu_moves);
      return;
    }
    // seq_cst: the count is what the parked poller re-checks (Dekker with its park);
    // counted first, the poller keeps looking until the push below lands.
    s.pending_count.FetchAdd(1, MemOrder::kSeqCst);
    s.pending->Push(reinterpret_cast<u64>(t));  // never full: the credits bound it
    header_->server_event_.Notify();
  }

  /**
   * After a worker's answer: a client spinning for it on this CPU runs only once we stop,
   * so yield; and when that lasts, move this worker to another CPU (CpuUnstacker), counted
   * in `moves`.
   */
  static void GiveWayTo(const Atomic<u32> &client_cpu, Atomic<u64> &moves) {
    thread_local CpuUnstacker unstacker;
    if (ShareCpu(client_cpu)) {
      // relaxed: a statistic.
      if (unstacker.Stacked(MonotonicNs())) moves.FetchAdd(1, MemOrder::kRelaxed);
      sched_yield();
    } else {
      unstacker.Apart();
    }
  }

  /** True when slot s may take another request (the poller; reads `answered` rarely). */
  bool HasCredit(ShmServedSlot &s) {
    const u64 accepted = s.accepted.Load(MemOrder::kRelaxed);  // relaxed: ours
    if (accepted - s.answered_seen < options_.max_outstanding) return true;
    s.answered_seen = s.answered.Load(MemOrder::kAcquire);
    if (accepted - s.answered_seen >= options_.max_outstanding) {
      // seq_cst: announce the wait, then re-read (ReleaseCredit does the reverse).
      s.credit_wait.Store(1, MemOrder::kSeqCst);
      s.answered_seen = s.answered.Load(MemOrder::kSeqCst);
      if (accepted - s.answered_seen >= options_.max_outstanding) return false;
    }
    if (s.credit_wait.Load(MemOrder::kRelaxed) != 0) {
      s.credit_wait.Store(0, MemOrder::kRelaxed);  // relaxed: only spares a wake-up
    }
    return true;
  }

  // ---- The poller thread (defined in shm_server_poller.h) ----

  /** The poller thread's loop: slot membership, requests, answers, reaping, parking. */
  inline void Run();

  /**
   * Whether the poller reads slot i's requests in this pass: always while no worker
   * reads the streams; otherwise only those a worker handed over, or bytes with no record
   * (found at a look). A look also notes slots whose requests stall or pile up
   * (wake_parked_).
   */
  inline bool PollerMayRead(u32 i, bool workers_read, bool look);

  /** True when some served slot's request stream holds a request (the poller's hint). */
  inline bool RequestsWaiting() const;

  /** The park re-check: anything that would give the poller work (seq_cst loads). */
  inline bool ReadyToRun();

  /** True when no slot has work in flight (Stop may finish). */
  inline bool Quiet() const;

  /** Reads whatever requests slot i has published; dispatches the whole ones. */
  inline bool PumpRequests(u32 i);

  /** PumpRequests' body, holding slot i's reader flag. */
  inline bool PumpRequestsLocked(u32 i, ShmServedSlot &s);

  /** Hands one whole request to the dispatcher (reader flag held); refusals get error answers. */
  void Dispatch(u32 i, const char *data, u64 len) {
    ShmServedSlot &s = slots_[i];
    // relaxed: only the reader flag's holder writes it; counted before the answer exists.
    s.accepted.AddOwned(1);
    segment_.Slot(i)->tasks_served_.AddOwned(1);  // the reader flag's holder
    std::vector<char> error;  // allocates only for a refusal
    if (!dispatcher_->Dispatch(data, len, this, i, &error)) {
      s.PushError(std::move(error));
      header_->server_event_.Notify();  // the poller writes error answers
    }
  }

  /**
   * Takes in a kRef record of slot i (reader flag held): a whole request is decoded in
   * place, a chunk of a larger one joins the slot's assembly (dispatched once complete);
   * either way its block is then freed. A ref outside the region, a message over the
   * limit or a chunk out of step is refused with its error, and nothing is taken (the
   * caller breaks the slot).
   */
  ErrorCode TakeRef(u32 i, ShmServedSlot &s, const ShmStream::Piece &p) {
    const ShmDataRef ref = RefOf(p);
    if (ref.total > options_.max_message_bytes) return ErrorCode::kTooLarge;
    const ShmDataRegion region = RequestRegion(i);
    const char *data = region.Resolve(ref);
    if (data == nullptr ||
        !ref.InStep(s.assembling, s.assembly_by_ref, s.assembly_total, s.assembly.bytes.size())) {
      return ErrorCode::kMalformed;
    }
    // Counted before the dispatch: its answer may reach the client before we return.
    ShmClientSlot *slot = segment_.Slot(i);
    if (!s.assembling && ref.Whole()) {
      slot->data_requests_.AddOwned(1);  // the reader flag's holder
      Dispatch(i, data, ref.bytes);      // decoded in place: the client cannot reuse it yet
    } else {
      if (!s.assembling) {
        // Nothing reserved for the total the client names: the assembly grows with the
        // bytes it really sends (and never past max_message_bytes, checked above).
        s.assembly.bytes.clear();
        s.assembly_total = ref.total;
        s.assembling = true;
        s.assembly_by_ref = true;
      }
      if (!AppendToAssembly(s, data, ref.bytes)) return ErrorCode::kOutOfMemory;
      if (s.assembly.bytes.size() == s.assembly_total) {
        s.assembling = false;
        slot->data_requests_.AddOwned(1);
        Dispatch(i, s.assembly.bytes.data(), s.assembly.bytes.size());
        RecycleBuffer(&s.assembly);
      }
    }
    region.Release(ref);
    return ErrorCode::kOk;
  }

  /**
   * Appends n bytes to slot s's assembly; false when memory runs out (the caller breaks the
   * slot: one client's huge message must not end the poller).
   */
  static bool AppendToAssembly(ShmServedSlot &s, const char *data, u64 n) {
    try {
      s.assembly.bytes.insert(s.assembly.bytes.end(), data, data + n);
      return true;
    } catch (const std::bad_alloc &) {
      return false;
    }
  }

  /** Slot i's share of the client data segment (disabled when the runtime has none). */
  ShmDataRegion RequestRegion(u32 i) const {
    return data_.RequestRegion(i, &segment_.Slot(i)->request_data_released_);
  }
  RequestDispatcher *dispatcher_;
  ShmServerOptions options_;
  u32 port_ = 0;
  ProcessIdentity self_;
  ShmSegment segment_;
  ShmSegmentHeader *header_ = nullptr;
  std::unique_ptr<ShmServedSlot[]> slots_;
  u32 serving_words_ = 0;
  std::unique_ptr<Atomic<u64>[]> serving_bits_;  ///< slots workers may read (the reaper's)
  std::thread poller_;
  Atomic<u32> stopping_;  ///< Stop asked: read no more requests, finish answers
  Atomic<u32> stopped_;   ///< the poller is gone: completers discard answers
  u64 stop_deadline_ = 0;
  bool wake_parked_ = false;  ///< the poller's last look found requests stalled or piling up
  bool rang_ = false;         ///< a client rang about unread requests: the poller looks now
  u32 seen_membership_ = 0;
  std::unique_ptr<ShmReaper> reaper_;  ///< the poller's (and Stop's, after the join)
  ShmDataSegments data_;  ///< this process's mapping of the data segments (none in tests)
  ShmAnswerWriter answers_{&segment_, &data_, options_.max_message_bytes};
  /// Which worker reads which slot; a view per worker of the orchestrator's.
  ShmSlotAffinity affinity_{options_.num_slots, dispatcher_->Orchestrator() != nullptr
                                                    ? dispatcher_->Orchestrator()->NumWorkers()
                                                    : 1};
};

}  // namespace chi

// The poller thread's definitions: every user of the core needs them, so they come with
// this header.
#include "chi/transport/shm_server_poller.h"  // IWYU pragma: export
