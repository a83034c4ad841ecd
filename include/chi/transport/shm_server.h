// ShmServer: the runtime side of the shared-memory transport (its shm network role).
// Awake low-latency workers read small requests straight from the clients' request streams
// (a WorkerPoller) and append small answers themselves, so a round trip needs no thread
// hop; the poller thread serves while they sleep and handles the rest (pieces, errors,
// large answers, the reaper in shm_reaper.h). Invariant: only the holder of a slot's
// `reader` flag reads its requests, only the holder of its `writer` flag appends answers.
#pragma once

#include <memory>  // unique_ptr to the core

#include "chi/core/status.h"                   // Status
#include "chi/runtime/config.h"                // ServerConfig
#include "chi/transport/request_dispatcher.h"  // RequestDispatcher
#include "chi/transport/shm_segment.h"         // ShmSegment, ShmServerInfo
#include "chi/transport/shm_server_core.h"     // ShmServerCore, options, stats

namespace chi {

/** Serves pure clients of this runtime through a shared-memory segment. */
class ShmServer {
 public:
  using Options = ShmServerOptions;
  using Stats = ShmServerStats;


  /**
   * The options for a runtime configuration: shm.client_slots slots, and shm.main_size
   * split over their rings.
   */
  static Options OptionsFor(const ServerConfig &cfg) {
    Options o;
    o.num_slots = cfg.shm_client_slots;
    u64 per_ring = cfg.main_segment_bytes / (2ull * o.num_slots);
    u32 ring = shm_server::kMinRing;
    while (ring < shm_server::kMaxRing && 2ull * ring <= per_ring) ring *= 2;
    o.ring_bytes = ring;
    o.max_message_bytes = cfg.client_data_bytes;
    return o;
  }

  ShmServer() = default;
  ~ShmServer() { Stop(); }
  ShmServer(const ShmServer &) = delete;
  ShmServer &operator=(const ShmServer &) = delete;

  /** Start with the geometry OptionsFor(cfg) gives, and the runtime's data segments. */
  Status Start(RequestDispatcher *dispatcher, const ServerConfig &cfg, u32 port) {
    Options o = OptionsFor(cfg);
    o.request_data_segment = RuntimeSegmentName(port, "cdata");  // RuntimeSegments made them
    o.answer_data_segment = RuntimeSegmentName(port, "rdata");
    return Start(dispatcher, o, port);
  }

  /**
   * Creates the segment for `port` (per user, mode 0600; a stale one left by a dead
   * runtime is replaced, a live runtime's is kAlreadyExists) and starts the poller.
   */
  Status Start(RequestDispatcher *dispatcher, const Options &options, u32 port) {
    if (core_ != nullptr) {
      return Status::Error(ErrorCode::kAlreadyExists, "shm transport: server already started");
    }
    if (dispatcher == nullptr || options.num_slots == 0 || options.max_outstanding == 0 ||
        options.max_message_bytes < kEnvelopeHeaderBytes) {
      return Status::Error(ErrorCode::kInvalidArgument,
                           "shm transport: needs a dispatcher, slots, outstanding requests "
                           "and a message limit of at least 8 bytes");
    }
    auto core = std::make_unique<ShmServerCore>(dispatcher, options);
    if (Status st = core->Start(port); !st.ok()) return st;
    core_ = std::move(core);
    return Status::Ok();
  }

  /**
   * Stops serving: new requests stay unread, answers of tasks in flight are still sent
   * (for up to shm_server::kStopGraceNs), then clients see the runtime stopped (their outstanding
   * tasks fail with kShutdown), the poller is joined and the segment destroyed. Idempotent.
   */
  void Stop() {
    if (core_ == nullptr) return;
    if (core_->Stop()) {
      core_.reset();
    } else {
      // Tasks still running reference the core as their completer: it stays alive (and
      // discards their answers) rather than leaving them a dangling pointer.
      core_.release();
    }
  }

  /** How clients find this runtime's segment (empty before Start). */
  ShmServerInfo Info() const { return core_ == nullptr ? ShmServerInfo{} : core_->Info(); }

  /** Current counters. */
  Stats GetStats() const {
    return core_ == nullptr ? Stats{} : shm_server::ReadShmServerStats(core_->Segment());
  }

  /**
   * Requests taken in and not yet answered, over every client. Not in Stats: the counts
   * live in this process only (ProbeStats from another process cannot see them).
   */
  u64 TasksOutstanding() const { return core_ == nullptr ? 0 : core_->TasksOutstanding(); }

  /**
   * Finds the runtime serving `port`: kNotFound (none), kPeerDead (a dead runtime's
   * stale segment), kShutdown (stopping).
   */
  static Status Probe(u32 port, ShmServerInfo *info) {
    ShmSegment seg;
    if (Status st = seg.AttachByName(ShmSegmentName(port)); !st.ok()) return st;
    const ShmSegmentHeader *h = seg.Header();
    if (Status st = seg.RuntimeStatus(); !st.ok()) {
      seg.Detach();
      return st;
    }
    *info = ShmServerInfo{seg.Name(), seg.Size(), h->version_, h->port_, h->runtime_pid_};
    seg.Detach();
    return Status::Ok();
  }

  /** Reads the counters of the runtime serving `port` from its segment. */
  static Status ProbeStats(u32 port, Stats *out) {
    ShmSegment seg;
    if (Status st = seg.AttachByName(ShmSegmentName(port)); !st.ok()) return st;
    *out = shm_server::ReadShmServerStats(seg);
    seg.Detach();
    return Status::Ok();
  }

 private:
  std::unique_ptr<ShmServerCore> core_;
};

}  // namespace chi
