// ShmClientTransport: a pure client's connection to a runtime on this node through the
// runtime's segment (ShmServer). Send streams the task into its slot's request ring on the
// caller's thread; the receiving half (ShmClientReceiver, shm_client_receive.h) completes
// tasks from the answers and fails every outstanding task if the runtime dies. One
// connection, one runtime: ShmReconnectingTransport (shm_reconnect.h) replaces a lost one.
// Invariant: one writer at a time streams requests (the writer_ role).
#pragma once

#include <sched.h>  // sched_yield while Close waits for a writer to leave

#include <cstring>  // memcpy of requests into the client data region
#include <memory>  // unique_ptr
#include <vector>  // the request buffer

#include "chi/core/atomic.h"                   // Atomic, CpuRelax
#include "chi/core/status.h"                   // Status, ErrorCode
#include "chi/queue/wait_event.h"              // WaitEvent, AwaitOp, deadlines
#include "chi/transport/message_buffer.h"      // RecycleBuffer of the request buffer
#include "chi/transport/request_dispatcher.h"  // EncodeRequest
#include "chi/transport/shm_client_receive.h"  // ShmClientReceiver: answers, table, liveness
#include "chi/transport/shm_region_backing.h"  // ShmRegionBacking: the request region's pages
#include "chi/transport/shm_segment.h"         // segment layout, ShmServerInfo
#include "chi/transport/shm_stream.h"          // the request stream
#include "chi/transport/task_stack.h"          // TaskStack: submissions while another writes

namespace chi {

/** What a connection's user chooses (the runtime's segment fixes the rest). */
struct ShmClientOptions {
  /**
   * Outstanding tasks fail with kPeerDead once the runtime process, alive, has shown no
   * sign of life (its poller's heartbeat) for this long: stopped (SIGSTOP) or hung. 0:
   * never. networking.hang_timeout_s for clients that CHIMAERA_INIT connects.
   */
  double hang_timeout_sec = 0;
};

/** A connection to one runtime through its shared-memory segment. */
class ShmClientTransport final : public ShmClientReceiver {
 public:
  /**
   * Attaches the segment `info` names, checks it (kNotFound, kSizeMismatch,
   * kVersionMismatch, kPeerDead for a runtime that is gone) and claims a free client
   * slot (kOutOfMemory when all are taken).
   */
  static Status Connect(const ShmServerInfo &info, std::unique_ptr<ShmClientTransport> *out,
                        const ShmClientOptions &opt = ShmClientOptions()) {
    std::unique_ptr<ShmClientTransport> c(new ShmClientTransport());
    c->hang_timeout_ns_ = static_cast<u64>(opt.hang_timeout_sec * 1e9);  // before the receiver
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
    if (submissions_.Empty(MemOrder::kRelaxed) &&
        writer_.CompareExchange(idle, 1, MemOrder::kAcquire)) {
      WriteTask(task);
      LeaveWriter();
    } else {
      submissions_.Push(task);  // pushers and the writer re-check each other (push, then role)
      DrainSubmissions();
    }
    return true;
  }

  /** Fails every outstanding task with kShutdown, hands the slot back, unmaps. Idempotent. */
  void Close() override {
    Retire();
    segment_.Detach();
    data_.Detach();
  }

  /**
   * Close without unmapping the segment: a sender that still holds this connection may
   * read the runtime's state (Usable) until the owner calls Close. Idempotent.
   */
  void Retire() {
    if (closed_.Exchange(1, MemOrder::kSeqCst) != 0 || slot_ == nullptr) return;
    table_room_.Notify();  // a writer parked for room sees closed_ and leaves
    slot_->request_room_.Notify();
    u32 idle = 0;
    // acquire: the last writer's stream writes are done; we keep the role for good.
    while (!writer_.CompareExchange(idle, 1, MemOrder::kAcquire)) {
      idle = 0;
      sched_yield();
    }
    submissions_.FailAll(ErrorCode::kShutdown, "shm transport: closed before the task was sent");
    StopReceiving();  // no caller helps and the receiver has left: the stream is ours
    Fail(ErrorCode::kShutdown, "shm transport: closed with the task outstanding");
    // acquire: a reclaim by the runtime (new generation) is seen with what it reset.
    if (slot_->owner_pid_.Load(MemOrder::kAcquire) == self_.pid &&
        slot_->generation_.Load(MemOrder::kAcquire) == generation_) {
      // seq_cst: the runtime's rescan (membership bump below) sees the closed state.
      slot_->state_.Store(static_cast<u32>(ShmSlotState::kClosed), MemOrder::kSeqCst);
    }
    header_->membership_seq_.FetchAdd(1, MemOrder::kSeqCst);
    header_->server_event_.Notify();
  }

