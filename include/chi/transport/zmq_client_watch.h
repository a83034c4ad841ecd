// ZmqSocketWatch: which thread of a ZeroMQ client (zmq_client.h) sleeps on its
// socket's ZMQ_FD. One caller waiting in Future::Wait at a time holds the watch
// role and blocks in poll() on the fd, as a REQ socket's caller does; meanwhile the
// network thread sleeps without the fd ("blind"), so an answer wakes that caller
// alone. The fd only signals what happened since a thread last used the socket, so
// when another thread completes tasks (the watcher's may be among them) it rings
// the watcher's bell. A blind network thread that went to sleep with tasks in flight
// wakes on its own within kBlindBriefMs ("briefly blind"): a caller that sends its
// next task right after its last answer (a round-trip loop) need not ring it, and one
// that does not wait for its task (it polls, or waits later) still has the answer
// taken within that time. Invariants: a completion counted after the watcher last
// looked at the count rings the bell (role and count are seq_cst on both sides);
// while the network thread sleeps blind past kBlindBriefMs, a caller watches, or no
// task is in flight, or its doorbell rang: a leaving watcher rings it when tasks are
// in flight (Release), a caller that sent a task while nobody watches rings it
// (BlindUnwatched). Both sides write their own word, then read the other's, seq_cst
// (a Dekker pair each), with the in-flight count written before the role is read
// (ZmqRequestTable::Admit) and read after the network thread announces its sleep.
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
    return blind_.Load(MemOrder::kSeqCst) != kAwake;
  }

  /**
   * A caller that sent a task (counted in flight first): true when the network thread
   * sleeps blind until rung and nobody watches, so it must be rung to watch the socket
   * itself. A briefly blind thread needs no ring: it looks within kBlindBriefMs.
   */
  bool BlindUnwatched() const {
    // seq_cst: after the in-flight count (Dekker with BeginSleep, and with Release).
    return blind_.Load(MemOrder::kSeqCst) == kBlind && role_.Load(MemOrder::kSeqCst) == 0;
  }

  /** A thread that completed tasks (after counting them) wakes the watcher, if any. */
  void Wake() {
    if (role_.Load(MemOrder::kSeqCst) != 0) bell_.Signal();  // seq_cst: after the count
  }

  /** How the network thread sleeps (BeginSleep). */
  enum class SleepMode : u32 {
    kOnSocket,     ///< on the socket's fd: no caller watches
    kBlindBriefly, ///< without it, at most kBlindBriefMs: tasks are in flight
    kBlind,        ///< without it, until rung or its own timer
  };

  /**
   * The network thread, about to sleep: how (see SleepMode). `idle()` says whether no
   * task is in flight (a seq_cst read: ZmqRequestTable::Idle). A watcher that leaves
   * while it sleeps blind wakes it (Release).
   */
  template <typename Idle>
  SleepMode BeginSleep(Idle idle) {
    // seq_cst: announce, then read the role (Dekker with Release) and the in-flight count
    // (Dekker with a sender's Admit, then BlindUnwatched).
    blind_.Store(kBlind, MemOrder::kSeqCst);
    if (role_.Load(MemOrder::kSeqCst) == 0) {
      blind_.Store(kAwake, MemOrder::kRelaxed);  // relaxed: only spares a watcher a needless wake
      return SleepMode::kOnSocket;
    }
    if (idle()) return SleepMode::kBlind;
    // relaxed: a sender that still reads kBlind only rings needlessly.
    blind_.Store(kBlindBriefly, MemOrder::kRelaxed);
    return SleepMode::kBlindBriefly;
  }

  /** The network thread is awake again. */
  void EndSleep() { blind_.Store(kAwake, MemOrder::kRelaxed); }  // relaxed: as in BeginSleep

  /**
   * The longest sleep of a briefly blind network thread: how late the answer of a task
   * whose caller does not wait for it may be taken off the socket.
   */
  static constexpr int kBlindBriefMs = 2;

 private:
  ZmqDoorbell bell_;    ///< rung for the watcher; read only by it
  Atomic<u32> role_;    ///< 1 while a caller watches
  /** blind_ values: the network thread is awake (or sleeps on the fd), or how it sleeps blind. */
  static constexpr u32 kAwake = 0;
  static constexpr u32 kBlindBriefly = 1;
  static constexpr u32 kBlind = 2;
  Atomic<u32> blind_;   ///< kAwake, kBlindBriefly or kBlind
};

}  // namespace chi
