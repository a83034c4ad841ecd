// ShmStream: one direction of a shared-memory connection, a byte ring with one writer and
// one reader (usually two processes) carrying framed messages of any size in pieces. Both
// ends never block here, so one runtime poller can serve many streams; callers choose how
// to wait. Invariant: the ring holds only whole records (an 8- or 16-byte header + payload,
// each starting on a cache line); the writer clears the header word after a record before it
// publishes the record's own header word (release), so a reader polls the header at its
// read position and sees either zero or a whole record, never half of one, and never a
// stale one.
//
// Why the header and not a shared write position: a reader that polls the record itself
// gets the "ready" signal and the first payload bytes in one cache-line transfer; the
// write position (still published after each record) is read only by park re-checks,
// statistics and the corruption check (Unframed), so in steady state it never moves.
//
// Framing: a message that fits one record is a kWhole record (8-byte header: kind and
// length), so a request of up to 56 bytes is one cache line. A larger one is a kBegin
// record (16-byte header: its total length too, and the first bytes that fit) followed by
// kMore records (8-byte headers) with the rest. A kRef record (8-byte header and kRefBytes
// of payload) carries no message but names one kept in a data region (shm_data_region.h).
// The reader checks every header and reports a corrupt stream instead of trusting it.
//
// Trust: the other end may be hostile and can write every shared byte. A ShmStream is
// therefore a view that keeps the ring's geometry in the viewing process (fixed when the
// view is made; the size recorded in shared memory is for information only), and every
// position read from a shared word is checked (a record starts on a line; a writer never
// has more than the ring's bytes outstanding) before it decides where bytes go.
#pragma once

#include <algorithm>  // std::min for wrapped copies
#include <cstring>    // memcpy in and out of the ring
#include <new>        // placement new into the caller's region

#include "chi/core/atomic.h"        // Atomic, MemOrder
#include "chi/core/macros.h"        // kCacheLine, CHI_LIKELY
#include "chi/core/small_copy.h"    // CopySmall: a record's first line
#include "chi/core/types.h"         // u32, u64
#include "chi/memory/back_pages.h"  // BackPages: a ring backed before use
#include "chi/queue/ring_layout.h"  // RoundUpPow2, RoundUpTo, IsRingAligned

namespace chi {

/**
 * A view of a single-writer, single-reader message stream through a fixed byte ring (host
 * only). Cheap to copy: a pointer to the shared words and the ring, and the geometry.
 */
class ShmStream {
 public:
  /** The most bytes a record header takes (kBegin's; kWhole and kMore take 8). */
  static constexpr u64 kRecordHeaderBytes = 16;
  /** The smallest ring accepted; smaller requests are raised to it. */
  static constexpr u32 kMinRingBytes = 256;
  /** Record kinds ("SM" + n), chosen so zeroed or random memory is rarely mistaken for one. */
  static constexpr u32 kBegin = 0x534d0001;
  static constexpr u32 kMore = 0x534d0002;
  /** A whole message in one record; Peek reports it as a kBegin of its own length. */
  static constexpr u32 kWhole = 0x534d0003;
  /** A record naming a message that lies in a data region; its payload is kRefBytes. */
  static constexpr u32 kRef = 0x534d0004;
  /** The payload of every kRef record (a ShmDataRef: position, length, message length). */
  static constexpr u64 kRefBytes = 24;

  /** Region bytes for a ring of `ring_bytes` (raised to >= kMinRingBytes, a power of two). */
  static size_t BytesFor(u32 ring_bytes) { return sizeof(Shared) + RingSize(ring_bytes); }

  /**
   * Builds an empty stream at `mem` (BytesFor(ring_bytes) bytes, 64-byte aligned) and
   * returns a view of it; an invalid view (Valid() false) when `mem` is misaligned.
   */
  static ShmStream Create(void *mem, u32 ring_bytes) {
    if (!IsRingAligned(mem)) return ShmStream();
    auto *shared = new (mem) Shared();
    shared->ring_bytes_ = RingSize(ring_bytes);
    ShmStream s(mem, shared->ring_bytes_);
    s.ClearHeader(0);  // the region may hold old bytes: nothing is published at 0
    return s;
  }

  /** No stream. */
  ShmStream() = default;

