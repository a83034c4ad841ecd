// ZmqServer: the runtime's network worker for pure clients over ZeroMQ. A runtime Worker
// of its own (role kNetwork) serves a ROUTER socket per endpoint (ipc and tcp on
// loopback) as its external poller: it answers ClientConnect handshakes, decodes task
// requests through the RequestDispatcher and, while few are in flight, runs them itself
// (no hop to another thread) and sends each answer as the task finishes. Many in flight
// (a stream) go to the low-latency workers' lanes; a worker finishing one sends its
// answer when the sockets' lock is free, else queues it for the network worker. Idle, the
// network worker sleeps in poll() on the sockets' ZMQ_FDs and its doorbell, as a raw
// ZeroMQ server sleeps in recv: a request costs the wake-up raw ZeroMQ pays, no more.
// While a task holds the network worker without yielding, a rescue thread serves the
// sockets (poller_rescue.h). The sockets, the client table and the sending of answers
// are zmq_server_sockets.h.
// Invariants: sockets and the peer table are used only under sock_mu_, and by the
// ZMQ_FD rule (zmq_common.h): the network worker receives until EAGAIN or passes
// again, and another thread that finds requests waiting after its send asks for a pass.
#pragma once

#include <poll.h>  // the network worker's sleep on its fds

#include <cerrno>  // EINTR from poll
#include <memory>  // the network worker
#include <mutex>   // the sockets' lock
#include <string>  // peer keys
#include <vector>  // requests taken, not yet dispatched

#include <zmq.hpp>  // cppzmq

#include "chi/core/atomic.h"                   // the wake-up request
#include "chi/runtime/poller_rescue.h"        // serving the sockets while the worker is stuck
#include "chi/runtime/work_orchestrator.h"     // NewPollerWorker, Worker, WorkerParker
#include "chi/transport/request_dispatcher.h"  // Dispatch, EncodeAnswer
#include "chi/transport/zmq_common.h"          // the doorbell, ZmqReadable
#include "chi/transport/zmq_server_sockets.h"  // sockets, clients, answers, counters

