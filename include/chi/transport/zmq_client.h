// ZmqClientTransport: a pure client's connection to its runtime over ZeroMQ
// (DEALER to the runtime's ROUTER, ipc or tcp; the socket half is in
// zmq_client_connection.h). A caller sends its request itself when the socket's
// lock is free (else it queues it for the network thread), and while it waits in
// Future::Wait or polls Future::IsComplete it takes answers off the socket itself
// (through the process's WaitHelper; one waiting caller sleeps on the socket, see
// zmq_client_watch.h), so a round trip needs no hand-off to another thread. The
// network thread sleeps in poll() on the socket's ZMQ_FD, without the lock, and
// handles the rest: streams of tasks, answers nobody looks for, the handshake,
// reconnection; it does everything when the process's WaitHelper belongs to someone
// else (a GPU client's GpuWorker).
// Invariants: every task handed to Send is completed once; the socket is used only
// under sock_mu_, and by the ZMQ_FD rule (zmq_common.h).
#pragma once

#include <pthread.h>  // naming the network thread

#include <cerrno>  // EINTR from poll
#include <future>  // result of the first handshake
#include <memory>  // unique_ptr
#include <mutex>   // the socket's lock
#include <thread>  // the network thread

#include <zmq.hpp>  // cppzmq

#include "chi/core/atomic.h"                      // counters
#include "chi/runtime/worker.h"                   // NowNs
#include "chi/task/future.h"                      // WaitHelper: waiting callers receive
#include "chi/transport/zmq_client_connection.h"  // the socket half, options, stats
#include "chi/transport/zmq_client_watch.h"       // a waiting caller sleeps on the socket

namespace chi {

/** A pure client's ZeroMQ connection (see the file comment). */
class ZmqClientTransport final : public ZmqClientConnection {
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
    if (!t->doorbell_.ok() || !t->watch_.ok()) {
      return Status::Error(ErrorCode::kIo, "eventfd for the network thread");
    }
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

  /**
   * Sends a stamped task on this thread when the socket is free, else hands it to the
   * network thread; false once closed. Blocks while too many are in flight.
   */
  bool Send(Task *t) override {
    senders_.FetchAdd(1, MemOrder::kSeqCst);  // seq_cst: Close's flag and our count order totally
    if (closed_.Load(MemOrder::kSeqCst) != 0) {
      senders_.FetchSub(1, MemOrder::kRelease);
      return false;
    }
    table_.Admit();
    OfferHelper();
    if (SendNow(t)) {
      senders_.FetchSub(1, MemOrder::kRelease);
      return true;
    }
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
    // acquire: a Send's install is seen; Remove returns once no caller is in the helper.
    if (helper_state_.Load(MemOrder::kAcquire) == kHelperInstalled) WaitHelper::Remove(&helper_);
    stop_.Store(1, MemOrder::kRelease);
    doorbell_.Ring();
    if (thread_.joinable()) thread_.join();
    ctx_.close();
  }

  const char *Name() const override { return opt_.mode == "ipc" ? "ipc" : "tcp"; }

  /** The runtime process currently connected (changes after a reconnect; 0 while down). */
  u32 RuntimePid() const override { return runtime_pid_.Load(MemOrder::kAcquire); }

  /** The handshake answer of the runtime last connected (replaced by every reconnect). */
  bool CopyConnectAnswer(ConnectAnswer *out) const override {
    std::lock_guard<std::mutex> lock(answer_mu_);
    *out = answer_;
    return true;
  }

  /** A snapshot of the counters (any thread). */
  ZmqClientStats Stats() const {
    ZmqClientStats s;
    s.outstanding = table_.Outstanding();
    s.reconnects = reconnects_.Load(MemOrder::kRelaxed);
    s.peer_losses = losses_.Load(MemOrder::kRelaxed);
    s.sent_by_caller = sent_by_caller_.Load(MemOrder::kRelaxed);
    s.received_by_caller = received_by_caller_.Load(MemOrder::kRelaxed);
    s.late_wakeups = late_wakeups_.Load(MemOrder::kRelaxed);
    s.wait_helper = helper_state_.Load(MemOrder::kAcquire) == kHelperInstalled;
    s.network_sleeps = network_sleeps_.Load(MemOrder::kRelaxed);
    return s;
  }

 private:
  /**
   * Longest sleep of the network thread. Every wake-up it needs is an event (socket,
   * monitor, doorbell) or a timer it knows of; this bound only caps the damage of a
   * wake-up that never comes, which Stats().late_wakeups counts.
   */
  static constexpr u64 kMaxSleepNs = 1000000000ull;

  explicit ZmqClientTransport(const ZmqClientOptions &opt) : ZmqClientConnection(opt) {}

  // ---- Calling threads ----

