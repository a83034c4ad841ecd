// CopySpace: a byte ring that streams messages of any size between one sender and one
// receiver, usually in two processes sharing the region (large task payloads, bulk
// outputs). Invariant: the ring only ever holds whole records (16-byte header + payload
// padded to 16), published by moving write_pos_, so a reader never sees half a record.
//
// Wire format. A message is a kBegin record (its total length and the first bytes that
// fit), then kMore records with the rest. A sender that gives up mid-message (timeout)
// appends a kAbort record, at once if there is room or else at the start of its next
// Send; the receiver then reports kCancelled for that message. A receiver that gives up
// mid-message (timeout) or rejects a message (kTooLarge) discards the rest of it on its
// next calls. Either way the next message arrives intact: a timeout never corrupts the
// stream. Both ends block by spinning and then parking on a futex in the region.
#pragma once

#include <algorithm>  // std::min for chunk sizes
#include <cstring>    // memcpy in and out of the ring
#include <new>        // placement new into the caller's region
#include <vector>     // Recv into a vector sized once

#include "chi/core/atomic.h"        // chi::Atomic, MemOrder
#include "chi/core/macros.h"        // kCacheLine
#include "chi/core/status.h"        // Status, ErrorCode
#include "chi/core/types.h"         // u32, u64
#include "chi/queue/ring_layout.h"  // RoundUpPow2, RoundUpTo, IsRingAligned
#include "chi/queue/wait_event.h"   // WaitEvent, WaitStats, AwaitOp, DeadlineAfter

namespace chi {

/** A single-sender, single-receiver message stream through a fixed byte ring (host only). */
class CopySpace {
 public:
  /** The smallest ring accepted; smaller requests are raised to it. */
  static constexpr u32 kMinRingBytes = 64;

  /** Region bytes for a ring of `ring_bytes` (raised to >= 64 and a power of two). */
  static size_t BytesFor(u32 ring_bytes) { return sizeof(CopySpace) + RingSize(ring_bytes); }

  /**
   * Constructs an empty stream at `mem` (BytesFor(ring_bytes) bytes, 64-byte aligned).
   * Returns nullptr when `mem` is null or misaligned.
   */
  static CopySpace *Create(void *mem, u32 ring_bytes) {
    if (!IsRingAligned(mem)) return nullptr;
    return new (mem) CopySpace(RingSize(ring_bytes));
  }

  /** Views a stream that another process (or an earlier Create) built at `mem`. */
  static CopySpace *Attach(void *mem) { return static_cast<CopySpace *>(mem); }

  /** Bytes in the ring (headers included). */
  u32 RingBytes() const { return ring_bytes_; }

  // ---- Sender side ----

  /**
   * Sends the `len` bytes at `data` (null is fine when len is 0) as one message, in pieces
   * as the receiver frees space; blocks up to timeout_ns in total (0 = forever). kTimeout
   * before the first byte leaves no trace; kTimeout mid-message cancels the message (the
   * receiver gets kCancelled for it).
   */
  Status Send(const void *data, u64 len, u64 timeout_ns) {
    u64 deadline = DeadlineAfter(timeout_ns);
    const char *bytes = static_cast<const char *>(data);
    if (send_open_ != 0) {
      if (!AwaitFree(kHeaderBytes, deadline)) {
        return Status::Error(ErrorCode::kTimeout,
                             "copy space: ring still full, the cancelled message is not closed");
      }
      WriteRecord(kAbort, 0, nullptr, 0);
      send_open_ = 0;
    }
    if (!AwaitFree(kHeaderBytes, deadline)) {
      return Status::Error(ErrorCode::kTimeout, "copy space: no room for the message header");
    }
    u64 sent = std::min<u64>(len, FreeBytes(MemOrder::kAcquire) - kHeaderBytes);
    send_open_ = sent < len ? 1 : 0;
    WriteRecord(kBegin, len, bytes, sent);
    while (sent < len) {
      u64 left = len - sent;
      if (!AwaitFree(std::min<u64>(kHeaderBytes + RoundUpTo(left, kAlign), chunk_goal_),
                     deadline)) {
        if (FreeBytes(MemOrder::kAcquire) >= kHeaderBytes) {
          WriteRecord(kAbort, 0, nullptr, 0);
          send_open_ = 0;
        }
        return Status::Errorf(ErrorCode::kTimeout,
                              "copy space: message cancelled after %llu of %llu bytes",
                              static_cast<unsigned long long>(sent),
                              static_cast<unsigned long long>(len));
      }
      u64 chunk = std::min<u64>(left, FreeBytes(MemOrder::kAcquire) - kHeaderBytes);
      WriteRecord(kMore, 0, bytes + sent, chunk);
      sent += chunk;
    }
    send_open_ = 0;
    return Status::Ok();
  }

