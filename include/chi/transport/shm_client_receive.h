// ShmClientReceiver: the receiving half of a pure client's shm connection (ShmClientTransport
// in shm_client.h adds the sending half). It owns the table of outstanding tasks and turns
// answers into completed tasks, either on its receiver thread or on a caller spinning in
// Future::Wait or polling Future::IsComplete (through the process's WaitHelper), and
// watches the runtime's liveness.
// Invariant: only the holder of the receiver role (rx_role_) reads the answer stream, and
// only whoever clears a task's table entry (answer, failure, close) completes the task.
#pragma once

#include <pthread.h>  // pthread_setname_np for the receiver thread
#include <sched.h>    // sched_yield while the receiver spins

#include <cstdio>   // snprintf of failure messages
#include <cstring>  // memcpy of request ids
#include <memory>   // unique_ptr of the table
#include <thread>   // the receiver thread
#include <vector>   // the answer assembly buffer

#include "chi/core/atomic.h"                   // Atomic, CpuRelax
#include "chi/core/futex.h"                    // the receiver's naps
#include "chi/core/status.h"                   // Status, ErrorCode
#include "chi/queue/wait_event.h"              // WaitEvent, deadlines
#include "chi/task/future.h"                   // WaitHelper: callers deliver answers
#include "chi/task/task_ops.h"                 // CompleteTask
#include "chi/transport/message_buffer.h"      // RecycleBuffer of the answer assembly
#include "chi/transport/request_dispatcher.h"  // DecodeAnswer
#include "chi/transport/shm_process.h"         // the runtime's liveness
#include "chi/transport/shm_segment.h"         // segment layout
#include "chi/transport/shm_stream.h"          // the answer stream
#include "chi/transport/transport.h"           // ClientTransport, kEnvelopeHeaderBytes

namespace chi {

/** The receiving half of one shm connection (see the file comment); a base class only. */
class ShmClientReceiver : public ClientTransport {
 public:
  /**
   * How long the receiver spins on an empty answer stream before it parks: short, since
   * with fewer cores than spinning threads, spinning delays the threads we wait for.
   */
  static constexpr u64 kReceiverSpinNs = 10000;
  /**
   * The same while tasks are outstanding: an answer is due, and a parked receiver costs
   * the runtime a futex wake and us a wake-up per answer. It yields every 64 polls.
   */
  static constexpr u64 kReceiverBusySpinNs = 200000;
  /** How often a waiting side checks that the runtime is alive while tasks are out. */
  static constexpr u64 kPeerCheckNs = 10000000;
  /** The same with nothing outstanding. */
  static constexpr u64 kIdleCheckNs = 200000000;
  /** Most answers the receiver thread takes in one turn of the role (a helper takes one). */
  static constexpr u32 kAnswersPerTurn = 64;
  /**
   * How long the receiver naps while callers waiting in Future::Wait deliver answers
   * themselves (CallersDeliver). A caller that stops spinning without its answer wakes
   * it at once (CallerGaveUp). Long, since each wake-up takes a CPU from the threads
   * spinning for answers (and on a machine with few cores, invites the scheduler to
   * stack two of them on one).
   */
  static constexpr u64 kCallerNapNs = 10000000;
  /**
   * The same while some outstanding task has nobody spinning for it and no caller
   * delivered answers lately (its answer may arrive after the spinners left).
   */
  static constexpr u64 kShortNapNs = 50000;
  /** A connection rings the runtime's poller about unread requests at most this often. */
  static constexpr u64 kRingEveryNs = 1000000;

  /** Why the connection failed (kOk while healthy). */
  ErrorCode Failure() const {
    // acquire: the tasks failed before the code was stored are complete.
    return static_cast<ErrorCode>(failure_.Load(MemOrder::kAcquire));
  }
  /** Tasks sent and not yet answered. */
  u32 Outstanding() const {
    // acquire: a snapshot (released never passes claimed, so read it first).
    const u64 released = Released();
    return static_cast<u32>(claimed_.Load(MemOrder::kAcquire) - released);
  }
  /** Answers that matched no outstanding task (ignored). */
  u64 StrayAnswers() const { return stray_answers_.Load(MemOrder::kRelaxed); }
  /**
   * Answers delivered by callers waiting in Future::Wait (or polling Future::IsComplete)
   * rather than the receiver thread.
   */
  u64 HelpedAnswers() const { return helped_answers_.Load(MemOrder::kRelaxed); }
  /** Times a caller rang the runtime's poller about requests left unread (RingIfUnread). */
  u64 PollerRings() const { return rings_.Load(MemOrder::kRelaxed); }
  /** The runtime process this connection serves with. */
  u32 RuntimePid() const override { return runtime_.pid; }