  static constexpr u32 kHelperUntried = 0;
  static constexpr u32 kHelperTrying = 1;
  static constexpr u32 kHelperInstalled = 2;
  static constexpr u32 kHelperRefused = 3;
  /**
   * Beyond this many tasks in flight (sent or queued) a caller queues its task, and leaves
   * the answers to the network thread: it sends and receives a stream in batches, one
   * events check each, where callers pay one per task and contend for the socket. Counted
   * with queued tasks, so that a caller waiting at the head of a stream it just queued
   * does not take the socket (that cut the throughput of 256-task windows markedly).
   */
  static constexpr u64 kDirectMaxInflight = 4;
  /** Longest a waiting caller blocks on the socket before Future::Wait looks again. */
  static constexpr int kWatchMs = 1;
  /** Calls that only look after a watch that saw nothing (Future::Wait's clock period). */
  static constexpr u32 kSkipAfterIdle = 64;

  /** What a calling thread remembers of its use of this connection (thread_local). */
  struct CallerState {
    const ZmqClientTransport *connection = nullptr;  ///< whose state this is
    u64 seen = ~0ull;          ///< completions when it last looked (see Watch); ~0: never
    u32 skip = 0;              ///< helper calls left that only look (after an idle watch)
    bool streamed = false;     ///< its current burst went past kDirectMaxInflight
    bool queue_burst = false;  ///< its current burst goes through the network thread
  };

  /** This thread's state for this connection (fresh when it last used another one). */
  CallerState &Caller() {
    thread_local CallerState state;
    if (state.connection != this) {
      state = CallerState();
      state.connection = this;
    }
    return state;
  }

  /**
   * Offers this connection's answers to callers waiting in Future::Wait, on the first
   * Send (not at Connect: a handshake-only connection must leave the process's single
   * WaitHelper slot to the shm transport it hands over to).
   */
  void OfferHelper() {
    if (helper_state_.Load(MemOrder::kRelaxed) != kHelperUntried) return;  // relaxed: a hint
    u32 untried = kHelperUntried;
    // relaxed: only the winner installs; Close reads the final state with acquire.
    if (!helper_state_.CompareExchange(untried, kHelperTrying, MemOrder::kRelaxed)) return;
    const bool ok = WaitHelper::Install(&helper_);
    // release: Close (which waits for this Send) sees the install and removes it.
    helper_state_.Store(ok ? kHelperInstalled : kHelperRefused, MemOrder::kRelease);
  }

  /**
   * Sends t on the calling thread when the socket is free and connected; false when
   * it must go through the network thread (socket busy, not connected, earlier tasks
   * still queued there: a caller's tasks leave in the order it sent them, or a stream
   * of tasks, which the thread sends in batches).
   */
  bool SendNow(Task *t) {
    // A burst of sends starts when t is the only task in flight. A thread whose last burst
    // was a stream is taken to stream again: its whole burst goes to the network thread,
    // which sends it as one batch. Sending the first tasks of each 256-task window at once
    // split the window in two (two wake-up chains through both processes) and cost up to
    // a third of the throughput on a 2-core host.
    CallerState &me = Caller();
    const u64 inflight = table_.Inflight();  // t is counted already
    if (inflight == 1) {
      me.queue_burst = me.streamed;
      me.streamed = false;
    }
    if (inflight > kDirectMaxInflight) me.streamed = true;
    if (me.queue_burst || inflight > kDirectMaxInflight) return false;
    // An awake network thread takes a queued task at no wake-up's cost, and batches it
    // with others: a producer starved of CPU otherwise sent a stream one task at a time.
    if (!doorbell_.Sleeping()) return false;
    // relaxed: a hint; a task queued after this check is still sent by the thread.
    if (submitted_.Load(MemOrder::kRelaxed) != nullptr) return false;
    std::unique_lock<std::mutex> lock(sock_mu_, std::try_to_lock);
    if (!lock.owns_lock() || state_ != State::kReady || !socket_ || !controls_.empty()) {
      return false;
    }
    const u64 completions = table_.Completions();
    try {
      SendTask(t);  // from here on the task is in a slot: the thread fails it if need be
      sent_by_caller_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
      ReceiveBatch(false);  // the ZMQ_FD rule: our send may have taken the fd's signal
    } catch (const zmq::error_t &) {
      AskForPass();  // the network thread meets the same error and fails the slots
    }
    lock.unlock();
    if (table_.Completions() != completions) watch_.Wake();
    return true;  // if its caller does not watch, a blind network thread looks soon enough
  }

  /** The WaitHelper entry point: ctx is the connection. */
  static void HelpThunk(void *ctx) { static_cast<ZmqClientTransport *>(ctx)->HelpReceive(); }

