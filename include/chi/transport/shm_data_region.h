// ShmDataRegion: one client slot's share of a runtime data segment, where large messages
// travel whole instead of in pieces through the slot's stream. Requests go in the client
// data segment (cdata: the client writes, a runtime worker reads), answers in the runtime
// data segment (rdata: the runtime writes, the client reads). The writer reserves one
// contiguous block, fills it and publishes a kRef record {position, bytes} in the stream;
// the reader decodes the block in place and frees it. A message larger than the region
// goes in chunks of half of it, which the reader assembles. Blocks are freed in the order they
// were written (each stream has one reader at a time, reading in order), so the free space
// is one range and the only shared word is the reader's `released` position.
// Invariant: positions only grow (a block that would cross the region's end starts at the
// next lap instead), and a reader touches only bytes inside its region, whatever a ref says.
#pragma once

#include <cstring>  // memcpy of refs, name copies
#include <string>   // segment names

#include "chi/core/atomic.h"               // Atomic, MemOrder
#include "chi/core/status.h"               // Status, ErrorCode
#include "chi/core/types.h"                // u64
#include "chi/memory/posix_shm_backend.h"  // the data segments, mapped by name
#include "chi/transport/shm_stream.h"      // kRef records

namespace chi {

/** Name of a standalone runtime's segment `role` (main, cdata, rdata) on `port`. */
inline std::string RuntimeSegmentName(u32 port, const char *role) {
  return "rt" + std::to_string(port) + "_" + role;
}

/**
 * The payload of a kRef stream record: where a message, or one chunk of a message larger
 * than the region, lies in the data region. A message's chunks follow each other in the
 * stream, in order.
 */
struct ShmDataRef {
  u64 pos = 0;    ///< the block's start as a position (grows without bound; mod region size)
  u64 bytes = 0;  ///< the block's length
  u64 total = 0;  ///< the whole message's length (== bytes: the block is all of it)

  /** True when the block is a whole message (decoded in place). */
  bool Whole() const { return total == bytes; }

  /**
   * True when this block may come next in its stream: a whole message or a first chunk
   * while nothing is assembled, else the next chunk of the message being assembled
   * (`assembly_total` bytes, `have` of them held, its pieces refs: `by_ref`).
   */
  bool InStep(bool assembling, bool by_ref, u64 assembly_total, u64 have) const {
    return assembling ? by_ref && total == assembly_total && bytes <= assembly_total - have
                      : bytes <= total;
  }
};

static_assert(sizeof(ShmDataRef) == ShmStream::kRefBytes, "a kRef record carries one ShmDataRef");

/** The ref a kRef piece carries. */
inline ShmDataRef RefOf(const ShmStream::Piece &p) {
  ShmDataRef ref;
  p.CopyTo(reinterpret_cast<char *>(&ref));
  return ref;
}

/** A view of one slot's region in a mapped data segment (host only; not itself shared). */
class ShmDataRegion {
 public:
  ShmDataRegion() = default;
  /** Region [base, base + bytes) whose reader publishes its progress in `released`. */
  ShmDataRegion(char *base, u64 bytes, Atomic<u64> *released)
      : base_(base), bytes_(bytes), released_(released) {}

  /** False when the runtime shares no data segment (messages then stream in pieces). */
  bool Enabled() const { return bytes_ != 0; }

  /** The region's size: the largest message it can carry. */
  u64 Bytes() const { return bytes_; }

  // ---- Writer side (one writer at a time; `*w` is its private write position) ----

  /** Where position `pos` lies in the region. */
  char *At(u64 pos) const { return base_ + pos % bytes_; }

  /**
   * The largest block that could start at the writer's position `w` right now without
   * waiting, and where it would start (the next lap when the region's end is nearer than
   * its free space). For encoding straight into the region.
   */
  u64 ContiguousRoom(u64 w, u64 *start) const {
    // acquire: the reader is done with the bytes before `released`, so we may overwrite them.
    const u64 released = Released(MemOrder::kAcquire);
    if (released > w) w = released;  // see Place
    const u64 off = w % bytes_;
    const u64 to_end = bytes_ - off;
    if (released == w) {  // all free: the whole region, from the next lap's start if need be
      *start = off == 0 ? w : w + to_end;
      return bytes_;
    }
    const u64 used = w - released;
    if (used > bytes_) return 0;  // a block that skipped a tail is still out
    const u64 free_bytes = bytes_ - used;
    if (free_bytes <= to_end) {
      *start = w;
      return free_bytes;
    }
    // Free space wraps: the tail [off, end) or the head of the next lap, whichever is larger.
    if (to_end >= free_bytes - to_end) {
      *start = w;
      return to_end;
    }
    *start = w + to_end;
    return free_bytes - to_end;
  }

