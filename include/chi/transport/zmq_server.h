// ZmqServer: the runtime's network worker for pure clients over ZeroMQ. One
// thread serves a ROUTER socket per endpoint (ipc and tcp on loopback): it answers
// ClientConnect handshakes and decodes task requests through the RequestDispatcher.
// A worker finishing a task sends the answer itself when the sockets' lock is free
// (else it queues it for the network thread), so an answer needs no hand-off. The
// network thread sleeps in poll() on the sockets' ZMQ_FDs without the lock.
// Invariants: sockets and the peer table are used only under sock_mu_, and by the
// ZMQ_FD rule (zmq_common.h): the network thread receives until EAGAIN or passes
// again, and a worker that finds requests waiting after its send asks for a pass.
#pragma once

#include <pthread.h>  // naming the network thread
#include <unistd.h>   // unlink of the ipc socket file

#include <cerrno>         // EINTR from poll
#include <cstring>        // strlen
#include <future>         // start-up result of the network thread
#include <mutex>          // the sockets' lock
#include <string>         // peer keys
#include <thread>         // the network thread
#include <unordered_map>  // peers by routing id
#include <vector>         // answer buffers, free slots

#include <zmq.hpp>  // cppzmq

#include "chi/core/atomic.h"                  // answer list, counters
#include "chi/core/futex.h"                   // waiting for Open
#include "chi/runtime/worker.h"               // NowNs
#include "chi/transport/client_connect.h"     // ConnectRequest/Answer, ProcessAlive
#include "chi/transport/request_dispatcher.h" // Dispatch, EncodeAnswer
#include "chi/transport/zmq_common.h"         // endpoints, control ids, doorbell
#include "chi/transport/zmq_server_answers.h" // answer slots, their pool and queue

namespace chi {

/** Counters of a ZeroMQ server (read by the admin Monitor). */
struct ZmqServerStats {
  u64 clients = 0;            ///< registered clients now
  u64 clients_reaped = 0;     ///< clients forgotten because their process died
  u64 tasks_outstanding = 0;  ///< requests dispatched, answer not yet sent (a Monitor counts itself)
  u64 bytes_held = 0;         ///< answer buffers pooled for reuse (bounded)
  u64 requests = 0;           ///< task requests received
  u64 requests_refused = 0;   ///< requests answered with an error (malformed, not connected, ...)
  u64 answers_dropped = 0;    ///< answers whose client was gone
  u64 answers_by_worker = 0;  ///< answers the finishing worker sent itself
  /**
   * Requests the network thread found waiting after a sleep that ran to its timeout (the
   * reaper's): a wake-up that never came (the ZMQ_FD rule broken), or, rarely, a request
   * that landed just then. Expected 0.
   */
  u64 late_wakeups = 0;
};

/** Serves pure clients over ZeroMQ ROUTER sockets (ipc and/or tcp). */
class ZmqServer final : public TaskCompleter {
 public:
  struct Options {
    u32 port = 0;
    bool ipc = true;                              ///< bind the per-user ipc endpoint
    bool tcp = true;                              ///< bind tcp on 127.0.0.1:port
    u64 max_request_bytes = kZmqMaxRequestBytes;  ///< larger messages drop the connection
    u32 max_clients = 4096;                       ///< handshakes beyond this are refused
    u64 reap_interval_ns = 100000000ull;          ///< how often dead client pids are looked for
    u64 spin_ns = 20000;                          ///< busy polling after activity before sleeping
  };

  ZmqServer() = default;
  ~ZmqServer() { Stop(); }
  ZmqServer(const ZmqServer &) = delete;
  ZmqServer &operator=(const ZmqServer &) = delete;

  /**
   * Binds the endpoints on a new network thread. Handshakes and tasks queue in
   * ZeroMQ until Open() supplies the answer clients get. Fails (kAlreadyExists)
   * when another process holds the tcp port.
   */
  Status Start(RequestDispatcher *dispatcher, const Options &opt) {
    if (thread_.joinable()) return Status::Error(ErrorCode::kInvalidArgument, "already started");
    if (!doorbell_.ok()) return Status::Error(ErrorCode::kIo, "eventfd for the network thread");
    dispatcher_ = dispatcher;
    opt_ = opt;
    std::promise<Status> started;
    std::future<Status> result = started.get_future();
    thread_ = std::thread([this, &started] { Run(&started); });
    Status st = result.get();
    if (!st.ok()) {
      thread_.join();
      ctx_.close();
    }
    return st;
  }

