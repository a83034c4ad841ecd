// How a pure client (CHIMAERA_INIT(kClient, false)) reaches a runtime in
// another process, and the envelope every transport wraps tasks in.
//
// Request: [u64 request id][routing header + inputs]   (TaskOps::save_in)
// Answer:  [u64 request id][answer header + outputs]   (TaskOps::save_out)
// The request id names the client's outstanding task; the runtime echoes it.
#pragma once

#include "chi/core/status.h"  // Status
#include "chi/core/types.h"   // u64
#include "chi/task/task.h"    // Task

namespace chi {

struct ConnectAnswer;  // client_connect.h: what a runtime's handshake answered

/** Bytes of the request-id prefix of every request and answer. */
inline constexpr u64 kEnvelopeHeaderBytes = sizeof(u64);

/**
 * A client's connection to a runtime. Send takes a stamped task; the transport
 * completes it (CompleteTask) when the answer arrives, or with an error code
 * (kPeerDead, kTimeout, kShutdown) when it cannot. Never loses a task silently.
 */
class ClientTransport {
 public:
  virtual ~ClientTransport() = default;
  /** Sends the task; false (task untouched) only when the transport is closed. */
  virtual bool Send(Task *task) = 0;
  /** Fails every outstanding task with kShutdown and releases the connection. */
  virtual void Close() = 0;
  /** "shm", "ipc" or "tcp". */
  virtual const char *Name() const = 0;
  /** The pid of the runtime this transport talks to now; 0 while it knows none. */
  virtual u32 RuntimePid() const { return 0; }
  /**
   * Copies the handshake answer of the runtime this transport talks to now (after a
   * reconnect, the restarted one's) into *out; false when it keeps none.
   */
  virtual bool CopyConnectAnswer(ConnectAnswer *out) const {
    (void)out;
    return false;
  }
};

}  // namespace chi
