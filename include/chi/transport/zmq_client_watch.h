// ZmqSocketWatch: which thread of a ZeroMQ client (zmq_client.h) sleeps on its
// socket's ZMQ_FD. One caller waiting in Future::Wait at a time holds the watch
// role and blocks in poll() on the fd, as a REQ socket's caller does; meanwhile the
// network thread sleeps without the fd ("blind"), so an answer wakes that caller
// alone. The fd only signals what happened since a thread last used the socket, so
// when another thread completes tasks (the watcher's may be among them) it rings
// the watcher's bell. A blind sleep lasts at most kBlindSleepNs (2 ms): an answer nobody
// watches for (its caller polls, waits later, or parked) is taken within that, and a
// caller's send never has to wake the network thread (a wake-up per round trip made
// it a tenth slower on two cores). Invariants: a completion counted after the watcher
// last looked at the count rings the bell (role and count are seq_cst on both sides);
// a watcher that leaves while the network thread sleeps blind rings it when tasks are
// in flight (Release; both write their own word, then read the other's, seq_cst: a
// Dekker pair).
#pragma once

#include <poll.h>  // the watcher's wait on the socket and the bell

#include "chi/core/atomic.h"          // the role and the blind flag
#include "chi/transport/zmq_common.h"  // ZmqDoorbell: the bell's eventfd

namespace chi {

/** The watch role over one client socket (see the file comment). */
class ZmqSocketWatch {
 public:
  /** False when the bell's eventfd could not be created. */
  bool ok() const { return bell_.ok(); }

  /** A waiting caller takes the role; false when another caller holds it. */
  bool TryTake() {
    u32 idle = 0;
    // seq_cst: the role before the watcher reads the completion count (Dekker with Wake).
    return role_.CompareExchange(idle, 1, MemOrder::kSeqCst);
  }

  /** The watcher: blocks until fd is readable, the bell rings or timeout_ms; false on timeout. */
  bool Block(int fd, int timeout_ms) {
    pollfd p[2] = {{fd, POLLIN, 0}, {bell_.fd(), POLLIN, 0}};
    // A stale fd (the socket was replaced meanwhile) only ends the wait early.
    const bool came = poll(p, 2, timeout_ms) != 0;
    // Cleared only when it rang (a read saved per answer); a ring since then only makes
    // the next Block return at once.
    if ((p[1].revents & POLLIN) != 0) bell_.Clear();
    return came;
  }

  /**
   * The watcher gives the role up; true when the network thread sleeps blind (it must
   * be rung if tasks are in flight: read the count after this).
   */
  bool Release() {
    // seq_cst: release the role, then read blind_ (Dekker with BeginSleep).
    role_.Store(0, MemOrder::kSeqCst);
    return blind_.Load(MemOrder::kSeqCst) != 0;
  }

  /** A thread that completed tasks (after counting them) wakes the watcher, if any. */
  void Wake() {
    if (role_.Load(MemOrder::kSeqCst) != 0) bell_.Signal();  // seq_cst: after the count
  }

  /**
   * The network thread, about to sleep: true when it must watch the socket's fd itself
   * (no caller does). A watcher that leaves while it sleeps blind wakes it (Release).
   */
  bool BeginSleep() {
    // seq_cst: announce, then read the role (Dekker with Release).
    blind_.Store(1, MemOrder::kSeqCst);
    if (role_.Load(MemOrder::kSeqCst) != 0) return false;
    blind_.Store(0, MemOrder::kRelaxed);  // relaxed: only spares a watcher a needless wake
    return true;
  }

  /** The network thread is awake again. */
  void EndSleep() { blind_.Store(0, MemOrder::kRelaxed); }  // relaxed: as in BeginSleep

  /** The longest blind sleep of the network thread (see the file comment). */
  static constexpr u64 kBlindSleepNs = 2000000;

 private:
  ZmqDoorbell bell_;    ///< rung for the watcher; read only by it
  Atomic<u32> role_;    ///< 1 while a caller watches
  Atomic<u32> blind_;   ///< 1 while the network thread sleeps without the socket's fd
};

}  // namespace chi