 protected:
  /** One outstanding task: word = its request id (0 = free), task = the Task*. */
  struct alignas(32) Entry {
    Atomic<u64> word;
    Atomic<u64> task;
    u32 seq = 0;  ///< the writer's use count, the high half of request ids
  };

  ShmClientReceiver() = default;

  /** Starts the receiver thread and offers this connection's answers to waiting callers. */
  void StartReceiving() {
    helper_installed_ = WaitHelper::Install(&helper_);  // before the thread, which reads it
    receiver_ = std::thread([this] { ReceiveLoop(); });
  }

  /**
   * Stops receiving for good: no caller helps any more, the receiver has left, and this
   * thread holds the role (the answer stream is no longer read). Close's first half.
   */
  void StopReceiving() {
    if (helper_installed_) WaitHelper::Remove(&helper_);  // returns once no caller helps
    rx_stop_.Store(1, MemOrder::kSeqCst);  // seq_cst: the receiver's park re-check reads it
    slot_->answer_ready_.Notify();
    rx_nap_.FetchAdd(1, MemOrder::kSeqCst);  // seq_cst: after the flag; ends a nap early
    FutexWake(rx_nap_.Raw(), 1);
    if (receiver_.joinable()) receiver_.join();
    u32 idle = 0;
    // acquire: the last holder's stream reads are done; we keep the role for good.
    while (!rx_role_.CompareExchange(idle, 1, MemOrder::kAcquire)) {
      idle = 0;
      CpuRelax();
    }
  }

  /** True once the connection failed or was closed (seq_cst: part of park re-checks). */
  bool Unhealthy() const {
    return failure_.Load(MemOrder::kSeqCst) != 0 || closed_.Load(MemOrder::kSeqCst) != 0;
  }

  /** The error a task gets when the connection can no longer carry it. */
  Status FailureStatus() const {
    // acquire: failure_msg_ was written before failure_.
    if (u32 code = failure_.Load(MemOrder::kAcquire); code != 0) {
      return Status::Error(static_cast<ErrorCode>(code), failure_msg_);
    }
    return Status::Error(ErrorCode::kShutdown, "shm transport: closed");
  }

  /** Completes a task that never got an entry. */
  static void FailTask(Task *t, ErrorCode code, const char *msg) {
    t->SetError(code, msg);
    CompleteTask(t);
  }

  /** Completes entry idx's task with an error if it still holds request `id`. */
  void TakeAndFail(u32 idx, u64 id, ErrorCode code, const char *msg) {
    Entry &e = entries_[idx];
    Task *t = reinterpret_cast<Task *>(e.task.Load(MemOrder::kRelaxed));  // relaxed: ours
    u64 expected = id;
    // seq_cst: exactly one of answer, failure sweep or this takes the entry; and the
    // clear is what a writer parked for a free entry re-checks (Dekker with Notify).
    if (!e.word.CompareExchange(expected, 0, MemOrder::kSeqCst)) return;
    ReleaseEntry();
    FailTask(t, code, msg);
  }

  /** Counts an entry freed by a failure and wakes a writer waiting for one. */
  void ReleaseEntry() {
    // relaxed: the entry's seq_cst clear before us is what a parked writer re-checks.
    released_.FetchAdd(1, MemOrder::kRelaxed);
    table_room_.Notify();
  }

  /** Entries freed, ever: by answers (the receiver role's count) and by failures. */
  u64 Released() const {
    // acquire: entries counted here are done with their old task.
    return released_.Load(MemOrder::kAcquire) + answered_.Load(MemOrder::kAcquire);
  }

  /** True when some entry is free (seq_cst loads: a parked writer's re-check). */
  bool AnyFreeEntrySeqCst() const {
    for (u32 i = 0; i < table_size_; ++i) {
      // seq_cst: pairs with the seq_cst clear of whoever frees an entry, then notifies.
      if (entries_[i].word.Load(MemOrder::kSeqCst) == 0) return true;
    }
    return false;
  }

