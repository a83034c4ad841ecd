// The shared-memory transport's segment: a header (magic, version, the runtime's identity,
// geometry, wake-up event, statistics) and a table of client slots, each owning a request
// stream (client -> runtime) and an answer stream (runtime -> client). ShmServer creates
// it, ShmClientTransport attaches it. Invariant: the header's magic is written last, and a
// slot's streams are reset only by the runtime while no client owns the slot.
#pragma once

#include <new>          // placement new of the header and slots
#include <string>       // segment names, ShmServerInfo
#include <string_view>  // names

#include "chi/core/atomic.h"                // Atomic fields in the segment
#include "chi/core/cpu_share.h"             // NoteCpu / ShareCpu on the slot's CPU words
#include "chi/core/macros.h"                // kCacheLine
#include "chi/core/status.h"                // Status, ErrorCode
#include "chi/core/types.h"                 // u32, u64
#include "chi/memory/posix_shm_backend.h"   // named segment create/attach (per user, 0600)
#include "chi/queue/wait_event.h"           // WaitEvent: futex parking across processes
#include "chi/transport/shm_data_region.h"  // ShmDataGeometry: where large messages go
#include "chi/transport/shm_process.h"      // ProcessIdentity, IsProcessAlive
#include "chi/transport/shm_stream.h"       // the two streams of each slot

namespace chi {

inline constexpr u64 kShmTransportMagic = 0x5254534d48534843ull;  // "CHSHMSTR" (little endian)
/** Bumped whenever the segment layout or the slot protocol changes. */
inline constexpr u32 kShmTransportVersion = 8;  // 8: the poller's heartbeat

/** What a client needs to find and check a runtime's segment. */
struct ShmServerInfo {
  std::string segment;  ///< segment name (PosixShmBackend adds the per-user prefix)
  u64 size = 0;         ///< whole segment bytes; Connect refuses a segment of another size
  u32 version = 0;      ///< kShmTransportVersion of the runtime
  u32 port = 0;         ///< the runtime's port (names the segment)
  u32 runtime_pid = 0;  ///< for messages and liveness checks

