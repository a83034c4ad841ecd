// ShmClientTransport: a pure client's connection to a runtime on this node through the
// runtime's segment (ShmServer). Send streams the task into its slot's request ring on the
// caller's thread; a receiver thread completes tasks from the answers and watches the
// runtime, failing every outstanding task if it dies. Invariant: an outstanding task sits
// in one table entry, and only whoever clears the entry (answer, failure, close) completes it.
#pragma once

#include <pthread.h>  // pthread_setname_np for the receiver thread
#include <sched.h>    // sched_yield while Close waits for a writer to leave

#include <cstdio>   // snprintf of failure messages
#include <cstring>  // memcpy of request ids
#include <memory>   // unique_ptr
#include <thread>   // the receiver thread
#include <vector>   // request and answer buffers

#include "chi/core/atomic.h"                   // Atomic, CpuRelax
#include "chi/core/status.h"                   // Status, ErrorCode
#include "chi/queue/wait_event.h"              // WaitEvent, AwaitOp, deadlines
#include "chi/task/task_ops.h"                 // CompleteTask
#include "chi/transport/request_dispatcher.h"  // EncodeRequest, DecodeAnswer
#include "chi/transport/shm_process.h"         // the runtime's liveness
#include "chi/transport/shm_segment.h"         // segment layout, ShmServerInfo
#include "chi/transport/shm_stream.h"          // request and answer streams
#include "chi/transport/transport.h"           // ClientTransport

namespace chi {

/** A connection to one runtime through its shared-memory segment. */
class ShmClientTransport final : public ClientTransport {
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

  /**
   * Attaches the segment `info` names, checks it (kNotFound, kSizeMismatch,
   * kVersionMismatch, kPeerDead for a runtime that is gone) and claims a free client
   * slot (kOutOfMemory when all are taken).
   */
  static Status Connect(const ShmServerInfo &info, std::unique_ptr<ShmClientTransport> *out) {
    std::unique_ptr<ShmClientTransport> c(new ShmClientTransport());
    if (Status st = c->Open(info); !st.ok()) return st;
    *out = std::move(c);
    return Status::Ok();
  }

  ~ShmClientTransport() override { Close(); }
  ShmClientTransport(const ShmClientTransport &) = delete;
  ShmClientTransport &operator=(const ShmClientTransport &) = delete;

  /**
   * Sends a stamped task; the receiver completes it when the answer arrives. A task
   * that cannot travel (too large, runtime gone) is completed with the error at once.
   * Blocks only for back-pressure (too many outstanding tasks, or a full ring).
   */
  bool Send(Task *task) override {
    // acquire: a closed transport's state is settled; later calls only read it.
    if (closed_.Load(MemOrder::kAcquire) != 0) return false;
    u32 idle = 0;
    // Fast path: nobody writes and nothing waits, so write it here without queueing.
    // relaxed stack read: only a hint (pushers retry the role). acquire role: the
    // previous writer's stream writes are complete before ours.
    if (submit_head_.Load(MemOrder::kRelaxed) == 0 &&
        writer_.CompareExchange(idle, 1, MemOrder::kAcquire)) {
      WriteTask(task);
      LeaveWriter();
      return true;
    }
    u64 head = submit_head_.Load(MemOrder::kRelaxed);  // relaxed: the CAS below decides
    do {
      task->transport_cookie_ = head;  // the link of the submission stack
      // seq_cst: pushers and the writer re-check each other (push, then try the role).
    } while (!submit_head_.CompareExchange(head, reinterpret_cast<u64>(task), MemOrder::kSeqCst));
    DrainSubmissions();
    return true;
  }