namespace chi {

/** Serves pure clients over ZeroMQ ROUTER sockets (ipc and/or tcp) on a network worker. */
class ZmqServer final : public ZmqServerSockets,
                        public TaskCompleter,
                        public WorkerPoller,
                        public WorkerParker,
                        public RescuablePoller {
 public:
  using Options = ZmqServerOptions;

  ZmqServer() = default;
  ~ZmqServer() { Stop(); }
  ZmqServer(const ZmqServer &) = delete;
  ZmqServer &operator=(const ZmqServer &) = delete;

  /**
   * Binds the endpoints. Handshakes and tasks queue in ZeroMQ until Open() supplies the
   * answer clients get. Fails (kAlreadyExists) when another process holds the tcp port.
   */
  Status Start(RequestDispatcher *dispatcher, const Options &opt) {
    if (started_) return Status::Error(ErrorCode::kInvalidArgument, "already started");
    if (!doorbell_.ok()) return Status::Error(ErrorCode::kIo, "eventfd for the network worker");
    if (dispatcher->Orchestrator() == nullptr) {
      return Status::Error(ErrorCode::kInvalidArgument, "the ZeroMQ server needs a runtime");
    }
    dispatcher_ = dispatcher;
    opt_ = opt;
    Status st = Bind();
    if (!st.ok()) {
      CloseSockets();
      ctx_.close();
      return st;
    }
    started_ = true;
    return st;
  }

  /**
   * Starts serving on a new network worker; every accepted client gets `answer` (plus its
   * client id).
   */
  void Open(const ConnectAnswer &answer) {
    if (!started_ || worker_ != nullptr) return;
    template_ = answer;
    template_.max_request_bytes = opt_.max_request_bytes;  // clients refuse larger tasks
    next_reap_ = NowNs() + opt_.reap_interval_ns;
    worker_ = dispatcher_->Orchestrator()->NewPollerWorker(WorkerRole::kNetwork);
    network_ = worker_.get();
    worker_->ReplacePoller(nullptr, this);
    worker_->SetParker(this, opt_.spin_ns);
    worker_->Start();
    rescue_.Start(this, "chi-zmq-rescue");
  }

  /**
   * Refuses new tasks (answered with kShutdown) and handshakes, then stops the network
   * worker once the tasks it runs are done. Call before the runtime's workers stop (the
   * tasks it runs may wait on theirs); their answers still flow (Stop sends them).
   */
  void BeginShutdown() {
    shutting_down_.Store(1, MemOrder::kRelease);
    if (worker_ == nullptr) return;
    worker_->RequestStop();
    worker_->Join();  // meanwhile the rescue thread answers for a worker stuck in a task
    rescue_.Stop();
    worker_->ReplacePoller(this, nullptr);
  }

  /**
   * Sends every pending answer, tells each client the runtime stops, closes the sockets.
   * Call after the workers have stopped.
   */
  void Stop() {
    if (!started_) return;
    BeginShutdown();
    network_ = nullptr;
    worker_.reset();
    {
      std::lock_guard<std::mutex> lock(sock_mu_);
      const SocketsHeld held;
      DrainAnswers();
      NotifyShutdown();
      CloseSockets();
      sockets_closed_ = true;
      pool_.Clear();
    }
    ctx_.close();
    started_ = false;
  }

  /**
   * A remote task finished (on any worker): sends its answer when the sockets are free,
   * else queues it for the network worker.
   */
  void OnComplete(Task *t) override {
    auto *slot = reinterpret_cast<ZmqAnswerSlot *>(t->transport_cookie_);
    RequestDispatcher::EncodeAnswer(t, &slot->bytes);
    if (!SendNow(slot)) QueueAnswer(slot);
  }

  /** Who sent t: its client as the handshake identified it (the answer slot keeps it). */
  Caller CallerOf(const Task &t) const override {
    return reinterpret_cast<const ZmqAnswerSlot *>(t.transport_cookie_)->caller;
  }

  // ---- The network worker (WorkerPoller, WorkerParker) ----

  /** WorkerPoller: nothing to set up. */
  void BeginPolling(u32) override {}

  /**
   * WorkerPoller: a pass when a socket is due (the ZMQ_FD rule) or the sockets or the
   * doorbell say there is work; true when it did some. Once shutting down it still answers, but
   * reports no work, so a flood of requests cannot keep the worker from stopping.
   */
  bool Poll() override {
    polls_.AddOwned(1);  // only this thread writes it: the rescue thread's sign of progress
    u32 due = due_;
    if (due == 0) {
      due = Probe(0);
      if (due & kRung) doorbell_.Clear();  // a late Interrupt: else every probe would say yes
      if (due == 0) return false;
    }
    due_ = 0;
    const bool busy = Pass(due & kBothSockets, after_timeout_);
    after_timeout_ = false;
    return busy && shutting_down_.Load(MemOrder::kRelaxed) == 0;  // relaxed: a hint
  }

  /** WorkerPoller: nothing to hand over; the worker sleeps on our fds (Sleep). */
  bool EndPolling(u32) override { return false; }

  /**
   * WorkerParker: sleeps in poll() on the sockets and the doorbell, at most until the
   * next reap or `timeout_ns` (0: none). The next Poll passes whatever woke it.
   */
  void Sleep(u64 timeout_ns) override {
    if (due_ != 0) return;  // a socket still owes a pass (the ZMQ_FD rule): no sleep
    sleeps_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
    doorbell_.PrepareSleep();  // Probe re-checks the work lists after it
    const u64 now = NowNs();
    u64 wait_ns = next_reap_ > now ? next_reap_ - now : 0;
    if (timeout_ns != 0 && timeout_ns < wait_ns) wait_ns = timeout_ns;
    // Rounded up: never before the reap is due.
    const u32 woke = Probe(static_cast<long>((wait_ns + 999999) / 1000000));
    doorbell_.Awake((woke & kRung) != 0);
    after_timeout_ = woke == 0;
    due_ |= woke == 0 ? kBothSockets : woke & kBothSockets;  // a timeout: the reap is due
  }

  /** WorkerParker: ends the network worker's sleep (any thread). */
  void Interrupt() override { doorbell_.Signal(); }

  // ---- The rescue thread (RescuablePoller; poller_rescue.h) ----

  /** How many times the network worker polled its sockets (relaxed: a mark of progress). */
  u64 WorkerPolls() const override { return polls_.Load(MemOrder::kRelaxed); }
  /** True while the network worker sleeps in poll() (Sleep), idle rather than stuck. */
  bool WorkerSleeping() const override { return doorbell_.Sleeping(); }

  /**
   * For a network worker stuck in a task: sends the queued answers and hands every request
   * waiting on the sockets to the low-latency workers' lanes (none runs on the stuck
   * worker), when the sockets' lock is free. True when a socket may still hold requests.
   */
  bool RescuePass() override {
    std::unique_lock<std::mutex> lock(sock_mu_, std::try_to_lock);
    if (!lock.owns_lock() || sockets_closed_) return false;  // held: the next pass looks again
    const SocketsHeld held;  // a task failed at once answers through the queue, not SendNow
    DrainAnswers();
    bool more = false;
    for (int i = 0; i < 2; ++i) {
      std::string peer;
      u32 got = 0;
      for (; got < kRecvBatch; ++got) {
        zmq::message_t payload;
        const Taken taken = TakeRequest(i, &peer, &payload);
        if (taken == Taken::kNothing) break;
        if (taken == Taken::kRequest && Handle(peer, std::move(payload), true)) {
          rescued_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
        }
      }
      more |= got == kRecvBatch;  // stopped short of EAGAIN: the fd will not say what waits
    }
    return more;
  }

  /** Sleeps in poll() on the sockets' fds (not the doorbell: the network worker's). */
  void AwaitInput(int timeout_ms) override {
    pollfd items[2];
    nfds_t n = 0;
    for (int i = 0; i < 2; ++i) {
      if (socket_fds_[i] >= 0) items[n++] = {socket_fds_[i], POLLIN, 0};
    }
    poll(items, n, timeout_ms);  // an error or a signal only ends the wait early
  }

 private:
  static constexpr u32 kRecvBatch = 64;           ///< messages per socket per pass
  static constexpr u32 kBothSockets = 3;          ///< due_ and Probe bits: 1 << socket index
  static constexpr u32 kRung = 4;                 ///< Probe bit: the doorbell's fd was readable
  /** Beyond this many tasks in flight, requests go to the low-latency workers' lanes. */
  static constexpr u64 kDirectMaxOutstanding = 4;

  /** A request taken off a socket under the lock, dispatched after it (see Pass). */
  struct Pending {
    ZmqAnswerSlot *slot;  ///< where its answer goes
    zmq::message_t body;  ///< the request envelope
  };

  /**
   * Sends slot's answer now and true, unless the network worker holds the sockets, the
   * queue holds older answers (they go first), or, on another worker, many tasks are in
   * flight (the network worker sends those in batches, one events check each).
   */
  bool SendNow(ZmqAnswerSlot *slot) {
    // A task that completes at once while the network worker dispatches it inside its pass
    // (a GPU-route task failed at once) must not try-lock the mutex that worker holds.
    if (HoldsSockets()) return false;
    const bool own = OnNetworkWorker();
    if (!own && outstanding_.Load(MemOrder::kRelaxed) > kDirectMaxOutstanding) return false;
    // relaxed: a hint; an answer queued after this check is still sent by the network worker.
    if (answers_.WaitingHint()) return false;
    std::unique_lock<std::mutex> lock(sock_mu_, std::try_to_lock);
    if (!lock.owns_lock() || sockets_closed_) return false;
    const int i = static_cast<u8>(slot->peer[0]);
    DeliverAnswer(slot);  // on the network worker, it marks the socket due
    if (own) return true;
    bool readable = true;  // on error, let the network worker look
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

  /** True on the network worker or the rescue thread while it holds sock_mu_ (SocketsHeld). */
  static bool &HoldsSockets() {
    static thread_local bool held = false;
    return held;
  }

  /** Marks our threads' sock_mu_ sections, for SendNow's re-entry check. */
  struct SocketsHeld {
    SocketsHeld() { HoldsSockets() = true; }
    ~SocketsHeld() { HoldsSockets() = false; }
    SocketsHeld(const SocketsHeld &) = delete;
    SocketsHeld &operator=(const SocketsHeld &) = delete;
  };

  /**
   * One pass: under the sockets' lock, queued answers, the requests of the sockets in
   * `sockets` (bits) and the reaper; then, without the lock, the requests it took while few
   * were in flight are dispatched to run on this worker (each answer is sent as its task
   * finishes). With few in flight it takes one request and leaves the rest (and the
   * socket's EAGAIN) for the next pass, so the task starts without those system calls.
   * True when busy.
   */
  bool Pass(u32 sockets, bool after_timeout) {
    // relaxed: the doorbell's fences order it; this pass does what it asked for.
    wake_asked_.Store(0, MemOrder::kRelaxed);
    bool busy = false;
    {
      std::lock_guard<std::mutex> lock(sock_mu_);
      const SocketsHeld held;
      busy |= DrainAnswers();
      sockets |= due_;  // the sockets those answers went out on
      due_ = 0;
      for (int i = 0; i < 2; ++i) {
        if ((sockets & (1u << i)) == 0) continue;
        if (!pending_.empty()) {  // a task to start first: this socket waits for the next pass
          due_ |= 1u << i;
          batch_ |= 1u << i;
          continue;
        }
        const u32 got = ReceiveBatch(i);
        // relaxed: a statistic. Requests waiting after a full sleep were never signalled.
        if (after_timeout && got != 0) late_wakeups_.FetchAdd(got, MemOrder::kRelaxed);
        busy |= got != 0;
      }
      const u64 now = NowNs();
      if (now >= next_reap_) {
        Reap(now);
        next_reap_ = now + opt_.reap_interval_ns;
      }
    }
    DispatchPending(true);
    return busy;
  }

  /**
   * Submits the requests taken so far, in order, to run on this worker (`here`) or on the
   * low-latency workers' lanes; a refused one's error answer is queued.
   */
  void DispatchPending(bool here) {
    for (Pending &p : pending_) DispatchOne(p, here);
    pending_.clear();
  }

  /** Submits one request's task (here: on this worker); a refused one's error answer is queued. */
  void DispatchOne(Pending &p, bool here) {
    const char *data = static_cast<const char *>(p.body.data());
    if (dispatcher_->Dispatch(data, p.body.size(), this, reinterpret_cast<u64>(p.slot),
                              &p.slot->bytes, here)) {
      return;  // the task owns the slot now: it may be answered already
    }
    refused_.FetchAdd(1, MemOrder::kRelaxed);
    QueueAnswer(p.slot);  // counted as outstanding when taken; delivered next pass
  }

  /** Queues an encoded answer for the network worker's next pass (any thread). */
  void QueueAnswer(ZmqAnswerSlot *slot) {
    answers_.Push(slot);
    doorbell_.Ring();
  }

  /** True when answers are queued or a worker asked for a pass (re-read after PrepareSleep). */
  bool WorkAsked() const {
    // relaxed: the doorbell's fences order it.
    return answers_.Waiting() || wake_asked_.Load(MemOrder::kRelaxed) != 0;
  }

  /**
   * Waits up to timeout_ms for a socket (by its ZMQ_FD, without the lock: by the ZMQ_FD
   * rule whoever used a socket left it so that the fd signals what comes next) or the
   * doorbell. Returns the sockets to pass (bits), plus kRung when the doorbell's fd was
   * readable; 0 when the time ran out. Plain poll(): every item is a file descriptor, and
   * zmq_poll would look once without waiting first (a system call more per request).
   */
  u32 Probe(long timeout_ms) {
    if (WorkAsked()) return kBothSockets;
    pollfd items[3];
    int index[3];  // the socket behind each item; -1: the doorbell
    nfds_t n = 0;
    for (int i = 0; i < 2; ++i) {
      if (socket_fds_[i] >= 0) {
        index[n] = i;
        items[n++] = {socket_fds_[i], POLLIN, 0};
      }
    }
    index[n] = -1;
    items[n++] = {doorbell_.fd(), POLLIN, 0};
    const int rc = poll(items, n, static_cast<int>(timeout_ms));
    if (rc < 0 && errno != EINTR) throw zmq::error_t();
    if (rc < 0) return kBothSockets;  // a signal's interruption counts as a wake-up: look again
    u32 woke = 0;
    for (nfds_t k = 0; k < n && rc > 0; ++k) {
      if ((items[k].revents & POLLIN) == 0) continue;
      woke |= index[k] < 0 ? kRung | kBothSockets : 1u << index[k];
    }
    return woke;
  }

  /**
   * Receives up to kRecvBatch messages from socket i; returns how many. After a wake-up,
   * a task request taken while few are in flight ends the batch (it starts first; the next
   * pass takes a full batch). A batch ended early asks for another pass: more may wait,
   * and the fd will not say so (the ZMQ_FD rule).
   */
  u32 ReceiveBatch(int i) {
    const u32 bit = 1u << i;
    const bool first_only = (batch_ & bit) == 0;
    batch_ &= ~bit;
    u32 got = 0;
    std::string peer;
    for (; got < kRecvBatch; ++got) {
      zmq::message_t payload;
      const Taken taken = TakeRequest(i, &peer, &payload);
      if (taken == Taken::kNothing) break;
      if (taken == Taken::kRefused) continue;
      Handle(peer, std::move(payload), false);
      if (first_only && !pending_.empty()) {  // few in flight: it starts before the rest
        batch_ |= bit;
        ++got;
        break;
      }
    }
    if (got == kRecvBatch || (batch_ & bit) != 0) due_ |= bit;
    return got;
  }

  /** What TakeRequest found on a socket. */
  enum class Taken : u32 { kNothing, kRequest, kRefused };

  /**
   * Receives one message from socket i without waiting: its sender's key (*peer: the
   * socket's index, then the routing id) and its one frame (*payload). A message of more
   * frames is refused here (kMalformed). kNothing when nothing waits (EAGAIN).
   */
  Taken TakeRequest(int i, std::string *peer, zmq::message_t *payload) {
    if (!sockets_[i]) return Taken::kNothing;
    zmq::socket_t &s = *sockets_[i];
    zmq::message_t id;
    if (!s.recv(id, zmq::recv_flags::dontwait)) return Taken::kNothing;
    bool one_frame = id.more() && s.recv(*payload, zmq::recv_flags::none).has_value();
    while (payload->more()) {  // a well-behaved DEALER sends exactly one frame
      one_frame = false;
      if (!s.recv(*payload, zmq::recv_flags::none)) break;
    }
    peer->assign(1, static_cast<char>(i));
    peer->append(static_cast<const char *>(id.data()), id.size());
    if (one_frame) return Taken::kRequest;
    Refuse(*peer, 0, ErrorCode::kMalformed, "a request must be exactly one frame");
    return Taken::kRefused;
  }

  /**
   * A task request (or control message) from `peer`: taken for dispatch after the pass
   * (counted outstanding from here), or answered with an error. `rescued`: taken by the
   * rescue thread, so dispatched now, to the lanes. True when a task was taken.
   */
  bool Handle(const std::string &peer, zmq::message_t &&msg, bool rescued) {
    const char *data = static_cast<const char *>(msg.data());
    if (msg.size() < kEnvelopeHeaderBytes) {
      Refuse(peer, 0, ErrorCode::kTruncated, "request shorter than its 8-byte header");
      return false;
    }
    const u64 id = EnvelopeId(data);
    if (id & zmq_control::kBit) {
      HandleControl(peer, id, msg);
      return false;
    }
    requests_.FetchAdd(1, MemOrder::kRelaxed);
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      Refuse(peer, id, ErrorCode::kInvalidArgument,
             "not connected: send the ClientConnect handshake first");
      return false;
    }
    if (shutting_down_.Load(MemOrder::kAcquire) != 0) {
      Refuse(peer, id, ErrorCode::kShutdown, "the runtime is shutting down");
      return false;
    }
    ZmqAnswerSlot *slot = pool_.Take();
    slot->peer = peer;
    slot->caller = it->second.caller;
    // relaxed: raised under sock_mu_; workers read it as a hint.
    const u64 outstanding = outstanding_.FetchAdd(1, MemOrder::kRelaxed) + 1;  // Monitor counts it
    ++it->second.outstanding;  // DeliverAnswer takes both back, answer or error
    it->second.active = true;  // not quiet: the probe round leaves it alone
    if (rescued) {
      Pending p{slot, std::move(msg)};
      DispatchOne(p, false);
      return true;
    }
    pending_.push_back(Pending{slot, std::move(msg)});
    // Few in flight: dispatched after the pass, to run here. Many (a stream): now, in
    // order, to the lanes, so that the workers run them while this pass goes on receiving.
    if (outstanding > kDirectMaxOutstanding) DispatchPending(false);
    return true;
  }

  RequestDispatcher *dispatcher_ = nullptr;
  std::unique_ptr<Worker> worker_;  ///< the network worker (from Open)
  bool started_ = false;            ///< between Start and Stop
  u32 batch_ = 0;                   ///< network worker: sockets whose next pass takes a full batch
  bool after_timeout_ = false;      ///< network worker: its last sleep timed out
  u64 next_reap_ = 0;               ///< network worker: when Reap runs next
  std::vector<Pending> pending_;    ///< network worker only: taken, not dispatched
  Atomic<u64> polls_;               ///< the network worker's polls (WorkerPolls)
  PollerRescue rescue_;             ///< serves the sockets while the network worker is stuck
  ZmqDoorbell doorbell_;
  Atomic<u32> wake_asked_;  ///< a worker took a socket's wake-up: the network worker must look
};

}  // namespace chi
