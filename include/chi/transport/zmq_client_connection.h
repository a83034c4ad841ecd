// ZmqClientConnection: the socket half of a pure client's ZeroMQ connection to its
// runtime (DEALER to the runtime's ROUTER, ipc or tcp): opening and replacing the
// socket, the ClientConnect handshake, sending requests, taking answers off the
// socket and completing their tasks, and failing tasks when the runtime is lost.
// ZmqClientTransport (zmq_client.h) adds who does it: calling threads and the
// network thread. Invariants: every function here runs under sock_mu_ (the socket
// is not thread-safe), and whoever used the socket leaves it drained or asks the
// network thread for a pass before unlocking (the ZMQ_FD rule, zmq_common.h).
#pragma once

#include <unistd.h>  // getpid, getuid

#include <cstdio>   // snprintf of the too-large message
#include <cstring>  // memcpy of monitor events
#include <deque>    // tasks waiting for a connection, deferred control messages
#include <future>   // result of the first handshake
#include <memory>   // unique_ptr
#include <mutex>    // the socket's lock, the latest handshake answer
#include <string>   // endpoint
#include <vector>   // encode buffer

#include <zmq.hpp>  // cppzmq

#include "chi/core/atomic.h"                   // submit list, counters
#include "chi/runtime/worker.h"                // NowNs
#include "chi/transport/client_connect.h"      // ConnectRequest/Answer
#include "chi/transport/request_dispatcher.h"  // EncodeRequest, DecodeAnswer
#include "chi/transport/transport.h"           // ClientTransport
#include "chi/transport/zmq_client_table.h"    // request ids, back-pressure, completion
#include "chi/transport/zmq_common.h"          // endpoints, control ids, doorbell

namespace chi {

/** How a ZeroMQ client finds and keeps its runtime. */
struct ZmqClientOptions {
  std::string mode = "tcp";        ///< "ipc" or "tcp"
  u32 port = 9413;
  double connect_timeout_sec = 5;  ///< first handshake must succeed within this
  double reconnect_sec = 10;       ///< after a loss, tasks wait this long for the runtime
  /// A runtime whose heartbeats stop this long (stopped or hung) counts as lost; 0: never.
  double hang_timeout_sec = 10;
  u64 max_inflight = 1u << 16;     ///< Send blocks beyond this many unanswered tasks
  u64 spin_ns = 20000;             ///< network thread: busy polling after work before sleeping
};

/** Counters of a client connection. */
struct ZmqClientStats {
  u64 outstanding = 0;   ///< tasks sent, not answered
  u64 reconnects = 0;    ///< handshakes after the first
  u64 peer_losses = 0;   ///< times the runtime went away
  u64 sent_by_caller = 0;      ///< requests the calling thread sent itself
  u64 received_by_caller = 0;  ///< answers callers took themselves (waiting, polling, sending)
  bool wait_helper = false;    ///< waiting callers take answers (the process's WaitHelper is ours)
  /**
   * Times the network thread slept (each ends in a wake-up: an event, a timer, or the end
   * of a blind sleep). A caller's round trips wake it no more than once each 2 ms.
   */
  u64 network_sleeps = 0;
  /**
   * Answers the network thread found waiting on waking from a sleep that ran to its bound
   * with no timer due: a wake-up that never came (the ZMQ_FD rule broken). Expected 0.
   */
  u64 late_wakeups = 0;
};

/** The socket half of a client connection (see the file comment); a base class only. */
class ZmqClientConnection : public ClientTransport {
 protected:
  /** How long a client waits before asking a runtime whose client table was full again. */
  static constexpr u64 kHandshakeRetryNs = 50000000ull;
  enum class State { kConnecting, kReady, kDown };
  static constexpr u32 kRecvBatch = 64;

  explicit ZmqClientConnection(const ZmqClientOptions &opt)
      : opt_(opt), endpoint_(ZmqEndpoint(opt.mode, opt.port)), table_(opt.max_inflight) {}

  /** The socket holder left work on it for the network thread (the fd will not say so). */
  void AskForPass() {
    wake_asked_.Store(1, MemOrder::kRelaxed);  // relaxed: Ring's seq_cst fence publishes it
    doorbell_.Ring();
  }

