// ShmStream: one direction of a shared-memory connection, a byte ring with one writer and
// one reader (usually two processes) carrying framed messages of any size in pieces. Both
// ends are non-blocking so one runtime poller can serve many streams; callers choose how
// to wait. Invariant: the ring holds only whole records (16-byte header + payload padded
// to 16), published by moving write_pos_, so the reader never sees half a record.
//
// Framing: a message is a kBegin record (its total length and the first bytes that fit)
// followed by kMore records with the rest. The reader checks every header against what
// is published and reports a corrupt stream instead of trusting it.
#pragma once

#include <algorithm>  // std::min for wrapped copies
#include <cstring>    // memcpy in and out of the ring
#include <new>        // placement new into the caller's region
#include <vector>     // RecycleBuffer

#include "chi/core/atomic.h"        // Atomic, MemOrder
#include "chi/core/macros.h"        // kCacheLine, CHI_LIKELY
#include "chi/core/types.h"         // u32, u64
#include "chi/queue/ring_layout.h"  // RoundUpPow2, RoundUpTo, IsRingAligned

namespace chi {

/** A single-writer, single-reader message stream through a fixed byte ring (host only). */
class ShmStream {
 public:
  /** Bytes of every record header. */
  static constexpr u64 kRecordHeaderBytes = 16;
  /** The smallest ring accepted; smaller requests are raised to it. */
  static constexpr u32 kMinRingBytes = 256;
  /** Record kinds ("SM" + n), chosen so zeroed or random memory is rarely mistaken for one. */
  static constexpr u32 kBegin = 0x534d0001;
  static constexpr u32 kMore = 0x534d0002;

  /** Region bytes for a ring of `ring_bytes` (raised to >= kMinRingBytes, a power of two). */
  static size_t BytesFor(u32 ring_bytes) { return sizeof(ShmStream) + RingSize(ring_bytes); }

  /** Builds an empty stream at `mem` (BytesFor bytes, 64-byte aligned); nullptr if misaligned. */
  static ShmStream *Create(void *mem, u32 ring_bytes) {
    if (!IsRingAligned(mem)) return nullptr;
    return new (mem) ShmStream(RingSize(ring_bytes));
  }

  /** Views a stream that another process (or an earlier Create) built at `mem`. */
  static ShmStream *Attach(void *mem) { return static_cast<ShmStream *>(mem); }

  /** Empties the stream. Only while neither end uses it (the runtime reclaiming a slot). */
  void Reset() {
    // relaxed: nobody else touches the stream now; the caller publishes the reset slot.
    write_pos_.Store(0, MemOrder::kRelaxed);
    read_pos_.Store(0, MemOrder::kRelaxed);
    cached_read_ = 0;
    cached_write_ = 0;
  }

  /** Bytes in the ring (record headers included). */
  u32 RingBytes() const { return ring_bytes_; }
  /** The largest payload one record can carry. */
  u64 MaxPieceBytes() const { return ring_bytes_ - kRecordHeaderBytes; }

  // ---- Writer side ----

  /**
   * Payload bytes the next record may carry right now (0 when the ring is full). Reads
   * the reader's position only when the cached one leaves fewer than `want` bytes, so
   * a writer with room never touches the reader's cache line.
   */
  u64 WritableBytes(u64 want) {
    u64 w = write_pos_.Load(MemOrder::kRelaxed);  // relaxed: only the writer moves it
    u64 room = Room(w, cached_read_);
    if (room >= want) return room;
    // acquire: the reader is done with the bytes before read_pos_, so we may overwrite them.
    cached_read_ = read_pos_.Load(MemOrder::kAcquire);
    return Room(w, cached_read_);
  }

  /** True when a record of `want` payload bytes fits (seq_cst: a waiter's re-check). */
  bool HasRoomSeqCst(u64 want) const {
    // seq_cst: the Dekker re-check against the reader's seq_cst read_pos_ store.
    return Room(write_pos_.Load(MemOrder::kRelaxed), read_pos_.Load(MemOrder::kSeqCst)) >= want;
  }

  /**
   * Appends one record: kBegin (begin = true, message_bytes = the whole message) or kMore.
   * The caller made sure `bytes` <= WritableBytes(bytes). Publishes with seq_cst so a
   * parked reader is never missed (the caller notifies it afterwards).
   */
  void WritePiece(bool begin, u64 message_bytes, const void *data, u64 bytes) {
    // seq_cst: release publishes the record; seq_cst orders it before the notifier's
    // read of the reader's waiter count (WaitEvent's Dekker pair).
    Append(begin, message_bytes, data, bytes, MemOrder::kSeqCst);
  }

