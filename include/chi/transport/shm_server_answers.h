// ShmAnswerWriter: how the runtime's answers reach shm clients (ShmServerCore's answer
// half). A worker that finishes a client's task writes the answer itself when the slot's
// answer stream is free: a small one inline in the stream, a large one into the slot's
// region of the runtime data segment, named by a kRef record. Otherwise the task waits in
// the slot's pending ring for the poller, which writes it the same way or streams it in
// pieces. Invariant: only the holder of a slot's `writer` flag appends to its answer
// stream or writes its answer data region, so answers and their blocks stay in one order.
#pragma once

#include <cstring>  // memcpy of encoded answers into the data region
#include <vector>   // answer buffers

#include "chi/core/atomic.h"                   // Atomic, MemOrder
#include "chi/task/task_ops.h"                 // DeleteTask of answered tasks
#include "chi/transport/message_buffer.h"      // RecycleBuffer of encoded answers
#include "chi/transport/request_dispatcher.h"  // EncodeEnvelopeInto, kSmallEnvelopeBytes
#include "chi/transport/shm_data_region.h"     // ShmDataSegments, ShmDataRegion, ShmDataRef
#include "chi/transport/shm_reaper.h"          // ShmServedSlot: the writer flag and queues
#include "chi/transport/shm_segment.h"         // slots and their answer streams
#include "chi/transport/shm_server_types.h"    // EncodeShmAnswer
#include "chi/transport/shm_stream.h"          // the answer stream

namespace chi {

/** Writes answers into the client slots' answer streams and answer data regions. */
class ShmAnswerWriter {
 public:
  /** Answers for the slots of `segment`; `data` holds the runtime data segment (or none). */
  ShmAnswerWriter(ShmSegment *segment, const ShmDataSegments *data, u64 max_message_bytes)
      : segment_(segment), data_(data), max_message_bytes_(max_message_bytes) {}

  /**
   * A worker's answer to task t of slot i, written now if the slot's stream is free and
   * the answer fits it or the data region. False: nothing was written (the caller queues
   * the task for the poller). Never blocks; the task stays the caller's.
   */
  bool TryWrite(u32 i, ShmServedSlot &s, Task *t) {
    if (!TakeWriter(s)) return false;
    // Small answers are encoded on the stack, large ones straight into the runtime data
    // region when it has room. One that does not fit the region now is the poller's (it
    // would not fit the ring either: encoding it here would only be done twice); without
    // a region, large ones (and refusals) are encoded in `buf` for the ring.
    char small[kSmallEnvelopeBytes];
    const char *msg = small;
    u64 len = EncodeEnvelopeInto(t->request_id_, t, t->ops_->save_out, small, sizeof(small));
    thread_local MessageBuffer buf;
    const bool by_ref = len == 0 && AnswerRegion(i, s).Enabled();
    bool fits = by_ref && WriteRef(i, s, 0, 0, true, [&](char *dst, u64 cap, u64 *need) {
      return EncodeAnswerInto(t, dst, cap, need);  // held to limits.max_output_size
    });
    if (by_ref && !fits) {
      s.writer.Store(0, MemOrder::kRelease);  // release: nothing appended, hand back
      return false;
    }
    if (!fits && (len == 0 || len > max_message_bytes_)) {
      shm_server::EncodeShmAnswer(t, max_message_bytes_, &buf.bytes);
      msg = buf.bytes.data();
      len = buf.bytes.size();
    }
    const ShmStream as = segment_->AnswerStream(i);
    if (!fits && len <= as.WritableBytes(len)) {
      fits = true;
      as.WritePiece(true, len, msg, len);
      // Still the writer: the reaper's Reset rebuilds this event once it holds the writer.
      segment_->Slot(i)->answer_ready_.Notify();
    }
    s.writer.Store(0, MemOrder::kRelease);  // release: our appends precede the next writer's
    if (msg != small) RecycleBuffer(&buf);
    return fits;
  }

