// ZmqRescue: serves a ZeroMQ server's sockets while its network worker is stuck in a task.
// The network worker runs the tasks of requests that arrive while few are in flight itself
// (no hop to another thread); a task that holds it without yielding (a long computation, a
// blocking call: work that should have been TASK_HIGH_LATENCY) would otherwise leave every
// other ZeroMQ client unanswered for as long as it runs. A thread of the server looks every
// kLook (kIdleLook while the worker sleeps on its sockets): when the worker was awake at
// two looks and polled its sockets not once in between, the thread takes the sockets
// whenever their lock is free, sends the answers queued for them and hands new requests
// to the low-latency workers' lanes, sleeping on the sockets' fds (at most kPassMs)
// between passes, until the worker polls again.
// Invariant: the thread uses the sockets only under their lock and receives until EAGAIN
// (or passes again at once), so it leaves them as the ZMQ_FD rule (zmq_common.h) wants.
// Cost to the network worker: one relaxed store per poll; to an idle runtime: a wake-up of
// this thread every kIdleLook.
#pragma once

#include <pthread.h>  // pthread_setname_np for the thread

#include <chrono>              // the looks' period
#include <condition_variable>  // Stop interrupts a look's wait
#include <mutex>               // guards stop_ for the condition variable
#include <thread>              // the rescue thread

#include "chi/core/types.h"  // u64

namespace chi {

/** What ZmqRescue needs of its server (ZmqServer implements it). */
class ZmqRescuable {
 public:
  /** A count the network worker raises on every poll of its sockets. */
  virtual u64 NetworkPolls() const = 0;
  /** True while the network worker sleeps on its sockets (not stuck, just idle). */
  virtual bool NetworkSleeping() const = 0;
  /**
   * One pass over the sockets for the stuck worker, if their lock is free: queued answers
   * out, new requests to the lanes. True when it left requests waiting (pass again now:
   * the fds will not say so).
   */
  virtual bool RescuePass() = 0;
  /** Sleeps until a socket's fd is readable, at most timeout_ms. */
  virtual void AwaitSockets(int timeout_ms) = 0;

 protected:
  ~ZmqRescuable() = default;
};

/** The rescue thread of one ZeroMQ server (see the file comment). */
class ZmqRescue {
 public:
  /** How often the thread looks at the network worker's poll count while it is awake. */
  static constexpr std::chrono::milliseconds kLook{10};
  /** How often while it sleeps on its sockets (idle: nothing can hold it up). */
  static constexpr std::chrono::milliseconds kIdleLook{100};
  /** Longest sleep on the sockets between two passes while the worker is stuck. */
  static constexpr int kPassMs = 1;

  ZmqRescue() = default;
  ~ZmqRescue() { Stop(); }
  ZmqRescue(const ZmqRescue &) = delete;
  ZmqRescue &operator=(const ZmqRescue &) = delete;

  /** Starts watching `server`'s network worker (once the worker runs). */
  void Start(ZmqRescuable *server) {
    if (thread_.joinable()) return;
    stop_ = false;
    thread_ = std::thread([this, server] { Run(server); });
  }

  /** Stops the thread and joins it (idempotent); the sockets are the worker's alone again. */
  void Stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  /** Looks at the worker now and then; serves the sockets through each stretch it is stuck. */
  void Run(ZmqRescuable *server) {
    pthread_setname_np(pthread_self(), "chi-zmq-rescue");
    u64 seen = server->NetworkPolls();
    bool awake = !server->NetworkSleeping();
    while (!WaitLook(awake ? kLook : kIdleLook)) {
      const u64 polls = server->NetworkPolls();
      const bool awake_now = !server->NetworkSleeping();
      const bool stuck = polls == seen && awake && awake_now;
      seen = polls;
      awake = awake_now;
      while (stuck && !Stopping() && server->NetworkPolls() == seen &&
             !server->NetworkSleeping()) {
        if (!server->RescuePass()) server->AwaitSockets(kPassMs);
      }
    }
  }

  /** Waits until the next look; true when Stop asked the thread to end. */
  bool WaitLook(std::chrono::milliseconds period) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, period, [this] { return stop_; });
  }

  /** True once Stop asked (checked between passes). */
  bool Stopping() {
    std::lock_guard<std::mutex> g(mu_);
    return stop_;
  }

  std::thread thread_;
  std::mutex mu_;                ///< guards stop_
  std::condition_variable cv_;   ///< Stop's wake-up of a look's wait
  bool stop_ = false;            ///< under mu_
};

}  // namespace chi