  // ---- Receiver side ----

  /**
   * Waits up to timeout_ns (0 = forever) for the next message to start and reports its
   * total length, before its payload has arrived. The message stays next in line.
   */
  Status PeekLength(u64 *len, u64 timeout_ns) {
    Record begin;
    Status s = NextBegin(&begin, DeadlineAfter(timeout_ns));
    if (s.ok()) *len = begin.message_bytes;
    return s;
  }

  /**
   * Receives the next message into buf (buf_bytes long) and stores its length in *len.
   * A longer message is skipped and answered with kTooLarge (*len still says its size).
   * kTimeout mid-message abandons it; kCancelled says the sender abandoned it.
   */
  Status Recv(void *buf, u64 buf_bytes, u64 *len, u64 timeout_ns) {
    u64 deadline = DeadlineAfter(timeout_ns);
    Record begin;
    Status s = NextBegin(&begin, deadline);
    if (!s.ok()) return s;
    *len = begin.message_bytes;
    if (begin.message_bytes > buf_bytes) return Reject(begin, buf_bytes, deadline);
    return Receive(static_cast<char *>(buf), begin, deadline);
  }

  /**
   * Receives the next message into *out, sized once to the message length. Messages
   * longer than max_len are skipped with kTooLarge. On any failure *out is empty.
   */
  Status Recv(std::vector<char> *out, u64 max_len, u64 timeout_ns) {
    u64 deadline = DeadlineAfter(timeout_ns);
    out->clear();
    Record begin;
    Status s = NextBegin(&begin, deadline);
    if (!s.ok()) return s;
    if (begin.message_bytes > max_len) return Reject(begin, max_len, deadline);
    out->resize(begin.message_bytes);
    s = Receive(out->data(), begin, deadline);
    if (!s.ok()) out->clear();
    return s;
  }

  /** Discards the next message (waiting up to timeout_ns for it and its bytes). */
  Status Skip(u64 timeout_ns) {
    u64 deadline = DeadlineAfter(timeout_ns);
    Record begin;
    Status s = NextBegin(&begin, deadline);
    if (!s.ok()) return s;
    ConsumeRecord(begin, nullptr);
    discard_left_ = begin.message_bytes - begin.bytes;
    return FinishDiscard(deadline);
  }

  /** Times the sender had to wait for ring space (statistic). */
  u64 SenderStalls() const { return sender_stats_.Stalls(); }
  /** Times the receiver slept on the futex (statistic). */
  u64 ReceiverParks() const { return receiver_stats_.Parks(); }

 private:
  /** What every record starts with; always 16-byte aligned in the ring. */
  struct Record {
    u32 kind;           ///< kBegin, kMore or kAbort
    u32 bytes;          ///< payload bytes that follow in this record
    u64 message_bytes;  ///< kBegin: the whole message's length
  };
  static constexpr u64 kHeaderBytes = sizeof(Record);
  static constexpr u64 kAlign = 16;
  static_assert(kHeaderBytes == kAlign, "headers must never straddle the ring's end");
  static constexpr u32 kBegin = 0x43530001;  ///< "CS" + 1: a message starts
  static constexpr u32 kMore = 0x43530002;   ///< more bytes of the open message
  static constexpr u32 kAbort = 0x43530003;  ///< the sender abandoned the open message

  /** Ring size for a requested byte count. */
  static u32 RingSize(u32 ring_bytes) {
    return RoundUpPow2(ring_bytes < kMinRingBytes ? kMinRingBytes : ring_bytes);
  }

  /** Records the geometry; positions and wait words start at zero. */
  explicit CopySpace(u32 ring_bytes)
      : ring_bytes_(ring_bytes),
        mask_(ring_bytes - 1),
        chunk_goal_(ring_bytes / 4 > 2 * kAlign ? ring_bytes / 4 : 2 * kAlign) {}

  /** The byte ring trailing the header in the same region. */
  char *Ring() { return reinterpret_cast<char *>(this) + sizeof(CopySpace); }

  /** Free ring bytes as the sender sees them (always a multiple of 16). */
  u64 FreeBytes(MemOrder order) const {
    // relaxed: only the sender writes write_pos_. `order` on read_pos_: acquire lets us
    // overwrite bytes the receiver has finished with; seq_cst is the Dekker re-check.
    return ring_bytes_ - (write_pos_.Load(MemOrder::kRelaxed) - read_pos_.Load(order));
  }