  /** Starts serving; every accepted client gets `answer` (plus its client id). */
  void Open(const ConnectAnswer &answer) {
    template_ = answer;
    open_.Store(1, MemOrder::kRelease);  // release: template_ is complete before it is read
    FutexWake(open_.Raw(), 1);
  }

  /** Refuses new tasks (answered with kShutdown); handshakes too. Answers still flow. */
  void BeginShutdown() {
    shutting_down_.Store(1, MemOrder::kRelease);
    doorbell_.Ring();
  }

  /**
   * Sends every pending answer, tells each client the runtime stops, closes
   * the sockets and joins the thread. Call after the workers have stopped.
   */
  void Stop() {
    if (!thread_.joinable()) return;
    stop_.Store(1, MemOrder::kRelease);
    open_.Store(1, MemOrder::kRelease);  // a server never opened must still wake up
    FutexWake(open_.Raw(), 1);
    doorbell_.Ring();
    thread_.join();
    ctx_.close();
  }

  /**
   * Worker side: a remote task finished; sends its answer when the sockets are free,
   * else queues it for the network thread.
   */
  void OnComplete(Task *t) override {
    auto *slot = reinterpret_cast<ZmqAnswerSlot *>(t->transport_cookie_);
    RequestDispatcher::EncodeAnswer(t, &slot->bytes);
    if (!SendNow(slot)) QueueAnswer(slot);
  }

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
    s.answers_by_worker = sent_by_worker_.Load(MemOrder::kRelaxed);
    s.late_wakeups = late_wakeups_.Load(MemOrder::kRelaxed);
    return s;
  }

 private:
  static constexpr u32 kRecvBatch = 64;           ///< messages per socket per pass
  /** Beyond this many tasks in flight, workers leave answers to the network thread. */
  static constexpr u64 kDirectMaxOutstanding = 4;

  /** A request taken off a socket under the lock, dispatched after it (see Pass). */
  struct Pending {
    ZmqAnswerSlot *slot;  ///< where its answer goes
    zmq::message_t body;  ///< the request envelope
  };
  /** A registered client. */
  struct Peer {
    u32 pid = 0;
    u64 client_id = 0;
    u64 outstanding = 0;
  };

  /**
   * A worker: sends slot's answer itself and true, unless the network thread (or another
   * worker) holds the sockets, the queue holds older answers (they go first), or many
   * tasks are in flight (the thread sends those in batches, one events check each).
   */
  bool SendNow(ZmqAnswerSlot *slot) {
    // A task that completes at once while the network thread dispatches it inside its pass
    // (a GPU-route task failed at once) must not try-lock the mutex that thread holds.
    if (HoldsSockets()) return false;
    if (outstanding_.Load(MemOrder::kRelaxed) > kDirectMaxOutstanding) return false;
    // relaxed: a hint; an answer queued after this check is still sent by the thread.
    if (answers_.WaitingHint()) return false;
    std::unique_lock<std::mutex> lock(sock_mu_, std::try_to_lock);
    if (!lock.owns_lock() || sockets_closed_) return false;
    const int i = static_cast<u8>(slot->peer[0]);
    DeliverAnswer(slot);
    sent_by_worker_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
    bool readable = true;  // on error, let the network thread look
    try {
      // The ZMQ_FD rule: our send may have taken the fd's signal of requests now waiting.
      readable = ZmqReadable(*sockets_[i]);
    } catch (const zmq::error_t &) {
    }
    if (readable) {
      wake_asked_.Store(1, MemOrder::kRelaxed);  // relaxed: Ring's seq_cst fence publishes it
      doorbell_.Ring();
    }
    return true;
  }

  // ---- Network thread ----

