// The ClientConnect handshake and the standalone runtime's shared segments.
// A runtime creates three named segments per user and port (main, client data,
// runtime data; seed 004) and answers ConnectRequests with their names, sizes
// and versions; a pure client attaches them and checks both before any task.
// Invariant: a segment set is owned by the process its main header names (pid and
// start time: a dead runtime's pid taken by another process is not its owner); a set
// whose owner is dead is stale and is removed by the next runtime.
#pragma once

#include <sys/random.h>  // getrandom: the runtime's client key
#include <time.h>        // clock_gettime for the start time
#include <unistd.h>      // getpid, getuid

#include <memory>   // unique_ptr<PosixShmBackend>
#include <string>   // names
#include <vector>   // segment lists, opaque transport info

#include "chi/core/atomic.h"                // header fields read by other processes
#include "chi/core/fork_epoch.h"            // KeepInherited: a forked child abandons the set
#include "chi/core/status.h"                // Status, ErrorCode
#include "chi/core/types.h"                 // u32, u64
#include "chi/memory/posix_shm_backend.h"   // the segments
#include "chi/runtime/config.h"             // ServerConfig sizes
#include "chi/transport/shm_data_region.h"  // RuntimeSegmentName
#include "chi/transport/shm_process.h"      // ProcessIdentity: the owner of the segments

namespace chi {

/** Bumped whenever ConnectRequest/ConnectAnswer or the envelope changes. */
inline constexpr u32 kConnectProtocolVersion = 5;  // 5: the request carries the client key
/** Bumped whenever RuntimeHeader (the start of the main segment) changes. */
inline constexpr u32 kRuntimeHeaderVersion = 3;  // 3: the client key
/** Bytes of the runtime's client key (RuntimeHeader::key_). */
inline constexpr u32 kRuntimeKeyBytes = 32;
inline constexpr u64 kRuntimeHeaderMagic = 0x5254494843ull;  // "CHITR"

/** One shared segment as the runtime describes it to clients. */
struct SegmentInfo {
  std::string name;  ///< user part of the name (PosixShmBackend::OsName adds the prefix)
  u64 size = 0;      ///< whole region in bytes, as mapped by the runtime
  u32 version = 0;   ///< kBackendVersion of the runtime's build

  template <typename Ar>
  void serialize(Ar &ar) {
    ar(name, size, version);
  }
};

/** What a client says when it connects (the first message on a connection). */
struct ConnectRequest {
  u32 protocol_version = kConnectProtocolVersion;
  u32 pid = 0;        ///< the client's process id (the runtime reaps it when it dies)
  u32 uid = 0;        ///< the client's user id (segments are per user)
  std::string mode;   ///< transport the client will use: "shm", "ipc" or "tcp"
  /**
   * The runtime's client key as read from its main segment (ReadRuntimeKey), or empty. The
   * segment is readable by the runtime's user alone, so a tcp client that presents the key
   * proves it runs as that user; the pid and uid above are the client's word only.
   */
  std::string key;

  template <typename Ar>
  void serialize(Ar &ar) {
    ar(protocol_version, pid, uid, mode, key);
  }
};

/** The runtime's answer: who it is, where its memory lives, how to reach it. */
struct ConnectAnswer {
  u32 rc = 0;                         ///< ErrorCode; 0 = accepted
  std::string msg;                    ///< why the client was refused
  u32 protocol_version = kConnectProtocolVersion;
  u32 runtime_pid = 0;
  u32 node_id = 0;
  u32 port = 0;
  u64 client_id = 0;                  ///< this client's registration number
  std::vector<SegmentInfo> segments;  ///< main, client data, runtime data
  std::vector<char> shm_info;         ///< the shm server's serialized info (empty: none)
  /**
   * The runtime's GPU queues a client may attach (chi/gpu/gpu_connect_info.h, versioned
   * inside); empty when the runtime has no GPU or cannot share its queues.
   */
  std::vector<char> gpu_info;
  /**
   * The largest request the runtime takes over ZeroMQ (shm.client_data_size): a client
   * refuses a larger task itself (kTooLarge), since the runtime drops a connection that
   * sends one, and with it the answers of every task in flight on it. 0: not announced.
   */
  u64 max_request_bytes = 0;

  template <typename Ar>
  void serialize(Ar &ar) {
    ar(rc, msg, protocol_version, runtime_pid, node_id, port, client_id, segments, shm_info,
       gpu_info, max_request_bytes);
  }
  /** The answer as a Status (ok when accepted). */
  Status ToStatus() const {
    return rc == 0 ? Status::Ok() : Status::Error(static_cast<ErrorCode>(rc), msg.c_str());
  }
};

/** The first bytes of the main segment's data: which process owns the segment set. */
struct RuntimeHeader {
  // The first three fields keep their place in every layout version (FindOwner).
  Atomic<u64> magic_;  ///< kRuntimeHeaderMagic once the fields below are valid
  u32 version_;        ///< kRuntimeHeaderVersion
  u32 pid_;            ///< the runtime process
  u32 port_;           ///< its port
  u32 reserved_;
  u64 start_ns_;       ///< CLOCK_REALTIME at start, for `chimaera runtime status`
  u64 start_ticks_;    ///< with pid_, the runtime's identity: a reused pid is not the owner
  /// Random bytes a tcp client presents to prove it runs as the runtime's user (the segment
  /// is mode 0600): ConnectRequest::key.
  char key_[kRuntimeKeyBytes];
};

/**
 * True when process `pid` exists (a zombie counts as dead for this purpose), whichever
 * process holds the pid now: where a reused pid matters, check IsProcessAlive's identity.
 */
inline bool ProcessAlive(u32 pid) { return IsProcessAlive(ProcessIdentity{pid, 0}); }

/** The three segments of a standalone runtime, created and removed by the runtime. */
class RuntimeSegments {
 public:
  static constexpr const char *kRoles[3] = {"main", "cdata", "rdata"};