  /**
   * Views the stream at `mem` (built by Create, maybe in another process) as a ring of
   * `ring_bytes`, the size Create gave it (a power of two): the caller's own record of
   * the size, never the one in shared memory. Cheap enough to make for every use.
   */
  ShmStream(void *mem, u32 ring_bytes)
      : shared_(static_cast<Shared *>(mem)),
        ring_(static_cast<char *>(mem) + sizeof(Shared)),
        ring_bytes_(ring_bytes),
        mask_(ring_bytes - 1) {}

  /** True for a view of a stream (not the default or a failed Create). */
  bool Valid() const { return shared_ != nullptr; }

  /** Empties the stream. Only while neither end uses it (the runtime reclaiming a slot). */
  void Reset() const {
    // relaxed: nobody else touches the stream now; the caller publishes the reset slot.
    shared_->write_pos_.Store(0, MemOrder::kRelaxed);
    shared_->read_pos_.Store(0, MemOrder::kRelaxed);
    shared_->cached_read_ = 0;
    shared_->ring_bytes_ = ring_bytes_;  // what a previous client wrote there is undone
    ClearHeader(0);  // old records at offset 0 must not look published
  }

  /** Bytes in the ring (record headers included). */
  u32 RingBytes() const { return ring_bytes_; }

  /**
   * True when the shared positions are ones an honest peer could have left: the write
   * position on a record boundary, no more than the ring's bytes written and unread, and
   * the read position on a record boundary. A writer waiting for room that finds this
   * false waits for a peer that broke the stream (the runtime resets such a slot).
   */
  bool PositionsValid() const {
    // acquire: a snapshot of both ends; a live honest peer only ever makes it truer.
    const u64 r = shared_->read_pos_.Load(MemOrder::kAcquire);
    const u64 w = shared_->write_pos_.Load(MemOrder::kAcquire);
    return (r | w) % kAlign == 0 && w - r <= ring_bytes_;
  }

  /**
   * Maps the whole ring into the calling process now, so that records written or read
   * later take no page faults, and has the shm filesystem back every page of it
   * (BackPages). False when it cannot (/dev/shm is full): a write to such a ring would
   * die of SIGBUS, so a client refuses the connection instead.
   */
  bool Prefault() const { return BackPages(Ring(), ring_bytes_); }
  /** The largest payload one record can carry. */
  u64 MaxPieceBytes() const { return ring_bytes_ - kAlign - kRecordHeaderBytes; }

  // ---- Writer side ----

  /**
   * Payload bytes the next record may carry right now (0 when the ring is full). Reads
   * the reader's position only when the cached one leaves fewer than `want` bytes, so
   * a writer with room never touches the reader's cache line.
   */
  u64 WritableBytes(u64 want) const {
    // relaxed: only the writer moves it (a hostile reader may, too: Room bounds the answer).
    const u64 w = shared_->write_pos_.Load(MemOrder::kRelaxed);
    u64 room = Room(w, shared_->cached_read_);
    if (room >= want) return room;
    // acquire: the reader is done with the bytes before read_pos_, so we may overwrite them.
    shared_->cached_read_ = shared_->read_pos_.Load(MemOrder::kAcquire);
    return Room(w, shared_->cached_read_);
  }

  /** True when a record of `want` payload bytes fits (seq_cst: a waiter's re-check). */
  bool HasRoomSeqCst(u64 want) const {
    // seq_cst: the Dekker re-check against the reader's seq_cst read_pos_ store.
    return Room(shared_->write_pos_.Load(MemOrder::kRelaxed),
                shared_->read_pos_.Load(MemOrder::kSeqCst)) >= want;
  }

  /**
   * Appends one record: kBegin (begin = true, message_bytes = the whole message; kWhole
   * when `bytes` is all of it) or kMore.
   * The caller made sure `bytes` <= WritableBytes(bytes). Publishes with seq_cst so a
   * parked reader is never missed (the caller notifies it afterwards).
   */
  void WritePiece(bool begin, u64 message_bytes, const void *data, u64 bytes) const {
    // seq_cst: the write position's store is ordered before the notifier's read of the
    // reader's waiter count (WaitEvent's Dekker pair).
    Append(KindOf(begin, message_bytes, bytes), message_bytes, data, bytes, MemOrder::kSeqCst);
  }

