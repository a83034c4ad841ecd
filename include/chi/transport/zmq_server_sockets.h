// The socket half of the ZeroMQ server (zmq_server.h): its options and counters, the
// ROUTER sockets (bound per endpoint, closed with the ipc file removed), the table of
// registered clients (handshakes, goodbyes, the reaper of dead pids and closed connections,
// the shutdown notice),
// and the sending of answers and errors. A base class only: ZmqServer's network worker
// drives it.
// Invariants: sockets, the peer table, the slot pool and the scratch buffer are used
// only under sock_mu_; a send on the network worker marks its socket due (due_), since
// by the ZMQ_FD rule (zmq_common.h) it may have taken that fd's signal.
#pragma once

#include <unistd.h>  // unlink of the ipc socket file

#include <cerrno>         // EADDRINUSE from bind
#include <cstring>        // strlen
#include <iterator>       // std::next while erasing peers
#include <memory>         // the sockets
#include <mutex>          // the sockets' lock
#include <string>         // peer keys
#include <string_view>    // Peer-Address fields
#include <unordered_map>  // peers by routing id
#include <vector>         // the scratch error answer

#include <zmq.hpp>  // cppzmq

#include "chi/core/atomic.h"                   // counters
#include "chi/core/caller.h"                   // Caller: who each client is
#include "chi/core/parse.h"                    // ParseUnsigned of peer credentials
#include "chi/runtime/worker.h"                // tls_current_worker: is this the network worker
#include "chi/transport/client_connect.h"      // ConnectRequest/Answer, ProcessAlive
#include "chi/transport/request_dispatcher.h"  // EncodeError
#include "chi/transport/zmq_common.h"          // endpoints, control ids, socket options
#include "chi/transport/zmq_server_answers.h"  // answer slots, their pool and queue

namespace chi {

/** Counters of a ZeroMQ server (read by the admin Monitor). */
struct ZmqServerStats {
  u64 clients = 0;            ///< registered clients now
  u64 clients_reaped = 0;     ///< clients forgotten: their process died or their connection closed
  u64 tasks_outstanding = 0;  ///< requests dispatched, answer not yet sent (a Monitor counts itself)
  u64 bytes_held = 0;         ///< answer buffers pooled for reuse (bounded)
  u64 requests = 0;           ///< task requests received
  u64 requests_refused = 0;   ///< requests answered with an error (malformed, not connected, ...)
  u64 answers_dropped = 0;    ///< answers whose client was gone
  u64 sleeps = 0;             ///< times the network worker slept in poll()
  /**
   * Requests the network worker found waiting after a sleep that ran to its timeout (the
   * reaper's): a wake-up that never came (the ZMQ_FD rule broken), or, rarely, a request
   * that landed just then. Expected 0.
   */
  u64 late_wakeups = 0;
  /**
   * Requests taken in by the rescue thread while a task held the network worker without
   * yielding (poller_rescue.h); they ran on the low-latency workers.
   */
  u64 rescued = 0;
};

/** How a ZeroMQ server binds and what it accepts. */
struct ZmqServerOptions {
  u32 port = 0;
  bool ipc = true;                              ///< bind the per-user ipc endpoint
  bool tcp = true;                              ///< bind tcp on 127.0.0.1:port
  u64 max_request_bytes = kZmqMaxRequestBytes;  ///< larger messages drop the connection
  u32 max_clients = 4096;                       ///< handshakes beyond this are refused
  u64 reap_interval_ns = 100000000ull;          ///< how often dead client pids are looked for
  /// How often clients that sent nothing since the last look are pinged, so that entries
  /// of connections closed without a goodbye (by a live process) do not pile up.
  u64 probe_interval_ns = 5000000000ull;
  u64 spin_ns = 0;  ///< the network worker's idle polling before it sleeps (zmq_worker_spin_us)
  /// The runtime's client key (RuntimeSegments::Key): a tcp client that presents it runs as
  /// the runtime's user. Empty: no tcp client is known as anyone.
  std::string client_key;
};

/** The sockets, clients and answers of a ZeroMQ server (see the file comment). */
class ZmqServerSockets {
 public:
  /** A snapshot of the counters (any thread). */
  ZmqServerStats Stats() const {
    ZmqServerStats s;
    s.clients = clients_.Load(MemOrder::kRelaxed);
    s.clients_reaped = reaped_.Load(MemOrder::kRelaxed);
    s.tasks_outstanding = outstanding_.Load(MemOrder::kRelaxed);
    s.bytes_held = pool_.BytesHeld();
    s.requests = requests_.Load(MemOrder::kRelaxed);
    s.requests_refused = refused_.Load(MemOrder::kRelaxed);
    s.answers_dropped = dropped_.Load(MemOrder::kRelaxed);
    s.sleeps = sleeps_.Load(MemOrder::kRelaxed);
    s.late_wakeups = late_wakeups_.Load(MemOrder::kRelaxed);
    s.rescued = rescued_.Load(MemOrder::kRelaxed);
    return s;
  }

