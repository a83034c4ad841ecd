// PollerRescue: serves a poller worker's input while the worker is stuck in a task. A poller
// worker (the ZeroMQ server's network worker, the GPU worker) runs the tasks its poller takes
// in itself, with no hop to another thread; a task that holds it without yielding (a long
// computation, a blocking call: work that should have been TASK_HIGH_LATENCY) would leave
// everything else that arrives there (other ZeroMQ clients, other GPU blocks) unserved for
// as long as it runs. A thread of the poller looks every kLook (kIdleLook while the worker
// sleeps on its input): when the worker was awake at two looks and polled not once in
// between, the thread passes over the input itself (the poller's RescuePass: answers out,
// new requests to the low-latency workers' lanes), waiting for input between passes (at
// most kPassMs), until the worker polls again.
// Invariant: a pass and the worker's own polling exclude each other (each poller says how),
// so the input is never read by two threads at once.
// Cost to the worker: one relaxed store per poll, plus the poller's exclusion (ZeroMQ: none,
// its sockets' lock is taken anyway; GPU: a flag taken per poll); to an idle runtime: a
// wake-up of this thread every kIdleLook.
#pragma once

#include <pthread.h>  // pthread_setname_np for the thread

#include <chrono>              // the looks' period
#include <condition_variable>  // Stop interrupts a look's wait
#include <memory>              // the thread (a forked child keeps its parent's, unjoined)
#include <mutex>               // guards stop_ for the condition variable
#include <new>                 // placement new: a forked child's fresh lock
#include <thread>              // the rescue thread

#include "chi/core/fork_epoch.h"  // KeepInherited
#include "chi/core/types.h"       // u64

namespace chi {

/** What PollerRescue needs of the poller it rescues. */
class RescuablePoller {
 public:
  /** A count the worker raises every time it polls its input. */
  virtual u64 WorkerPolls() const = 0;
  /** True while the worker sleeps on its input (idle, not stuck). */
  virtual bool WorkerSleeping() const = 0;
  /**
   * One pass over the input for the stuck worker, unless the worker (or nothing) holds it
   * now: answers out, new requests to the lanes. True when it left input waiting (pass again
   * at once: waiting would not say so).
   */
  virtual bool RescuePass() = 0;
  /** Sleeps until input may have come, at most timeout_ms. */
  virtual void AwaitInput(int timeout_ms) = 0;

 protected:
  ~RescuablePoller() = default;
};

/** The rescue thread of one poller (see the file comment). */
class PollerRescue {
 public:
  /** How often the thread looks at the worker's poll count while it is awake. */
  static constexpr std::chrono::milliseconds kLook{10};
  /** How often while it sleeps on its input (idle: nothing can hold it up). */
  static constexpr std::chrono::milliseconds kIdleLook{100};
  /** Longest wait for input between two passes while the worker is stuck. */
  static constexpr int kPassMs = 1;

  PollerRescue() = default;
  ~PollerRescue() { Stop(); }
  PollerRescue(const PollerRescue &) = delete;
  PollerRescue &operator=(const PollerRescue &) = delete;

  /** Starts watching `poller`'s worker (once the worker runs); the thread is named `name`. */
  void Start(RescuablePoller *poller, const char *name) {
    if (thread_ != nullptr) return;
    stop_ = false;
    thread_ = std::make_unique<std::thread>([this, poller, name] { Run(poller, name); });
  }

  /** Stops the thread and joins it (idempotent); the input is the worker's alone again. */
  void Stop() {
    if (thread_ == nullptr) return;
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_->join();
    thread_.reset();
  }

  /**
   * In a forked child: the thread was the parent's. Keeps its handle unjoined
   * (KeepInherited) and makes the lock and condition fresh, so Stop and Start work here.
   */
  void ForgetAfterFork() {
    KeepInherited(std::move(thread_));
    new (&mu_) std::mutex();
    new (&cv_) std::condition_variable();
    stop_ = false;
  }

 private:
  /** Looks at the worker now and then; serves its input through each stretch it is stuck. */
  void Run(RescuablePoller *poller, const char *name) {
    pthread_setname_np(pthread_self(), name);
    u64 seen = poller->WorkerPolls();
    bool awake = !poller->WorkerSleeping();
    while (!WaitLook(awake ? kLook : kIdleLook)) {
      const u64 polls = poller->WorkerPolls();
      const bool awake_now = !poller->WorkerSleeping();
      const bool stuck = polls == seen && awake && awake_now;
      seen = polls;
      awake = awake_now;
      while (stuck && !Stopping() && poller->WorkerPolls() == seen &&
             !poller->WorkerSleeping()) {
        if (!poller->RescuePass()) poller->AwaitInput(kPassMs);
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

  std::unique_ptr<std::thread> thread_;
  std::mutex mu_;                ///< guards stop_
  std::condition_variable cv_;   ///< Stop's wake-up of a look's wait
  bool stop_ = false;            ///< under mu_
};

}  // namespace chi