  /**
   * Marks the connection failed (first reason wins) and completes every outstanding
   * task with it. Called by the receiver thread, or by Close once it has stopped.
   */
  void Fail(ErrorCode code, const char *msg) {
    if (failure_.Load(MemOrder::kRelaxed) == 0) {  // relaxed: only this thread stores it
      std::snprintf(failure_msg_, sizeof(failure_msg_), "%s", msg);
      // seq_cst: writers read it after publishing an entry (Dekker with the sweep below).
      failure_.Store(static_cast<u32>(code), MemOrder::kSeqCst);
    }
    // relaxed: stored by this thread (or by the receiver that Close has joined).
    const ErrorCode first = static_cast<ErrorCode>(failure_.Load(MemOrder::kRelaxed));
    for (u32 i = 0; i < table_size_; ++i) {
      Entry &e = entries_[i];
      // seq_cst: take the entry (see TakeAndFail); acquire sees its task pointer.
      u64 id = e.word.Exchange(0, MemOrder::kSeqCst);
      if (id == 0) continue;
      // relaxed: the Exchange above acquired the writer's release of the entry.
      Task *t = reinterpret_cast<Task *>(e.task.Load(MemOrder::kRelaxed));
      ReleaseEntry();
      FailTask(t, first, failure_msg_);
    }
    table_room_.Notify();
    slot_->request_room_.Notify();
  }

  // The connection (set by Open, read-only afterwards).
  ShmSegment segment_;
  ShmSegmentHeader *header_ = nullptr;
  ShmClientSlot *slot_ = nullptr;
  ShmStream req_;  ///< our request stream (a view with the runtime's geometry)
  ShmStream ans_;  ///< our answer stream
  u32 slot_index_ = 0;
  u32 generation_ = 0;
  ProcessIdentity self_;
  ProcessIdentity runtime_;
  u64 max_message_bytes_ = 0;
  u32 table_size_ = 0;
  std::unique_ptr<Entry[]> entries_;
  ShmDataSegments data_;          ///< the runtime's data segments, mapped here
  ShmDataRegion request_region_;  ///< the slot's cdata region (large requests)
  ShmDataRegion answer_region_;   ///< the slot's rdata region (large answers)

  // The writer's (ShmClientTransport), read here by Outstanding.
  alignas(kCacheLine) Atomic<u64> claimed_;  ///< entries the writer has taken, ever
  // Written only when a writer parks; read by every release.
  alignas(kCacheLine) WaitEvent table_room_;  ///< a writer parks here while the table is full

  // Read on every send, written once.
  alignas(kCacheLine) Atomic<u32> closed_;
  Atomic<u32> failure_;  ///< ErrorCode that ended the connection (0 = healthy)
  char failure_msg_[Status::kMaxMessage] = {};

 private:
  // ---- Receiving (the receiver thread, or a caller helping while it waits) ----
  // Deliver and HelpDeliver run only while holding rx_role_.

  /** The WaitHelper entry point: ctx is the connection. */
  static void HelpThunk(void *ctx) { static_cast<ShmClientReceiver *>(ctx)->HelpDeliver(); }
  /** The WaitHelper's give-up hook: ctx is the connection. */
  static void GaveUpThunk(void *ctx) {
    auto *self = static_cast<ShmClientReceiver *>(ctx);
    self->RingIfUnread();
    self->CallerGaveUp();
  }

  /**
   * A caller spun a whole Future::kSpinNs without its answer. When requests still wait
   * unread while a worker claims the runtime's streams (so nobody rang the runtime's
   * poller as they were written: Published), that worker may be stuck in a long task:
   * ring the poller, which looks at stalled streams and wakes a parked worker to take the
   * slot over. Without the ring it looks only at its next liveness check (up to 20 ms).
   * At most once per kRingEveryNs per connection: callers of a busy slot give up often.
   */
  void RingIfUnread() {
    // relaxed: hints; the poller's looks decide.
    if (!req_.HasData() || header_->worker_readers_.Load(MemOrder::kRelaxed) == 0) return;
    const u64 now = MonotonicNs();
    u64 next = next_ring_ns_.Load(MemOrder::kRelaxed);
    if (now < next || !next_ring_ns_.CompareExchange(next, now + kRingEveryNs,
                                                     MemOrder::kRelaxed)) {
      return;
    }
    rings_.FetchAdd(1, MemOrder::kRelaxed);
    // seq_cst: the flag, then Notify's read of the waiters (Dekker with the poller's
    // count, then ReadyToRun's read of the flag): a poller about to park sees it.
    slot_->client_rang_.Store(1, MemOrder::kSeqCst);
    header_->server_event_.Notify();
  }

