// ShmServer's options, statistics and limits, and the answer encoding the poller and the
// workers share: what the rest of the runtime (and a process probing the segment) needs
// without the server's machinery (shm_server_core.h).
#pragma once

#include <string>  // data segment names
#include <vector>  // answer buffers

#include "chi/core/atomic.h"                   // MemOrder for the statistics loads
#include "chi/core/status.h"                   // Status, ErrorCode
#include "chi/core/types.h"                    // u32, u64
#include "chi/transport/request_dispatcher.h"  // EncodeAnswerKeep, error answers
#include "chi/transport/shm_segment.h"         // the segment header the statistics live in

namespace chi {

/** Segment geometry and limits (ShmServer::OptionsFor derives them from the config). */
struct ShmServerOptions {
  u32 num_slots = 32;                    ///< clients served at once
  u32 ring_bytes = 1u << 20;             ///< each stream's ring (messages may be larger)
  u64 max_message_bytes = 256ull << 20;  ///< largest request or answer
  u32 max_outstanding = 1024;            ///< requests in flight per client
  /// Segments (PosixShmBackend names) whose per-slot regions carry large requests (the
  /// client data segment) and large answers (the runtime data segment); "" = none, and
  /// such messages stream through the rings in pieces.
  std::string request_data_segment;
  std::string answer_data_segment;
};

/** What the transport is doing (also readable from other processes: ProbeStats). */
struct ShmServerStats {
  u32 clients = 0;            ///< slots being served
  u32 slots = 0;              ///< slots there are (shm.client_slots)
  u64 reclaimed_clients = 0;  ///< slots taken back from dead or misbehaving clients
  u64 bytes_in_use = 0;       ///< unread ring bytes plus partial messages held
  u64 tasks_served = 0;       ///< requests taken in (refused ones get an error answer)
  u64 broken_streams = 0;     ///< request streams found corrupt (their slot was reset)
  u64 worker_taken = 0;       ///< requests workers took in straight from the rings
  u64 data_requests = 0;      ///< requests that lay in the client data segment
  u64 data_answers = 0;       ///< answers written to the runtime data segment
  u64 cpu_moves = 0;  ///< runtime threads moved off a CPU they shared with a client
};

namespace shm_server {
inline constexpr u32 kMinRing = 16u << 10;
inline constexpr u32 kMaxRing = 16u << 20;
/// Polling before the poller parks: short, since on a machine with fewer cores than
/// spinning threads every microsecond spun delays the thread we are waiting for.
inline constexpr u64 kPollerSpinNs = 10000;
inline constexpr u64 kReapIntervalNs = 20000000;  ///< liveness checks while clients exist
/// While workers read the request streams and requests wait, the poller looks at them this
/// often; a request still waiting at the next look (its worker is stuck in a long task)
/// makes it wake a parked worker, which takes the slot over (ShmSlotAffinity).
inline constexpr u64 kPollerLookNs = 50000;
inline constexpr u64 kIdleScanNs = 1000000000;  ///< table scans when nobody is connected
inline constexpr u32 kRecordsPerPass = 64;       ///< fairness between clients
inline constexpr u64 kStopGraceNs = 5000000000ull;  ///< Stop waits this long for running tasks

/**
 * Reads the counters of a mapped segment (in the runtime or any process mapping it), over
 * the slots this process noted for it: a client that rewrites the shared slot count cannot
 * make the runtime read past its table.
 */
inline ShmServerStats ReadShmServerStats(const ShmSegment &seg) {
  const ShmSegmentHeader *h = seg.Header();
  // relaxed: statistics; each counter is read on its own.
  ShmServerStats s;
  s.clients = h->stats_.clients.Load(MemOrder::kRelaxed);
  s.slots = seg.NumSlots();  // fixed when the segment was made
  // acquire: a reclaimed client's slot is free once it is counted (ShmReaper::Reset).
  s.reclaimed_clients = h->stats_.reclaimed_clients.Load(MemOrder::kAcquire);
  s.bytes_in_use = h->stats_.bytes_in_use.Load(MemOrder::kRelaxed);
  s.broken_streams = h->stats_.broken_streams.Load(MemOrder::kRelaxed);
  s.cpu_moves = h->stats_.cpu_moves.Load(MemOrder::kRelaxed);
  for (u32 i = 0; i < seg.NumSlots(); ++i) {
    const ShmClientSlot *slot = seg.Slot(i);
    s.tasks_served += slot->tasks_served_.Load(MemOrder::kRelaxed);
    s.worker_taken += slot->worker_taken_.Load(MemOrder::kRelaxed);
    s.data_requests += slot->data_requests_.Load(MemOrder::kRelaxed);
    s.data_answers += slot->data_answers_.Load(MemOrder::kRelaxed);
  }
  return s;
}

/** Encodes a finished task's answer envelope into *out (the task stays alive). */
inline void EncodeShmAnswer(Task *t, u64 max_bytes, std::vector<char> *out) {
  EncodeAnswerKeep(t, out);
  if (out->size() > max_bytes) {
    Status st = Status::Errorf(ErrorCode::kTooLarge,
                               "answer of %llu bytes exceeds the shm transport's %llu-byte "
                               "limit (shm.client_data_size)",
                               static_cast<unsigned long long>(out->size()),
                               static_cast<unsigned long long>(max_bytes));
    RequestDispatcher::EncodeError(t->request_id_, st.code(), st.message(), out);
  }
}
}  // namespace shm_server

}  // namespace chi