  /** Published bytes as the receiver sees them. */
  u64 UsedBytes(MemOrder order) const {
    // relaxed: only the receiver writes read_pos_. `order` on write_pos_: acquire makes
    // the published bytes visible; seq_cst is the Dekker re-check.
    return write_pos_.Load(order) - read_pos_.Load(MemOrder::kRelaxed);
  }

  /** Blocks until `need` bytes are free or the deadline passes. */
  bool AwaitFree(u64 need, u64 deadline) {
    return AwaitOp(
        not_full_, sender_stats_, [&] { return FreeBytes(MemOrder::kAcquire) >= need; },
        [&] { return FreeBytes(MemOrder::kSeqCst) >= need; }, deadline, kFullRingBackoff);
  }

  /** Blocks until a whole record is published or the deadline passes. */
  bool AwaitRecord(u64 deadline) {
    return AwaitOp(
        not_empty_, receiver_stats_, [&] { return UsedBytes(MemOrder::kAcquire) >= kHeaderBytes; },
        [&] { return UsedBytes(MemOrder::kSeqCst) >= kHeaderBytes; }, deadline);
  }

  /** Copies n bytes into the ring at position pos, wrapping at its end. */
  void CopyIn(u64 pos, const char *src, u64 n) {
    if (n == 0) return;
    u64 off = pos & mask_;
    u64 first = std::min<u64>(n, ring_bytes_ - off);
    std::memcpy(Ring() + off, src, first);
    if (first < n) std::memcpy(Ring(), src + first, n - first);
  }

  /** Copies n bytes out of the ring from position pos, wrapping at its end. */
  void CopyOut(u64 pos, char *dst, u64 n) {
    if (n == 0) return;
    u64 off = pos & mask_;
    u64 first = std::min<u64>(n, ring_bytes_ - off);
    std::memcpy(dst, Ring() + off, first);
    if (first < n) std::memcpy(dst + first, Ring(), n - first);
  }

  /** Appends one record (the caller made sure it fits) and wakes the receiver. */
  void WriteRecord(u32 kind, u64 message_bytes, const char *payload, u64 bytes) {
    // relaxed: only the sender writes write_pos_.
    u64 pos = write_pos_.Load(MemOrder::kRelaxed);
    Record rec{kind, static_cast<u32>(bytes), message_bytes};
    CopyIn(pos, reinterpret_cast<const char *>(&rec), kHeaderBytes);
    CopyIn(pos + kHeaderBytes, payload, bytes);
    // seq_cst: release publishes the bytes; seq_cst pairs with a parked receiver.
    write_pos_.Store(pos + kHeaderBytes + RoundUpTo(bytes, kAlign), MemOrder::kSeqCst);
    not_empty_.Notify();
  }

  /** Reads the header of the oldest published record (AwaitRecord succeeded). */
  Record PeekRecord() {
    Record rec;
    CopyOut(read_pos_.Load(MemOrder::kRelaxed), reinterpret_cast<char *>(&rec), kHeaderBytes);
    return rec;
  }

  /** kMalformed unless `rec` is a known kind that fits in what is published. */
  Status CheckRecord(const Record &rec) const {
    bool known = rec.kind == kBegin || rec.kind == kMore || rec.kind == kAbort;
    if (known && kHeaderBytes + RoundUpTo(rec.bytes, kAlign) <= UsedBytes(MemOrder::kAcquire)) {
      return Status::Ok();
    }
    return Status::Errorf(ErrorCode::kMalformed,
                          "copy space: corrupt record (kind %#x, %u bytes); stream halted",
                          rec.kind, rec.bytes);
  }

  /** Copies the record's payload to dst (nullptr: drop it) and frees its space. */
  void ConsumeRecord(const Record &rec, char *dst) {
    u64 pos = read_pos_.Load(MemOrder::kRelaxed);
    if (dst != nullptr) CopyOut(pos + kHeaderBytes, dst, rec.bytes);
    // seq_cst: release hands the space back after our reads; seq_cst pairs with a
    // parked sender.
    read_pos_.Store(pos + kHeaderBytes + RoundUpTo(rec.bytes, kAlign), MemOrder::kSeqCst);
    not_full_.Notify();
  }