  template <class Ar>
  void serialize(Ar &ar) {
    ar(segment, size, version, port, runtime_pid);
  }
};

/** Life of a client slot as both sides see it (ShmClientSlot::state_). */
enum class ShmSlotState : u32 {
  kFree = 0,    ///< no owner, or an owner that won owner_pid_ and is still setting up
  kActive = 1,  ///< the client is set up; the runtime serves it
  kClosed = 2,  ///< the client left; the runtime reclaims it
  kBroken = 3,  ///< the runtime found a corrupt request stream; the client must close
};

/** Life of the runtime (ShmSegmentHeader::runtime_state_). */
enum class ShmRuntimeState : u32 { kStarting = 0, kServing = 1, kStopping = 2, kStopped = 3 };

/**
 * Counters the runtime publishes in its segment (any process may read them). Those
 * counted per request live in each slot instead (ShmClientSlot line 6), so that no two
 * readers ever bump one shared line.
 */
struct ShmStatsBlock {
  Atomic<u32> clients;           ///< slots being served now
  Atomic<u64> reclaimed_clients; ///< slots taken back from dead or misbehaving clients
  Atomic<u64> bytes_in_use;      ///< ring bytes unread plus partial messages held
  Atomic<u64> broken_streams;    ///< request streams found corrupt
  WaitStats poller_waits;        ///< how often the poller parked
  Atomic<u64> cpu_moves;         ///< runtime threads moved off a client's CPU (CpuUnstacker)
};

/** One client's place in the segment; its two streams follow it. */
struct ShmClientSlot {
  // Line 0: ownership, written on connect, close and reclaim only.
  alignas(kCacheLine) Atomic<u32> owner_pid_;  ///< the claim word: 0 = free
  Atomic<u32> state_;                          ///< ShmSlotState
  Atomic<u32> generation_;                     ///< bumped by every reclaim
  Atomic<u32> broken_code_;                    ///< ErrorCode once kBroken
  Atomic<u64> owner_start_ticks_;              ///< with owner_pid_: the owner's identity
  // Line 1: set by the runtime while it waits for room in the answer stream, and by the
  // client when its requests wait unread while a worker claims the streams (its poller
  // then looks at once: ShmClientReceiver::RingIfUnread).
  alignas(kCacheLine) Atomic<u32> runtime_needs_room_;
  Atomic<u32> client_rang_;
  // Lines 2-3: the client parks here (answers to read; room to write requests).
  alignas(kCacheLine) WaitEvent answer_ready_;
  alignas(kCacheLine) WaitEvent request_room_;
  // Lines 4-5: where each end last ran (CpuTag), stored only when it changes. Two
  // spinning ends placed on one CPU hand it to each other (ShareCpu) instead of each
  // spinning out its time slice.
  alignas(kCacheLine) Atomic<u32> runtime_cpu_;  ///< the runtime thread that took requests
  alignas(kCacheLine) Atomic<u32> client_cpu_;   ///< the client thread that sent requests
  // Line 6: the runtime's counts for this slot over all its clients, written only by the
  // holder of the slot's reader flag (a load and a store, no locked add); summed by
  // anyone reading the statistics.
  alignas(kCacheLine) Atomic<u64> tasks_served_;  ///< requests taken in (refused ones too)
  Atomic<u64> worker_taken_;  ///< requests runtime workers took in themselves (no poller)
  Atomic<u64> data_requests_;  ///< requests that lay in the client data segment
  // Lines 7-8: how far each data region's reader has freed it (ShmDataRegion::Release):
  // the runtime frees the slot's cdata region, the client its rdata region.
  alignas(kCacheLine) Atomic<u64> request_data_released_;
  Atomic<u64> data_answers_;  ///< answers written to the runtime data segment (the writer's)
  alignas(kCacheLine) Atomic<u64> answer_data_released_;
};

/** The first bytes of the segment's data area. */
struct ShmSegmentHeader {
  // Line 0: geometry and identity, written before the magic and then only read.
  alignas(kCacheLine) Atomic<u64> magic_;
  u32 version_ = 0;
  u32 port_ = 0;
  u32 num_slots_ = 0;
  u32 ring_bytes_ = 0;       ///< each stream's ring
  u32 max_outstanding_ = 0;  ///< requests in flight per client
  u32 runtime_pid_ = 0;
  u64 runtime_start_ticks_ = 0;
  u64 max_message_bytes_ = 0;
  u64 slots_offset_ = 0;     ///< from the header's address
  u64 slot_bytes_ = 0;       ///< stride of the slot table
  Atomic<u32> runtime_state_;  ///< ShmRuntimeState
  // Line 1: bumped by clients that connect or close, so the runtime rescans the table.
  alignas(kCacheLine) Atomic<u32> membership_seq_;
  /// Runtime workers polling the request streams right now, one bit per worker id mod 64
  /// (changes only when one parks or wakes): while non-zero a client does not wake the
  /// poller after a request.
  Atomic<u64> worker_readers_;
  // Line 2: the runtime's poller parks here; clients and workers notify it.
  alignas(kCacheLine) WaitEvent server_event_;
  // Line 3: statistics, written by the poller.
  alignas(kCacheLine) ShmStatsBlock stats_;
  // The data segments large messages travel in: written before the magic, then only read.
  alignas(kCacheLine) ShmDataGeometry data_;
  // The poller's clock (MonotonicNs) at its latest pass, stored at least every
  // kReapIntervalNs while it serves clients: a client with tasks out that finds it
  // unchanged for its hang timeout while the runtime process lives takes the runtime for
  // stopped or hung (ShmClientReceiver::PeerHealthy). Read only by such checks, so it
  // costs no transfer.
  alignas(kCacheLine) Atomic<u64> heartbeat_ns_;
};

/** Sizes of a segment, chosen by the runtime and recorded in its header. */
struct ShmGeometry {
  u32 num_slots = 32;
  u32 ring_bytes = 1u << 20;
  u64 max_message_bytes = 256ull << 20;
  u32 max_outstanding = 1024;
  ShmDataGeometry data;  ///< the data segments (ShmDataSegments::Open fills it)
};

/** The segment name of the runtime serving `port` ("shm_transport_<port>"). */
inline std::string ShmSegmentName(u32 port) { return "shm_transport_" + std::to_string(port); }

/** A mapped transport segment: the runtime creates it, clients attach it. */
class ShmSegment {
 public:
  /** Bytes of the data area a geometry needs. */
  static u64 BytesFor(const ShmGeometry &g) {
    return SlotsOffset() + static_cast<u64>(g.num_slots) * SlotBytes(g.ring_bytes);
  }

