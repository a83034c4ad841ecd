// What the ZeroMQ client transport and server share: endpoint names (per user
// and port), the control messages that travel in the task envelope, socket
// options, and the doorbell that wakes a network thread (the runtime's: its network
// worker) from other threads.
// Invariant: a ZeroMQ socket is used by one thread at a time, under its
// transport's lock; threads that cannot take it hand work over on a lock-free
// list plus this doorbell.
//
// The ZMQ_FD rule. Threads sleep in poll() on a socket's ZMQ_FD without its lock.
// That fd is edge-like: it signals commands that reach the socket after a thread
// last used it (send, recv or reading ZMQ_EVENTS all consume them), not "a message
// is waiting". So a thread that used a socket must, before unlocking, either have
// received until EAGAIN (or read ZMQ_EVENTS without ZMQ_POLLIN), or ask the network
// thread for another pass. A thread that stops early (a full batch) and sleeps on
// the fd sleeps with messages waiting: that is how 256 tasks in flight once fell
// to 0.002 M/s, each batch of answers waiting for the next poll timeout.
#pragma once

#include <sys/eventfd.h>  // the doorbell's file descriptor
#include <unistd.h>       // getuid, read, write, close

#include <cstring>  // memcpy of ids
#include <string>   // endpoint text
#include <vector>   // message bytes

#include <zmq.hpp>  // cppzmq

#include "chi/core/atomic.h"           // sleeping flag, fences
#include "chi/core/types.h"            // u32, u64
#include "chi/serialize/archive.h"     // control payloads
#include "chi/transport/transport.h"   // kEnvelopeHeaderBytes

namespace chi {

/** The ZeroMQ endpoint of the runtime on this node for `mode` ("ipc" or "tcp") and `port`. */
inline std::string ZmqEndpoint(std::string_view mode, u32 port) {
  if (mode == "ipc") {
    return "ipc:///tmp/chi_" + std::to_string(getuid()) + "_" + std::to_string(port) + ".ipc";
  }
  return "tcp://127.0.0.1:" + std::to_string(port);
}

/**
 * Control messages share the envelope with tasks: a request id with the top bit
 * set names a control message instead of a task, followed by its archive bytes.
 */
namespace zmq_control {
inline constexpr u64 kBit = 1ull << 63;
inline constexpr u64 kConnect = kBit | 1;   ///< client -> runtime: ConnectRequest
inline constexpr u64 kAccept = kBit | 2;    ///< runtime -> client: ConnectAnswer
inline constexpr u64 kBye = kBit | 3;       ///< client -> runtime: forget me
inline constexpr u64 kShutdown = kBit | 4;  ///< runtime -> client: I am stopping
inline constexpr u64 kRefused = kBit | 5;   ///< runtime -> client: connect first
/// runtime -> client: nothing to do (clients ignore it). Sent to a client that has gone
/// quiet: a ROUTER refuses the send when that client's connection is gone.
inline constexpr u64 kPing = kBit | 6;
}  // namespace zmq_control

/** Largest request the runtime accepts (ZMQ_MAXMSGSIZE): larger ones drop the connection. */
inline constexpr u64 kZmqMaxRequestBytes = 256ull << 20;
/** How long a closing socket may still push queued messages out. */
inline constexpr int kZmqLingerMs = 1000;

/** Reads the u64 request id at the front of an envelope (the caller checked the length). */
inline u64 EnvelopeId(const void *data) {
  u64 id = 0;
  std::memcpy(&id, data, sizeof(id));
  return id;
}

/** Encoded messages of at least this many bytes go to ZeroMQ without a copy (MessageOf). */
inline constexpr size_t kZmqHandOverBytes = 64u << 10;

/** ZeroMQ's release of a buffer MessageOf handed over (its I/O thread, once sent). */
inline void FreeHandedOver(void *, void *hint) { delete static_cast<std::vector<char> *>(hint); }

/**
 * A message of the encoded `bytes`. Small ones are copied, so the caller's buffer keeps its
 * capacity for the next; from kZmqHandOverBytes the buffer itself is handed over (leaving
 * `bytes` empty): copying a large payload into a fresh ZeroMQ buffer cost a 1 MiB ipc echo
 * a quarter of its time. ZeroMQ frees it once sent, or the message does if never sent.
 */
inline zmq::message_t MessageOf(std::vector<char> *bytes) {
  if (bytes->size() < kZmqHandOverBytes) return zmq::message_t(bytes->data(), bytes->size());
  auto *owned = new std::vector<char>(std::move(*bytes));
  bytes->clear();  // moved from: empty, said plainly
  try {
    return zmq::message_t(owned->data(), owned->size(), &FreeHandedOver, owned);
  } catch (...) {  // ENOMEM for ZeroMQ's own record: the buffer is still ours
    delete owned;
    throw;
  }
}

/** Builds a control message: the id, then the archive of `body`. */
template <typename T>
zmq::message_t MakeControl(u64 id, T &body) {
  std::vector<char> buf(kEnvelopeHeaderBytes);
  std::memcpy(buf.data(), &id, sizeof(id));
  OutputArchive ar(buf);
  ar(body);
  return zmq::message_t(buf.data(), buf.size());
}

/** A control message with no body. */
inline zmq::message_t MakeControl(u64 id) { return zmq::message_t(&id, sizeof(id)); }

/** Decodes a control message's body; false when malformed. */
template <typename T>
bool ParseControl(const zmq::message_t &msg, T *body) {
  if (msg.size() < kEnvelopeHeaderBytes) return false;
  InputArchive ar(static_cast<const char *>(msg.data()) + kEnvelopeHeaderBytes,
                  msg.size() - kEnvelopeHeaderBytes);
  ar(*body);
  return ar.ok();
}

/**
 * Wakes a network thread blocked in zmq_poll. Producers ring it after
 * publishing work; the eventfd is written only while the thread says it sleeps,
 * so a busy network thread costs producers no system call.
 */
class ZmqDoorbell {
 public:
  ZmqDoorbell() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~ZmqDoorbell() {
    if (fd_ >= 0) close(fd_);
  }
  ZmqDoorbell(const ZmqDoorbell &) = delete;
  ZmqDoorbell &operator=(const ZmqDoorbell &) = delete;