  /** True on the network thread while it holds sock_mu_ (see SocketsHeld). */
  static bool &HoldsSockets() {
    static thread_local bool held = false;
    return held;
  }

  /** Marks the network thread's sock_mu_ sections, for SendNow's re-entry check. */
  struct SocketsHeld {
    SocketsHeld() { HoldsSockets() = true; }
    ~SocketsHeld() { HoldsSockets() = false; }
    SocketsHeld(const SocketsHeld &) = delete;
    SocketsHeld &operator=(const SocketsHeld &) = delete;
  };

  /** The network thread: binds, waits for Open, serves until Stop, then says goodbye. */
  void Run(std::promise<Status> *started) {
    pthread_setname_np(pthread_self(), "chi-zmq-server");
    Status st = Bind();
    started->set_value(st);
    if (!st.ok()) {
      CloseSockets();
      return;
    }
    while (open_.Load(MemOrder::kAcquire) == 0) FutexWait(open_.Raw(), 0);
    Loop();
    std::lock_guard<std::mutex> lock(sock_mu_);
    const SocketsHeld held;
    DrainAnswers();
    NotifyShutdown();
    CloseSockets();
    sockets_closed_ = true;
    pool_.Clear();
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

  /**
   * Passes over the sockets under their lock while there is work; between passes it
   * spins (spin_ns after work) or sleeps in poll() without the lock, so workers can send.
   */
  void Loop() {
    u64 last_busy = NowNs();
    next_reap_ = last_busy + opt_.reap_interval_ns;
    bool work = true;        // a pass is due
    bool timed_out = false;  // the sleep before this pass ran to its timeout
    while (stop_.Load(MemOrder::kAcquire) == 0) {
      if (work && Pass(timed_out)) last_busy = NowNs();
      timed_out = false;
      const u64 now = NowNs();
      if (now - last_busy < opt_.spin_ns) {  // spin on readiness, not on the lock
        work = Probe(0);
        if (!work) CpuRelax();
        continue;
      }
      doorbell_.PrepareSleep();
      if (!WorkAsked()) {
        // Until the next reap, rounded up: never before it is due.
        const u64 wait_ns = next_reap_ > now ? next_reap_ - now : 0;
        timed_out = !Probe(static_cast<long>((wait_ns + 999999) / 1000000));
      }
      doorbell_.Awake();
      work = true;
    }
  }

  /**
   * One pass: under the sockets' lock, queued answers, requests and the reaper; then,
   * without it, the requests it took while few were in flight are dispatched, so that a
   * worker finishing one at once finds the lock free and answers itself. True when busy.
   */
  bool Pass(bool after_timeout) {
    // relaxed: the doorbell's fences order it; this pass does what it asked for.
    wake_asked_.Store(0, MemOrder::kRelaxed);
    bool busy = false;
    {
      std::lock_guard<std::mutex> lock(sock_mu_);
      const SocketsHeld held;
      busy |= DrainAnswers();
      for (int i = 0; i < 2; ++i) {
        const u32 got = ReceiveBatch(i);
        // relaxed: a statistic. Requests waiting after a full sleep were never signalled.
        if (after_timeout && got != 0) late_wakeups_.FetchAdd(got, MemOrder::kRelaxed);
        busy |= got != 0;
      }
      const u64 now = NowNs();
      if (now >= next_reap_) {
        Reap();
        next_reap_ = now + opt_.reap_interval_ns;
      }
    }
    DispatchPending();
    return busy;
  }

  /** Submits the requests taken so far, in order; a refused one's error answer is queued. */
  void DispatchPending() {
    for (Pending &p : pending_) {
      const char *data = static_cast<const char *>(p.body.data());
      if (dispatcher_->Dispatch(data, p.body.size(), this, reinterpret_cast<u64>(p.slot),
                                &p.slot->bytes)) {
        continue;  // the task owns the slot now: it may be answered already
      }
      refused_.FetchAdd(1, MemOrder::kRelaxed);
      QueueAnswer(p.slot);  // counted as outstanding when taken; delivered next pass
    }
    pending_.clear();
  }

  /** Queues an encoded answer for the network thread's next pass (any thread). */
  void QueueAnswer(ZmqAnswerSlot *slot) {
    answers_.Push(slot);
    doorbell_.Ring();
  }

  /** True when answers are queued or a worker asked for a pass (re-read after PrepareSleep). */
  bool WorkAsked() const {
    return answers_.Waiting() ||
           wake_asked_.Load(MemOrder::kRelaxed) != 0 ||  // relaxed: the doorbell's fences order it
           stop_.Load(MemOrder::kAcquire) != 0;
  }

  /**
   * Waits up to timeout_ms for a socket (by its ZMQ_FD, without the lock: by the ZMQ_FD
   * rule whoever used a socket left it so that the fd signals what comes next) or the
   * doorbell; false when the time ran out.
   */
  bool Probe(long timeout_ms) {
    if (WorkAsked()) return true;
    zmq::pollitem_t items[3];
    int n = 0;
    for (int i = 0; i < 2; ++i) {
      if (socket_fds_[i] >= 0) items[n++] = {nullptr, socket_fds_[i], ZMQ_POLLIN, 0};
    }
    items[n++] = {nullptr, doorbell_.fd(), ZMQ_POLLIN, 0};
    const int rc = zmq_poll(items, n, timeout_ms);
    if (rc < 0 && zmq_errno() != EINTR) throw zmq::error_t();
    return rc != 0;  // a signal's interruption counts as a wake-up: look again
  }

  /**
   * Receives up to kRecvBatch messages from socket i; returns how many. A full batch asks
   * for another pass: more may wait, and the fd will not say so (the ZMQ_FD rule).
   */
  u32 ReceiveBatch(int i) {
    if (!sockets_[i]) return 0;
    zmq::socket_t &s = *sockets_[i];
    u32 got = 0;
    for (; got < kRecvBatch; ++got) {
      zmq::message_t id;
      if (!s.recv(id, zmq::recv_flags::dontwait)) break;
      zmq::message_t payload;
      bool one_frame = id.more() && s.recv(payload, zmq::recv_flags::none).has_value();
      while (payload.more()) {  // a well-behaved DEALER sends exactly one frame
        one_frame = false;
        if (!s.recv(payload, zmq::recv_flags::none)) break;
      }
      std::string peer(1, static_cast<char>(i));
      peer.append(static_cast<const char *>(id.data()), id.size());
      if (!one_frame) {
        Refuse(peer, 0, ErrorCode::kMalformed, "a request must be exactly one frame");
        continue;
      }
      Handle(peer, std::move(payload));
    }
    // relaxed: read by this thread, in its next Probe.
    if (got == kRecvBatch) wake_asked_.Store(1, MemOrder::kRelaxed);
    return got;
  }

  /**
   * A task request (or control message) from `peer`: taken for dispatch after the pass
   * (counted outstanding from here), or answered with an error.
   */
  void Handle(const std::string &peer, zmq::message_t &&msg) {
    const char *data = static_cast<const char *>(msg.data());
    if (msg.size() < kEnvelopeHeaderBytes) {
      Refuse(peer, 0, ErrorCode::kTruncated, "request shorter than its 8-byte header");
      return;
    }
    const u64 id = EnvelopeId(data);
    if (id & zmq_control::kBit) {
      HandleControl(peer, id, msg);
      return;
    }
    requests_.FetchAdd(1, MemOrder::kRelaxed);
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      Refuse(peer, id, ErrorCode::kInvalidArgument,
             "not connected: send the ClientConnect handshake first");
      return;
    }
    if (shutting_down_.Load(MemOrder::kAcquire) != 0) {
      Refuse(peer, id, ErrorCode::kShutdown, "the runtime is shutting down");
      return;
    }
    ZmqAnswerSlot *slot = pool_.Take();
    slot->peer = peer;
    // relaxed: the count is this thread's to raise; workers read it as a hint.
    const u64 outstanding = outstanding_.FetchAdd(1, MemOrder::kRelaxed) + 1;  // Monitor counts it
    ++it->second.outstanding;  // DeliverAnswer takes both back, answer or error
    pending_.push_back(Pending{slot, std::move(msg)});
    // Few in flight: dispatched after the pass, when a worker that finishes at once finds
    // the lock free and answers itself. Many: now, in order, so that the workers start
    // while the pass goes on (a stream's answers are this thread's anyway); waiting for
    // the pass to end cost a 256-task stream its overlap of receiving and running.
    if (outstanding > kDirectMaxOutstanding) DispatchPending();
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
      st = Status::Errorf(ErrorCode::kOutOfMemory, "the runtime already serves %u clients",
                          opt_.max_clients);
    }
    if (st.ok()) {
      Peer &p = peers_[peer];
      p.pid = req.pid;
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
    SendTo(peer, reply.data(), reply.size());
  }