  /**
   * A caller waiting in Future::Wait while few tasks are in flight (a stream's answers
   * are the network thread's): takes every answer that is ready (anyone's). When none is,
   * one waiting caller at a time blocks on the socket, at most kWatchMs (ZmqSocketWatch).
   * After a watch that saw nothing, the thread's next kSkipAfterIdle calls only look, so
   * Future::Wait soon reads its clock and parks. Never waits for the lock.
   */
  void HelpReceive() {
    CallerState &me = Caller();  // per thread: each waiting caller has its own spin phase
    if (table_.Outstanding() != 0 && table_.Inflight() <= kDirectMaxInflight) {
      if (me.skip == 0 && watch_.TryTake()) {
        if (!Watch(me.seen)) me.skip = kSkipAfterIdle;
      } else {
        if (me.skip != 0) --me.skip;
        TakeReady();
      }
    }
    me.seen = table_.Completions();  // Future::Wait checks its task after this
  }

  /** The WaitHelper poll hook: ctx is the connection. */
  static void PollThunk(void *ctx) { static_cast<ZmqClientTransport *>(ctx)->PollReceive(); }

  /**
   * A caller polling Future::IsComplete while few tasks are in flight: takes every answer
   * that is ready, if the socket is free, and never waits. Without it a polled answer
   * waited for the network thread, asleep blind for up to kBlindSleepNs after a watch.
   */
  void PollReceive() {
    if (table_.Outstanding() != 0 && table_.Inflight() <= kDirectMaxInflight) TakeReady();
  }

  /** Receives what is ready if the socket is free; rings the watcher if tasks completed. */
  void TakeReady() {
    const u64 before = table_.Completions();
    int fd = -1;
    TryReceive(&fd);
    if (table_.Completions() != before) watch_.Wake();
  }

  /**
   * The watcher's turn. A task completed since this thread last looked may be its own,
   * so it blocks only while the count is unchanged: a completion counted later rings
   * the bell. False when it watched for kWatchMs and nothing came.
   */
  bool Watch(u64 seen) {
    int fd = -1;
    bool came = true;
    if (!TryReceive(&fd, true) && fd >= 0 && table_.Completions() == seen) {
      came = watch_.Block(fd, kWatchMs);
      TryReceive(&fd);
    }
    // The network thread sleeps without the fd: with tasks in flight it must watch again
    // now (their callers may park), not at the end of its blind sleep. With none it sleeps
    // on: waking it after every round trip cost the next one the socket's lock at times.
    // (A runtime that stops is seen on the monitor, which it always polls.)
    if (watch_.Release() && !table_.Idle()) AskForPass();
    return came;
  }

  /**
   * Receives what is ready if the socket is free; true when it delivered any. *fd: its fd.
   * `unless_armed`: a watcher about to block on the fd skips the recv when the socket's
   * last use found nothing (a send's check, usually its own): the fd will say.
   */
  bool TryReceive(int *fd, bool unless_armed = false) {
    std::unique_lock<std::mutex> lock(sock_mu_, std::try_to_lock);
    if (!lock.owns_lock() || !socket_) return false;
    *fd = socket_fd_;
    if (unless_armed && armed_) return false;
    try {
      return ReceiveBatch(false) != 0;
    } catch (const zmq::error_t &) {
      AskForPass();
      *fd = -1;
      return false;
    }
  }

  // ---- Network thread ----

  /** The network thread: connects, serves until Close, then fails what is left. */
  void Run() {
    pthread_setname_np(pthread_self(), "chi-zmq-client");
    const u64 start = NowNs();
    connect_deadline_ = start + static_cast<u64>(opt_.connect_timeout_sec * 1e9);
    try {
      {
        std::lock_guard<std::mutex> lock(sock_mu_);
        OpenSocket();
      }
      Loop();
    } catch (const zmq::error_t &e) {
      std::lock_guard<std::mutex> lock(sock_mu_);
      FailAll(ErrorCode::kIo, "ZeroMQ error in the client transport");
      if (!first_done_) {
        first_done_ = true;
        first_result_.set_value(Status::Errorf(ErrorCode::kIo, "ZeroMQ: %s", e.what()));
      }
    }
    std::lock_guard<std::mutex> lock(sock_mu_);  // Close removed the helper: no caller helps
    FailAll(ErrorCode::kShutdown, "the client closed its connection to the runtime");
    if (state_ == State::kReady && socket_) {
      socket_->set(zmq::sockopt::linger, 100);  // long enough for the Bye, short at exit
      bye_sent_ = SendOnSocket(MakeControl(zmq_control::kBye), zmq::send_flags::dontwait);
    }
    CloseSocket();
  }