  /** Drops what is left of an abandoned or rejected message. */
  Status FinishDiscard(u64 deadline) {
    while (discard_left_ > 0) {
      if (!AwaitRecord(deadline)) {
        return Status::Errorf(ErrorCode::kTimeout,
                              "copy space: %llu bytes of an earlier message still to discard",
                              static_cast<unsigned long long>(discard_left_));
      }
      Record rec = PeekRecord();
      Status s = CheckRecord(rec);
      if (!s.ok()) return s;
      if (rec.kind == kAbort) {
        discard_left_ = 0;
      } else if (rec.kind == kMore && rec.bytes <= discard_left_) {
        discard_left_ -= rec.bytes;
      } else {
        return Status::Error(ErrorCode::kMalformed,
                             "copy space: a message started inside another; stream halted");
      }
      ConsumeRecord(rec, nullptr);
    }
    return Status::Ok();
  }

  /** Finishes any discard, then waits for the next kBegin record and returns its header. */
  Status NextBegin(Record *begin, u64 deadline) {
    Status s = FinishDiscard(deadline);
    if (!s.ok()) return s;
    for (;;) {
      if (!AwaitRecord(deadline)) {
        return Status::Error(ErrorCode::kTimeout, "copy space: no message arrived in time");
      }
      Record rec = PeekRecord();
      s = CheckRecord(rec);
      if (!s.ok()) return s;
      if (rec.kind == kBegin) {
        *begin = rec;
        return Status::Ok();
      }
      if (rec.kind != kAbort) {
        return Status::Error(ErrorCode::kMalformed,
                             "copy space: message bytes without a message; stream halted");
      }
      ConsumeRecord(rec, nullptr);  // a cancel for a message we never started: nothing to do
    }
  }

  /** Skips a message longer than `limit` and says so. */
  Status Reject(const Record &begin, u64 limit, u64 deadline) {
    ConsumeRecord(begin, nullptr);
    discard_left_ = begin.message_bytes - begin.bytes;
    Status s = FinishDiscard(deadline);
    if (s.code() == ErrorCode::kMalformed) return s;
    // A timed-out discard continues on the next call; the answer is still "too large".
    return Status::Errorf(ErrorCode::kTooLarge,
                          "copy space: message of %llu bytes exceeds the %llu-byte limit; skipped",
                          static_cast<unsigned long long>(begin.message_bytes),
                          static_cast<unsigned long long>(limit));
  }

  /** Receives the message that `begin` (the oldest record) starts into dst. */
  Status Receive(char *dst, const Record &begin, u64 deadline) {
    u64 total = begin.message_bytes;
    ConsumeRecord(begin, dst);
    u64 got = begin.bytes;
    while (got < total) {
      if (!AwaitRecord(deadline)) {
        discard_left_ = total - got;
        return Status::Errorf(ErrorCode::kTimeout,
                              "copy space: message abandoned after %llu of %llu bytes",
                              static_cast<unsigned long long>(got),
                              static_cast<unsigned long long>(total));
      }
      Record rec = PeekRecord();
      Status s = CheckRecord(rec);
      if (!s.ok()) return s;
      if (rec.kind == kAbort) {
        ConsumeRecord(rec, nullptr);
        return Status::Errorf(ErrorCode::kCancelled,
                              "copy space: sender cancelled the message after %llu of %llu bytes",
                              static_cast<unsigned long long>(got),
                              static_cast<unsigned long long>(total));
      }
      if (rec.kind != kMore || rec.bytes > total - got) {
        return Status::Error(ErrorCode::kMalformed,
                             "copy space: message bytes overrun the announced length");
      }
      ConsumeRecord(rec, dst + got);
      got += rec.bytes;
    }
    return Status::Ok();
  }

  // Line 0: written once by the constructor, then only read.
  alignas(kCacheLine) u32 ring_bytes_;
  u32 mask_;
  u64 chunk_goal_;  ///< the sender waits for this much room before writing a middle piece
  // Line 1: the sender's.
  alignas(kCacheLine) Atomic<u64> write_pos_;
  u32 send_open_ = 0;  ///< 1 while a message is partly sent (it needs a kAbort if dropped)
  WaitStats sender_stats_;
  // Line 2: the receiver's.
  alignas(kCacheLine) Atomic<u64> read_pos_;
  u64 discard_left_ = 0;  ///< bytes of an abandoned or rejected message still to drop
  WaitStats receiver_stats_;
  // Line 3: read on every record, written only when someone parks.
  alignas(kCacheLine) WaitEvent not_empty_;  ///< the receiver parks here
  WaitEvent not_full_;                       ///< the sender parks here
};

}  // namespace chi
