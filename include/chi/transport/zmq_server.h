// ZmqServer: the runtime's network worker for pure clients over ZeroMQ. One
// thread owns a ROUTER socket per endpoint (ipc and tcp on loopback), answers
// ClientConnect handshakes, decodes task requests through the RequestDispatcher
// and sends the answers that workers hand back (OnComplete, any worker thread).
// Invariant: only the network thread touches sockets and the peer table;
// workers publish answers on a lock-free list and ring the doorbell.
#pragma once

#include <pthread.h>  // naming the network thread
#include <unistd.h>   // unlink of the ipc socket file

#include <cstring>        // strlen
#include <future>         // start-up result of the network thread
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

  /** Worker side: a remote task finished; queue its answer for the network thread. */
  void OnComplete(Task *t) override {
    auto *slot = reinterpret_cast<AnswerSlot *>(t->transport_cookie_);
    RequestDispatcher::EncodeAnswer(t, &slot->bytes);
    AnswerSlot *head = answers_.Load(MemOrder::kRelaxed);
    do {
      slot->next = head;
      // release: the encoded bytes are visible to the network thread that takes the list.
    } while (!answers_.CompareExchange(head, slot, MemOrder::kRelease));
    doorbell_.Ring();
  }

  /** A snapshot of the counters (any thread). */
  ZmqServerStats Stats() const {
    ZmqServerStats s;
    s.clients = clients_.Load(MemOrder::kRelaxed);
    s.clients_reaped = reaped_.Load(MemOrder::kRelaxed);
    s.tasks_outstanding = outstanding_.Load(MemOrder::kRelaxed);
    s.bytes_held = bytes_held_.Load(MemOrder::kRelaxed);
    s.requests = requests_.Load(MemOrder::kRelaxed);
    s.requests_refused = refused_.Load(MemOrder::kRelaxed);
    s.answers_dropped = dropped_.Load(MemOrder::kRelaxed);
    return s;
  }

 private:
  static constexpr u32 kRecvBatch = 64;           ///< messages per socket per pass
  static constexpr u64 kKeepBufferBytes = 1 << 20;  ///< larger answer buffers are not pooled
  static constexpr size_t kMaxFreeSlots = 1024;

  /** Where one remote task's answer goes, and its encoded bytes. */
  struct AnswerSlot {
    AnswerSlot *next = nullptr;
    std::string peer;          ///< socket index byte + routing id
    std::vector<char> bytes;   ///< the encoded answer (capacity reused)
  };
  /** A registered client. */
  struct Peer {
    u32 pid = 0;
    u64 client_id = 0;
    u64 outstanding = 0;
  };

  // ---- Network thread ----

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
    DrainAnswers();
    NotifyShutdown();
    CloseSockets();
    for (AnswerSlot *s : free_) delete s;
    free_.clear();
  }

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
        sockets_[i] = std::move(s);
        ipc_bound_ = ipc_bound_ || i == 0;
      }
      return Status::Ok();
    } catch (const zmq::error_t &e) {
      return Status::Errorf(ErrorCode::kIo, "ZeroMQ server start: %s", e.what());
    }
  }

  void Loop() {
    u64 last_busy = NowNs();
    u64 next_reap = last_busy + opt_.reap_interval_ns;
    while (stop_.Load(MemOrder::kAcquire) == 0) {
      bool busy = DrainAnswers();
      for (int i = 0; i < 2; ++i) busy |= ReceiveBatch(i);
      const u64 now = NowNs();
      if (now >= next_reap) {
        Reap();
        next_reap = now + opt_.reap_interval_ns;
      }
      if (busy) {
        last_busy = now;
        continue;
      }
      if (now - last_busy < opt_.spin_ns) {
        CpuRelax();
        continue;
      }
      doorbell_.PrepareSleep();
      if (answers_.Load(MemOrder::kAcquire) == nullptr && stop_.Load(MemOrder::kAcquire) == 0) {
        zmq::pollitem_t items[3];
        int n = 0;
        for (int i = 0; i < 2; ++i) {
          if (sockets_[i]) items[n++] = {sockets_[i]->handle(), 0, ZMQ_POLLIN, 0};
        }
        items[n++] = {nullptr, doorbell_.fd(), ZMQ_POLLIN, 0};
        const long wait_ms = static_cast<long>(opt_.reap_interval_ns / 1000000) + 1;
        zmq::poll(items, n, std::chrono::milliseconds(wait_ms));
      }
      doorbell_.Awake();
      last_busy = NowNs();  // one short spin after every wake-up
    }
  }

  /** Receives up to kRecvBatch messages from socket i; true when any arrived. */
  bool ReceiveBatch(int i) {
    if (!sockets_[i]) return false;
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
      Handle(peer, payload);
    }
    return got > 0;
  }

  void Handle(const std::string &peer, const zmq::message_t &msg) {
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
    AnswerSlot *slot = TakeSlot();
    slot->peer = peer;
    outstanding_.FetchAdd(1, MemOrder::kRelaxed);  // before the task can run (Monitor counts it)
    if (!dispatcher_->Dispatch(data, msg.size(), this, reinterpret_cast<u64>(slot), &error_)) {
      outstanding_.FetchSub(1, MemOrder::kRelaxed);
      refused_.FetchAdd(1, MemOrder::kRelaxed);
      SendTo(peer, error_.data(), error_.size());
      GiveSlot(slot);
      return;
    }
    ++it->second.outstanding;
  }

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
    // acquire: pairs with OnComplete's release; the encoded bytes are visible.
    AnswerSlot *list = answers_.Exchange(nullptr, MemOrder::kAcquire);
    if (list == nullptr) return false;
    AnswerSlot *fifo = nullptr;
    while (list != nullptr) {  // the list is newest first; reverse it
      AnswerSlot *next = list->next;
      list->next = fifo;
      fifo = list;
      list = next;
    }
    while (fifo != nullptr) {
      AnswerSlot *slot = fifo;
      fifo = fifo->next;
      auto it = peers_.find(slot->peer);
      if (it != peers_.end()) {
        SendTo(slot->peer, slot->bytes.data(), slot->bytes.size());
        --it->second.outstanding;
      } else {
        dropped_.FetchAdd(1, MemOrder::kRelaxed);
      }
      outstanding_.FetchSub(1, MemOrder::kRelaxed);
      GiveSlot(slot);
    }
    return true;
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

  AnswerSlot *TakeSlot() {
    if (free_.empty()) return new AnswerSlot();
    AnswerSlot *s = free_.back();
    free_.pop_back();
    pooled_bytes_ -= s->bytes.capacity();
    return s;
  }
  /** Pools a slot for reuse; large buffers and slots beyond the pool's bound are freed. */
  void GiveSlot(AnswerSlot *s) {
    if (free_.size() >= kMaxFreeSlots) {
      delete s;
      return;
    }
    if (s->bytes.capacity() > kKeepBufferBytes) std::vector<char>().swap(s->bytes);
    s->bytes.clear();
    pooled_bytes_ += s->bytes.capacity();
    free_.push_back(s);
    bytes_held_.Store(pooled_bytes_ + free_.size() * sizeof(AnswerSlot), MemOrder::kRelaxed);
  }

  RequestDispatcher *dispatcher_ = nullptr;
  Options opt_;
  zmq::context_t ctx_{1};
  std::unique_ptr<zmq::socket_t> sockets_[2];  ///< [0] ipc, [1] tcp
  std::thread thread_;
  ZmqDoorbell doorbell_;
  ConnectAnswer template_;
  std::unordered_map<std::string, Peer> peers_;  ///< network thread only
  std::vector<AnswerSlot *> free_;               ///< network thread only
  std::vector<char> error_;                      ///< network thread's scratch answer
  u64 next_client_id_ = 0;
  u64 pooled_bytes_ = 0;
  bool ipc_bound_ = false;
  Atomic<AnswerSlot *> answers_{nullptr};  ///< finished answers, newest first
  Atomic<u32> open_;
  Atomic<u32> stop_;
  Atomic<u32> shutting_down_;
  Atomic<u64> clients_;
  Atomic<u64> reaped_;
  Atomic<u64> outstanding_;
  Atomic<u64> bytes_held_;
  Atomic<u64> requests_;
  Atomic<u64> refused_;
  Atomic<u64> dropped_;
};

}  // namespace chi