  bool ok() const { return fd_ >= 0; }
  /** The fd to poll for POLLIN. */
  int fd() const { return fd_; }

  /** Producer: call after publishing work. */
  void Ring() {
    // seq_cst fence: our publish is visible before we read sleeping_ (mirrors Sleep).
    FenceSeqCst();
    if (sleeping_.Load(MemOrder::kRelaxed) != 0) Signal();
  }
  /** True while the network thread sleeps or is about to (a hint: read relaxed). */
  bool Sleeping() const { return sleeping_.Load(MemOrder::kRelaxed) != 0; }

  /** Network thread: announce a sleep; re-check the work lists afterwards, then poll. */
  void PrepareSleep() {
    sleeping_.Store(1, MemOrder::kRelaxed);
    // seq_cst fence: the flag is visible before we re-check for work (mirrors Ring).
    FenceSeqCst();
  }
  /**
   * Network thread: back from polling; clears the flag, and the counter unless the poll
   * said the fd was not readable (`rung` false: saves a read; a ring that came since
   * only makes the next poll return at once).
   */
  void Awake(bool rung = true) {
    sleeping_.Store(0, MemOrder::kRelaxed);
    if (rung) Clear();
  }

  /** Makes the fd readable now, whether or not anyone sleeps (a bell without the flag). */
  void Signal() {
    u64 one = 1;
    ssize_t n = write(fd_, &one, sizeof(one));
    (void)n;  // EAGAIN means the counter is already non-zero: the poller wakes anyway
  }
  /** Clears the counter: the fd is no longer readable until the next ring. */
  void Clear() {
    u64 v = 0;
    ssize_t n = read(fd_, &v, sizeof(v));
    (void)n;  // EAGAIN: nobody rang
  }

 private:
  int fd_;
  Atomic<u32> sleeping_;
};

/** True when `s` has a message to receive; re-reads its events (see the ZMQ_FD rule). */
inline bool ZmqReadable(zmq::socket_t &s) {
  return (s.get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
}

/** Socket options every chi ZeroMQ socket gets: bounded linger, no message limit on HWM. */
inline void ConfigureZmqSocket(zmq::socket_t &s) {
  s.set(zmq::sockopt::linger, kZmqLingerMs);
  s.set(zmq::sockopt::sndhwm, 0);  // back-pressure is ours (bounded in-flight), not ZeroMQ's
  s.set(zmq::sockopt::rcvhwm, 0);
}

}  // namespace chi