  /** Answers request `id` with an error (id 0 when the request had none). */
  void Refuse(const std::string &peer, u64 id, ErrorCode code, const char *why) {
    refused_.FetchAdd(1, MemOrder::kRelaxed);
    RequestDispatcher::EncodeError(id, code, why, &error_);
    SendTo(peer, error_.data(), error_.size());
  }

  /** Sends [routing id][payload] on the peer's socket; a vanished peer drops it silently. */
  void SendTo(const std::string &peer, const void *data, size_t len) {
    zmq::socket_t *s = sockets_[static_cast<u8>(peer[0])].get();
    zmq::message_t id(peer.data() + 1, peer.size() - 1);
    zmq::message_t body(data, len);
    try {
      if (s->send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        s->send(body, zmq::send_flags::dontwait);
      }
    } catch (const zmq::error_t &) {
      dropped_.FetchAdd(1, MemOrder::kRelaxed);  // EHOSTUNREACH and friends: the peer is gone
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
      SendTo(slot->peer, slot->bytes.data(), slot->bytes.size());
      --it->second.outstanding;
    } else {
      dropped_.FetchAdd(1, MemOrder::kRelaxed);
    }
    outstanding_.FetchSub(1, MemOrder::kRelaxed);
    pool_.Give(slot);
  }