  /**
   * Creates the segment for `port` and fills in header and slots (state kStarting). A
   * segment left by a dead or stopped runtime is replaced; one whose runtime still runs
   * is kAlreadyExists.
   */
  Status Create(u32 port, const ShmGeometry &g, const ProcessIdentity &self) {
    const std::string name = ShmSegmentName(port);
    const u64 bytes = BytesFor(g);
    Status st = backend_.Create(name, bytes, CreateMode::kExclusive);
    if (st.code() == ErrorCode::kAlreadyExists) {
      if (Status live = CheckNotServed(name, port); !live.ok()) return live;
      st = backend_.Create(name, bytes, CreateMode::kReplace);
    }
    if (!st.ok()) return st;
    header_ = new (backend_.Data()) ShmSegmentHeader();
    header_->version_ = kShmTransportVersion;
    header_->port_ = port;
    header_->num_slots_ = g.num_slots;
    header_->ring_bytes_ = RoundUpPow2(g.ring_bytes);
    header_->max_outstanding_ = g.max_outstanding;
    header_->runtime_pid_ = self.pid;
    header_->runtime_start_ticks_ = self.start_ticks;
    header_->max_message_bytes_ = g.max_message_bytes;
    header_->slots_offset_ = SlotsOffset();
    header_->slot_bytes_ = SlotBytes(g.ring_bytes);
    header_->data_ = g.data;
    NoteGeometry();
    for (u32 i = 0; i < g.num_slots; ++i) {
      char *slot = reinterpret_cast<char *>(new (Slot(i)) ShmClientSlot());
      ShmStream::Create(slot + sizeof(ShmClientSlot), ring_bytes_);
      ShmStream::Create(slot + sizeof(ShmClientSlot) + stream_bytes_, ring_bytes_);
    }
    // release: attachers that read the magic see the geometry and the slots above.
    header_->magic_.Store(kShmTransportMagic, MemOrder::kRelease);
    return Status::Ok();
  }

  /**
   * Attaches the segment `info` names and checks it: kNotFound (no such segment),
   * kSizeMismatch (not the size announced), kVersionMismatch (not a transport segment,
   * or another layout version), kMalformed (a header whose geometry does not fit).
   */
  Status Attach(const ShmServerInfo &info) {
    if (info.version != kShmTransportVersion) {
      return Status::Errorf(ErrorCode::kVersionMismatch,
                            "shm transport: the runtime announced layout version %u; this "
                            "client speaks %u",
                            info.version, kShmTransportVersion);
    }
    if (Status st = AttachByName(info.segment); !st.ok()) return st;
    if (info.size != backend_.Size()) {
      Status st = Status::Errorf(ErrorCode::kSizeMismatch,
                                 "shm transport: segment '%s' is %llu bytes, the runtime "
                                 "announced %llu",
                                 info.segment.c_str(),
                                 static_cast<unsigned long long>(backend_.Size()),
                                 static_cast<unsigned long long>(info.size));
      Detach();
      return st;
    }
    return Status::Ok();
  }