  /**
   * Passes over the socket under its lock while there is work; between passes it spins
   * (spin_ns after work) or sleeps in poll() without the lock, so callers can use it.
   */
  void Loop() {
    u64 last_busy = NowNs();
    bool work = true;        // a pass is due
    bool timed_out = false;  // the sleep before this pass ran to kMaxSleepNs
    while (stop_.Load(MemOrder::kAcquire) == 0) {
      if (work && Pass(timed_out)) last_busy = NowNs();
      timed_out = false;
      const u64 now = NowNs();
      if (now - last_busy < opt_.spin_ns) {  // spin on readiness, not on the lock
        work = Probe(0, true);
        if (!work) CpuRelax();
        continue;
      }
      doorbell_.PrepareSleep();
      if (!WorkAsked()) {
        // Until the next timer, at most kMaxSleepNs (kBlindSleepNs when blind); rounded up:
        // never before it is due.
        const u64 timer_ns = NextTimerNs(now);
        const bool on_socket = watch_.BeginSleep();
        const u64 bound_ns = on_socket ? kMaxSleepNs : ZmqSocketWatch::kBlindSleepNs;
        // No timer due: it ends on an event (a blind sleep's timeout is no late wake-up).
        const bool capped = timer_ns >= kMaxSleepNs && on_socket;
        const u64 sleep_ns = timer_ns < bound_ns ? timer_ns : bound_ns;
        const long sleep_ms = static_cast<long>((sleep_ns + 999999) / 1000000);
        network_sleeps_.FetchAdd(1, MemOrder::kRelaxed);  // relaxed: a statistic
        timed_out = !Probe(sleep_ms, on_socket) && capped;
        watch_.EndSleep();
      }
      doorbell_.Awake();  // no spin after a wake-up: a waiting caller may have taken the answer
      work = true;
    }
  }

  /**
   * One pass under the socket's lock: control messages callers left, queued tasks, ready
   * answers, connection events, timers. True when it found anything to do.
   */
  bool Pass(bool after_timeout) {
    // relaxed: the doorbell's fences order it; this pass does what it asked for.
    wake_asked_.Store(0, MemOrder::kRelaxed);
    const u64 completions = table_.Completions();
    bool busy = false;
    {
      std::lock_guard<std::mutex> lock(sock_mu_);
      busy |= HandleDeferredControls();
      busy |= TakeSubmitted();
      // Before the monitor: what came before a disconnect (answers, a goodbye) counts.
      const u32 got = ReceiveBatch(true);
      // relaxed: a statistic. Answers waiting after a full sleep were never signalled.
      if (after_timeout && got != 0) late_wakeups_.FetchAdd(got, MemOrder::kRelaxed);
      busy |= got != 0;
      if (ReadMonitor()) {  // a replaced socket is read once too (the ZMQ_FD rule)
        busy = true;
        ReceiveBatch(true);
      }
      Timers(NowNs());  // after the socket work: a peer loss just stamped down_since_
    }
    if (table_.Completions() != completions) watch_.Wake();
    return busy;
  }

  /** True when a caller queued work or asked for a pass (re-checked after PrepareSleep). */
  bool WorkAsked() const {
    return submitted_.Load(MemOrder::kAcquire) != nullptr ||  // acquire: pairs with Send
           wake_asked_.Load(MemOrder::kRelaxed) != 0 ||  // relaxed: the doorbell's fences order it
           stop_.Load(MemOrder::kAcquire) != 0;
  }

  /**
   * Waits up to timeout_ms for the socket (by its ZMQ_FD, without the lock: callers may
   * use the socket meanwhile, and by the ZMQ_FD rule the fd then signals what comes
   * next), the monitor (ours alone) or the doorbell; false when the time ran out.
   */
  bool Probe(long timeout_ms, bool with_socket) {
    if (WorkAsked()) return true;
    zmq::pollitem_t items[3] = {{monitor_->handle(), 0, ZMQ_POLLIN, 0},
                                {nullptr, doorbell_.fd(), ZMQ_POLLIN, 0},
                                {nullptr, socket_fd_, ZMQ_POLLIN, 0}};
    const int rc = zmq_poll(items, with_socket ? 3 : 2, timeout_ms);
    if (rc < 0 && zmq_errno() != EINTR) throw zmq::error_t();
    return rc != 0;  // a signal's interruption counts as a wake-up: look again
  }

  WaitHelper helper_{&HelpThunk, this, nullptr, &PollThunk};  ///< waiting and polling callers
  ZmqSocketWatch watch_;  ///< which waiting caller, if any, sleeps on the socket's fd
  std::thread thread_;
  Atomic<u32> closed_;
  Atomic<u32> senders_;
  Atomic<u32> helper_state_;  ///< kHelperUntried .. kHelperRefused
  Atomic<u64> sent_by_caller_;
  Atomic<u64> network_sleeps_;  ///< see ZmqClientStats::network_sleeps
};

}  // namespace chi