  /**
   * WritePiece with a release publish only: the caller issues FenceSeqCst before it
   * reads any waiter flag, so one fence covers this publish and the stores before it.
   */
  void WritePieceRelease(bool begin, u64 message_bytes, const void *data, u64 bytes) {
    // release: publishes the record; the caller's fence orders it before its Dekker reads.
    Append(begin, message_bytes, data, bytes, MemOrder::kRelease);
  }

  /**
   * Publishes raw bytes with no framing (length rounded up to 16). Fault injection for
   * tests of a reader's defences only; the caller made sure they fit.
   */
  void PublishUnframed(const void *data, u64 bytes) {
    u64 w = write_pos_.Load(MemOrder::kRelaxed);  // relaxed: only the writer moves it
    CopyIn(w, data, bytes);
    // seq_cst: as in WritePiece.
    write_pos_.Store(w + RoundUpTo(bytes, kAlign), MemOrder::kSeqCst);
  }

  // ---- Reader side ----

  /** The oldest published record, as the reader sees it in place (maybe wrapped in two). */
  struct Piece {
    u32 kind = 0;
    u32 bytes = 0;            ///< payload bytes of this record
    u64 message_bytes = 0;    ///< kBegin: the whole message's length
    const char *first = nullptr;   ///< payload up to the ring's end
    u64 first_bytes = 0;
    const char *second = nullptr;  ///< the rest, from the ring's start (wrapped payloads)
    u64 second_bytes = 0;
    u64 footprint = 0;        ///< ring bytes the record occupies (Consume frees them)

    /** True when the payload is one contiguous run of bytes in the ring. */
    bool Contiguous() const { return second_bytes == 0; }
    /** Copies the payload out. */
    void CopyTo(char *dst) const {
      if (first_bytes != 0) std::memcpy(dst, first, first_bytes);
      if (second_bytes != 0) std::memcpy(dst + first_bytes, second, second_bytes);
    }
  };

  /** What Peek found. */
  enum class PeekResult : u32 { kEmpty, kReady, kCorrupt };

  /**
   * Describes the oldest record without consuming it. kCorrupt: the published bytes do
   * not form a valid record (unknown kind, or a length beyond what is published); the
   * stream cannot be trusted any more.
   */
  PeekResult Peek(Piece *p) {
    u64 r = read_pos_.Load(MemOrder::kRelaxed);  // relaxed: only the reader moves it
    if (cached_write_ == r) {
      // acquire: the record bytes before write_pos_ are visible once we read it.
      cached_write_ = write_pos_.Load(MemOrder::kAcquire);
      if (cached_write_ == r) return PeekResult::kEmpty;
    }
    const u64 used = cached_write_ - r;
    Record rec;
    if (used < kRecordHeaderBytes || used > ring_bytes_) return PeekResult::kCorrupt;
    CopyOut(r, &rec, kRecordHeaderBytes);
    const u64 footprint = kRecordHeaderBytes + RoundUpTo(rec.bytes, kAlign);
    if ((rec.kind != kBegin && rec.kind != kMore) || footprint > used ||
        (rec.kind == kBegin && rec.bytes > rec.message_bytes)) {
      return PeekResult::kCorrupt;
    }
    p->kind = rec.kind;
    p->bytes = rec.bytes;
    p->message_bytes = rec.message_bytes;
    p->footprint = footprint;
    const u64 off = (r + kRecordHeaderBytes) & mask_;
    p->first = Ring() + off;
    p->first_bytes = std::min<u64>(rec.bytes, ring_bytes_ - off);
    p->second = Ring();
    p->second_bytes = rec.bytes - p->first_bytes;
    return PeekResult::kReady;
  }

  /** Frees the record that Peek described (the reader is done with its bytes). */
  void Consume(const Piece &p) {
    u64 r = read_pos_.Load(MemOrder::kRelaxed);  // relaxed: only the reader moves it
    // seq_cst: release hands the space back after our reads; seq_cst orders it before
    // the notifier's read of a parked writer's waiter count.
    read_pos_.Store(r + p.footprint, MemOrder::kSeqCst);
  }

  /** True when a record is published (a spinning reader's cheap check). */
  bool HasData() const {
    // acquire: a record seen here is readable by the Peek that follows.
    return write_pos_.Load(MemOrder::kAcquire) != read_pos_.Load(MemOrder::kRelaxed);
  }