  /**
   * WritePiece with a release publish only: the caller issues FenceSeqCst before it
   * reads any waiter flag, so one fence covers this publish and the stores before it.
   */
  void WritePieceRelease(bool begin, u64 message_bytes, const void *data, u64 bytes) const {
    // release: the caller's fence orders the publish before its Dekker reads.
    Append(KindOf(begin, message_bytes, bytes), message_bytes, data, bytes, MemOrder::kRelease);
  }

  /**
   * Appends a kRef record whose payload is the kRefBytes at `ref`, with `publish` order
   * for the write position (as WritePiece or WritePieceRelease). The caller made sure
   * WritableBytes(kRefBytes) >= kRefBytes.
   */
  void WriteRef(const void *ref, MemOrder publish) const {
    Append(kRef, kRefBytes, ref, kRefBytes, publish);
  }

  /**
   * Publishes raw bytes with no framing (length rounded up to 16): the write position
   * moves, no header is written. Fault injection for tests of a reader's defences only;
   * the caller made sure they fit.
   */
  void PublishUnframed(const void *data, u64 bytes) const {
    u64 w = shared_->write_pos_.Load(MemOrder::kRelaxed);  // relaxed: only the writer moves it
    CopyIn(w, data, bytes);
    // seq_cst: as in WritePiece.
    shared_->write_pos_.Store(w + RoundUpTo(bytes, kAlign), MemOrder::kSeqCst);
  }

