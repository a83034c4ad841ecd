// ShmReconnectingTransport: what a pure client with CHI_IPC_MODE=shm talks through. It
// sends over one ShmClientTransport at a time; when that connection's runtime stops or
// dies, the connection fails its outstanding tasks (kShutdown / kPeerDead) and the next
// Send starts a reconnection: a thread repeats the ClientConnect handshake, attaches the
// new segment and claims a new slot for up to the reconnect time, while tasks sent in the
// meantime wait for it (they fail with kPeerDead if it does not come back in time). It
// keeps the handshake answer of the runtime it talks to now (Answer).
// Invariant: every task handed to Send is completed once; a replaced connection object
// (and its segment mapping) lives until Close, so a sender still holding it finds it
// retired and retries.
#pragma once

#include <pthread.h>  // naming the reconnect thread

#include <climits>  // INT_MAX: wake the reconnect thread
#include <cstdio>   // snprintf of the failure message
#include <memory>   // unique_ptr of connections
#include <mutex>    // the current handshake answer (read rarely, replaced on a rejoin)
#include <thread>   // the reconnect thread
#include <vector>   // replaced connections

#include "chi/core/atomic.h"             // Atomic
#include "chi/core/futex.h"              // parking the reconnect thread
#include "chi/core/status.h"             // Status, ErrorCode
#include "chi/queue/wait_event.h"        // MonotonicNs
#include "chi/serialize/archive.h"       // InputArchive: the shm part of an answer
#include "chi/task/task_ops.h"           // CompleteTask
#include "chi/transport/client_connect.h"  // ConnectAnswer
#include "chi/transport/shm_client.h"    // ShmClientTransport, one connection
#include "chi/transport/shm_segment.h"   // ShmServerInfo
#include "chi/transport/task_stack.h"    // TaskStack: tasks waiting for a connection
#include "chi/transport/transport.h"     // ClientTransport

namespace chi {

/** The shm server's description in a handshake answer (kUnsupported when it has none). */
inline Status ShmInfoFromAnswer(const ConnectAnswer &answer, ShmServerInfo *info) {
  InputArchive info_ar(answer.shm_info.data(), answer.shm_info.size());
  info_ar(*info);
  if (answer.shm_info.empty() || !info_ar.ok()) {
    return Status::Error(ErrorCode::kUnsupported,
                         "CHI_IPC_MODE=shm: the runtime offers no shared-memory transport; "
                         "use CHI_IPC_MODE=ipc or tcp");
  }
  return Status::Ok();
}

/**
 * How to find the runtime again: a ClientConnect handshake (chimaera.h does it over
 * ZeroMQ) that fills *answer with the runtime's accepted answer, waiting at most
 * timeout_sec for a runtime to answer. A plain function pointer: it runs only while
 * reconnecting.
 */
struct ShmRejoin {
  Status (*handshake)(void *ctx, double timeout_sec, ConnectAnswer *answer) = nullptr;
  void *ctx = nullptr;
  double reconnect_sec = 10;  ///< networking.reconnect_timeout_s
  ShmClientOptions client;    ///< how each new connection behaves
};

/** A shm client connection that rejoins a restarted runtime (see the file comment). */
class ShmReconnectingTransport final : public ClientTransport {
 public:
  /** Pause between handshakes that fail at once (a refusal, a segment not there yet). */
  static constexpr u64 kRetryPauseNs = 20000000;
  /** Most one handshake waits, so a long window still notices Close. */
  static constexpr double kHandshakeSliceSec = 1.0;

  /** Takes over a connected first connection; `answer` is the handshake that found it. */
  ShmReconnectingTransport(std::unique_ptr<ShmClientTransport> first, const ShmRejoin &rejoin,
                           const ConnectAnswer &answer = ConnectAnswer())
      : rejoin_(rejoin), answer_(answer) {
    current_.Store(first.get(), MemOrder::kRelease);  // release: before any Send sees it
    connections_.push_back(std::move(first));
    thread_ = std::thread([this] { Loop(); });  // parked until a Send finds the runtime gone
  }
  ~ShmReconnectingTransport() override { Close(); }
  ShmReconnectingTransport(const ShmReconnectingTransport &) = delete;
  ShmReconnectingTransport &operator=(const ShmReconnectingTransport &) = delete;

  /**
   * Sends over the current connection while it is healthy; otherwise queues the task
   * for the reconnection (started here if none runs). False only once closed.
   */
  bool Send(Task *task) override {
    for (;;) {
      // acquire: a connection published by the reconnect thread is fully set up.
      ShmClientTransport *c = current_.Load(MemOrder::kAcquire);
      if (c->Usable() && c->Send(task)) return true;
      // seq_cst: Close sets the flag before it fails the queue (Dekker with our push).
      if (closed_.Load(MemOrder::kSeqCst) != 0) return false;
      // relaxed: re-read with acquire at the top; a replaced connection is retried.
      if (current_.Load(MemOrder::kRelaxed) != c) continue;
      Queue(task);
      return true;
    }
  }

  /** Stops reconnecting, fails queued tasks with kShutdown, closes every connection. */
  void Close() override {
    if (closed_.Exchange(1, MemOrder::kSeqCst) != 0) return;
    Kick();
    if (thread_.joinable()) thread_.join();
    queue_.FailAll(ErrorCode::kShutdown, "shm transport: closed before the runtime came back");
    for (auto &c : connections_) c->Close();
  }

  const char *Name() const override { return "shm"; }

  /** The connection in use (tests and diagnostics). */
  ShmClientTransport *Current() const { return current_.Load(MemOrder::kAcquire); }
  /** The runtime process of the connection in use. */
  u32 RuntimePid() const override { return Current()->RuntimePid(); }
  /** Successful reconnections so far. */
  u64 Reconnects() const { return reconnects_.Load(MemOrder::kRelaxed); }

