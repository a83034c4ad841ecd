// ZmqClientTransport: a pure client's connection to its runtime over ZeroMQ
// (DEALER to the runtime's ROUTER, ipc or tcp). Callers hand tasks over on a
// lock-free list; one network thread encodes, sends, matches answers by request
// id and completes the tasks. A lost runtime fails outstanding tasks with
// kPeerDead (kShutdown when it said goodbye), then the thread reconnects and
// repeats the ClientConnect handshake; tasks sent meanwhile wait up to
// reconnect_sec for it. Invariant: every task handed to Send is completed once.
#pragma once

#include <pthread.h>  // naming the network thread
#include <unistd.h>   // getpid, getuid

#include <climits>  // INT_MAX: wake every blocked sender
#include <cstring>  // memcpy of monitor events
#include <deque>    // tasks waiting for a connection
#include <future>   // result of the first handshake
#include <memory>   // unique_ptr
#include <mutex>    // the latest handshake answer
#include <string>   // endpoint
#include <thread>   // the network thread
#include <vector>   // request slots, encode buffer

#include <zmq.hpp>  // cppzmq

#include "chi/core/atomic.h"                   // submit list, counters
#include "chi/core/futex.h"                    // back-pressure parking
#include "chi/runtime/worker.h"                // NowNs
#include "chi/task/task_ops.h"                 // CompleteTask
#include "chi/transport/client_connect.h"      // ConnectRequest/Answer
#include "chi/transport/request_dispatcher.h"  // EncodeRequest, DecodeAnswer
#include "chi/transport/zmq_common.h"          // endpoints, control ids, doorbell

namespace chi {

/** How a ZeroMQ client finds and keeps its runtime. */
struct ZmqClientOptions {
  std::string mode = "tcp";        ///< "ipc" or "tcp"
  u32 port = 9413;
  double connect_timeout_sec = 5;  ///< first handshake must succeed within this
  double reconnect_sec = 10;       ///< after a loss, tasks wait this long for the runtime
  u64 max_inflight = 1u << 16;     ///< Send blocks beyond this many unanswered tasks
  u64 spin_ns = 20000;             ///< busy polling after activity before sleeping
};

/** Counters of a client connection. */
struct ZmqClientStats {
  u64 outstanding = 0;   ///< tasks sent, not answered
  u64 reconnects = 0;    ///< handshakes after the first
  u64 peer_losses = 0;   ///< times the runtime went away
};

/** A pure client's ZeroMQ connection (see the file comment). */
class ZmqClientTransport final : public ClientTransport {
 public:
  ~ZmqClientTransport() override { Close(); }

  /**
   * Connects to the runtime on this node and performs the handshake. Fails with
   * kTimeout when no runtime answers in time, or with the runtime's refusal.
   */
  static Status Connect(const ZmqClientOptions &opt, std::unique_ptr<ZmqClientTransport> *out,
                        ConnectAnswer *answer = nullptr) {
    if (opt.mode != "ipc" && opt.mode != "tcp") {
      return Status::Errorf(ErrorCode::kInvalidArgument, "ZeroMQ transport '%.16s': use ipc or tcp",
                            opt.mode.c_str());
    }
    std::unique_ptr<ZmqClientTransport> t(new ZmqClientTransport(opt));
    if (!t->doorbell_.ok()) return Status::Error(ErrorCode::kIo, "eventfd for the network thread");
    std::future<Status> first = t->first_result_.get_future();
    t->thread_ = std::thread([raw = t.get()] { raw->Run(); });
    Status st = first.get();
    if (!st.ok()) {
      t->Close();
      return st;
    }
    if (answer != nullptr) *answer = t->first_answer_;
    *out = std::move(t);
    return Status::Ok();
  }