  /**
   * Stores raw values into the shared words, as a hostile or broken peer could: fault
   * injection for tests of the other end's defences only.
   */
  void ForgeShared(u64 write_pos, u64 read_pos, u32 ring_bytes) const {
    // relaxed: the tests that forge publish by other means (the stream's next record).
    shared_->write_pos_.Store(write_pos, MemOrder::kRelaxed);
    shared_->read_pos_.Store(read_pos, MemOrder::kRelaxed);
    shared_->cached_read_ = read_pos;
    shared_->ring_bytes_ = ring_bytes;
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
   * Describes the oldest record without consuming it, reading only its header (no shared
   * position). kCorrupt: the header is no valid record (unknown kind, or a length the
   * ring cannot hold); the stream cannot be trusted any more. Bytes published with no
   * header at all read as kEmpty here; Unframed tells them apart.
   */
  PeekResult Peek(Piece *p) const {
    const u64 r = shared_->read_pos_.Load(MemOrder::kRelaxed);  // relaxed: only the reader moves it
    if (CHI_UNLIKELY(r % kAlign != 0)) return PeekResult::kCorrupt;  // not a record's start
    // acquire: pairs with the writer's release of the header word; the record's other
    // header bytes and its payload are visible once we see it.
    const u64 word = HeaderWord(r)->Load(MemOrder::kAcquire);
    if (word == 0) return PeekResult::kEmpty;
    const u32 kind = static_cast<u32>(word);
    const u32 bytes = static_cast<u32>(word >> 32);
    const u64 header = HeaderBytes(kind);
    u64 message_bytes = bytes;
    if (kind == kBegin) CopyOut(r + sizeof(u64), &message_bytes, sizeof(message_bytes));
    const u64 footprint = RoundUpTo(header + bytes, kAlign);
    if ((kind != kBegin && kind != kMore && kind != kWhole && kind != kRef) ||
        footprint > ring_bytes_ - kAlign || bytes > message_bytes ||
        (kind == kRef && bytes != kRefBytes)) {
      return PeekResult::kCorrupt;
    }
    p->kind = kind == kMore || kind == kRef ? kind : kBegin;
    p->bytes = bytes;
    p->message_bytes = kind == kMore || kind == kRef ? 0 : message_bytes;
    p->footprint = footprint;
    const u64 off = (r + header) & mask_;
    p->first = Ring() + off;
    p->first_bytes = std::min<u64>(bytes, ring_bytes_ - off);
    p->second = Ring();
    p->second_bytes = bytes - p->first_bytes;
    return PeekResult::kReady;
  }

  /** Frees the record that Peek described (the reader is done with its bytes). */
  void Consume(const Piece &p) const {
    u64 r = shared_->read_pos_.Load(MemOrder::kRelaxed);  // relaxed: only the reader moves it
    // seq_cst: release hands the space back after our reads; seq_cst orders it before
    // the notifier's read of a parked writer's waiter count.
    shared_->read_pos_.Store(r + p.footprint, MemOrder::kSeqCst);
  }

  /**
   * True when a record is published (a spinning reader's cheap check: the header only).
   * A record found here has its other lines, and the line of the header after it, on
   * their way already: the reader's decode does not wait for them one after another,
   * and its look at the next header (which the writer cleared, so it lies in the
   * writer's cache) overlaps with its work on this record.
   */
  bool HasData() const {
    const u64 r = shared_->read_pos_.Load(MemOrder::kRelaxed);  // relaxed: only the reader moves it
    if (CHI_UNLIKELY(r % kAlign != 0)) return true;  // a broken position: Peek reports it
    // acquire: a record seen here is readable by the Peek that follows.
    const u64 word = HeaderWord(r)->Load(MemOrder::kAcquire);
    if (word == 0) return false;
    PrefetchRecord(r, word >> 32);
    return true;
  }

  /**
   * True when the writer has published bytes past the read position (seq_cst: a waiter's
   * Dekker re-check against the writer's publish). A reader may consume a record before
   * its write position is stored, hence "past", not "different".
   */
  bool HasDataSeqCst() const {
    // seq_cst: pairs with the writer's seq_cst (or release + fence) write_pos_ store.
    const u64 w = shared_->write_pos_.Load(MemOrder::kSeqCst);
    return static_cast<i64>(w - shared_->read_pos_.Load(MemOrder::kRelaxed)) > 0;
  }

  /**
   * True when bytes were published at the read position with no record header: a writer
   * that broke the framing (the slow check that Peek's kEmpty leaves to pollers that
   * are not on the hot path). Reads the shared write position.
   */
  bool Unframed() const {
    const u64 r = shared_->read_pos_.Load(MemOrder::kRelaxed);  // relaxed: only the reader moves it
    if (r % kAlign != 0) return true;  // a broken position: Peek reports it
    // acquire: the writer stores the header before the position, so once the position
    // is past r, the header at r is visible to the load below.
    if (static_cast<i64>(shared_->write_pos_.Load(MemOrder::kAcquire) - r) <= 0) return false;
    return HeaderWord(r)->Load(MemOrder::kAcquire) == 0;
  }

  /** The reader's position (any thread; a mark of progress for those watching it). */
  u64 ReadPosition() const { return shared_->read_pos_.Load(MemOrder::kRelaxed); }  // relaxed: a mark

  /** Published bytes not yet consumed (a statistic: read from any process). */
  u64 UsedBytes() const {
    // acquire: a snapshot; clamped because the two loads are not atomic together.
    u64 r = shared_->read_pos_.Load(MemOrder::kAcquire);
    u64 w = shared_->write_pos_.Load(MemOrder::kAcquire);
    return w > r ? (w - r > ring_bytes_ ? ring_bytes_ : w - r) : 0;
  }

 private:
  /** The kind of a piece: kMore, or kWhole / kBegin for a message's first piece. */
  static constexpr u32 KindOf(bool begin, u64 message_bytes, u64 bytes) {
    return !begin ? kMore : (bytes == message_bytes ? kWhole : kBegin);
  }

  /** Header bytes of a record of `kind`: the word (kind, bytes), and kBegin's total length. */
  static constexpr u64 HeaderBytes(u32 kind) { return kind == kBegin ? 16 : 8; }
  /**
   * Records start on a cache line: a record of up to 48 payload bytes is one line, the
   * one the reader polls, and the writer clears the next header on a line of its own.
   */
  static constexpr u64 kAlign = kCacheLine;
  static_assert(kAlign % kRecordHeaderBytes == 0, "a header must never straddle the ring's end");

  /**
   * Fetches the lines of the record at r that follow its header's, and the next header's
   * line (only for records of up to 4 KiB: a large one's decode waits anyway).
   */
  void PrefetchRecord(u64 r, u64 bytes) const {
    if (bytes > 4096) return;
    const u64 footprint = RoundUpTo(kRecordHeaderBytes + bytes, kAlign);
    for (u64 off = kAlign; off <= footprint; off += kAlign) {
      __builtin_prefetch(Ring() + ((r + off) & mask_));
    }
  }

  /** Ring size for a requested byte count. */
  static u32 RingSize(u32 ring_bytes) {
    return RoundUpPow2(ring_bytes < kMinRingBytes ? kMinRingBytes : ring_bytes);
  }

  /** The shared part of a stream, at the start of its region; the ring follows it. */
  struct Shared {
    // Line 0: the size Create gave the ring, for information only (views keep their own).
    alignas(kCacheLine) u32 ring_bytes_ = 0;
    // Line 1: the writer's.
    alignas(kCacheLine) Atomic<u64> write_pos_;
    u64 cached_read_ = 0;  ///< the writer's last view of read_pos_
    // Line 2: the reader's.
    alignas(kCacheLine) Atomic<u64> read_pos_;
  };

  /** The byte ring trailing the shared words in the same region. */
  char *Ring() const { return ring_; }

  /**
   * The first 8 bytes of the record header at position pos: kind (low) and bytes (high).
   * pos is a multiple of kAlign (the writer aligns, the reader checks), so the word lies
   * inside the ring and is aligned.
   */
  Atomic<u64> *HeaderWord(u64 pos) const {
    return reinterpret_cast<Atomic<u64> *>(ring_ + (pos & mask_));
  }

  /** Marks position pos as "nothing published here" (the writer, or an idle stream). */
  void ClearHeader(u64 pos) const {
    // relaxed: the reader reaches pos only through the acquire of an earlier header whose
    // release follows this store.
    HeaderWord(pos)->Store(0, MemOrder::kRelaxed);
  }

  /**
   * Payload room for one record given the writer's and a reader's position. The line
   * after the record stays free so the writer can clear the next header (see Append).
   */
  u64 Room(u64 w, u64 r) const {
    const u64 used = w - r;
    const u64 reserved = kAlign + kRecordHeaderBytes;
    // A reader position ahead of the writer, or further behind than the ring, is forged:
    // no room (PositionsValid then tells the writer why).
    if (used > ring_bytes_) return 0;
    const u64 free_bytes = ring_bytes_ - used;
    return free_bytes > reserved ? free_bytes - reserved : 0;
  }

  /**
   * Copies one record into the ring: the payload past the header's line first, then the
   * next record's header cleared, then the header's line (length, first payload bytes)
   * and last its word (release: the reader may take it from here), so the line the
   * reader polls changes hands once; then the write position with `publish` order
   * (park re-checks and statistics).
   */
  void Append(u32 kind, u64 message_bytes, const void *data, u64 bytes, MemOrder publish) const {
    // relaxed: only the writer moves it. Rounded down to a line: a forged position moves
    // where the record lands (in the ring), never lets its first line cross the ring's end.
    const u64 w = shared_->write_pos_.Load(MemOrder::kRelaxed) & ~(kAlign - 1);
    const u64 header = HeaderBytes(kind);
    const u64 next = w + RoundUpTo(header + bytes, kAlign);
    const u64 head = bytes < kAlign - header ? bytes : kAlign - header;
    const char *src = static_cast<const char *>(data);
    if (bytes > head) CopyIn(w + kAlign, src + head, bytes - head);
    ClearHeader(next);  // Room keeps it free: the reader has consumed it already
    if (kind == kBegin) CopyIn(w + sizeof(u64), &message_bytes, sizeof(message_bytes));
    // The record's first line never wraps (records start on a line; the ring is whole lines).
    CopySmall(Ring() + (w & mask_) + header, src, head);
    const u64 word = static_cast<u64>(kind) | (bytes << 32);
    // release: the payload, the length and the cleared next header precede the record.
    HeaderWord(w)->Store(word, MemOrder::kRelease);
    shared_->write_pos_.Store(next, publish);
  }

  /** Copies n bytes into the ring at position pos, wrapping at its end. */
  void CopyIn(u64 pos, const void *src, u64 n) const {
    if (n == 0) return;
    const char *s = static_cast<const char *>(src);
    u64 off = pos & mask_;
    u64 first = std::min<u64>(n, ring_bytes_ - off);
    std::memcpy(Ring() + off, s, first);
    if (first < n) std::memcpy(Ring(), s + first, n - first);
  }

  /** Copies n bytes out of the ring from position pos, wrapping at its end. */
  void CopyOut(u64 pos, void *dst, u64 n) const {
    char *d = static_cast<char *>(dst);
    u64 off = pos & mask_;
    u64 first = std::min<u64>(n, ring_bytes_ - off);
    std::memcpy(d, Ring() + off, first);
    if (first < n) std::memcpy(d + first, Ring(), n - first);
  }

  Shared *shared_ = nullptr;
  char *ring_ = nullptr;
  u32 ring_bytes_ = 0;  ///< the viewer's record of the ring's size (a power of two)
  u32 mask_ = 0;
};

}  // namespace chi