  /**
   * Reserves `len` contiguous bytes at the writer's position `w`: fills *ref and returns
   * where to write, or nullptr when they do not fit now (the reader has not freed enough).
   * Nothing changes until Commit.
   */
  char *Reserve(u64 w, u64 len, ShmDataRef *ref) const {
    u64 start = 0;
    // acquire: the reader is done with the bytes before `released`, so we may overwrite them.
    if (!Place(w, len, Released(MemOrder::kAcquire), &start)) return nullptr;
    ref->pos = start;
    ref->bytes = len;
    ref->total = len;  // a whole message unless the caller says otherwise
    return base_ + start % bytes_;
  }

  /** The writer's position after publishing the block `ref` names. */
  static u64 Commit(const ShmDataRef &ref) { return ref.pos + ref.bytes; }

  /** True when `len` bytes fit at `w` (seq_cst: a parked writer's re-check against Release). */
  bool HasRoomSeqCst(u64 w, u64 len) const {
    u64 start = 0;
    return Place(w, len, Released(MemOrder::kSeqCst), &start);
  }

  // ---- Reader side (the stream's reader) ----

  /** The bytes a ref names, or nullptr when it points outside the region (a bad writer). */
  const char *Resolve(const ShmDataRef &ref) const {
    if (!Enabled() || ref.bytes == 0 || ref.bytes > bytes_) return nullptr;
    const u64 off = ref.pos % bytes_;
    if (off + ref.bytes > bytes_) return nullptr;
    return base_ + off;
  }

  /**
   * Frees every block up to and including `ref` (the reader has decoded it). seq_cst:
   * a writer parked for room re-checks `released` (Dekker with the caller's Notify).
   */
  void Release(const ShmDataRef &ref) const { released_->Store(ref.pos + ref.bytes, MemOrder::kSeqCst); }

  /**
   * True when the reader's `released` is one an honest reader could have left, given the
   * writer's position `w`: less than two regions behind it (a block may start at the next
   * lap, up to a region past `released`, and is at most a region long; ahead only moves
   * the writer on, see Place). A writer waiting for room that finds this false waits for
   * a reader that broke the region.
   */
  bool ReleasedValid(u64 w) const {
    const u64 released = Released(MemOrder::kAcquire);  // acquire: as in Reserve
    return released >= w || w - released <= 2 * bytes_;
  }

  /** Bytes written and not yet freed, given the writer's position (a statistic). */
  u64 HeldBytes(u64 w) const {
    const u64 released = Released(MemOrder::kRelaxed);
    return released <= w && w - released <= 2 * bytes_ ? w - released : 0;
  }

 private:
  /**
   * Where a block of `len` bytes written at `w` starts: here, or at the next lap when it
   * would cross the region's end, or when the region is empty (a client that waits for
   * each answer then reuses the region's first pages instead of touching all of them).
   * False when the reader has not freed the bytes it covers (every byte is free once
   * `released` reaches `w`, the skipped tail included). A reader that freed more than was
   * written (bytes written behind the writer's back, or a reader gone wrong) moves the
   * writer on to there: nothing of its own lies beyond `w`.
   */
  bool Place(u64 w, u64 len, u64 released, u64 *start) const {
    if (len == 0 || len > bytes_) return false;
    if (released > w) w = released;
    const u64 off = w % bytes_;
    const bool empty = released == w;
    *start = off == 0 || (off + len <= bytes_ && !empty) ? w : w + (bytes_ - off);
    return empty || *start + len - released <= bytes_;
  }

  /** How far the reader has freed the region. */
  u64 Released(MemOrder order) const { return released_->Load(order); }

  char *base_ = nullptr;
  u64 bytes_ = 0;
  Atomic<u64> *released_ = nullptr;
};

/** Where the transport segment's header records the data segments (both ends read it). */
struct ShmDataGeometry {
  static constexpr u32 kMaxName = 48;  ///< bytes of a name, NUL included
  char request_segment[kMaxName] = {};  ///< cdata's name ("" = none)
  char answer_segment[kMaxName] = {};   ///< rdata's name ("" = none)
  u64 request_region_bytes = 0;         ///< each slot's share of cdata (0 = none)
  u64 answer_region_bytes = 0;          ///< each slot's share of rdata (0 = none)
};

/**
 * Both data segments as one process maps them, cut into one region per client slot. Each
 * process maps them itself, so a runtime whose owner of the segments unlinks them (or a
 * client) keeps a valid mapping until it detaches.
 */
class ShmDataSegments {
 public:
  /** Regions smaller than this are not worth a segment: messages stream instead. */
  static constexpr u64 kMinRegionBytes = 64u << 10;

