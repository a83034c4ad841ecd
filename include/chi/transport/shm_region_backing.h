// ShmRegionBacking: how much of one data region (shm_data_region.h) its writer has had
// backed by /dev/shm, so that no write into the region can die of SIGBUS. The backed part
// is a prefix of the region that grows as blocks reach further, doubling from kFirstBytes:
// a client of small large messages commits a few hundred KiB rather than its whole share,
// the first large message waits for the pages it needs (what touching them would cost
// anyway) rather than for all of them, and a writer whose blocks march through the whole
// region pays a handful of populate calls. Blocks start at the region's start again
// whenever it is empty (ShmDataRegion::Place), so a request-then-answer client stays in the
// prefix it first backed. Once /dev/shm could not back a step the writer is refused for
// good and sends its large messages through the stream, whose pages were backed at connect.
// Invariant: every byte of [0, Backed()) of the region is backed.
#pragma once

#include <algorithm>  // std::max, std::min of the next prefix

#include "chi/core/types.h"                 // u64
#include "chi/memory/back_pages.h"          // BackPages: populate ahead of use
#include "chi/queue/ring_layout.h"          // RoundUpTo a page
#include "chi/transport/shm_data_region.h"  // ShmDataRegion, ShmDataRef

namespace chi {

/** One writer's backed prefix of its data region (the writer's own: not shared). */
class ShmRegionBacking {
 public:
  /** The first prefix backed: what a first message of up to this many bytes waits for. */
  static constexpr u64 kFirstBytes = 256u << 10;

  /**
   * True when the block `ref` names lies in backed pages of `r`, backing them now if need
   * be. A chunk of a message larger than the region (ref.total) backs all of it: the
   * message's chunks will cover every page, so only its first chunk, before anything of
   * the message is published, can be refused.
   */
  bool Covers(const ShmDataRegion &r, const ShmDataRef &ref) {
    return Through(r, ref.total > r.Bytes() ? r.Bytes() : ref.pos % r.Bytes() + ref.bytes);
  }

  /**
   * Of `room` free bytes at position `start` of `r`, how many lie in backed pages (an
   * encoder's limit), backing at least min(room, max(want, kFirstBytes)) of them now. 0
   * when /dev/shm cannot back them.
   */
  u64 BackedRoom(const ShmDataRegion &r, u64 start, u64 room, u64 want = 0) {
    if (room == 0) return 0;
    const u64 off = start % r.Bytes();
    if (!Through(r, off + std::min(room, std::max(want, kFirstBytes)))) return 0;
    return std::min(room, backed_ - off);
  }

  /**
   * Runs `encode(dst, cap, &need)` (it returns the bytes written, or 0 and sets `need` to
   * at least the bytes the message takes) at position `start` of `r`, `room` bytes free
   * there, within backed pages: first in those backed already, then, when the message
   * said it needs more and that fits the room, once more after backing that much. The
   * message's length, or 0 when it did not fit (Refused(): /dev/shm could not back it).
   */
  template <typename Encode>
  u64 EncodeIn(const ShmDataRegion &r, u64 start, u64 room, Encode &&encode) {
    u64 cap = BackedRoom(r, start, room);
    u64 need = 0;
    const u64 n = cap == 0 ? 0 : encode(r.At(start), cap, &need);
    if (n != 0 || need <= cap || need > room) return n;
    cap = BackedRoom(r, start, room, need);
    return cap < need ? 0 : encode(r.At(start), cap, &need);
  }

  /** True once /dev/shm could not back a step: the writer leaves the region alone for good. */
  bool Refused() const { return refused_; }
  /** Bytes of the region, from its start, known to be backed. */
  u64 Backed() const { return backed_; }

 private:
  static constexpr u64 kPage = 4096;

  /** True when [0, end) of `r` is backed; grows the prefix to at least twice what it was. */
  bool Through(const ShmDataRegion &r, u64 end) {
    if (end <= backed_) return true;
    if (refused_) return false;
    const u64 target = std::min(RoundUpTo(std::max({end, 2 * backed_, kFirstBytes}), kPage),
                                r.Bytes());
    if (!BackPages(r.At(backed_), target - backed_)) {
      refused_ = true;
      return false;
    }
    backed_ = target;
    return true;
  }

  u64 backed_ = 0;
  bool refused_ = false;
};

}  // namespace chi