  RuntimeSegments() = default;
  ~RuntimeSegments() { Destroy(); }
  RuntimeSegments(const RuntimeSegments &) = delete;
  RuntimeSegments &operator=(const RuntimeSegments &) = delete;

  /** "rt<port>_<role>": per port; PosixShmBackend makes it per user. */
  static std::string SegmentName(u32 port, const char *role) {
    return RuntimeSegmentName(port, role);
  }

  /**
   * The pid of the live runtime owning port's segments (its pid and start time both
   * match the header), 0 when there is none.
   * Sets *stale when a segment set exists but its owner is dead (or it is unreadable), and
   * *start_ns (when given) to a live owner's start (CLOCK_REALTIME ns; 0 for another layout).
   */
  static u32 FindOwner(u32 port, bool *stale, u64 *start_ns = nullptr) {
    *stale = false;
    PosixShmBackend main;
    Status st = main.Attach(SegmentName(port, kRoles[0]));
    if (!st.ok()) {
      *stale = st.code() != ErrorCode::kNotFound;
      if (!*stale) {  // main is gone, but a crash between creates may have left the others
        for (int i = 1; i < 3; ++i) {
          PosixShmBackend other;
          if (other.Attach(SegmentName(port, kRoles[i])).code() != ErrorCode::kNotFound) {
            *stale = true;
          }
        }
      }
      return 0;
    }
    const RuntimeHeader *h = reinterpret_cast<const RuntimeHeader *>(main.Data());
    // acquire: pairs with Create's release, so pid_ is valid once the magic reads right.
    if (main.DataSize() < sizeof(RuntimeHeader) ||
        h->magic_.Load(MemOrder::kAcquire) != kRuntimeHeaderMagic) {
      *stale = true;
      return 0;
    }
    // Every layout version starts with magic, version and pid: a runtime of another version
    // that still runs owns its set (a newer build must not remove it), decided by its pid.
    const bool current = h->version_ == kRuntimeHeaderVersion;
    const bool alive = IsProcessAlive(ProcessIdentity{h->pid_, current ? h->start_ticks_ : 0});
    *stale = !alive;
    if (start_ns != nullptr) *start_ns = alive && current ? h->start_ns_ : 0;
    return alive ? h->pid_ : 0;
  }

  /**
   * Forgets the segments without unmapping or removing them: in a child made by fork they
   * are the parent runtime's, which keeps serving through them.
   */
  void Abandon() {
    for (std::unique_ptr<PosixShmBackend> &seg : segments_) KeepInherited(std::move(seg));
    segments_.clear();
  }

  /** Removes every segment of `port` (stale clean-up); missing ones are fine. */
  static void RemoveAll(u32 port) {
    for (const char *role : kRoles) PosixShmBackend::DestroyByName(SegmentName(port, role));
  }

  /**
   * Creates the segments for `port` with the configured sizes. A live runtime on
   * the port is an error (kAlreadyExists); a dead one's leftovers are removed first.
   * Sets *cleaned_stale when it removed leftovers.
   */
  Status Create(const ServerConfig &cfg, u32 port, bool *cleaned_stale = nullptr) {
    bool stale = false;
    if (u32 owner = FindOwner(port, &stale); owner != 0) {
      return Status::Errorf(ErrorCode::kAlreadyExists,
                            "a runtime (pid %u) already serves port %u; stop it first "
                            "(chimaera runtime stop) or pick another port (CHI_PORT)",
                            owner, port);
    }
    if (stale) RemoveAll(port);
    if (cleaned_stale != nullptr) *cleaned_stale = stale;
    const u64 sizes[3] = {cfg.main_segment_bytes, cfg.client_data_bytes, cfg.runtime_data_bytes};
    for (int i = 0; i < 3; ++i) {
      auto seg = std::make_unique<PosixShmBackend>();
      Status st = seg->Create(SegmentName(port, kRoles[i]), sizes[i]);
      if (!st.ok()) {
        Destroy();
        return st;
      }
      segments_.push_back(std::move(seg));
    }
    auto *h = reinterpret_cast<RuntimeHeader *>(segments_[0]->Data());
    h->version_ = kRuntimeHeaderVersion;
    h->pid_ = static_cast<u32>(getpid());
    h->port_ = port;
    h->reserved_ = 0;
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    h->start_ns_ = static_cast<u64>(ts.tv_sec) * 1000000000ull + static_cast<u64>(ts.tv_nsec);
    h->start_ticks_ = SelfIdentity().start_ticks;
    if (getrandom(h->key_, sizeof(h->key_), 0) != static_cast<ssize_t>(sizeof(h->key_))) {
      Destroy();
      return Status::Error(ErrorCode::kIo, "cannot draw the runtime's client key (getrandom)");
    }
    key_.assign(h->key_, sizeof(h->key_));
    h->magic_.Store(kRuntimeHeaderMagic, MemOrder::kRelease);  // publishes the fields above
    return Status::Ok();
  }