  /** Fails every outstanding task with kShutdown and hands the slot back. Idempotent. */
  void Close() override {
    if (closed_.Exchange(1, MemOrder::kSeqCst) != 0 || slot_ == nullptr) return;
    table_room_.Notify();  // a writer parked for room sees closed_ and leaves
    slot_->request_room_.Notify();
    u32 idle = 0;
    // acquire: the last writer's stream writes are done; we keep the role for good.
    while (!writer_.CompareExchange(idle, 1, MemOrder::kAcquire)) {
      idle = 0;
      sched_yield();
    }
    FailSubmissions(ErrorCode::kShutdown, "shm transport: closed before the task was sent");
    rx_stop_.Store(1, MemOrder::kSeqCst);  // seq_cst: the receiver's park re-check reads it
    slot_->answer_ready_.Notify();
    if (receiver_.joinable()) receiver_.join();
    Fail(ErrorCode::kShutdown, "shm transport: closed with the task outstanding");
    // acquire: a reclaim by the runtime (new generation) is seen with what it reset.
    if (slot_->owner_pid_.Load(MemOrder::kAcquire) == self_.pid &&
        slot_->generation_.Load(MemOrder::kAcquire) == generation_) {
      // seq_cst: the runtime's rescan (membership bump below) sees the closed state.
      slot_->state_.Store(static_cast<u32>(ShmSlotState::kClosed), MemOrder::kSeqCst);
    }
    header_->membership_seq_.FetchAdd(1, MemOrder::kSeqCst);
    header_->server_event_.Notify();
    slot_ = nullptr;
    segment_.Detach();
  }

  const char *Name() const override { return "shm"; }

  /** Index of the slot this connection holds (tests inject bytes into its streams). */
  u32 SlotIndex() const { return slot_index_; }
  /** The mapped segment (tests and diagnostics). */
  ShmSegment &Segment() { return segment_; }
  /** Why the connection failed (kOk while healthy). */
  ErrorCode Failure() const {
    // acquire: the tasks failed before the code was stored are complete.
    return static_cast<ErrorCode>(failure_.Load(MemOrder::kAcquire));
  }
  /** Tasks sent and not yet answered. */
  u32 Outstanding() const {
    // acquire: a snapshot of two counters (released never passes claimed).
    u64 released = released_.Load(MemOrder::kAcquire);
    return static_cast<u32>(claimed_.Load(MemOrder::kAcquire) - released);
  }
  /** Answers that matched no outstanding task (ignored). */
  u64 StrayAnswers() const { return stray_answers_.Load(MemOrder::kRelaxed); }

 private:
  /** One outstanding task: word = its request id (0 = free), task = the Task*. */
  struct alignas(32) Entry {
    Atomic<u64> word;
    Atomic<u64> task;
    u32 seq = 0;  ///< the writer's use count, the high half of request ids
  };

  ShmClientTransport() = default;

  /** Attaches, checks and claims a slot; starts the receiver. */
  Status Open(const ShmServerInfo &info) {
    if (Status st = segment_.Attach(info); !st.ok()) return st;
    header_ = segment_.Header();
    runtime_ = ProcessIdentity{header_->runtime_pid_, header_->runtime_start_ticks_};
    if (Status st = segment_.RuntimeStatus(); !st.ok()) {
      segment_.Detach();
      return st;
    }
    self_ = SelfIdentity();
    const u32 slots = header_->num_slots_;
    for (u32 i = 0; i < slots && slot_ == nullptr; ++i) {
      u32 expected = 0;
      // acq_rel: acquire sees the runtime's reset of the slot; release marks it ours.
      if (segment_.Slot(i)->owner_pid_.CompareExchange(expected, self_.pid, MemOrder::kAcqRel)) {
        slot_index_ = i;
        slot_ = segment_.Slot(i);
      }
    }
    if (slot_ == nullptr) {
      Status st = Status::Errorf(ErrorCode::kOutOfMemory,
                                 "shm transport: all %u client slots of runtime pid %u are taken",
                                 slots, runtime_.pid);
      segment_.Detach();
      return st;
    }
    req_ = segment_.RequestStream(slot_index_);
    ans_ = segment_.AnswerStream(slot_index_);
    max_message_bytes_ = header_->max_message_bytes_;
    table_size_ = header_->max_outstanding_;
    entries_ = std::make_unique<Entry[]>(table_size_);
    generation_ = slot_->generation_.Load(MemOrder::kRelaxed);  // relaxed: ordered by the CAS
    slot_->owner_start_ticks_.Store(self_.start_ticks, MemOrder::kRelaxed);
    // release: the identity above is visible to a runtime that sees kActive.
    slot_->state_.Store(static_cast<u32>(ShmSlotState::kActive), MemOrder::kRelease);
    // seq_cst: the runtime's park re-check reads the sequence (Dekker with Notify).
    header_->membership_seq_.FetchAdd(1, MemOrder::kSeqCst);
    header_->server_event_.Notify();
    receiver_ = std::thread([this] { ReceiveLoop(); });
    return Status::Ok();
  }