  /**
   * A caller stopped spinning in Future::Wait without its answer (it parks next): the
   * receiver must deliver it, so a napping receiver wakes now.
   */
  void CallerGaveUp() {
    // seq_cst: bump, then read the nap flag (Dekker with LeaveToCallers).
    rx_nap_.FetchAdd(1, MemOrder::kSeqCst);
    if (rx_napping_.Load(MemOrder::kSeqCst) != 0) FutexWake(rx_nap_.Raw(), 1);
  }

  /**
   * A caller spinning in Future::Wait, or polling Future::IsComplete: delivers the next
   * answer if it is whole and ready (any caller's, not only its own) unless someone else
   * holds the role. Never waits, and leaves split answers, corrupt streams and failures to
   * the receiver thread. One answer per call: the header after it lies in the runtime's
   * cache (its writer cleared it), and reading it now would delay the caller's return by a
   * transfer; the spin (or the next poll) calls again.
   */
  void HelpDeliver() {
    if (!ans_.HasData()) {
      // The runtime worker last seen on our CPU answers only while we do not run.
      if (ShareCpu(slot_->runtime_cpu_)) sched_yield();
      return;
    }
    // relaxed role test first: a busy role costs no write of its line.
    if (rx_role_.Load(MemOrder::kRelaxed) != 0) return;
    u32 idle = 0;
    // acquire: the previous holder's stream reads (and consume) are complete before ours.
    if (!rx_role_.CompareExchange(idle, 1, MemOrder::kAcquire)) return;
    // An answer in pieces (or a bad one) is the receiver's.
    bool left = rx_assembling_;
    ShmStream::Piece p;
    if (!left && ans_.Peek(&p) == ShmStream::PeekResult::kReady) {
      if (p.kind == ShmStream::kRef) {
        // Chunks of a larger answer, and bad refs (the receiver fails the connection),
        // are the receiver's.
        left = !RefOf(p).Whole() || !TakeRef(p);
      } else if (p.kind == ShmStream::kBegin && p.bytes == p.message_bytes && p.Contiguous()) {
        Deliver(p.first, p.bytes);  // decoded in place: the runtime cannot reuse it yet
      } else {
        left = true;
      }
      if (!left) {
        ans_.Consume(p);
        NotifyRuntimeRoom();
        helped_answers_.AddOwned(1);  // the role's
      }
    }
    rx_role_.Store(0, MemOrder::kRelease);  // release: our reads precede the next holder's
    // A napping receiver would leave what we cannot take for its whole nap: wake it.
    if (left) CallerGaveUp();
  }

  void ReceiveLoop() {
    pthread_setname_np(pthread_self(), "chi-shm-client");
    bool deferred = false;
    for (;;) {
      if (!ans_.HasData()) {
        deferred = false;
        if (!AwaitAnswer()) return;
        continue;
      }
      // A caller spinning in Future::Wait takes ready answers itself (HelpDeliver), sooner
      // than a hand-off through this thread would wake it: give it the first go. What it
      // leaves (split answers, or an answer nobody took meanwhile) is ours.
      if (!deferred && helper_installed_ && WaitHelper::Spinners() != 0) {
        deferred = true;
        sched_yield();
        continue;
      }
      deferred = false;
      u32 idle = 0;
      // acquire: as in HelpDeliver. Busy: a waiting caller is delivering; look again.
      if (!rx_role_.CompareExchange(idle, 1, MemOrder::kAcquire)) {
        CpuRelax();
        continue;
      }
      bool go_on = true;
      for (u32 n = 0; go_on && n < kAnswersPerTurn; ++n) {
        ShmStream::Piece p;
        const ShmStream::PeekResult r = ans_.Peek(&p);
        if (r == ShmStream::PeekResult::kEmpty) break;
        if (r == ShmStream::PeekResult::kCorrupt) {
          Fail(ErrorCode::kMalformed, "shm transport: the runtime's answer stream is corrupt");
          go_on = false;
        } else {
          go_on = OnPiece(p);
        }
      }
      rx_role_.Store(0, MemOrder::kRelease);  // release: as in HelpDeliver
      if (!go_on) return;
    }
  }