  /** A fresh DEALER (and its monitor), connected, with the handshake queued on it. */
  void OpenSocket() {
    socket_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
    ConfigureZmqSocket(*socket_);
    socket_->set(zmq::sockopt::reconnect_ivl, 20);
    socket_->set(zmq::sockopt::reconnect_ivl_max, 200);
    // A stopped or hung runtime stops answering heartbeats: the connection drops after
    // hang_timeout_sec, and its tasks fail as for a runtime that went away.
    const int hang_ms = static_cast<int>(opt_.hang_timeout_sec * 1000);
    if (hang_ms > 0) {
      socket_->set(zmq::sockopt::heartbeat_ivl, hang_ms < 2000 ? (hang_ms + 3) / 4 : 500);
      socket_->set(zmq::sockopt::heartbeat_timeout, hang_ms);
    }
    const std::string mon = "inproc://chi-zmq-monitor-" +
                            std::to_string(reinterpret_cast<u64>(this)) + "-" +
                            std::to_string(++monitor_serial_);
    if (zmq_socket_monitor(socket_->handle(), mon.c_str(),
                           ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0) {
      throw zmq::error_t();
    }
    monitor_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::pair);
    monitor_->set(zmq::sockopt::linger, 0);
    monitor_->connect(mon);
    socket_->connect(endpoint_);
    socket_fd_ = socket_->get(zmq::sockopt::fd);
    // Over tcp the handshake carries the client key, which a runtime (re)starting now may
    // not have written yet: it is sent once the connection stands (ReadMonitor), when the
    // runtime has bound its port and so has made its segments.
    if (opt_.mode != "tcp") SendHandshake();
  }

  /** Queues the ClientConnect handshake on the socket. */
  void SendHandshake() {
    ConnectRequest req;
    req.pid = static_cast<u32>(getpid());
    req.uid = static_cast<u32>(getuid());
    req.mode = opt_.mode;
    // Over tcp the runtime cannot ask the kernel who we are: the key of a runtime of this
    // user on this machine says it (ipc clients are known by their socket's credentials).
    if (opt_.mode == "tcp") req.key = ReadRuntimeKey(opt_.port);
    SendOnSocket(MakeControl(zmq_control::kConnect, req), zmq::send_flags::none);
  }

  /** Every send on the socket goes here: it may take the fd's signal, so it is no longer armed. */
  bool SendOnSocket(zmq::message_t &&msg, zmq::send_flags flags) {
    armed_ = false;
    return socket_->send(std::move(msg), flags).has_value();
  }

  /** Closes the socket; what is still queued on it is dropped (a lost runtime, or a Bye). */
  void CloseSocket() {
    if (socket_) {
      zmq_socket_monitor(socket_->handle(), nullptr, 0);
      if (!bye_sent_) socket_->set(zmq::sockopt::linger, 0);
      socket_->close();
      socket_.reset();
    }
    if (monitor_) {
      monitor_->close();
      monitor_.reset();
    }
  }

  /** Handles control messages a caller received (callers never replace the socket). */
  bool HandleDeferredControls() {
    if (controls_.empty()) return false;
    while (!controls_.empty()) {
      zmq::message_t msg = std::move(controls_.front());
      controls_.pop_front();
      HandleControl(EnvelopeId(msg.data()), msg);
    }
    return true;
  }

  /** Moves newly submitted tasks onto the wire (or the waiting list); true when any. */
  bool TakeSubmitted() {
    // acquire: pairs with Send's release; the tasks' fields are visible.
    Task *list = submitted_.Exchange(nullptr, MemOrder::kAcquire);
    if (list == nullptr) return false;
    Task *fifo = nullptr;
    while (list != nullptr) {  // newest first on the list; reverse it
      Task *next = reinterpret_cast<Task *>(list->transport_cookie_);
      list->transport_cookie_ = reinterpret_cast<u64>(fifo);
      fifo = list;
      list = next;
    }
    while (fifo != nullptr) {
      Task *t = fifo;
      fifo = reinterpret_cast<Task *>(t->transport_cookie_);
      t->transport_cookie_ = 0;
      if (state_ == State::kReady) {
        SendTask(t);
      } else if (down_expired_) {
        table_.Fail(t, ErrorCode::kPeerDead,
                    "no runtime: it went away and did not come back in time");
      } else {
        waiting_.push_back(t);
      }
    }
    return true;
  }