  // ---- Sending (any thread; one writer at a time) ----

  /** Becomes the writer if nobody is, and sends everything submitted meanwhile. */
  void DrainSubmissions() {
    for (;;) {
      u32 idle = 0;
      // acquire: the previous writer's stream writes are complete before ours.
      if (!writer_.CompareExchange(idle, 1, MemOrder::kAcquire)) {
        // The writer re-checks the stack when it leaves; Close keeps the role for good.
        // seq_cst: Close stores closed_ before taking the role (Dekker with our push).
        if (closed_.Load(MemOrder::kSeqCst) != 0) {
          FailSubmissions(ErrorCode::kShutdown, "shm transport: closed before the task was sent");
        }
        return;
      }
      for (Task *t = TakeSubmissions(); t != nullptr; t = TakeSubmissions()) {
        while (t != nullptr) {
          Task *next = reinterpret_cast<Task *>(t->transport_cookie_);  // t may be freed below
          WriteTask(t);
          t = next;
        }
      }
      // seq_cst: leave the role, then re-check the stack (pushers do the reverse).
      writer_.Store(0, MemOrder::kSeqCst);
      if (submit_head_.Load(MemOrder::kSeqCst) == 0) return;
    }
  }

  /** Leaves the writer role; sends what was submitted meanwhile. */
  void LeaveWriter() {
    // seq_cst: leave the role, then re-check the stack (pushers do the reverse).
    writer_.Store(0, MemOrder::kSeqCst);
    if (submit_head_.Load(MemOrder::kSeqCst) != 0) DrainSubmissions();
  }

  /** Takes the submission stack, oldest first. */
  Task *TakeSubmissions() {
    // acquire: the pushers' writes to the tasks are visible.
    u64 head = submit_head_.Exchange(0, MemOrder::kAcquire);
    Task *fifo = nullptr;
    while (head != 0) {
      Task *t = reinterpret_cast<Task *>(head);
      head = t->transport_cookie_;
      t->transport_cookie_ = reinterpret_cast<u64>(fifo);
      fifo = t;
    }
    return fifo;
  }

  /** Completes every task still in the submission stack with an error. */
  void FailSubmissions(ErrorCode code, const char *msg) {
    for (Task *t = TakeSubmissions(); t != nullptr;) {
      Task *next = reinterpret_cast<Task *>(t->transport_cookie_);
      FailTask(t, code, msg);
      t = next;
    }
  }

  /** Registers one task and streams its request (the writer only). */
  void WriteTask(Task *t) {
    if (Unhealthy()) {
      Status st = FailureStatus();
      FailTask(t, st.code(), st.message());
      return;
    }
    u32 idx = 0;
    if (!ClaimEntry(&idx)) {
      Status st = FailureStatus();
      FailTask(t, st.code(), st.message());
      return;
    }
    Entry &e = entries_[idx];
    if (++e.seq == 0) e.seq = 1;
    const u64 id = (static_cast<u64>(e.seq) << 32) | idx;
    EncodeRequest(t, id, &tx_);
    e.task.Store(reinterpret_cast<u64>(t), MemOrder::kRelaxed);  // relaxed: published below
    // release: the task and our reads of it (encoding) happen before the receiver, which
    // takes the entry with acquire, completes it; published before the request can travel.
    e.word.Store(id, MemOrder::kRelease);
    // The entry this writer will most likely take next: fetch its line while we wait.
    __builtin_prefetch(&entries_[cursor_], 1);
    Status st;
    if (tx_.size() > max_message_bytes_) {
      st = Status::Errorf(ErrorCode::kTooLarge,
                          "shm transport: request of %llu bytes exceeds the runtime's %llu-byte "
                          "limit (shm.client_data_size)",
                          static_cast<unsigned long long>(tx_.size()),
                          static_cast<unsigned long long>(max_message_bytes_));
    } else {
      st = StreamOut(tx_.data(), tx_.size());
    }
    RecycleBuffer(&tx_);
    // seq_cst fence: orders our entry store before the read of failure_ (Dekker with Fail,
    // which stores failure_ and then sweeps the table), so a task registered after the
    // sweep is failed here. Cheap: the stream's seq_cst publish already drained our stores.
    FenceSeqCst();
    if (st.ok() && Unhealthy()) st = FailureStatus();
    if (!st.ok()) TakeAndFail(idx, id, st.code(), st.message());
  }