  /** Hands a stamped task to the network thread; false once closed. Blocks when too many are in flight. */
  bool Send(Task *t) override {
    senders_.FetchAdd(1, MemOrder::kSeqCst);  // seq_cst: Close's flag and our count order totally
    if (closed_.Load(MemOrder::kSeqCst) != 0) {
      senders_.FetchSub(1, MemOrder::kRelease);
      return false;
    }
    WaitForRoom();
    inflight_.FetchAdd(1, MemOrder::kRelaxed);
    Task *head = submitted_.Load(MemOrder::kRelaxed);
    do {
      t->transport_cookie_ = reinterpret_cast<u64>(head);
      // release: the task's fields are visible to the network thread that takes the list.
    } while (!submitted_.CompareExchange(head, t, MemOrder::kRelease));
    senders_.FetchSub(1, MemOrder::kRelease);
    doorbell_.Ring();
    return true;
  }

  /** Fails what is pending with kShutdown, says goodbye, closes the socket. Idempotent. */
  void Close() override {
    if (closed_.Exchange(1, MemOrder::kSeqCst) != 0) return;
    while (senders_.Load(MemOrder::kAcquire) != 0) CpuRelax();  // a Send mid-push finishes first
    stop_.Store(1, MemOrder::kRelease);
    doorbell_.Ring();
    if (thread_.joinable()) thread_.join();
    ctx_.close();
  }

  const char *Name() const override { return opt_.mode == "ipc" ? "ipc" : "tcp"; }

  /** The runtime process currently connected (changes after a reconnect; 0 while down). */
  u32 RuntimePid() const { return runtime_pid_.Load(MemOrder::kAcquire); }

  /** The handshake answer of the runtime last connected (replaced by every reconnect). */
  bool CopyConnectAnswer(ConnectAnswer *out) const override {
    std::lock_guard<std::mutex> lock(answer_mu_);
    *out = answer_;
    return true;
  }

  /** A snapshot of the counters (any thread). */
  ZmqClientStats Stats() const {
    ZmqClientStats s;
    s.outstanding = outstanding_.Load(MemOrder::kRelaxed);
    s.reconnects = reconnects_.Load(MemOrder::kRelaxed);
    s.peer_losses = losses_.Load(MemOrder::kRelaxed);
    return s;
  }

 private:
  enum class State { kConnecting, kReady, kDown };
  static constexpr u32 kRecvBatch = 64;
  static constexpr u64 kTimerNs = 50000000ull;  ///< timer granularity while idle

  explicit ZmqClientTransport(const ZmqClientOptions &opt)
      : opt_(opt), endpoint_(ZmqEndpoint(opt.mode, opt.port)) {}

  /** Back-pressure: park while max_inflight tasks are unanswered. */
  void WaitForRoom() {
    for (u32 spins = 0; inflight_.Load(MemOrder::kAcquire) >= opt_.max_inflight; ++spins) {
      if (spins < 1024) {
        CpuRelax();
        continue;
      }
      const u32 seen = room_.Load(MemOrder::kAcquire);
      room_waiters_.FetchAdd(1, MemOrder::kSeqCst);  // seq_cst: visible before the re-check
      if (inflight_.Load(MemOrder::kSeqCst) >= opt_.max_inflight) {
        FutexWait(room_.Raw(), seen, 1000000);
      }
      room_waiters_.FetchSub(1, MemOrder::kRelaxed);
    }
  }

  // ---- Network thread ----

  void Run() {
    pthread_setname_np(pthread_self(), "chi-zmq-client");
    const u64 start = NowNs();
    connect_deadline_ = start + static_cast<u64>(opt_.connect_timeout_sec * 1e9);
    try {
      OpenSocket();
      Loop();
    } catch (const zmq::error_t &e) {
      FailAll(ErrorCode::kIo, "ZeroMQ error in the client transport");
      if (!first_done_) {
        first_done_ = true;
        first_result_.set_value(Status::Errorf(ErrorCode::kIo, "ZeroMQ: %s", e.what()));
      }
    }
    FailAll(ErrorCode::kShutdown, "the client closed its connection to the runtime");
    if (state_ == State::kReady && socket_) {
      socket_->set(zmq::sockopt::linger, 100);  // long enough for the Bye, short at exit
      bye_sent_ = socket_->send(MakeControl(zmq_control::kBye), zmq::send_flags::dontwait)
                      .has_value();
    }
    CloseSocket();
  }