  /** Under sock_mu_: gives t a request id and sends it. */
  void SendTask(Task *t) {
    const u64 request_id = table_.Insert(t);
    EncodeRequest(t, request_id, &encode_);
    const u64 limit = max_request_bytes_;
    if (limit != 0 && encode_.size() > limit) {  // the runtime would drop the connection
      char why[Status::kMaxMessage];
      std::snprintf(why, sizeof(why),
                    "%s transport: request of %zu bytes exceeds the runtime's %llu-byte limit "
                    "(shm.client_data_size)",
                    opt_.mode.c_str(), encode_.size(), static_cast<unsigned long long>(limit));
      table_.Fail(table_.Take(request_id), ErrorCode::kTooLarge, why);
      std::vector<char>().swap(encode_);  // do not keep the oversized buffer
      return;
    }
    SendOnSocket(MessageOf(&encode_), zmq::send_flags::none);
  }

  /**
   * Receives and delivers up to kRecvBatch messages; returns how many. The network
   * thread handles control messages; a caller (network_thread false) leaves them, and
   * what follows them, to it. It ends with a recv that found nothing, or asks the
   * network thread for another pass (a full batch: more may wait, and the fd will not
   * say so), as the ZMQ_FD rule asks.
   */
  u32 ReceiveBatch(bool network_thread) {
    if (!network_thread && !controls_.empty()) return 0;  // the thread was rung for them
    u32 got = 0;
    armed_ = false;
    for (; got < kRecvBatch && socket_; ++got) {
      zmq::message_t msg;
      if (!socket_->recv(msg, zmq::recv_flags::dontwait)) {
        armed_ = true;
        break;
      }
      while (msg.more()) {  // the runtime sends one frame; skip anything else
        zmq::message_t extra;
        if (!socket_->recv(extra, zmq::recv_flags::none) || !extra.more()) break;
      }
      if (msg.size() < kEnvelopeHeaderBytes) continue;
      const u64 id = EnvelopeId(msg.data());
      if (id == zmq_control::kPing) continue;  // the runtime checked the connection: nothing to do
      if (id & zmq_control::kBit) {
        if (network_thread) {
          HandleControl(id, msg);
          continue;
        }
        controls_.push_back(std::move(msg));
        AskForPass();
        return got + 1;
      }
      Task *t = table_.Take(id);
      if (t == nullptr) continue;  // an answer to a task already failed by a peer loss
      DecodeAnswer(t, static_cast<const char *>(msg.data()), msg.size());
      table_.Complete(t);
      // relaxed: a statistic.
      if (!network_thread) received_by_caller_.FetchAdd(1, MemOrder::kRelaxed);
    }
    if (got == kRecvBatch) AskForPass();  // more may wait: the fd is quiet
    return got;
  }