 protected:
  /** A registered client. */
  struct Peer {
    ProcessIdentity who;  ///< pid and start time: a reused pid is not taken for the client
    Caller caller;        ///< who the transport says the client is (CallerOf its tasks)
    u64 client_id = 0;
    u64 outstanding = 0;
    bool active = true;  ///< sent something since the last probe round (ForgetUnreachable)
  };

  ZmqServerSockets() = default;
  ~ZmqServerSockets() = default;
  ZmqServerSockets(const ZmqServerSockets &) = delete;
  ZmqServerSockets &operator=(const ZmqServerSockets &) = delete;

  /** True on the network worker's thread. */
  bool OnNetworkWorker() const {
    return network_ != nullptr && tls_current_worker == network_;
  }

  /** Binds the wanted endpoints (kAlreadyExists when another process holds the port). */
  Status Bind() {
    try {
      const char *modes[2] = {"ipc", "tcp"};
      const bool want[2] = {opt_.ipc, opt_.tcp};
      for (int i = 0; i < 2; ++i) {
        if (!want[i]) continue;
        auto s = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::router);
        ConfigureZmqSocket(*s);
        s->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(opt_.max_request_bytes));
        // A send to a client whose connection is gone fails (EHOSTUNREACH) instead of
        // vanishing: that is how the table learns of connections closed without a goodbye.
        s->set(zmq::sockopt::router_mandatory, true);
        const std::string ep = ZmqEndpoint(modes[i], opt_.port);
        try {
          s->bind(ep);
        } catch (const zmq::error_t &e) {
          return Status::Errorf(e.num() == EADDRINUSE ? ErrorCode::kAlreadyExists : ErrorCode::kIo,
                                "cannot bind %s: %s%s", ep.c_str(), e.what(),
                                e.num() == EADDRINUSE ? " (another runtime or program uses the "
                                                        "port; set CHI_PORT)" : "");
        }
        socket_fds_[i] = s->get(zmq::sockopt::fd);
        sockets_[i] = std::move(s);
        ipc_bound_ = ipc_bound_ || i == 0;
      }
      return Status::Ok();
    } catch (const zmq::error_t &e) {
      return Status::Errorf(ErrorCode::kIo, "ZeroMQ server start: %s", e.what());
    }
  }

  /** A control message: a handshake (answered), a goodbye, or an unknown one (refused). */
  void HandleControl(const std::string &peer, u64 id, const zmq::message_t &msg) {
    if (id == zmq_control::kBye) {
      if (peers_.erase(peer) != 0) clients_.Store(peers_.size(), MemOrder::kRelaxed);
      return;
    }
    if (id != zmq_control::kConnect) {
      Refuse(peer, 0, ErrorCode::kMalformed, "unknown control message");
      return;
    }
    ConnectRequest req;
    ConnectAnswer answer = template_;
    Status st = ParseControl(msg, &req)
                    ? CheckConnectRequest(req)
                    : Status::Error(ErrorCode::kMalformed, "malformed ClientConnect request");
    if (st.ok() && shutting_down_.Load(MemOrder::kAcquire) != 0) {
      st = Status::Error(ErrorCode::kShutdown, "the runtime is shutting down");
    }
    if (st.ok() && peers_.size() >= opt_.max_clients && peers_.count(peer) == 0) {
      // Full: first forget the clients whose connection closed without a goodbye (at most
      // once per reap interval, so a flood of handshakes cannot turn into a flood of pings).
      const u64 now = NowNs();
      if (now >= next_sweep_) {
        next_sweep_ = now + opt_.reap_interval_ns;
        ForgetUnreachable(false);
      }
      if (peers_.size() >= opt_.max_clients) {
        st = Status::Errorf(ErrorCode::kOutOfMemory, "the runtime already serves %u clients",
                            opt_.max_clients);
      }
    }
    Caller caller;
    if (st.ok()) st = IdentifyPeer(peer, msg, req, &caller);
    if (st.ok()) {
      Peer &p = peers_[peer];
      p.caller = caller;
      // Its start time, read now while it waits for our answer (0 where /proc is missing).
      // Over ipc the kernel's pid; over tcp the client's word (used only to forget it).
      p.who = IdentityOf(caller.pid != 0 ? caller.pid : req.pid);
      p.active = true;
      p.client_id = ++next_client_id_;
      answer.client_id = p.client_id;
      clients_.Store(peers_.size(), MemOrder::kRelaxed);
    } else {
      refused_.FetchAdd(1, MemOrder::kRelaxed);
      answer = ConnectAnswer();
      answer.rc = static_cast<u32>(st.code());
      answer.msg = st.message();
    }
    zmq::message_t reply = MakeControl(zmq_control::kAccept, answer);
    if (!SendTo(peer, reply.data(), reply.size()) && st.ok()) {
      Forget(peers_.find(peer));  // its connection closed before the answer could go out
    }
  }

  /**
   * Who the client of a handshake is, from the transport, never from the request's ids:
   * over ipc the socket's credentials (SO_PEERCRED, which ZeroMQ reports in the message's
   * Peer-Address as "...:uid:gid:pid"), refused unless the runtime's user or root; over tcp
   * the runtime's user when the client presents the client key, else nobody it can name.
   */
  Status IdentifyPeer(const std::string &peer, const zmq::message_t &msg,
                      const ConnectRequest &req, Caller *out) const {
    if (static_cast<u8>(peer[0]) == 1) {  // tcp
      *out = Caller{Caller::Via::kTcp, 0,
                    KeysMatch(req.key, opt_.client_key) ? static_cast<u32>(getuid())
                                                        : Caller::kNoUid};
      return Status::Ok();
    }
    *out = Caller{Caller::Via::kIpc, 0, Caller::kNoUid};
    const char *address = zmq_msg_gets(msg.handle(), "Peer-Address");  // null: none
    if (!ParsePeerCredentials(address, &out->uid, &out->pid)) {
      return Status::Error(ErrorCode::kPermissionDenied,
                           "ipc handshake: the socket's peer credentials are unavailable");
    }
    if (!Caller::IsRuntimeUid(out->uid)) {
      return Status::Errorf(ErrorCode::kPermissionDenied,
                            "ipc client pid %u runs as uid %u; this runtime serves uid %u",
                            out->pid, out->uid, static_cast<u32>(getuid()));
    }
    return Status::Ok();
  }

  /** Reads uid and pid from the end of an ipc Peer-Address ("host:uid:gid:pid"). */
  static bool ParsePeerCredentials(const char *address, u32 *uid, u32 *pid) {
    if (address == nullptr) return false;
    const std::string_view a(address);
    u64 fields[3] = {0, 0, 0};  // uid, gid, pid
    size_t end = a.size();
    for (int k = 2; k >= 0; --k) {
      const size_t colon = a.rfind(':', end == 0 ? 0 : end - 1);
      if (colon == std::string_view::npos || colon + 1 > end ||
          !detail::ParseUnsigned(a.substr(colon + 1, end - colon - 1), 0xffffffffull,
                                 &fields[k])) {
        return false;
      }
      end = colon;
    }
    if (fields[2] == 0) return false;
    *uid = static_cast<u32>(fields[0]);
    *pid = static_cast<u32>(fields[2]);
    return true;
  }

  /** Answers request `id` with an error (id 0 when the request had none). */
  void Refuse(const std::string &peer, u64 id, ErrorCode code, const char *why) {
    refused_.FetchAdd(1, MemOrder::kRelaxed);
    RequestDispatcher::EncodeError(id, code, why, &error_);
    if (!SendTo(peer, error_.data(), error_.size())) dropped_.FetchAdd(1, MemOrder::kRelaxed);
  }

  /**
   * Sends [routing id][payload] on the peer's socket; false when it could not go out (the
   * peer's connection is gone, or the socket failed). On the network worker it marks the
   * socket due (our send may have taken its fd's signal).
   */
  bool SendTo(const std::string &peer, const void *data, size_t len) {
    return SendTo(peer, zmq::message_t(data, len));
  }

  /** SendTo with the payload as a message already (MessageOf: a large answer uncopied). */
  bool SendTo(const std::string &peer, zmq::message_t &&body) {
    const int i = static_cast<u8>(peer[0]);
    if (OnNetworkWorker()) due_ |= 1u << i;
    zmq::socket_t *s = sockets_[i].get();
    zmq::message_t id(peer.data() + 1, peer.size() - 1);
    try {
      // No high-water mark (ConfigureZmqSocket): a send never waits, so dontwait never fails.
      return s->send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait) &&
             s->send(body, zmq::send_flags::dontwait);
    } catch (const zmq::error_t &) {
      return false;  // EHOSTUNREACH (router_mandatory): the peer's connection is gone
    }
  }

  /** Drops a registered client (gone, or its process died); its later answers are dropped. */
  void Forget(std::unordered_map<std::string, Peer>::iterator it) {
    peers_.erase(it);
    reaped_.FetchAdd(1, MemOrder::kRelaxed);
    clients_.Store(peers_.size(), MemOrder::kRelaxed);
  }

  /**
   * Pings clients and forgets those whose connection is gone (the send fails). With
   * `quiet_only`, only clients that sent nothing since the last round and await no answer
   * (an answer's own send finds the others); the rest are marked for the next round.
   */
  void ForgetUnreachable(bool quiet_only) {
    const zmq::message_t ping = MakeControl(zmq_control::kPing);
    for (auto it = peers_.begin(); it != peers_.end();) {
      Peer &p = it->second;
      if (quiet_only && (p.active || p.outstanding != 0)) {
        p.active = false;
        ++it;
        continue;
      }
      auto next = std::next(it);
      if (!SendTo(it->first, ping.data(), ping.size())) Forget(it);
      it = next;
    }
  }

  /** Sends the answers workers queued, oldest first; true when there were any. */
  bool DrainAnswers() {
    ZmqAnswerSlot *fifo = answers_.TakeAll();
    if (fifo == nullptr) return false;
    while (fifo != nullptr) {
      ZmqAnswerSlot *slot = fifo;
      fifo = fifo->next;
      DeliverAnswer(slot);
    }
    return true;
  }

  /** Sends one answer to its client (dropped when the client is gone); under sock_mu_. */
  void DeliverAnswer(ZmqAnswerSlot *slot) {
    auto it = peers_.find(slot->peer);
    if (it != peers_.end()) {
      --it->second.outstanding;
      if (!SendTo(slot->peer, MessageOf(&slot->bytes))) {
        dropped_.FetchAdd(1, MemOrder::kRelaxed);
        Forget(it);  // its connection is gone: a reconnecting client comes with a new id
      }
    } else {
      dropped_.FetchAdd(1, MemOrder::kRelaxed);
    }
    outstanding_.FetchSub(1, MemOrder::kRelaxed);
    pool_.Give(slot);
  }

  /**
   * Forgets clients whose process has died, and every probe interval those whose
   * connection closed without a goodbye (their later answers are dropped).
   */
  void Reap(u64 now) {
    for (auto it = peers_.begin(); it != peers_.end();) {
      auto next = std::next(it);
      if (!IsProcessAlive(it->second.who)) Forget(it);
      it = next;
    }
    if (now >= next_probe_) {
      next_probe_ = now + opt_.probe_interval_ns;
      ForgetUnreachable(true);
    }
  }

  /** Tells every registered client that the runtime stops (they fail what is pending). */
  void NotifyShutdown() {
    for (const auto &kv : peers_) {
      zmq::message_t note = MakeControl(zmq_control::kShutdown);
      SendTo(kv.first, note.data(), note.size());
    }
    peers_.clear();
    clients_.Store(0, MemOrder::kRelaxed);
  }

  /** Closes the sockets and removes the ipc socket file (ZeroMQ leaves it behind). */
  void CloseSockets() {
    for (auto &s : sockets_) {
      if (s) s->close();
      s.reset();
    }
    if (ipc_bound_) {
      const std::string ep = ZmqEndpoint("ipc", opt_.port);
      unlink(ep.c_str() + std::strlen("ipc://"));
      ipc_bound_ = false;
    }
  }

  ZmqServerOptions opt_;
  zmq::context_t ctx_{1};
  std::mutex sock_mu_;  ///< the sockets, peers_, pool_ and the scratch buffer
  std::unique_ptr<zmq::socket_t> sockets_[2];  ///< [0] ipc, [1] tcp; under sock_mu_
  int socket_fds_[2] = {-1, -1};               ///< their ZMQ_FDs; set before serving
  bool sockets_closed_ = false;                ///< under sock_mu_: late answers are dropped
  bool ipc_bound_ = false;
  const Worker *network_ = nullptr;  ///< the network worker, while it runs
  u32 due_ = 0;  ///< network worker: sockets (bits) to pass without asking poll()
  ConnectAnswer template_;                       ///< what every accepted client is told
  std::unordered_map<std::string, Peer> peers_;  ///< under sock_mu_
  ZmqAnswerPool pool_;                           ///< under sock_mu_
  std::vector<char> error_;                      ///< scratch error answer; under sock_mu_
  u64 next_client_id_ = 0;
  u64 next_sweep_ = 0;  ///< under sock_mu_: when a full table may ping every client again
  u64 next_probe_ = 0;  ///< under sock_mu_: when quiet clients are pinged next (Reap)
  ZmqAnswerQueue answers_;  ///< finished answers for the network worker
  Atomic<u32> shutting_down_;
  Atomic<u64> clients_;
  Atomic<u64> reaped_;
  Atomic<u64> outstanding_;
  Atomic<u64> requests_;
  Atomic<u64> refused_;
  Atomic<u64> dropped_;
  Atomic<u64> sleeps_;
  Atomic<u64> late_wakeups_;  ///< see ZmqServerStats
  Atomic<u64> rescued_;       ///< see ZmqServerStats
};

}  // namespace chi