  /**
   * True while new tasks can go this way: the connection has not failed and the runtime
   * still serves (a stopping runtime refuses new requests before its stop reaches the
   * receiver). Safe on a retired connection; not after Close.
   */
  bool Usable() const {
    // acquire: as in Failure; relaxed state: a line the runtime writes only at start and stop.
    return failure_.Load(MemOrder::kAcquire) == 0 && closed_.Load(MemOrder::kAcquire) == 0 &&
           header_->runtime_state_.Load(MemOrder::kRelaxed) ==
               static_cast<u32>(ShmRuntimeState::kServing);
  }

  const char *Name() const override { return "shm"; }

  /** Index of the slot this connection holds (tests inject bytes into its streams). */
  u32 SlotIndex() const { return slot_index_; }
  /** The mapped segment (tests and diagnostics). */
  ShmSegment &Segment() { return segment_; }

 private:
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
                                 "shm transport: all %u client slots of runtime pid %u are taken "
                                 "(its shm.client_slots; or connect with CHI_IPC_MODE=ipc)",
                                 slots, runtime_.pid);
      segment_.Detach();
      return st;
    }
    if (Status st = data_.Attach(header_->data_, slots); !st.ok()) return GiveBackSlot(st);
    request_region_ = data_.RequestRegion(slot_index_, &slot_->request_data_released_);
    answer_region_ = data_.AnswerRegion(slot_index_, &slot_->answer_data_released_);
    req_ = segment_.RequestStream(slot_index_);
    ans_ = segment_.AnswerStream(slot_index_);
    // The first requests and answers then take no page faults here, and every page of the
    // rings is backed: a ring /dev/shm cannot back would kill a later write with SIGBUS.
    if (!req_.Prefault() || !ans_.Prefault()) {
      return GiveBackSlot(Status::Errorf(
          ErrorCode::kOutOfMemory,
          "shm transport: /dev/shm cannot back this client's rings (2 x %u KiB): free room "
          "there or connect with CHI_IPC_MODE=ipc",
          req_.RingBytes() >> 10));
    }
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
    StartReceiving();
    return Status::Ok();
  }

  /**
   * Undoes a connection that failed after claiming its slot: hands the slot back untouched
   * (it never became active) and unmaps everything, so Close has nothing left to do.
   */
  Status GiveBackSlot(Status why) {
    data_.Detach();
    slot_->owner_pid_.Store(0, MemOrder::kRelease);  // release: our reads of the slot are done
    slot_ = nullptr;
    segment_.Detach();
    return why;
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
          submissions_.FailAll(ErrorCode::kShutdown, "shm transport: closed before the task was sent");
        }
        return;
      }
      for (Task *t = submissions_.TakeOldestFirst(); t != nullptr;
           t = submissions_.TakeOldestFirst()) {
        while (t != nullptr) {
          Task *next = TaskStack::Next(t);  // t may be freed below
          WriteTask(t);
          t = next;
        }
      }
      // seq_cst: leave the role, then re-check the stack (pushers do the reverse).
      writer_.Store(0, MemOrder::kSeqCst);
      if (submissions_.Empty(MemOrder::kSeqCst)) return;
    }
  }

  /** Leaves the writer role; sends what was submitted meanwhile. */
  void LeaveWriter() {
    // seq_cst: leave the role, then re-check the stack (pushers do the reverse).
    writer_.Store(0, MemOrder::kSeqCst);
    if (!submissions_.Empty(MemOrder::kSeqCst)) DrainSubmissions();
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
    // Small requests are encoded on the stack and streamed from there; larger ones go
    // straight into the client data region when it has room, and tx_ takes the rest.
    char small[kSmallEnvelopeBytes];
    const char *msg = small;
    u64 len = EncodeEnvelopeInto(id, t, t->ops_->save_in, small, sizeof(small));
    ShmDataRef ref;
    if (len == 0) EncodeInRegion(id, t, &ref);
    if (len == 0 && ref.bytes == 0) {
      OutputArchive ar = BeginEnvelope(id, &tx_.bytes);
      t->ops_->save_in(*t, ar);
      msg = tx_.bytes.data();
      len = tx_.bytes.size();
    }
    e.task.Store(reinterpret_cast<u64>(t), MemOrder::kRelaxed);  // relaxed: published below
    // release: the task and our reads of it (encoding) happen before the receiver, which
    // takes the entry with acquire, completes it; published before the request can travel.
    e.word.Store(id, MemOrder::kRelease);
    // The entry this writer will most likely take next: fetch its line while we wait.
    __builtin_prefetch(&entries_[cursor_], 1);
    Status st;
    if (ref.bytes != 0) {
      st = SendRef(ref);
    } else if (len > max_message_bytes_) {
      st = Status::Errorf(ErrorCode::kTooLarge,
                          "shm transport: request of %llu bytes exceeds the runtime's %llu-byte "
                          "limit (shm.client_data_size)",
                          static_cast<unsigned long long>(len),
                          static_cast<unsigned long long>(max_message_bytes_));
    } else if (len > kSmallEnvelopeBytes && request_region_.Enabled()) {
      st = CopyToRegion(msg, len);
    } else {
      st = StreamOut(msg, len);
    }
    if (msg != small) RecycleBuffer(&tx_);
    // A sent request was followed by Published's seq_cst fence, which orders our entry
    // store before this read of failure_ (Dekker with Fail, which stores failure_ and then
    // sweeps the table): a task registered after the sweep is failed here. A request that
    // was not sent is failed below anyway.
    if (st.ok() && Unhealthy()) st = FailureStatus();
    if (!st.ok()) {
      TakeAndFail(idx, id, st.code(), st.message());
      return;
    }
    NoteCpu(slot_->client_cpu_);
    // A runtime worker last seen on our CPU reads the request only once we stop: let it.
    if (ShareCpu(slot_->runtime_cpu_)) sched_yield();
  }

  /**
   * True when the request region can be used as far as `backed` says (/dev/shm backed its
   * pages). Otherwise the region is dropped for good: large requests stream through the
   * ring (backed at connect) rather than a write into the region dying of SIGBUS.
   */
  bool KeepRequestRegion(bool backed) {
    if (!backed) request_region_ = ShmDataRegion();
    return backed;
  }

  /** Finds a free table entry, waiting while max_outstanding tasks are out. */
  bool ClaimEntry(u32 *idx) {
    // relaxed: only the writer moves claimed_.
    const u64 claimed = claimed_.Load(MemOrder::kRelaxed);
    auto try_claim = [&] {
      if (claimed - released_seen_ >= table_size_) {
        released_seen_ = Released();
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
    return AwaitWhileHealthy(table_room_, tx_waits_, try_claim,
                             [&] { return AnyFreeEntrySeqCst(); });
  }

  /** Streams one message into the request ring, in pieces when it is larger than the room. */
  Status StreamOut(const char *data, u64 len) {
    for (u64 sent = 0; sent < len;) {
      const u64 left = len - sent;
      // The usual request fits whole now: one record, no wait. Otherwise wait for room
      // for a piece of a quarter ring (or the rest), so pieces do not shrink to slivers.
      u64 room = req_.WritableBytes(left);
      if (room < left) {
        const u64 goal = req_.RingBytes() / 4;
        if (Status st = AwaitRingRoom(left < goal ? left : goal, &room); !st.ok()) return st;
      }
      const u64 n = left < room ? left : room;
      req_.WritePieceRelease(sent == 0, len, data + sent, n);
      sent += n;
      Published();
    }
    return Status::Ok();
  }

  /**
   * Encodes a request straight into the free room of the client data region; *ref names
   * it (ref->bytes stays 0 when the region is off, the request does not fit now, or
   * /dev/shm cannot back its pages: the region is dropped then).
   */
  void EncodeInRegion(u64 id, Task *t, ShmDataRef *ref) {
    if (!request_region_.Enabled()) return;
    u64 start = 0;
    u64 room = request_region_.ContiguousRoom(request_data_w_, &start);
    if (room > max_message_bytes_) room = max_message_bytes_;
    if (room <= kSmallEnvelopeBytes) return;
    const u64 n = request_backing_.EncodeIn(
        request_region_, start, room, [&](char *dst, u64 cap, u64 *need) {
          return EncodeEnvelopeInto(id, t, t->ops_->save_in, dst, cap, need);
        });
    KeepRequestRegion(!request_backing_.Refused());
    *ref = ShmDataRef{start, n, n};
  }

  /**
   * Copies an encoded request into the client data region, waiting for room, and sends
   * its ref: whole when it fits the region, else in chunks of half the region (the
   * runtime assembles them while we write the next). Streams it through the ring instead
   * when /dev/shm cannot back the pages it needs.
   */
  Status CopyToRegion(const char *data, u64 len) {
    const u64 chunk = len <= request_region_.Bytes() ? len : request_region_.Bytes() / 2;
    for (u64 sent = 0; sent < len;) {
      const u64 n = len - sent < chunk ? len - sent : chunk;
      ShmDataRef ref;
      char *dst = nullptr;
      bool ok = AwaitWhileHealthy(
          slot_->request_room_, tx_waits_,
          [&] { return (dst = request_region_.Reserve(request_data_w_, n, &ref)) != nullptr; },
          [&] { return request_region_.HasRoomSeqCst(request_data_w_, n); });
      if (!ok) return FailureStatus();
      ref.total = len;
      // Only the first block can be refused (Covers), so nothing of the message is out yet.
      if (!KeepRequestRegion(request_backing_.Covers(request_region_, ref))) {
        return StreamOut(data, len);
      }
      std::memcpy(dst, data + sent, n);
      if (Status st = SendRef(ref); !st.ok()) return st;
      sent += n;
    }
    return Status::Ok();
  }

  /** Publishes a kRef record naming a request written to the client data region. */
  Status SendRef(const ShmDataRef &ref) {
    u64 room = 0;
    if (Status st = AwaitRingRoom(ShmStream::kRefBytes, &room); !st.ok()) return st;
    req_.WriteRef(&ref, MemOrder::kRelease);  // release: the caller's fence follows (Published)
    request_data_w_ = ShmDataRegion::Commit(ref);
    Published();
    return Status::Ok();
  }

  /** Waits until a record of `want` payload bytes fits the request ring; *room: what fits now. */
  Status AwaitRingRoom(u64 want, u64 *room) {
    *room = req_.WritableBytes(want);
    if (*room >= want) return Status::Ok();
    bool ok = AwaitWhileHealthy(
        slot_->request_room_, tx_waits_, [&] { return req_.WritableBytes(want) >= want; },
        [&] { return req_.HasRoomSeqCst(want); });
    if (!ok) return FailureStatus();
    *room = req_.WritableBytes(want);
    return Status::Ok();
  }

  /** After a record's release publish: the full barrier, then wake the poller if no worker reads. */
  void Published() {
    // seq_cst fence: the one full barrier per record. It orders the publish (and the
    // entry store before it) ahead of the reads below and WriteTask's failure_ check.
    FenceSeqCst();
    // seq_cst: read after the fence; a worker clears its bit, then re-checks the
    // streams (Dekker), so while one polls the poller need not be woken. Notify's
    // waiter-count read is covered by the same fence.
    if (header_->worker_readers_.Load(MemOrder::kSeqCst) == 0) header_->server_event_.Notify();
  }

  /**
   * Runs try_op until it succeeds (spin, then park on `event`), giving up when the
   * connection fails or closes. `ready` is the seq_cst re-check of the awaited state.
   */
  template <typename TryOp, typename Ready>
  bool AwaitWhileHealthy(WaitEvent &event, WaitStats &stats, TryOp try_op, Ready ready) {
    // The usual case first, before any clock read (the deadline below costs one).
    if (Unhealthy()) return false;
    if (try_op()) return true;
    for (;;) {
      bool done = AwaitOp(
          event, stats, [&] { return Unhealthy() || try_op(); },
          [&] { return Unhealthy() || ready(); }, DeadlineAfter(kPeerCheckNs));
      if (done) return !Unhealthy();
    }
  }

  // The writer's.
  TaskStack submissions_;  ///< tasks to send, pushed by callers while another thread writes
  Atomic<u32> writer_;    ///< 1 while a thread streams requests (Close keeps it)
  u32 cursor_ = 0;        ///< the writer's next entry to try
  u64 released_seen_ = 0; ///< the writer's last view of Released()
  u64 request_data_w_ = 0;  ///< the writer's position in the client data region
  ShmRegionBacking request_backing_;  ///< how much of the request region /dev/shm backed
  MessageBuffer tx_;  ///< the writer's request buffer
  WaitStats tx_waits_;    ///< the writer's stalls and parks
};

}  // namespace chi