  /**
   * The runtime: maps the segments named (empty names are skipped) and records in *g how
   * each divides over `num_slots` slots. kNotFound and friends from the mapping.
   */
  Status Open(const std::string &request_name, const std::string &answer_name, u32 num_slots,
              ShmDataGeometry *g) {
    *g = ShmDataGeometry{};
    if (Status st = MapOne(request_name, num_slots, &request_, g->request_segment,
                           &g->request_region_bytes);
        !st.ok()) {
      return st;
    }
    return MapOne(answer_name, num_slots, &answer_, g->answer_segment, &g->answer_region_bytes);
  }

  /**
   * A client: maps the segments the runtime's geometry names and checks they divide into
   * regions of the recorded sizes (kSizeMismatch otherwise, kMalformed for a bad name).
   */
  Status Attach(const ShmDataGeometry &g, u32 num_slots) {
    Status st = AttachOne(g.request_segment, g.request_region_bytes, num_slots, &request_);
    if (st.ok()) st = AttachOne(g.answer_segment, g.answer_region_bytes, num_slots, &answer_);
    if (!st.ok()) Detach();
    return st;
  }

  /** Unmaps both here. Idempotent. */
  void Detach() {
    request_.Detach();
    answer_.Detach();
    request_region_ = answer_region_ = 0;
  }

  /** Slot i's region for requests (cdata); `released` is the slot's shared word. */
  ShmDataRegion RequestRegion(u32 i, Atomic<u64> *released) const {
    return Region(request_, request_region_, i, released);
  }
  /** Slot i's region for answers (rdata). */
  ShmDataRegion AnswerRegion(u32 i, Atomic<u64> *released) const {
    return Region(answer_, answer_region_, i, released);
  }

 private:
  /** Region bytes of a segment of `data_bytes` over `num_slots` slots (page multiples). */
  static u64 RegionBytes(u64 data_bytes, u32 num_slots) {
    const u64 per = data_bytes / num_slots / 4096 * 4096;
    return per >= kMinRegionBytes ? per : 0;
  }

  /** The runtime's half of Open for one segment: maps it, records its name and region size. */
  Status MapOne(const std::string &name, u32 num_slots, PosixShmBackend *seg, char *name_out,
                u64 *region_out) {
    if (name.empty()) return Status::Ok();
    if (name.size() >= ShmDataGeometry::kMaxName) {
      return Status::Errorf(ErrorCode::kInvalidArgument,
                            "shm transport: data segment name '%s' is too long", name.c_str());
    }
    if (Status st = seg->Attach(name); !st.ok()) return st;
    *region_out = RegionBytes(seg->DataSize(), num_slots);
    if (*region_out == 0) {
      seg->Detach();
      return Status::Ok();  // too small to share: this direction streams
    }
    std::memcpy(name_out, name.c_str(), name.size() + 1);
    (seg == &request_ ? request_region_ : answer_region_) = *region_out;
    return Status::Ok();
  }

  /** A client's half of Attach for one segment: maps it and checks its region size. */
  Status AttachOne(const char *name, u64 region_bytes, u32 num_slots, PosixShmBackend *seg) {
    if (region_bytes == 0) return Status::Ok();
    if (std::memchr(name, 0, ShmDataGeometry::kMaxName) == nullptr || name[0] == 0) {
      return Status::Error(ErrorCode::kMalformed,
                           "shm transport: the runtime's segment names a data segment badly");
    }
    if (Status st = seg->Attach(name); !st.ok()) return st;
    if (RegionBytes(seg->DataSize(), num_slots) != region_bytes) {
      return Status::Errorf(ErrorCode::kSizeMismatch,
                            "shm transport: data segment '%s' (%llu bytes) does not hold %u "
                            "regions of %llu bytes",
                            name, static_cast<unsigned long long>(seg->DataSize()), num_slots,
                            static_cast<unsigned long long>(region_bytes));
    }
    (seg == &request_ ? request_region_ : answer_region_) = region_bytes;
    return Status::Ok();
  }

  /** Slot i's region of a mapped segment (a disabled view when it is not shared). */
  static ShmDataRegion Region(const PosixShmBackend &seg, u64 region_bytes, u32 i,
                              Atomic<u64> *released) {
    if (region_bytes == 0) return ShmDataRegion();
    return ShmDataRegion(seg.Data() + static_cast<u64>(i) * region_bytes, region_bytes, released);
  }

  PosixShmBackend request_;
  PosixShmBackend answer_;
  u64 request_region_ = 0;
  u64 answer_region_ = 0;
};

}  // namespace chi