  void Loop() {
    u64 last_busy = NowNs();
    u64 next_timer = last_busy + kTimerNs;
    while (stop_.Load(MemOrder::kAcquire) == 0) {
      bool busy = TakeSubmitted();
      busy |= ReceiveBatch();
      busy |= ReadMonitor();
      const u64 now = NowNs();
      if (now >= next_timer) {
        Timers(now);
        next_timer = now + kTimerNs;
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
      if (submitted_.Load(MemOrder::kAcquire) == nullptr && stop_.Load(MemOrder::kAcquire) == 0) {
        zmq::pollitem_t items[3] = {{socket_->handle(), 0, ZMQ_POLLIN, 0},
                                    {monitor_->handle(), 0, ZMQ_POLLIN, 0},
                                    {nullptr, doorbell_.fd(), ZMQ_POLLIN, 0}};
        zmq::poll(items, 3, std::chrono::milliseconds(kTimerNs / 1000000));
      }
      doorbell_.Awake();
      last_busy = NowNs();
    }
  }

  /** A fresh DEALER (and its monitor), connected, with the handshake queued on it. */
  void OpenSocket() {
    socket_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
    ConfigureZmqSocket(*socket_);
    socket_->set(zmq::sockopt::reconnect_ivl, 20);
    socket_->set(zmq::sockopt::reconnect_ivl_max, 200);
    socket_->set(zmq::sockopt::heartbeat_ivl, 500);      // a hung runtime is noticed in ~2 s
    socket_->set(zmq::sockopt::heartbeat_timeout, 2000);
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
    ConnectRequest req;
    req.pid = static_cast<u32>(getpid());
    req.uid = static_cast<u32>(getuid());
    req.mode = opt_.mode;
    socket_->send(MakeControl(zmq_control::kConnect, req), zmq::send_flags::none);
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
        Finish(t, ErrorCode::kPeerDead, "no runtime: it went away and did not come back in time");
      } else {
        waiting_.push_back(t);
      }
    }
    return true;
  }

  void SendTask(Task *t) {
    u32 index;
    if (!free_slots_.empty()) {
      index = free_slots_.back();
      free_slots_.pop_back();
    } else {
      index = static_cast<u32>(slots_.size());
      slots_.push_back(Slot{});
    }
    Slot &s = slots_[index];
    s.task = t;
    const u64 request_id = (static_cast<u64>(s.generation) << 32) | index;
    EncodeRequest(t, request_id, &encode_);
    outstanding_.FetchAdd(1, MemOrder::kRelaxed);
    socket_->send(zmq::message_t(encode_.data(), encode_.size()), zmq::send_flags::none);
  }