  /** True when a record is published (seq_cst: a waiter's Dekker re-check). */
  bool HasDataSeqCst() const {
    // seq_cst: pairs with the writer's seq_cst write_pos_ store.
    return write_pos_.Load(MemOrder::kSeqCst) != read_pos_.Load(MemOrder::kRelaxed);
  }

  /** Published bytes not yet consumed (a statistic: read from any process). */
  u64 UsedBytes() const {
    // acquire: a snapshot; clamped because the two loads are not atomic together.
    u64 r = read_pos_.Load(MemOrder::kAcquire);
    u64 w = write_pos_.Load(MemOrder::kAcquire);
    return w > r ? (w - r > ring_bytes_ ? ring_bytes_ : w - r) : 0;
  }

 private:
  /** What every record starts with; always 16-byte aligned in the ring. */
  struct Record {
    u32 kind;
    u32 bytes;
    u64 message_bytes;
  };
  static constexpr u64 kAlign = 16;
  static_assert(sizeof(Record) == kRecordHeaderBytes && kRecordHeaderBytes == kAlign,
                "a header must never straddle the ring's end");

  /** Ring size for a requested byte count. */
  static u32 RingSize(u32 ring_bytes) {
    return RoundUpPow2(ring_bytes < kMinRingBytes ? kMinRingBytes : ring_bytes);
  }

  /** Records the geometry; positions start at zero. */
  explicit ShmStream(u32 ring_bytes) : ring_bytes_(ring_bytes), mask_(ring_bytes - 1) {}

  /** The byte ring trailing the header in the same region. */
  char *Ring() { return reinterpret_cast<char *>(this) + sizeof(ShmStream); }

  /** Payload room for one record given the writer's and a reader's position. */
  u64 Room(u64 w, u64 r) const {
    u64 free_bytes = ring_bytes_ - (w - r);
    return free_bytes > kRecordHeaderBytes ? free_bytes - kRecordHeaderBytes : 0;
  }

  /** Copies one record into the ring and moves write_pos_ past it with `publish` order. */
  void Append(bool begin, u64 message_bytes, const void *data, u64 bytes, MemOrder publish) {
    u64 w = write_pos_.Load(MemOrder::kRelaxed);  // relaxed: only the writer moves it
    Record rec{begin ? kBegin : kMore, static_cast<u32>(bytes), begin ? message_bytes : 0};
    CopyIn(w, &rec, kRecordHeaderBytes);
    CopyIn(w + kRecordHeaderBytes, data, bytes);
    write_pos_.Store(w + kRecordHeaderBytes + RoundUpTo(bytes, kAlign), publish);
  }

  /** Copies n bytes into the ring at position pos, wrapping at its end. */
  void CopyIn(u64 pos, const void *src, u64 n) {
    if (n == 0) return;
    const char *s = static_cast<const char *>(src);
    u64 off = pos & mask_;
    u64 first = std::min<u64>(n, ring_bytes_ - off);
    std::memcpy(Ring() + off, s, first);
    if (first < n) std::memcpy(Ring(), s + first, n - first);
  }

  /** Copies n bytes out of the ring from position pos, wrapping at its end. */
  void CopyOut(u64 pos, void *dst, u64 n) {
    char *d = static_cast<char *>(dst);
    u64 off = pos & mask_;
    u64 first = std::min<u64>(n, ring_bytes_ - off);
    std::memcpy(d, Ring() + off, first);
    if (first < n) std::memcpy(d + first, Ring(), n - first);
  }

  // Line 0: written once by the constructor, then only read.
  alignas(kCacheLine) u32 ring_bytes_;
  u32 mask_;
  // Line 1: the writer's.
  alignas(kCacheLine) Atomic<u64> write_pos_;
  u64 cached_read_ = 0;  ///< the writer's last view of read_pos_
  // Line 2: the reader's.
  alignas(kCacheLine) Atomic<u64> read_pos_;
  u64 cached_write_ = 0;  ///< the reader's last view of write_pos_
};

/**
 * Empties a buffer that assembles stream messages, freeing its memory once it grew past
 * 1 MiB: small buffers stay warm for the next message, one huge message is not kept.
 */
inline void RecycleBuffer(std::vector<char> *v) {
  if (v->capacity() > (1u << 20)) {
    std::vector<char>().swap(*v);
  } else {
    v->clear();
  }
}

}  // namespace chi