  /** Finds a free table entry, waiting while max_outstanding tasks are out. */
  bool ClaimEntry(u32 *idx) {
    // relaxed: only the writer moves claimed_.
    const u64 claimed = claimed_.Load(MemOrder::kRelaxed);
    auto try_claim = [&] {
      if (claimed - released_seen_ >= table_size_) {
        // acquire: entries freed by the receiver are done with their old task.
        released_seen_ = released_.Load(MemOrder::kAcquire);
        if (claimed - released_seen_ >= table_size_) return false;
      }
      for (u32 k = 0; k < table_size_; ++k) {
        u32 j = cursor_ + k < table_size_ ? cursor_ + k : cursor_ + k - table_size_;
        // acquire: the last user of the entry has read its task before freeing it.
        if (entries_[j].word.Load(MemOrder::kAcquire) == 0) {
          cursor_ = j + 1 < table_size_ ? j + 1 : 0;
          *idx = j;
          claimed_.Store(claimed + 1, MemOrder::kRelaxed);  // relaxed: entries carry the order
          return true;
        }
      }
      return false;
    };
    return AwaitWhileHealthy(table_room_, tx_waits_, try_claim, [&] {
      // seq_cst: the re-check against the receiver's seq_cst release count.
      return claimed - released_.Load(MemOrder::kSeqCst) < table_size_;
    });
  }

  /** Streams one message into the request ring, in pieces when it is larger than the room. */
  Status StreamOut(const char *data, u64 len) {
    const u64 goal = req_->RingBytes() / 4;
    u64 sent = 0;
    while (sent < len) {
      const u64 left = len - sent;
      const u64 want = left < goal ? left : goal;
      u64 room = req_->WritableBytes(want);
      if (room < want) {
        bool ok = AwaitWhileHealthy(
            slot_->request_room_, tx_waits_, [&] { return req_->WritableBytes(want) >= want; },
            [&] { return req_->HasRoomSeqCst(want); });
        if (!ok) return FailureStatus();
        room = req_->WritableBytes(want);
      }
      const u64 n = left < room ? left : room;
      req_->WritePiece(sent == 0, len, data + sent, n);
      sent += n;
      // seq_cst: read after our seq_cst publish; a worker clears its bit, then re-checks
      // the streams (Dekker), so while one polls the poller need not be woken.
      if (header_->worker_readers_.Load(MemOrder::kSeqCst) == 0) header_->server_event_.Notify();
    }
    return Status::Ok();
  }