  /** Unmaps and unlinks the segments (clients keep their mappings). Idempotent. */
  void Destroy() {
    for (auto &seg : segments_) {
      if (seg->IsAttached()) seg->Destroy();
    }
    segments_.clear();
  }

  /** What ConnectAnswer::segments carries. */
  std::vector<SegmentInfo> Describe() const {
    std::vector<SegmentInfo> out;
    for (const auto &seg : segments_) {
      out.push_back(SegmentInfo{seg->Name(), seg->Size(), seg->Header()->version_});
    }
    return out;
  }

  bool IsCreated() const { return !segments_.empty(); }

  /** The client key tcp clients of this user present (empty before Create). */
  const std::string &Key() const { return key_; }

 private:
  std::vector<std::unique_ptr<PosixShmBackend>> segments_;
  std::string key_;
};

/**
 * The client key of the runtime serving `port` on this machine for this user, read from
 * its main segment; empty when there is none or it is not ours to read (another user's
 * runtime, another node's, or another layout version).
 */
inline std::string ReadRuntimeKey(u32 port) {
  PosixShmBackend main;
  if (!main.Attach(RuntimeSegments::SegmentName(port, RuntimeSegments::kRoles[0])).ok()) return {};
  const auto *h = reinterpret_cast<const RuntimeHeader *>(main.Data());
  // acquire: pairs with Create's release, so the key is complete once the magic reads right.
  if (main.DataSize() < sizeof(RuntimeHeader) ||
      h->magic_.Load(MemOrder::kAcquire) != kRuntimeHeaderMagic ||
      h->version_ != kRuntimeHeaderVersion) {
    return {};
  }
  return std::string(h->key_, sizeof(h->key_));
}

/** Compares two keys in time that does not depend on where they differ. */
inline bool KeysMatch(const std::string &a, const std::string &b) {
  if (a.size() != b.size() || a.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

/**
 * Client side: attaches the segments an answer names and checks that each has
 * the version and size the runtime announced and this build understands.
 * Errors: kVersionMismatch, kSizeMismatch, kNotFound (the runtime is gone).
 */
inline Status AttachRuntimeSegments(const ConnectAnswer &answer,
                                    std::vector<std::unique_ptr<PosixShmBackend>> *out) {
  std::vector<std::unique_ptr<PosixShmBackend>> attached;
  for (const SegmentInfo &info : answer.segments) {
    if (info.version != kBackendVersion) {
      return Status::Errorf(ErrorCode::kVersionMismatch,
                            "runtime segment '%s' has layout version %u; this client "
                            "understands %u (rebuild the client against the runtime's chi)",
                            info.name.c_str(), info.version, kBackendVersion);
    }
    auto seg = std::make_unique<PosixShmBackend>();
    if (Status st = seg->Attach(info.name); !st.ok()) return st;
    if (seg->Size() != info.size) {
      return Status::Errorf(ErrorCode::kSizeMismatch,
                            "runtime segment '%s' is %llu bytes but the runtime announced %llu",
                            info.name.c_str(), static_cast<unsigned long long>(seg->Size()),
                            static_cast<unsigned long long>(info.size));
    }
    attached.push_back(std::move(seg));
  }
  *out = std::move(attached);
  return Status::Ok();
}

/** Server side: the error answer for a request this runtime cannot accept (or Ok). */
inline Status CheckConnectRequest(const ConnectRequest &req) {
  if (req.protocol_version != kConnectProtocolVersion) {
    return Status::Errorf(ErrorCode::kVersionMismatch,
                          "client speaks connect protocol %u; this runtime speaks %u "
                          "(rebuild the client against the runtime's chi)",
                          req.protocol_version, kConnectProtocolVersion);
  }
  if (req.uid != static_cast<u32>(getuid())) {
    return Status::Errorf(ErrorCode::kInvalidArgument,
                          "client uid %u differs from the runtime's uid %u (runtimes are per user)",
                          req.uid, static_cast<u32>(getuid()));
  }
  if (req.pid == 0) {  // the runtime could never tell when such a client is gone
    return Status::Error(ErrorCode::kInvalidArgument, "handshake names no client process (pid 0)");
  }
  if (!detail::IsIpcMode(req.mode)) {
    return Status::Errorf(ErrorCode::kInvalidArgument, "unknown transport '%.16s'",
                          req.mode.c_str());
  }
  return Status::Ok();
}

}  // namespace chi