  /**
   * The poller: writes slot i's queued answers (error answers first) as far as the
   * client's ring allows; an answer too large for it streams on at the next call.
   */
  bool Pump(u32 i, ShmServedSlot &s) {
    ShmClientSlot *slot = segment_->Slot(i);
    const ShmStream as = segment_->AnswerStream(i);
    bool worked = false;
    for (;;) {
      if (!s.outgoing_open) {
        // relaxed: the ring itself orders the values; the count only says "look".
        const bool have_task = s.pending_count.Load(MemOrder::kRelaxed) != 0;
        const bool have_error = s.error_count.Load(MemOrder::kRelaxed) != 0;  // relaxed: hint
        if (!have_error && !have_task) break;
        u32 idle = 0;
        // acquire: a worker's direct append is complete before ours.
        if (!s.writer.CompareExchange(idle, ShmServedSlot::kPollerWrites, MemOrder::kAcquire)) {
          break;
        }
        if (!have_error || !s.PopError(&s.outgoing.bytes)) {  // error answers go first
          u64 v = 0;
          if (!s.pending->TryPop(v)) {  // pushed but not yet published
            s.writer.Store(0, MemOrder::kRelease);  // release: nothing appended, hand back
            break;
          }
          s.pending_count.FetchSub(1, MemOrder::kRelaxed);  // relaxed: the poller's own count
          Task *t = reinterpret_cast<Task *>(v);
          shm_server::EncodeShmAnswer(t, max_message_bytes_, &s.outgoing.bytes);
          DeleteTask(t);
        }
        s.outgoing_open = true;
        s.outgoing_sent = 0;
      }
      if (!StreamOutgoing(i, s, slot, as)) break;
      worked = true;
    }
    return worked;
  }

  /**
   * True when slot i's answer stream and answer data region hold positions its client could
   * honestly have left (ShmStream::PositionsValid, ShmDataRegion::ReleasedValid); the poller
   * resets a slot whose answer waits on forged ones.
   */
  bool PositionsValid(u32 i, ShmServedSlot &s) const {
    const ShmDataRegion region = AnswerRegion(i, s);
    return segment_->AnswerStream(i).PositionsValid() &&
           (!region.Enabled() || region.ReleasedValid(s.answer_data_w.Load(MemOrder::kRelaxed)));
  }

 private:
  /** Polls of a worker-held writer flag before a worker's answer goes to the poller. */
  static constexpr u32 kWriterPolls = 64;

  /**
   * Takes slot s's writer flag for a worker. Another worker holds it only while it appends
   * one answer, so we wait for that (bounded: it may have been descheduled), rather than
   * hand the answer to the poller; the poller may hold it long, so then we give up at once.
   */
  static bool TakeWriter(ShmServedSlot &s) {
    for (u32 polls = 0; polls < kWriterPolls; ++polls) {
      // relaxed test first: a busy stream costs no write of its line.
      const u32 held = s.writer.Load(MemOrder::kRelaxed);
      if (held == 0) {
        u32 idle = 0;
        // acquire: the previous writer's appends are complete before ours.
        if (s.writer.CompareExchange(idle, ShmServedSlot::kWorkerWrites, MemOrder::kAcquire)) {
          return true;
        }
      } else if (held != ShmServedSlot::kWorkerWrites) {
        return false;
      }
      CpuRelax();
    }
    return false;
  }

  /**
   * Slot i's share of the runtime data segment (writer flag held): a disabled region once
   * /dev/shm could not back a block of it (s.answer_backing), so that answers stream
   * through the ring (backed at connect) rather than a write into the region dying of SIGBUS.
   */
  ShmDataRegion AnswerRegion(u32 i, ShmServedSlot &s) const {
    if (s.answer_backing.Refused()) return ShmDataRegion();
    return data_->AnswerRegion(i, &segment_->Slot(i)->answer_data_released_);
  }