  /**
   * Network thread: the runtime's goodbye, or its answer to our handshake (kAccept). Pings
   * never get here (ReceiveBatch drops them); other unknown ids are ignored.
   */
  void HandleControl(u64 id, const zmq::message_t &msg) {
    if (id == zmq_control::kShutdown) {
      PeerLost(ErrorCode::kShutdown, "the runtime shut down before answering");
      return;
    }
    if (id != zmq_control::kAccept) return;
    ConnectAnswer answer;
    if (!ParseControl(msg, &answer)) {
      answer = ConnectAnswer();
      answer.rc = static_cast<u32>(ErrorCode::kMalformed);
      answer.msg = "malformed ClientConnect answer";
    }
    if (answer.rc == 0) {  // before Connect can return: Answer() is the accepted one
      std::lock_guard<std::mutex> lock(answer_mu_);
      answer_ = answer;
    }
    if (!first_done_ && answer.rc == static_cast<u32>(ErrorCode::kOutOfMemory)) {
      // The runtime's client table is full; it makes room as closed connections are found,
      // so ask again shortly, until the connect timeout.
      const u64 retry_ns = NowNs() + kHandshakeRetryNs;
      if (retry_ns < connect_deadline_) {
        handshake_retry_ns_ = retry_ns;
        return;
      }
    }
    if (!first_done_) {
      first_done_ = true;
      first_answer_ = answer;
      if (answer.rc != 0) {
        first_result_.set_value(answer.ToStatus());
        stop_.Store(1, MemOrder::kRelease);
        return;
      }
      first_result_.set_value(Status::Ok());
    } else if (answer.rc != 0) {
      FailWaiting(static_cast<ErrorCode>(answer.rc), "the runtime refused the reconnection");
      return;
    } else {
      reconnects_.FetchAdd(1, MemOrder::kRelaxed);
    }
    max_request_bytes_ = answer.max_request_bytes;
    runtime_pid_.Store(answer.runtime_pid, MemOrder::kRelease);
    state_ = State::kReady;
    down_expired_ = false;
    while (!waiting_.empty()) {
      Task *t = waiting_.front();
      waiting_.pop_front();
      SendTask(t);
    }
  }

  /**
   * Reads connection events; a disconnect is a lost runtime. The answers the runtime sent
   * before it went away are taken off the socket first (ZeroMQ queues them there before it
   * reports the disconnect): only tasks it never answered fail.
   */
  bool ReadMonitor() {
    bool any = false;
    for (;;) {
      zmq::message_t event;
      if (!monitor_ || !monitor_->recv(event, zmq::recv_flags::dontwait)) return any;
      any = true;
      zmq::message_t address;
      if (event.more()) (void)monitor_->recv(address, zmq::recv_flags::none);
      u16 kind = 0;
      if (event.size() >= sizeof(kind)) std::memcpy(&kind, event.data(), sizeof(kind));
      if (kind == ZMQ_EVENT_CONNECTED && opt_.mode == "tcp" && state_ != State::kReady) {
        SendHandshake();
        AskForPass();  // the ZMQ_FD rule: our send may have taken the fd's signal
        continue;
      }
      if (kind == ZMQ_EVENT_DISCONNECTED) {
        if (state_ != State::kReady) {  // lost mid-handshake: start over, sending it again
          CloseSocket();
          OpenSocket();
          return true;
        }
        while (state_ == State::kReady && ReceiveBatch(true) == kRecvBatch) {
        }
        // Unless a goodbye among the answers (kShutdown) already failed the rest.
        if (state_ == State::kReady) {
          PeerLost(ErrorCode::kPeerDead, "the runtime went away before answering");
        }
        return true;  // the monitor was replaced
      }
    }
  }

  /** The runtime is gone: fail what it holds and reconnect on a fresh socket. */
  void PeerLost(ErrorCode code, const char *why) {
    losses_.FetchAdd(1, MemOrder::kRelaxed);
    runtime_pid_.Store(0, MemOrder::kRelease);
    table_.FailAll(code, why);
    state_ = State::kDown;
    down_since_ = NowNs();
    CloseSocket();
    OpenSocket();
  }

  /** Nanoseconds from `now` until Timers has something to do; ~0 when nothing is due. */
  u64 NextTimerNs(u64 now) const {
    u64 due = ~0ull;
    if (!first_done_) due = connect_deadline_;
    if (handshake_retry_ns_ != 0 && handshake_retry_ns_ < due) due = handshake_retry_ns_;
    if (state_ == State::kDown && !down_expired_) {
      const u64 expiry = down_since_ + static_cast<u64>(opt_.reconnect_sec * 1e9);
      due = expiry < due ? expiry : due;
    }
    if (due == ~0ull) return due;
    return due > now ? due - now : 0;
  }