  /** Takes one answer record; false when the stream is out of step (the connection fails). */
  bool OnPiece(const ShmStream::Piece &p) {
    if (p.kind == ShmStream::kRef) {
      if (!TakeRef(p)) {
        Fail(ErrorCode::kMalformed,
             "shm transport: an answer names bytes outside this client's runtime data region, "
             "or a chunk out of step");
        return false;
      }
      ans_.Consume(p);
      NotifyRuntimeRoom();
      return true;
    }
    if (!rx_assembling_) {
      if (p.kind != ShmStream::kBegin) {
        Fail(ErrorCode::kMalformed, "shm transport: answer stream out of step");
        return false;
      }
      if (p.bytes == p.message_bytes && p.Contiguous()) {
        Deliver(p.first, p.bytes);  // decoded in place: the runtime cannot reuse it yet
        ans_.Consume(p);
        NotifyRuntimeRoom();
        return true;
      }
      rx_.bytes.clear();
      rx_total_ = p.message_bytes;
      rx_assembling_ = true;
      rx_by_ref_ = false;
    } else if (p.kind != ShmStream::kMore || rx_by_ref_ || p.bytes > rx_total_ - rx_.bytes.size()) {
      Fail(ErrorCode::kMalformed, "shm transport: answer stream out of step");
      return false;
    }
    rx_.bytes.insert(rx_.bytes.end(), p.first, p.first + p.first_bytes);
    rx_.bytes.insert(rx_.bytes.end(), p.second, p.second + p.second_bytes);
    ans_.Consume(p);
    NotifyRuntimeRoom();
    if (rx_.bytes.size() == rx_total_) {
      rx_assembling_ = false;
      Deliver(rx_.bytes.data(), rx_.bytes.size());
      RecycleBuffer(&rx_);
    }
    return true;
  }

  /**
   * Takes an answer (or a chunk of one) that lies in the runtime data region: a whole one
   * is delivered in place, chunks are assembled and delivered once complete; then frees
   * its block. False (nothing taken) when the ref points outside the region or a chunk is
   * out of step.
   */
  bool TakeRef(const ShmStream::Piece &p) {
    const ShmDataRef ref = RefOf(p);
    const char *data = answer_region_.Resolve(ref);
    if (data == nullptr || ref.total > max_message_bytes_ ||
        !ref.InStep(rx_assembling_, rx_by_ref_, rx_total_, rx_.bytes.size())) {
      return false;
    }
    if (!rx_assembling_ && ref.Whole()) {
      Deliver(data, ref.bytes);  // decoded in place: the runtime cannot reuse it yet
    } else {
      if (!rx_assembling_) {
        rx_.bytes.clear();
        rx_.bytes.reserve(ref.total);
        rx_total_ = ref.total;
        rx_assembling_ = true;
        rx_by_ref_ = true;
      }
      rx_.bytes.insert(rx_.bytes.end(), data, data + ref.bytes);
      if (rx_.bytes.size() == rx_total_) {
        rx_assembling_ = false;
        Deliver(rx_.bytes.data(), rx_.bytes.size());
        RecycleBuffer(&rx_);
      }
    }
    answer_region_.Release(ref);
    return true;
  }

  /** Completes the task an answer names; answers naming no outstanding task are ignored. */
  void Deliver(const char *data, u64 len) {
    u64 id = 0;
    if (len >= kEnvelopeHeaderBytes) std::memcpy(&id, data, sizeof(id));
    const u32 idx = static_cast<u32>(id);
    if (id == 0 || idx >= table_size_) {
      stray_answers_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
      return;
    }
    Entry &e = entries_[idx];
    // relaxed: the request -> runtime -> answer chain orders the writer's store before us.
    Task *t = reinterpret_cast<Task *>(e.task.Load(MemOrder::kRelaxed));
    u64 expected = id;
    // seq_cst: exactly one of answer, failure sweep or a failed send takes the entry
    // (and see TakeAndFail on the parked writer).
    if (!e.word.CompareExchange(expected, 0, MemOrder::kSeqCst)) {
      stray_answers_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
      return;
    }
    DecodeAnswer(t, data, len);
    answered_.AddOwned(1);  // the role's count: no locked add
    table_room_.Notify();
    CompleteTask(t);
  }