  bool ReceiveBatch() {
    u32 got = 0;
    for (; got < kRecvBatch && socket_; ++got) {
      zmq::message_t msg;
      if (!socket_->recv(msg, zmq::recv_flags::dontwait)) break;
      while (msg.more()) {  // the runtime sends one frame; skip anything else
        zmq::message_t extra;
        if (!socket_->recv(extra, zmq::recv_flags::none) || !extra.more()) break;
      }
      if (msg.size() < kEnvelopeHeaderBytes) continue;
      const u64 id = EnvelopeId(msg.data());
      if (id & zmq_control::kBit) {
        HandleControl(id, msg);
        continue;
      }
      const u32 index = static_cast<u32>(id);
      const u32 generation = static_cast<u32>(id >> 32);
      if (index >= slots_.size() || slots_[index].task == nullptr ||
          slots_[index].generation != generation) {
        continue;  // an answer to a task already failed by a peer loss
      }
      Task *t = slots_[index].task;
      ReleaseSlot(index);
      DecodeAnswer(t, static_cast<const char *>(msg.data()), msg.size());
      Complete(t);
    }
    return got > 0;
  }

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
    runtime_pid_.Store(answer.runtime_pid, MemOrder::kRelease);
    state_ = State::kReady;
    down_expired_ = false;
    while (!waiting_.empty()) {
      Task *t = waiting_.front();
      waiting_.pop_front();
      SendTask(t);
    }
  }

  /** Reads connection events; a disconnect is a lost runtime. */
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
      if (kind == ZMQ_EVENT_DISCONNECTED) {
        if (state_ == State::kReady) {
          PeerLost(ErrorCode::kPeerDead, "the runtime went away before answering");
        } else {  // lost mid-handshake: start over so the handshake is sent again
          CloseSocket();
          OpenSocket();
        }
        return true;  // the monitor was replaced
      }
    }
  }

  /** The runtime is gone: fail what it holds and reconnect on a fresh socket. */
  void PeerLost(ErrorCode code, const char *why) {
    losses_.FetchAdd(1, MemOrder::kRelaxed);
    runtime_pid_.Store(0, MemOrder::kRelease);
    for (u32 i = 0; i < slots_.size(); ++i) {
      if (Task *t = slots_[i].task) {
        ReleaseSlot(i);
        Finish(t, code, why);
      }
    }
    state_ = State::kDown;
    down_since_ = NowNs();
    CloseSocket();
    OpenSocket();
  }

  void Timers(u64 now) {
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

  void FailWaiting(ErrorCode code, const char *why) {
    while (!waiting_.empty()) {
      Task *t = waiting_.front();
      waiting_.pop_front();
      Finish(t, code, why);
    }
  }

  /** Completes everything this transport still holds (at close or fatal error). */
  void FailAll(ErrorCode code, const char *why) {
    for (u32 i = 0; i < slots_.size(); ++i) {
      if (Task *t = slots_[i].task) {
        ReleaseSlot(i);
        Finish(t, code, why);
      }
    }
    FailWaiting(code, why);
    Task *list = submitted_.Exchange(nullptr, MemOrder::kAcquire);
    while (list != nullptr) {
      Task *next = reinterpret_cast<Task *>(list->transport_cookie_);
      list->transport_cookie_ = 0;
      Finish(list, code, why);
      list = next;
    }
  }

  void ReleaseSlot(u32 index) {
    slots_[index].task = nullptr;
    ++slots_[index].generation;  // a late answer for the old occupant no longer matches
    free_slots_.push_back(index);
    outstanding_.FetchSub(1, MemOrder::kRelaxed);
  }

  void Finish(Task *t, ErrorCode code, const char *why) {
    t->SetError(code, why);
    Complete(t);
  }

  void Complete(Task *t) {
    CompleteTask(t);
    inflight_.FetchSub(1, MemOrder::kSeqCst);  // seq_cst: pairs with WaitForRoom's re-check
    if (room_waiters_.Load(MemOrder::kSeqCst) != 0) {
      room_.FetchAdd(1, MemOrder::kRelease);
      FutexWake(room_.Raw(), INT_MAX);
    }
  }

  /** A sent task awaiting its answer; generation tells a stale answer from a current one. */
  struct Slot {
    Task *task = nullptr;
    u32 generation = 1;
  };

  ZmqClientOptions opt_;
  std::string endpoint_;
  zmq::context_t ctx_{1};
  std::unique_ptr<zmq::socket_t> socket_;   ///< network thread only
  std::unique_ptr<zmq::socket_t> monitor_;  ///< network thread only
  std::thread thread_;
  ZmqDoorbell doorbell_;
  std::promise<Status> first_result_;
  ConnectAnswer first_answer_;
  mutable std::mutex answer_mu_;  ///< guards answer_ (read rarely, written per handshake)
  ConnectAnswer answer_;          ///< the last accepted handshake answer (Answer)
  bool first_done_ = false;
  bool bye_sent_ = false;
  State state_ = State::kConnecting;
  bool down_expired_ = false;
  u64 down_since_ = 0;
  u64 connect_deadline_ = 0;
  u64 monitor_serial_ = 0;
  std::vector<Slot> slots_;       ///< request id low half = index
  std::vector<u32> free_slots_;
  std::deque<Task *> waiting_;    ///< submitted while not connected
  std::vector<char> encode_;      ///< reused request buffer
  Atomic<Task *> submitted_{nullptr};  ///< newest first, linked through transport_cookie_
  Atomic<u32> closed_;
  Atomic<u32> stop_;
  Atomic<u32> senders_;
  Atomic<u64> inflight_;
  Atomic<u32> room_;
  Atomic<u32> room_waiters_;
  Atomic<u32> runtime_pid_;
  Atomic<u64> outstanding_;
  Atomic<u64> reconnects_;
  Atomic<u64> losses_;
};

}  // namespace chi