  /** Forgets clients whose process has died (their later answers are dropped). */
  void Reap() {
    for (auto it = peers_.begin(); it != peers_.end();) {
      if (it->second.pid != 0 && !ProcessAlive(it->second.pid)) {
        it = peers_.erase(it);
        reaped_.FetchAdd(1, MemOrder::kRelaxed);
      } else {
        ++it;
      }
    }
    clients_.Store(peers_.size(), MemOrder::kRelaxed);
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

  RequestDispatcher *dispatcher_ = nullptr;
  Options opt_;
  zmq::context_t ctx_{1};
  std::mutex sock_mu_;  ///< the sockets, peers_, pool_ and the scratch buffer
  std::unique_ptr<zmq::socket_t> sockets_[2];  ///< [0] ipc, [1] tcp; under sock_mu_
  int socket_fds_[2] = {-1, -1};               ///< their ZMQ_FDs; set before serving
  bool sockets_closed_ = false;                ///< under sock_mu_: late answers are dropped
  std::thread thread_;
  ZmqDoorbell doorbell_;
  ConnectAnswer template_;
  std::unordered_map<std::string, Peer> peers_;  ///< under sock_mu_
  ZmqAnswerPool pool_;                           ///< under sock_mu_
  std::vector<Pending> pending_;                 ///< network thread only: taken, not dispatched
  std::vector<char> error_;                      ///< scratch error answer; under sock_mu_
  u64 next_client_id_ = 0;
  u64 next_reap_ = 0;  ///< network thread: when Reap runs next
  bool ipc_bound_ = false;
  ZmqAnswerQueue answers_;  ///< finished answers for the network thread
  Atomic<u32> open_;
  Atomic<u32> stop_;
  Atomic<u32> shutting_down_;
  Atomic<u64> clients_;
  Atomic<u64> reaped_;
  Atomic<u64> outstanding_;
  Atomic<u64> requests_;
  Atomic<u64> refused_;
  Atomic<u64> dropped_;
  Atomic<u64> sent_by_worker_;
  Atomic<u32> wake_asked_;  ///< a worker took a socket's wake-up: the thread must look
  Atomic<u64> late_wakeups_;  ///< see ZmqServerStats
};

}  // namespace chi