  /**
   * Puts an answer, or a chunk of one `total` bytes long, in slot i's runtime data region
   * and names it in the answer stream (writer flag held). `fill(dst, cap, &need)` writes
   * it and returns its length (0: it did not fit, and `need` is at least what it takes);
   * `want` is that length when known, else 0 (fill gets the free room in backed pages,
   * ShmRegionBacking::EncodeIn, and the block is a whole answer).
   * `last`: the block ends its answer (counted in data_answers_). False, with nothing
   * published, when the region or the stream has no room now, or when /dev/shm cannot
   * back the block's pages (s.answer_backing refuses from then on).
   */
  template <typename Fill>
  bool WriteRef(u32 i, ShmServedSlot &s, u64 want, u64 total, bool last, Fill fill) {
    const ShmDataRegion region = AnswerRegion(i, s);
    const ShmStream as = segment_->AnswerStream(i);
    if (!region.Enabled() || as.WritableBytes(ShmStream::kRefBytes) < ShmStream::kRefBytes) {
      return false;
    }
    ShmDataRef ref;
    if (want != 0) {
      char *dst = region.Reserve(s.answer_data_w.Load(MemOrder::kRelaxed), want, &ref);
      ref.total = total;
      if (dst == nullptr || !s.answer_backing.Covers(region, ref)) return false;
      fill(dst, want, nullptr);  // exactly `want` bytes: it fits, nothing to learn
    } else {
      u64 start = 0;
      const u64 room = region.ContiguousRoom(s.answer_data_w.Load(MemOrder::kRelaxed), &start);
      const u64 n = s.answer_backing.EncodeIn(
          region, start, room < max_message_bytes_ ? room : max_message_bytes_, fill);
      if (n == 0) return false;
      ref = ShmDataRef{start, n, n};
    }
    // Counted before the publish: the client may read the statistics once it has the answer.
    if (last) segment_->Slot(i)->data_answers_.AddOwned(1);  // the writer flag's holder
    as.WriteRef(&ref, MemOrder::kSeqCst);  // seq_cst: as WritePiece (the Notify below)
    // relaxed: the writer flag orders it for the next writer; others read a statistic.
    s.answer_data_w.Store(ShmDataRegion::Commit(ref), MemOrder::kRelaxed);
    segment_->Slot(i)->answer_ready_.Notify();
    return true;
  }

  /**
   * Writes the open answer's next pieces: through the runtime data region when there is
   * one (whole, or in chunks of half the region when larger), else through the ring.
   * True once it is all out (writer released).
   */
  bool StreamOutgoing(u32 i, ShmServedSlot &s, ShmClientSlot *slot, const ShmStream &as) {
    const u64 total = s.outgoing.bytes.size();
    const ShmDataRegion region =
        total > kSmallEnvelopeBytes ? AnswerRegion(i, s) : ShmDataRegion();
    const bool by_ref = region.Enabled();
    u64 goal = !by_ref ? as.RingBytes() / 4
                       : (total <= region.Bytes() ? total : region.Bytes() / 2);
    while (by_ref && s.outgoing_sent < total) {
      const u64 n = total - s.outgoing_sent < goal ? total - s.outgoing_sent : goal;
      auto copy = [&](char *dst, u64 bytes, u64 *) {
        std::memcpy(dst, s.outgoing.bytes.data() + s.outgoing_sent, bytes);
        return bytes;
      };
      const bool last = s.outgoing_sent + n == total;
      if (!WriteRef(i, s, n, total, last, copy)) {
        if (s.answer_backing.Refused()) {  // only a first block (nothing sent): the ring
          goal = as.RingBytes() / 4;
          break;
        }
        // seq_cst: announce the wait; the fence orders it before the re-check (the client
        // frees a block, then reads the flag).
        slot->runtime_needs_room_.Store(1, MemOrder::kSeqCst);
        FenceSeqCst();
        if (!WriteRef(i, s, n, total, last, copy)) return false;
      }
      s.outgoing_sent += n;
    }
    while (s.outgoing_sent < total) {
      const u64 left = total - s.outgoing_sent;
      const u64 want = left < goal ? left : goal;
      u64 room = as.WritableBytes(want);
      if (room < want) {
        // seq_cst: announce the wait, then re-check (the client reads it after consuming).
        slot->runtime_needs_room_.Store(1, MemOrder::kSeqCst);
        room = as.WritableBytes(want);
        if (room < want) return false;
      }
      const u64 n = left < room ? left : room;
      as.WritePiece(s.outgoing_sent == 0, total, s.outgoing.bytes.data() + s.outgoing_sent, n);
      s.outgoing_sent += n;
      slot->answer_ready_.Notify();
    }
    slot->runtime_needs_room_.Store(0, MemOrder::kRelaxed);  // relaxed: only a hint
    s.outgoing_open = false;
    RecycleBuffer(&s.outgoing);
    s.writer.Store(0, MemOrder::kRelease);  // release: our appends precede the next writer's
    s.ReleaseCredit(segment_->Header()->server_event_);
    return true;
  }


  ShmSegment *segment_;
  const ShmDataSegments *data_;
  u64 max_message_bytes_;
};

}  // namespace chi