  /**
   * Runs try_op until it succeeds (spin, then park on `event`), giving up when the
   * connection fails or closes. `ready` is the seq_cst re-check of the awaited state.
   */
  template <typename TryOp, typename Ready>
  bool AwaitWhileHealthy(WaitEvent &event, WaitStats &stats, TryOp try_op, Ready ready) {
    for (;;) {
      bool done = AwaitOp(
          event, stats, [&] { return Unhealthy() || try_op(); },
          [&] { return Unhealthy() || ready(); }, DeadlineAfter(kPeerCheckNs));
      if (done) return !Unhealthy();
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
    // acq_rel: exactly one of answer, failure sweep or this takes the entry.
    if (!e.word.CompareExchange(expected, 0, MemOrder::kAcqRel)) return;
    ReleaseEntry();
    FailTask(t, code, msg);
  }

  /** Counts a freed entry and wakes a writer waiting for one. */
  void ReleaseEntry() {
    // seq_cst: the writer's park re-check reads the count (Dekker with Notify).
    released_.FetchAdd(1, MemOrder::kSeqCst);
    table_room_.Notify();
  }

  // ---- Receiving (the receiver thread) ----

  void ReceiveLoop() {
    pthread_setname_np(pthread_self(), "chi-shm-client");
    for (;;) {
      ShmStream::Piece p;
      switch (ans_->Peek(&p)) {
        case ShmStream::PeekResult::kReady:
          if (!OnPiece(p)) return;
          break;
        case ShmStream::PeekResult::kCorrupt:
          Fail(ErrorCode::kMalformed, "shm transport: the runtime's answer stream is corrupt");
          return;
        case ShmStream::PeekResult::kEmpty:
          if (!AwaitAnswer()) return;
          break;
      }
    }
  }

  /** Takes one answer record; false when the stream is out of step (the connection fails). */
  bool OnPiece(const ShmStream::Piece &p) {
    if (!rx_assembling_) {
      if (p.kind != ShmStream::kBegin) {
        Fail(ErrorCode::kMalformed, "shm transport: answer stream out of step");
        return false;
      }
      if (p.bytes == p.message_bytes && p.Contiguous()) {
        Deliver(p.first, p.bytes);  // decoded in place: the runtime cannot reuse it yet
        ans_->Consume(p);
        NotifyRuntimeRoom();
        return true;
      }
      rx_.clear();
      rx_total_ = p.message_bytes;
      rx_assembling_ = true;
    } else if (p.kind != ShmStream::kMore || p.bytes > rx_total_ - rx_.size()) {
      Fail(ErrorCode::kMalformed, "shm transport: answer stream out of step");
      return false;
    }
    rx_.insert(rx_.end(), p.first, p.first + p.first_bytes);
    rx_.insert(rx_.end(), p.second, p.second + p.second_bytes);
    ans_->Consume(p);
    NotifyRuntimeRoom();
    if (rx_.size() == rx_total_) {
      rx_assembling_ = false;
      Deliver(rx_.data(), rx_.size());
      RecycleBuffer(&rx_);
    }
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
    // acq_rel: exactly one of answer, failure sweep or a failed send takes the entry.
    if (!e.word.CompareExchange(expected, 0, MemOrder::kAcqRel)) {
      stray_answers_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
      return;
    }
    DecodeAnswer(t, data, len);
    ReleaseEntry();
    CompleteTask(t);
  }

  /** Tells a runtime that waits for room in our answer stream that there is some. */
  void NotifyRuntimeRoom() {
    // seq_cst: after our seq_cst consume; pairs with the runtime's flag-then-re-check.
    if (slot_->runtime_needs_room_.Load(MemOrder::kSeqCst) != 0) header_->server_event_.Notify();
  }

  /** Waits for the next answer; false when the receiver should stop. */
  bool AwaitAnswer() {
    const u64 start = MonotonicNs();
    for (u32 i = 1;; ++i) {
      if (ans_->HasData()) return true;
      if (rx_stop_.Load(MemOrder::kRelaxed) != 0) return false;  // relaxed: re-read below
      CpuRelax();
      if ((i & 63) != 0) continue;
      const u64 spun = MonotonicNs() - start;
      if (spun >= (Outstanding() != 0 ? kReceiverBusySpinNs : kReceiverSpinNs)) break;
      // A thread we are waiting for (a runtime worker, the caller) may share this CPU.
      sched_yield();
    }
    for (;;) {
      const u64 period = Outstanding() != 0 ? kPeerCheckNs : kIdleCheckNs;
      WaitResult r = slot_->answer_ready_.Wait(
          [&] {
            // seq_cst: re-checks against the runtime's publishes and Close's stop flag.
            return ans_->HasDataSeqCst() || rx_stop_.Load(MemOrder::kSeqCst) != 0 ||
                   slot_->state_.Load(MemOrder::kSeqCst) !=
                       static_cast<u32>(ShmSlotState::kActive) ||
                   header_->runtime_state_.Load(MemOrder::kSeqCst) ==
                       static_cast<u32>(ShmRuntimeState::kStopped);
          },
          DeadlineAfter(period), rx_waits_);
      if (rx_stop_.Load(MemOrder::kAcquire) != 0) return false;  // acquire: Close's stop
      if (ans_->HasData()) return true;
      if (!PeerHealthy(r == WaitResult::kTimedOut)) return ans_->HasData();
    }
  }

  /**
   * Checks the slot and the runtime (the process itself only when check_process);
   * fails the connection and returns false when they are gone. Answers already in
   * the stream are still delivered first (the caller re-checks it).
   */
  bool PeerHealthy(bool check_process) {
    char msg[Status::kMaxMessage];
    ErrorCode code = ErrorCode::kOk;
    // acquire: whatever the runtime wrote before changing the state is visible after.
    const u32 state = slot_->state_.Load(MemOrder::kAcquire);
    const u32 runtime_state = header_->runtime_state_.Load(MemOrder::kAcquire);
    if (state == static_cast<u32>(ShmSlotState::kBroken)) {
      u32 why = slot_->broken_code_.Load(MemOrder::kRelaxed);  // relaxed: set before the state
      code = why != 0 ? static_cast<ErrorCode>(why) : ErrorCode::kMalformed;
      std::snprintf(msg, sizeof(msg),
                    "shm transport: runtime pid %u reset this connection: it received a bad "
                    "request stream (%s)",
                    runtime_.pid, ErrorName(code));
    } else if (slot_->owner_pid_.Load(MemOrder::kAcquire) != self_.pid ||  // acquire: reclaim
               slot_->generation_.Load(MemOrder::kAcquire) != generation_ ||
               state != static_cast<u32>(ShmSlotState::kActive)) {
      code = ErrorCode::kPeerDead;
      std::snprintf(msg, sizeof(msg), "shm transport: runtime pid %u took this connection back",
                    runtime_.pid);
    } else if (runtime_state == static_cast<u32>(ShmRuntimeState::kStopped)) {
      code = ErrorCode::kShutdown;
      std::snprintf(msg, sizeof(msg), "shm transport: runtime pid %u stopped", runtime_.pid);
    } else if (check_process && !IsProcessAlive(runtime_)) {
      code = ErrorCode::kPeerDead;
      std::snprintf(msg, sizeof(msg), "shm transport: runtime pid %u died", runtime_.pid);
    }
    if (code == ErrorCode::kOk) return true;
    if (ans_->HasData()) return false;  // deliver what arrived before the end first
    Fail(code, msg);
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
      // acq_rel: take the entry (see TakeAndFail); acquire sees its task pointer.
      u64 id = e.word.Exchange(0, MemOrder::kAcqRel);
      if (id == 0) continue;
      // relaxed: the Exchange above acquired the writer's release of the entry.
      Task *t = reinterpret_cast<Task *>(e.task.Load(MemOrder::kRelaxed));
      ReleaseEntry();
      FailTask(t, first, failure_msg_);
    }
    table_room_.Notify();
    slot_->request_room_.Notify();
  }