  /** Tells a runtime that waits for room in our answer stream that there is some. */
  void NotifyRuntimeRoom() {
    // seq_cst: after our seq_cst consume; pairs with the runtime's flag-then-re-check.
    if (slot_->runtime_needs_room_.Load(MemOrder::kSeqCst) != 0) header_->server_event_.Notify();
  }

  /** What SpinForAnswer found. */
  enum class SpinResult : u32 { kData, kStop, kPark };

  /**
   * The receiver's busy wait for an answer, napping while callers take the answers
   * themselves; kPark once it should park on the answer stream instead.
   */
  inline SpinResult SpinForAnswer();

  /** Waits for the next answer; false when the receiver should stop. */
  inline bool AwaitAnswer();

  /**
   * True while callers waiting in Future::Wait take the answers (HelpDeliver): one spins
   * now, or some delivered answers since the receiver last looked (a caller between two
   * waits is not counted, but it comes back for its next answer). Then the receiver naps
   * instead of parking on the answer stream: parked there, it would cost the runtime a
   * futex wake per answer, and take a CPU from the threads that spin for them.
   */
  inline bool CallersDeliver();

  /**
   * Callers spinning in Future::Wait take answers themselves (HelpDeliver), so the
   * receiver naps, off their CPUs, without asking them to wake it as they leave: that
   * made every Wait's end a futex wake and a context switch, once per round trip. Only
   * a caller that gives up spinning without its answer wakes it (CallerGaveUp); a nap
   * starts only once the receiver has looked at the stream since the last such wake.
   */
  inline void LeaveToCallers();

  /**
   * Checks the slot and the runtime (the process itself only when check_process);
   * fails the connection and returns false when they are gone. Answers already in
   * the stream are still delivered first (the caller re-checks it).
   */
  inline bool PeerHealthy(bool check_process);

  /**
   * True when tasks are outstanding and the runtime's poller has not stored a heartbeat
   * for the hang timeout (counted from when this receiver last saw it change, or from
   * when tasks went out). Never with the timeout off (0).
   */
  inline bool RuntimeSilent();

 protected:
  // The receiver's.
  alignas(kCacheLine) Atomic<u64> released_;  ///< entries freed by failures, ever
  Atomic<u32> rx_stop_;
  Atomic<u64> stray_answers_;
  WaitStats rx_waits_;  ///< the receiver's parks
  Atomic<u32> rx_nap_;      ///< futex word of the receiver's naps (LeaveToCallers)
  Atomic<u32> rx_napping_;  ///< 1 while the receiver naps (CallerGaveUp wakes it)
  Atomic<u64> next_ring_ns_;  ///< RingIfUnread rings no sooner (MonotonicNs)
  Atomic<u64> rings_;         ///< times RingIfUnread rang the runtime's poller
  u32 nap_seen_ = 0;        ///< the receiver's: rx_nap_ when it last looked at the stream
  u64 helped_seen_ = 0;     ///< the receiver's: helped_answers_ when it last looked
  bool callers_delivered_ = false;  ///< the receiver's: helped_answers_ moved since then
  u64 hang_timeout_ns_ = 0;   ///< ShmClientOptions::hang_timeout_sec (0: never), set by Open
  u64 beat_seen_ = 0;         ///< the receiver's: the runtime's heartbeat at its last check
  u64 beat_changed_ns_ = 0;   ///< the receiver's: when it saw that heartbeat first

 private:
  // The role's: written only by the holder of rx_role_ (the counters read by anyone).
  alignas(kCacheLine) Atomic<u32> rx_role_;  ///< 1 while a thread reads the answer stream
  Atomic<u64> answered_;        ///< entries freed by answers, ever
  Atomic<u64> helped_answers_;  ///< of those, delivered by waiting or polling callers
  MessageBuffer rx_;
  u64 rx_total_ = 0;
  bool rx_assembling_ = false;
  bool rx_by_ref_ = false;  ///< the answer being assembled arrives in data region chunks
  /** Spinning and polling callers deliver answers (HelpDeliver); one giving up wakes us. */
  WaitHelper helper_{&HelpThunk, this, &GaveUpThunk, &HelpThunk};
  bool helper_installed_ = false;  ///< set before the receiver starts, then read-only
  std::thread receiver_;
};

}  // namespace chi

// The receiver's waiting (spin, nap, park, liveness checks): every user of the receiver
// needs them, so they come with this header.
#include "chi/transport/shm_client_wait.h"  // IWYU pragma: export