  /** Ends the connect wait, and the reconnect wait of queued tasks, at their deadlines. */
  void Timers(u64 now) {
    if (handshake_retry_ns_ != 0 && now >= handshake_retry_ns_) {
      handshake_retry_ns_ = 0;
      if (!first_done_ && socket_) {
        SendHandshake();
        AskForPass();  // the ZMQ_FD rule: our send may have taken the fd's signal
      }
    }
    if (!first_done_ && now >= connect_deadline_) {
      first_done_ = true;
      first_result_.set_value(Status::Errorf(
          ErrorCode::kTimeout, "no runtime answered at %s within %.1f s (start one with "
          "chimaera runtime start, or check CHI_PORT / CHI_IPC_MODE)",
          endpoint_.c_str(), opt_.connect_timeout_sec));
      stop_.Store(1, MemOrder::kRelease);
      return;
    }
    if (state_ == State::kDown && !down_expired_ &&
        now - down_since_ >= static_cast<u64>(opt_.reconnect_sec * 1e9)) {
      down_expired_ = true;
      FailWaiting(ErrorCode::kPeerDead, "no runtime: it went away and did not come back in time");
    }
  }

  /** Fails the tasks that wait for a connection. */
  void FailWaiting(ErrorCode code, const char *why) {
    while (!waiting_.empty()) {
      Task *t = waiting_.front();
      waiting_.pop_front();
      table_.Fail(t, code, why);
    }
  }

  /** Completes everything this transport still holds (at close or fatal error). */
  void FailAll(ErrorCode code, const char *why) {
    table_.FailAll(code, why);
    FailWaiting(code, why);
    Task *list = submitted_.Exchange(nullptr, MemOrder::kAcquire);
    while (list != nullptr) {
      Task *next = reinterpret_cast<Task *>(list->transport_cookie_);
      list->transport_cookie_ = 0;
      table_.Fail(list, code, why);
      list = next;
    }
  }

  ZmqClientOptions opt_;
  std::string endpoint_;
  zmq::context_t ctx_{1};
  std::mutex sock_mu_;  ///< the socket, the slots, the connection state (see the file comment)
  std::unique_ptr<zmq::socket_t> socket_;   ///< under sock_mu_; replaced by the network thread
  std::unique_ptr<zmq::socket_t> monitor_;  ///< network thread only
  int socket_fd_ = -1;                      ///< socket_'s ZMQ_FD; under sock_mu_
  /**
   * Under sock_mu_: the socket's last use was a recv that found nothing, so by the ZMQ_FD
   * rule its fd signals whatever comes next (a watcher may block on it without a recv).
   * Set by ReceiveBatch, cleared by SendOnSocket; a new socket's first use is a send.
   */
  bool armed_ = false;
  std::deque<zmq::message_t> controls_;     ///< control messages a caller received; under sock_mu_
  ZmqDoorbell doorbell_;
  std::promise<Status> first_result_;
  ConnectAnswer first_answer_;
  mutable std::mutex answer_mu_;  ///< guards answer_ (read rarely, written per handshake)
  ConnectAnswer answer_;          ///< the runtime's answer to the latest accepted handshake
  bool first_done_ = false;
  bool bye_sent_ = false;
  State state_ = State::kConnecting;
  bool down_expired_ = false;
  u64 down_since_ = 0;
  u64 connect_deadline_ = 0;
  u64 handshake_retry_ns_ = 0;  ///< network thread: when to ask a full runtime again (0: never)
  u64 max_request_bytes_ = 0;   ///< the runtime's announced limit (0: none); under sock_mu_
  u64 monitor_serial_ = 0;
  ZmqRequestTable table_;         ///< tasks on the wire; its slots under sock_mu_
  std::deque<Task *> waiting_;    ///< submitted while not connected
  std::vector<char> encode_;      ///< request buffer (reused; a large one goes with its message)
  Atomic<Task *> submitted_{nullptr};  ///< newest first, linked through transport_cookie_
  Atomic<u32> stop_;
  Atomic<u32> runtime_pid_;
  Atomic<u64> reconnects_;
  Atomic<u64> losses_;
  Atomic<u32> wake_asked_;    ///< a caller asked the network thread for a pass
  Atomic<u64> received_by_caller_;
  Atomic<u64> late_wakeups_;  ///< see ZmqClientStats
};

}  // namespace chi
