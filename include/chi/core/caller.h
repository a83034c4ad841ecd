// Caller: who submitted a task, as the transport that carried it vouches for it. Handlers
// that act on a client's behalf (admin RegisterMemory, StopRuntime, DestroyPool) decide
// with it, never with ids read from the request bytes. Invariant: a pid or uid is set only
// when the kernel told the runtime (SO_PEERCRED on ipc, /proc for an shm slot's owner, the
// runtime's own process) or the peer proved it (a tcp client that read the runtime's key).
#pragma once

#include <unistd.h>  // getpid, getuid

#include "chi/core/types.h"  // u32

namespace chi {

/** Who sent a task (chi::CallerOf). Plain data: transports keep one per client. */
struct Caller {
  /** How the task reached this runtime. */
  enum class Via : u32 {
    kThisProcess = 0,  ///< submitted here: the application or a handler's subtask
    kShm = 1,          ///< an shm client slot
    kIpc = 2,          ///< ZeroMQ over the ipc socket
    kTcp = 3,          ///< ZeroMQ over tcp
    kGpu = 4,          ///< a GPU kernel of this runtime's process
    kUnknown = 5,      ///< a transport that vouches for nobody
  };
  static constexpr u32 kNoUid = ~0u;  ///< the uid is not known

  Via via = Via::kUnknown;
  u32 pid = 0;         ///< the sending process, or 0 when the runtime cannot verify it
  u32 uid = kNoUid;    ///< its user, or kNoUid when the runtime cannot verify it

  /** This process (the runtime itself, or the application that embeds it). */
  static Caller ThisProcess() {
    return Caller{Via::kThisProcess, static_cast<u32>(getpid()), static_cast<u32>(getuid())};
  }

  /** True for tasks this process submitted itself (GPU kernels of this process included). */
  bool IsThisProcess() const { return via == Via::kThisProcess || via == Via::kGpu; }

  /**
   * True when the caller runs as the runtime's user (or as root, who may stop any process
   * anyway): what StopRuntime and DestroyPool require.
   */
  bool IsRuntimeUser() const { return IsThisProcess() || IsRuntimeUid(uid); }

  /** True for the runtime's own uid and for root (never for kNoUid): who may own it. */
  static bool IsRuntimeUid(u32 uid) {
    return uid != kNoUid && (uid == static_cast<u32>(getuid()) || uid == 0);
  }

  /** "shm", "ipc", "tcp", ...: for messages. */
  const char *ViaName() const {
    switch (via) {
      case Via::kThisProcess: return "in-process";
      case Via::kShm: return "shm";
      case Via::kIpc: return "ipc";
      case Via::kTcp: return "tcp";
      case Via::kGpu: return "gpu";
      default: return "unknown";
    }
  }
};

}  // namespace chi