  /** Attaches by name and validates the header (used by Attach and by probes). */
  Status AttachByName(std::string_view name) {
    if (Status st = backend_.Attach(name); !st.ok()) return st;
    Status st = Validate();
    if (!st.ok()) {
      backend_.Detach();
      return st;
    }
    header_ = reinterpret_cast<ShmSegmentHeader *>(backend_.Data());
    NoteGeometry();
    return Status::Ok();
  }

  /** Unmaps the segment here (others keep it). Idempotent. */
  void Detach() {
    header_ = nullptr;
    slots_ = nullptr;
    backend_.Detach();
  }

  /** Unmaps and removes the segment's name (the runtime, on Stop). */
  void Destroy() {
    header_ = nullptr;
    slots_ = nullptr;
    if (backend_.IsAttached()) backend_.Destroy();
  }

  bool IsAttached() const { return header_ != nullptr; }
  ShmSegmentHeader *Header() const { return header_; }
  u64 Size() const { return backend_.Size(); }
  const char *Name() const { return backend_.Name(); }

  /** Slots in the table, as this process noted them at create or attach. */
  u32 NumSlots() const { return num_slots_; }

  /** Slot i (i < NumSlots()). */
  ShmClientSlot *Slot(u32 i) const {
    return reinterpret_cast<ShmClientSlot *>(slots_ + i * slot_bytes_);
  }

  /** Slot i of the segment whose (validated) header is h. */
  static ShmClientSlot *SlotOf(const ShmSegmentHeader *h, u32 i) {
    char *base = reinterpret_cast<char *>(const_cast<ShmSegmentHeader *>(h));
    return reinterpret_cast<ShmClientSlot *>(base + h->slots_offset_ + i * h->slot_bytes_);
  }
  /** Slot i's client -> runtime stream, viewed with this process's record of its geometry. */
  ShmStream RequestStream(u32 i) const {
    return ShmStream(reinterpret_cast<char *>(Slot(i)) + sizeof(ShmClientSlot), ring_bytes_);
  }
  /** Slot i's runtime -> client stream. */
  ShmStream AnswerStream(u32 i) const {
    return ShmStream(reinterpret_cast<char *>(Slot(i)) + sizeof(ShmClientSlot) + stream_bytes_,
                     ring_bytes_);
  }

  /**
   * Ok while the runtime that made the segment serves it; kPeerDead once its process is
   * gone (a stale segment), kShutdown while it is stopping or stopped.
   */
  Status RuntimeStatus() const {
    // acquire: what the runtime wrote before changing its state is visible after.
    const u32 state = header_->runtime_state_.Load(MemOrder::kAcquire);
    const u32 pid = header_->runtime_pid_;
    if (!IsProcessAlive(ProcessIdentity{pid, header_->runtime_start_ticks_})) {
      return Status::Errorf(ErrorCode::kPeerDead,
                            "shm transport: runtime pid %u of segment '%s' is gone", pid,
                            backend_.Name());
    }
    if (state != static_cast<u32>(ShmRuntimeState::kServing)) {
      return Status::Errorf(ErrorCode::kShutdown,
                            "shm transport: runtime pid %u of segment '%s' is not serving "
                            "(stopping or stopped)",
                            pid, backend_.Name());
    }
    return Status::Ok();
  }

  /** kAlreadyExists when a live runtime serves segment `name`; Ok when it is stale. */
  static Status CheckNotServed(const std::string &name, u32 port) {
    ShmSegment old;
    if (!old.AttachByName(name).ok()) return Status::Ok();  // unreadable: a crash mid-create
    const ShmSegmentHeader *h = old.Header();
    const bool stopped =
        h->runtime_state_.Load(MemOrder::kAcquire) == static_cast<u32>(ShmRuntimeState::kStopped);
    const u32 pid = h->runtime_pid_;
    const bool live = !stopped && IsProcessAlive(ProcessIdentity{pid, h->runtime_start_ticks_});
    old.Detach();
    if (!live) return Status::Ok();
    return Status::Errorf(ErrorCode::kAlreadyExists,
                          "shm transport: port %u is served by runtime pid %u (segment '%s')",
                          port, pid, name.c_str());
  }