  /**
   * The handshake answer of the runtime the current connection serves with (a copy:
   * the reconnect thread replaces it when it rejoins a restarted runtime).
   */
  bool CopyConnectAnswer(ConnectAnswer *out) const override {
    std::lock_guard<std::mutex> lock(answer_mu_);
    *out = answer_;
    return true;
  }

 private:
  /** Pushes a task for the reconnect thread and makes sure it runs. */
  void Queue(Task *task) {
    queue_.Push(task);  // before our kick and Close's flag check (see Close, Loop)
    Kick();
    // seq_cst: push, then read the flag; Close sets it, then takes the queue. If we see
    // it unset, Close's take sees our push; if set, we may be too late: fail it ourselves.
    if (closed_.Load(MemOrder::kSeqCst) != 0) {
      queue_.FailAll(ErrorCode::kShutdown, "shm transport: closed before the runtime came back");
    }
  }

  /** Wakes the reconnect thread. */
  void Kick() {
    kicks_.FetchAdd(1, MemOrder::kSeqCst);  // seq_cst: after the push it announces
    FutexWake(kicks_.Raw(), INT_MAX);
  }

  /** The reconnect thread: one window per batch of queued tasks, until Close. */
  void Loop() {
    pthread_setname_np(pthread_self(), "chi-shm-rejoin");
    for (;;) {
      // acquire: tasks pushed before the kick we read are visible to the drain below.
      const u32 seen = kicks_.Load(MemOrder::kAcquire);
      if (closed_.Load(MemOrder::kAcquire) != 0) break;  // acquire: Close's flag
      if (!queue_.Empty(MemOrder::kAcquire)) Window();
      if (closed_.Load(MemOrder::kAcquire) != 0) break;
      // seq_cst: a push before a kick we did not see yet is found here.
      if (queue_.Empty(MemOrder::kSeqCst)) FutexWait(kicks_.Raw(), seen, 0);
    }
  }

  /**
   * Gets a healthy connection within reconnect_sec and sends the queued tasks over it;
   * fails them with kPeerDead when no runtime answers in time.
   */
  void Window() {
    const u64 deadline = MonotonicNs() + static_cast<u64>(rejoin_.reconnect_sec * 1e9);
    Status last = Status::Error(ErrorCode::kPeerDead, "shm transport: no runtime came back");
    for (;;) {
      if (closed_.Load(MemOrder::kAcquire) != 0) return;  // Close fails the queue
      ShmClientTransport *c = current_.Load(MemOrder::kAcquire);
      if (c->Usable()) {
        for (Task *t = queue_.TakeOldestFirst(); t != nullptr;) {
          Task *next = TaskStack::Next(t);
          if (!c->Send(t)) FailTask(t, ErrorCode::kShutdown, "shm transport: closed");
          t = next;
        }
        return;
      }
      const u64 now = MonotonicNs();
      if (now >= deadline) break;
      double left = static_cast<double>(deadline - now) / 1e9;
      if (rejoin_.handshake == nullptr) break;
      ConnectAnswer answer;
      ShmServerInfo info;
      last = rejoin_.handshake(rejoin_.ctx, left < kHandshakeSliceSec ? left : kHandshakeSliceSec,
                               &answer);
      if (last.ok()) last = ShmInfoFromAnswer(answer, &info);
      std::unique_ptr<ShmClientTransport> next;
      if (last.ok()) last = ShmClientTransport::Connect(info, &next, rejoin_.client);
      if (last.ok() && !next->Usable()) {  // the old runtime, on its way out
        last = Status::Error(ErrorCode::kShutdown, "shm transport: the runtime is stopping");
        next.reset();
      }
      if (!last.ok()) {
        if (last.code() != ErrorCode::kTimeout) {  // a pause that Close (a kick) cuts short
          FutexWait(kicks_.Raw(), kicks_.Load(MemOrder::kAcquire), kRetryPauseNs);
        }
        continue;
      }
      // Retire the old connection first (it is failed or its runtime is leaving), so the
      // new one may help waiters; its mapping stays until Close, for senders holding it.
      c->Retire();
      {
        std::lock_guard<std::mutex> lock(answer_mu_);
        answer_ = std::move(answer);  // before the connection is published: Answer matches it
      }
      current_.Store(next.get(), MemOrder::kRelease);  // release: set up before senders use it
      connections_.push_back(std::move(next));
      reconnects_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
    }
    char msg[Status::kMaxMessage];
    std::snprintf(msg, sizeof(msg),
                  "shm transport: the runtime went away and did not come back within %.1f s "
                  "(last try: %s)", rejoin_.reconnect_sec, last.message());
    queue_.FailAll(ErrorCode::kPeerDead, msg);
  }

  /** Completes a task with an error. */
  static void FailTask(Task *t, ErrorCode code, const char *msg) {
    t->SetError(code, msg);
    CompleteTask(t);
  }

  ShmRejoin rejoin_;
  mutable std::mutex answer_mu_;  ///< guards answer_ (not on any task's path)
  ConnectAnswer answer_;          ///< the current runtime's handshake answer
  Atomic<ShmClientTransport *> current_{nullptr};
  std::vector<std::unique_ptr<ShmClientTransport>> connections_;  ///< the reconnect thread's
  TaskStack queue_;  ///< tasks waiting for a connection
  Atomic<u32> kicks_;       ///< the reconnect thread's futex word
  Atomic<u32> closed_;
  Atomic<u64> reconnects_;
  std::thread thread_;
};

}  // namespace chi