  ShmSegment segment_;
  ShmSegmentHeader *header_ = nullptr;
  ShmClientSlot *slot_ = nullptr;
  ShmStream *req_ = nullptr;
  ShmStream *ans_ = nullptr;
  u32 slot_index_ = 0;
  u32 generation_ = 0;
  ProcessIdentity self_;
  ProcessIdentity runtime_;
  u64 max_message_bytes_ = 0;
  u32 table_size_ = 0;
  std::unique_ptr<Entry[]> entries_;

  // Senders.
  alignas(kCacheLine) Atomic<u64> submit_head_;  ///< stack of tasks to send (link: cookie)
  Atomic<u32> writer_;    ///< 1 while a thread streams requests (Close keeps it)
  u32 cursor_ = 0;        ///< the writer's next entry to try
  Atomic<u64> claimed_;   ///< entries the writer has taken, ever
  u64 released_seen_ = 0; ///< the writer's last view of released_
  std::vector<char> tx_;  ///< the writer's request buffer
  WaitStats tx_waits_;    ///< the writer's stalls and parks
  // Written only when a writer parks; read by every release.
  alignas(kCacheLine) WaitEvent table_room_;  ///< a writer parks here while the table is full

  // Read on every send, written once.
  alignas(kCacheLine) Atomic<u32> closed_;
  Atomic<u32> failure_;  ///< ErrorCode that ended the connection (0 = healthy)
  char failure_msg_[Status::kMaxMessage] = {};

  // The receiver's.
  alignas(kCacheLine) Atomic<u64> released_;  ///< entries freed, ever (answers and failures)
  Atomic<u32> rx_stop_;
  Atomic<u64> stray_answers_;
  WaitStats rx_waits_;  ///< the receiver's parks
  std::vector<char> rx_;
  u64 rx_total_ = 0;
  bool rx_assembling_ = false;
  std::thread receiver_;
};

}  // namespace chi