 private:
  /** Where the slot table starts (after the header, on a cache line). */
  static constexpr u64 SlotsOffset() { return RoundUpTo(sizeof(ShmSegmentHeader), kCacheLine); }
  /** One slot plus its two streams. */
  static u64 SlotBytes(u32 ring_bytes) {
    return RoundUpTo(sizeof(ShmClientSlot) + 2 * ShmStream::BytesFor(ring_bytes), kCacheLine);
  }

  /** Checks a freshly attached segment's transport header against its size. */
  Status Validate() const {
    const auto *h = reinterpret_cast<const ShmSegmentHeader *>(backend_.Data());
    if (backend_.DataSize() < sizeof(ShmSegmentHeader)) {
      return Status::Errorf(ErrorCode::kSizeMismatch,
                            "shm transport: segment '%s' is too small for a transport header",
                            backend_.Name());
    }
    // acquire: pairs with Create's release, so the geometry below is complete.
    u64 magic = h->magic_.Load(MemOrder::kAcquire);
    if (magic == 0) {
      return Status::Errorf(ErrorCode::kNotFound,
                            "shm transport: segment '%s' is still being set up",
                            backend_.Name());
    }
    if (magic != kShmTransportMagic) {
      return Status::Errorf(ErrorCode::kVersionMismatch,
                            "shm transport: segment '%s' is not a transport segment (bad magic)",
                            backend_.Name());
    }
    if (h->version_ != kShmTransportVersion) {
      return Status::Errorf(ErrorCode::kVersionMismatch,
                            "shm transport: segment '%s' has layout version %u; this build "
                            "expects %u",
                            backend_.Name(), h->version_, kShmTransportVersion);
    }
    const bool geometry_ok =
        h->num_slots_ > 0 && h->ring_bytes_ >= ShmStream::kMinRingBytes &&
        RoundUpPow2(h->ring_bytes_) == h->ring_bytes_ && h->slots_offset_ == SlotsOffset() &&
        h->slot_bytes_ == SlotBytes(h->ring_bytes_) && h->max_outstanding_ > 0 &&
        h->slots_offset_ + static_cast<u64>(h->num_slots_) * h->slot_bytes_ <=
            backend_.DataSize();
    if (!geometry_ok) {
      return Status::Errorf(ErrorCode::kMalformed,
                            "shm transport: segment '%s' records a geometry that does not fit "
                            "its %llu bytes",
                            backend_.Name(), static_cast<unsigned long long>(backend_.Size()));
    }
    return Status::Ok();
  }

  /**
   * Keeps the validated geometry in this process: the slot and stream addresses that
   * every request and answer looks up then cost no reads of the shared header, and a
   * client that rewrites the header cannot move them for the runtime (which notes them
   * before any client attaches).
   */
  void NoteGeometry() {
    slots_ = reinterpret_cast<char *>(header_) + header_->slots_offset_;
    slot_bytes_ = header_->slot_bytes_;
    ring_bytes_ = header_->ring_bytes_;
    stream_bytes_ = ShmStream::BytesFor(ring_bytes_);
    num_slots_ = header_->num_slots_;
  }

  PosixShmBackend backend_;
  ShmSegmentHeader *header_ = nullptr;
  char *slots_ = nullptr;  ///< slot 0 (NoteGeometry)
  u64 slot_bytes_ = 0;     ///< the slot table's stride
  u32 ring_bytes_ = 0;     ///< each stream's ring
  u32 num_slots_ = 0;      ///< slots in the table
  u64 stream_bytes_ = 0;   ///< one stream's header and ring
};

}  // namespace chi
